"""graphkit.trace: every op node carries the path of the module whose forward created it."""

from __future__ import annotations

from typing import Any

import models
import pytest
import torch
from torch import nn
from torch.nn import functional
from torch_versions import LINEAR_3D_OUTPUT_NODE

from graphkit import capture, trace
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind
from graphkit.graph.tensors import GraphkitInputError


def paths_by_op(graph: AutogradGraph) -> list[tuple[str, str | None]]:
    """``[(autograd class name, module_path)]`` of the op nodes, sorted."""
    return sorted(
        (data["name"], data["module_path"])
        for _, data in graph.nodes(data=True)
        if data["kind"] not in (NodeKind.PARAMETER, NodeKind.LEAF, NodeKind.STAGE_INPUT)
    )


def test_nested_modules_stamp_their_own_paths() -> None:
    module, inputs = models.nested()
    outputs, graph = trace(module, **inputs)

    assert paths_by_op(graph) == sorted(
        [
            ("AddmmBackward0", "blocks.0.proj"),
            ("TBackward0", "blocks.0.proj"),
            ("ReluBackward0", "blocks.0"),
            ("AddmmBackward0", "blocks.1.proj"),
            ("TBackward0", "blocks.1.proj"),
            ("ReluBackward0", "blocks.1"),
            ("SigmoidBackward0", ""),
            ("MulBackward0", ""),
            ("AddmmBackward0", "head"),
            ("TBackward0", "head"),
        ]
    )
    parameters = {name: graph.nodes[node]["module_path"] for name, node in graph.parameter_nodes().items()}
    assert parameters == {
        "blocks.0.proj.weight": "blocks.0.proj",
        "blocks.0.proj.bias": "blocks.0.proj",
        "blocks.1.proj.weight": "blocks.1.proj",
        "blocks.1.proj.bias": "blocks.1.proj",
        "head.weight": "head",
        "head.bias": "head",
    }
    assert graph.nodes[graph.inputs[0].node]["module_path"] is None
    torch.testing.assert_close(outputs, module(**inputs), rtol=0, atol=0)


