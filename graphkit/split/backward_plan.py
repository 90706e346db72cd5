"""What the split backward needs of a graph's structure, computed once per structure and cached.

A :class:`BackwardPlan` is the split of one walked graph (:func:`graphkit.graph.walk.walk_nodes`) by node
index: the intermediates where weight gradients leave the input path and the weight-side edges each feeds,
the weight leaves, the weight-only Nodes, and which leaves are fed both ways. These are the definitions of
:mod:`graphkit.analysis.closures` (input closure, parameter closure, intermediates), computed on node
indices instead of a networkx graph, because B plans every microbatch it has not seen the structure of.

Microbatches of one stage have the same structure (Node classes and edges; only shapes differ), so
:func:`cached_plan` keeps the last :data:`PLAN_CACHE_SIZE` plans by structure; B then replays a plan for
every later microbatch. Everything here is iterative (explicit stacks), O(nodes + edges).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from torch.autograd.graph import Node

from graphkit.graph import _autograd
from graphkit.graph.walk import NodeWalk
from graphkit.split.checkpointing import saves_tensors
from graphkit.split.run_once import run_once_kind

__all__ = [
    "PLAN_CACHE_SIZE",
    "REDUCTIONS_IN_B",
    "BackwardPlan",
    "cached_plan",
    "input_closure_flags",
    "opaque_positions_of",
    "plan_of",
    "reach",
    "with_reductions_in_b",
]


@dataclass(slots=True)
class BackwardPlan:
    """The split of one walked graph, by node index (see :mod:`graphkit.analysis.closures` for the definitions).

    It depends only on the graph's structure, so microbatches of the same stage share one plan.
    """

    # (intermediate index, ((input_nr, target index, target output_nr), ...))
    intermediates: list[tuple[int, tuple[tuple[int, int, int], ...]]]
    weight_leaves: list[int]
    weight_only: bytearray
    # per intermediate: the input_nr of each weight-side edge (what its formula computes)
    weight_input_nrs: list[tuple[int, ...]]
    # targets that are AccumulateGrad Nodes (leaves: a sparse one gets its gradient from its Node)
    leaf_targets: frozenset[int]
    # leaf targets fed both by intermediates and by the weight-only subgraph
    mixed_leaves: frozenset[int]
    # positions in ``intermediates`` after which W may hand the gradients so far to the engine: no
    # weight-only part of the graph is fed from both sides of the position (see weight_flush_points)
    flush_points: frozenset[int]
    # filled on first use by opaque_positions_of: (run-once Node indices, Nodes W may unpack hooked saved
    # tensors of); both depend on Node classes alone, like the rest of the plan
    opaque_positions: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # the second of opaque_positions as a set, for membership tests (filled with it)
    saving_positions: frozenset[int] = frozenset()
    # filled on first use by custom_functions_in_input_phase: whether any Node is a custom Function's
    # (Node classes are part of the structure)
    has_custom_functions: bool | None = None
    # the same split with the normalizations' weight gradients computed in B (REDUCTIONS_IN_B,
    # with_reductions_in_b), or None when the graph has none; B uses it for a microbatch where those
    # parameters have no tensor hooks
    reductions_in_b: BackwardPlan | None = None
    # in such a plan: (target index, output_nr) of every parameter whose gradient B computes, captured
    # at its AccumulateGrad Node; and per intermediate whose weight-side edges all lead to such
    # parameters (so W has nothing left to do for it), the positions in ``computed_in_b`` it feeds
    computed_in_b: tuple[tuple[int, int], ...] = ()
    done_in_b: tuple[tuple[int, ...], ...] = ()
    # weight-only Nodes that turn a missing gradient into a real one, themselves or further along their
    # next_functions: a custom Function's Node materializes it as zeros (``ctx.set_materialize_grads``).
    # A full backward runs such a Node even when every gradient it receives is missing; W must too
    zero_materializing: frozenset[int] = frozenset()


_CACHE: dict[Any, BackwardPlan] = {}
PLAN_CACHE_SIZE = 16
"""How many structures :func:`cached_plan` remembers (a stage has one; a few stages share a process)."""
_CACHE_LOCK = threading.Lock()


def cached_plan(
    walk: NodeWalk, input_nodes: set[Node], excluded: frozenset[int], input_positions: tuple[int, ...]
) -> BackwardPlan:
    """The plan of ``walk``, reused when a graph of the same structure was planned before.

    The key is the structure alone (Node classes, edges, which nodes are stage inputs and excluded
    leaves): shapes are read per microbatch in W, so graphs that differ only in shapes share a plan.
    """
    key = (tuple(map(type, walk.nodes)), tuple(walk.flat_edges), excluded, input_positions)
    plan = _CACHE.get(key)
    if plan is None:
        plan = plan_of(walk, input_nodes, excluded)
        with _CACHE_LOCK:  # split backwards may run on several threads at once
            if len(_CACHE) >= PLAN_CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[key] = plan
    return plan


def plan_of(walk: NodeWalk, input_nodes: set[Node], excluded: frozenset[int] = frozenset()) -> BackwardPlan:
    """Input closure, weight-only nodes and intermediates of ``walk`` in one pass over its edges.

    The same definitions as :mod:`graphkit.analysis.closures`, on node indices instead of a networkx graph:
    this runs for every new graph structure, so it avoids building attribute dictionaries. Leaves whose
    indices are in ``excluded`` (parameters left out by ``params=``) count as no weight at all, so the W
    phase computes nothing for them.
    """
    count = len(walk.nodes)
    consumers: list[list[int]] = [[] for _ in range(count)]
    for producer, consumer, _, _ in walk.edges():
        consumers[producer].append(consumer)
    inputs = [index for index, node in enumerate(walk.nodes) if node in input_nodes]
    leaves = [
        index
        for index, node in enumerate(walk.nodes)
        if node not in input_nodes and index not in excluded and _autograd.is_accumulate_grad(node)
    ]
    in_closure = reach(consumers, inputs, count)
    weight_only = reach(consumers, leaves, count)
    for index in range(count):
        if in_closure[index]:
            weight_only[index] = 0
    zero_materializing = _zero_materializing(walk, consumers, weight_only)
    edges_of: dict[int, list[tuple[int, int, int]]] = {}
    for producer, consumer, output_nr, input_nr in walk.edges():
        if weight_only[producer] and in_closure[consumer]:
            edges_of.setdefault(consumer, []).append((input_nr, producer, output_nr))
    # in the order a full backward runs them (latest created first, as the engine's ready queue), so
    # that several contributions to one parameter are summed in the same order
    intermediates = [
        (index, tuple(sorted(edges)))
        for index, edges in sorted(
            edges_of.items(), key=lambda item: (-_autograd.sequence_number(walk.nodes[item[0]]), item[0])
        )
    ]
    targets = {target for _, edges in intermediates for _, target, _ in edges}
    flush_points = weight_flush_points(intermediates, weight_only, walk.edges())
    leaf_targets = frozenset(target for target in targets if _autograd.is_accumulate_grad(walk.nodes[target]))
    plan = BackwardPlan(
        intermediates,
        leaves,
        weight_only,
        [tuple(input_nr for input_nr, _, _ in edges) for _, edges in intermediates],
        leaf_targets,
        frozenset(
            leaf for leaf in leaf_targets if any(weight_only[consumer] for consumer in consumers[leaf])
        ),
        flush_points,
        zero_materializing=zero_materializing,
    )
    plan.reductions_in_b = with_reductions_in_b(plan, walk)
    return plan


def _zero_materializing(walk: NodeWalk, consumers: list[list[int]], weight_only: bytearray) -> frozenset[int]:
    """The weight-only Nodes from which a custom Function's weight-only Node is reached along
    ``next_functions`` (that Node included): those a full backward may turn a missing gradient into a
    real one through (``PyNode::apply`` materializes missing gradients as zeros unless the Function
    called ``ctx.set_materialize_grads(False)``, which is only known when it runs)."""
    nodes = walk.nodes
    if not _autograd.any_custom_function(
        [node for node, only in zip(nodes, weight_only, strict=True) if only]
    ):
        return frozenset()
    sources = [
        index for index, node in enumerate(nodes) if weight_only[index] and _autograd.is_custom_function(node)
    ]
    reached = reach(consumers, sources, len(nodes))
    return frozenset(index for index, flag in enumerate(reached) if flag and weight_only[index])


REDUCTIONS_IN_B: dict[str, frozenset[int]] = {
    # next_functions: (input, weight, bias)
    "NativeLayerNormBackward0": frozenset({1, 2}),
    "NativeGroupNormBackward0": frozenset({1, 2}),
    "NativeBatchNormBackward0": frozenset({1, 2}),
}
"""Per intermediate class: the ``next_functions`` positions whose gradients B computes itself.

