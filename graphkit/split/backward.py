"""Split backward for zero-bubble pipeline schedules: B (input gradients) now, W (weight gradients) later.

Zero-bubble pipeline parallelism (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) splits a
stage's backward in two: **B** computes the gradients of the stage inputs (the previous stage waits for
them), **W** computes the parameter gradients later, filling pipeline bubbles. graphkit drives both from
the parameter groups of the captured graph (:mod:`graphkit.analysis.parameter_groups`):

**B phase** (:func:`backward_input`). One autograd-engine call,
``torch.autograd.grad(outputs, inputs=stage_inputs, retain_graph=True)``. The engine runs only Nodes on a
path to a stage input, and a Node computes only the outputs whose ``next_functions`` entry is on such a
path (``Node::task_should_compute_output`` in ``torch/csrc/autograd/function.h``): ``AddmmBackward0``
computes ``grad_mat1`` and not ``grad_mat2``. A post-hook on every intermediate captures the gradients it
received, one per forward output (a post-hook is passed them as the Node received them, after its
pre-hooks and the tensor hooks of its outputs). (Not the engine's own captures for
``inputs=GradientEdge(...)``: those are taken before the tensor hooks of the intermediate's outputs run,
and W needs the gradient the Node itself receives, after them.) Registering it also shows any other
post-hook of the intermediate (``Node.register_hook``, a module full backward hook): B refuses those,
since W, which computes the weight-side gradients by a formula or a direct call, could not run them.

**W phase** (:func:`backward_weight`). First the gradient along every weight-side edge is computed:

- for the ops that carry most weights (``mm``, ``addmm``, ``bmm``, convolution, layer, batch and
  group norm, ``mul``, ``add``), by a formula over the tensors the Node saved, taken in B (:mod:`graphkit.split.weight_rules`),
  so the state holds those tensors and not the Node, and the input path's graph is freed once the
  caller drops the outputs;
- for any other Node, by calling it with its captured gradients inside a small engine call of its own
  (:func:`_call_nodes`) whose ``inputs=`` are exactly the weight-side edges, so that the Node computes
  only its weight-side outputs (``Node::task_should_compute_output``): never its input-side ones, and
  nothing on the input path runs again.

Then one autograd-engine call, with ``inputs=`` the weight leaves, takes each of these gradients as
the root gradient of its edge's *target* (``GradientEdge(target, output_nr)``, in the order a full
backward produces them), plus the parameter-only outputs. The engine sums several roots on one edge and
reduces each to the edge's shape and dtype (``validate_outputs`` in ``torch/csrc/autograd/engine.cpp``),
and tensor hooks on a target - a parameter's hooks, a hook or ``retain_grad`` on ``W.t()`` - see the
summed gradient, as in a full backward. A parameter fed both by intermediates and through the
weight-only subgraph gets its direct contributions through small host Nodes placed in the engine's
order (:class:`_OrderedGradient`), so its sum is added in a full backward's order.

The engine then pushes the gradients through the weight-only subgraph once, so AccumulateGrad runs
normally: ``.grad`` accumulates across microbatches and post-accumulate-grad hooks fire once per W.
A parameter shared by many intermediates receives each contribution exactly once, whatever the order
of parameters, and a chain of intermediates is never re-entered. Plans (closures, intermediates and
their weight-side edges) depend only on the graph's structure and are reused across microbatches.

Custom ``torch.autograd.Function`` backwards run in both phases. graphkit knows, per Node, which of its
``next_functions`` entries lie on the input path and which on the weight side, and sets the Node's
``ctx.needs_input_grad`` to match before each phase (restoring it after): in B only the arguments on the
input path ask for a gradient, in W only the weight-side ones. A Function written the ordinary way,
computing only what ``needs_input_grad`` asks for, thus does exactly B's work in B and W's in W, on any
thread (the flags live on the Node of its own graph, not in a process-wide variable).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter, is_not
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

from graphkit.graph import _autograd
from graphkit.graph._autograd import ACCUMULATE_GRAD_CLASS
from graphkit.graph.tensors import GraphkitInputError, distinct_bytes
from graphkit.graph.walk import NodeWalk, walk_nodes
from graphkit.split.arguments import (
    named_inputs,
    pair_outputs,
    parameter_list,
    weight_filter,
)
from graphkit.split.backward_plan import (
    BackwardPlan,
    cached_plan,
    opaque_positions_of,
)
from graphkit.split.checkpointing import (
    CheckpointedRegions,
    Recompute,
    recompute_policy,
    regions_of,
)
from graphkit.split.custom_functions import call_custom_function, custom_functions_in_input_phase
from graphkit.split.graph_anchor import graph_anchor
from graphkit.split.laps import NO_LAPS, started_laps
from graphkit.split.multi_grad_hooks import MULTI_GRAD_HOOK_REASON, refusing_multi_grad_hooks
from graphkit.split.run_once import RunOnceNodes, kept_gradient, run_once_kind
from graphkit.split.weight_queue import (
    NO_WALK,
    REGIONS_AS_PLANNED,
    WALK,
    WALK_INSTEAD,
    NoWalkPlan,
    WeightQueue,
    check_regions,
    input_phase,
    no_walk_plan,
)
from graphkit.split.weight_rules import PreparedWeightGradient, prepare, tensor_version

__all__ = [
    "SUGGESTED_FLUSH_BYTES",
    "DirectCallObserver",
    "GraphFreedError",
    "SplitError",
    "SplitState",
    "backward_full",
    "backward_input",
    "backward_weight",
    "observing_direct_calls",
]


_not_none = partial(is_not, None)
"""``value is not None``, as a C-level callable for ``filter`` (no Python frame per gradient)."""


class SplitError(RuntimeError):
    """Misuse of the split backward (W twice, W without B, a state from elsewhere)."""


class GraphFreedError(SplitError):
    """The autograd graph's saved tensors were already freed by an earlier backward, or (in W) another
    backward ran through the microbatch's graph since B and counted its weight gradients already."""


@dataclass(slots=True)
class _WeightWork:
    """What the W phase does for one intermediate: a prepared rule, or a direct call of its Node."""

    grads: tuple[torch.Tensor | None, ...]
    # (input_nr in the intermediate's next_functions, target index, target output_nr)
    edges: tuple[tuple[int, int, int], ...]
    rule: PreparedWeightGradient | None
    node: Node | None  # kept only when no rule applies
    versions: tuple[int, ...] = ()  # of ``grads`` when B captured them
    sequence_nr: int = -1  # of the intermediate, read in B when it feeds a mixed leaf (see BackwardPlan)
    # a custom Function's ``grads`` as its backward received them in B (materialized by the engine)
    materialized: bool = False

    def check_unchanged(self) -> None:
        """Raise if a captured gradient was modified in place between B and W."""
        if tuple(map(tensor_version, filter(_not_none, self.grads))) == self.versions:
            return
        for grad, version in zip((g for g in self.grads if g is not None), self.versions, strict=True):
            if grad._version != version:
                raise SplitError(
                    f"a gradient of shape {tuple(grad.shape)} captured in the B phase was modified in place "
                    "before the W phase (a reused receive buffer, or an input gradient scaled in place); "
                    "pass cotangents that stay unchanged until W, or clone them"
                )


