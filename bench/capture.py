"""Benchmark graph capture: graphkit.capture next to torchviz.make_dot on the same autograd graph.

    python bench/capture.py [--layers 12 48 256 360] [--steps 2000] [--repeat 5] [--json]

For each ``nn.TransformerEncoder`` (d_model 16, 2 heads, feed-forward 16, batch 2, 4 tokens, post-LN,
no dropout, training mode) and for a ``steps``-long recurrence ``h = tanh(h @ W)``, one forward builds the
graph; then, on that same graph in the same run:

- ``graphkit.capture(outputs, inputs=..., module=...)`` with all details (shapes, saved tensors, names);
- ``graphkit.capture(..., details=False)``: the structure alone;
- ``torchviz.make_dot(outputs, params=dict(module.named_parameters()))``, torchviz 0.0.3's one call,
  with Python's default recursion limit. Its recursive walk raises RecursionError on deep graphs; that
  is caught and reported in place of a time.

Times are the median of ``--repeat`` calls (seconds, wall clock). The ratio column is torchviz's time
over graphkit's full capture. The goal line says whether a graph of 20,000 nodes or more was captured
in under a second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

import graphkit

GOAL_NODES = 20_000
GOAL_SECONDS = 1.0


@dataclass(slots=True)
class Row:
    """One benchmarked graph. Times in seconds; ``torchviz_error`` replaces ``torchviz_s`` on failure."""

    model: str
    nodes: int
    edges: int
    capture_s: float
    structure_s: float
    torchviz_s: float | None
    torchviz_error: str | None

    @property
    def ratio(self) -> float | None:
        return None if self.torchviz_s is None else self.torchviz_s / self.capture_s


def encoder(layers: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A ``layers``-deep TransformerEncoder (d_model 16) and its input, float32 ``(2, 4, 16)``."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    module = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return module, {"src": torch.randn(2, 4, 16, requires_grad=True)}


class Recurrence(nn.Module):
    """``h = tanh(h @ weight)`` ``steps`` times: a graph ``2 * steps`` nodes deep."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps
        self.weight = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x
        for _ in range(self.steps):
            hidden = torch.tanh(hidden @ self.weight)
        return hidden


def recurrence(steps: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    return Recurrence(steps), {"x": torch.randn(2, 16, requires_grad=True)}


def median_time(function: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def benchmark(name: str, module: nn.Module, inputs: dict[str, torch.Tensor], repeat: int) -> Row:
    outputs = module(**inputs)
    graph = graphkit.capture(outputs, inputs=inputs, module=module)  # warm-up, and the sizes
    capture_s = median_time(lambda: graphkit.capture(outputs, inputs=inputs, module=module), repeat)
    structure_s = median_time(
        lambda: graphkit.capture(outputs, inputs=inputs, module=module, details=False), repeat
    )
    torchviz_s, torchviz_error = None, None
    try:
        from torchviz import make_dot
    except ImportError:
        torchviz_error = "torchviz not installed (pip install torchviz==0.0.3)"
    else:
        params = dict(module.named_parameters())
        try:
            make_dot(outputs, params=params)
            torchviz_s = median_time(lambda: make_dot(outputs, params=params), repeat)
        except RecursionError as error:
            torchviz_error = f"RecursionError ({error})"
    return Row(
        name,
        graph.number_of_nodes(),
        graph.number_of_edges(),
        capture_s,
        structure_s,
        torchviz_s,
        torchviz_error,
    )


def format_table(rows: list[Row]) -> str:
    header = ("graph", "nodes", "edges", "capture s", "structure s", "torchviz s", "torchviz / capture")
    lines = [header]
    for row in rows:
        torchviz = f"{row.torchviz_s:.3f}" if row.torchviz_s is not None else "RecursionError"
        if row.torchviz_error and not row.torchviz_error.startswith("RecursionError"):
            torchviz = "n/a"
        lines.append(
            (
                row.model,
                f"{row.nodes:,}",
                f"{row.edges:,}",
                f"{row.capture_s:.3f}",
                f"{row.structure_s:.3f}",
                torchviz,
                f"{row.ratio:.2f}x" if row.ratio is not None else "-",
            )
        )
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    text = [
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]
    text.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(text)


def goal_line(rows: list[Row]) -> str:
    big = [row for row in rows if row.nodes >= GOAL_NODES]
    if not big:
        return f"goal: no graph of {GOAL_NODES:,}+ nodes was measured (add --layers 360)"
    worst = max(big, key=lambda row: row.capture_s)
    verdict = "met" if worst.capture_s < GOAL_SECONDS else "NOT met"
    return (
        f"goal ({GOAL_NODES:,}+ nodes captured in under {GOAL_SECONDS:.0f} s): {verdict} - "
        f"{worst.model}, {worst.nodes:,} nodes in {worst.capture_s:.3f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 48, 256, 360])
    parser.add_argument("--steps", type=int, default=2000, help="recurrence length (0: skip)")
    parser.add_argument("--repeat", type=int, default=5, help="calls per measurement (median)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    arguments = parser.parse_args(argv)

    rows = []
    for layers in arguments.layers:
        module, inputs = encoder(layers)
        rows.append(benchmark(f"encoder-{layers}", module, inputs, arguments.repeat))
        print(f"measured encoder-{layers}", file=sys.stderr)
    if arguments.steps:
        module, inputs = recurrence(arguments.steps)
        rows.append(benchmark(f"recurrence-{arguments.steps}", module, inputs, arguments.repeat))

    if arguments.json:
        print(json.dumps([asdict(row) | {"ratio": row.ratio} for row in rows], indent=2))
    else:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {arguments.repeat}")
        print(format_table(rows))
        print(goal_line(rows))
        for row in rows:
            if row.torchviz_error:
                print(f"{row.model}: torchviz {row.torchviz_error}")
    return 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
