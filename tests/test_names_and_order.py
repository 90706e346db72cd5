"""Op names as PyTorch spells them, and parameter groups numbered in forward order."""

from __future__ import annotations

import re

import models
import pytest
import torch
from torch import nn

from graphkit.analysis.parameter_groups import forward_ranks, natural_key, param_groups
from graphkit.graph import _autograd
from graphkit.graph.autograd_graph import AutogradGraph, capture
from graphkit.graph.tracing import trace
from graphkit.models import zoo
from graphkit.models.specs import spec_inputs_as_call


def _aten_operator_names() -> set[str]:
    """Every ATen op name, leading underscores dropped: the oracle for op names."""
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, name = qualified.partition("::")
        if namespace == "aten":
            names.add(name.partition(".")[0].lstrip("_"))
    return names


class _Vision(nn.Module):
    """Ops with digits in their names: pooling, upsampling, FFT (what a ResNet or a U-Net uses)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        y = nn.functional.adaptive_avg_pool2d(y, (3, 3)) + nn.functional.avg_pool2d(y, 2)[..., :1, :1]
        y = nn.functional.interpolate(y, scale_factor=2, mode="bilinear") + nn.functional.interpolate(
            y, scale_factor=2, mode="nearest"
        )
        return torch.fft.rfft2(y).abs().sum() + nn.functional.max_pool1d(y.flatten(2), 2).sum()


def _node_classes() -> dict[str, torch.autograd.graph.Node]:
    """One live Node of every backward Node class the zoo, the test models and ``_Vision`` produce."""
    found: dict[str, torch.autograd.graph.Node] = {}
    graphs: list[AutogradGraph] = []
    for name in zoo.MODELS:
        module, inputs = zoo.build(name)
        args, kwargs = spec_inputs_as_call(inputs)
        graphs.append(trace(module, *args, **kwargs)[1])
    for kind in models.KINDS:
        module, inputs = models.KINDS[kind]()
        graphs.append(capture(module(**inputs), inputs=inputs, module=module))
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    graphs.append(trace(_Vision(), x)[1])
    for graph in graphs:
        for node in graph.autograd_nodes.values():
            found.setdefault(type(node).__name__, node)
    return found


NODE_CLASSES = _node_classes()


@pytest.mark.parametrize("class_name", sorted(NODE_CLASSES))
def test_every_backward_node_class_is_named_as_pytorch_names_its_op(class_name: str) -> None:
    node = NODE_CLASSES[class_name]
    name = _autograd.forward_op_name(node)
    if _autograd.is_custom_function(node):
        assert name == re.sub(r"Backward\d*$", "", class_name)
    elif _autograd.is_accumulate_grad(node):
        assert name == "accumulate_grad"
    else:
        assert name in _aten_operator_names(), f"{class_name} -> {name!r} is no ATen op"
    assert not re.search(r"\d_[a-z](_|$)", name), f"a digit split from its letter: {name}"


def test_ops_with_digits_keep_them_in_their_words() -> None:
    expected = {
        "MaxPool2DWithIndicesBackward0": "max_pool2d_with_indices",
        "UpsampleBilinear2DBackward0": "upsample_bilinear2d",
        "FftR2CBackward0": "fft_r2c",
        "AdaptiveAvgPool2DBackward0": "adaptive_avg_pool2d",
        "ConvolutionBackward0": "convolution",
        "NativeBatchNormBackward0": "native_batch_norm",
    }
    for class_name, op in expected.items():
        assert _autograd.forward_op_name(NODE_CLASSES[class_name]) == op


def test_gpt_stage_groups_follow_the_forward_block_by_block() -> None:
    module, inputs = zoo.build("gpt_stage")
    args, kwargs = spec_inputs_as_call(inputs)
    _, graph = trace(module, *args, **kwargs)
    order = [group.params[0].rpartition(".")[0] for group in param_groups(graph)]
    layers = ["ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc", "mlp.proj"]
    assert order == [f"blocks.{block}.{layer}" for block in range(2) for layer in layers]


def test_a_convolution_comes_before_the_batch_norm_it_feeds() -> None:
    model = nn.Sequential()
    model.add_module("bn1", nn.BatchNorm2d(3))  # registered first, computed second
    model.add_module("conv1", nn.Conv2d(3, 3, 1))
    model.forward = lambda x: model.bn1(model.conv1(x))  # type: ignore[method-assign]
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    groups = param_groups(capture(model(x), inputs=x, module=model))
    assert [group.params for group in groups] == [("conv1.bias", "conv1.weight"), ("bn1.bias", "bn1.weight")]


class _Parallel(nn.Module):
    """Twelve linears on the same input, registered in a shuffled order: ties by rank alone."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(index): nn.Linear(2, 2) for index in (10, 2, 0, 11, 1)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(self.layers[str(index)](x) for index in (11, 10, 2, 1, 0))


def test_without_live_nodes_groups_follow_the_longest_path_and_ties_the_natural_name_order() -> None:
    module = _Parallel()
    x = torch.randn(3, 2, requires_grad=True)
    graph = capture(module(x), inputs=x, module=module)
    live = [group.params[0] for group in param_groups(graph)]
    assert live == [f"layers.{index}.bias" for index in (11, 10, 2, 1, 0)]  # the order the forward ran
    graph.autograd_nodes.clear()  # as for a graph read back from JSON: ranks by longest path, ties by name
    ranks = forward_ranks(graph)
    assert all(ranks[consumer] > ranks[producer] for producer, consumer in graph.edges())
    exported = [group.params[0] for group in param_groups(graph)]
    assert exported == [f"layers.{index}.bias" for index in (0, 1, 2, 10, 11)]


def test_natural_key_orders_numbers_by_value() -> None:
    names = ["h.10.attn", "h.2.attn", "h.1.mlp", "h.1.attn"]
    assert sorted(names, key=natural_key) == ["h.1.attn", "h.1.mlp", "h.2.attn", "h.10.attn"]
