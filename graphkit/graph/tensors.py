"""Flattening nested outputs and inputs (tensors, sequences, mappings, Hugging Face ``ModelOutput``).

Stage outputs and inputs arrive in every shape a model can return: one tensor, a tuple, a dict, a
``ModelOutput`` (a dict subclass), a namedtuple, or any nesting of these. graphkit names every tensor by
its path (``"logits"``, ``"1"``, ``"hidden.0"``) so that diagrams, reports and gradients can refer to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

__all__ = ["GraphkitInputError", "distinct_bytes", "flatten_tensors", "unflatten_like"]


class GraphkitInputError(ValueError):
    """Raised for input graphkit cannot work with; the message says what was wrong and how to fix it."""


def flatten_tensors(
    value: Any, prefix: str = "", *, keep_none: bool = False, edges: bool = False, lone_name: str = "output"
) -> list[tuple[str, Any]]:
    """All tensors inside ``value`` with their paths, in a deterministic order.

    Args:
        value: a tensor, a sequence, a mapping (``ModelOutput`` included) or a nested mix; other objects
            (``None``, numbers, strings) are skipped.
        prefix: path prefix for the names.
        keep_none: also list ``None`` leaves (as ``(path, None)``), so that two structures of the same
            shape, such as outputs and their cotangents, flatten to aligned lists.
        edges: also list ``torch.autograd.graph.GradientEdge`` leaves (a stage output a pipeline released,
            standing for its tensor), which would otherwise be taken apart as a tuple.
        lone_name: the name of a single tensor (``"input"`` for a stage's inputs) without a prefix.

    Returns:
        ``[(path, tensor), ...]`` in depth-first order: sequences by index, mappings in their own order.
        A single tensor gets the name ``prefix or lone_name``.
    """
    found: list[tuple[str, torch.Tensor]] = []
    stack: list[tuple[str, Any]] = [(prefix, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, torch.Tensor) or (keep_none and item is None) or (edges and _is_edge(item)):
            found.append((path or lone_name, item))
        elif isinstance(item, Mapping):
            children = [(_join(path, str(key)), child) for key, child in item.items()]
            stack.extend(reversed(children))
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes)):
            children = [(_join(path, str(index)), child) for index, child in enumerate(item)]
            stack.extend(reversed(children))
    return found


def _is_edge(item: Any) -> bool:
    return isinstance(item, GradientEdge)


def non_tensor_leaves(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """The leaves of ``value`` that are neither tensors nor None, with their paths and type names
    (``[("count", "int")]`` for ``{"logits": tensor, "count": 3}``): outputs no gradient flows through,
    which capture skips and the commands name. Same walk and paths as :func:`flatten_tensors`."""
    found: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [(prefix, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, torch.Tensor) or item is None:
            continue
        if isinstance(item, Mapping):
            stack.extend(reversed([(_join(path, str(key)), child) for key, child in item.items()]))
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes)):
            stack.extend(reversed([(_join(path, str(index)), child) for index, child in enumerate(item)]))
        else:
            found.append((path or "output", type(item).__name__))
    return found


def distinct_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes held by ``tensors``, each stretch of storage counted once (views of one tensor are not added up).

    A tensor is keyed by its storage and offset; of several tensors with the same key the largest counts.
    """
    sizes: dict[tuple[int, int], int] = {}
    for tensor in tensors:
        if tensor.numel():
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            sizes[key] = max(sizes.get(key, 0), tensor.numel() * tensor.element_size())
    return sum(sizes.values())


def unflatten_like(template: Any, values: Sequence[Any]) -> Any:
    """Put ``values`` (one per tensor of ``flatten_tensors(template)``) back into ``template``'s shape.

    Mappings become dicts, sequences become lists or tuples like the template's; non-tensor leaves stay.
    """
    iterator = iter(values)

    def rebuild(item: Any) -> Any:
        # Depth is bounded by the nesting of the user's output structure, not by the graph.
        if isinstance(item, torch.Tensor):
            return next(iterator)
        if isinstance(item, Mapping):
            return {key: rebuild(child) for key, child in item.items()}
        if isinstance(item, Sequence) and not isinstance(item, (str, bytes)):
            rebuilt = [rebuild(child) for child in item]
            return tuple(rebuilt) if isinstance(item, tuple) else rebuilt
        return item

    return rebuild(template)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
