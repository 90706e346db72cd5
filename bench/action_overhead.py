"""What each action of a recorded pipeline step costs against the same stage's ``graphkit costs``.

    python bench/action_overhead.py zoo-pipeline:mlp_wide --schedule ZBVZeroBubble --ranks 2 \\
        --microbatches 8 --batch-size 512

Records one step of ``--schedule`` with graphkit's stage (``graphkit timeline``, gloo ranks, one thread
each) and measures every stage alone (``graphkit costs``, same microbatch size, as many threads). Prints, per
stage and kind of action (F: forward, I: B, the input gradients, W: the weight gradients, B: a full
backward), the median recorded duration against the stage's own cost, and their difference: the
overhead per action that the schedule adds (communication bookkeeping, the stage's Python around B and W,
and, on a loaded machine, other processes). Not a test: run it by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from graphkit.measure.costs import spec_costs

COST_FIELD = {"F": "forward", "I": "backward_input", "W": "backward_weight"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("spec")
    parser.add_argument("--schedule", default="ZBVZeroBubble")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3, help="recorded steps (the median one is used)")
    parser.add_argument("--repeat", type=int, default=10, help="timed microbatches for the costs")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op CPU threads, per rank and for the costs"
    )
    arguments = parser.parse_args(argv)
    torch.set_num_threads(arguments.threads)  # as each rank of the recorded step
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "timeline.json"
        command = [
            sys.executable, "-m", "graphkit", "timeline", arguments.spec, "--schedule", arguments.schedule,
            "--ranks", str(arguments.ranks), "--microbatches", str(arguments.microbatches),
            "--batch-size", str(arguments.batch_size), "--steps", str(arguments.steps),
            "--timeout", str(arguments.timeout), "--threads", str(arguments.threads), "-o", str(path),
        ]  # fmt: skip
        # the graphkit this process imports (PYTHONPATH): compare two checkouts with the same script
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        timeline = json.loads(path.read_text())
    durations: dict[tuple[int, str], list[float]] = {}
    for rank in timeline["ranks"]:
        for action in rank["actions"]:
            if action["phase"] == "run" and action["kind"] in ("F", "I", "W", "B"):
                key = (action["stage"], action["kind"])
                durations.setdefault(key, []).append(action["end"] - action["start"])
    costs = spec_costs(
        arguments.spec,
        pipeline=True,
        num_stages=timeline["num_stages"],
        batch_size=arguments.batch_size,
        microbatches=arguments.microbatches,
        repeat=arguments.repeat,
    )
    print(
        f"{arguments.schedule} on {arguments.ranks} ranks, {arguments.microbatches} microbatches of "
        f"{arguments.spec}: step {timeline['summary']['step_seconds'] * 1e3:.1f} ms"
    )
    print(
        f"{'stage':>5s} {'kind':>4s} {'n':>3s} {'recorded ms':>11s} {'costs ms':>9s} {'overhead ms':>11s} {'ratio':>6s}"
    )
    for (stage, kind), values in sorted(durations.items()):
        recorded = statistics.median(values)
        cost = None
        if kind in COST_FIELD:
            cost = costs.stages[stage].to_dict()[COST_FIELD[kind]]["seconds"]
        elif kind == "B":
            stage_costs = costs.stages[stage].to_dict()
            cost = stage_costs["backward_input"]["seconds"] + stage_costs["backward_weight"]["seconds"]
        cost_cell = f"{cost * 1e3:9.2f}" if cost else f"{'-':>9s}"
        over_cell = f"{(recorded - cost) * 1e3:11.2f}" if cost else f"{'-':>11s}"
        ratio_cell = f"{recorded / cost:5.2f}x" if cost else f"{'-':>6s}"
        print(
            f"{stage:5d} {kind:>4s} {len(values):3d} {recorded * 1e3:11.2f} {cost_cell} {over_cell} {ratio_cell}"
        )
    return 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
