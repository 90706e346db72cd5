"""Folding repeated structure: a long recurrence drawn as one node per repeated op, the repeat keys that tell
positions apart and match identical blocks, and ``fold=`` forcing folding off or on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from graphkit.drawing.diagram import draw
from graphkit.drawing.folding import folded_node_count, repeat_keys
from graphkit.drawing.rendering import drawn_nodes
from graphkit.graph.autograd_graph import AutogradGraph, capture
from graphkit.graph.tracing import trace
from graphkit.models import zoo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale_models import Recurrence  # noqa: E402


def recurrence_graph(steps: int) -> AutogradGraph:
    torch.manual_seed(0)
    return trace(Recurrence(steps), torch.randn(2, 16, requires_grad=True))[1]


def test_a_long_recurrence_folds_into_one_node_per_repeated_op() -> None:
    steps = 1500
    graph = recurrence_graph(steps)
    assert graph.number_of_nodes() == 4 * steps + 3  # add, tanh, addmm, t per step; weight, bias, input

    source = draw(graph).source  # past max_nodes, no module depth fits (every step is module "cell")
    assert "repeated structure folded" in source
    folds = {
        match.group(1): int(match.group(2)) for match in re.finditer(r"<b>(\w+) \u00d7(\d+)</b>", source)
    }
    assert set(folds) == {"add", "tanh", "addmm", "t"}
    drawn_ops = {
        op: sum(1 for line in source.split("\n") if re.search(rf"<b>{op}</b>", line)) for op in folds
    }
    for op, repeats in folds.items():  # every node drawn once: folded or on its own
        assert repeats + drawn_ops[op] == steps
    assert drawn_nodes(draw(graph)) < 30


def test_repeat_keys_tell_positions_apart_and_match_identical_blocks() -> None:
    module, (hidden,) = zoo.build("gpt_stage")
    graph = capture(module(hidden), inputs=[hidden], module=module)  # no module paths
    keys = repeat_keys(graph)
    by_name = {graph.nodes[node]["param_names"][0]: keys[node] for node in graph.parameter_nodes().values()}
    assert by_name["blocks.0.mlp.fc.weight"] == by_name["blocks.1.mlp.fc.weight"]
    assert by_name["blocks.0.mlp.fc.weight"] != by_name["blocks.0.mlp.proj.weight"]
    # the two residual adds of a block compute the same op on the same shapes, at different positions
    adds = [node for node in graph.nodes if graph.nodes[node]["op"] == "add"]
    assert len({keys[node] for node in adds}) > 1
    folded = draw(graph, fold=True).source
    assert "blocks.*.mlp.fc.weight \u00d72" in folded
    assert folded_node_count(graph) < graph.number_of_nodes() * 0.7
    with pytest.raises(ValueError, match="rounds"):
        repeat_keys(graph, rounds=-1)


def test_fold_false_never_folds_and_fold_true_always_does() -> None:
    graph = recurrence_graph(30)
    assert "folded" not in draw(graph, fold=False, max_nodes=10).source
    assert "repeated structure folded" in draw(graph, fold=True, max_nodes=None).source