@dataclass(slots=True, weakref_slot=True)
class SplitState:
    """What the B phase leaves for the W phase of one microbatch. Single use.

    It holds only what the W phase needs: the gradients captured at intermediates, the normalization
    parameters' gradients B computed (:data:`~graphkit.split.backward_plan.REDUCTIONS_IN_B`), the saved
    tensors the weight-side formulas read (:mod:`graphkit.split.weight_rules`) or, for ops without a formula, the
    intermediate Node itself, and the weight-only Nodes the gradients enter. Once the caller drops the
    stage outputs, the rest of the input path's graph is freed - except what a kept Node reaches
    through its ``next_functions``, and, when W must call a custom Function's Node, the whole graph (a
    Python Node refers to its C++ Node weakly; the state then holds an empty anchor tensor above the
    outputs, :func:`graphkit.split.graph_anchor.graph_anchor`, never the outputs themselves, so they may
    be detached in place after B).

    Attributes:
        input_grads: gradient of each tensor in ``flatten_tensors(inputs)`` (None where the input needs no
            grad or receives none).
        input_names: the names of those inputs.
        num_intermediates: intermediates that received a gradient (captured for W, or with all their
            weight-side gradients computed in B).
        num_node_calls: intermediates without a weight-side formula, whose Node the W phase calls.
    """

    input_grads: tuple[torch.Tensor | None, ...]
    input_names: tuple[str, ...]
    num_intermediates: int
    num_node_calls: int
    _plan: BackwardPlan = field(repr=False)
    _work: list[_WeightWork | None] = field(repr=False)
    _targets: dict[int, Node] = field(repr=False)
    _output_roots: list[tuple[GradientEdge, torch.Tensor]] = field(repr=False)
    # the normalization parameters' gradients B computed (BackwardPlan.reductions_in_b), as W's roots
    _computed_in_b: list[tuple[GradientEdge, torch.Tensor]] = field(repr=False)
    _weight_tensors: list[torch.Tensor] = field(repr=False)
    # Kept only when a custom Function's Node must be called in W: a Python Node object refers to its
    # C++ Node weakly, and only the graph above it keeps that (and its ctx) alive. An empty anchor
    # tensor (graph_anchor) holds that graph, not the caller's outputs, which may be detached in place.
    _keep_alive: tuple[torch.Tensor | GradientEdge, ...] = field(default=(), repr=False)
    _used: bool = False
    _failure: str | None = field(default=None, repr=False)  # why W failed, when it did
    # set by a pre-hook when another backward runs through this microbatch's graph before W
    _other_backward: list[bool] = field(default_factory=lambda: [False], repr=False)
    _watch_handles: list[Any] = field(default_factory=list, repr=False)
    # the non-reentrant checkpointed regions W reads, with one GraphExecGroup per phase (checkpointing.py)
    _checkpoints: CheckpointedRegions | None = field(default=None, repr=False)
    # reentrant checkpoints and compiled regions W still runs (run_once.py)
    _run_once: RunOnceNodes | None = field(default=None, repr=False)
    # every leaf W's engine call reaches is one of _weight_tensors (no parameter left out by params= or
    # by requires_grad), so that call needs no inputs= (see _run_weight_engine)
    _reaches_only_weights: bool = field(default=False, repr=False)
    # B without a walk (graphkit.split.weight_queue): the compiled regions' pending W, which W runs
    _weight_queue: WeightQueue | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        """How B ran: ``"no-walk"`` (every parameter inside regions split by ``graphkit.splitting_backend()``:
        the regions queued their W, :mod:`graphkit.split.weight_queue`) or ``"walk"`` (the graph walked)."""
        return NO_WALK if self._weight_queue is not None else WALK

    @property
    def used(self) -> bool:
        """True once :func:`backward_weight` consumed this state."""
        return self._used

    def captured_tensors(self) -> list[torch.Tensor]:
        """The gradients captured at intermediates and for parameter-only outputs, and the normalization
        parameters' gradients B computed, kept for W."""
        tensors = [grad for work in self._work if work is not None for grad in work.grads if grad is not None]
        if self._weight_queue is not None:
            tensors += self._weight_queue.captured_tensors()
        return tensors + [grad for _, grad in self._output_roots] + [grad for _, grad in self._computed_in_b]

    def captured_bytes(self) -> int:
        """Bytes of :meth:`captured_tensors` (each storage counted once)."""
        return distinct_bytes(self.captured_tensors())

    def held_tensors(self) -> list[torch.Tensor]:
        """Saved tensors the weight-side formulas keep alive (not counting Nodes kept for direct calls), and
        what the compiled regions queued for W on the no-walk path."""
        held = [
            tensor for work in self._work if work is not None and work.rule for tensor in work.rule.tensors
        ]
        if self._weight_queue is not None:
            held += self._weight_queue.held_tensors()
        return held

    def held_nodes(self) -> list[Node]:
        """Nodes the state keeps alive: intermediates without a formula, weight-side targets, output roots."""
        nodes = self.called_nodes() + self.weight_side_nodes()
        nodes += [
            item.node if isinstance(item, GradientEdge) else item.grad_fn
            for item in self._keep_alive
            if isinstance(item, GradientEdge) or item.grad_fn is not None
        ]
        return nodes

    def called_nodes(self) -> list[Node]:
        """The intermediates without a weight-side formula, whose Node W calls (their saved tensors stay)."""
        return [work.node for work in self._work if work is not None and work.node is not None]

    def weight_side_nodes(self) -> list[Node]:
        """The Nodes W's engine call starts from: weight-side targets and parameter-only outputs' Nodes."""
        return (
            list(self._targets.values())
            + [edge.node for edge, _ in self._output_roots]
            + [edge.node for edge, _ in self._computed_in_b]
        )

    def weight_tensors(self) -> list[torch.Tensor]:
        """The parameters (weight leaves) W accumulates into."""
        return list(self._weight_tensors)

    @property
    def checkpoint_regions(self) -> CheckpointedRegions | None:
        """The non-reentrant checkpointed regions W reads (their recomputation counts), or None."""
        return self._checkpoints

    def __del__(self) -> None:
        # a state dropped without W: remove the pre-hooks watching for other backwards (W removed them
        # otherwise); cheaper per microbatch than a weakref.finalize
        handles = self._watch_handles
        while handles:  # no module global: also safe while the interpreter shuts down
            handles.pop().remove()

    def _release(self) -> None:
        _remove_handles(self._watch_handles)
        self._used = True
        self._work = []
        self._targets = {}
        self._output_roots = []
        self._computed_in_b = []
        self._weight_tensors = []
        self._keep_alive = ()
        if self._checkpoints is not None:
            self._checkpoints.release()
            self._checkpoints = None
        self._run_once = None
        if self._weight_queue is not None:
            self._weight_queue.release()


def _storage_range(tensor: torch.Tensor) -> tuple[int, int] | None:
    """``[start, end)`` addresses of the storage behind ``tensor``: every view of it points inside.

    None for a tensor without a storage of its own to read (a wrapper subclass such as DTensor).
    """
    try:
        storage = tensor.untyped_storage()
        start = storage.data_ptr()
    except RuntimeError:
        return None
    return start, start + storage.nbytes()


def _inside(tensor: torch.Tensor, ranges: list[tuple[int, int] | None]) -> bool:
    """Whether ``tensor`` may view one of the storages ``ranges`` describe (a cheap test on its address).

    True when an address cannot be read (wrapper subclasses): the caller then copies, to be safe.
    """
    try:
        address = tensor.data_ptr()
    except RuntimeError:
        return True
    for bounds in ranges:  # noqa: SIM110 - a loop, not any(generator): called for every captured gradient
        if bounds is None or bounds[0] <= address < bounds[1]:
            return True
    return False


def _in_leaf_layout(grad: torch.Tensor | None, leaf: torch.Tensor) -> torch.Tensor | None:
    """``grad`` with the strides a full backward gives the ``.grad`` of ``leaf`` (values unchanged).

    AccumulateGrad keeps a gradient whose strides match its leaf's (sizes of 1 aside) and otherwise copies
    it into the leaf's strides (into a contiguous tensor if the leaf is not dense): ``clone_obey_contract``
    in ``torch/csrc/autograd/functions/accumulate_grad.h``. The engine's raw input gradient may have other
    strides (an LSTM over a PackedSequence, some fft backwards); B's follows the same rule.
    """
    if grad is None or not leaf.is_leaf or grad.layout != torch.strided or leaf.layout != torch.strided:
        return grad
    if grad.shape != leaf.shape:
        return grad
    strides = grad.stride()
    if strides == leaf.stride() and 0 not in strides and leaf.is_contiguous():
        return grad  # the common case, as the loop below would find it
    if _dense(leaf):
        if all(
            (size != 1 and stride == expected) or (size == 1 and stride != 0)
            for size, stride, expected in zip(grad.shape, grad.stride(), leaf.stride(), strict=True)
        ):
            return grad
        return grad.new_empty_strided(leaf.shape, leaf.stride()).copy_(grad)
    return grad if grad.is_contiguous() else grad.clone(memory_format=torch.contiguous_format)


