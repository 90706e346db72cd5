"""The pipeline commands: ``graphkit costs``, ``graphkit timeline``, ``graphkit compare-schedules`` (what each
pipeline stage costs per microbatch, and what a real schedule step ran on every rank, and when) and
``graphkit verify-pipeline`` (one real schedule step of a pipeline spec's stages, every gradient compared
with a single-process full backward)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from graphkit.cli.options import (
    add_json_option,
    add_microbatches_option,
    add_model_device_option,
    add_model_spec,
    add_pin_cores_option,
    add_pipeline_spec,
    add_ranks_option,
    add_run_timeout_option,
    add_stage_option,
    add_stages_per_rank_option,
    add_steps_option,
    add_threads_option,
    check_device,
)
from graphkit.cli.terminal import print_model_error

__all__ = [
    "add_compare_schedules_command",
    "add_costs_command",
    "add_timeline_command",
    "add_verify_pipeline_command",
]


# --- costs -------------------------------------------------------------------------------------------------
def add_costs_command(commands: Any) -> None:
    costs = commands.add_parser(
        "costs",
        help="time, FLOPs and memory of F, I and W per microbatch, for each stage (scheduler input)",
        description="Time, FLOPs and memory per microbatch of each stage's F (forward), I (input-gradient "
        "backward: the ZB paper's B, graphkit's B phase) and W (weight-gradient backward).",
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
    add_json_option(costs, help="print JSON (with the ZB schedulers' cost_f/cost_b/cost_w fields: b is I)")
    costs.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write what it prints to FILE instead (the JSON with --json: graphkit plan --costs FILE), "
        "only once everything is measured: a refused or failed run writes nothing",
    )
    costs.set_defaults(run=run_costs)


def run_costs(arguments: argparse.Namespace) -> int:
    from graphkit.measure.costs import spec_costs

    check_device(arguments.device)  # before the spec loads: a CPU-only torch refuses cuda here
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
        text = costs.to_json()
    else:
        text = f"per-microbatch costs of {arguments.spec} ({len(costs.stages)} stage(s))\n{costs.table()}"
    if arguments.output:
        Path(arguments.output).write_text(text + "\n")
        print(f"wrote {arguments.output}")
    else:
        print(text)
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
    add_pin_cores_option(parser)
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
    """One recorded timeline per schedule name, with the options of :func:`add_recording_options`. Says on
    standard error what other processes used of the CPU meanwhile, with a warning where they took enough
    to move the figures (:mod:`graphkit.measure.competing_load`)."""
    from graphkit.measure.competing_load import other_processes_warning, watching_other_processes
    from graphkit.pipelining.planning.timelines import TimelineError
    from graphkit.pipelining.recording import following_rounds, record_schedules

    timelines: list[Any] = []
    try:
        with watching_other_processes() as others:
            for steps in set_sizes(arguments):  # each set in new processes
                more = record_schedules(
                    arguments.spec,
                    schedules,
                    microbatches=arguments.microbatches,
                    ranks=arguments.ranks,
                    device=arguments.device,
                    threads=arguments.threads,
                    timeout_s=arguments.timeout,
                    stage=arguments.stage,
                    stage_class=arguments.stage_class,
                    steps=steps,
                    stages_per_rank=arguments.stages_per_rank,
                    batch_size=arguments.batch_size,
                    pin_cores=arguments.pin_cores,
                )
                timelines = following_rounds(timelines, more)
    except TimelineError as error:  # bad schedule, stages that do not divide, a failed rank: exit 2
        raise ValueError(str(error)) from error
    warning = other_processes_warning(others)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    elif others.cores is not None:
        print(others.describe(), file=sys.stderr)
    return timelines


def set_sizes(arguments: argparse.Namespace) -> list[int]:
    """The rounds each set of processes records: ``--steps`` split into ``--process-sets`` sets
    (:func:`~graphkit.measure.paired_rounds.process_set_sizes`); one set without that option."""
    from graphkit.measure.paired_rounds import process_set_sizes

    sets = getattr(arguments, "process_sets", 1)
    if sets < 1:
        raise ValueError(f"--process-sets must be at least 1, got {sets}")
    return process_set_sizes(arguments.steps, sets) if arguments.steps >= 1 else [arguments.steps]


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
        "--control",
        action="store_true",
        help="record the first schedule a second time, last, as an A/A control: the spread between the "
        "copies is printed as the run's noise floor (listing a schedule twice does the same)",
    )
    compare.add_argument(
        "--process-sets",
        type=int,
        default=1,
        metavar="N",
        help="record the rounds in N sets of new processes (new copies of the stages), at least 5 rounds "
        "a set, and give each schedule the mean of the sets' median round ratios: what one set's copies "
        "happen to get (memory, a quieter core) then averages out, which more rounds in one set cannot "
        "do (default 1; graphkit plan prints its check with 3)",
    )
    compare.add_argument(
        "-o", "--output", metavar="DIR", help="also write index.html and the pictures to DIR"
    )
    add_json_option(compare, help="also print the summaries as JSON")
    compare.set_defaults(run=run_compare_schedules)


def run_compare_schedules(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.timeline import comparison_table, write_timeline

    schedules = [name.strip() for name in arguments.schedules.split(",") if name.strip()]
    if arguments.control and schedules:
        schedules.append(schedules[0])
    timelines = record(arguments, schedules)
    print(comparison_table(timelines))
    if arguments.steps > 1:
        print(rounds_lines(timelines, set_sizes(arguments)))
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


def rounds_lines(timelines: list[Any], sets: list[int] | None = None) -> str:
    """Each schedule's recorded rounds against the first's (paired: the same round, the order of each
    round in the next order of a design balanced for position and predecessor), and the noise floor where
    a schedule was recorded twice. ``sets``: the rounds each set of processes recorded, in order; with
    several, each ratio is the mean of the sets' median rounds, and each set's is listed."""
    from graphkit.measure.paired_rounds import compare_rounds

    named = [
        (timeline.schedule, list(timeline.ranks[0].step_times) if timeline.ranks else [])
        for timeline in timelines
    ]
    summary = compare_rounds(named, sets)
    several = len(summary["sets"]) > 1
    rounds = len(named[0][1]) if named else 0
    lines = [
        f"rounds ({rounds}, each visiting the schedules in an order balanced for position and predecessor"
        + (
            f"; in {len(summary['sets'])} sets of new processes of {_sizes(summary['sets'])} rounds, each "
            "ratio the mean of the sets' median rounds"
            if several
            else ""
        )
        + f"), step over {summary['baseline']}'s in the same round:"
    ]
    for row in summary["rows"]:
        ratio = row["median_round_ratio"]
        figure = "-" if ratio is None else f"{ratio:.3f}x"
        where = (
            " in the mean of the sets (" + ", ".join(f"{each:.3f}x" for each in row["by_set"]) + ")"
            if several
            else " in the median round"
        )
        lines.append(
            f"  {row['name']}: {figure}{where}, faster in {row['won']} of {row['rounds']} rounds "
            f"(sign test p = {row['p']:.2g})" + (" - within the noise floor" if row["within_noise"] else "")
        )
    floor = summary["noise_floor"]
    if floor is not None:
        lines.append(
            f"noise floor: {summary['control']} recorded twice (A/A) measured {floor:.1%} apart"
            + (" in the mean of the sets" if several else " in the median round")
            + ": differences within it are not told from noise in this run"
        )
    else:
        lines.append("no noise floor: list a schedule twice, or add --control, to measure one")
    error = summary["standard_error"]
    if error is not None:
        lines.append(
            f"precision: a round's difference between two schedules strayed by {summary['round_spread']:.1%} "
            f"of a step, so over {rounds} rounds two ratios differ by about {error:.1%} (one standard error) "
            f"by chance: differences within {2 * error:.1%} are not told apart; more --steps narrow it (four "
            "times the rounds halve it)"
        )
    return "\n".join(lines)


def _sizes(sizes: list[int]) -> str:
    """``[7, 7, 7]`` is "7, 7 and 7"."""
    text = [str(size) for size in sizes]
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} and {text[-1]}"


# --- verify-pipeline -----------------------------------------------------------------------------------------
def add_verify_pipeline_command(commands: Any) -> None:
    pipeline = commands.add_parser(
        "verify-pipeline",
        help="run a torch.distributed.pipelining schedule step; compare every gradient with a full backward",
        description="Run one real schedule step of PIPELINE_SPEC's stages (two per rank) with graphkit's "
        "PipelineStage and compare every parameter's gradient with a single-process full backward over the "
        "same microbatches. With --frontend tracing the stages are traced and cut by pipeline() and built "
        "by build_stage; the gradients are then compared bit for bit with a full backward of the traced "
        "model, and within 1e-10 with the untraced model's (a parameter pipeline() copied into several "
        "stages: its copies summed). Exit 0 iff every gradient is exact and hooks fired once per "
        "microbatch, 1 if not, 2 on bad input (a spec that does not load or that pipeline() cannot trace).",
    )
    add_pipeline_spec(
        pipeline,
        help="path/to/file.py:function, package.module:function, zoo-pipeline:NAME, hf:gpt2?... or hf:llama?...",
    )
    pipeline.add_argument(
        "--schedule",
        default="ZBVZeroBubble",
        help="InterleavedZeroBubble, ZBVZeroBubble (default), DualPipeV, CSV, ZBH1, ZBH2, Adaptive, CostAware "
        "(one stage per rank, generated by graphkit) or csv:PATH",
    )
    add_microbatches_option(pipeline, help="microbatches per step")
    add_steps_option(pipeline, default=1, metavar="N", help="schedule steps (SGD in between)")
    add_ranks_option(pipeline, help="processes on 127.0.0.1 (default 1: all stages here)")
    parallel = pipeline.add_mutually_exclusive_group()
    parallel.add_argument("--ddp", action="store_true", help="R/2 pipeline ranks x 2 DDP replicas")
    parallel.add_argument("--fsdp", action="store_true", help="R/2 pipeline ranks x 2 FSDP2 replicas")
    add_stages_per_rank_option(
        pipeline, help="stages on each rank (default 2; other counts for InterleavedZeroBubble and CSV)"
    )
    add_stage_option(
        pipeline, help="whose stage to run: PipelineStage, or build_stage with --frontend tracing"
    )
    pipeline.add_argument(
        "--frontend",
        choices=["manual", "tracing"],
        default="manual",
        help="manual (default): the spec's stage modules are the stages; tracing: pipeline() traces them "
        "composed into one model and cuts it at every stage boundary, build_stage builds the stages "
        "(no --ddp / --fsdp)",
    )
    add_run_timeout_option(pipeline, default=300.0, old_spelling="--deadline")
    pipeline.add_argument(
        "--timeline",
        action="append",
        metavar="OUT",
        help="also record the last step and draw it: OUT.svg, .png, .pdf, .html or .json (repeat for several)",
    )
    add_json_option(pipeline)
    pipeline.set_defaults(run=run_verify_pipeline)


def run_verify_pipeline(arguments: argparse.Namespace) -> int:
    from graphkit.pipelining.launcher import LaunchError
    from graphkit.pipelining.verification import verify_pipeline

    data_parallel = "ddp" if arguments.ddp else "fsdp" if arguments.fsdp else None
    try:
        result = verify_pipeline(
            arguments.spec,
            schedule=arguments.schedule,
            microbatches=arguments.microbatches,
            steps=arguments.steps,
            ranks=arguments.ranks,
            data_parallel=data_parallel,
            stage=arguments.stage,
            stages_per_rank=arguments.stages_per_rank,
            deadline=arguments.timeout,
            timeline=bool(arguments.timeline),
            frontend=arguments.frontend,
        )
    except LaunchError as error:  # the ranks ran past --timeout, or one died: nothing was verified
        hint = (
            f"; raise --timeout (now {arguments.timeout:g} s) if the step is only slow"
            if error.timed_out
            else ""
        )
        print(f"graphkit verify-pipeline: error: {error}{hint}", file=sys.stderr)
        if arguments.json:
            print(json.dumps({"ok": False, "exact": False, "error": f"{error}{hint}"}, indent=1))
        else:
            print("FAILED: nothing was verified")
        return 1
    if result.model_error:  # the spec's own model raised in the step: bad input, not a verdict
        print_model_error(arguments, str(result.error), result.model_error, result.error_traceback)
        if arguments.json:
            print(json.dumps(result_payload(result, data_parallel, []), indent=1))
        return 2
    written = write_checked_timeline(arguments, result) if arguments.timeline else []
    if arguments.json:
        print(json.dumps(result_payload(result, data_parallel, written), indent=1))
        return 0 if result.ok else 1
    where = f"{result.ranks} process{'es' if result.ranks > 1 else ''}"
    tracing = result.case.frontend == "tracing"
    print(
        f"{arguments.spec}: {result.case.schedule}, {result.case.microbatches} microbatches, "
        f"{result.case.steps} step(s), {where}, {result.case.stage} stages"
        + (", tracing frontend (pipeline() + build_stage)" if tracing else "")
        + (f", {data_parallel}" if data_parallel else "")
    )
    if result.error is not None:
        print(f"the schedule step failed: {result.error}")
        if tracing and result.case.stage == "torch" and "Pair is not connected" in result.error:
            print(
                "(PyTorch's traced stage sends a warm-up tensor to each neighbour stage, also to one on its "
                "own rank, which gloo cannot do; graphkit's build_stage leaves those sends out)"
            )
    if result.parameters:
        if tracing:
            print(
                "against a full backward of the traced model (each copy of a replicated parameter on its own):"
            )
        print(result.table())
    if tracing and result.untraced:
        print_untraced(result)
    if result.backward_calls:
        print(backwards_line(result.backward_calls))
    for path in written:
        print(f"wrote {path}")
    if result.timeline is not None:
        print(
            f"recorded the last step: {result.timeline.step_seconds * 1e3:.3f} ms, "
            f"bubble {100 * result.timeline.bubble_fraction:.1f}%"
        )
    if result.ok:
        verdict = (
            "exact: every gradient equals the full backward's bit for bit"
            if result.exact
            else "equal within 1e-10 ("
            + (
                "data-parallel all-reduce order"
                if result.case.data_parallel is not None
                else "stages on one rank share a parameter: its gradient sums their contributions"
            )
            + ")"
        )
        if tracing:
            verdict = "exact: every gradient equals the traced model's full backward bit for bit; " + (
                "the untraced model's too"
                if result.untraced_exact
                else "the untraced model's within "
                f"{max(check.relative_error or 0.0 for check in result.untraced):.2g} relative (rounding: copies "
                "summed in another order, or a custom autograd.Function's forward traced as ATen operations)"
            )
        print(f"{verdict}; hooks once per microbatch")
    elif result.error is not None:
        compared = max((check.steps_compared for check in result.parameters), default=0)
        print(
            "FAILED: the schedule step did not run to the end, so no gradient was compared"
            if not compared
            else f"FAILED: step {compared + 1} of {result.case.steps} did not run to the end (the gradients "
            f"of steps 1-{compared} are in the table)"
        )
    else:
        print(f"NOT exact: {pipeline_failures(result)}")
    return 0 if result.ok else 1


def backwards_line(calls: dict[str, int]) -> str:
    """The backward calls a checked step ran, in the schedules' letters: I (input gradients), W (weight
    gradients) and B (the full backward); I is the ZB paper's B (graphkit's B phase)."""
    if not any(calls.values()):
        return "backwards run: none (the step failed before any backward ran)"
    return (
        f"backwards run: {calls.get('input', 0)} I, {calls.get('weight', 0)} W (graphkit's split: "
        f"I = input-gradient backward, the ZB paper's B; W = weight-gradient backward), "
        f"{calls.get('full', 0)} B (full backward; PyTorch's runtime runs a first stage's I as nothing and its "
        "W as one full backward, counted here as B)"
    )


def print_untraced(result: Any) -> None:
    """The tracing frontend's second comparison: what tracing changed, against the untraced model."""
    for name, copies in result.replicated.items():
        print(
            f"pipeline() copied {name} into {len(copies)} stage-module parameters ({', '.join(copies)}); "
            "the untraced gradient is their sum (sum them before the optimizer step)"
        )
    differing = [check for check in result.untraced if not check.bitwise]
    print(
        f"against the untraced model (pipeline()'s copies summed): {len(result.untraced) - len(differing)} of "
        f"{len(result.untraced)} gradients bit for bit"
        + (
            f", the others differ by up to {max(_relative(check) for check in differing):.3g} relative "
            f"(tolerance {1e-10:g})"
            if differing
            else ""
        )
    )
    if differing:
        print(result.table(untraced=True))


