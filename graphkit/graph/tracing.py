"""Run a module's forward while recording which submodule created each autograd Node.

:func:`trace` registers forward pre/post hooks on every submodule (a stack of module paths) and runs the
forward under a ``torch.overrides.TorchFunctionMode``. After every torch function call it stamps the
Nodes that call created with the innermost module path, in ``Node.metadata`` (a public, per-Node dict).
A Node is "created by this call" when its autograd sequence number is newer than the start of the trace
and no earlier call stamped it; composite functions that create several Nodes (``F.linear`` -> ``t`` +
``addmm``) have all of them stamped. Nodes created outside any torch function call (a custom
``torch.autograd.Function.apply`` does not pass through the mode) are stamped at the next module boundary
they cross - the module pre-hook stamps its arguments' new Nodes with the calling module, the post-hook
stamps its outputs' new Nodes with the module itself - or else by the next torch function call that
consumes them. Hooks and the mode are removed on every path, exceptions included.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from graphkit.graph import _autograd
from graphkit.graph.autograd_graph import MODULE_PATH_KEY, AutogradGraph, capture
from graphkit.graph.tensors import flatten_tensors

__all__ = ["trace"]


class _ModulePathStamp(TorchFunctionMode):
    """Stamps the Nodes each torch function call creates with the innermost module path."""

    def __init__(self, path_stack: list[str], start_sequence_number: int) -> None:
        super().__init__()
        self.path_stack = path_stack
        self.start = start_sequence_number

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        self.stamp(result, self.path_stack[-1])
        return result

    def stamp(self, value: Any, path: str) -> None:
        """Stamp ``path`` on every unstamped Node newer than the trace's start that ``value`` depends on."""
        stack = [tensor.grad_fn for _, tensor in flatten_tensors(value) if tensor.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or _autograd.is_accumulate_grad(node):
                continue
            if _autograd.sequence_number(node) <= self.start or MODULE_PATH_KEY in node.metadata:
                continue
            node.metadata[MODULE_PATH_KEY] = path
            stack.extend(producer for producer, _ in node.next_functions)


def _current_sequence_number() -> int:
    """The newest autograd sequence number of this thread (creates and drops one probe Node).

    0 under ``torch.inference_mode()``, where no Node is created at all.
    """
    with torch.enable_grad():
        probe = torch.zeros(1, requires_grad=True).view_as(torch.zeros(1))
    return 0 if probe.grad_fn is None else _autograd.sequence_number(probe.grad_fn)


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
        graphkit.graph.tensors.GraphkitInputError: as :func:`graphkit.capture` (no tensor output, no grad_fn).
    """
    path_stack = [""]
    stamp = _ModulePathStamp(path_stack, _current_sequence_number())

    def enter(path: str) -> Any:
        def hook(_module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            stamp.stamp((args, kwargs), path_stack[-1])  # made by the caller, outside a torch call
            path_stack.append(path)

        return hook

    def leave(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        stamp.stamp(output, path_stack[-1])  # made inside this module, outside a torch call
        path_stack.pop()

    handles = []
    for path, submodule in module.named_modules(remove_duplicate=False):
        handles.append(submodule.register_forward_pre_hook(enter(path), with_kwargs=True))
        handles.append(submodule.register_forward_hook(leave, always_call=True))
    try:
        with stamp:
            outputs = module(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    named_inputs = {str(position): value for position, value in enumerate(args)} | dict(kwargs)
    graph = capture(outputs, inputs=named_inputs, module=module)
    return outputs, graph
