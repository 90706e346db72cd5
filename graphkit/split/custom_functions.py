"""Custom ``torch.autograd.Function`` Nodes in the split backward: ``ctx.needs_input_grad`` per phase.

graphkit knows, per Node, which of its ``next_functions`` entries lie on the input path and which on the
weight side, and sets a custom Function Node's ``ctx.needs_input_grad`` to match before each phase,
restoring it after (also on errors): in B only the arguments on the input path ask for a gradient
(:func:`custom_functions_in_input_phase`), in W only the weight-side ones (:func:`call_custom_function`).
The flags live on the Node of its own graph, never in a process-wide variable, so it is right on any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch.autograd.graph import Node

from graphkit.graph import _autograd
from graphkit.graph.walk import NodeWalk
from graphkit.split.backward_plan import BackwardPlan, input_closure_flags

__all__ = [
    "call_custom_function",
    "custom_functions_in_input_phase",
    "needs_input_grad_for",
    "recording_apply",
]


def needs_input_grad_for(node: Node, wanted: Callable[[int, Node], bool]) -> tuple[bool, ...]:
    """A custom Function Node's ``needs_input_grad`` (one flag per forward argument) with True kept only
    for the arguments whose ``next_functions`` entry ``wanted(input_nr, next_node)`` accepts.

    The arguments that require grad are the valid ``next_functions`` entries, in order
    (``THPFunction_apply`` in ``torch/csrc/autograd/python_function.cpp`` makes one entry per tensor
    argument, an empty one where it needs no grad).
    """
    next_functions = node.next_functions
    valid = iter([nr for nr, (next_node, _) in enumerate(next_functions) if next_node is not None])
    flags = []
    for needed in node.needs_input_grad:
        input_nr = next(valid, None) if needed else None
        flags.append(input_nr is not None and bool(wanted(input_nr, next_functions[input_nr][0])))
    return tuple(flags)


def recording_apply(
    node: Node, received: dict[int, tuple[torch.Tensor | None, ...]], index: int, *grads: torch.Tensor | None
) -> Any:
    """A custom Function Node's ``apply`` that first notes the gradients the engine passes to it."""
    received[index] = grads
    return type(node).apply(node, *grads)


@contextmanager
def custom_functions_in_input_phase(
    walk: NodeWalk,
    input_nodes: set[Node],
    plan: BackwardPlan,
    received: dict[int, tuple[torch.Tensor | None, ...]],
) -> Iterator[None]:
    """Within: every custom Function Node on the input path asks, through ``ctx.needs_input_grad``, only
    for the gradients of its arguments on the input path (restored on exit, also on errors).

    Those that are intermediates also note in ``received`` the gradients their backward gets, after the
    engine materialized the missing ones (``PyNode::apply`` in ``torch/csrc/autograd/python_function.cpp``:
    zeros of each output's shape, a non-differentiable output's included, or None under
    ``ctx.set_materialize_grads(False)``), so that W passes the very same ones. The engine calls a custom
    Function through its ``apply`` attribute, so an instance attribute stands in for the class's one.
    """
    if plan.has_custom_functions is None:  # once per structure: the plan's key holds the Node classes
        plan.has_custom_functions = _autograd.any_custom_function(walk.nodes)
    if not plan.has_custom_functions:
        yield
        return
    custom = [index for index, node in enumerate(walk.nodes) if _autograd.is_custom_function(node)]
    in_closure = input_closure_flags(walk, input_nodes)
    intermediates = {index for index, _ in plan.intermediates}
    changed: list[tuple[Node, tuple[bool, ...]]] = []

    def on_input_path(_input_nr: int, next_node: Node) -> bool:
        position = walk.index.get(next_node)
        return position is not None and bool(in_closure[position])

    try:
        for index in custom:
            if not in_closure[index]:
                continue
            node = walk.nodes[index]
            original = node.needs_input_grad
            changed.append((node, original))
            node.needs_input_grad = needs_input_grad_for(node, on_input_path)
            if index in intermediates:
                node.apply = partial(recording_apply, node, received, index)
        yield
    finally:
        for node, original in changed:
            node.needs_input_grad = original
            node.__dict__.pop("apply", None)


def call_custom_function(
    node: Node, grads: tuple[torch.Tensor | None, ...], weight_input_nrs: Sequence[int], materialized: bool
) -> tuple[torch.Tensor | None, ...]:
    """W: call a custom Function's backward with ``ctx.needs_input_grad`` set to its weight-side arguments.

    ``grads``: what the backward received in B (``materialized``), else the captured gradients, whose
    missing entries become zeros of the output's shape. Returns one result per ``next_functions`` entry:
    the backward returns one gradient per forward argument, and those of the arguments that require grad
    are matched, in order, with the valid entries.
    """
    if materialized:
        arguments = list(grads)
    else:
        metadata = _autograd.gradient_metadata(node)
        if metadata is None:  # shapes unknown on this PyTorch: pass missing gradients on as None
            arguments = list(grads)
        else:
            arguments = [
                grad if grad is not None else torch.zeros(meta.shape, dtype=meta.dtype, device=meta.device)
                for grad, meta in zip(grads, metadata, strict=True)
            ]
    original = node.needs_input_grad
    wanted = set(weight_input_nrs)
    node.needs_input_grad = needs_input_grad_for(node, lambda input_nr, _: input_nr in wanted)
    try:
        result = node.apply(*arguments)
    finally:
        node.needs_input_grad = original
    result = (result,) if isinstance(result, torch.Tensor) or result is None else tuple(result)
    per_argument = [grad for grad, needed in zip(result, original, strict=False) if needed]
    edges: list[torch.Tensor | None] = []
    valid = iter(per_argument)
    for next_node, _ in node.next_functions:
        edges.append(next(valid, None) if next_node is not None else None)
    return tuple(edges)