def result_payload(result: Any, data_parallel: str | None, timeline_files: list[str]) -> dict[str, Any]:
    """The ``--json`` form of a checked pipeline step (a ``PipelineVerification``)."""
    return {
        "frontend": result.case.frontend,
        "schedule": result.case.schedule,
        "microbatches": result.case.microbatches,
        "steps": result.case.steps,
        "ranks": result.ranks,
        "data_parallel": data_parallel,
        "stage": result.case.stage,
        "ok": result.ok,
        "exact": result.exact,
        "error": result.error,
        "model_error": result.model_error,
        "backward_calls": result.backward_calls,
        "parameters": [_parameter_payload(check) for check in result.parameters],
        "untraced": [_parameter_payload(check) for check in result.untraced],
        "untraced_exact": result.untraced_exact,
        "replicated": result.replicated,
        "timeline": result.timeline.summary() if result.timeline is not None else None,
        "timeline_files": timeline_files,
    }


def _relative(check: Any) -> float:
    """A check's relative error, ``inf`` where one side has no gradient."""
    return math.inf if check.relative_error is None else check.relative_error


def _parameter_payload(check: Any) -> dict[str, Any]:
    return {
        **check.to_dict(),
        "hooks": check.hooks,
        "expected_hooks": check.expected_hooks,
        "stages": check.stages,
        "steps_compared": check.steps_compared,
    }


