"""Refusing ``torch.autograd.graph.register_multi_grad_hook(..., mode="all")`` across B and W.

A multi-grad hook in ``"all"`` mode waits, per autograd graph task, for the gradients of every one of its
tensors that the task will compute, and then calls its function once with all of them. On its first
gradient in a task it asks the engine which of its tensors' Nodes the task will run
(``torch._C._will_engine_execute_node``). B and W are separate engine calls: over one tensor on the input
path and one on the weight side, the hook would fire twice, once per phase, each time with part of the
gradients, where a full backward fires it once with all of them.

graphkit cannot hand the hook both phases' gradients, so B refuses it: while B's engine call runs, the
engine query is answered through a wrapper that raises :class:`~graphkit.split.backward.SplitError`
when a multi-grad hook asks about a Node only W will run - before the hook's function is called. The
wrapper is installed on ``torch._C`` only while some thread runs such a B (a count under a lock) and
passes every other query through unchanged. Private details used: the name of
``torch._C._will_engine_execute_node``, and the code name of the hook's closure
(``register_multi_grad_hook.<locals>.get_inner_hook.<locals>.inner_hook``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.autograd.graph import Node

__all__ = ["MULTI_GRAD_HOOK_REASON", "refusing_multi_grad_hooks"]

MULTI_GRAD_HOOK_REASON = (
    "a torch.autograd.graph.register_multi_grad_hook(..., mode='all') hook spans tensors on the input "
    "path and on the weight side of this stage: B and W are two backward passes, so it would fire twice, "
    "each time with part of the gradients (a full backward fires it once with all of them). Register it "
    "over tensors of one side only, use mode='any' or tensor.register_hook, or run a full backward "
    "(graphkit.backward_full) for this stage"
)

_lock = threading.Lock()
_active: dict[int, tuple[frozenset[int], Callable[[], Exception]]] = {}
_original: list[Callable[[Node], bool]] = []


def _asked_by_multi_grad_hook() -> bool:
    caller = sys._getframe(2)  # the wrapper's caller's frame: the hook that asked
    return caller.f_code.co_name == "inner_hook" and "register_multi_grad_hook" in getattr(
        caller.f_code, "co_qualname", ""
    )


def _will_engine_execute_node(node: Node) -> bool:
    result = _original[0](node)
    if not result and _active:
        for weight_side, error in list(_active.values()):
            if id(node) in weight_side and _asked_by_multi_grad_hook():
                raise error()
    return result


@contextmanager
def refusing_multi_grad_hooks(weight_side: list[Node], error: Callable[[], Exception]) -> Iterator[None]:
    """Inside: a multi-grad hook that asks about one of ``weight_side`` (Nodes only W runs) raises ``error()``.

    ``weight_side`` is kept by id while the context is open (the caller holds the Nodes).
    """
    if not weight_side:
        yield
        return
    token = object()
    with _lock:
        if not _active:
            _original[:] = [torch._C._will_engine_execute_node]
            torch._C._will_engine_execute_node = _will_engine_execute_node
        _active[id(token)] = (frozenset(id(node) for node in weight_side), error)
    try:
        yield
    finally:
        with _lock:
            del _active[id(token)]
            if not _active:
                torch._C._will_engine_execute_node = _original[0]
                _original.clear()
