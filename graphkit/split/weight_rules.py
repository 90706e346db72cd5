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
``NativeBatchNormBackward0``    ``aten.native_batch_norm_backward`` with an output mask
``NativeGroupNormBackward0``    ``aten.native_group_norm_backward`` with an output mask
``MulBackward0``                other: ``g * self``; self: ``g * other``
``AddBackward0``                other: ``alpha * g``; self: ``g``
==============================  ==================================================================

:func:`prepare` runs in the B phase: it reads the saved tensors the formula needs and returns a small
callable holding only those, so the W phase no longer needs the Node, nor, through it, the rest of the
input path's graph. Ops without a rule, complex or non-strided tensors, and tensors packed by
``torch.autograd.graph.saved_tensors_hooks`` (activation checkpointing, offloading: unpacking them runs
user code) return None: the W phase then calls the Node itself. Gradients come back in the shape the
formula gives; the autograd engine reduces them to the edge's shape and dtype when the W phase feeds
them in (``validate_outputs`` in ``torch/csrc/autograd/engine.cpp``).

:func:`prepare` runs once per intermediate and microbatch, so it reads each attribute once and holds
its tensors in a plain tuple.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import torch
from torch.autograd.graph import Node

from graphkit.graph import _autograd

__all__ = ["PreparedWeightGradient", "WeightGradient", "prepare"]

# A rule's formula: the gradients the intermediate received (one per forward output) and the tensors the
# rule holds (the version-checked ones; a rule may also read them from its closure); returns one
# gradient (or None) per weight-side ``next_functions`` entry it was prepared for, in the order of
# ``weight_input_nrs``.
WeightGradient = Callable[
    [Sequence[torch.Tensor | None], tuple[torch.Tensor, ...]], list[torch.Tensor | None]
]


class _Unsupported(Exception):
    """This Node's tensors rule out a formula (packed by hooks, complex, sparse): call the Node instead."""


_STRIDED = torch.strided

tensor_version = attrgetter("_version")
"""``tensor._version`` (the version counter in-place operations bump), as a C-level callable for ``map``."""


def _saved(node: Node, name: str) -> torch.Tensor:
    """The saved tensor ``name`` of ``node``, refusing tensors a formula cannot read safely.

    Only called through :func:`prepare`, which has made sure no saved tensor of ``node`` was packed by
    saved-tensor hooks (reading one would run its unpack hook outside the engine)."""
    tensor = getattr(node, _ATTRIBUTE_NAMES[name])
    if tensor is None or tensor.layout is not _STRIDED or tensor.is_complex():
        raise _Unsupported(name)
    # an activation's grad_fn would keep the whole input path's graph alive until W; the detached
    # tensor shares storage and version counter, so in-place changes are still caught
    return tensor.detach() if tensor.grad_fn is not None else tensor


def _real_output(node: Node) -> None:
    """Refuse a complex output: PyTorch then takes the real part for a real input and conjugates
    ``alpha``/``beta`` (``handle_r_to_c`` in ``FunctionsManual.cpp``); the Node does it right."""
    for metadata in node._input_metadata:
        if metadata.dtype.is_complex:
            raise _Unsupported("complex output")


# per saved name: its unpacked attribute; _LAYOUT_NAMES: (sizes, strides)
_ATTRIBUTE_NAMES: dict[str, str] = {
    name: f"_saved_{name}"
    for name in ("mat1", "mat2", "self", "other", "input", "weight", "result1", "result2")
}
_LAYOUT_NAMES: dict[str, tuple[str, str]] = {
    name: (f"_saved_{name}_sym_sizes", f"_saved_{name}_sym_strides") for name in ("mat1", "mat2", "self")
}


