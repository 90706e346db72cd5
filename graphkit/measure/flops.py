"""Counting FLOPs of the split backward: per phase, in total, and per autograd Node.

:class:`PhaseFlops` is the one place FLOPs of a microbatch's phases are counted - the forward, the full
backward, B and W (:meth:`PhaseFlops.counting`) - for :mod:`graphkit.measure.verification`,
:mod:`graphkit.measure.benchmark`, :mod:`graphkit.measure.costs` and the inspect report.

:class:`FlopCounter` is ``torch.utils.flop_counter.FlopCounterMode`` without its per-module breakdown.
That breakdown comes from a ``ModuleTracker`` that registers gradient hooks on every module's inputs
and outputs; when activation checkpointing recomputes a module inside ``torch.autograd.grad`` (graphkit's
B phase), PyTorch refuses those hooks ("_will_engine_execute_node ... running autograd.grad()"). The
global count, all graphkit reports, needs no module tracking.

:func:`flops_per_node` attributes the FLOPs counted while given Nodes run - by the engine (between a
Node's pre-hook and post-hook) or called directly by the W phase - to those Nodes, so a report can say
which Node costs more under B + W than in a full backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from torch.autograd.graph import Node
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

from graphkit.graph import _autograd
from graphkit.split.backward import observing_direct_calls

__all__ = ["NOT_COUNTED", "FlopCounter", "Phase", "PhaseFlops", "flops_per_node"]

Phase = Literal["forward", "full", "b", "w"]
"""A phase of one microbatch: its forward, a full backward, B (input gradients) or W (weight gradients)."""

NOT_COUNTED = -1
"""The FLOPs of a phase that was not counted (it did not run, or could not run under the counter)."""


class _GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker: every FLOP counts for "Global" only."""

    parents = ("Global",)

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *args: object) -> None:
        return None


