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
wrapper is installed only while some thread runs a B (a count under a lock) and passes every other query
through unchanged. The private PyTorch details it relies on (the query's name, the code name of the
hook's closure) are read in :mod:`graphkit.graph._autograd`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from torch.autograd.graph import Node

from graphkit.graph import _autograd

__all__ = ["MULTI_GRAD_HOOK_REASON", "refusing_multi_grad_hooks"]

MULTI_GRAD_HOOK_REASON = (
    "a torch.autograd.graph.register_multi_grad_hook(..., mode='all') hook spans tensors on the input "
    "path and on the weight side of this stage: B and W are two backward passes, so it would fire twice, "
    "each time with part of the gradients (a full backward fires it once with all of them). Register it "
    "over tensors of one side only, use mode='any' or tensor.register_hook, or run a full backward "
    "(graphkit.backward_full) for this stage"
)

_lock = threading.Lock()
# per open context: (is this Node one only W runs?, the error to raise)
_active: dict[int, tuple[Callable[[Node], bool], Callable[[], Exception]]] = {}
_original: list[Callable[[Node], bool]] = []


def _will_engine_execute_node(node: Node) -> bool:
    result = _original[0](node)
    if not result and _active:
        for only_in_weight_phase, error in list(_active.values()):
            if only_in_weight_phase(node) and _autograd.asked_by_multi_grad_hook(depth=1):
                raise error()
    return result


class refusing_multi_grad_hooks:  # noqa: N801 - used as a function: ``with refusing_multi_grad_hooks(...):``
    """Inside: a multi-grad hook that asks about a Node ``only_in_weight_phase`` accepts raises ``error()``.

    Opening the context costs a lock and a dict entry (the predicate is asked only when a multi-grad hook
    asks the engine about a Node the running task will not execute), so every B can afford it. A class
    rather than a generator-based context manager: B opens it once per microbatch.
    """

    __slots__ = ("_entry",)

    def __init__(self, only_in_weight_phase: Callable[[Node], bool], error: Callable[[], Exception]) -> None:
        self._entry = (only_in_weight_phase, error)

    def __enter__(self) -> None:
        with _lock:
            if not _active:
                _original[:] = [_autograd.engine_execution_query()]
                _autograd.replace_engine_execution_query(_will_engine_execute_node)
            _active[id(self)] = self._entry

    def __exit__(self, *_exception: object) -> None:
        with _lock:
            del _active[id(self)]
            if not _active:
                _autograd.replace_engine_execution_query(_original[0])
                _original.clear()
