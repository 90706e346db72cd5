"""B without a walk of the autograd graph, for stages whose parameters all lie inside split compiled regions.

A stage whose blocks are compiled with :func:`graphkit.splitting_backend` reaches the autograd graph as glue
(residual adds, activations between the blocks) around :class:`~graphkit.split.compiled_region.SplitRegionFunction`
Nodes. Where every parameter of the stage is an argument of such a region, at a position the region counts
as a weight, and nowhere else, B needs no walk, no hooks and no weight rules:

- **B** is one engine call, ``torch.autograd.grad(outputs, inputs=stage_inputs)``, run while this
  microbatch's :class:`WeightQueue` is installed on the calling thread (:func:`input_phase`). Each region the
  engine runs finds it (:func:`current_queue`), runs its compiled I graph only, and puts its pending W (the
  values the W graph reads and the parameters' gradient edges) on the queue, in the order the engine ran
  the regions;
- **W** (:meth:`WeightQueue.run`) runs the queued W graphs and hands their gradients to the parameters'
  AccumulateGrad Nodes in one engine call, from a host Node (:class:`_QueuedWeightGradients`) that returns
  them: ``.grad`` accumulates exactly as in a full backward (a fresh gradient is taken over into an empty
  ``.grad``, else added), tensor hooks on the parameters and post-accumulate-grad hooks run, and a parameter
  several regions share sums their gradients in the order a full backward does.

This is the WeightGradStore of the zero-bubble paper's Megatron fork and of DeepSeek's DualPipe
(``dualpipe/utils.py``), made safe: one queue per microbatch (held by its
:class:`~graphkit.split.backward.SplitState`), installed per thread and only for the duration of B's engine
call (never process-wide), so microbatches and threads never share one and any order of W across
microbatches is exact. A queue runs once (:class:`WeightQueueError` otherwise); a queue dropped with its W
still pending warns (:class:`PendingWeightWarning`: the weight gradients of that microbatch are lost).

**Which path.** :func:`no_walk_plan` decides per call without a cost per Node: it keys a small cache on the
stage outputs' Nodes and the split region nearest to each (found within a fixed number of Nodes below it,
:func:`nearest_region`; none found: B walks), the number of stage inputs, the ``params=`` given and the
devices. On a key it has not seen, it walks the graph once and qualifies it (:func:`qualify`): every leaf
that requires grad and is not a stage input is consumed only by regions, at their weight positions, and
each such region lies on a path to a stage input (else B would not run it and its W would never be
queued); no Node the split runs once (reentrant checkpoint, an unsplit compiled region) lies in the graph;
every output, cotangent and stage input is on the CPU (the autograd engine runs the Nodes of other devices
on threads of its own, where B's queue is not installed). After each no-walk B, :func:`check_regions`
compares the regions that queued their W with those the walk found, and how many Nodes the forward created
between each of them and the outputs (their sequence numbers); where they differ (the structure changed: a
region skipped, a Linear in the glue on some microbatches only), the graph is walked again (B keeps it,
``retain_graph=True``) and qualified anew; where it no longer qualifies, B walks it after all if no region
queued anything (the glue's own backward then ran twice, hooks included), and raises otherwise. A change
the check does not see is one before the first region that keeps every count (a parameter used ahead of
the first block on some microbatches only): a stage that does so should pass ``params=`` (a parameter that
no region covers makes the stage take the walking path) or compile that parameter's block too.

W's host Node is made once per thread and set of parameters and reused (:data:`HOSTS_PER_THREAD` per
thread); it holds the parameters' AccumulateGrad Nodes, and so the parameters, while it is kept.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, Node

from graphkit.graph import _autograd
from graphkit.graph.walk import walk_nodes
from graphkit.split import _aot_autograd
from graphkit.split.backward_plan import reach
from graphkit.split.run_once import run_once_kind

__all__ = [
    "HOSTS_PER_THREAD",
    "NO_WALK",
    "NEAREST_REGION_NODES",
    "NOT_EXACT",
    "NO_WALK_CACHE_SIZE",
    "REGIONS_AS_PLANNED",
    "WALK_INSTEAD",
    "WALK",
    "NoWalkPlan",
    "PendingWeight",
    "PendingWeightWarning",
    "WeightQueue",
    "WeightQueueError",
    "check_regions",
    "current_queue",
    "engine_skips",
    "forget_decisions",
    "input_phase",
    "nearest_region",
    "regions_made",
    "no_walk_plan",
    "qualify",
    "remember",
    "walking_always",
]

NO_WALK = "no-walk"
"""``SplitState.path`` of a microbatch whose B ran without a walk (its W runs its :class:`WeightQueue`)."""

WALK = "walk"
"""``SplitState.path`` of a microbatch whose B walked the graph (:mod:`graphkit.split.backward`)."""


class WeightQueueError(RuntimeError):
    """A queue's W asked for twice, or a region's I asked for after it queued its W."""


class PendingWeightWarning(UserWarning):
    """A microbatch's queue was dropped with its W never run: its weight gradients are lost."""


