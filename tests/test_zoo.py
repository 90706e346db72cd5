"""The built-in models: deterministic, tiny, and shaped the way their docstrings say."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional
from torch_versions import LINEAR_3D_OUTPUT_IS_VIEW, LINEAR_3D_OUTPUT_NODE

from graphkit.models import zoo

EXPECTED_MODELS = {
    "gpt",
    "gpt_ends",
    "gpt_stage",
    "mlp",
    "lstm",
    "conv_bn",
    "shared_late",
    "param_only_output",
    "custom_function",
    "chain",
    "view_output",
    "weight_norm",
    "detached",
}


def run(module: nn.Module, inputs: tuple[Any, ...] | dict[str, Any]) -> Any:
    if isinstance(inputs, dict):
        return module(**inputs)
    return module(*inputs)


def tensors_in(value: Any) -> list[Tensor]:
    """The tensors of a nested output, in a fixed order (dicts by insertion order)."""
    found: list[Tensor] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, tuple | list):
            stack.extend(reversed(item))
    return found


def autograd_nodes(outputs: list[Tensor]) -> Iterator[torch.autograd.graph.Node]:
    """Every autograd node reachable from ``outputs``, each once (iterative walk over next_functions)."""
    seen: set[torch.autograd.graph.Node] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)


def node_names(outputs: list[Tensor]) -> Counter[str]:
    return Counter(node.name() for node in autograd_nodes(outputs))


def test_registry_has_every_model_with_a_one_line_description() -> None:
    assert set(zoo.MODELS) >= EXPECTED_MODELS
    assert zoo.DEFAULT_MODEL == "gpt_ends"
    for name, entry in zoo.MODELS.items():
        assert entry.name == name
        assert entry.build is getattr(zoo, name)
        assert entry.description and "\n" not in entry.description
        assert entry.description == entry.build.__doc__.strip().splitlines()[0]


def test_build_unknown_name_lists_known_models() -> None:
    with pytest.raises(KeyError, match="unknown zoo model 'nope'.*gpt_stage"):
        zoo.build("nope")


@pytest.mark.parametrize("name", sorted(EXPECTED_MODELS))
def test_model_is_deterministic_tiny_float32_and_leaves_global_rng_alone(name: str) -> None:
    rng_before = torch.get_rng_state()
    module, inputs = zoo.build(name)
    assert torch.equal(torch.get_rng_state(), rng_before), "building must not touch the global random state"

    # Two builds are equal: same parameters, same inputs.
    module_again, inputs_again = zoo.build(name)
    state, state_again = module.state_dict(), module_again.state_dict()
    assert state.keys() == state_again.keys()
    for key in state:
        assert torch.equal(state[key], state_again[key]), key
    for tensor, tensor_again in zip(tensors_in(inputs), tensors_in(inputs_again), strict=True):
        assert torch.equal(tensor, tensor_again)

    # Tiny, CPU, float32.
    parameters = list(module.parameters())
    assert parameters
    assert sum(p.numel() for p in parameters) < 100_000
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in parameters)

    # Two forward calls give identical outputs, at least one of which needs a gradient.
    first = tensors_in(run(module, inputs))
    second = tensors_in(run(module, inputs))
    assert first and len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
        assert a.dtype == torch.float32
    assert any(t.requires_grad for t in first)

    # Stage inputs are float32 leaves that require grad; other inputs need no grad.
    for tensor in tensors_in(inputs):
        assert tensor.is_leaf
        if tensor.requires_grad:
            assert tensor.dtype == torch.float32


@pytest.mark.parametrize("name", sorted(EXPECTED_MODELS))
def test_full_backward_reaches_every_parameter(name: str) -> None:
    module, inputs = zoo.build(name)
    outputs = [t for t in tensors_in(run(module, inputs)) if t.requires_grad]
    loss = sum((t.float() * (index + 1)).sum() for index, t in enumerate(outputs))
    loss.backward()
    for parameter_name, parameter in module.named_parameters():
        assert parameter.grad is not None, parameter_name
        assert torch.isfinite(parameter.grad).all(), parameter_name
    for tensor in tensors_in(inputs):
        if tensor.requires_grad:
            assert tensor.grad is not None and torch.isfinite(tensor.grad).all()


# --------------------------------------------------------------------------------------------------------
# Structure of each model


def test_gpt_has_a_tied_head_integer_inputs_and_is_causal() -> None:
    module, inputs = zoo.gpt()
    assert module.lm_head.weight is module.wte.weight
    all_names = [name for name, _ in module.named_parameters(remove_duplicate=False)]
    assert "wte.weight" in all_names and "lm_head.weight" in all_names
    assert "lm_head.weight" not in dict(module.named_parameters())  # one Parameter, listed once by default
    assert len(module.blocks) == 2

    (token_ids,) = inputs
    assert token_ids.dtype == torch.int64 and token_ids.shape == (2, 8)
    assert int(token_ids.min()) >= 0 and int(token_ids.max()) < 64
    logits = module(token_ids)
    assert logits.shape == (2, 8, 64)

    # Causality: changing the last token leaves every earlier position's logits unchanged.
    changed = token_ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 64
    changed_logits = module(changed)
    assert torch.equal(changed_logits[:, :-1], logits[:, :-1])
    assert not torch.equal(changed_logits[:, -1], logits[:, -1])

    # The tied weight feeds both the embedding lookup and the head.
    accumulate = [n for n in autograd_nodes([logits]) if n.name().endswith("AccumulateGrad")]
    tied = [n for n in accumulate if n.variable is module.wte.weight]
    assert len(tied) == 1
    consumers = {
        node.name()
        for node in autograd_nodes([logits])
        for next_node, _ in node.next_functions
        if next_node is tied[0]
    }
    assert consumers == {"EmbeddingBackward0", "TBackward0"}


def test_gpt_head_computes_logits_against_the_embedding() -> None:
    module, (token_ids,) = zoo.gpt()
    hidden = module.wte(token_ids) + module.wpe(torch.arange(token_ids.shape[1]))
    for block in module.blocks:
        hidden = block(hidden)
    expected = module.ln_f(hidden) @ module.wte.weight.T
    torch.testing.assert_close(module(token_ids), expected)


def test_gpt_stage_maps_hidden_states_to_hidden_states() -> None:
    module, (hidden,) = zoo.gpt_stage()
    assert hidden.shape == (2, 8, 32) and hidden.requires_grad and hidden.dtype == torch.float32
    output = module(hidden)
    assert output.shape == hidden.shape
    assert len(module.blocks) == 2
    assert not any(isinstance(m, nn.Embedding) for m in module.modules())
    names = node_names([output])
    assert names["NativeLayerNormBackward0"] == 4
    assert names["SplitBackward0"] == 2  # fused q/k/v split, one per block


def test_mlp_matches_its_formula() -> None:
    module, (x,) = zoo.mlp()
    assert x.shape == (4, 16) and x.requires_grad
    first, activation, second = module
    assert isinstance(first, nn.Linear) and isinstance(activation, nn.GELU) and isinstance(second, nn.Linear)
    expected = functional.gelu(x @ first.weight.T + first.bias) @ second.weight.T + second.bias
    torch.testing.assert_close(module(x), expected)


def test_lstm_returns_out_h_c_with_h_equal_to_the_last_step() -> None:
    module, (x,) = zoo.lstm()
    outputs = module(x)
    assert isinstance(outputs, tuple) and len(outputs) == 3
    out, h, c = outputs
    assert all(isinstance(t, Tensor) and t.requires_grad for t in outputs)
    assert out.shape == (2, 5, 16) and h.shape == (1, 2, 16) and c.shape == (1, 2, 16)
    torch.testing.assert_close(h[0], out[:, -1])
    assert not torch.equal(h, c)


def test_conv_bn_is_conv_batchnorm_relu_conv_in_training_mode() -> None:
    module, (x,) = zoo.conv_bn()
    kinds = [type(m) for m in module]
    assert kinds == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.Conv2d]
    assert module.training
    assert x.shape == (2, 3, 8, 8)
    output = module(x)
    assert output.shape == (2, 4, 8, 8)
    names = node_names([output])
    assert names["ConvolutionBackward0"] == 2 and names["NativeBatchNormBackward0"] == 1


def test_shared_late_registers_the_shared_parameter_last_and_uses_it_in_both_layers() -> None:
    module, (x,) = zoo.shared_late()
    names = [name for name, _ in module.named_parameters()]
    assert names == ["layer1.weight", "layer1.bias", "layer2.weight", "layer2.bias", "shared.scale"]
    shared = module.shared.scale
    expected = module.layer2(torch.tanh(module.layer1(x) * shared)) * shared
    output = module(x)
    torch.testing.assert_close(output, expected)
    accumulate = [
        n for n in autograd_nodes([output]) if n.name().endswith("AccumulateGrad") and n.variable is shared
    ]
    consumers = [
        node.name()
        for node in autograd_nodes([output])
        for next_node, _ in node.next_functions
        if next_node is accumulate[0]
    ]
    assert consumers == ["MulBackward0", "MulBackward0"]


def test_param_only_output_returns_a_temperature_that_depends_on_the_parameter_alone() -> None:
    module, (x,) = zoo.param_only_output()
    output = module(x)
    assert set(output) == {"hidden", "logit_scale"}
    assert output["hidden"].shape == (4, 8)
    assert output["logit_scale"].shape == ()
    torch.testing.assert_close(output["logit_scale"], torch.tensor(1 / 0.07))
    (grad_x,) = torch.autograd.grad(output["logit_scale"], x, allow_unused=True)
    assert grad_x is None
    (grad_scale,) = torch.autograd.grad(output["logit_scale"], module.logit_scale)
    torch.testing.assert_close(grad_scale, output["logit_scale"].detach())  # d exp(s) / ds = exp(s)


def test_custom_function_backward_matches_autograd_and_gradcheck() -> None:
    module, (x,) = zoo.custom_function()
    output = module(x)
    names = node_names([output])
    assert names["MatmulTanhBackward"] == 1
    (custom_node,) = [n for n in autograd_nodes([output]) if n.name() == "MatmulTanhBackward"]
    consumers = sorted(
        (node.name(), output_nr)
        for node in autograd_nodes([output])
        for next_node, output_nr in node.next_functions
        if next_node is custom_node
    )
    assert consumers == [("AddBackward0", 0), ("AddmmBackward0", 1)]  # y feeds the sum, t feeds the head

    # Oracle: the same computation with built-in ops only.
    x_oracle = x.detach().clone().requires_grad_()
    weight = module.weight.detach().clone().requires_grad_()
    y = x_oracle @ weight
    expected = module.head(torch.tanh(y)) + y
    torch.testing.assert_close(output, expected)
    grads = torch.autograd.grad(output.sum(), [x, module.weight])
    expected_grads = torch.autograd.grad(expected.sum(), [x_oracle, weight])
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)

    x64 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w64 = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(zoo.MatmulTanh.apply, (x64, w64))


def test_chain_uses_one_weight_three_times() -> None:
    module, (x,) = zoo.chain()
    output = module(x)
    weight = module.weight
    torch.testing.assert_close(output, torch.tanh(torch.tanh(torch.tanh(x @ weight) @ weight) @ weight))
    names = node_names([output])
    assert names["MmBackward0"] == 3 and names["TanhBackward0"] == 3
    (accumulate,) = [n for n in autograd_nodes([output]) if getattr(n, "variable", None) is weight]
    assert accumulate.name().endswith("AccumulateGrad")
    uses = [
        node.name()
        for node in autograd_nodes([output])
        for nxt, _ in node.next_functions
        if nxt is accumulate
    ]
    assert uses == ["MmBackward0"] * 3


def test_view_output_returns_a_tensor_and_its_transposed_view() -> None:
    module, (x,) = zoo.view_output()
    y, y_transposed = module(x)
    assert y.shape == (2, 5, 6) and y_transposed.shape == (2, 6, 5)
    assert (
        y_transposed._base is not None
        and y_transposed.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    )
    torch.testing.assert_close(y_transposed, y.transpose(1, 2))
    assert y_transposed.grad_fn.name() == "TransposeBackward0"
    assert y.grad_fn.name() == LINEAR_3D_OUTPUT_NODE
    assert y._is_view() == LINEAR_3D_OUTPUT_IS_VIEW
    with pytest.raises(RuntimeError):
        y_transposed.detach_()


def test_weight_norm_reaches_the_input_path_through_a_weight_only_chain() -> None:
    module, (x,) = zoo.weight_norm()
    output = module(x)
    weight = module.weight
    torch.testing.assert_close(
        output, x @ (weight / math.sqrt(float((weight.detach() ** 2).sum()))).T + module.bias
    )
    names = node_names([output])
    assert names["LinalgVectorNormBackward0"] == 1 and names["DivBackward0"] == 1
    # The node meeting the input uses the weight only through the normalised (weight-only) tensor.
    addmm = output.grad_fn
    assert addmm.name() == "AddmmBackward0"
    weight_side = [nxt.name() for nxt, _ in addmm.next_functions if nxt is not None]
    assert "TBackward0" in weight_side
    assert not any(
        nxt is not None and getattr(nxt, "variable", None) is weight for nxt, _ in addmm.next_functions
    )


def test_detached_branch_gets_weight_gradients_but_passes_none_to_the_input() -> None:
    module, (x,) = zoo.detached()
    output = module(x)
    names = node_names([output])
    assert names["ReluBackward0"] == 1
    grad_x, grad_side = torch.autograd.grad(output.sum(), [x, module.side.weight])
    assert grad_side.abs().sum() > 0
    # Oracle: without the side branch the input gradient is the same.
    x_oracle = x.detach().clone().requires_grad_()
    hidden = functional.relu(module.first(x_oracle))
    (expected_grad_x,) = torch.autograd.grad(module.second(hidden).sum(), x_oracle)
    torch.testing.assert_close(grad_x, expected_grad_x)


def test_gpt_ends_ties_the_head_to_the_embedding_and_returns_both_ends():
    module, inputs = zoo.build("gpt_ends")
    assert module.lm_head.weight is module.wte.weight
    assert inputs["hidden"].requires_grad and not inputs["token_ids"].is_floating_point()
    outputs = module(**inputs)
    assert set(outputs) == {"embeddings", "logits"}
    assert outputs["embeddings"].shape == (2, 8, 32) and outputs["logits"].shape == (2, 8, 64)
