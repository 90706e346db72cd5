"""Nodes the split backward runs once, in B: reentrant checkpoints and ``torch.compile``'d regions.

Some Nodes compute every gradient in one backward and cannot compute only the input side:

- a **reentrant activation checkpoint** (``torch.utils.checkpoint.checkpoint(..., use_reentrant=True)``,
  ``CheckpointFunction`` in ``torch/utils/checkpoint.py``): its backward recomputes the region and runs
  a nested ``torch.autograd.backward`` over it, which accumulates into the ``.grad`` of every parameter
  the region uses. PyTorch refuses it inside ``torch.autograd.grad`` ("incompatible with .grad()"),
  because that call cannot restrict the nested backward to its ``inputs``;
- a **compiled region** (``CompiledFunction`` of AOTAutograd, ``torch/_functorch/_aot_autograd/
  runtime_wrappers.py``): one compiled backward for all inputs, ignoring ``ctx.needs_input_grad``. When
  it was compiled with *donated buffers* (``torch._functorch.config.donated_buffer``, the default) it
  may overwrite its saved tensors, so PyTorch refuses to run it under ``retain_graph=True``.

Running such a Node again in W would repeat its whole backward - and, for a reentrant checkpoint,
accumulate the region's parameters a second time. So graphkit runs it exactly once, in B
(:class:`RunOnceNodes`; which Nodes these are, :mod:`graphkit.analysis.opaque` says): B's engine call allows the nested backward (``torch.autograd._is_checkpoint_valid``
answers True for its duration) and a compiled backward under ``retain_graph=True`` (``donated_buffer``
is off for its duration: no Node that donates runs twice), a post-hook keeps the gradients such an
intermediate returns along its weight-side edges, and W feeds those in without calling the Node
(:func:`kept_gradient`). Gradients are exact and no FLOP is repeated; the price is that B does the
Node's weight-side work too, and that a reentrant region's own parameters receive their ``.grad`` in
B (a warning says so). The nested backward is an ordinary full backward over the recomputed region:
a custom Function inside it sees ``ctx.needs_input_grad`` as PyTorch set it in the recomputation (every
argument that requires grad), so it computes all its gradients there, once.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch.autograd.graph import Node

from graphkit.analysis.opaque import OpaqueKind, opaque_kind
from graphkit.graph import _autograd
from graphkit.split.weight_rules import PreparedWeightGradient

__all__ = ["RunOnceNodes", "kept_gradient", "run_once_kind"]


def run_once_kind(node: Node) -> OpaqueKind | None:
    """``OpaqueKind.REENTRANT_CHECKPOINT`` or ``OpaqueKind.COMPILED_REGION`` for a Node the split runs
    once, in B; None for any other Node (:func:`graphkit.analysis.opaque.opaque_kind` decides)."""
    return opaque_kind(node, intermediate=False)


class _SharedOverride:
    """A process-wide setting overridden while at least one caller needs it (thread-safe, reentrant).

    The first caller to enter applies the override, the last to leave restores the original, so
    overlapping callers (threads, nested B calls) never restore each other's override as the original.

    Args:
        apply: applies the override and returns the function that undoes it.
    """

    def __init__(self, apply: Callable[[], Callable[[], None]]) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._holders = 0
        self._undo: Callable[[], None] | None = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._undo = self._apply()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._undo is not None:
                    undo, self._undo = self._undo, None
                    undo()


def _allow_nested_checkpoint_backward() -> Callable[[], None]:
    original = torch.autograd._is_checkpoint_valid
    torch.autograd._is_checkpoint_valid = lambda: True

    def undo() -> None:
        torch.autograd._is_checkpoint_valid = original

    return undo


def _keep_donated_buffers() -> Callable[[], None]:
    import torch._functorch.config as functorch_config

    patch = functorch_config.patch(donated_buffer=False)
    patch.__enter__()
    return lambda: patch.__exit__(None, None, None)


_checkpoint_valid = _SharedOverride(_allow_nested_checkpoint_backward)
"""Let ``CheckpointFunction.backward`` run its nested backward inside ``torch.autograd.grad``
(``torch.autograd._is_checkpoint_valid`` answers True; process-wide while any B that needs it runs)."""

_no_donated_buffers = _SharedOverride(_keep_donated_buffers)
"""Let a compiled backward run under ``retain_graph=True`` (``donated_buffer`` off while any B needs it)."""


class RunOnceNodes:
    """The run-once Nodes of one microbatch's graph, and what B keeps of them for W.

    Args:
        nodes: every Node of the walked graph with a run-once kind (:func:`run_once_kind`), as
            ``(index, node, kind)``.
        weight_input_nrs: for the intermediates among them, by index, the ``next_functions`` positions of
            their weight-side edges.

    Attributes:
        kept: by intermediate index, the gradients B's run returned along its weight-side edges.
        ran: indices of the Nodes that ran in B.
    """

    def __init__(
        self,
        nodes: Sequence[tuple[int, Node, OpaqueKind]],
        weight_input_nrs: dict[int, tuple[int, ...]],
    ) -> None:
        self.nodes = list(nodes)
        self._weight_input_nrs = weight_input_nrs
        self.kept: dict[int, tuple[torch.Tensor | None, ...]] = {}
        self.ran: set[int] = set()

    @property
    def reentrant(self) -> list[int]:
        """Indices of the reentrant checkpoints."""
        return [index for index, _, kind in self.nodes if kind is OpaqueKind.REENTRANT_CHECKPOINT]

    def all_ran(self) -> bool:
        """Whether every run-once Node ran (in B)."""
        return len(self.ran) == len(self.nodes)

    @contextmanager
    def engine_call(self) -> Iterator[None]:
        """Wrap an engine call that may run these Nodes: allow the nested and the compiled backwards,
        keep the weight-side gradients of the intermediates among them."""
        with ExitStack() as stack:
            handles = []
            for index, node, _ in self.nodes:
                handles.append(node.register_hook(_autograd.mark_own_hook(self._post_hook(index))))
            for handle in handles:
                stack.callback(handle.remove)
            if self.reentrant:
                stack.enter_context(_checkpoint_valid())
            if any(kind is OpaqueKind.COMPILED_REGION for _, _, kind in self.nodes):
                stack.enter_context(_no_donated_buffers())
            yield

    def _post_hook(self, index: int) -> Callable[[Any, Any], None]:
        wanted = self._weight_input_nrs.get(index, ())

        def keep(grad_inputs: Any, grad_outputs: Any) -> None:
            self.ran.add(index)
            if wanted:
                self.kept[index] = tuple(grad_inputs[input_nr] for input_nr in wanted)

        return keep

    def warn_about_reentrant(self, stacklevel: int) -> None:
        """Warn once per call site that reentrant regions gave their parameters ``.grad`` in B."""
        count = sum(1 for index in self.reentrant if index in self.ran)
        if not count:
            return
        warnings.warn(
            f"{count} reentrant activation checkpoint region(s) (use_reentrant=True) ran in the B phase: "
            "PyTorch runs each as one nested full backward, so the parameters used inside receive their "
            ".grad in B, not in W (each exactly once). Use torch.utils.checkpoint.checkpoint(..., "
            "use_reentrant=False) to defer them to W",
            stacklevel=stacklevel + 1,
        )


def kept_gradient(gradients: tuple[torch.Tensor | None, ...]) -> PreparedWeightGradient:
    """A weight-side 'formula' that returns the gradients B's run of the Node already computed."""
    present = tuple(gradient for gradient in gradients if gradient is not None)

    def compute(grads: Any, tensors: tuple[torch.Tensor, ...]) -> list[torch.Tensor | None]:
        return list(gradients)

    return PreparedWeightGradient(compute, present)