@dataclass(slots=True, eq=False)
class PendingWeight:
    """The W of one compiled region, queued by its I (:func:`graphkit.split.compiled_region` fills it).

    Attributes:
        region: the :class:`~graphkit.split.compiled_region.SplitRegion` (its ``weight_backward``).
        arguments: what its W graph takes: the values I handed on, then the saved tensors and gradients
            it reads.
        edges: per weight gradient the W graph returns, the parameter's AccumulateGrad Node (None where
            that parameter needs no gradient).
        tangents: the gradients of the region's outputs among ``arguments``, as ``(index in arguments,
            version when I ran)``: checked unchanged in W, copied in B where they are the caller's.
        node: the region's Node (its ctx), whose ``held_tensors`` list ``arguments`` until W, for graphkit's
            memory accounting; emptied when W ran or the queue was released.
    """

    region: Any
    arguments: list[torch.Tensor]
    edges: tuple[Node | None, ...]
    tangents: list[tuple[int, int]] = field(default_factory=list)
    node: Any = None
    sequence_nr: int = -1  # of the region's Node, for StructureCheck

    def drop(self) -> None:
        """Let go of everything kept for W (also on the region's Node)."""
        self.arguments = []
        if self.node is not None:
            self.node.held_tensors = []
            self.node = None


