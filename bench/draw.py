"""Benchmark drawing: graphkit's diagram against torchviz on the same autograd graph, in the same run.

    python bench/draw.py [--timeout SECONDS] [--only CASE ...] [--json]
    python bench/draw.py --images docs/images      # regenerate the PNGs of the documentation

For every case: nodes captured and drawn, seconds to capture (``graphkit.trace``), to build the DOT source
(``graphkit.draw``) and to lay it out to SVG with Graphviz ``dot`` (``graphkit.render``); then
``torchviz.make_dot`` on the same model and inputs, laid out to SVG by the same ``dot``, in a child process
stopped after ``--timeout`` seconds (default 120; "did not finish" when it runs longer). The last column is
torchviz's time over graphkit's, both measured here.

Cases: a 48-layer ``nn.TransformerEncoder`` (d_model 16) drawn with the default node budget (collapsed
automatically) and collapsed to one node per layer, the same encoder drawn in full, and a 100-step chain
``h = tanh(h @ W)`` that uses one weight 100 times (drawn with one copy of ``W`` per use).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import graphkit
from graphkit.drawing import RenderTimeoutError, draw, render
from graphkit.drawing.collapsing import choose_collapse_depth, drawn_node_count
from graphkit.models import zoo

Model = tuple[nn.Module, tuple[Any, ...]]


def encoder(layers: int = 48, width: int = 16) -> Model:
    """``nn.TransformerEncoder``: ``layers`` post-norm layers of width ``width``, input (2, 8, width)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(width, 2, 4 * width, dropout=0.0, batch_first=True)
        module = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        return module, (torch.randn(2, 8, width, requires_grad=True),)


def chain(steps: int = 100) -> Model:
    """One (8, 8) weight used ``steps`` times: ``h = tanh(h @ W)``, input (4, 8)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return zoo.Chain(steps=steps), (torch.randn(4, 8, requires_grad=True),)


# case name -> (model builder, graphkit.draw options)
CASES: dict[str, tuple[Callable[[], Model], dict[str, Any]]] = {
    "encoder-48x16 (budget 400)": (encoder, {}),
    "encoder-48x16 (per layer)": (encoder, {"collapse_depth": 2}),
    "encoder-48x16 (full)": (encoder, {"max_nodes": None}),
    "chain-100 shared W": (chain, {}),
}


def run_torchviz(case: str) -> None:
    """Child process: make_dot on the case's output, then lay it out to SVG; print the timings as JSON."""
    import torchviz

    module, inputs = CASES[case][0]()
    output = module(*inputs)
    start = time.perf_counter()
    digraph = torchviz.make_dot(output, params=dict(module.named_parameters()))
    built = time.perf_counter()
    digraph.pipe(format="svg")
    done = time.perf_counter()
    print(json.dumps({"build_s": built - start, "total_s": done - start}))


def time_torchviz(case: str, timeout_s: float) -> dict[str, Any]:
    """Run :func:`run_torchviz` in its own process group; kill the group (dot included) after ``timeout_s``."""
    command = [sys.executable, __file__, "--torchviz", case]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return {"status": f"did not finish in {timeout_s:g} s"}
    if process.returncode != 0:
        lines = stderr.decode("utf-8", "replace").strip().splitlines()
        return {"status": "failed: " + (lines[-1] if lines else f"exit status {process.returncode}")}
    return {"status": "ok", **json.loads(stdout.decode().strip().splitlines()[-1])}


def time_graphkit(case: str, timeout_s: float) -> dict[str, Any]:
    builder, options = CASES[case]
    module, inputs = builder()
    start = time.perf_counter()
    _, graph = graphkit.trace(module, *inputs)
    captured = time.perf_counter()
    draw(graph, **options)
    built = time.perf_counter()
    depth = options.get("collapse_depth")
    budget = options.get("max_nodes", 400)
    if depth is None and budget is not None:
        depth = choose_collapse_depth(graph, budget)[0]
    result: dict[str, Any] = {
        "nodes": graph.number_of_nodes(),
        "drawn": drawn_node_count(graph, depth),
        "capture_s": captured - start,
        "draw_s": built - captured,
    }
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        try:
            render(graph, Path(folder) / "diagram.svg", timeout_s=timeout_s, **options)
        except RenderTimeoutError:
            return {**result, "status": f"did not finish in {timeout_s:g} s"}
        result["render_s"] = time.perf_counter() - start
    return {**result, "status": "ok"}


