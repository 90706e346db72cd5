"""A compiled region whose backward runs in two parts: I (input gradients) and W (weight gradients).

:class:`SplitRegion` holds what :mod:`graphkit.split.compile_backend` compiled for one captured graph: the
forward, the whole backward, and that backward cut in two (:mod:`graphkit.split.compiled_partition`).
Running it applies :class:`SplitRegionFunction`, a ``torch.autograd.Function`` whose backward computes
what ``ctx.needs_input_grad`` asks for - the contract graphkit's split already drives for custom Functions
(:mod:`graphkit.split.custom_functions`):

- every gradient that requires one (a plain ``loss.backward()``): the whole compiled backward, once;
- only input gradients (graphkit's I phase): the I graph. It keeps, until W, the values the W graph reads
  and no other tensor of the region (its other saved intermediates are released);
- then only weight gradients (graphkit's W phase): the W graph, over what I kept and the gradients W gets
  (the same ones I got). Everything the region kept is released after it;
- only weight gradients with no I before it (a region whose inputs need no gradient): the whole backward;
- inside graphkit's B without a walk (:mod:`graphkit.split.weight_queue`: a queue is installed on this
  thread and the engine call will not run the region's parameters): the I graph, with its pending W put
  on the microbatch's queue instead of kept on the Node (which then holds nothing and refuses another
  backward).

Other requests (an input gradient after I ran) raise a RuntimeError instead of returning a wrong gradient.
The Node holds the saved tensors itself (detached aliases, never through ``ctx.save_for_backward``), so that
after I it can let go of every one W does not read; it checks, as autograd does, that none was changed in
place since the forward, and lists what it holds in ``ctx.held_tensors`` for graphkit's memory accounting.
``saved_tensors_hooks`` (offloading, non-reentrant checkpointing around the region) do not see them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphkit.graph import _autograd
from graphkit.split import _aot_autograd
from graphkit.split.compiled_partition import BackwardPartition
from graphkit.split.weight_queue import PendingWeight, WeightQueue, current_queue, engine_skips, regions_made

__all__ = ["SplitRegion", "SplitRegionFunction"]


@dataclass(slots=True, eq=False)
class SplitRegion:
    """One compiled region, split (module docstring); built by :mod:`graphkit.split.compile_backend`.

    Attributes:
        forward: the compiled forward (boxed): takes the region's inputs (``parameters`` first), returns its
            ``output_count`` outputs, then one tensor per entry of ``saved``.
        backward: the compiled whole backward (boxed): takes the saved tensors, then one gradient per entry
            of ``tangent_outputs``; returns one gradient or None per input.
        input_backward: the compiled I graph (same arguments; returns the gradients at
            ``partition.input_positions``, then what W reads).
        weight_backward: the compiled W graph (takes what I returned for W, then the backward's arguments
            at ``partition.weight_reads``; returns the gradients at ``partition.weight_positions``).
        partition: the positions of the cut.
        parameters: tensors the captured graph holds as attributes (dynamo lifts parameters into inputs,
            then this is empty), passed before the inputs, as AOTAutograd does.
        output_count: how many outputs the region returns.
        saved: the names of the saved tensors in the forward graph, in order.
        differentiable_outputs: per output, whether it requires grad.
        tangent_outputs: the output position of each gradient the backward takes.
        tangent_layouts: per gradient, the (shape, stride) the compiled backward was traced with (a gradient
            of another layout is copied into that one first).
        disable_autocast: run the graphs with autocast off (they were traced under it).
    """

    forward: Callable[[list[Any]], Any]
    backward: Callable[[list[Any]], Any]
    input_backward: Callable[[list[Any]], Any]
    weight_backward: Callable[[list[Any]], Any]
    partition: BackwardPartition
    parameters: tuple[torch.Tensor, ...]
    output_count: int
    saved: tuple[str, ...]
    differentiable_outputs: tuple[bool, ...]
    tangent_outputs: tuple[int, ...]
    tangent_layouts: tuple[tuple[tuple[int, ...], tuple[int, ...]] | None, ...]
    disable_autocast: bool

    def __post_init__(self) -> None:
        regions_made.any = True  # from now on, graphkit's B looks for split regions near a stage's outputs

    def __call__(self, *arguments: Any) -> tuple[torch.Tensor, ...]:
        """Run the region: what torch.compile calls with the captured graph's inputs."""
        return SplitRegionFunction.apply(self, *self.parameters, *arguments)


class _Phase(enum.Enum):
    FRESH = "fresh"  # no backward ran yet, or only whole ones
    AFTER_INPUT = "after-input"  # I ran; W's values are kept
    DONE = "done"  # W ran (or the graph was released): nothing is kept
    QUEUED = "queued"  # I ran in a no-walk B: W waits on the microbatch's queue, the Node keeps nothing


