"""``graphkit plan``: which pipeline schedule to run, predicted from measured costs (and, with ``--run``,
measured): a thin shell over :func:`graphkit.pipelining.planner.plan_schedules`."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from graphkit.cli.options import (
    add_json_option,
    add_pin_cores_option,
    add_run_timeout_option,
    add_threads_option,
    positive_bytes,
)

__all__ = ["add_plan_command"]


def add_plan_command(commands: Any) -> None:
    from graphkit.pipelining.schedule_plan import PROCESS_SETS, RUNOFF_MARGIN

    plan = commands.add_parser(
        "plan",
        help="simulate every pipeline schedule from measured F/I/W costs, rank them, write the best as CSV",
        description="Measure PIPELINE_SPEC's per-stage F, I and W costs (or read them with --costs), simulate "
        "every built-in schedule that fits --ranks and graphkit's ZBH1, ZBH2 and adaptive ones, and print "
        "them ranked: predicted step, ratio to 1F1B, bubble, peak activation memory per rank, messages per "
        "step. The best is written as a CSV that csv:PATH runs (-o DIR). With --run, 1F1B (twice: an A/A "
        "control) and every schedule predicted within --prediction-error of the best are recorded for real, "
        "in rounds whose orders balance position and predecessor, and the table adds the measured step; "
        "what one recording cannot decide is recorded again in new processes (a run-off, --no-runoff), and "
        "the output ends with the compare-schedules command that checks the pick in a separate run.",
    )
    plan.add_argument(
        "spec",
        metavar="PIPELINE_SPEC",
        nargs="?",
        help="a pipeline spec (zoo-pipeline:mlp_wide, hf:gpt2?n_layer=4, path/to/file.py:function); "
        "optional with --costs",
    )
    plan.add_argument("--ranks", type=int, default=2, metavar="R", help="pipeline ranks (default 2)")
    plan.add_argument(
        "--microbatches", type=int, default=8, metavar="M", help="microbatches per step (default 8)"
    )
    plan.add_argument(
        "--batch-size", type=int, metavar="B", help="the whole batch (default: 8 rows per microbatch)"
    )
    plan.add_argument(
        "--memory-limit",
        type=positive_bytes,
        metavar="BYTES",
        help="activation bytes each rank may hold, above 0: plain (4000000, 4e6) or with a unit, KiB, MiB, "
        "GiB (powers of 2) or KB, MB, GB (powers of 10), e.g. 4MiB or '4 MiB'; the adaptive schedule is "
        "built under it, schedules over it rank last (default: no limit)",
    )
    plan.add_argument(
        "--costs",
        metavar="FILE.json",
        help="per-stage costs as `graphkit costs PIPELINE_SPEC --num-stages 2R --json` writes them (add "
        "--pipeline for hf:gpt2 or hf:llama), measured elsewhere (e.g. on a GPU machine), for R or 2R "
        "stages; default: measure them here",
    )
    plan.add_argument(
        "--latency",
        type=float,
        metavar="S",
        help="seconds per message between ranks (default: with --run, measured on the recorded schedules, "
        "size included; without, 100e-6)",
    )
    plan.add_argument(
        "--bandwidth",
        type=float,
        metavar="B/S",
        help="bytes per second between ranks (default 1e9; with --run and no --latency, the measured "
        "message time includes its size)",
    )
    plan.add_argument(
        "--overhead",
        type=float,
        metavar="S",
        help="seconds the runtime adds to each action on its rank (default: with --run, measured on the "
        "recorded schedules, each predicted from the others; without, 1e-3: gloo on the CPU)",
    )
    plan.add_argument(
        "--run",
        dest="record",
        action="store_true",
        help="record for real 1F1B (twice: the spread between the copies is the run's noise floor), the best "
        "zero-bubble schedule, every schedule predicted within --prediction-error of the best that "
        "--record-budget allows, and the best non-splitting schedule of each recorded splitting schedule's "
        "placement; print the measured steps, and recommend (and write as best.csv) what measured faster than "
        "1F1B beyond the noise floor and in more rounds than chance would give it (a sign test)",
    )
    plan.add_argument(
        "--steps",
        type=steps_or_auto,
        default=15,
        metavar="K|auto",
        help="recorded steps per schedule with --run, in interleaved rounds (default 15; a schedule is "
        "recommended only when faster than 1F1B in more rounds than chance would give it: 12 of 15, "
        "8 of 9, never from fewer than 5); auto: 15, then as many more as the schedule closest to beating "
        "1F1B needs at its win fraction, until decided or --record-budget seconds pass",
    )
    plan.add_argument(
        "--top",
        type=int,
        metavar="N",
        help="with --run, record at most N of the schedules within --prediction-error (default: no cap)",
    )
    plan.add_argument(
        "--prediction-error",
        type=float,
        default=None,
        metavar="F",
        help="with --run, how far each prediction may be off, a fraction of its step: every schedule "
        "predicted within (1 + F) / (1 - F) of the best predicted step is recorded, 22%% for 0.10 (default: "
        "the worst error the last --run of the same model, ranks and microbatches measured, at least 0.05, "
        "remembered in ~/.cache/graphkit/prediction_errors.json or $GRAPHKIT_CACHE_DIR; 0.10 before any run)",
    )
    plan.add_argument(
        "--record-budget",
        type=float,
        default=600.0,
        metavar="S",
        help="with --run, seconds of recording (estimated from the predicted steps) the schedules within "
        "--prediction-error may take; those it leaves out are named; a run-off records as many rounds as "
        "ordering its finalists to a 1%% standard error needs, within what is left of it (default 600)",
    )
    plan.add_argument(
        "--no-runoff",
        dest="runoff",
        action="store_false",
        help=f"with --run, recommend from one recording even where other schedules measured within "
        f"{RUNOFF_MARGIN * 100:.0f}%% (or the noise floor) of the pick; by default those are recorded again with 1F1B "
        f"in {PROCESS_SETS} sets of new processes (a run-off) and the best of them there is recommended",
    )
    plan.add_argument(
        "--recording-sets",
        type=int,
        default=PROCESS_SETS,
        metavar="N",
        help=f"with --run, record the first recording's rounds in N sets of new processes (new copies of the "
        f"stages, at least 5 rounds a set; default {PROCESS_SETS}, as a run-off): a schedule's ratio to 1F1B moves "
        "between sets of processes, and one set's luck should not decide which schedules reach the run-off",
    )
    plan.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="with --run, record 1F1B once: no A/A control, no noise floor",
    )
    plan.add_argument(
        "--weight-slowdown",
        type=float,
        default=1.0,
        metavar="X",
        help="cost every W at X times what was measured standalone before simulating and building "
        "CostAware and Adaptive (a --run prints the X it measured: W's slowdown in the pipeline over the other "
        "passes'; default 1)",
    )
    plan.add_argument(
        "--schedules",
        metavar="NAMES",
        help="comma-separated schedules to plan (default: every built-in one that fits and graphkit's "
        "ZBH1, ZBH2, Adaptive and CostAware)",
    )
    plan.add_argument(
        "--what-if",
        action="store_true",
        help="also predict the same per-stage costs at 8, 16, 32 and 64 ranks, with M and 4 x ranks microbatches",
    )
    add_threads_option(plan, help="intra-op CPU threads for measuring and per recorded rank (default 1)")
    add_pin_cores_option(plan, when="with --run: ")
    add_run_timeout_option(plan, default=600.0)
    plan.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="write best.csv (the recommended schedule: with --run the measured best, else the best "
        "predicted where it is predicted at least 1%% below 1F1B, else 1F1B), one CSV per generated schedule (zbh1.csv, ...), plan.json and, with --run, recorded.json "
        "and timelines.html/.svg; without it nothing is written",
    )
    add_json_option(plan, help="print the plan as JSON instead of the table")
    plan.set_defaults(run=run_plan)


def steps_or_auto(text: str) -> int | str:
    """An argparse ``type``: a whole number of steps of at least 1, or ``auto``."""
    if text == "auto":
        return text
    try:
        steps = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of steps or 'auto', got {text!r}"
        ) from None
    if steps < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {steps}")
    return steps


def run_plan(arguments: argparse.Namespace) -> int:
    from graphkit.measure.allocator import untuned_allocator_warning
    from graphkit.measure.timing import busy_machine_warning
    from graphkit.pipelining.planner import plan_schedules
    from graphkit.pipelining.planning.calibration import DEFAULT_COMM
    from graphkit.pipelining.planning.cost_model import CommModel
    from graphkit.pipelining.planning.timelines import TimelineError
    from graphkit.pipelining.schedule_plan import what_if_table

    if arguments.spec is None and arguments.costs is None:
        raise ValueError("give a PIPELINE_SPEC or --costs FILE.json")
    if arguments.spec is None and arguments.record:
        raise ValueError("--run records the schedules on real ranks: give the PIPELINE_SPEC to run")
    if arguments.pin_cores and not arguments.record:
        raise ValueError("--pin-cores pins the ranks that --run records: add --run, or leave --pin-cores out")
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    comm = None  # with --run: calibrated on the recorded schedules; without: DEFAULT_COMM
    if arguments.latency is not None or arguments.bandwidth is not None:
        comm = CommModel(
            arguments.latency if arguments.latency is not None else DEFAULT_COMM.latency,
            arguments.bandwidth if arguments.bandwidth is not None else DEFAULT_COMM.bandwidth,
            rendezvous=DEFAULT_COMM.rendezvous,
        )
    if arguments.spec is not None and (arguments.costs is None or arguments.record):
        busy = busy_machine_warning()  # said before minutes of measuring, and again under the table
        if busy:
            print(f"warning: {busy}", file=sys.stderr)
        untuned = untuned_allocator_warning()  # the ranks follow this process's choice (graphkit.cli.main)
        if untuned:
            print(f"warning: {untuned}", file=sys.stderr)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the warning above
            plan = plan_schedules(
                arguments.spec,
                ranks=arguments.ranks,
                microbatches=arguments.microbatches,
                costs=arguments.costs,
                schedules=arguments.schedules.split(",") if arguments.schedules else None,
                memory_limit=arguments.memory_limit,
                comm=comm,
                overhead=arguments.overhead,
                batch_size=arguments.batch_size,
                run=arguments.record,
                steps=arguments.steps,
                top=arguments.top,
                prediction_error=arguments.prediction_error,
                record_budget_s=arguments.record_budget,
                control=arguments.control,
                runoff=arguments.runoff,
                recording_sets=arguments.recording_sets,
                weight_slowdown=arguments.weight_slowdown,
                output=arguments.output,
                threads=arguments.threads or 1,
                timeout_s=arguments.timeout,
                pin_cores=arguments.pin_cores,
            )
    except TimelineError as error:  # a failed or stuck rank under --run: bad input or a too short --timeout
        raise ValueError(str(error)) from error
    what_if = plan.what_if() if arguments.what_if else None
    if arguments.json:
        payload = plan.to_dict()
        if what_if is not None:
            payload["what_if"] = what_if
        print(json.dumps(payload, indent=1, default=str))
        return 0
    print(plan.table())
    if what_if is not None:
        print()
        print("what if: the same per-stage costs on more ranks")
        print(what_if_table(what_if))
    if arguments.output and plan.timelines:
        from graphkit.drawing.timeline import write_timeline

        for name in ("timelines.html", "timelines.svg"):
            write_timeline(
                plan.timelines, Path(arguments.output) / name, title="Predicted and recorded steps"
            )
        print(f"wrote {arguments.output}/timelines.html (each recorded schedule: predicted, then recorded)")
    if arguments.output:
        folder = Path(arguments.output)
        recommended = plan.recommended
        measured_kept = recommended is plan.baseline and recommended.measured_seconds is not None
        if measured_kept or (recommended is plan.baseline and plan.best is not plan.baseline):
            how = "kept: nothing " + (
                "measured faster in the median round and beyond chance in the rounds"
                if recommended.measured_seconds is not None
                else "predicted at least 1% faster"
            )
        else:
            how = (
                "measured faster than 1F1B beyond chance"
                if recommended.measured_seconds is not None
                else "the best predicted"
            )
        if (folder / "best.csv").is_file():
            print(
                f"wrote {folder}/best.csv ({recommended.name}, {how}: run it as --schedule csv:{folder}/best.csv)"
            )
        others = sorted(
            path.name for path in folder.iterdir() if path.is_file() and path.name not in ("best.csv",)
        )
        print(f"wrote in {folder}/: {', '.join(others)}")
    return 0
