"""Run a module's forward while recording which submodule created each autograd Node.

:func:`trace` registers forward pre/post hooks on every submodule (a stack of module paths) and runs the
forward under a ``torch.overrides.TorchFunctionMode``. After every torch function call it stamps the
Nodes that call created with the innermost module path, in ``Node.metadata`` (a public, per-Node dict).
A Node is "created by this call" when its autograd sequence number is newer than every Node seen
before the call; composite functions that create several Nodes (``F.linear`` -> ``t`` + ``addmm``) have
all of them stamped. Hooks and the mode are removed on every path, exceptions included.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from graphkit import _autograd
from graphkit.graph import MODULE_PATH_KEY, AutogradGraph, capture
from graphkit.tensors import flatten_tensors

__all__ = ["trace"]


class _ModulePathStamp(TorchFunctionMode):
    def __init__(self, path_stack: list[str], newest_sequence_number: int) -> None:
        super().__init__()
        self.path_stack = path_stack
        self.newest = newest_sequence_number

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        roots = [tensor.grad_fn for _, tensor in flatten_tensors(result) if tensor.grad_fn is not None]
        if roots:
            self._stamp(roots)
        return result

    def _stamp(self, roots: list[Any]) -> None:
        path = self.path_stack[-1]
        newest = self.newest
        stack = list(roots)
        while stack:
            node = stack.pop()
            if node is None or _autograd.is_accumulate_grad(node):
                continue
            number = _autograd.sequence_number(node)
            if number <= self.newest or MODULE_PATH_KEY in node.metadata:
                continue
            node.metadata[MODULE_PATH_KEY] = path
            newest = max(newest, number)
            stack.extend(producer for producer, _ in node.next_functions)
        self.newest = newest


def _current_sequence_number() -> int:
    probe = torch.zeros(1, requires_grad=True).view_as(torch.zeros(1))
    return _autograd.sequence_number(probe.grad_fn)


def trace(module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, AutogradGraph]:
    """Run ``module(*args, **kwargs)`` and capture its autograd graph with module paths.

    Args:
        module: the model or stage to run.
        *args, **kwargs: its forward arguments; tensors among them that require grad are the stage inputs.

    Returns:
        ``(outputs, graph)``: what the forward returned, and :func:`graphkit.capture` of it with
        ``inputs`` = the tensor arguments and ``module`` = ``module``; every op node has ``module_path``
        (``""`` for the top-level module, ``"layers.0.attn"`` for a submodule).

    Raises:
        graphkit.tensors.GraphkitInputError: as :func:`graphkit.capture` (no tensor output, no grad_fn).
    """
    path_stack = [""]

    def enter(path: str) -> Any:
        def hook(_module: torch.nn.Module, _args: Any) -> None:
            path_stack.append(path)

        return hook

    def leave(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
        path_stack.pop()

    handles = []
    for path, submodule in module.named_modules(remove_duplicate=False):
        handles.append(submodule.register_forward_pre_hook(enter(path)))
        handles.append(submodule.register_forward_hook(leave, always_call=True))
    try:
        with _ModulePathStamp(path_stack, _current_sequence_number()):
            outputs = module(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    named_inputs = {str(position): value for position, value in enumerate(args)} | dict(kwargs)
    graph = capture(outputs, inputs=named_inputs, module=module)
    return outputs, graph