def _seconds(result: dict[str, Any], key: str) -> str:
    return f"{result[key]:.2f}" if key in result else "-"


def benchmark(cases: list[str], timeout_s: float, as_json: bool) -> int:
    header = (
        f"{'case':28s} {'nodes':>6s} {'drawn':>6s} {'draw s':>7s} {'render s':>9s}   "
        f"{'torchviz s':>24s} {'torchviz/graphkit':>18s}"
    )
    if not as_json:
        print(header)
        print("-" * len(header))
    results = {}
    for case in cases:
        ours = time_graphkit(case, timeout_s)
        theirs = time_torchviz(case, timeout_s)
        results[case] = {"graphkit": ours, "torchviz": theirs}
        if as_json:
            continue
        render_text = _seconds(ours, "render_s") if ours["status"] == "ok" else ours["status"]
        torchviz_text = _seconds(theirs, "total_s") if theirs["status"] == "ok" else theirs["status"]
        if ours["status"] == "ok" and theirs["status"] == "ok":
            ratio = f"{theirs['total_s'] / ours['render_s']:.1f}x"
        elif ours["status"] == "ok":
            ratio = f"> {timeout_s / ours['render_s']:.0f}x"
        else:
            ratio = "-"
        print(
            f"{case:28s} {ours['nodes']:6d} {ours['drawn']:6d} {_seconds(ours, 'draw_s'):>7s} "
            f"{render_text:>9s}   {torchviz_text:>24s} {ratio:>18s}",
            flush=True,
        )
    if as_json:
        print(json.dumps(results, indent=1))
    else:
        print(
            "\ndraw s: building the DOT source; render s: draw + Graphviz layout to SVG (graphkit.render); "
            "torchviz s: make_dot + the same layout."
        )
    return 0


# --- documentation images ----------------------------------------------------------------------------------
_MAX_PNG_BYTES = 500_000


def _png(digraph: Any) -> bytes:
    """PNG bytes of ``digraph`` at the highest of a few resolutions that stays under 500 KB."""
    data = b""
    for dpi in (96, 80, 64, 48, 36):
        digraph.attr("graph", dpi=str(dpi))
        data = digraph.pipe(format="png")
        if len(data) < _MAX_PNG_BYTES:
            break
    return data


def write_images(folder: Path) -> int:
    """Draw every zoo model, a highlighted group and a 12-layer GPT-2 (whole, and its middle stage)."""
    folder.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, Callable[[], tuple[Any, Any]], dict[str, Any]]] = [
        (f"zoo_{name}", lambda name=name: zoo.build(name), {"title": f"zoo:{name}"}) for name in zoo.MODELS
    ]
    jobs.append(
        (
            "zoo_gpt_stage_highlight",
            lambda: zoo.build("gpt_stage"),
            {"title": "zoo:gpt_stage, group 6 highlighted", "highlight_group": 6},
        )
    )
    for spec, name in (
        ("hf:gpt2?n_layer=12", "gpt2_12_layers"),
        ("hf:gpt2?n_layer=12&stage=middle", "gpt2_12_layers_middle"),
    ):
        jobs.append((name, lambda spec=spec: _load_hf(spec), {"title": spec}))
    for name, build, options in jobs:
        module, inputs = build()
        if isinstance(inputs, dict):
            _, graph = graphkit.trace(module, **inputs)
        else:
            _, graph = graphkit.trace(module, *inputs)
        data = _png(draw(graph, **options))
        path = folder / f"{name}.png"
        path.write_bytes(data)
        print(f"{path}  {len(data) / 1000:.0f} KB")
    return 0


def _load_hf(spec: str) -> tuple[Any, Any]:
    from graphkit.models.huggingface import load_hf_spec

    return load_hf_spec(spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a layout is stopped")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--images", type=Path, help="write the documentation PNGs to this folder instead")
    parser.add_argument("--torchviz", help=argparse.SUPPRESS)  # child process of the torchviz timing
    arguments = parser.parse_args(argv)
    if arguments.torchviz:
        run_torchviz(arguments.torchviz)
        return 0
    if arguments.images:
        return write_images(arguments.images)
    cases = [case for case in CASES if not arguments.only or case in arguments.only]
    return benchmark(cases, arguments.timeout, arguments.json)


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    sys.exit(main())
