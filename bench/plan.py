"""Does the schedule planner's prediction hold, and does its best schedule beat 1F1B? Measured, re-runnable.

    .venv/bin/python bench/plan.py [--spec zoo-pipeline:mlp_wide --spec 'hf:gpt2?n_layer=4'] [--ranks 2]
                         [--microbatches 8] [--batch-size 256] [--steps 9] [--top N]
                         [--pin-cores auto|on|off] [--json] [-o DIR]

For each spec: ``graphkit costs`` (measured here, one thread) feeds the simulator for every built-in schedule
and graphkit's ZBH1, ZBH2 and adaptive ones (:func:`graphkit.pipelining.planner.plan_schedules`);
then the ``--top`` best predicted (default: all) and 1F1B, twice (an A/A control: the run's noise floor), are
recorded for real on ``--ranks`` gloo processes (one thread each; with ``--pin-cores auto``, the default, each
on a core of its own where there is a core per rank), ``--steps`` steps each in rounds whose orders balance
position and predecessor (the median kept). The table gives, per schedule, the
predicted step from the costs, the measured step and their ratio, and the step predicted from the recorded
per-action durations (what the runtime adds between actions, isolated) and its ratio to the measured one;
ratios to 1F1B are taken within the same run. The machine's load average is printed before and after:
numbers from a loaded machine are noisy, re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import torch

from graphkit.measure.timing import sign_test_p_value
from graphkit.pipelining.planner import plan_schedules
from graphkit.pipelining.planning import simulate
from graphkit.pipelining.planning.calibration import costs_from_recorded
from graphkit.pipelining.schedules import schedule_order


def replan(plan) -> None:
    """The one-stage-per-rank schedules simulated from this run's recorded action times (median per stage and
    kind) and its measured runtime gap: what the machine itself says about W filling the bubble."""
    recorded = [timeline for timeline in plan.timelines if timeline.schedule.endswith("recorded")]
    costs = costs_from_recorded(recorded, plan.ranks)
    if costs is None or not plan.measured_overhead or plan.measured_overhead["between"] is None:
        return
    costs = [
        replace(c, output_bytes=m.output_bytes, input_grad_bytes=m.input_grad_bytes)
        for c, m in zip(costs, plan.costs, strict=True)
    ]
    overhead = plan.measured_overhead["between"]
    print(f"from the recorded action times (runtime gap {overhead * 1e6:.0f} us per action):")
    for stage, cost in enumerate(costs):
        print(
            f"  stage {stage}: F {cost.forward * 1e3:.2f} ms, I {cost.backward_input * 1e3:.2f}, "
            f"W {cost.backward_weight * 1e3:.2f}, "
            f"I + W {(cost.backward_input + cost.backward_weight) * 1e3:.2f}, "
            f"B {cost.seconds('B') * 1e3:.2f}"
        )
    base = None
    for name in ("1F1B", "GPipe", "ZBH1", "ZBH2"):
        order = schedule_order(name, plan.ranks, plan.microbatches)
        step = simulate(order, costs, plan.comm, overhead=overhead).step_seconds
        base = base or step
        measured = next((item.measured_seconds for item in plan.schedules if item.name == name), None)
        shown = f", measured {measured * 1e3:.1f} ms" if measured else ""
        print(f"  {name:<6} predicted {step * 1e3:8.1f} ms ({step / base:.2f}x of 1F1B){shown}")
    print()


def rounds(plan) -> None:
    """Every recorded schedule's step round by round against 1F1B's in the same round: the median ratio and
    the rounds it was faster in (the rounds ran the schedules in turn, so a change of load touches all)."""
    base = plan.baseline.measured_steps
    print(f"rounds ({len(base)}), step / 1F1B's step in the same round:")
    for item in plan.schedules:
        if not item.measured_steps or item is plan.baseline:
            continue
        ratios = sorted(step / other for step, other in zip(item.measured_steps, base, strict=False))
        won, total = plan.rounds_won(item)
        median = ratios[(len(ratios) - 1) // 2]
        print(
            f"  {item.name:<22} median {median:.3f}x, faster in {won} of {total} rounds "
            f"(sign test p = {sign_test_p_value(won, total):.2g}; range {ratios[0]:.3f}-{ratios[-1]:.3f})"
        )
    floor = plan.noise_floor
    if floor is not None:
        print(f"  noise floor (1F1B against its A/A copy, median round): {floor:.1%}")
    print(f"  recommended: {plan.recommended.name}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", action="append", help="pipeline specs (default: mlp_wide and gpt2 n_layer=4)"
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument(
        "--top", type=int, default=None, help="record the N best predicted and 1F1B (default: all)"
    )
    parser.add_argument("--memory-limit", type=float, default=None)
    parser.add_argument("--schedules", help="comma-separated schedules to plan (default: every one)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("-o", "--output", help="a folder per spec under DIR: CSVs, plan.json, timelines")
    parser.add_argument(
        "--pin-cores",
        choices=("auto", "on", "off"),
        default="auto",
        help="each rank on one core (Linux): auto (default) where there is a core per rank, on, off",
    )
    arguments = parser.parse_args()
    # one rank per core steadies the steps (2 cores, 2 ranks: worst prediction error 0.09-0.18 pinned,
    # 0.20-0.25 not); with more ranks than cores they time-slice anyway; pinned in pairs, no steadier
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    pin_cores = arguments.pin_cores == "on" or (arguments.pin_cores == "auto" and arguments.ranks <= cores)
    print(f"ranks {'pinned, one core each' if pin_cores else 'not pinned'} ({cores} cores usable)\n")
    torch.set_num_threads(1)
    specs = arguments.spec or ["zoo-pipeline:mlp_wide", "hf:gpt2?n_layer=4"]
    for spec in specs:
        output = None
        if arguments.output:
            output = os.path.join(arguments.output, spec.replace(":", "_").replace("?", "_").replace("=", ""))
        plan = plan_schedules(
            spec,
            ranks=arguments.ranks,
            microbatches=arguments.microbatches,
            batch_size=arguments.batch_size,
            memory_limit=arguments.memory_limit,
            schedules=arguments.schedules.split(",") if arguments.schedules else None,
            run=True,
            steps=arguments.steps,
            top=arguments.top,
            prediction_error=10.0,  # every schedule: the bench measures the prediction of all of them
            runoff=False,  # one recording of them all: its rounds are what the bench compares
            record_budget_s=None,
            output=output,
            timeout_s=1800,
            pin_cores=pin_cores,
        )
        print(plan.table())
        print()
        rounds(plan)
        replan(plan)
        if output is not None and plan.timelines:
            from graphkit.drawing.timeline import write_timeline

            for name in ("timelines.html", "timelines.svg"):
                write_timeline(
                    plan.timelines, os.path.join(output, name), title="Predicted and recorded steps"
                )
        if arguments.json:
            print(json.dumps(plan.to_dict(), indent=1, default=str))


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    main()
