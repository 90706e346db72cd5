"""Counting FLOPs of the split backward: in total, and per autograd Node.

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

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch.autograd.graph import Node
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["FlopCounter", "flops_per_node"]


class _GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker: every FLOP counts for "Global" only."""

    parents = ("Global",)

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *args: object) -> None:
        return None


class FlopCounter(FlopCounterMode):
    """``FlopCounterMode(display=False)`` counting only the total (``get_total_flops()``), so that it
    works while checkpointed modules are recomputed inside ``torch.autograd.grad`` (module docstring).

    Replaces the private ``mod_tracker`` attribute of ``FlopCounterMode``
    (``torch/utils/flop_counter.py``), pinned by a test.
    """

    def __init__(self) -> None:
        super().__init__(display=False)
        self.mod_tracker = _GlobalOnly()


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
    (:func:`graphkit.split.backward._call_node` for C++ Nodes and
    :func:`graphkit.split.backward._call_custom_function` for custom Functions, both wrapped for the
    duration). Hooks and wrappers are removed on exit, also on errors.
    """
    from graphkit.split import backward as backward_module

    names = {node: name for name, node in nodes.items()}
    found: dict[str, int] = {}
    started: dict[str, list[int]] = {}

    def start(name: str) -> None:
        started.setdefault(name, []).append(counter.get_total_flops())

    def stop(name: str) -> None:
        if started.get(name):
            found[name] = found.get(name, 0) + counter.get_total_flops() - started[name].pop()

    handles = []
    for node, name in names.items():
        handles.append(node.register_prehook(lambda grads, name=name: start(name)))
        handles.append(node.register_hook(lambda inputs, outputs, name=name: stop(name)))
    # W's direct calls: C++ Nodes through _call_node, custom Functions through _call_custom_function
    # (which calls the Function's backward itself, so no Node hook fires for it)
    originals = {name: getattr(backward_module, name) for name in _DIRECT_CALLS}

    def counted(original: Any) -> Any:
        def call(node: Node, *arguments: Any) -> Any:
            name = names.get(node)
            if name is None:
                return original(node, *arguments)
            start(name)
            try:
                return original(node, *arguments)
            finally:
                stop(name)

        return call

    try:
        for name, original in originals.items():
            setattr(backward_module, name, counted(original))
        yield found
    finally:
        for name, original in originals.items():
            setattr(backward_module, name, original)
        for handle in handles:
            handle.remove()


_DIRECT_CALLS = ("_call_node", "_call_custom_function")
"""The functions of :mod:`graphkit.split.backward` through which W calls a Node outside the engine."""