def _tangents(region: SplitRegion, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    tangents = []
    for position, layout in zip(region.tangent_outputs, region.tangent_layouts, strict=True):
        grad = grads[position]
        if grad is None:  # not materialized: a zero gradient, as AOTAutograd passes it
            raise RuntimeError("a compiled region got no gradient for one of its outputs")
        if layout is not None and (tuple(grad.shape), grad.stride()) != layout:
            laid_out = torch.empty_strided(layout[0], layout[1], dtype=grad.dtype, device=grad.device)
            grad = laid_out.copy_(grad)
        tangents.append(grad)
    return tangents


class SplitRegionFunction(torch.autograd.Function):
    """The autograd Function of a :class:`SplitRegion` (module docstring). graphkit recognizes it as a
    Function whose backward computes only what ``ctx.needs_input_grad`` asks for."""

    computes_only_needed_gradients = True
    """Read by :mod:`graphkit.analysis.opaque`: this Function's I and W do no work twice."""

    queues_weight_in_b = True
    """Read by :mod:`graphkit.split.weight_queue`: in a no-walk B this Function queues its W there."""

    @staticmethod
    def forward(ctx: Any, region: SplitRegion, *arguments: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run the compiled forward; keep the saved tensors (detached) on the Node; return the outputs."""
        with _aot_autograd.no_autocast(region.disable_autocast):
            results = _aot_autograd.call_boxed(region.forward, list(arguments))
        outputs = tuple(results[: region.output_count])
        # detached aliases: no reference from the Node to an output's grad_fn (itself), and the version
        # counter they share with the original tells whether anyone changed one in place since. A saved
        # input that requires grad (a parameter a flex_attention score_mod captured) still says so, as in
        # AOTAutograd's own backward: flex_attention_backward computes a captured tensor's gradient only then
        saved = [
            value.detach().requires_grad_(value.requires_grad) for value in results[region.output_count :]
        ]
        ctx.region = region
        ctx.phase = _Phase.FRESH
        ctx.saved = saved
        ctx.saved_versions = [_aot_autograd.version(value) for value in saved]
        ctx.kept_for_weight = []
        ctx.kept_reads = {}
        ctx.kept_gradients = {}
        ctx.held_tensors = list(saved)  # what the Node holds, for graphkit's memory accounting
        ctx.mark_non_differentiable(
            *(
                output
                for output, needed in zip(outputs, region.differentiable_outputs, strict=True)
                if not needed
            )
        )
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """The gradients ``ctx.needs_input_grad`` asks for: the whole backward, I, or W (module docstring).

        Raises:
            RuntimeError: a saved tensor was changed in place since the forward; an input gradient asked
                for after I ran; a backward after the Node released what it held.
        """
        region: SplitRegion = ctx.region
        needed = ctx.needs_input_grad[1:]
        wanted = {position for position, flag in enumerate(needed) if flag}
        partition = region.partition
        weights = set(partition.weight_positions)
        gradients: list[torch.Tensor | None] = [None] * len(needed)
        with torch.no_grad(), _aot_autograd.no_autocast(region.disable_autocast):
            if ctx.phase is _Phase.AFTER_INPUT:
                if not wanted <= weights | set(ctx.kept_gradients):
                    raise RuntimeError(
                        "this compiled region's backward already ran its input-gradient part (I): only its "
                        "weight gradients (W) can follow; run a fresh forward for another backward"
                    )
                tangents = _tangents(region, grads)
                saved_count = len(region.saved)
                arguments = list(ctx.kept_for_weight)
                arguments += [
                    ctx.kept_reads[p] if p < saved_count else tangents[p - saved_count]
                    for p in partition.weight_reads
                ]
                gradients = [ctx.kept_gradients.get(position) for position in range(len(needed))]
                _release(ctx)
                results = _aot_autograd.call_boxed(region.weight_backward, arguments)
                for position, value in zip(partition.weight_positions, results, strict=True):
                    gradients[position] = value
            elif ctx.phase is _Phase.DONE:
                raise RuntimeError(
                    "this compiled region's backward ran already and released what it saved; pass "
                    "retain_graph=True to the first backward to run it again"
                )
            elif ctx.phase is _Phase.QUEUED:
                raise RuntimeError(
                    "this compiled region ran its input-gradient part (I) in graphkit's backward_input and "
                    "queued its weight gradients (W) for backward_weight; run a fresh forward for another "
                    "backward"
                )
            elif (queue := current_queue()) is not None and (
                queued := _queue_weight(ctx, region, grads, queue, weights)
            ) is not None:
                return queued
            else:
                saved = _saved_values(ctx)
                arguments = saved + _tangents(region, grads)
                split = bool(wanted) and wanted.isdisjoint(weights) and bool(weights & _requires(ctx))
                if split:
                    results = _aot_autograd.call_boxed(region.input_backward, arguments)
                    count = len(partition.input_positions)
                    ctx.kept_gradients = {}
                    for position, value in zip(partition.input_positions, results[:count], strict=True):
                        gradients[position] = value
                        if position not in wanted:  # an input gradient W asks for (a leaf graphkit defers)
                            ctx.kept_gradients[position] = value
                    ctx.kept_for_weight = list(results[count:])
                    ctx.kept_reads = {p: saved[p] for p in partition.weight_reads if p < len(saved)}
                    ctx.saved = None
                    ctx.held_tensors = [
                        *ctx.kept_for_weight,
                        *ctx.kept_reads.values(),
                        *ctx.kept_gradients.values(),
                    ]
                    ctx.phase = _Phase.AFTER_INPUT
                else:
                    del saved
                    results = _aot_autograd.call_boxed(region.backward, arguments)
                    gradients = list(results)
                    if not _aot_autograd.keeps_graph():
                        _release(ctx)
        return (None, *(value if position in wanted else None for position, value in enumerate(gradients)))


def _queue_weight(
    ctx: Any, region: SplitRegion, grads: Sequence[torch.Tensor | None], queue: WeightQueue, weights: set[int]
) -> tuple[torch.Tensor | None, ...] | None:
    """No-walk B: run the I graph and put the pending W on ``queue``; None where this call is no such B.

    It is one when some weight needs a gradient and the running engine call will not execute the first
    such weight's AccumulateGrad Node (B's ``inputs=`` are the stage inputs; a backward a hook starts inside
    B would run it), and every weight that needs a gradient is a leaf (its W accumulates into ``.grad``).
    """
    next_functions = ctx.next_functions
    edges = tuple(next_functions[position][0] for position in region.partition.weight_positions)
    present = [node for node in edges if node is not None]
    if not present or not engine_skips(present[0]) or not all(map(_autograd.is_accumulate_grad, present)):
        return None
    partition = region.partition
    saved = _saved_values(ctx)
    tangents = _tangents(region, grads)
    results = _aot_autograd.call_boxed(region.input_backward, [*saved, *tangents])
    count = len(partition.input_positions)
    wanted = {position for position, (node, _) in enumerate(next_functions) if node is not None} - weights
    gradients: list[torch.Tensor | None] = [None] * (len(ctx.needs_input_grad) - 1)
    for position, value in zip(partition.input_positions, results[:count], strict=True):
        if position in wanted:
            gradients[position] = value
    arguments = list(results[count:])
    del results
    saved_count = len(region.saved)
    kept_tangents = []
    for position in partition.weight_reads:
        if position < saved_count:
            arguments.append(saved[position])
        else:
            value = tangents[position - saved_count]
            kept_tangents.append((len(arguments), _aot_autograd.version(value)))
            arguments.append(value)
    queue.put(PendingWeight(region, arguments, edges, kept_tangents, ctx, ctx._sequence_nr()))
    _release(ctx)
    ctx.held_tensors = list(arguments)  # until W runs the queue (PendingWeight.drop)
    ctx.phase = _Phase.QUEUED
    return (None, *gradients)


def _release(ctx: Any) -> None:
    """Drop every tensor the Node holds; a later backward through it raises."""
    ctx.saved = None
    ctx.kept_for_weight = []
    ctx.kept_reads = {}
    ctx.kept_gradients = {}
    ctx.held_tensors = []
    ctx.phase = _Phase.DONE


def _requires(ctx: Any) -> set[int]:
    """Positions of the region's inputs that need a gradient at all: one ``next_functions`` entry per tensor
    argument (the region itself is none), empty where it needs none."""
    return {position for position, (node, _) in enumerate(ctx.next_functions) if node is not None}


def _saved_values(ctx: Any) -> list[torch.Tensor]:
    """The saved tensors, checked against in-place changes since the forward (as autograd checks its own)."""
    for index, (value, version) in enumerate(zip(ctx.saved, ctx.saved_versions, strict=True)):
        if _aot_autograd.version(value) != version:
            raise RuntimeError(
                f"one of the tensors a compiled region saved for its backward (saved tensor {index}, "
                f"{tuple(value.shape)}) was modified by an inplace operation after the forward: it is at "
                f"version {_aot_autograd.version(value)}, expected version {version}"
            )
    return list(ctx.saved)
