"""graphkit's B and W with the signatures of ``torch.distributed.pipelining._backward``.

``stage_backward_input`` and ``stage_backward_weight`` in ``torch/distributed/pipelining/_backward.py`` are
what PyTorch's pipeline stage calls for a zero-bubble schedule's I and W actions. The functions here take
the same arguments and return values of the same shape, and run :func:`graphkit.split.backward.backward_input`
and :func:`graphkit.split.backward.backward_weight` instead, so a runtime that calls PyTorch's functions
directly can call these. What differs from PyTorch's:

- the "parameter groups" returned by :func:`stage_backward_input` are an opaque one-element list holding
  graphkit's :class:`~graphkit.split.backward.SplitState`; pass it, unchanged, to :func:`stage_backward_weight`;
- the stage inputs' ``.grad`` is left alone (PyTorch's adds the input gradients to it); the gradients are
  returned, as by PyTorch's function;
- the outputs are not detached in place (PyTorch's detaches every output, which raises for a view); the
  caller may detach the ones that are not views, after B;
- :func:`stage_backward_weight` returns the parameters' ``.grad`` after W (PyTorch's returns them as they
  were before).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.nn import Parameter

from graphkit.graph.tensors import GraphkitInputError
from graphkit.split.backward import SplitState, backward_input, backward_weight

__all__ = ["split_input_gradients", "stage_backward_input", "stage_backward_weight"]

_STATE_KEY = "graphkit_split_state"


def split_input_gradients(
    stage_outputs: Sequence[Any],
    output_grads: Sequence[torch.Tensor | None] | None,
    input_values: Sequence[Any],
    params: Iterable[torch.Tensor] | None = None,
) -> tuple[tuple[torch.Tensor | None, ...], SplitState | None]:
    """B phase over a pipeline stage's flat outputs and inputs, as ``torch.distributed.pipelining`` holds them.

    Args:
        stage_outputs: the stage outputs (tensors; other values are skipped), or ``(loss,)`` on the last stage.
        output_grads: one cotangent per entry of ``stage_outputs`` (None entries for outputs that receive
            no gradient), or None when ``stage_outputs`` are scalar losses (cotangent 1).
        input_values: the stage inputs (tensors and other values).
        params: restrict W to these leaves; None means every leaf that requires grad, like a full backward.

    Returns:
        ``(input_grads, state)``: one gradient per entry of ``input_values`` (None for non-tensors and
        inputs without gradient), and the state for the W phase (None when no output has a gradient to
        run backward for: W then has nothing to do).

    Raises:
        graphkit.graph.tensors.GraphkitInputError: a cotangent whose shape differs from its output's,
            more or fewer cotangents than outputs, or (``output_grads`` None) a loss that does not
            require grad.
    """
    if output_grads is not None and len(output_grads) != len(stage_outputs):
        raise GraphkitInputError(
            f"{len(output_grads)} output gradients for {len(stage_outputs)} stage outputs; give one per "
            "output (None for an output that receives no gradient)"
        )
    if output_grads is None and not any(
        isinstance(output, torch.Tensor) and output.requires_grad for output in stage_outputs
    ):
        raise GraphkitInputError(
            "the loss does not require grad (it has no grad_fn), so there is nothing to run backward for: "
            "compute it from the stage output without detaching it, with gradients enabled"
        )
    outputs: list[torch.Tensor] = []
    cotangents: list[torch.Tensor] = []
    for position, output in enumerate(stage_outputs):
        if not isinstance(output, torch.Tensor) or not output.requires_grad:
            continue
        grad = torch.ones_like(output) if output_grads is None else output_grads[position]
        if grad is None:
            continue
        outputs.append(output)
        cotangents.append(grad)
    tensor_positions = [
        position for position, value in enumerate(input_values) if isinstance(value, torch.Tensor)
    ]
    input_grads: list[torch.Tensor | None] = [None] * len(input_values)
    if not outputs:
        return tuple(input_grads), None
    state = backward_input(
        outputs, cotangents, [input_values[position] for position in tensor_positions], params
    )
    for position, grad in zip(tensor_positions, state.input_grads, strict=True):
        input_grads[position] = grad
    return tuple(input_grads), state


def stage_backward_input(
    stage_outputs_or_loss: list[torch.Tensor],
    output_grads: list[torch.Tensor] | None,
    input_values: list[Any],
    weights: Iterator[Parameter],
) -> tuple[tuple[torch.Tensor | None, ...], list[dict[str, Any]]]:
    """Drop-in for ``torch.distributed.pipelining._backward.stage_backward_input``: graphkit's B phase.

    Args:
        stage_outputs_or_loss: the stage outputs, or ``[loss]`` on the last stage.
        output_grads: the cotangents received from the next stage, one per output (None entries allowed),
            or None on the last stage (the loss gets cotangent 1).
        input_values: the stage inputs.
        weights: the parameters whose gradients W accumulates (the leaves of the stage's autograd graph:
            for FSDP2, the unsharded parameters the forward used).

    Returns:
        ``(input_grads, param_groups)``: one gradient per entry of ``input_values`` (None where none
        flows), and an opaque list to pass to :func:`stage_backward_weight`.

    Raises:
        graphkit.graph.tensors.GraphkitInputError: mismatched output gradients.
        graphkit.split.backward.GraphFreedError: the graph was freed by an earlier backward.
    """
    grads, state = split_input_gradients(stage_outputs_or_loss, output_grads, input_values, list(weights))
    return grads, [{_STATE_KEY: state}]


def stage_backward_weight(
    weights: Iterator[Parameter], param_groups: list[dict[str, Any]], retain_graph: bool = False
) -> tuple[torch.Tensor | None, ...]:
    """Drop-in for ``torch.distributed.pipelining._backward.stage_backward_weight``: graphkit's W phase.

    Args:
        weights: the stage's parameters (only read for the return value).
        param_groups: what :func:`stage_backward_input` returned for this microbatch.
        retain_graph: must be False: graphkit's W state is single use.

    Returns:
        Each parameter's ``.grad`` after the W phase (None where it has none).

    Raises:
        ValueError: ``retain_graph=True``, or ``param_groups`` did not come from graphkit's
            :func:`stage_backward_input` (PyTorch's parameter groups cannot be replayed by graphkit).
        graphkit.split.backward.SplitError: this microbatch's W already ran.
    """
    if retain_graph:
        raise ValueError(
            "graphkit's W phase runs once per B phase and frees what it used; retain_graph=True is not "
            "supported: run the microbatch's forward and B again instead"
        )
    weights = list(weights)
    for group in param_groups:
        if not isinstance(group, dict) or _STATE_KEY not in group:
            raise ValueError(
                "param_groups did not come from graphkit.pipelining.stage_backward_input (got PyTorch's "
                "parameter groups?); run B and W with graphkit's functions, both or neither"
            )
        state = group[_STATE_KEY]
        if state is not None:
            backward_weight(state)
    return tuple(weight.grad for weight in weights)