class WeightQueue:
    """The pending W of the compiled regions of one microbatch, in the order B's engine ran them.

    Single use: :meth:`run` once. Installed on a thread by :func:`input_phase` for B's engine call only.
    """

    __slots__ = ("_entries", "_ran", "__weakref__")

    def __init__(self) -> None:
        self._entries: list[PendingWeight] = []
        self._ran = False

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def pending(self) -> bool:
        """True while W has not run (and something is queued)."""
        return not self._ran and bool(self._entries)

    def put(self, entry: PendingWeight) -> None:
        """Queue a region's W (called by the region's backward inside B's engine call)."""
        if self._ran:
            raise WeightQueueError("this microbatch's W already ran: no region can queue its W any more")
        self._entries.append(entry)

    def region_keys(self) -> tuple[int, ...]:
        """The regions that queued their W, as a sorted tuple of ``id(region)`` (one entry per call)."""
        return tuple(sorted(id(entry.region) for entry in self._entries))

    def distances(self, output_edges: Sequence[GradientEdge]) -> tuple[int, ...] | None:
        """Per queued region, sorted: how many Nodes the forward created from the region's Node to the
        latest output Node (sequence numbers), or None where no output Node has one."""
        latest = _latest_sequence_nr(output_edges)
        if latest is None:
            return None
        return tuple(sorted(latest - entry.sequence_nr for entry in self._entries))

    def held_tensors(self) -> list[torch.Tensor]:
        """What the queue keeps for W: the values I handed on, saved tensors and output gradients."""
        return [tensor for entry in self._entries for tensor in entry.arguments]

    def captured_tensors(self) -> list[torch.Tensor]:
        """The output gradients the regions keep for W (among :meth:`held_tensors`)."""
        return [entry.arguments[index] for entry in self._entries for index, _ in entry.tangents]

    def gradient_tensors(self) -> list[torch.Tensor]:
        """The kept tensors that are gradients (what I handed on, and the output gradients): the only ones
        a stage input's gradient may share storage with (the others are the forward's saved tensors)."""
        tensors = []
        for entry in self._entries:
            arguments = entry.arguments
            tensors += arguments[: entry.region.partition.boundary_count]
            tensors += [arguments[index] for index, _ in entry.tangents]
        return tensors

    def weight_tensors(self) -> list[torch.Tensor]:
        """The parameters W accumulates into (one per region argument; a shared one repeats)."""
        return [node.variable for entry in self._entries for node in entry.edges if node is not None]

    def copy_caller_gradients(self, cotangents: Sequence[torch.Tensor]) -> None:
        """Copy every kept output gradient that shares storage with one of the caller's ``cotangents``:
        the caller may reuse those buffers before W."""
        addresses = {_storage_address(grad) for grad in cotangents}
        addresses.discard(None)
        if not addresses:
            return
        for entry in self._entries:
            for slot, (index, _) in enumerate(entry.tangents):
                tensor = entry.arguments[index]
                if _storage_address(tensor) in addresses:
                    copied = tensor.clone()
                    entry.arguments[index] = copied
                    if entry.node is not None:
                        entry.node.held_tensors = list(entry.arguments)
                    entry.tangents[slot] = (index, _aot_autograd.version(copied))

    def run(self, observers: Sequence[Callable[[Node], AbstractContextManager[Any]]] = ()) -> None:
        """W: run every queued W graph and accumulate the gradients into ``.grad`` (module docstring).

        ``observers``: called with each region's Node, their contexts entered while its W graph runs (as
        for the Nodes the walking path's W calls directly: FLOPs per Node).

        Raises:
            WeightQueueError: W already ran for this queue.
            RuntimeError: an output gradient a region kept was modified in place since B.
        """
        if self._ran:
            raise WeightQueueError("this microbatch's W already ran: each B allows one W")
        self._ran = True
        entries, self._entries = self._entries, []
        nodes: list[Node] = []
        for entry in entries:
            for index, version in entry.tangents:
                if _aot_autograd.version(entry.arguments[index]) != version:
                    tensor = entry.arguments[index]
                    raise RuntimeError(
                        f"a gradient of shape {tuple(tensor.shape)} a compiled region kept in B for its W "
                        "was modified in place before W (a reused buffer, or an input gradient scaled in "
                        "place); pass cotangents that stay unchanged until W, or clone them"
                    )
            nodes += [node for node in entry.edges if node is not None]
        if not nodes:
            for entry in entries:
                entry.drop()
            return
        host_node, root, root_grad = _host_for(nodes)
        host_node.work = (entries, tuple(observers))
        try:
            _autograd.run_engine_backward([root], [root_grad], (), keep_graph=True)
        finally:
            host_node.work = None

    def release(self) -> None:
        """Drop what the queue holds (W ran, or the state was released)."""
        entries, self._entries = self._entries, []
        for entry in entries:
            entry.drop()
        self._ran = True

    def __del__(self) -> None:
        # a microbatch whose state was dropped between B and W: say so once, the gradients are lost
        if self._ran or not self._entries:
            return
        warnings.warn(
            f"a microbatch's split state was dropped with the W of {len(self._entries)} compiled "
            "region(s) never run: their parameters did not receive this microbatch's gradients; call "
            "backward_weight on every state backward_input returned",
            PendingWeightWarning,
            stacklevel=2,
        )


class _QueuedWeightGradients(torch.autograd.Function):
    """A host Node whose ``next_functions`` are the queued parameters' AccumulateGrad Nodes.

    ``apply(*parameters)`` returns a scalar to root W's engine call at (kept: :func:`_host_for` reuses it
    for every microbatch of the same parameters, under ``retain_graph=True``); set the Node's ``work`` to
    ``(entries, observers)`` before the call. The backward runs each entry's W graph and returns its
    gradients, one per parameter, holding no reference of its own: the engine hands each to AccumulateGrad
    as a full backward does (taking it over into an empty ``.grad``).
    """

    @staticmethod
    def forward(ctx: Any, *parameters: torch.Tensor) -> torch.Tensor:
        ctx.work = None
        return torch.zeros((), device=parameters[0].device)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, _grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (entries, observers), ctx.work = ctx.work, None
        gradients: list[torch.Tensor | None] = []
        for entry in entries:
            region = entry.region
            arguments = entry.arguments
            node = entry.node
            entry.drop()
            with ExitStack() as observed, _aot_autograd.no_autocast(region.disable_autocast):
                for observer in observers:
                    observed.enter_context(observer(node))
                results = _aot_autograd.call_boxed(region.weight_backward, arguments)
            del arguments
            gradients += [value for value, node in zip(results, entry.edges, strict=True) if node is not None]
            del results
        return tuple(gradients)