class _CountingMode(_FlopCounterMode):
    """FlopCounterMode's dispatch mode, counting also the higher-order ops that have a FLOP formula
    (``flex_attention``, ``flex_attention_backward``): each runs below the mode, counted by its formula, as
    the newest torch counts them; torch 2.13 refuses them (``NotImplemented``), so a flex_attention
    backward could not run under the counter at all."""

    def _handle_higher_order_ops(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func in self.counter.flop_registry:
            return self.counter._count_flops(func, func(*args, **kwargs), args, kwargs)
        return super()._handle_higher_order_ops(func, types, args, kwargs)


class FlopCounter(FlopCounterMode):
    """``FlopCounterMode(display=False)`` counting only the total (``get_total_flops()``), so that it
    works while checkpointed modules are recomputed inside ``torch.autograd.grad`` (module docstring), and
    counting higher-order ops by their FLOP formula (:class:`_CountingMode`).

    Replaces the private ``mod_tracker`` and ``mode`` attributes of ``FlopCounterMode``
    (``torch/utils/flop_counter.py``: its dispatch mode ``_FlopCounterMode``), pinned by tests.
    """

    def __init__(self) -> None:
        super().__init__(display=False)
        self.mod_tracker = _GlobalOnly()

    def __enter__(self) -> FlopCounter:
        super().__enter__()
        # swap the dispatch mode FlopCounterMode pushed for one that counts higher-order ops too
        self.mode.__exit__(None, None, None)
        self.mode = _CountingMode(self)
        self.mode.__enter__()
        return self


@contextmanager
def flops_per_node(counter: FlopCounterMode, nodes: Mapping[str, Node]) -> Iterator[dict[str, int]]:
    """Attribute the FLOPs ``counter`` counts while each of ``nodes`` runs to that Node's name.

    Args:
        counter: an active (entered) FLOP counter.
        nodes: the Nodes to watch, by a name of the caller's choice.

    Yields:
        A dict filled as the Nodes run: name -> FLOPs (a Node that never ran is absent). FLOPs of work a
        Node triggers inside its backward (a checkpoint's recomputation, a nested backward) count for it.

    The engine runs a Node between its pre-hooks and post-hooks; the W phase calls some Nodes directly
    (C++ Nodes and custom Functions, see :func:`graphkit.split.backward._call_nodes`), watched through
    :func:`graphkit.split.backward.observing_direct_calls`. Nothing global is patched: counters in
    other threads, or nested in this one, stay separate. Hooks are removed on exit, also on errors.
    """
    names = {node: name for name, node in nodes.items()}
    found: dict[str, int] = {}
    started: dict[str, list[int]] = {}

    def start(name: str) -> None:
        started.setdefault(name, []).append(counter.get_total_flops())

    def stop(name: str) -> None:
        if started.get(name):
            found[name] = found.get(name, 0) + counter.get_total_flops() - started[name].pop()

    @contextmanager
    def counted(node: Node) -> Iterator[None]:
        name = names.get(node)
        if name is None:
            yield
            return
        start(name)
        try:
            yield
        finally:
            stop(name)

    handles = []
    try:
        for node, name in names.items():
            handles.append(node.register_prehook(lambda grads, name=name: start(name)))
            handles.append(
                node.register_hook(_autograd.mark_own_hook(lambda inputs, outputs, name=name: stop(name)))
            )
        with observing_direct_calls(counted):
            yield found
    finally:
        for handle in handles:
            handle.remove()


@dataclass(slots=True)
class PhaseFlops:
    """FLOPs of the phases of one microbatch, as :class:`FlopCounter` counts them.

    Fill it one phase at a time with :meth:`counting`; a phase never counted, or dropped with
    :meth:`forget`, stays :data:`NOT_COUNTED`.

    Attributes:
        forward: FLOPs of the forward.
        full: FLOPs of a full backward.
        b: FLOPs of B (the input-gradient phase).
        w: FLOPs of W (the weight-gradient phase).
        nodes: by phase, the FLOPs each watched Node triggered (:func:`flops_per_node`; a Node that did
            not run in that phase is absent).
    """

    forward: int = NOT_COUNTED
    full: int = NOT_COUNTED
    b: int = NOT_COUNTED
    w: int = NOT_COUNTED
    nodes: dict[str, dict[str, int]] = field(default_factory=dict)

    @contextmanager
    def counting(self, phase: Phase, nodes: Mapping[str, Node] | None = None) -> Iterator[None]:
        """Count the FLOPs of the block as ``phase`` (replacing any earlier count of it).

        Args:
            phase: ``"forward"``, ``"full"``, ``"b"`` or ``"w"``.
            nodes: Nodes whose FLOPs to count separately, by name (:func:`flops_per_node`), into
                ``self.nodes[phase]``.

        The count is recorded when the block ends without an error; an error propagates and leaves the
        phase as it was.
        """
        with FlopCounter() as counter:
            watching = flops_per_node(counter, nodes) if nodes else contextlib.nullcontext({})
            with watching as per_node:
                yield
        setattr(self, phase, int(counter.get_total_flops()))
        self.nodes[phase] = dict(per_node)

    def forget(self, *phases: Phase) -> None:
        """Mark ``phases`` as not counted (a later phase failed, so their counts tell nothing)."""
        for phase in phases:
            setattr(self, phase, NOT_COUNTED)
            self.nodes.pop(phase, None)

    def backward(self) -> dict[str, int]:
        """``{"full", "b", "w"}``: FLOPs of the full backward, of B and of W (:data:`NOT_COUNTED`: -1)."""
        return {"full": self.full, "b": self.b, "w": self.w}

    def of_node(self, name: str) -> dict[str, int]:
        """``{"full", "b", "w"}``: FLOPs the watched Node ``name`` triggered in each backward (0: none)."""
        return {phase: self.nodes.get(phase, {}).get(name, 0) for phase in ("full", "b", "w")}