def _dense(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is non-overlapping and dense (its elements fill its storage span once, any order)."""
    if tensor.is_contiguous():
        return True
    sizes_strides = sorted(
        (stride, size) for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size != 1
    )
    expected = 1
    for stride, size in sizes_strides:
        if stride != expected:
            return False
        expected *= size
    return True


def _unaliased(grad: torch.Tensor | None, captured: list[torch.Tensor]) -> torch.Tensor | None:
    """``grad``, copied if it shares storage with a gradient the W phase still needs.

    The input gradient is the caller's to change (scale, send, reuse); the W phase must not see that.
    """
    if grad is None or not captured:
        return grad
    ranges = [_storage_range(grad)]
    return grad.clone() if any(_inside(kept, ranges) for kept in captured) else grad


def _register_prehook(node: Node, hook: Any) -> Any:
    """Every pre-hook graphkit puts on a Node goes through here (one place to audit their removal)."""
    return node.register_prehook(hook)


def _register_posthook(node: Node, hook: Any) -> Any:
    """Every post-hook the split puts on a Node goes through here (one place to audit their removal)."""
    return node.register_hook(hook)


def _freed_error(error: RuntimeError) -> Exception:
    """A GraphFreedError for PyTorch's freed-graph error; any other error unchanged."""
    if "backward through the graph a second time" in str(error):
        return GraphFreedError(
            "the autograd graph of these outputs was already freed by an earlier backward; run the "
            "forward again for this microbatch (or pass retain_graph=True to the earlier backward)"
        )
    return error


def _mark_materialized(
    plan: BackwardPlan, work: list[_WeightWork | None], received: dict[int, tuple[torch.Tensor | None, ...]]
) -> None:
    """Flag the work of the custom Functions whose gradients B took as their backward received them."""
    if not received:
        return
    for (index, _), item in zip(plan.intermediates, work, strict=True):
        if item is not None and index in received:
            item.materialized = True


def _remove_handles(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


def _watch_for_other_backwards(state: SplitState, output_edges: list[GradientEdge]) -> None:
    """Pre-hooks, until W, on the Nodes of the stage outputs B ran from.

    Another backward from these outputs before W (an ordinary ``.backward()``, or ``backward_input`` a
    second time for the same outputs) has counted this microbatch's weight gradients already, or freed
    the graph; W then refuses to count them again (:class:`GraphFreedError`). A backward of some other
    loss taken from an activation inside the stage is left alone: its gradients are its own. A
    parameter returned as an output is not watched (its AccumulateGrad Node serves every microbatch).
    The hooks hold only a flag, never the state; W removes them before its own engine call, and so does
    the state's ``__del__`` if W never runs.
    """
    watched = {edge.node for edge in output_edges if not _autograd.is_accumulate_grad(edge.node)}
    if not watched:
        return
    flag = state._other_backward

    def note(_grads: Any) -> None:
        flag[0] = True

    handles = state._watch_handles
    for node in watched:
        handles.append(_register_prehook(node, note))


def backward_input(
    outputs: Any,
    grad_outputs: Any = None,
    inputs: Any = None,
    params: Iterable[torch.Tensor] | torch.nn.Module | None = None,
    *,
    recompute: Recompute | str = Recompute.IN_W,
) -> SplitState:
    """B phase: compute the stage-input gradients and capture what the W phase needs.

    Args:
        outputs: the stage outputs - a tensor, sequence, mapping or nested mix (as :func:`graphkit.capture`).
        grad_outputs: the cotangents, in the same structure (None entries for outputs without gradient),
            matched to the outputs by key and index (a dict's order does not matter); None means every
            output that requires grad is a scalar loss (cotangent 1).
        inputs: the stage inputs (same forms, ``torch.Tensor`` subclasses too); those that require grad
            get gradients.
        params: restrict the W phase to these parameters (a module or an iterable of tensors); by default
            every leaf that requires grad and is not a stage input, like a full backward.
        recompute: when W gets the saved tensors of non-reentrant activation checkpoints
            (:class:`~graphkit.split.checkpointing.Recompute`): ``"in-w"`` (default) recomputes them in W,
            so between B and W a region holds only its checkpoint inputs; ``"keep-from-b"`` keeps B's
            recomputation for W (one recomputation instead of two, more memory between B and W).

    Returns:
        A single-use :class:`SplitState`; ``state.input_grads`` aligns with ``flatten_tensors(inputs)``.
        Layer, group and batch norm's weight and bias gradients, reductions over the pass that gives the
        input gradient (:data:`~graphkit.split.backward_plan.REDUCTIONS_IN_B`), are computed here by the
        Node's own call and kept for W (which adds them to ``.grad``) - unless such a parameter has
        tensor hooks (the capture would run them in B), the stage has parameter-only outputs, or no
        stage input requires grad: W then computes them from the Nodes' saved tensors.
        No ``.grad`` is touched - except by a reentrant checkpoint (``use_reentrant=True``), whose nested
        backward gives the parameters inside it their ``.grad`` in B (with a warning; see
        :mod:`graphkit.split.run_once`). Until W, a pre-hook on each output's Node notes any other
        backward from the outputs (W then refuses to count the weight gradients twice). Where every
        parameter lies inside regions compiled by ``graphkit.splitting_backend()`` (on the CPU), B runs
        without a walk and the regions queue their W (``state.path == "no-walk"``,
        :mod:`graphkit.split.weight_queue`).

    Raises:
        graphkit.graph.tensors.GraphkitInputError: outputs without a graph, ``grad_outputs`` whose
            structure or keys differ from the outputs', ``params`` holding a tensor that is not a leaf.
        GraphFreedError: the graph was already freed by an earlier backward.
        ValueError: ``recompute`` is not a :class:`~graphkit.split.checkpointing.Recompute` value.
        SplitError: a hook registered a tensor hook on a normalization parameter whose gradient B
            computes while B ran (it might run twice); register parameter hooks before or after B.

    Under ``torch.inference_mode()`` B runs as a full backward does there, with ``inference_mode(False)``
    inside (so the gradients, and the parameters' ``.grad`` in W, are ordinary tensors).
    """
    if not torch.is_inference_mode_enabled():  # the usual case, without entering a context
        return _backward_input(outputs, grad_outputs, inputs, params, recompute, stacklevel=3)
    with _outside_inference_mode():
        return _backward_input(outputs, grad_outputs, inputs, params, recompute, stacklevel=3)


@contextmanager
def _outside_inference_mode() -> Iterator[None]:
    """``torch.inference_mode(False)`` where inference mode is on (no cost otherwise): B and W create small
    graphs of their own and read gradient edges, which inference mode would prevent."""
    if not torch.is_inference_mode_enabled():
        yield
        return
    with torch.inference_mode(False):
        yield


def _backward_input(
    outputs: Any,
    grad_outputs: Any,
    inputs: Any,
    params: Iterable[torch.Tensor] | torch.nn.Module | None,
    recompute: Recompute | str,
    stacklevel: int,
) -> SplitState:
    lap = started_laps()  # NO_LAPS, whose marks do nothing, unless timing_laps() is on
    recompute = recompute_policy(recompute)
    params = parameter_list(params)
    pairs = pair_outputs(outputs, grad_outputs)
    if not pairs:
        raise GraphkitInputError("every output's cotangent is None: there is nothing to run backward for")
    inputs_by_name = named_inputs(inputs)
    stage_inputs = [tensor for _, tensor in inputs_by_name if tensor.requires_grad]
    for name, tensor in inputs_by_name:
        if tensor.requires_grad and tensor.grad_fn is not None:
            warnings.warn(
                f"stage input {name!r} is not a leaf: the split backward stops at it, so nothing before it "
                "(an earlier stage's graph) receives gradients; pass .detach().requires_grad_() inputs, as "
                "a pipeline stage receives them",
                stacklevel=stacklevel,
            )
    output_edges = [_root_edge(output) for output, _ in pairs]
    lap("b.arguments")
    if stage_inputs and all(isinstance(output, torch.Tensor) for output, _ in pairs):
        cotangents = [grad for _, grad in pairs]
        key, no_walk = no_walk_plan(output_edges, cotangents, stage_inputs, params)
        lap("b.no_walk_plan")
        if no_walk is not None:
            state = _backward_input_without_walk(
                key, no_walk, pairs, cotangents, inputs_by_name, stage_inputs, output_edges, params, lap
            )
            if state is not None:
                return state
    walk, input_nodes, variables = _walk_to_inputs(output_edges, stage_inputs)
    lap("b.walk")
    input_positions = tuple(sorted(walk.index.get(node, -1) for node in input_nodes))
    allowed = weight_filter(params)
    # planned first with every leaf a weight: the leaves to leave out (outside ``params=``, or no longer
    # requiring grad) are among its weight leaves, whose variables W needs anyway
    plan = cached_plan(walk, input_nodes, frozenset(), input_positions)
    nodes = walk.nodes
    weight_tensors = _variables(nodes, plan.weight_leaves, variables)
    excluded = frozenset(
        leaf
        for leaf, tensor in zip(plan.weight_leaves, weight_tensors, strict=True)
        # requires_grad turned off after the forward: a full backward's AccumulateGrad skips such a
        # leaf, so W leaves it out, as params= would
        if not tensor.requires_grad or (allowed is not None and id(tensor) not in allowed)
    )
    if excluded:
        plan = cached_plan(walk, input_nodes, excluded, input_positions)
        weight_tensors = _variables(nodes, plan.weight_leaves, variables)

    lap("b.plan")
    closure_outputs = []
    output_roots: list[tuple[GradientEdge, torch.Tensor]] = []
    for edge, (tensor, grad) in zip(output_edges, pairs, strict=True):
        if plan.weight_only[walk.index[edge.node]]:
            # the caller may reuse its cotangent buffer before W: keep a copy (as for captured gradients)
            output_roots.append((edge, grad.clone()))
        else:
            closure_outputs.append((tensor, grad))

    variant = plan.reductions_in_b
    # the parameters whose gradients B would compute (read from their cold AccumulateGrad Nodes once)
    parameters_computed_in_b = (
        _variables(nodes, [target for target, _ in variant.computed_in_b], variables)
        if variant is not None and stage_inputs and closure_outputs and not output_roots
        else []
    )
    if parameters_computed_in_b and not any(map(_autograd.has_tensor_hooks, parameters_computed_in_b)):
        plan = variant
    # a Node post-hook receives the gradients the Node received, after the tensor hooks of its outputs
    # and its pre-hooks ran (the engine's captures for ``inputs=GradientEdge`` come before them)
    captured: dict[int, tuple[torch.Tensor | None, ...]] = {}

    input_grads_by_id: dict[int, torch.Tensor | None] = {}
    grads_computed_in_b: tuple[torch.Tensor | None, ...] = ()
    handles = []
    # the gradients custom Function backwards receive in B, after the engine materialized them
    materialized: dict[int, tuple[torch.Tensor | None, ...]] = {}
    run_once_positions, hook_candidates = opaque_positions_of(plan, nodes)
    run_once = _run_once_nodes(plan, nodes, run_once_positions)
    # read once here: the regions need them before the engine call, the formulas after it
    hooked = [index for index in hook_candidates if _autograd.uses_saved_tensor_hooks(nodes[index])]
    checkpoints = _checkpointed_regions(nodes, hooked, recompute)
    lap("b.opaque")
    try:
        for index, _ in plan.intermediates:
            capture = partial(_capture_received, captured, index)
            handles.append(_register_posthook(nodes[index], capture))
            others = _autograd.post_hooks_beside(handles[-1], capture)
            if others and index not in run_once_positions:
                raise _post_hook_error(nodes[index], others)
        lap("b.hooks")
        if stage_inputs and closure_outputs:
            if plan.has_custom_functions is None:  # once per structure: the plan's key holds the Node classes
                plan.has_custom_functions = _autograd.any_custom_function(nodes)
            with (
                # the common case (no custom Function, checkpoint or compiled region) enters only the last
                custom_functions_in_input_phase(walk, input_nodes, plan, materialized)
                if plan.has_custom_functions
                else _NO_CONTEXT,
                _opaque_input_phase(run_once, checkpoints)
                if run_once is not None or checkpoints is not None
                else _NO_CONTEXT,
                refusing_multi_grad_hooks(
                    partial(_only_in_weight_phase, walk.index, plan.weight_only), _multi_grad_hook_error
                ),
            ):
                lap("b.custom_functions")
                grads = _autograd.run_engine_grad(
                    [tensor for tensor, _ in closure_outputs],
                    [grad for _, grad in closure_outputs],
                    [
                        *stage_inputs,
                        *(GradientEdge(nodes[target], nr) for target, nr in plan.computed_in_b),
                    ]
                    if plan.computed_in_b
                    else stage_inputs,
                )
                if plan.computed_in_b:
                    grads_computed_in_b = grads[len(stage_inputs) :]
                    grads = grads[: len(stage_inputs)]
                lap("b.engine")
            lap("b.custom_functions")
            input_grads_by_id = {id(tensor): grad for tensor, grad in zip(stage_inputs, grads, strict=True)}
    except RuntimeError as error:
        freed = _freed_error(error)
        if freed is error:
            raise
        raise freed from error
    finally:
        for handle in handles:
            handle.remove()
    captured.update(materialized)
    lap("b.hooks")

    unhooked = plan.saving_positions.difference(hooked) if hooked else plan.saving_positions
    work, targets, kept_grads = _weight_work(
        plan, nodes, captured, [grad for _, grad in pairs], unhooked, weight_tensors
    )
    roots_computed_in_b = (
        _roots_computed_in_b(plan, nodes, grads_computed_in_b, parameters_computed_in_b)
        if grads_computed_in_b
        else []
    )
    lap("b.formulas")
    if run_once is not None:
        _use_kept_gradients(plan, work, run_once)
        run_once.warn_about_reentrant(stacklevel=stacklevel)
    input_grads = tuple(
        _unaliased(_in_leaf_layout(input_grads_by_id.get(id(tensor)), tensor), kept_grads)
        for _, tensor in inputs_by_name
    )
    num_intermediates = num_node_calls = 0
    calls_custom_function = False
    for item in work:  # one pass: intermediates with work, Nodes W calls, custom Functions among them
        if item is not None:
            num_intermediates += 1
            if item.node is not None:
                num_node_calls += 1
                calls_custom_function = calls_custom_function or _autograd.is_custom_function(item.node)
    state = SplitState(
        input_grads=input_grads,
        input_names=tuple(name for name, _ in inputs_by_name),
        num_intermediates=num_intermediates + _count_done_in_b(plan, grads_computed_in_b),
        num_node_calls=num_node_calls,
        _plan=plan,
        _work=work,
        _targets=targets,
        _output_roots=output_roots,
        _computed_in_b=roots_computed_in_b,
        _weight_tensors=weight_tensors,
        _keep_alive=_anchor_outputs([tensor for tensor, _ in pairs]) if calls_custom_function else (),
        _checkpoints=checkpoints,
        # W runs what B did not (a stage without inputs that require grad runs them all in W)
        _run_once=run_once if run_once is not None and not run_once.all_ran() else None,
        _reaches_only_weights=not excluded,
    )
    _mark_materialized(plan, work, materialized)
    lap("b.state")
    _watch_for_other_backwards(state, output_edges)
    lap("b.watch")
    return state


def _backward_input_without_walk(
    key: Any,
    plan: NoWalkPlan,
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    cotangents: list[torch.Tensor],
    inputs_by_name: list[tuple[str, torch.Tensor]],
    stage_inputs: list[torch.Tensor],
    output_edges: list[GradientEdge],
    params: list[torch.Tensor] | None,
    lap: Any,
) -> SplitState | None:
    """B where every parameter lies inside split compiled regions: one engine call with this microbatch's
    queue installed; the regions queue their W (:mod:`graphkit.split.weight_queue`). None where the graph
    turned out not to qualify and no region queued anything (the caller walks it instead)."""
    queue = WeightQueue()
    try:
        with input_phase(queue):
            grads = _autograd.run_engine_grad([tensor for tensor, _ in pairs], cotangents, stage_inputs)
        lap("b.engine")
    except RuntimeError as error:
        queue.release()
        freed = _freed_error(error)
        if freed is error:
            raise
        raise freed from error
    checked = check_regions(key, plan, queue, output_edges, cotangents, stage_inputs, params)
    lap("b.check_regions")
    if checked == WALK_INSTEAD:
        return None
    if checked != REGIONS_AS_PLANNED:
        queue.release()
        raise SplitError(
            "this microbatch's autograd graph differs from the structure its stage was qualified with for B "
            "without a walk: a parameter is used outside the regions compiled by graphkit.splitting_backend(), "
            "and B could not compute its gradient; run the forward again for this microbatch (B walks this "
            "structure from now on)"
        )
    queue.copy_caller_gradients(cotangents)
    kept = queue.gradient_tensors()
    lap("b.copies")
    by_id = {id(tensor): grad for tensor, grad in zip(stage_inputs, grads, strict=True)}
    state = SplitState(
        input_grads=tuple(
            _unaliased(_in_leaf_layout(by_id.get(id(tensor)), tensor), kept) for _, tensor in inputs_by_name
        ),
        input_names=tuple(name for name, _ in inputs_by_name),
        num_intermediates=len(queue),
        num_node_calls=0,
        _plan=None,  # type: ignore[arg-type]  # W runs the queue, never a plan
        _work=[],
        _targets={},
        _output_roots=[],
        _computed_in_b=[],
        _weight_tensors=queue.weight_tensors(),
        _weight_queue=queue,
    )
    lap("b.state")
    _watch_for_other_backwards(state, output_edges)
    lap("b.watch")
    return state


def _walk_to_inputs(
    output_edges: list[GradientEdge], stage_inputs: list[torch.Tensor]
) -> tuple[NodeWalk, set[Node], dict[int, torch.Tensor]]:
    """The walk from the outputs' Nodes, stopping at the stage inputs, the inputs' Nodes, and the
    variables of the AccumulateGrad Nodes it read on the way, by node index (the plan's weight leaves
    are among them; empty where it read none).

    A leaf input's Node (its AccumulateGrad) is found among the walked Nodes by its ``variable``
    instead of through ``get_gradient_edge``, which makes and drops a view of the input each time (about
    as long as the walk itself on a small stage). A leaf input the outputs do not reach has no Node in
    the walk, so none here: it stands as position -1 in the plan's key, as its own Node would.

    The walk is :func:`graphkit.graph.walk.walk_nodes`'s, which reads the variables where it meets an
    AccumulateGrad Node anyway, instead of in a second pass.
    """
    leaf_inputs = {id(tensor) for tensor in stage_inputs if tensor.grad_fn is None}
    if not leaf_inputs or ACCUMULATE_GRAD_CLASS is type(None):
        input_nodes = {_autograd.gradient_edge(tensor).node for tensor in stage_inputs}
        return walk_nodes((edge.node for edge in output_edges), input_nodes), input_nodes, {}
    stop = {_autograd.gradient_edge(tensor).node for tensor in stage_inputs if tensor.grad_fn is not None}
    variables: dict[int, torch.Tensor] = {}
    walk = walk_nodes((edge.node for edge in output_edges), stop, variables)
    nodes = walk.nodes
    input_nodes = stop | {
        nodes[position] for position, tensor in variables.items() if id(tensor) in leaf_inputs
    }
    return walk, input_nodes, variables


def _variables(
    nodes: list[Node], leaves: Iterable[int], known: dict[int, torch.Tensor]
) -> list[torch.Tensor]:
    """The variables of the AccumulateGrad Nodes at ``leaves``, those in ``known`` not read again."""
    return [known[leaf] if leaf in known else nodes[leaf].variable for leaf in leaves]


_NO_CONTEXT = nullcontext()
"""A context manager that does nothing (reentrant: B enters it for the phases a graph does not need)."""


def _only_in_weight_phase(index: dict[Node, int], weight_only: bytearray, node: Node) -> bool:
    """Whether only W runs ``node`` (the weight-only subgraph, parameters' AccumulateGrad Nodes included)."""
    position = index.get(node)
    return position is not None and bool(weight_only[position])


def _roots_computed_in_b(
    plan: BackwardPlan,
    nodes: list[Node],
    grads_computed_in_b: tuple[torch.Tensor | None, ...],
    parameters: list[torch.Tensor],
) -> list[tuple[GradientEdge, torch.Tensor]]:
    """W's roots for the gradients B computed (one per parameter; none where no gradient flowed). The
    normalization kernels return new tensors, so none of them shares storage with a cotangent.

    B computes them only where none of ``parameters`` (those of ``plan.computed_in_b``) has a tensor
    hook: the engine's capture of a Node it does not run comes after that Node's tensor pre-hooks, so a
    hook on such a parameter (``register_hook``, ``register_multi_grad_hook``) would run in B and again
    in W. A stage with parameter-only outputs keeps them in W too (their root would meet the captured
    sum on one Node). Hooks on the AccumulateGrad Node itself (DDP's, FSDP's) and post-accumulate-grad
    hooks run in W either way; tensor hooks added from C++ do not show
    (:func:`graphkit.graph._autograd.has_tensor_hooks`).

    Raises:
        SplitError: one of ``parameters`` got a tensor hook during B (from another hook): the engine's
            capture may have run it in B already, and W would run it again.
    """
    if any(map(_autograd.has_tensor_hooks, parameters)):
        raise SplitError(
            "a tensor hook was registered on a normalization parameter while B ran (from another hook); "
            "B computes these parameters' gradients itself and may have run the hook already, so W would "
            "run it twice: register parameter hooks before backward_input or after it returned"
        )
    return [
        (GradientEdge(nodes[target], output_nr), grad)
        for (target, output_nr), grad in zip(plan.computed_in_b, grads_computed_in_b, strict=True)
        if grad is not None
    ]


def _count_done_in_b(plan: BackwardPlan, grads_computed_in_b: tuple[torch.Tensor | None, ...]) -> int:
    """The intermediates B finished (all their weight-side gradients computed in B) that received one."""
    if not grads_computed_in_b:
        return 0
    return sum(
        1 for feeds in plan.done_in_b if any(grads_computed_in_b[position] is not None for position in feeds)
    )


def _multi_grad_hook_error() -> SplitError:
    return SplitError(MULTI_GRAD_HOOK_REASON)


def _capture_received(
    captured: dict[int, tuple[torch.Tensor | None, ...]], index: int, _grad_inputs: Any, grad_outputs: Any
) -> None:
    """Post-hook of intermediate ``index`` in B: note the gradients it received (one per forward output)."""
    captured[index] = grad_outputs


def _post_hook_error(node: Node, hooks: tuple[Any, ...]) -> SplitError:
    """Why an intermediate may not carry a post-hook (``Node.register_hook``, a module full backward hook).

    A post-hook sees, and may replace, every gradient its Node computes. B computes only an
    intermediate's input-side gradients and W its weight-side ones (by a formula or a direct call, which
    runs no hooks), so the hook could neither see nor change the weight-side ones as in a full backward.
    (A run-once Node - reentrant checkpoint, compiled region - runs whole in B, its hooks included: allowed.)
    """
    node_name = type(node).__name__
    if any(getattr(hook, "__qualname__", "").startswith("BackwardHook.") for hook in hooks):
        return SplitError(
            "a module full backward hook (nn.Module.register_full_backward_hook or "
            "register_full_backward_pre_hook) is on a module one of whose inputs or outputs is computed "
            f"from parameters alone, so its hook Node ({node_name}) feeds both the stage inputs and "
            "parameters: B would pass the hook only the input-path gradients and W would never call it, "
            "so it could not see or change the others. Register the hook on a module whose inputs and "
            "outputs all depend on the stage inputs, use tensor.register_hook on the tensors instead, or "
            "run a full backward (graphkit.backward_full) for this stage"
        )
    return SplitError(
        f"{node_name} has a post-hook registered with Node.register_hook ({_hook_name(hooks[0])}), and "
        "its gradients feed both the stage inputs and parameters: B computes only its input-side "
        "gradients and W its weight-side ones, so the hook could not see or change them as in a full "
        "backward. Use tensor.register_hook on the tensors the Node takes or returns instead (the split "
        "honours tensor hooks), or run a full backward (graphkit.backward_full) for this stage"
    )


def _hook_name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__


def _anchor_outputs(outputs: list[Any]) -> tuple[Any, ...]:
    """What keeps the outputs' graph alive: an anchor tensor above the tensor outputs, and the
    ``GradientEdge`` outputs themselves (an edge holds its Node)."""
    anchor = graph_anchor([output for output in outputs if isinstance(output, torch.Tensor)])
    edges = tuple(output for output in outputs if isinstance(output, GradientEdge))
    return edges if anchor is None else (anchor, *edges)


def _root_edge(output: torch.Tensor | GradientEdge) -> GradientEdge:
    """The autograd edge a stage output roots the backward at: a ``GradientEdge`` output is its own."""
    return output if isinstance(output, GradientEdge) else get_gradient_edge(output)


def _run_once_nodes(plan: BackwardPlan, nodes: list[Node], positions: tuple[int, ...]) -> RunOnceNodes | None:
    """The reentrant checkpoints and compiled regions of the walked graph, or None when it has none."""
    if not positions:
        return None
    found = [(index, nodes[index], run_once_kind(nodes[index])) for index in positions]
    weight_input_nrs = {
        index: input_nrs
        for (index, _), input_nrs in zip(plan.intermediates, plan.weight_input_nrs, strict=True)
    }
    return RunOnceNodes(found, weight_input_nrs)


def _checkpointed_regions(
    nodes: list[Node], hooked: list[int], recompute: Recompute
) -> CheckpointedRegions | None:
    """The non-reentrant checkpointed regions behind the Nodes W will unpack, or None.

    ``hooked``: those of the candidates (:func:`opaque_positions_of`: the intermediates W may call and
    the weight-only Nodes W's engine call runs, of classes that save tensors; a run-once Node is never
    called in W) whose saved tensors were packed by saved-tensor hooks.
    """
    return regions_of([nodes[index] for index in hooked], recompute) if hooked else None


@contextmanager
def _opaque_input_phase(
    run_once: RunOnceNodes | None, checkpoints: CheckpointedRegions | None
) -> Iterator[None]:
    """What B's engine call runs under for run-once Nodes and checkpointed regions (if any)."""
    with ExitStack() as stack:
        if checkpoints is not None:
            stack.enter_context(checkpoints.input_phase())
        if run_once is not None:
            stack.enter_context(run_once.engine_call())
        yield


@contextmanager
def _opaque_weight_phase(state: SplitState) -> Iterator[None]:
    """What the W phase runs under: one recomputation group, and the run-once Nodes B did not run."""
    with ExitStack() as stack:
        if state._checkpoints is not None:
            stack.enter_context(state._checkpoints.weight_phase())
        if state._run_once is not None:
            stack.enter_context(state._run_once.engine_call())
        yield


def _use_kept_gradients(plan: BackwardPlan, work: list[_WeightWork | None], run_once: RunOnceNodes) -> None:
    """W feeds in what a run-once intermediate returned in B instead of calling it again."""
    for position, (index, _) in enumerate(plan.intermediates):
        item = work[position]
        if item is None or index not in run_once.kept:
            continue
        work[position] = _WeightWork(
            (), item.edges, kept_gradient(run_once.kept[index]), None, (), item.sequence_nr
        )


def _weight_work(
    plan: BackwardPlan,
    nodes: list[Node],
    captured: dict[int, tuple[torch.Tensor | None, ...]],
    cotangents: list[torch.Tensor],
    unhooked: Container[int],
    weight_tensors: Sequence[torch.Tensor],
) -> tuple[list[_WeightWork | None], dict[int, Node], list[torch.Tensor]]:
    """What W will do for each intermediate of ``plan``, from the gradients B ``captured``.

    Returns the work per intermediate (None where no gradient arrived), the targets it feeds by node
    index, and every captured gradient kept. Gradients that share storage with a caller's cotangent are
    copied (the caller may reuse that buffer before W); formulas read their saved tensors now.
    ``unhooked``: node indices already found free of hooked saved tensors (not checked again).
    ``weight_tensors``: the variables of ``plan.weight_leaves`` (B has read them already).
    """
    work: list[_WeightWork | None] = []
    kept_grads: list[torch.Tensor] = []
    cotangent_ranges = [_storage_range(grad) for grad in cotangents]
    # sparse parameters: their gradient layout is their Node's to choose, so that Node is called instead
    sparse_leaves = {
        leaf
        for leaf, tensor in zip(plan.weight_leaves, weight_tensors, strict=True)
        if leaf in plan.leaf_targets and tensor.layout != torch.strided
    }
    mixed_leaves = plan.mixed_leaves
    targets: dict[int, Node] = {}
    for (index, edges), weight_input_nrs in zip(plan.intermediates, plan.weight_input_nrs, strict=True):
        grads_received = captured.get(index)
        if grads_received is None:
            work.append(None)  # no gradient reached this intermediate: nothing flows to its weights either
            continue
        kept = list(filter(_not_none, grads_received))
        if not kept and not _autograd.is_custom_function(nodes[index]):
            # a C++ Node passes nothing on then; a full backward still runs a custom Function's
            # backward (on zeros), which may give its parameters a gradient: W calls it too
            if plan.zero_materializing and any(target in plan.zero_materializing for _, target, _ in edges):
                # and the engine still runs the weight-only Nodes it feeds, with missing gradients,
                # which a custom Function further on materializes as zeros: W passes them on missing
                work.append(_WeightWork(grads_received, edges, _missing_gradients(len(edges)), None))
                for _, target, _ in edges:
                    targets[target] = nodes[target]
                continue
            work.append(None)
            continue
        for grad in kept:
            if _inside(grad, cotangent_ranges):
                # the caller owns its cotangents and may reuse their buffers before W: keep a copy
                grads_received = tuple(
                    received.clone()
                    if received is not None and _inside(received, cotangent_ranges)
                    else received
                    for received in grads_received
                )
                kept = list(filter(_not_none, grads_received))
                break
        kept_grads += kept
        node = nodes[index]
        # a rule reads the saved tensors now, so the state need not keep the Node (and the graph above it)
        rule = (
            None
            if sparse_leaves and any(target in sparse_leaves for _, target, _ in edges)
            else prepare(node, weight_input_nrs, unhooked=index in unhooked)
        )
        versions = tuple(map(tensor_version, kept))
        sequence_nr = (
            _autograd.sequence_number(node)
            if mixed_leaves and any(target in mixed_leaves for _, target, _ in edges)
            else -1
        )
        work.append(
            _WeightWork(
                grads_received, edges, rule, None if rule is not None else node, versions, sequence_nr
            )
        )
        for _, target, _ in edges:
            targets[target] = nodes[target]
    return work, targets, kept_grads


def _missing_gradients(count: int) -> PreparedWeightGradient:
    """A weight-side formula that gives ``count`` missing gradients (a C++ Node that received none)."""
    return PreparedWeightGradient(lambda _grads, _tensors: [None] * count, ())


def _call_node(node: Node, grads: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor | None, ...]:
    """Call a C++ Node's backward directly; one result per ``next_functions`` entry.

    Called inside the graph task of :func:`_call_nodes` (whose ``inputs=`` are the weight-side edges), a
    C++ Node computes only its weight-side outputs. Custom Functions go through
    :func:`call_custom_function`.
    """
    result = node(*grads)
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


def backward_weight(state: SplitState, *, retain_graph: bool = False, flush_bytes: int | None = None) -> None:
    """W phase: accumulate the parameter gradients of one microbatch into ``.grad``.

    Args:
        state: what :func:`backward_input` returned for this microbatch.
        retain_graph: keep the saved tensors of the weight-only part of the graph that W runs through
            (as ``retain_graph`` of ``torch.autograd.backward``), so another backward through that part
            may follow. The state is single use either way.

    Effects: every parameter receives exactly the gradient a full backward would give it, added to its
    ``.grad`` by AccumulateGrad (post-accumulate-grad hooks fire once each). The state is released.
    Under ``torch.inference_mode()`` W runs with ``inference_mode(False)`` inside, as B does.

        flush_bytes: None (the default): W computes every weight-side gradient, then hands them all to
            the engine in one call. A number of bytes: W hands them over in several calls, each as soon
            as that many are waiting at a point where no parameter's sum would be split (the plan's
            flush points: a parameter used by several intermediates gets all its gradients in one call,
            and a stage with parameter-only outputs or a parameter fed both directly and through other
            Nodes keeps one call), so that W holds about that much at once instead of about one copy of
            the parameters' gradients; the gradients stay bit for bit those of a full backward. Each call
            is a graph task of its own, so what PyTorch runs once per graph task runs once per call:
            ``register_multi_grad_hook`` hooks and callbacks queued with
            ``Variable._execution_engine.queue_callback`` (how DistributedDataParallel and FSDP finish a
            backward). Leave it None with those. On the CPU it also spares page faults when the
            gradients are large (:data:`SUGGESTED_FLUSH_BYTES`).

    Memory: W frees each captured gradient and saved tensor as soon as its gradient is computed; the
    weight-side gradients it computed wait for their engine call (see ``flush_bytes``).

    Raises:
        ValueError: ``flush_bytes`` is neither None nor an int >= 0.
        SplitError: ``state`` is not a SplitState, or was already used (the message says if that W
            failed part-way: ``.grad`` may then hold part of the microbatch's gradients); or a parameter
            stopped requiring grad since B (the state stays usable once it requires grad again).
        GraphFreedError: the graph was freed between B and W, or another backward ran from the
            outputs (an ordinary backward, or :func:`backward_input` a second time for the same
            outputs), which counted the weight gradients already.
        RuntimeError: a saved tensor W reads was modified in place since B (as the autograd engine's
            version-counter check).
        Any error a hook raises during W, after which the state counts as used.
    """
    lap = started_laps()
    if flush_bytes is not None and not (isinstance(flush_bytes, int) and flush_bytes >= 0):
        raise ValueError(f"flush_bytes must be None or a number of bytes >= 0, got {flush_bytes!r}")
    if not isinstance(state, SplitState):
        raise SplitError(
            f"backward_weight needs the SplitState returned by backward_input, got {type(state).__name__}; "
            "run backward_input for this microbatch first"
        )
    if state.used:
        if state._failure is not None:
            raise SplitError(
                f"this SplitState's W phase already ran and failed ({state._failure}); .grad may hold part "
                "of this microbatch's gradients: restore or zero .grad and run the microbatch again from "
                "its forward"
            )
        raise SplitError(
            "this SplitState was already used by backward_weight; each B phase allows one W phase"
        )
    if state._other_backward[0]:
        raise GraphFreedError(
            "another backward ran from this microbatch's outputs between its B and its W phase (an "
            "ordinary .backward() or torch.autograd.grad, or backward_input a second time for the same "
            "outputs): it counted these weight gradients already, or freed the graph, and W would count "
            "them twice; run the forward again for this microbatch and one B and one W on it"
        )
    if not all([tensor.requires_grad for tensor in state._weight_tensors]):
        tensor = next(tensor for tensor in state._weight_tensors if not tensor.requires_grad)
        raise SplitError(
            f"a parameter of shape {tuple(tensor.shape)} stopped requiring grad between the B and the W "
            "phase; set requires_grad back before W, or leave it out with backward_input(..., params=...)"
        )
    _remove_handles(state._watch_handles)  # W's own engine call runs through the watched output roots
    lap("w.checks")
    try:
        if state._weight_queue is not None:
            with _outside_inference_mode():
                state._weight_queue.run(_direct_call_observers.get())
            lap("w.queue")
        elif (
            torch.is_inference_mode_enabled() or state._checkpoints is not None or state._run_once is not None
        ):
            with _outside_inference_mode(), _opaque_weight_phase(state):
                _run_weight_phase(state, retain_graph, lap, flush_bytes)
        else:  # the usual case, without entering contexts
            _run_weight_phase(state, retain_graph, lap, flush_bytes)
    except BaseException as error:
        state._failure = f"{type(error).__name__}: {error}"[:200]
        raise
    finally:
        state._release()
        lap("w.release")


def _run_weight_phase(
    state: SplitState, retain_graph: bool = False, lap: Any = NO_LAPS, flush_bytes: int | None = None
) -> None:
    if not state._weight_tensors or (
        not state._targets and not state._output_roots and not state._computed_in_b
    ):
        return
    work = state._work
    targets = state._targets
    # intermediates without a formula (B kept their Node): called first, inside a graph task of their own
    node_calls = [position for position, item in enumerate(work) if item is not None and item.rule is None]
    called = _call_nodes(state, node_calls) if node_calls else {}
    lap("w.node_calls")
    # Every weight-side gradient becomes the root gradient of its target, in the order a full backward
    # produces them: the engine sums several roots on one edge and reduces each to the edge's shape and
    # dtype (validate_outputs), and tensor hooks on a target (a parameter's hook, a hook on ``W.t()``)
    # see the summed gradient, as in a full backward.
    # Parameter-only outputs' roots come first: a full backward's GraphRoot hands their cotangents to
    # their Nodes before any intermediate runs, so a parameter that is also fed by intermediates sums
    # its output's cotangent first (bit for bit in bfloat16). The gradients B computed go with the first
    # call (each is its parameter's whole gradient; a stage with parameter-only outputs has none).
    roots: list[GradientEdge] = [edge for edge, _ in state._output_roots]
    root_grads: list[torch.Tensor] = [grad for _, grad in state._output_roots]
    roots += [edge for edge, _ in state._computed_in_b]
    root_grads += [grad for _, grad in state._computed_in_b]
    state._computed_in_b = []  # the state's references would keep AccumulateGrad from taking them over
    # A parameter also fed through the weight-only subgraph (a bias also used through view or .to())
    # gets each direct contribution through a host Node of its own (_OrderedGradient) that carries the
    # intermediate's sequence number: as roots they would all reach it before anything the weight-only
    # Nodes produce, while the engine's ready queue runs the host Nodes among the weight-only Nodes in
    # the order of a full backward, so the sum keeps that order (bit for bit in bfloat16).
    mixed = _mixed_parameters(state)
    ordered: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    add_root = roots.append
    add_root_grad = root_grads.append
    # With flush_bytes, the gradients go to the engine in several calls, each as soon as that many are
    # waiting at a position where no weight-only Node is fed from both sides (the plan's flush points).
    # Parameter-only outputs and mixed parameters join the last call, so their parts are never split:
    # one call then.
    # weight-only Nodes that only missing gradients reach, which a full backward runs all the same
    zero_materializing = state._plan.zero_materializing
    missing: dict[int, int] = {}  # target index: output_nr of one missing gradient
    fed: set[int] = set()  # targets a real gradient reaches
    flush_points = (
        state._plan.flush_points
        if flush_bytes is not None and not (mixed or state._output_roots or zero_materializing)
        else ()
    )
    pending_bytes = sum(grad.numel() * grad.element_size() for grad in root_grads) if flush_points else 0
    with torch.no_grad():  # as inside the engine: the gradients handed to hooks require no grad
        for position, item in enumerate(work):
            if item is None:
                continue
            grads = called.pop(position, None) if called else None
            if grads is None:
                item.check_unchanged()
                lap("w.roots")
                grads = item.rule(item.grads)
                lap("w.formulas")
            for (_, target, output_nr), grad in zip(item.edges, grads, strict=True):
                if grad is None:
                    if zero_materializing and target in zero_materializing:
                        missing.setdefault(target, output_nr)
                    continue
                if zero_materializing:
                    fed.add(target)
                if mixed and target in mixed:
                    ordered.append((item.sequence_nr, mixed[target], grad))
                    continue
                add_root(GradientEdge(targets[target], output_nr))
                add_root_grad(grad)
                if flush_points:
                    pending_bytes += grad.numel() * grad.element_size()  # also for a sparse gradient
            work[position] = None  # free the captured gradient and saved tensors as soon as they are used
            if flush_points and pending_bytes >= flush_bytes and position in flush_points:  # type: ignore[operator]
                item = grads = grad = None  # type: ignore[assignment]  # AccumulateGrad may take them over
                lap("w.roots")
                _run_weight_engine(roots, root_grads, state, retain_graph)
                roots.clear()
                root_grads.clear()
                pending_bytes = 0
                lap("w.engine")
    for sequence_nr, variable, grad in ordered:
        with torch.enable_grad():
            host = _OrderedGradient.apply(grad, variable)
        _autograd.set_sequence_number(host.grad_fn, sequence_nr)
        roots.append(get_gradient_edge(host))
        root_grads.append(host.detach())
    item = grads = grad = None  # type: ignore[assignment]  # AccumulateGrad may take them over
    unfed = [(target, output_nr) for target, output_nr in missing.items() if target not in fed]
    if not roots and not unfed:
        return
    lap("w.roots")
    if unfed:
        with _missing_gradient_roots(unfed, targets, roots, root_grads):
            _run_weight_engine(roots, root_grads, state, retain_graph)
    else:
        _run_weight_engine(roots, root_grads, state, retain_graph)
    lap("w.engine")


@contextmanager
def _missing_gradient_roots(
    unfed: list[tuple[int, int]],
    targets: dict[int, Node],
    roots: list[GradientEdge],
    root_grads: list[torch.Tensor],
) -> Iterator[None]:
    """Within: the weight-only Nodes ``unfed`` (target index, output_nr) are roots of W's engine call
    that receive only missing gradients, as in a full backward.

    A full backward runs a Node whose every incoming gradient is missing (the Function above it returned
    None): a C++ Node passes missing gradients on, and a custom Function's Node materializes them as
    zeros (``PyNode::apply``, unless ``ctx.set_materialize_grads(False)``), which gives its parameters
    zero gradients. The engine takes no missing root gradient, so each such Node is rooted with zeros of
    its input's shape, which a pre-hook (removed on exit, also on errors) turns back into missing
    gradients before the Node runs; a Node that another root reaches already needs neither. (Tensor hooks on the Node's outputs run before Node pre-hooks: they
    see the zeros where a full backward passes them None.)
    """
    handles = []
    reached = walk_nodes([edge.node for edge in roots], set()).index if roots else {}
    try:
        for target, output_nr in unfed:
            node = targets[target]
            if node in reached:  # the engine runs it anyway, and a real gradient reaches it there
                continue
            metadata = _autograd.gradient_metadata(node)
            if metadata is None:  # shapes unknown on this PyTorch: left out, as before
                continue
            meta = metadata[output_nr]
            roots.append(GradientEdge(node, output_nr))
            root_grads.append(torch.zeros(meta.shape, dtype=meta.dtype, device=meta.device))
            handles.append(_register_prehook(node, _all_missing))
        yield
    finally:
        _remove_handles(handles)


def _all_missing(grads: tuple[torch.Tensor | None, ...]) -> tuple[None, ...]:
    """Node pre-hook: every gradient the Node receives is missing."""
    return (None,) * len(grads)


def _run_weight_engine(
    roots: list[GradientEdge], root_grads: list[torch.Tensor], state: SplitState, retain_graph: bool
) -> None:
    """One engine call of the W phase: accumulate ``root_grads`` from ``roots`` into the parameters.

    With a single root the engine starts from that root's Node itself instead of a GraphRoot above it,
    and then tells ``torch._C._will_engine_execute_node`` that the root's Node will not run: a
    ``register_multi_grad_hook`` over a tensor produced there (``weight.t()`` of a bias-free Linear, the
    stage's one weight-side intermediate) would expect no gradient and never fire, where a full backward
    fires it. A second root, a zero gradient towards a throwaway leaf that is no input of the call (so the
    engine runs nothing for it), keeps the GraphRoot.
    """
    inputs = state._weight_tensors
    if state._plan.leaf_targets and not (state._plan.mixed_leaves or state._output_roots):
        _hand_over_to_accumulate_grad(roots, root_grads)
    if len(roots) == 1:
        spare = torch.zeros((), requires_grad=True)
        roots = [*roots, _autograd.gradient_edge(spare)]
        root_grads = [*root_grads, torch.zeros(())]
    elif state._reaches_only_weights and state._checkpoints is None and state._run_once is None:
        # Every Node the roots reach is weight-only and every leaf it reaches is a weight: the engine
        # runs the same Nodes and accumulates into the same leaves without inputs=, and skips building
        # its per-Node execution flags (init_to_execute in torch/csrc/autograd/engine.cpp), a traversal
        # of the weight-only graph (measured in docs/concepts.md, "What the split costs").
        inputs = ()
    try:
        _autograd.run_engine_backward(roots, root_grads, inputs, retain_graph)
    except RuntimeError as error:
        raise _freed_error(error) from error


HAND_OVER_BYTES = 128 << 10
"""A parameter of at least this many bytes gets its gradient through a host Node
(:func:`_hand_over_to_accumulate_grad`), so that AccumulateGrad may take it over as ``.grad`` instead of
copying it. Below it the copy costs less than the Python around the host (measured on the CPU, one
thread, interleaved in one process: handing over the 64-wide biases of a 48-layer MLP made W about 20%
slower; handing over the Conv1D weights of GPT-2 stages of width 256 and 512 made B + W 1.6-2.1% faster)."""


_nbytes = attrgetter("nbytes")
_node_of = attrgetter("node")


def _hand_over_to_accumulate_grad(roots: list[GradientEdge], root_grads: list[torch.Tensor]) -> None:
    """Move the gradients that go straight to a large parameter's AccumulateGrad Node (one each, parameters
    of at least :data:`HAND_OVER_BYTES`) from ``roots`` / ``root_grads`` (in place) to one host Node,
    itself added as a root.

    AccumulateGrad takes a gradient over as an empty ``.grad`` when nothing else refers to it, and copies
    it otherwise (``accumulateGrad`` in ``torch/csrc/autograd/functions/accumulate_grad.h``: not in grad
    mode, dense, the layout of the parameter, ``use_count`` no more than its own references). A root
    gradient is always referred to by the engine's root Node and by the caller's tensor, so it is copied;
    in a full backward the same gradient comes out of a Node's backward, referred to by nothing else, and
    is taken over. The host's backward (:class:`_HandOver`) returns the gradients and drops its own
    references, so AccumulateGrad sees them as in a full backward: taken over unless something else (a
    gradient the caller still holds) refers to them, copied then. A gradient of a broadcast shape (a
    Linear's bias: the rows of ``addmm``'s gradient) is first summed to the parameter's shape by
    ``sum_to_size``, the engine's own reduction (``validate_outputs``), so the values are bit for bit the
    same. Only gradients of the parameter's dtype and device are moved (the engine would cast the
    others), and only where the parameter receives no other root (several are summed in the engine's
    order). The caller must hold no other reference to the moved gradients.
    """
    try:
        sizes = list(map(_nbytes, root_grads))  # one pass in C: on small stages no gradient is large
    except RuntimeError:  # a sparse gradient has no nbytes (and stays with the engine)
        sizes = [grad.nbytes if grad.layout == torch.strided else 0 for grad in root_grads]
    if not sizes or max(sizes) < HAND_OVER_BYTES:
        return
    candidates = [
        position
        for position, size in enumerate(sizes)
        if size >= HAND_OVER_BYTES
        and root_grads[position].layout == torch.strided
        and _autograd.is_accumulate_grad(roots[position].node)
    ]
    candidates = [  # a broadcast gradient of a small parameter (a bias): the copy is cheaper
        position for position in candidates if roots[position].node.variable.nbytes >= HAND_OVER_BYTES
    ]
    if not candidates:
        return
    uses = Counter(map(_node_of, roots))
    moved: list[int] = []
    variables: list[torch.Tensor] = []
    for position in candidates:
        node = roots[position].node
        if uses[node] != 1:
            continue
        variable = node.variable
        grad = root_grads[position]
        if grad.dtype != variable.dtype or grad.device != variable.device:
            continue
        if grad.shape != variable.shape:
            try:  # the engine's own reduction (validate_outputs: at::sum_to), done here
                with torch.no_grad():
                    root_grads[position] = grad.sum_to_size(variable.shape)
            except RuntimeError:  # not reducible: the engine raises its own error
                continue
        moved.append(position)
        variables.append(variable)
    if not moved:
        return
    holder = [root_grads[position] for position in moved]
    taken = set(moved)
    roots[:] = [edge for position, edge in enumerate(roots) if position not in taken]
    root_grads[:] = [grad for position, grad in enumerate(root_grads) if position not in taken]
    del grad
    with torch.enable_grad():
        host = _HandOver.apply(holder, *variables)
    del holder
    roots.append(get_gradient_edge(host))
    root_grads.append(torch.zeros((), device=host.device))


class _HandOver(torch.autograd.Function):
    """A host Node whose ``next_functions`` are parameters' AccumulateGrad Nodes: ``apply(gradients,
    *parameters)`` returns a scalar to root the engine at; the backward passes ``gradients`` (a list, which
    it empties) on, one per parameter, keeping no reference to them."""

    @staticmethod
    def forward(ctx: Any, gradients: list[torch.Tensor], *parameters: torch.Tensor) -> torch.Tensor:
        ctx.gradients = gradients
        return torch.zeros((), device=parameters[0].device)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, _grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gradients, ctx.gradients = ctx.gradients, None
        passed = (None, *gradients)
        gradients.clear()
        return passed


SUGGESTED_FLUSH_BYTES = 8 << 20
"""A ``flush_bytes`` for :func:`backward_weight` on the CPU with large weights and no per-graph-task hooks.

Each engine call costs tens of microseconds; holding every weight gradient of a stage at once costs
memory, and on the CPU page faults: glibc returns freed memory above its trim threshold to the system, so
the next microbatch's W faults it in again. The C library's heuristics decide which wins (figures in
docs/concepts.md, "What the split costs")."""


def _mixed_parameters(state: SplitState) -> dict[int, torch.Tensor]:
    """The parameters, by target index, fed both by intermediates and by the weight-only subgraph:
    the plan's mixed leaves, less those that are themselves the edge of a parameter-only output (a root
    of the engine call, which reaches them first in a full backward too)."""
    leaves = state._plan.mixed_leaves
    if not leaves:
        return {}
    variables = dict(zip(state._plan.weight_leaves, state._weight_tensors, strict=True))
    excluded = {id(edge.node) for edge, _ in state._output_roots}
    return {
        index: variables[index]
        for index in leaves
        if index in state._targets and id(state._targets[index]) not in excluded
    }


class _OrderedGradient(torch.autograd.Function):
    """A host Node whose one ``next_functions`` entry is a parameter's AccumulateGrad Node.

    ``apply(gradient, parameter)`` returns a scalar to root the engine at; the backward passes
    ``gradient`` on to the parameter. Given the sequence number of the intermediate that produced the
    gradient, the engine runs it when a full backward would run that intermediate. The caller keeps its
    own reference to ``gradient`` until the engine call ends, so AccumulateGrad copies it into ``.grad``
    like any root gradient, never taking over a tensor another gradient may share.
    """

    @staticmethod
    def forward(ctx: Any, gradient: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
        ctx.gradient = gradient
        return torch.zeros((), device=parameter.device)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, _grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        gradient, ctx.gradient = ctx.gradient, None
        return None, gradient


DirectCallObserver = Callable[[Node], AbstractContextManager[Any]]
"""Called with each Node W calls directly (outside the engine's scheduling); the returned context
manager is entered for the duration of the call."""

_direct_call_observers: ContextVar[tuple[DirectCallObserver, ...]] = ContextVar(
    "graphkit_direct_call_observers", default=()
)


@contextmanager
def observing_direct_calls(observer: DirectCallObserver) -> Iterator[None]:
    """Have ``observer`` watch every Node the W phase calls directly, in this thread (or task) only.

    The W phase calls intermediates' Nodes itself (:func:`_call_nodes`), so no Node hook fires for a
    custom Function's backward; a FLOP counter per Node (:func:`graphkit.measure.flops.flops_per_node`)
    uses this instead. Observers are held in a :class:`contextvars.ContextVar`, so concurrent threads and
    nested observers never see each other's, and nothing global is patched. They are read when W starts
    (on the caller's thread) and used from there, also where the engine runs the calls on a device thread.
    """
    token = _direct_call_observers.set((*_direct_call_observers.get(), observer))
    try:
        yield
    finally:
        _direct_call_observers.reset(token)


def _call_nodes(state: SplitState, positions: list[int]) -> dict[int, list[torch.Tensor | None]]:
    """Call the Nodes of the intermediates at ``positions``; their weight-side gradients, by position.

    A C++ Node computes the outputs its *current graph task* needs
    (``Node::task_should_compute_output``): called outside any task it would compute its input-side
    outputs too. So the calls run inside a small engine call of their own, from the backward of a host
    Node (:class:`_HostNodeCalls`), whose ``inputs=`` are the weight-side edges of these
    intermediates (as ``GradientEdge`` captures, never executed: the host reaches none of them). In
    that task exactly those edges count as needed, so each Node computes only its weight-side outputs:
    never its input-side ones, and nothing on the input path runs again.
    """
    work = state._work
    targets = state._targets
    results: dict[int, list[torch.Tensor | None]] = {}
    observers = _direct_call_observers.get()  # here, on the caller's thread: call_all may run on another

    def call_all() -> None:
        for position in positions:
            item = work[position]
            item.check_unchanged()
            with ExitStack() as observed:
                for observer in observers:
                    observed.enter_context(observer(item.node))
                if _autograd.is_custom_function(item.node):
                    weight_input_nrs = [input_nr for input_nr, _, _ in item.edges]
                    outputs = call_custom_function(item.node, item.grads, weight_input_nrs, item.materialized)
                else:
                    outputs = _call_node(item.node, item.grads)
            results[position] = [outputs[input_nr] for input_nr, _, _ in item.edges]

    edges = {
        (target, output_nr): GradientEdge(targets[target], output_nr)
        for position in positions
        for _, target, output_nr in work[position].edges
    }
    device = next(
        (grad.device for position in positions for grad in work[position].grads if grad is not None), None
    )
    if device is None:  # only custom Functions that received no gradient: run where their outputs live
        metadata = _autograd.gradient_metadata(work[positions[0]].node)
        device = metadata[0].device if metadata else torch.device("cpu")
    host = torch.zeros((), device=device, requires_grad=True)
    with torch.enable_grad():
        root = _HostNodeCalls.apply(host, call_all)
    try:
        _autograd.run_engine_grad([root], [torch.zeros_like(root)], [host, *edges.values()])
    except RuntimeError as error:
        raise _freed_error(error) from error
    return results


class _HostNodeCalls(torch.autograd.Function):
    """A one-Node graph whose backward runs ``calls()``: an autograd graph task for direct Node calls.

    Forward returns a scalar zero to root the engine at; backward runs ``calls()`` (inside the engine's
    graph task, see :func:`_call_nodes`) and passes no gradient on.
    """

    @staticmethod
    def forward(ctx: Any, host: torch.Tensor, calls: Any) -> torch.Tensor:
        ctx.calls = calls
        return torch.zeros((), dtype=host.dtype, device=host.device)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, _grad: torch.Tensor) -> tuple[None, None]:
        calls, ctx.calls = ctx.calls, None
        calls()
        return None, None


def backward_full(
    outputs: Any,
    grad_outputs: Any = None,
    inputs: Any = None,
    params: Iterable[torch.Tensor] | torch.nn.Module | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """An ordinary backward (B and W at once), with the same arguments as :func:`backward_input`.

    Returns:
        The gradient of each tensor in ``flatten_tensors(inputs)`` (None where none flows). Parameters
        accumulate into ``.grad`` as usual; the stage inputs' own ``.grad`` is left as it was.

    Raises:
        graphkit.graph.tensors.GraphkitInputError: as :func:`backward_input`.
        GraphFreedError: the graph was already freed by an earlier backward.
    """
    params = parameter_list(params)
    pairs = pair_outputs(outputs, grad_outputs)
    inputs_by_name = named_inputs(inputs)
    stage_inputs = [tensor for _, tensor in inputs_by_name if tensor.requires_grad]
    received: dict[int, torch.Tensor] = {}
    handles = []

    def keep(tensor: torch.Tensor) -> Any:
        def hook(grad: torch.Tensor) -> None:
            received[id(tensor)] = grad

        return hook

    saved_grads = [tensor.grad if tensor.is_leaf else None for tensor in stage_inputs]
    restrict = None
    allowed = weight_filter(params)
    if allowed is not None:
        restrict = list(stage_inputs) + [parameter for parameter in params if parameter.requires_grad]
    try:
        for tensor in stage_inputs:
            handles.append(tensor.register_hook(keep(tensor)))
        torch.autograd.backward(
            [tensor for tensor, _ in pairs], grad_tensors=[grad for _, grad in pairs], inputs=restrict
        )
    except RuntimeError as error:
        raise _freed_error(error) from error
    finally:
        for handle in handles:
            handle.remove()
        for tensor, saved in zip(stage_inputs, saved_grads, strict=True):
            if tensor.is_leaf:
                tensor.grad = saved
    return tuple(received.get(id(tensor)) if tensor.requires_grad else None for _, tensor in inputs_by_name)
