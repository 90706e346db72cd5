"""Activation checkpointing under graphkit's split: recomputations, FLOPs, memory between B and W, time.

    python bench/checkpointing.py [--repeat N] [--threads N] [--width W] [--json]

The stage: four GPT blocks (``graphkit.models.zoo.Block``), each wrapped in
``torch.utils.checkpoint.checkpoint``. For each variant - no checkpointing, non-reentrant
checkpointing with ``recompute="in-w"`` (the default) and ``"keep-from-b"``, reentrant checkpointing -
it prints the block forwards run by the full backward and by B and W (a forward pre-hook counts them),
FLOPs of B + W over the full backward's, ``retained_bytes`` (what the split keeps alive between B and W
once the stage outputs are dropped, :func:`graphkit.measure.benchmark.memory_kept`) and the median time
of B + W over the full backward of the same variant, all measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphkit.measure.benchmark import memory_kept
from graphkit.measure.flops import FlopCounter
from graphkit.models import zoo
from graphkit.split.backward import backward_input, backward_weight


class CheckpointedBlocks(nn.Module):
    def __init__(self, config: zoo.GPTConfig, mode: str) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(zoo.Block(config) for _ in range(4))
        self.mode = mode

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.mode == "none":
                hidden = block(hidden)
            else:
                hidden = checkpoint(block, hidden, use_reentrant=self.mode == "reentrant")
        return hidden


VARIANTS = {
    "no checkpointing": ("none", "in-w"),
    "non-reentrant, in-w": ("non-reentrant", "in-w"),
    "non-reentrant, keep-from-b": ("non-reentrant", "keep-from-b"),
    "reentrant": ("reentrant", "in-w"),
}


def measure(name: str, width: int, repeat: int) -> dict[str, Any]:
    mode, recompute = VARIANTS[name]
    torch.manual_seed(0)
    config = zoo.GPTConfig(context_length=32, width=width, heads=4, layers=4, batch=4, tokens=32)
    stage = CheckpointedBlocks(config, mode)
    forwards = [0]
    for block in stage.blocks:
        block.register_forward_pre_hook(lambda module, args: forwards.__setitem__(0, forwards[0] + 1))
    x = torch.randn(config.batch, config.tokens, width)
    grad = torch.randn(config.batch, config.tokens, width)

    def fresh() -> tuple[torch.Tensor, torch.Tensor]:
        stage.zero_grad(set_to_none=True)
        hidden = x.clone().requires_grad_()
        out = stage(hidden)
        forwards[0] = 0
        return hidden, out

    full_times, split_times = [], []
    for _ in range(repeat + 1):
        hidden, out = fresh()
        start = time.perf_counter()
        out.backward(grad)
        full_times.append(time.perf_counter() - start)
        hidden, out = fresh()
        start = time.perf_counter()
        state = backward_input(out, grad, hidden, recompute=recompute)
        del out
        backward_weight(state)
        split_times.append(time.perf_counter() - start)

    hidden, out = fresh()
    with FlopCounter() as full_counter:
        out.backward(grad)
    full_forwards = forwards[0]
    hidden, out = fresh()
    with FlopCounter() as b_counter:
        state = backward_input(out, grad, hidden, recompute=recompute)
    b_forwards = forwards[0]
    del out
    retained, _ = memory_kept(state)
    with FlopCounter() as w_counter:
        backward_weight(state)
    full_flops = full_counter.get_total_flops()
    split_flops = b_counter.get_total_flops() + w_counter.get_total_flops()
    return {
        "variant": name,
        "forwards_full": full_forwards,
        "forwards_b": b_forwards,
        "forwards_w": forwards[0] - b_forwards,
        "flops_full": full_flops,
        "flops_b": b_counter.get_total_flops(),
        "flops_w": w_counter.get_total_flops(),
        "flops_ratio": split_flops / full_flops,
        "retained_bytes": retained,
        "time_ratio": statistics.median(split_times[1:]) / statistics.median(full_times[1:]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args(argv)
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*reentrant activation checkpoint")
        rows = [measure(name, arguments.width, arguments.repeat) for name in VARIANTS]
    if arguments.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'variant':28} {'forwards full/B/W':>18} {'FLOPs (B+W)/full':>17} {'retained KiB':>13} "
        f"{'time (B+W)/full':>16}"
    )
    for row in rows:
        forwards = f"{row['forwards_full']}/{row['forwards_b']}/{row['forwards_w']}"
        print(
            f"{row['variant']:28} {forwards:>18} {row['flops_ratio']:17.3f} "
            f"{row['retained_bytes'] / 1024:13.1f} {row['time_ratio']:16.2f}"
        )
    return 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
