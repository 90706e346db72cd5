"""Keep an autograd graph alive without keeping the tensors it produced.

The W phase sometimes calls a custom ``torch.autograd.Function``'s Node directly. Its Python object refers
to the C++ Node weakly (``THPFunction::cdata`` is a weak pointer), so only the graph above it keeps it and
its ``ctx`` alive. Holding the stage outputs would do that, but it also holds their memory and breaks when
the caller detaches them in place (``torch.distributed.pipelining`` does, to free the graph early).

:func:`graph_anchor` returns a tensor with no elements whose ``grad_fn`` has an edge to each output's
``grad_fn``: holding it keeps the graph alive, while the outputs themselves may be dropped or detached in
place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["graph_anchor"]


class _GraphAnchor(torch.autograd.Function):
    """Forward: any tensors in, one empty tensor out (nothing saved). Backward: no gradient flows."""

    @staticmethod
    def forward(ctx: Any, *tensors: torch.Tensor) -> torch.Tensor:
        return torch.empty(0, device=tensors[0].device)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, _grad: torch.Tensor) -> tuple[None, ...]:
        return (None,) * len(ctx.needs_input_grad)


def graph_anchor(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """An empty tensor whose ``grad_fn`` keeps the autograd graph of ``tensors`` alive.

    Args:
        tensors: tensors that require grad (outputs of a forward); those that do not are ignored.

    Returns:
        A tensor with no elements (on the first tensor's device) that holds no data of ``tensors``, or
        None when none of them requires grad.
    """
    with_graph = [tensor for tensor in tensors if tensor.requires_grad]
    if not with_graph:
        return None
    with torch.enable_grad():
        return _GraphAnchor.apply(*with_graph)