HOSTS_PER_THREAD = 8
"""How many host Nodes (one per set of parameters: a stage's) :func:`_host_for` keeps per thread."""

_hosts = threading.local()


def _host_for(nodes: list[Node]) -> tuple[Any, GradientEdge, torch.Tensor]:
    """The host Node over these AccumulateGrad Nodes, the edge to root W's engine call at and its gradient.

    Made once per thread and set of parameters and reused (its ``apply`` with every parameter costs more
    than the rest of W's bookkeeping): a thread's own, so W on several threads never shares one. It holds
    the AccumulateGrad Nodes, so their ``id`` stays theirs while it is kept.
    """
    cache: dict[tuple[int, ...], tuple[Any, GradientEdge, torch.Tensor]] | None = getattr(
        _hosts, "cache", None
    )
    if cache is None:
        cache = _hosts.cache = {}
    key = tuple(map(id, nodes))
    found = cache.get(key)
    if found is not None:
        return found
    with torch.enable_grad():
        host = _QueuedWeightGradients.apply(*[node.variable for node in nodes])
    found = (host.grad_fn, _autograd.gradient_edge(host), torch.zeros_like(host))
    if len(cache) >= HOSTS_PER_THREAD:
        cache.pop(next(iter(cache)))
    cache[key] = found
    return found


def _storage_address(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr()
    except RuntimeError:  # a wrapper subclass without a storage of its own
        return None


_installed = threading.local()


def current_queue() -> WeightQueue | None:
    """The queue of the B running its engine call on this thread, or None (no-walk B only)."""
    return getattr(_installed, "queue", None)


class walking_always:  # noqa: N801 - used as a context manager, named as one
    """Within, on this thread, B walks the graph even where the no-walk path applies (to compare the two,
    or to rule the no-walk path out while debugging a stage)."""

    __slots__ = ("_previous",)

    def __enter__(self) -> None:
        self._previous = getattr(_installed, "walk", False)
        _installed.walk = True

    def __exit__(self, *_exc: object) -> None:
        _installed.walk = self._previous


class input_phase:  # noqa: N801 - used as a context manager, named as one
    """Install ``queue`` on this thread for the duration of B's engine call (the previous one after)."""

    __slots__ = ("_previous", "_queue")

    def __init__(self, queue: WeightQueue) -> None:
        self._queue = queue
        self._previous: WeightQueue | None = None

    def __enter__(self) -> WeightQueue:
        self._previous = getattr(_installed, "queue", None)
        _installed.queue = self._queue
        return self._queue

    def __exit__(self, *_exc: object) -> None:
        _installed.queue = self._previous


def engine_skips(node: Node | None) -> bool:
    """Whether the running engine call will not execute ``node`` (B's ``inputs=`` leave it out).

    A region checks one parameter's AccumulateGrad Node with it before it queues its W: a backward started
    inside B by a hook, which would run the parameters, then gets the region's whole backward.
    """
    return node is None or not torch._C._will_engine_execute_node(node)


@dataclass(slots=True, frozen=True)
class NoWalkPlan:
    """A stage structure qualified for the no-walk path (:func:`qualify`).

    Attributes:
        regions: the regions whose W B queues, as :meth:`WeightQueue.region_keys` gives them.
        distances: as :meth:`WeightQueue.distances` gives them: a Node more or fewer in the glue between
            the regions and the outputs (a Linear used on some microbatches only) changes them.
    """

    regions: tuple[int, ...]
    distances: tuple[int, ...]


def _latest_sequence_nr(output_edges: Sequence[GradientEdge]) -> int | None:
    """The largest sequence number among the outputs' Nodes that are not leaves (they have none)."""
    numbers = [
        edge.node._sequence_nr() for edge in output_edges if not _autograd.is_accumulate_grad(edge.node)
    ]
    return max(numbers) if numbers else None


NO_WALK_CACHE_SIZE = 32
"""How many stage keys :func:`no_walk_plan` remembers (a stage has one; tests build many)."""

_DECISIONS: dict[Any, NoWalkPlan | None] = {}
_DECISIONS_LOCK = threading.Lock()


NEAREST_REGION_NODES = 32
"""How many Nodes :func:`nearest_region` looks at below a stage output for a split region (a constant,
whatever the graph's size): glue after a stage's last region is a few Nodes (a residual add, an activation)."""


class _RegionsMade:
    """Whether any split region was built in this process: until one is, B does not look for one."""

    any = False


regions_made = _RegionsMade()
"""Set by :class:`~graphkit.split.compiled_region.SplitRegion` when the first one is built."""


def nearest_region(node: Node) -> int | None:
    """``id`` of the first split region's object found breadth-first below ``node``, within
    :data:`NEAREST_REGION_NODES` Nodes; None if none is (B then walks)."""
    seen = {node}
    queue = [node]
    for current in queue:  # a list iterator sees what is appended while it runs
        region = getattr(current, "region", None)
        if region is not None and hasattr(region, "weight_backward"):
            return id(region)
        if len(queue) >= NEAREST_REGION_NODES:
            continue
        for producer, _ in current.next_functions:
            if producer is not None and producer not in seen:
                seen.add(producer)
                queue.append(producer)
    return None


def _key(
    output_edges: Sequence[GradientEdge],
    cotangents: Sequence[torch.Tensor],
    stage_inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor] | None,
) -> tuple[Any, ...] | None:
    """The cache key of a call, or None where no split region lies near the outputs: per output its Node's
    class, output_nr and nearest region (:func:`nearest_region`); the number of stage inputs; the parameters
    given; the devices of the cotangents and stage inputs. A bounded cost, none per Node of the graph."""
    if not regions_made.any or getattr(_installed, "walk", False):
        return None
    outputs = tuple((type(edge.node), edge.output_nr, nearest_region(edge.node)) for edge in output_edges)
    if all(region is None for _, _, region in outputs):
        return None
    devices = tuple(
        {grad.device.type for grad in cotangents} | {tensor.device.type for tensor in stage_inputs}
    )
    return (outputs, len(stage_inputs), None if params is None else tuple(map(id, params)), devices)


