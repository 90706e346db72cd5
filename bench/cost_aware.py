"""The simulator's step of every one-stage-per-rank generator, as a ratio to 1F1B's in the same run.

    python bench/cost_aware.py [--overhead 0] [--json]

Costs per stage (every stage the same, milliseconds): this CPU's (``mlp_wide``'s last stage recorded on 2
gloo ranks: F 6, I 5.6, W 12.7, B 12.7, the split 1.44 B) and the ZB paper's (F = I = W = 1, B = 2). Shapes: 2
x 8, 4 x 8 and 8 x 16 ranks x microbatches; free messages; ``--overhead`` ms of runtime after each action.
Printed: step over 1F1B's step for ZB-H1, ZB-H2, Adaptive, 1F1B with the last k microbatches of each rank
split (their W's at the end, k searched per rank by coordinate descent) and CostAware, how many of its
backwards are full, and the seconds :func:`~graphkit.pipelining.planning.cost_aware_schedule` took.
"""

from __future__ import annotations

import argparse
import json
import time

from graphkit.pipelining.planning import (
    StageCost,
    adaptive_schedule,
    cost_aware_schedule,
    one_f_one_b,
    simulate,
    split_last,
    zb_h1,
    zb_h2,
)

COSTS = {
    "this CPU (F 6, I 5.6, W 12.7, B 12.7 ms)": StageCost(6.0, 5.6, 12.7, full_backward=12.7),
    "ZB paper (F = I = W, B = 2F)": StageCost(1.0, 1.0, 1.0, full_backward=2.0),
}
SHAPES = ((2, 8), (4, 8), (8, 16))


def best_split_last(costs: StageCost, ranks: int, microbatches: int, overhead: float) -> float:
    """The shortest step of 1F1B with the last ``k[r]`` microbatches of rank ``r`` split (coordinate descent)."""
    split = [0] * ranks
    best = simulate(split_last(ranks, microbatches, split), costs, overhead=overhead).step_seconds
    changed = True
    while changed:
        changed = False
        for rank in range(ranks):
            for count in range(microbatches + 1):
                trial = [*split[:rank], count, *split[rank + 1 :]]
                step = simulate(split_last(ranks, microbatches, trial), costs, overhead=overhead).step_seconds
                if step < best - 1e-12:
                    best, split, changed = step, trial, True
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead", type=float, default=0.0, help="ms of runtime after each action")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    arguments = parser.parse_args()
    rows = []
    for label, costs in COSTS.items():
        for ranks, microbatches in SHAPES:

            def step(order, costs=costs):
                return simulate(order, costs, overhead=arguments.overhead).step_seconds

            base = step(one_f_one_b(ranks, microbatches))
            start = time.perf_counter()
            order = cost_aware_schedule(costs, ranks, microbatches, overhead=arguments.overhead)
            seconds = time.perf_counter() - start
            rows.append(
                {
                    "costs": label,
                    "shape": f"{ranks} x {microbatches}",
                    "ZB-H1": step(zb_h1(ranks, microbatches)) / base,
                    "ZB-H2": step(zb_h2(ranks, microbatches)) / base,
                    "Adaptive": step(adaptive_schedule(costs, ranks, microbatches)) / base,
                    "split last k": best_split_last(costs, ranks, microbatches, arguments.overhead) / base,
                    "CostAware": step(order) / base,
                    "full backwards": sum(a.kind == "B" for row in order.values() for a in row),
                    "backwards": ranks * microbatches,
                    "seconds": seconds,
                }
            )
    if arguments.json:
        print(json.dumps(rows, indent=1))
        return
    names = ("ZB-H1", "ZB-H2", "Adaptive", "split last k", "CostAware")
    print(f"step / 1F1B's step (overhead {arguments.overhead:g} ms per action, free messages)")
    print(f"{'costs':<42} {'shape':>7} " + " ".join(f"{name:>12}" for name in names) + "   full B   seconds")
    for row in rows:
        print(
            f"{row['costs']:<42} {row['shape']:>7} "
            + " ".join(f"{row[name]:>12.3f}" for name in names)
            + f"   {row['full backwards']:>3}/{row['backwards']:<3} {row['seconds']:>6.2f}"
        )


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    main()