def _present(first: torch.Tensor | None, second: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The operands a formula holds (those it read), without the Nones."""
    if first is None:
        return () if second is None else (second,)
    return (first,) if second is None else (first, second)


def _column_major(node: Node, name: str) -> bool:
    """Whether the saved strides of the 2-D operand ``name`` are column-major (``W.t()`` of a Linear).

    PyTorch's ``mm_mat1_backward``/``mm_mat2_backward`` (``torch/csrc/autograd/FunctionsManual.cpp``)
    then return the gradient column-major too, so that after the transpose it is contiguous in the
    parameter's own layout and AccumulateGrad adds it without a strided copy. The rules do the same.
    """
    sizes_name, strides_name = _LAYOUT_NAMES[name]
    strides = getattr(node, strides_name, None)
    return (
        strides is not None
        and len(strides) == 2
        and strides[0] == 1
        and strides[1] == getattr(node, sizes_name)[0]
    )


def _matrix_gradient(
    grad: torch.Tensor, other: torch.Tensor, of_second: bool, column_major: bool
) -> torch.Tensor:
    """Gradient of ``first @ second`` for one operand, in the layout PyTorch's backward gives it.

    ``of_second``: ``first.T @ grad`` (``other`` is ``first``); else ``grad @ second.T`` (``other`` is
    ``second``). ``column_major``: the operand's saved strides are column-major (see above).
    """
    if of_second:
        return grad.t().mm(other).t() if column_major else other.t().mm(grad)
    return other.mm(grad.t()).t() if column_major else grad.mm(other.t())


def _matrix_operands(
    node: Node, wanted: tuple[int, ...], first_name: str, second_name: str, first_nr: int
) -> tuple[torch.Tensor | None, torch.Tensor | None, bool, bool]:
    """The saved operands of ``first @ second`` (``next_functions`` positions ``first_nr`` and
    ``first_nr + 1``) that the wanted gradients read - each operand's gradient takes the other one -
    and whether each wanted operand's saved strides are column-major (:func:`_column_major`)."""
    second_nr = first_nr + 1
    first = _saved(node, first_name) if second_nr in wanted else None
    second = _saved(node, second_name) if first_nr in wanted else None
    column_major_first = first_nr in wanted and _column_major(node, first_name)
    column_major_second = second_nr in wanted and _column_major(node, second_name)
    return first, second, column_major_first, column_major_second


def _addmm(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    # next_functions: (self = bias, mat1, mat2)
    if wanted == (0,):
        _real_output(node)  # otherwise a saved operand is read, and _saved refuses a complex one
    alpha, beta = node._saved_alpha, node._saved_beta
    mat1, mat2, column_major_mat1, column_major_mat2 = _matrix_operands(node, wanted, "mat1", "mat2", 1)

    def gradients(
        grads: Sequence[torch.Tensor | None], tensors: tuple[torch.Tensor, ...]
    ) -> list[torch.Tensor | None]:
        grad = grads[0]
        result = []
        for input_nr in wanted:
            if input_nr == 0:
                result.append(grad if beta == 1 else grad * beta)
                continue
            if input_nr == 2:
                product = _matrix_gradient(grad, mat1, True, column_major_mat2)
            else:
                product = _matrix_gradient(grad, mat2, False, column_major_mat1)
            result.append(product if alpha == 1 else product * alpha)
        return result

    return gradients, _present(mat1, mat2)


def _mm(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    # next_functions: (self, mat2); d(self @ mat2)/d(mat2) takes self, and the other way round
    first, second, column_major_self, column_major_mat2 = _matrix_operands(node, wanted, "self", "mat2", 0)

    def gradients(
        grads: Sequence[torch.Tensor | None], tensors: tuple[torch.Tensor, ...]
    ) -> list[torch.Tensor | None]:
        grad = grads[0]
        return [
            _matrix_gradient(grad, first, True, column_major_mat2)
            if input_nr == 1
            else _matrix_gradient(grad, second, False, column_major_self)
            for input_nr in wanted
        ]

    return gradients, _present(first, second)


def _bmm(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    # next_functions: (self, mat2), batched over the first dimension
    first = _saved(node, "self") if 1 in wanted else None
    second = _saved(node, "mat2") if 0 in wanted else None

    def gradients(
        grads: Sequence[torch.Tensor | None], tensors: tuple[torch.Tensor, ...]
    ) -> list[torch.Tensor | None]:
        grad = grads[0]
        return [
            first.transpose(1, 2).bmm(grad) if input_nr == 1 else grad.bmm(second.transpose(1, 2))
            for input_nr in wanted
        ]

    return gradients, _present(first, second)


def _masked_rule(
    wanted: tuple[int, ...],
    backward: Callable[[torch.Tensor, tuple[torch.Tensor, ...], list[bool]], Sequence[torch.Tensor | None]],
    tensors: tuple[torch.Tensor, ...],
    also_saved: Sequence[torch.Tensor | None] = (),
) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    """The rule of an op with ``next_functions`` (input, weight, bias) whose aten backward takes an
    output mask: ``backward(grad, tensors, mask) -> (grad_input, grad_weight, grad_bias)``, called with
    the input's entry masked off. ``also_saved``: saved tensors the backward reads from its closure
    (parameters, running statistics), held and version-checked with ``tensors``."""
    mask = [False, 1 in wanted, 2 in wanted]
    count = len(tensors)

    def gradients(
        grads: Sequence[torch.Tensor | None], tensors: tuple[torch.Tensor, ...]
    ) -> list[torch.Tensor | None]:
        _, grad_weight, grad_bias = backward(grads[0], tensors[:count], mask)
        return [grad_weight if input_nr == 1 else grad_bias for input_nr in wanted]

    return gradients, tensors + tuple(tensor for tensor in also_saved if tensor is not None)


def _no_input_side(wanted: tuple[int, ...]) -> None:
    if 0 in wanted:
        raise _Unsupported("input")  # the op's input itself on the weight side: rare, let the Node do it


def _convolution(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    _no_input_side(wanted)
    arguments = (
        node._saved_bias_sym_sizes_opt,
        list(node._saved_stride),
        list(node._saved_padding),
        list(node._saved_dilation),
        bool(node._saved_transposed),
        list(node._saved_output_padding),
        int(node._saved_groups),
    )

    def backward(grad: torch.Tensor, tensors: tuple[torch.Tensor, ...], mask: list[bool]) -> Any:
        return torch.ops.aten.convolution_backward(grad, *tensors, *arguments, mask)

    return _masked_rule(wanted, backward, (_saved(node, "input"), _saved(node, "weight")))


def _layer_norm(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    _no_input_side(wanted)
    normalized_shape = list(node._saved_normalized_shape)
    weight, bias = node._saved_weight, node._saved_bias

    def backward(grad: torch.Tensor, tensors: tuple[torch.Tensor, ...], mask: list[bool]) -> Any:
        tensor_input, mean, rstd = tensors
        return torch.ops.aten.native_layer_norm_backward(
            grad.contiguous(), tensor_input, normalized_shape, mean, rstd, weight, bias, mask
        )

    return _masked_rule(wanted, backward, _saved_statistics(node), (weight, bias))


def _batch_norm(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    _no_input_side(wanted)
    # in eval mode the backward normalizes with the running statistics, and PyTorch's Node refuses them
    # once modified in place (another microbatch's forward in training mode, a restored checkpoint);
    # in training mode it reads the batch statistics instead, so later updates do not matter
    weight, running_mean, running_var = node._saved_weight, node._saved_running_mean, node._saved_running_var
    training, eps = bool(node._saved_training), float(node._saved_eps)
    checked = (weight,) if training else (weight, running_mean, running_var)

    def backward(grad: torch.Tensor, tensors: tuple[torch.Tensor, ...], mask: list[bool]) -> Any:
        tensor_input, mean, inverse_std = tensors
        return torch.ops.aten.native_batch_norm_backward(
            grad, tensor_input, weight, running_mean, running_var, mean, inverse_std, training, eps, mask
        )

    return _masked_rule(wanted, backward, _saved_statistics(node), checked)


def _group_norm(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    _no_input_side(wanted)
    weight = node._saved_weight
    sizes = (int(node._saved_N), int(node._saved_C), int(node._saved_HxW), int(node._saved_group))

    def backward(grad: torch.Tensor, tensors: tuple[torch.Tensor, ...], mask: list[bool]) -> Any:
        tensor_input, mean, rstd = tensors
        # both in the standard layout: the CPU kernel crashes on a channels_last input when the input's
        # own gradient is masked off (PyTorch's Node always asks for it, so it never meets this)
        return torch.ops.aten.native_group_norm_backward(
            grad.contiguous(), tensor_input.contiguous(), mean, rstd, weight, *sizes, mask
        )

    return _masked_rule(wanted, backward, _saved_statistics(node), (weight,))


def _saved_statistics(node: Node) -> tuple[torch.Tensor, ...]:
    """A normalization's saved input and the statistics its forward returned (mean, 1/std)."""
    return (_saved(node, "input"), _saved(node, "result1"), _saved(node, "result2"))


def _mul(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    # next_functions: (self, other); d(self * other)/d(other) = self, and the other way round
    _real_output(node)
    factors = tuple(_saved(node, "self" if input_nr == 1 else "other") for input_nr in wanted)

    def gradients(
        grads: Sequence[torch.Tensor | None], tensors: tuple[torch.Tensor, ...]
    ) -> list[torch.Tensor | None]:
        grad = grads[0]
        return [grad * factor for factor in tensors]

    return gradients, factors


def _add(node: Node, wanted: tuple[int, ...]) -> tuple[WeightGradient, tuple[torch.Tensor, ...]]:
    _real_output(node)
    alpha = node._saved_alpha

    def gradients(
        grads: Sequence[torch.Tensor | None], tensors: tuple[torch.Tensor, ...]
    ) -> list[torch.Tensor | None]:
        grad = grads[0]
        return [grad if input_nr == 0 or alpha == 1 else grad * alpha for input_nr in wanted]

    return gradients, ()


_RULES: dict[str, Callable[[Node, tuple[int, ...]], tuple[WeightGradient, tuple[torch.Tensor, ...]]]] = {
    "AddmmBackward0": _addmm,
    "MmBackward0": _mm,
    "BmmBackward0": _bmm,
    "ConvolutionBackward0": _convolution,
    "NativeLayerNormBackward0": _layer_norm,
    "NativeBatchNormBackward0": _batch_norm,
    "NativeGroupNormBackward0": _group_norm,
    "MulBackward0": _mul,
    "AddBackward0": _add,
}
_rules_by_class: dict[type, Callable[..., tuple[WeightGradient, tuple[torch.Tensor, ...]]] | None] = {}
_UNKNOWN: Any = object()  # a Node class not looked up yet


def _rule_for(node_class: type) -> Callable[..., tuple[WeightGradient, tuple[torch.Tensor, ...]]] | None:
    try:
        return _rules_by_class[node_class]
    except KeyError:
        factory = _rules_by_class[node_class] = _RULES.get(node_class.__name__)
        return factory


def prepare(
    node: Node, weight_input_nrs: Sequence[int], *, unhooked: bool = False
) -> PreparedWeightGradient | None:
    """A callable computing ``node``'s weight-side gradients without the Node, or None if unsupported.

    Args:
        node: an intermediate whose saved tensors are still alive (call this in the B phase).
        weight_input_nrs: positions in ``node.next_functions`` of its weight-side edges, in the order the
            results should come back.
        unhooked: the caller has already found that no saved tensor of ``node`` was packed by
            saved-tensor hooks (:func:`graphkit.graph._autograd.uses_saved_tensor_hooks` is False), so
            ``prepare`` does not look again.

    Returns:
        ``rule(grads) -> [gradient, ...]``, one per entry of ``weight_input_nrs`` (None where no
        gradient flows), where ``grads`` are the gradients ``node`` received (one per forward
        output); or None when graphkit has no rule for this op or these
        tensors (complex, sparse, packed by saved-tensor hooks).
    """
    node_class = type(node)
    factory = _rules_by_class.get(node_class, _UNKNOWN)  # one dict lookup per call in the usual case
    if factory is _UNKNOWN:
        factory = _rule_for(node_class)
    if factory is None:
        return None
    if not unhooked and _autograd.uses_saved_tensor_hooks(node):
        # every read of a hooked tensor runs its unpack hook (for checkpointing: a recomputation, and
        # outside an engine call one per read): the Node, called in W, unpacks them itself
        return None
    try:
        compute, tensors = factory(
            node, weight_input_nrs if isinstance(weight_input_nrs, tuple) else tuple(weight_input_nrs)
        )
    except (_Unsupported, AttributeError, RuntimeError):  # also: a renamed attribute, freed saved tensors
        return None
    return PreparedWeightGradient(compute, tensors)


class PreparedWeightGradient:
    """A weight-side formula with the saved tensors it holds and their versions at B time.

    Calling it checks that none of those tensors was modified in place since the B phase (the check
    autograd's SavedVariable would make) and raises RuntimeError if one was.

    Attributes:
        tensors: the saved tensors the formula reads (what it keeps alive until the W phase).
    """

    __slots__ = ("_compute", "_versions", "tensors")

    def __init__(self, compute: WeightGradient, tensors: tuple[torch.Tensor, ...]) -> None:
        self._compute = compute
        self.tensors = tensors
        self._versions = tuple(map(tensor_version, tensors))

    def __call__(self, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        if tuple(map(tensor_version, self.tensors)) != self._versions:
            self._refuse_changed()
        return self._compute(grads, self.tensors)

    def _refuse_changed(self) -> None:
        for tensor, version in zip(self.tensors, self._versions, strict=True):
            if tensor._version != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: a tensor of shape {tuple(tensor.shape)} saved for the W phase was modified "
                    f"in place between the B and the W phase (it is at version {tensor._version}; expected "
                    f"version {version}); keep "
                    "activations, parameters and buffers unchanged until W ran (an optimizer step, or "
                    "another microbatch's forward updating a buffer, must wait for W)"
                )