def pipeline_failures(result: Any) -> str:
    """What made a checked pipeline step fail: wrong gradients, silent or repeated hooks, or both."""
    wrong = [check.name for check in result.parameters if not check.bitwise]
    if result.case.data_parallel is not None or any(check.stages > 1 for check in result.parameters):
        wrong = [check.name for check in result.parameters if not check.ok]
    hooks = [
        check.name
        for check in result.parameters
        if check.hooks is not None and check.hooks != check.expected_hooks
    ]
    reasons = []
    if wrong:
        oracle = " from the traced model's full backward" if result.case.frontend == "tracing" else ""
        reasons.append(
            f"{len(wrong)} of {len(result.parameters)} gradients differ{oracle} ({', '.join(wrong[:3])}"
            + (", ..." if len(wrong) > 3 else "")
            + ")"
        )
    changed = [check.name for check in result.untraced if not check.ok]
    if changed:
        reasons.append(
            f"pipeline() changed {len(changed)} of {len(result.untraced)} gradients beyond 1e-10 of the "
            f"untraced model's ({', '.join(changed[:3])}" + (", ..." if len(changed) > 3 else "") + "): "
            "the traced model computes other gradients (pipeline() traces a custom autograd.Function's "
            "forward and does not use its backward)"
        )
    if hooks:
        reasons.append(
            f"post-accumulate-grad hooks did not fire once per microbatch for {len(hooks)} of "
            f"{len(result.parameters)} parameters ({', '.join(hooks[:3])}"
            + (", ..." if len(hooks) > 3 else "")
            + "): DDP would leave their gradients un-averaged"
        )
    return "; ".join(reasons) or "no parameter was compared"


def write_checked_timeline(arguments: argparse.Namespace, result: Any) -> list[str]:
    """Draw the recorded step of a checked pipeline to each ``--timeline`` file (none if the step failed)."""
    from graphkit.drawing.timeline import write_timeline

    if result.timeline is None:
        print("no timeline: the schedule step did not run to the end", file=sys.stderr)
        return []
    note = (
        f"graphkit verify-pipeline {arguments.spec} --schedule {arguments.schedule} --ranks {arguments.ranks}"
        + (" --frontend tracing" if result.case.frontend == "tracing" else "")
    )
    traced = ", traced" if result.case.frontend == "tracing" else ""
    title = f"{result.timeline.schedule} timeline ({result.case.stage} stages{traced})"
    return [
        str(write_timeline(result.timeline, output, title=title, note=note)) for output in arguments.timeline
    ]
