"""Weight-side gradients of common ops, computed from the tensors their Node saved.

The W phase needs, for each intermediate, only the gradients along its weight-side edges. For the ops
that carry most weights, these are simple formulas of the gradient the intermediate received and of the
tensors its Node saved in the forward (the same formulas as ``tools/autograd/derivatives.yaml`` in
PyTorch):

==============================  ==================================================================
Node                            weight-side gradient (``g`` = gradient of the op's output)
==============================  ==================================================================
``AddmmBackward0``              bias: ``beta * g``; mat2: ``alpha * mat1.T @ g``; mat1: ``alpha * g @ mat2.T``
``MmBackward0``                 mat2: ``self.T @ g``; self: ``g @ mat2.T``
``BmmBackward0``                mat2: ``self.mT @ g``; self: ``g @ mat2.mT``
``ConvolutionBackward0``        ``aten.convolution_backward`` with an output mask of the weight-side edges
``NativeLayerNormBackward0``    ``aten.native_layer_norm_backward`` with an output mask
``MulBackward0``                other: ``g * self``; self: ``g * other``
``AddBackward0``                other: ``alpha * g``; self: ``g``
==============================  ==================================================================

:func:`prepare` runs in the B phase: it reads the saved tensors the formula needs and returns a small
callable holding only those, so the W phase no longer needs the Node, nor, through it, the rest of the
input path's graph. Ops without a rule (and complex or non-strided tensors) return None: the W phase
then calls the Node itself. Gradients are reduced to the edge's shape and dtype afterwards, like the
engine's ``validate_outputs`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.graph import Node

__all__ = ["PreparedWeightGradient", "WeightGradient", "held_tensors", "prepare"]

# A prepared rule: takes the gradients the intermediate received (one per forward output) and returns
# one gradient (or None) per weight-side input_nr it was prepared for.
WeightGradient = Callable[[Sequence[torch.Tensor | None]], dict[int, torch.Tensor | None]]


def _plain(tensor: torch.Tensor | None) -> bool:
    return tensor is not None and tensor.layout == torch.strided and not tensor.is_complex()


def _addmm(node: Node, wanted: frozenset[int]) -> WeightGradient | None:
    # next_functions: (self = bias, mat1, mat2)
    alpha, beta = node._saved_alpha, node._saved_beta
    mat1 = node._saved_mat1 if 2 in wanted else None
    mat2 = node._saved_mat2 if 1 in wanted else None
    if (2 in wanted and not _plain(mat1)) or (1 in wanted and not _plain(mat2)):
        return None

    def gradients(grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
        grad = grads[0]
        result: dict[int, torch.Tensor | None] = {}
        if 0 in wanted:
            result[0] = grad if beta == 1 else grad * beta
        if 2 in wanted:
            product = mat1.t().mm(grad)
            result[2] = product if alpha == 1 else product * alpha
        if 1 in wanted:
            product = grad.mm(mat2.t())
            result[1] = product if alpha == 1 else product * alpha
        return result

    return gradients


def _matmul_rule(
    transpose: Callable[[torch.Tensor], torch.Tensor], multiply: Callable[..., torch.Tensor]
) -> Any:
    """The rule of ``self @ mat2`` (``mm``: ``transpose = t``; ``bmm``: the last two dimensions)."""

    def rule(node: Node, wanted: frozenset[int]) -> WeightGradient | None:
        # next_functions: (self, mat2); d(self @ mat2)/d(mat2) takes self, and the other way round
        first = node._saved_self if 1 in wanted else None
        second = node._saved_mat2 if 0 in wanted else None
        if (1 in wanted and not _plain(first)) or (0 in wanted and not _plain(second)):
            return None

        def gradients(grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
            grad = grads[0]
            result: dict[int, torch.Tensor | None] = {}
            if 1 in wanted:
                result[1] = multiply(transpose(first), grad)
            if 0 in wanted:
                result[0] = multiply(grad, transpose(second))
            return result

        return gradients

    return rule


_mm = _matmul_rule(torch.t, torch.mm)
_bmm = _matmul_rule(lambda tensor: tensor.transpose(1, 2), torch.bmm)


def _weight_and_bias(
    wanted: frozenset[int], grad_weight: torch.Tensor | None, grad_bias: torch.Tensor | None
) -> dict[int, torch.Tensor | None]:
    """The gradients of ``next_functions`` entries 1 (weight) and 2 (bias) that are weight-side."""
    return {input_nr: grad for input_nr, grad in ((1, grad_weight), (2, grad_bias)) if input_nr in wanted}


def _convolution(node: Node, wanted: frozenset[int]) -> WeightGradient | None:
    # next_functions: (input, weight, bias)
    if 0 in wanted:
        return None  # the input itself on the weight side: rare, let the Node do it
    tensor_input, weight = node._saved_input, node._saved_weight
    if not (_plain(tensor_input) and _plain(weight)):
        return None
    arguments = (
        node._saved_bias_sym_sizes_opt,
        list(node._saved_stride),
        list(node._saved_padding),
        list(node._saved_dilation),
        bool(node._saved_transposed),
        list(node._saved_output_padding),
        int(node._saved_groups),
    )
    mask = [False, 1 in wanted, 2 in wanted]

    def gradients(grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
        bias_sizes, stride, padding, dilation, transposed, output_padding, groups = arguments
        _, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grads[0],
            tensor_input,
            weight,
            bias_sizes,
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
            mask,
        )
        return _weight_and_bias(wanted, grad_weight, grad_bias)

    return gradients


def _layer_norm(node: Node, wanted: frozenset[int]) -> WeightGradient | None:
    # next_functions: (input, weight, bias)
    if 0 in wanted:
        return None
    saved = (
        node._saved_input,
        list(node._saved_normalized_shape),
        node._saved_result1,
        node._saved_result2,
        node._saved_weight,
        node._saved_bias,
    )
    if not (_plain(saved[0]) and _plain(saved[2]) and _plain(saved[3])):
        return None
    mask = [False, 1 in wanted, 2 in wanted]

    def gradients(grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
        tensor_input, normalized_shape, mean, rstd, weight, bias = saved
        _, grad_weight, grad_bias = torch.ops.aten.native_layer_norm_backward(
            grads[0].contiguous(), tensor_input, normalized_shape, mean, rstd, weight, bias, mask
        )
        return _weight_and_bias(wanted, grad_weight, grad_bias)

    return gradients


def _mul(node: Node, wanted: frozenset[int]) -> WeightGradient | None:
    # next_functions: (self, other); d(self*other)/d(other) = self
    factors = {1: node._saved_self if 1 in wanted else None, 0: node._saved_other if 0 in wanted else None}
    if any(not _plain(factors[input_nr]) for input_nr in wanted):
        return None

    def gradients(grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
        return {input_nr: grads[0] * factors[input_nr] for input_nr in wanted}

    return gradients


def _add(node: Node, wanted: frozenset[int]) -> WeightGradient | None:
    alpha = node._saved_alpha

    def gradients(grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
        grad = grads[0]
        return {input_nr: grad if input_nr == 0 or alpha == 1 else grad * alpha for input_nr in wanted}

    return gradients


_RULES: dict[str, Callable[[Node, frozenset[int]], WeightGradient | None]] = {
    "AddmmBackward0": _addmm,
    "MmBackward0": _mm,
    "BmmBackward0": _bmm,
    "ConvolutionBackward0": _convolution,
    "NativeLayerNormBackward0": _layer_norm,
    "MulBackward0": _mul,
    "AddBackward0": _add,
}


def prepare(node: Node, weight_input_nrs: Sequence[int]) -> PreparedWeightGradient | None:
    """A callable computing ``node``'s weight-side gradients without the Node, or None if unsupported.

    Args:
        node: an intermediate whose saved tensors are still alive (call this in the B phase).
        weight_input_nrs: positions in ``node.next_functions`` of its weight-side edges.

    Returns:
        ``rule(grads) -> {input_nr: gradient}``, where ``grads`` are the gradients ``node`` received
        (one per forward output); or None when graphkit has no rule for this op or these tensors.
    """
    factory = _RULES.get(type(node).__name__)
    if factory is None:
        return None
    try:
        compute = factory(node, frozenset(weight_input_nrs))
    except (AttributeError, RuntimeError):  # an attribute PyTorch renamed, or freed saved tensors
        return None
    return None if compute is None else PreparedWeightGradient(compute)


class PreparedWeightGradient:
    """A weight-side formula with the saved tensors it holds and their versions at B time.

    Calling it checks that none of those tensors was modified in place since the B phase (the check
    autograd's SavedVariable would make) and raises RuntimeError if one was.
    """

    __slots__ = ("compute", "tensors", "versions")

    def __init__(self, compute: WeightGradient) -> None:
        self.compute = compute
        self.tensors = held_tensors(compute)
        self.versions = tuple(tensor._version for tensor in self.tensors)

    def __call__(self, grads: Sequence[torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
        for tensor, version in zip(self.tensors, self.versions, strict=True):
            if tensor._version != version:
                raise RuntimeError(
                    f"a tensor of shape {tuple(tensor.shape)} saved for the W phase was modified in place "
                    "between the B and the W phase; keep activations and parameters unchanged until W ran"
                )
        return self.compute(grads)


def held_tensors(rule: Any) -> list[torch.Tensor]:
    """The tensors a prepared rule keeps alive (for memory accounting)."""
    found: list[torch.Tensor] = []
    stack = [cell.cell_contents for cell in (getattr(rule, "__closure__", None) or ())]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return found