A normalization's weight and bias gradients are reductions over the same pass through the activations
that gives its input gradient, and its backward kernel computes them together. B lets the Node compute
them in its own call and captures them at the parameters' AccumulateGrad Nodes; left to W, they would
cost a second normalization backward over activations that left the cache, and the activations would
have to stay alive until W. The zero-bubble paper's implementation defers only the Linear layers' weight
GEMMs (``WeightGradStore`` in sail-sg/zero-bubble-pipeline-parallelism), so normalization layers run
their whole backward in B there too. Measured and left out: a Linear's or convolution's bias, which
W sums in one kernel either way (on the CPU B + W got no faster, a 48-layer MLP about 5% slower).
"""


def with_reductions_in_b(plan: BackwardPlan, walk: NodeWalk) -> BackwardPlan | None:
    """``plan`` with the gradients of the parameters fed only through :data:`REDUCTIONS_IN_B` edges
    computed in B.

    A parameter qualifies when it is a leaf (its AccumulateGrad Node is the edge's target), not fed
    through the weight-only subgraph too, and every edge into it from any intermediate is such a
    reduction: the engine then sums all of its contributions within B's call, in a full backward's
    order, and W hands the sum to its AccumulateGrad Node as one root. Returns None when none qualifies.
    The returned plan has those edges removed from its intermediates (an intermediate left with none is
    no longer one for W), its own flush points, and the captures in ``computed_in_b``.
    """
    nodes = walk.nodes
    candidate: dict[int, bool] = {}
    for index, edges in plan.intermediates:
        reducing = REDUCTIONS_IN_B.get(type(nodes[index]).__name__, frozenset())
        for input_nr, target, _ in edges:
            eligible = (
                input_nr in reducing and target in plan.leaf_targets and target not in plan.mixed_leaves
            )
            candidate[target] = candidate.get(target, True) and eligible
    finished = {target for target, eligible in candidate.items() if eligible}
    if not finished:
        return None
    computed_in_b: list[tuple[int, int]] = []
    position_of: dict[tuple[int, int], int] = {}
    intermediates: list[tuple[int, tuple[tuple[int, int, int], ...]]] = []
    done_in_b: list[tuple[int, ...]] = []
    for index, edges in plan.intermediates:
        feeds = []
        for _, target, output_nr in edges:
            if target in finished:
                key = (target, output_nr)
                if key not in position_of:
                    position_of[key] = len(computed_in_b)
                    computed_in_b.append(key)
                feeds.append(position_of[key])
        remaining = tuple(edge for edge in edges if edge[1] not in finished)
        if remaining:
            intermediates.append((index, remaining))
        else:
            done_in_b.append(tuple(feeds))
    return BackwardPlan(
        intermediates,
        plan.weight_leaves,
        plan.weight_only,
        [tuple(input_nr for input_nr, _, _ in edges) for _, edges in intermediates],
        frozenset(target for target in plan.leaf_targets if target not in finished),
        plan.mixed_leaves,
        weight_flush_points(intermediates, plan.weight_only, walk.edges()),
        computed_in_b=tuple(computed_in_b),
        done_in_b=tuple(done_in_b),
        zero_materializing=plan.zero_materializing,
    )


def weight_flush_points(
    intermediates: list[tuple[int, tuple[tuple[int, int, int], ...]]],
    weight_only: bytearray,
    edges: Any,
) -> frozenset[int]:
    """Positions in ``intermediates`` after which the W phase may run the engine on what it has so far.

    W computes the weight-side gradients intermediate by intermediate; handing them to the engine in
    several calls keeps fewer of them alive at once (on the CPU, each fresh allocation of a large
    gradient costs page faults once the allocator has returned the memory). A call must not split what
    the engine sums: every gradient reaching one weight-only Node (a parameter used twice, a ``W.t()``
    fed by two intermediates) must be in the same call, or the sums and the hooks would differ from a
    full backward. So the weight-only Nodes are grouped into connected parts (union-find over the
    weight-only edges ``edges``: ``(producer, consumer, output_nr, input_nr)`` as
    :meth:`~graphkit.graph.walk.NodeWalk.edges`), and a position qualifies when every part fed by an
    intermediate at or before it is fed by none after it. The last position always qualifies.
    """
    parent: dict[int, int] = {}

    def root_of(node: int) -> int:
        root = node
        while parent.get(root, root) != root:
            root = parent[root]
        while node != root:  # path compression, iteratively
            parent[node], node = root, parent[node]
        return root

    for producer, consumer, _, _ in edges:
        if weight_only[producer] and weight_only[consumer]:
            first, second = root_of(producer), root_of(consumer)
            if first != second:
                parent[first] = second
    parts = [{root_of(target) for _, target, _ in targets} for _, targets in intermediates]
    last_feeder: dict[int, int] = {}
    for position, feeds in enumerate(parts):
        for part in feeds:
            last_feeder[part] = position
    points = []
    reach = -1
    for position, feeds in enumerate(parts):
        reach = max(reach, position, *(last_feeder[part] for part in feeds))
        if reach == position:
            points.append(position)
    return frozenset(points)


def reach(consumers: list[list[int]], sources: list[int], count: int) -> bytearray:
    """Per node index: 1 where the node is reachable from ``sources`` along ``consumers`` (sources
    included), with an explicit stack."""
    reached = bytearray(count)
    stack = list(sources)
    for source in sources:
        reached[source] = 1
    while stack:
        for consumer in consumers[stack.pop()]:
            if not reached[consumer]:
                reached[consumer] = 1
                stack.append(consumer)
    return reached


def input_closure_flags(walk: NodeWalk, input_nodes: set[Node]) -> bytearray:
    """Per node index of ``walk``: 1 where the node is on a path to a stage input (the input closure)."""
    count = len(walk.nodes)
    consumers: list[list[int]] = [[] for _ in range(count)]
    for producer, consumer, _, _ in walk.edges():
        consumers[producer].append(consumer)
    return reach(consumers, [index for index, node in enumerate(walk.nodes) if node in input_nodes], count)


def opaque_positions_of(plan: BackwardPlan, nodes: list[Node]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """For ``plan``'s structure: the indices of run-once Nodes, and of the Nodes W may unpack hooked
    saved tensors of (intermediates and weight-only Nodes of classes that save tensors). Cached per plan:
    both depend on Node classes alone, and checkpointing adds no Node."""
    if plan.opaque_positions is not None:
        return plan.opaque_positions
    run_once = tuple(index for index, node in enumerate(nodes) if run_once_kind(node) is not None)
    skip = set(run_once)
    candidates = [index for index, _ in plan.intermediates if index not in skip]
    candidates += [index for index, flag in enumerate(plan.weight_only) if flag]
    saving = tuple(index for index in candidates if saves_tensors(nodes[index]))
    # the set first: a reader that sees opaque_positions filled finds it too; threads that fill both at
    # once compute the same values
    plan.saving_positions = frozenset(saving)
    plan.opaque_positions = (run_once, saving)
    return run_once, saving
