"""Diagrams and the explorer at real-model scale: wall times of the commands a user runs, in one run.

    python bench/draw_scale.py [--baseline-timeout SECONDS] [--json]

Cases (specs from bench/scale_models.py and hf:):

- ``graphkit render`` and ``graphkit inspect`` (fresh processes, interpreter start included) of a 12-layer
  GPT-2 middle stage and of the 1500-step residual recurrence (about 6000 nodes, folded);
- the notebook explorer on the 12-layer GPT-2 stage: picking a group and redrawing (Graphviz layout and
  the widget's HTML; the first pick of a group, then again from the cache) and selecting a node;
- the baseline, measured here too: the recurrence laid out unfolded (``fold=False``), stopped after
  ``--baseline-timeout`` seconds (default 30); the ratio column is baseline / folded.

The browser side of a group pick (widget message to redrawn picture) is timed by tests/test_browser.py,
which writes test-artifacts/browser-*-timing.txt.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import graphkit
from graphkit.drawing.rendering import RenderTimeoutError, render
from graphkit.models.specs import load_spec, spec_inputs_as_call

ROOT = Path(__file__).resolve().parent.parent
GPT2 = "hf:gpt2?stage=middle&n_layer=12"
RECURRENCE = "bench/scale_models.py:recurrence"


def command_seconds(*arguments: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "graphkit", *arguments], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def traced(spec: str) -> graphkit.AutogradGraph:
    module, inputs = load_spec(str(ROOT / spec) if spec.startswith("bench/") else spec)
    args, kwargs = spec_inputs_as_call(inputs)
    return graphkit.trace(module, *args, **kwargs)[1]


def explorer_seconds() -> dict[str, float]:
    from graphkit.apps.explorer import explore

    graph = traced(GPT2)
    start = time.perf_counter()
    explorer = explore(graph)
    opened = time.perf_counter() - start
    picks = []
    for index in (5, 17, 40):
        start = time.perf_counter()
        explorer.select_group(index)
        picks.append(time.perf_counter() - start)
    start = time.perf_counter()
    explorer.select_group(17)
    cached = time.perf_counter() - start
    node = next(iter(graph.nodes))
    start = time.perf_counter()
    explorer.select_node(node)
    selected = time.perf_counter() - start
    return {"open": opened, "group pick + redraw": max(picks), "cached pick": cached, "node select": selected}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline-timeout", type=float, default=30.0)
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args(argv)
    results: dict[str, float | str] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, spec in (("gpt2-12", GPT2), ("recurrence-1500", RECURRENCE)):
            results[f"render {name}"] = command_seconds("render", spec, "-o", f"{folder}/{name}.svg")
            results[f"inspect {name}"] = command_seconds("inspect", spec, "-o", f"{folder}/{name}")
        graph = traced(RECURRENCE)
        start = time.perf_counter()
        render(graph, f"{folder}/folded.svg")
        folded = time.perf_counter() - start
        start = time.perf_counter()
        try:
            render(
                graph,
                f"{folder}/unfolded.svg",
                fold=False,
                fallback=False,
                timeout_s=arguments.baseline_timeout,
            )
            baseline: float | str = time.perf_counter() - start
        except RenderTimeoutError:
            baseline = f"> {arguments.baseline_timeout:g}"
        results["recurrence layout folded"] = folded
        results["recurrence layout unfolded (baseline)"] = baseline
        if isinstance(baseline, float):
            results["ratio unfolded / folded"] = baseline / folded
        else:
            results["ratio unfolded / folded"] = f"> {arguments.baseline_timeout / folded:.0f}"
    for key, value in explorer_seconds().items():
        results[f"explorer gpt2-12 {key}"] = value
    if arguments.json:
        print(json.dumps(results, indent=1))
        return 0
    for key, value in results.items():
        shown = f"{value:.3f} s" if isinstance(value, float) and not key.startswith("ratio") else str(value)
        if key.startswith("ratio") and isinstance(value, float):
            shown = f"{value:.0f}x"
        print(f"{key:45s} {shown}")
    return 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