def no_walk_plan(
    output_edges: Sequence[GradientEdge],
    cotangents: Sequence[torch.Tensor],
    stage_inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor] | None,
) -> tuple[Any, NoWalkPlan | None]:
    """``(key, plan)``: the no-walk plan of this stage (None: B walks), from the cache or :func:`qualify`."""
    key = _key(output_edges, cotangents, stage_inputs, params)
    if key is None:
        return None, None
    try:
        return key, _DECISIONS[key]
    except KeyError:
        pass
    plan = qualify(output_edges, cotangents, stage_inputs, params)
    remember(key, plan)
    return key, plan


def forget_decisions() -> None:
    """Forget every stage :func:`no_walk_plan` qualified or refused: the next B of each walks once again."""
    with _DECISIONS_LOCK:
        _DECISIONS.clear()


def remember(key: Any, plan: NoWalkPlan | None) -> None:
    """Cache the decision for ``key`` (the oldest goes beyond :data:`NO_WALK_CACHE_SIZE`)."""
    with _DECISIONS_LOCK:  # split backwards may run on several threads at once
        _DECISIONS.pop(key, None)
        if len(_DECISIONS) >= NO_WALK_CACHE_SIZE:
            _DECISIONS.pop(next(iter(_DECISIONS)))
        _DECISIONS[key] = plan


