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

from torch.autograd.graph import Node
from torch.utils.flop_counter import FlopCounterMode

from graphkit.graph import _autograd

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
    (C++ Nodes and custom Functions, see :func:`graphkit.split.backward._call_nodes`), watched through
    :func:`graphkit.split.backward.observing_direct_calls`. Nothing global is patched: counters in
    other threads, or nested in this one, stay separate. Hooks are removed on exit, also on errors.
    """
    from graphkit.split.backward import observing_direct_calls

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
