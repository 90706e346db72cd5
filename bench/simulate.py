"""How fast graphkit's schedule simulator predicts a step, against PyTorch's order-only simulation.

    python bench/simulate.py [--ranks 64] [--microbatches 256] [--repeat 3] [--json]

Cases: 1F1B (F and full B) and ZB-H1 (F, I, W) with one stage per rank, unit costs; the best of
``--repeat`` wall times (``time.perf_counter``) of :func:`graphkit.pipelining.planning.simulate`, which predicts every
action's start and end, bubbles and memory. The baseline, measured in the same run on the same ZB-H1
order: PyTorch's ``_simulate_comms_compute`` (unit steps, order only) after ``_PipelineScheduleRuntime``
has lowered the order with sends and receives (minus the UNSHARD / RESHARD / REDUCE_GRAD actions its
simulation rejects); it grows faster than linearly, so it runs at
``--baseline-ranks`` x ``--baseline-microbatches`` (default 16 x 64) and the ratio compares time per action.
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import torch
from torch.distributed.pipelining import schedules as torch_schedules

from graphkit.pipelining.planning import StageCost, one_f_one_b, simulate, zb_h1

UNIT = StageCost(1.0, 1.0, 1.0, activation_bytes=1, weight_bytes=1)


def best_seconds(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def pytorch_seconds(ranks: int, microbatches: int) -> tuple[float, int]:
    """Lower the ZB-H1 order with PyTorch's runtime, then time its order-only simulation."""
    stage = SimpleNamespace(
        stage_index=0,
        num_stages=ranks,
        group_rank=0,
        group_size=ranks,
        is_first=True,
        is_last=ranks == 1,
        submod=torch.nn.Identity(),
        stage_index_to_group_rank=None,
    )
    runtime = torch_schedules._PipelineScheduleRuntime([stage], microbatches)
    order = {
        rank: [torch_schedules._Action.from_str(str(a)) for a in row]
        for rank, row in zb_h1(ranks, microbatches).items()
    }
    runtime._prepare_schedule_with_comms(order)
    # its simulation knows compute and send/receive actions only, not the UNSHARD / RESHARD / REDUCE_GRAD
    # its own lowering adds: drop those
    skip = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}
    lowered = {
        rank: [a for a in row if a.computation_type.value not in skip]
        for rank, row in runtime.pipeline_order_with_comms.items()
    }
    actions = sum(len(row) for row in lowered.values())
    start = time.perf_counter()
    torch_schedules._simulate_comms_compute(lowered, lambda s: runtime.stage_index_to_group_rank[s], ranks)
    return time.perf_counter() - start, actions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-ranks", type=int, default=16)
    parser.add_argument("--baseline-microbatches", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    p, m = args.ranks, args.microbatches
    rows = []
    for name, generate in (("1F1B", one_f_one_b), ("ZB-H1", zb_h1)):
        order = generate(p, m)
        count = sum(len(row) for row in order.values())
        seconds = best_seconds(lambda order=order: simulate(order, UNIT), args.repeat)
        rows.append({"case": f"graphkit {name} {p}x{m}", "actions": count, "seconds": seconds})
    baseline, baseline_actions = pytorch_seconds(args.baseline_ranks, args.baseline_microbatches)
    rows.append(
        {
            "case": f"PyTorch _simulate_comms_compute ZB-H1 {args.baseline_ranks}x{args.baseline_microbatches}",
            "actions": baseline_actions,
            "seconds": baseline,
        }
    )
    per_action = baseline / baseline_actions
    for row in rows:
        row["ratio_per_action"] = per_action / (row["seconds"] / row["actions"])
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':<55} {'actions':>8} {'seconds':>9} {'baseline/this per action':>25}")
    for row in rows:
        print(
            f"{row['case']:<55} {row['actions']:>8} {row['seconds']:>9.3f} {row['ratio_per_action']:>25.1f}"
        )


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    main()
