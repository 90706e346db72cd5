"""``graphkit costs``, ``graphkit timeline`` and ``graphkit compare-schedules``: what each pipeline stage
costs per microbatch, and what a real schedule step ran on every rank, and when."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from graphkit.cli.options import (
    add_json_option,
    add_microbatches_option,
    add_model_device_option,
    add_model_spec,
    add_pipeline_spec,
    add_ranks_option,
    add_run_timeout_option,
    add_stage_option,
    add_stages_per_rank_option,
    add_steps_option,
    add_threads_option,
)

__all__ = ["add_compare_schedules_command", "add_costs_command", "add_timeline_command"]


# --- costs -------------------------------------------------------------------------------------------------
def add_costs_command(commands: Any) -> None:
    costs = commands.add_parser(
        "costs", help="time, FLOPs and memory of F, B and W per microbatch, for each stage (scheduler input)"
    )
    add_model_spec(costs, help="a model spec (one stage) or a pipeline spec")
    costs.add_argument(
        "--pipeline",
        action="store_true",
        help="SPEC is a pipeline spec (needed for hf:gpt2 and hf:llama cut into stages; files are told apart by themselves)",
    )
    costs.add_argument(
        "--num-stages", type=int, metavar="N", help="stages of a pipeline spec (default: its own, else 2)"
    )
    costs.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="whole batch of a pipeline spec (default: its own, else 8)",
    )
    costs.add_argument(
        "--microbatches",
        type=int,
        default=1,
        metavar="M",
        help="split the batch into M microbatches and measure the first (default 1: the whole batch)",
    )
    add_model_device_option(costs)
    costs.add_argument("--repeat", type=int, default=10, help="timed microbatches (medians; default 10)")
    costs.add_argument("--warmup", type=int, default=3, help="untimed microbatches first (default 3)")
    add_threads_option(
        costs,
        help="intra-op CPU threads (default 1, as timeline and compare-schedules: steadier times; 0: PyTorch's)",
    )
    add_json_option(costs, help="print JSON (with the schedulers' F/B/W fields)")
    costs.set_defaults(run=run_costs)


def run_costs(arguments: argparse.Namespace) -> int:
    from graphkit.measure.costs import spec_costs

    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    costs = spec_costs(
        arguments.spec,
        pipeline=True if arguments.pipeline else None,
        num_stages=arguments.num_stages,
        batch_size=arguments.batch_size,
        microbatches=arguments.microbatches,
        repeat=arguments.repeat,
        warmup=arguments.warmup,
        device=arguments.device,
    )
    if arguments.json:
        print(costs.to_json())
    else:
        print(f"per-microbatch costs of {arguments.spec} ({len(costs.stages)} stage(s))")
        print(costs.table())
    return 0


# --- timeline and compare-schedules: recorded schedule steps ----------------------------------------------
def add_recording_options(parser: argparse.ArgumentParser) -> None:
    """The options of a recorded run, the same for ``timeline`` and ``compare-schedules``."""
    add_pipeline_spec(
        parser, help="a pipeline spec (zoo-pipeline:mlp, path/to/file.py:function, hf:gpt2?..., hf:llama?...)"
    )
    add_microbatches_option(parser, help="microbatches per step (default 4)")
    add_ranks_option(parser, help="1: every stage in this process (default); R: R processes")
    parser.add_argument("--device", default="cpu", help="cpu (gloo, default) or cuda (NCCL)")
    add_threads_option(parser, help="intra-op CPU threads per rank (default 1)")
    add_run_timeout_option(parser, default=120.0)
    add_steps_option(
        parser,
        default=3,
        metavar="K",
        help="recorded steps per schedule, in rounds; the median one is drawn (default 3)",
    )
    add_stage_option(parser, help="whose PipelineStage to run: graphkit's (default) or PyTorch's")
    parser.add_argument(
        "--stage-class",
        metavar="MODULE:CLASS",
        help="another pipeline stage class (overrides --stage)",
    )
    add_stages_per_rank_option(
        parser,
        help="stages on each rank of the interleaved schedules (default 2; V schedules: 2, GPipe/1F1B: 1)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="the whole batch, split into the microbatches (default: 8 rows per microbatch)",
    )


def record(arguments: argparse.Namespace, schedules: list[str]) -> list[Any]:
    """One recorded timeline per schedule name, with the options of :func:`add_recording_options`."""
    from graphkit.pipelining.recording import TimelineError, record_schedules

    try:
        return record_schedules(
            arguments.spec,
            schedules,
            microbatches=arguments.microbatches,
            ranks=arguments.ranks,
            device=arguments.device,
            threads=arguments.threads,
            timeout_s=arguments.timeout,
            stage=arguments.stage,
            stage_class=arguments.stage_class,
            steps=arguments.steps,
            stages_per_rank=arguments.stages_per_rank,
            batch_size=arguments.batch_size,
        )
    except TimelineError as error:  # bad schedule, stages that do not divide, a failed rank: exit 2
        raise ValueError(str(error)) from error


def add_timeline_command(commands: Any) -> None:
    timeline = commands.add_parser(
        "timeline", help="record one real step of a pipeline schedule and draw every rank's actions"
    )
    add_recording_options(timeline)
    timeline.add_argument(
        "--schedule",
        required=True,
        metavar="NAME",
        help="1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV ...",
    )
    timeline.add_argument(
        "-o",
        "--output",
        action="append",
        required=True,
        metavar="OUT",
        help="OUT.svg, .png, .pdf, .html or .json (repeat for several)",
    )
    timeline.set_defaults(run=run_timeline)


def run_timeline(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.timeline import write_timeline

    (timeline,) = record(arguments, [arguments.schedule])
    stage = arguments.stage_class or arguments.stage
    note = (
        f"graphkit timeline {arguments.spec} --schedule {arguments.schedule} --ranks {arguments.ranks} "
        f"({stage} stages)"
    )
    for output in arguments.output:
        print(f"wrote {write_timeline(timeline, output, title=f'{timeline.schedule} timeline', note=note)}")
    print(
        f"{timeline.schedule}: {timeline.microbatches} microbatches on {len(timeline.ranks)} rank(s), "
        f"step {timeline.step_seconds * 1e3:.3f} ms, bubble {100 * timeline.bubble_fraction:.1f}%"
    )
    return 0


def add_compare_schedules_command(commands: Any) -> None:
    compare = commands.add_parser(
        "compare-schedules", help="record several schedules on the same stages in one run, side by side"
    )
    add_recording_options(compare)
    compare.add_argument(
        "--schedules",
        default="GPipe,1F1B,Interleaved1F1B,InterleavedZeroBubble,ZBVZeroBubble,DualPipeV",
        metavar="A,B,...",
        help="schedule names, comma-separated (default: GPipe, 1F1B, Interleaved1F1B and the zero-bubble ones)",
    )
    compare.add_argument(
        "-o", "--output", metavar="DIR", help="also write index.html and the pictures to DIR"
    )
    add_json_option(compare, help="also print the summaries as JSON")
    compare.set_defaults(run=run_compare_schedules)


def run_compare_schedules(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.timeline import comparison_table, write_timeline

    schedules = [name.strip() for name in arguments.schedules.split(",") if name.strip()]
    timelines = record(arguments, schedules)
    print(comparison_table(timelines))
    if arguments.json:
        print(json.dumps([timeline.summary() for timeline in timelines], indent=1))
    if arguments.output:
        folder = Path(arguments.output)
        folder.mkdir(parents=True, exist_ok=True)
        stage = arguments.stage_class or arguments.stage
        note = f"graphkit compare-schedules {arguments.spec} --ranks {arguments.ranks} ({stage} stages)"
        for name in ("index.html", "timelines.svg", "timelines.png", "timelines.json"):
            write_timeline(timelines, folder / name, title="Schedules compared", note=note)
        print(f"wrote {folder / 'index.html'} (and timelines.svg, .png, .json)")
    return 0
