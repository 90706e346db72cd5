"""The layout time budget: a layout past its budget is drawn smaller and says so, a PNG past Graphviz's size
limit says it was shrunk, and ``inspect`` reports a timeout as a timeout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from graphkit.drawing import rendering
from graphkit.drawing.rendering import RenderTimeoutError, render
from graphkit.graph.autograd_graph import AutogradGraph
from graphkit.graph.tracing import trace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale_models import Recurrence  # noqa: E402


def recurrence_graph(steps: int) -> AutogradGraph:
    torch.manual_seed(0)
    return trace(Recurrence(steps), torch.randn(2, 16, requires_grad=True))[1]


def test_a_layout_past_its_budget_draws_a_smaller_diagram_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = recurrence_graph(200)
    calls: list[int] = []
    real_run_dot = rendering.run_dot

    def slow_first(source: str, output_format: str, timeout_s: float, nodes: int, warn: Any = None) -> bytes:
        calls.append(nodes)
        if len(calls) == 1:
            raise RenderTimeoutError(f"Graphviz 'dot' did not finish laying out {nodes} nodes")
        return real_run_dot(source, output_format, timeout_s, nodes)

    monkeypatch.setattr(rendering, "run_dot", slow_first)
    said: list[str] = []
    path = render(
        graph, tmp_path / "deep" / "er" / "graph.svg", timeout_s=5, progress=said.append, fold=False
    )
    assert path.exists() and len(calls) == 2 and calls[1] < calls[0]
    svg = path.read_text()
    assert "did not lay out" in svg and "folded" in svg
    assert any("laying out" in line for line in said) and any("drawn with repeated" in line for line in said)
    assert not any("Graphviz missing" in line or "not installed" in line for line in said)


def test_a_png_past_graphviz_size_limit_says_it_was_shrunk() -> None:
    said: list[str] = []
    chain = "digraph { " + "; ".join(f"n{i} -> n{i + 1}" for i in range(1200)) + " }"
    png = rendering.run_dot(chain, "png", 60, 1201, said.append)
    assert png[:4] == b"\x89PNG" and any("shrank the picture" in line and ".svg" in line for line in said)


def test_a_timeout_in_inspect_is_reported_as_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphkit.apps.report.inspection import collect
    from graphkit.apps.report.terminal import terminal_rows

    def always_slow(source: str, output_format: str, timeout_s: float, nodes: int, warn: Any = None) -> bytes:
        raise RenderTimeoutError(
            f"Graphviz 'dot' did not finish laying out {nodes} nodes within {timeout_s} s"
        )

    monkeypatch.setattr(rendering, "run_dot", always_slow)
    inspection = collect("zoo:mlp", timeout_s=1)
    assert inspection.svg is None and "did not finish" in inspection.diagram_note
    (diagram,) = [value for label, value in terminal_rows(inspection, tmp_path) if label == "diagram"]
    assert "time budget" in diagram and "Graphviz missing" not in diagram
