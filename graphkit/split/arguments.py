"""The arguments of the split backward, checked and put in order: outputs with their cotangents, stage
inputs, and the parameters W accumulates into.

Every function raises :class:`~graphkit.graph.tensors.GraphkitInputError` with what was wrong and how to fix
it, so that bad input never becomes a silently wrong gradient.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

from graphkit.graph import _autograd
from graphkit.graph.tensors import GraphkitInputError, flatten_tensors

__all__ = ["Output", "matched_by_path", "named_inputs", "pair_outputs", "parameter_list", "weight_filter"]


Output = torch.Tensor | GradientEdge
"""A stage output: a tensor, or the ``GradientEdge`` of one that was released after its forward (the
autograd edge it fed, ``torch.autograd.graph.get_gradient_edge(tensor)``), as newer
``torch.distributed.pipelining`` stages pass them."""


def _requires_grad(output: Output) -> bool:
    return True if isinstance(output, GradientEdge) else output.requires_grad


def _edge_shape(edge: GradientEdge) -> tuple[int, ...] | None:
    """The shape of the gradient ``edge`` takes (its Node's input metadata), or None where PyTorch hides it."""
    metadata = _autograd.gradient_metadata(edge.node)
    if metadata is None or not 0 <= edge.output_nr < len(metadata):
        return None
    return metadata[edge.output_nr].shape


def pair_outputs(outputs: Any, grad_outputs: Any) -> list[tuple[Output, torch.Tensor]]:
    """(output, cotangent) pairs for every output that requires grad and receives a gradient.

    An output may be a ``GradientEdge`` (:data:`Output`): it always needs a cotangent.
    """
    pairs = _plain_pairs(outputs, grad_outputs)
    if pairs is not None:
        return pairs
    named_outputs = flatten_tensors(outputs, edges=True)
    if not named_outputs:
        raise GraphkitInputError(
            f"outputs hold no tensor (got {type(outputs).__name__}); pass the tensors the stage returned"
        )
    if grad_outputs is None:
        pairs = []
        for name, tensor in named_outputs:
            if isinstance(tensor, GradientEdge):
                raise GraphkitInputError(
                    f"output {name!r} is a GradientEdge (a released stage output), which needs its "
                    "cotangent: grad_outputs=None means scalar losses; pass grad_outputs"
                )
            if not tensor.requires_grad:
                continue
            if tensor.numel() != 1:
                raise GraphkitInputError(
                    f"grad_outputs=None means the outputs are scalar losses, but output {name!r} has shape "
                    f"{tuple(tensor.shape)}; pass grad_outputs with one cotangent per output"
                )
            pairs.append((tensor, torch.ones_like(tensor)))
    else:
        if isinstance(grad_outputs, torch.Tensor):
            grads: list[tuple[str, Any]] = [("output", grad_outputs)]
            structure = named_outputs
        else:
            grads = flatten_tensors(grad_outputs, keep_none=True)
            structure = flatten_tensors(outputs, keep_none=True, edges=True)
        if len(grads) != len(structure):
            raise GraphkitInputError(
                f"grad_outputs has {len(grads)} entries but outputs has {len(structure)}; give one "
                "cotangent per output tensor, in the same structure (None for an output with no gradient)"
            )
        grads = matched_by_path(structure, grads)
        pairs = []
        for (name, tensor), (_, grad) in zip(structure, grads, strict=True):
            if tensor is None or not _requires_grad(tensor) or grad is None:
                continue
            if not isinstance(grad, torch.Tensor):
                raise GraphkitInputError(
                    f"cotangent for output {name!r} is a {type(grad).__name__}, not a tensor or None"
                )
            shape = _edge_shape(tensor) if isinstance(tensor, GradientEdge) else tuple(tensor.shape)
            if shape is not None and tuple(grad.shape) != shape:
                raise GraphkitInputError(
                    f"cotangent for output {name!r} has shape {tuple(grad.shape)} but the output has shape "
                    f"{shape}"
                )
            pairs.append((tensor, grad))
    if not any(_requires_grad(tensor) for _, tensor in named_outputs):
        raise GraphkitInputError(
            "no output requires grad, so there is no autograd graph to run backward through; run the "
            "forward with gradients enabled and parameters or inputs that require grad"
        )
    return pairs


def _plain_pairs(outputs: Any, grad_outputs: Any) -> list[tuple[Output, torch.Tensor]] | None:
    """:func:`pair_outputs` for the common case, without flattening: one tensor with its cotangent, or a
    list or tuple of tensors with one cotangent each (all tensors, shapes alike, some output requiring
    grad), or such outputs as scalar losses (``grad_outputs=None``). None for anything else, which the
    general path pairs, or refuses with its error."""
    if grad_outputs is None:
        return _plain_losses(outputs)
    if isinstance(outputs, torch.Tensor):
        if not isinstance(grad_outputs, torch.Tensor):
            return None
        outputs, grad_outputs = (outputs,), (grad_outputs,)
    elif not (
        type(outputs) in (list, tuple)
        and type(grad_outputs) in (list, tuple)
        and 0 < len(outputs) == len(grad_outputs)
    ):
        return None
    pairs = []
    any_requires_grad = False
    for tensor, grad in zip(outputs, grad_outputs, strict=True):
        if (
            type(tensor) is not torch.Tensor
            or not isinstance(grad, torch.Tensor)
            or grad.shape != tensor.shape
        ):
            return None
        if tensor.requires_grad:
            any_requires_grad = True
            pairs.append((tensor, grad))
    return pairs if any_requires_grad else None


def _plain_losses(outputs: Any) -> list[tuple[Output, torch.Tensor]] | None:
    """:func:`_plain_pairs` without cotangents: one tensor, or a list or tuple of tensors, whose outputs
    that require grad are scalar losses (cotangent 1). None for anything else."""
    if type(outputs) is torch.Tensor:
        outputs = (outputs,)
    elif type(outputs) not in (list, tuple):
        return None
    pairs = []
    for tensor in outputs:
        if type(tensor) is not torch.Tensor:
            return None
        if tensor.requires_grad:
            if tensor.numel() != 1:
                return None
            pairs.append((tensor, torch.ones_like(tensor)))
    return pairs or None


def matched_by_path(structure: list[tuple[str, Any]], grads: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``grads`` reordered to follow ``structure``, matched by path (dict keys, nested too), not position.

    Raises:
        GraphkitInputError: a path of one has no counterpart in the other (a misspelt or missing key).
    """
    if [name for name, _ in structure] == [name for name, _ in grads]:
        return grads
    by_path = dict(grads)
    missing = [name for name, _ in structure if name not in by_path]
    unexpected = sorted(set(by_path) - {name for name, _ in structure})
    if missing or unexpected or len(by_path) != len(grads):
        raise GraphkitInputError(
            f"grad_outputs does not match the outputs' structure: no cotangent for {missing or 'none'}, "
            f"cotangents for {unexpected or 'none'} that are not outputs; give one cotangent per output "
            "under the same keys (None for an output with no gradient)"
        )
    return [(name, by_path[name]) for name, _ in structure]


def named_inputs(inputs: Any) -> list[tuple[str, torch.Tensor]]:
    """``flatten_tensors(inputs, lone_name="input")``; one tensor, or a list or tuple of plain tensors (the
    usual stage inputs), named without the general walk."""
    if inputs is None:
        return []
    if type(inputs) is torch.Tensor:
        return [("input", inputs)]
    if type(inputs) in (list, tuple) and all(type(tensor) is torch.Tensor for tensor in inputs):
        return [(str(position), tensor) for position, tensor in enumerate(inputs)]
    return flatten_tensors(inputs, lone_name="input")


def weight_filter(params: list[torch.Tensor] | None) -> set[int] | None:
    if params is None:
        return None
    return {id(parameter) for parameter in params}


def parameter_list(params: Iterable[torch.Tensor] | torch.nn.Module | None) -> list[torch.Tensor] | None:
    """``params`` read once into a list (``module.parameters()`` is a generator), or None.

    Raises:
        GraphkitInputError: an entry is not a tensor, or not a leaf (W accumulates into leaves only, so
            a computed tensor would silently receive nothing).
    """
    if params is None:
        return None
    parameters = list(params.parameters() if isinstance(params, torch.nn.Module) else params)
    for position, parameter in enumerate(parameters):
        if not isinstance(parameter, torch.Tensor):
            raise GraphkitInputError(
                f"params[{position}] is a {type(parameter).__name__}, not a tensor: pass a module or the "
                "parameters (leaf tensors) whose gradients W should accumulate"
            )
        if parameter.grad_fn is not None:
            raise GraphkitInputError(
                f"params[{position}] (shape {tuple(parameter.shape)}, made by {type(parameter.grad_fn).__name__}) "
                "is not a leaf: W accumulates into leaves only, so it would receive no gradient; pass the "
                "parameters it is computed from instead"
            )
    return parameters