def qualify(
    output_edges: Sequence[GradientEdge],
    cotangents: Sequence[torch.Tensor],
    stage_inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor] | None,
) -> NoWalkPlan | None:
    """Walk the graph once and say whether B may skip the walk for it (module docstring), or None.

    Iterative, O(nodes + edges).
    """
    if not stage_inputs or not output_edges:
        return None
    if any(grad.device.type != "cpu" for grad in cotangents) or any(
        tensor.device.type != "cpu" for tensor in stage_inputs
    ):
        return None
    leaf_inputs = {id(tensor) for tensor in stage_inputs if tensor.grad_fn is None}
    stop = {_autograd.gradient_edge(tensor).node for tensor in stage_inputs if tensor.grad_fn is not None}
    variables: dict[int, torch.Tensor] = {}
    walk = walk_nodes((edge.node for edge in output_edges), stop, variables)
    nodes = walk.nodes
    count = len(nodes)
    consumers: list[list[int]] = [[] for _ in range(count)]
    uses: list[list[tuple[int, int]]] = [[] for _ in range(count)]  # per producer: (consumer, input_nr)
    for producer, consumer, _, input_nr in walk.edges():
        consumers[producer].append(consumer)
        uses[producer].append((consumer, input_nr))
    inputs = [index for index, node in enumerate(nodes) if node in stop]
    inputs += [index for index, tensor in variables.items() if id(tensor) in leaf_inputs]
    if not inputs:
        return None
    on_input_path = reach(consumers, inputs, count)
    if not all(on_input_path[walk.index[edge.node]] for edge in output_edges):
        return None  # an output only parameters feed (a parameter returned as an output)
    allowed = None if params is None else {id(tensor) for tensor in params if tensor.requires_grad}
    input_indices = set(inputs)
    regions: list[int] = []
    covered: set[int] = set()
    for index, node in enumerate(nodes):
        if run_once_kind(node) is not None:
            return None  # a reentrant checkpoint or an unsplit compiled region: the walking path runs it
        if index not in variables:
            continue
        if index in input_indices:
            if any(_is_weight_use(nodes[consumer], input_nr) for consumer, input_nr in uses[index]):
                return None  # a stage input a region counts as a weight: its gradient belongs to B
            continue
        variable = variables[index]
        if allowed is not None and id(variable) not in allowed:
            return None  # a leaf params= leaves out: the walking path leaves it out
        for consumer, input_nr in uses[index]:
            region_node = nodes[consumer]
            if not _is_region_node(region_node):
                return None  # a parameter used outside a split region
            if input_nr not in region_node.region.partition.weight_positions or not on_input_path[consumer]:
                return None  # computed by the region's I, or a region B would not run
            regions.append(consumer)
        covered.add(id(variable))
    if allowed is not None and not allowed <= covered:
        return None  # a parameter of the stage that no region covers here: its use may change
    region_nodes = [nodes[index] for index in set(regions)]
    latest = _latest_sequence_nr(output_edges)
    if not region_nodes or latest is None:
        return None
    return NoWalkPlan(
        tuple(sorted(id(node.region) for node in region_nodes)),
        tuple(sorted(latest - node._sequence_nr() for node in region_nodes)),
    )


REGIONS_AS_PLANNED = "as planned"
""":func:`check_regions`: the regions that queued their W are those the plan expects."""

WALK_INSTEAD = "walk instead"
""":func:`check_regions`: the structure does not qualify, and no region queued its W: B may walk."""

NOT_EXACT = "not exact"
""":func:`check_regions`: the structure does not qualify, and regions consumed their I: B must fail."""


def _is_region_node(node: Node) -> bool:
    """Whether ``node`` is the Node of a split region (its Function says it queues its W here)."""
    return bool(getattr(_autograd.forward_class(node), "queues_weight_in_b", False))


def _is_weight_use(node: Node, input_nr: int) -> bool:
    """Whether ``node`` is a split region's Node taking a weight at ``next_functions[input_nr]``."""
    return _is_region_node(node) and input_nr in node.region.partition.weight_positions


def check_regions(
    key: Any,
    plan: NoWalkPlan,
    queue: WeightQueue,
    output_edges: Sequence[GradientEdge],
    cotangents: Sequence[torch.Tensor],
    stage_inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor] | None,
) -> str:
    """After a no-walk B: whether the regions that queued their W are those a walk finds in this graph.

    Where they differ from ``plan``'s, the graph (kept by B) is qualified anew and the cache updated.
    Returns :data:`REGIONS_AS_PLANNED`, :data:`WALK_INSTEAD` (it no longer qualifies and no region queued
    anything: the graph is whole, B may walk it) or :data:`NOT_EXACT` (it no longer qualifies and regions
    ran their I: a parameter outside them did not get its gradient).
    """
    found = queue.region_keys()
    distances = queue.distances(output_edges)
    if found == plan.regions and distances == plan.distances:
        return REGIONS_AS_PLANNED
    fresh = qualify(output_edges, cotangents, stage_inputs, params)
    remember(key, fresh)
    if fresh is not None and fresh.regions == found and fresh.distances == distances:
        return REGIONS_AS_PLANNED
    return NOT_EXACT if found else WALK_INSTEAD