def test_f_linear_stamps_both_its_t_and_addmm_nodes() -> None:
    class TwoLinears(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(4, 4)
            self.weight = nn.Parameter(torch.randn(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return functional.linear(self.first(x), self.weight)

    module = TwoLinears()
    _, graph = trace(module, torch.randn(2, 4, requires_grad=True))
    addmm = graph.outputs[0].node
    assert graph.nodes[addmm]["name"] == "MmBackward0"  # no bias: t + mm
    assert paths_by_op(graph) == [
        ("AddmmBackward0", "first"),
        ("MmBackward0", ""),
        ("TBackward0", ""),
        ("TBackward0", "first"),
    ]
    assert graph.nodes[graph.parameter_nodes()["weight"]]["module_path"] == ""


def test_a_module_called_twice_stamps_both_calls() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(3, 3)
            self.other = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(self.other(self.layer(x)))

    _, graph = trace(Twice(), torch.randn(2, 3, requires_grad=True))
    assert paths_by_op(graph) == sorted(
        [("AddmmBackward0", "layer"), ("TBackward0", "layer")] * 2
        + [("AddmmBackward0", "other"), ("TBackward0", "other")]
    )


class Doubler(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class DoubledLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Doubler.apply(self.proj(x))  # the custom node is this module's last op


def test_custom_function_nodes_get_the_module_that_applied_them() -> None:
    """``Function.apply`` bypasses torch function modes; the node must not take the next consumer's path."""

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = DoubledLinear()
            self.head = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(Doubler.apply(self.inner(x)))  # the second Doubler runs in the root

    _, graph = trace(Outer(), torch.randn(2, 3, requires_grad=True))
    assert paths_by_op(graph) == sorted(
        [
            ("AddmmBackward0", "inner.proj"),
            ("TBackward0", "inner.proj"),
            ("DoublerBackward", "inner"),
            ("DoublerBackward", ""),
            ("AddmmBackward0", "head"),
            ("TBackward0", "head"),
        ]
    )


def test_custom_multi_output_function_in_the_root_module() -> None:
    module, inputs = models.custom_multi_output()
    _, graph = trace(module, **inputs)
    assert paths_by_op(graph) == [("MulBackward0", ""), ("ScaleAndShiftBackward", ""), ("TanhBackward0", "")]


def test_lstm_and_view_outputs_are_stamped() -> None:
    module, inputs = models.lstm()
    _, graph = trace(module, **inputs)
    assert {path for _, path in paths_by_op(graph)} == {"lstm"}

    module, inputs = models.view_outputs()
    _, graph = trace(module, **inputs)
    # the input's flattening view, and the output's reshape (a view up to torch 2.14, an _unsafe_view since)
    assert paths_by_op(graph) == sorted(
        [
            ("AddmmBackward0", "linear"),
            ("TBackward0", "linear"),
            ("TransposeBackward0", ""),
            ("ViewBackward0", "linear"),
            (LINEAR_3D_OUTPUT_NODE, "linear"),
        ]
    )


def test_nodes_made_before_the_trace_are_not_stamped() -> None:
    x = torch.randn(2, 4, requires_grad=True)
    hidden = torch.tanh(x)  # an earlier stage's op, outside the trace
    module = nn.Linear(4, 4)
    _, graph = trace(module, hidden)
    assert paths_by_op(graph) == [("AddmmBackward0", ""), ("TBackward0", "")]
    assert "graphkit.module_path" not in hidden.grad_fn.metadata


def test_positional_and_keyword_inputs_are_named() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor, *, gate: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return self.linear(x) * gate + ids.float().sum()

    x = torch.randn(2, 3, requires_grad=True)
    gate = torch.randn(2, 3, requires_grad=True)
    _, graph = trace(TwoInputs(), x, gate=gate, ids=torch.arange(3))
    assert [endpoint.name for endpoint in graph.inputs] == ["0", "gate"]
    assert [graph.autograd_nodes[endpoint.node].variable for endpoint in graph.inputs] == [x, gate]


def test_hooks_are_removed_after_the_trace_and_after_an_error() -> None:
    module, inputs = models.nested()
    trace(module, **inputs)
    for submodule in module.modules():
        assert not submodule._forward_hooks and not submodule._forward_pre_hooks

    class Failing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.linear(x)
            raise RuntimeError("forward failed")

    failing = Failing()
    with pytest.raises(RuntimeError, match="forward failed"):
        trace(failing, torch.randn(2, 3))
    for submodule in failing.modules():
        assert not submodule._forward_hooks and not submodule._forward_pre_hooks
    # The torch function mode is gone too: a later forward is not stamped.
    later = nn.Linear(3, 3)(torch.randn(2, 3))
    assert "graphkit.module_path" not in later.grad_fn.metadata


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_trace_under_no_grad_raises_the_clear_error(context: Any) -> None:
    module, inputs = models.linear()
    with context(), pytest.raises(GraphkitInputError, match=r"torch\.no_grad\(\)"):
        trace(module, **inputs)


def test_trace_of_integer_outputs_raises_the_clear_error() -> None:
    class Argmax(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x).argmax(-1)

    with pytest.raises(GraphkitInputError, match="integer and bool tensors never require grad"):
        trace(Argmax(), torch.randn(2, 3))


def test_trace_and_capture_give_the_same_graph_apart_from_module_paths() -> None:
    module, inputs = models.nested()
    _, traced = trace(module, **inputs)
    captured = capture(module(**inputs), inputs=inputs, module=module)
    assert sorted(traced.edges(data=True)) == sorted(captured.edges(data=True))
    for node, data in traced.nodes(data=True):
        other = dict(captured.nodes[node])
        if data["kind"] not in (NodeKind.PARAMETER,):
            assert other.pop("module_path") is None
            other["module_path"] = data["module_path"]
        assert data == other
