"""graphkit's B and W with the signatures of ``torch.distributed.pipelining._backward``.

``stage_backward_input`` and ``stage_backward_weight`` in ``torch/distributed/pipelining/_backward.py`` are
what PyTorch's pipeline stage calls for a zero-bubble schedule's I and W actions. The functions here take
the same arguments, return the same values and have the same effects on the caller's side (the stage
inputs' ``.grad``, outputs detached in place, ``retain_graph``), and run
:func:`graphkit.split.backward.backward_input` and :func:`graphkit.split.backward.backward_weight` instead,
so a runtime that calls PyTorch's functions directly can call these. Where they differ from PyTorch's
(the table in ``docs/pipelining.md`` lists the same):

- the parameters' gradients are a full backward's, including where PyTorch's are wrong or missing
  (shared and tied weights, parameter-only outputs, parameters inside ``loss_fn``), and W runs the
  parameters' AccumulateGrad Nodes (post-accumulate-grad and DDP hooks fire);
- the "parameter groups" returned by :func:`stage_backward_input` are an opaque one-element list holding
  graphkit's :class:`~graphkit.split.backward.SplitState`; pass it, unchanged, to :func:`stage_backward_weight`;
- outputs that are views are not detached in place (PyTorch's detaches every output, which raises for a
  view);
- ``GradientEdge`` outputs (released stage outputs) are accepted on every torch release, and an output
  that is neither a tensor, a ``GradientEdge`` nor None raises ``GraphkitInputError``.

Errors are drop-ins too: where PyTorch's functions raise a type of their own for bad input, graphkit's error
is also that type (it subclasses both ``GraphkitInputError`` and PyTorch's type) and holds PyTorch's words,
so code (and PyTorch's own tests) written against PyTorch's functions catch graphkit's:

- a ``GradientEdge`` output with ``output_grads=None``: :class:`OutputGradientsRequiredError`, an
  ``AssertionError`` saying "requires output gradients", as PyTorch's ``stage_backward_input``;
- input the B phase refuses (a cotangent whose shape differs from its output's):
  :class:`StageBackwardInputError`, a ``RuntimeError`` beginning "Failed to run stage backward input", as
  PyTorch's function wraps whatever its backward raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.autograd.graph import GradientEdge
from torch.nn import Parameter

from graphkit.graph.tensors import GraphkitInputError
from graphkit.split.backward import SplitState, backward_input, backward_weight

__all__ = [
    "OutputGradientsRequiredError",
    "StageBackwardInputError",
    "split_input_gradients",
    "stage_backward_input",
    "stage_backward_weight",
]

_STATE_KEY = "graphkit_split_state"


class OutputGradientsRequiredError(GraphkitInputError, AssertionError):
    """A ``GradientEdge`` stage output (a released output) was given without its gradient
    (``output_grads=None``). An ``AssertionError`` as well, as PyTorch's ``stage_backward_input`` raises
    for the same input, with its words "requires output gradients"."""


class StageBackwardInputError(GraphkitInputError, RuntimeError):
    """The B phase refused its input (a cotangent whose shape differs from its output's). A
    ``RuntimeError`` as well, beginning "Failed to run stage backward input", as PyTorch's
    ``stage_backward_input`` wraps what its backward raises."""


def split_input_gradients(
    stage_outputs: Sequence[Any],
    output_grads: Sequence[torch.Tensor | None] | None,
    input_values: Sequence[Any],
    params: Iterable[torch.Tensor] | None = None,
) -> tuple[tuple[torch.Tensor | None, ...], SplitState | None]:
    """B phase over a pipeline stage's flat outputs and inputs, as ``torch.distributed.pipelining`` holds them.

    Args:
        stage_outputs: the stage outputs, or ``(loss,)`` on the last stage. Each entry is a tensor, a
            ``torch.autograd.graph.GradientEdge`` (newer PyTorch stages release an output after sending
            it and pass its edge instead: B and W run from the edge, exactly as from the tensor), or None
            (a released output that required no grad). A tensor that requires no grad is skipped, as by
            PyTorch's stage.
        output_grads: one cotangent per entry of ``stage_outputs`` (None entries for outputs that receive
            no gradient), or None when ``stage_outputs`` are scalar losses (cotangent 1).
        input_values: the stage inputs (tensors and other values).
        params: restrict W to these leaves; None means every leaf that requires grad, like a full backward.

    Returns:
        ``(input_grads, state)``: one gradient per entry of ``input_values`` (None for non-tensors and
        inputs without gradient), and the state for the W phase (None when no output has a gradient to
        run backward for: W then has nothing to do).

    Raises:
        OutputGradientsRequiredError: a ``GradientEdge`` output with ``output_grads`` None (also an
            ``AssertionError``, as PyTorch's).
        StageBackwardInputError: the B phase refused its input, such as a cotangent whose shape differs
            from its output's (also a ``RuntimeError``, as PyTorch's).
        graphkit.graph.tensors.GraphkitInputError: an output graphkit cannot run backward from (neither a
            tensor, a ``GradientEdge`` nor None), more or fewer cotangents than outputs, or
            (``output_grads`` None) a loss that does not require grad.
    """
    if output_grads is not None and len(output_grads) != len(stage_outputs):
        raise GraphkitInputError(
            f"{len(output_grads)} output gradients for {len(stage_outputs)} stage outputs; give one per "
            "output (None for an output that receives no gradient)"
        )
    for position, output in enumerate(stage_outputs):
        if output is not None and not isinstance(output, (torch.Tensor, GradientEdge)):
            raise GraphkitInputError(
                f"stage output {position} is a {type(output).__name__}: graphkit runs the backward from "
                "tensors and torch.autograd.graph.GradientEdge objects only (None for an output without "
                "gradient); return tensors from the stage"
            )
        if isinstance(output, GradientEdge) and output_grads is None:
            raise OutputGradientsRequiredError(
                f"stage output {position} is a GradientEdge (a released output), which requires output "
                "gradients: pass the gradient the next stage sent (output_grads=None means the outputs are "
                "scalar losses)"
            )
    if output_grads is None and not any(
        isinstance(output, torch.Tensor) and output.requires_grad for output in stage_outputs
    ):
        raise GraphkitInputError(
            "the loss does not require grad (it has no grad_fn), so there is nothing to run backward for: "
            "compute it from the stage output without detaching it, with gradients enabled"
        )
    outputs: list[torch.Tensor | GradientEdge] = []
    cotangents: list[torch.Tensor] = []
    for position, output in enumerate(stage_outputs):
        if output is None or (isinstance(output, torch.Tensor) and not output.requires_grad):
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
    try:
        state = backward_input(
            outputs, cotangents, [input_values[position] for position in tensor_positions], params
        )
    except GraphkitInputError as error:
        raise StageBackwardInputError(f"Failed to run stage backward input: {error}") from error
    for position, grad in zip(tensor_positions, state.input_grads, strict=True):
        input_grads[position] = grad
    return tuple(input_grads), state


def stage_backward_input(
    stage_outputs_or_loss: Sequence[torch.Tensor | GradientEdge | None],
    output_grads: list[torch.Tensor | None] | None,
    input_values: list[Any],
    weights: Iterator[Parameter],
) -> tuple[tuple[torch.Tensor | None, ...], list[dict[str, Any]]]:
    """Drop-in for ``torch.distributed.pipelining._backward.stage_backward_input``: graphkit's B phase.

    As PyTorch's function on the caller's side: each stage input's gradient is added to its ``.grad``
    (set where it was None) and returned, and the tensor outputs are detached in place afterwards -
    except views, which cannot be (PyTorch's raises there). Outputs may be ``GradientEdge`` objects.

    Args:
        stage_outputs_or_loss: the stage outputs (tensors, ``GradientEdge`` objects of released outputs,
            None), or ``[loss]`` on the last stage.
        output_grads: the cotangents received from the next stage, one per output (None entries allowed),
            or None on the last stage (the loss gets cotangent 1).
        input_values: the stage inputs.
        weights: the parameters whose gradients W accumulates (the leaves of the stage's autograd graph:
            for FSDP2, the unsharded parameters the forward used).

    Returns:
        ``(input_grads, param_groups)``: one gradient per entry of ``input_values`` (None where none
        flows), and an opaque list to pass to :func:`stage_backward_weight`.

    Raises:
        OutputGradientsRequiredError: a ``GradientEdge`` output with ``output_grads`` None (an
            ``AssertionError`` too, as PyTorch's).
        StageBackwardInputError: a cotangent whose shape differs from its output's (a ``RuntimeError``
            too, as PyTorch's).
        graphkit.graph.tensors.GraphkitInputError: more or fewer output gradients than outputs, an output
            that is neither a tensor, a ``GradientEdge`` nor None.
        graphkit.split.backward.GraphFreedError: the graph was freed by an earlier backward.
    """
    grads, state = split_input_gradients(stage_outputs_or_loss, output_grads, input_values, list(weights))
    for value, grad in zip(input_values, grads, strict=True):
        if isinstance(value, torch.Tensor) and grad is not None:
            if value.grad is None:
                value.grad = grad
            else:
                value.grad += grad
    for output in stage_outputs_or_loss:
        if isinstance(output, torch.Tensor) and not output._is_view():
            output.detach_()
    return grads, [{_STATE_KEY: state}]


def stage_backward_weight(
    weights: Iterator[Parameter], param_groups: list[dict[str, Any]], retain_graph: bool = False
) -> tuple[torch.Tensor | None, ...]:
    """Drop-in for ``torch.distributed.pipelining._backward.stage_backward_weight``: graphkit's W phase.

    Args:
        weights: the stage's parameters (only read for the return value).
        param_groups: what :func:`stage_backward_input` returned for this microbatch.
        retain_graph: as PyTorch's: keep the graph W ran through for another backward (graphkit's W
            state itself is single use: a second W for the same ``param_groups`` raises).

    Returns:
        Each parameter's ``.grad`` as it was before W, as PyTorch's function returns it (None where it
        had none; a tensor that was there received W's gradient in place).

    Raises:
        ValueError: ``param_groups`` did not come from graphkit's :func:`stage_backward_input`
            (PyTorch's parameter groups cannot be replayed by graphkit).
        graphkit.split.backward.SplitError: this microbatch's W already ran.
    """
    weight_grads = tuple(weight.grad for weight in weights)
    for group in param_groups:
        if not isinstance(group, dict) or _STATE_KEY not in group:
            raise ValueError(
                "param_groups did not come from graphkit.pipelining.stage_backward_input (got PyTorch's "
                "parameter groups?); run B and W with graphkit's functions, both or neither"
            )
        state = group[_STATE_KEY]
        if state is not None:
            backward_weight(state, retain_graph=retain_graph)
    return weight_grads
