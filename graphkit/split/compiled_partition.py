"""Partition a compiled region's backward graph into an I graph (input gradients) and a W graph (weights).

AOTAutograd hands a ``torch.compile``'d region's backward to its compiler as one ``torch.fx`` graph: its
placeholders are the saved tensors and the tangents (the gradients of the region's outputs), its output one
gradient per forward input (None where none is needed). :func:`partition_backward` cuts that graph, once,
in two:

- the **I graph** takes every placeholder and returns the input gradients, then the values the W graph reads
  that only it computes (the *boundary*: a ``grad_output`` of an inner matmul, say);
- the **W graph** takes the boundary values, then the placeholders it reads itself, and returns the weight
  gradients.

Each node of the backward graph runs in exactly one of them (in I when an input gradient needs it, else in
W), with its own arguments, so I then W computes every gradient with the same ops on the same values as
the whole backward: bit for bit the same result. The idea is meta-pytorch/autoparallel's dI/dW split
(``autoparallel/graph_passes/split_di_dw_graph.py``, built on ``torch._functorch.partitioners``); this one
uses only the public ``torch.fx`` API and refuses (:class:`UnsplittableBackward`) the graphs it cannot cut
without changing what runs: an op that mutates a tensor in place, an op with side effects that no gradient
needs, a random op (the backward would be no function of the saved values alone), a graph whose output is
not one node or None per gradient.

Higher-order ops (``torch.ops.higher_order.*``: ``flex_attention_backward``, ``invoke_subgraph``) read their
subgraphs through ``get_attr`` nodes. A ``get_attr`` node is no computation: it is copied into each part
whose ops read it, and each part's ``GraphModule`` carries the submodules its ``get_attr`` nodes name. A
higher-order op call is one op like any other: it runs in I when one of its outputs leads to an input
gradient (``flex_attention_backward`` returns dq, dk, dv and the gradients of the tensors its ``score_mod``
captured, all in one call), and its outputs that are weight gradients are handed to W as they are. The ops
inside its subgraphs are checked as the graph's own ops are (no mutation, no random draw, no side effect);
``run_with_rng_state``, which replays a random op from a saved RNG state (dropout recomputed under
activation checkpointing), is a function of the saved values and splits like any op. ``invoke_subgraph`` (what ``torch.compiler.nested_compile_region`` compiles to) is no more than a call of
its subgraph: it is inlined first, so that the weight-gradient ops inside it move to W like any other.
torchtitan's GraphPP (``torchtitan/experiments/graph_trainer/graph_pp/split_di_dw.py``) keeps get_attr
nodes as references in its weight graph the same way.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

__all__ = ["BackwardPartition", "UnsplittableBackward", "partition_backward"]


class UnsplittableBackward(ValueError):
    """A backward graph :func:`partition_backward` cannot cut into I and W; the message says why."""


@dataclass(slots=True, frozen=True)
class BackwardPartition:
    """A backward graph cut into an I graph and a W graph (:func:`partition_backward`).

    Attributes:
        input_graph: takes the backward's placeholders, in order; returns the gradients at
            ``input_positions``, then ``boundary_count`` values for the W graph.
        weight_graph: takes the ``boundary_count`` values, then the backward's placeholders at
            ``weight_reads``; returns the gradients at ``weight_positions``.
        input_positions: positions in the backward's output of the gradients I computes (not None).
        weight_positions: positions of the gradients W computes (not None).
        boundary_count: how many values I hands to W.
        weight_reads: positions among the backward's placeholders of those W reads itself.
    """

    input_graph: fx.GraphModule
    weight_graph: fx.GraphModule
    input_positions: tuple[int, ...]
    weight_positions: tuple[int, ...]
    boundary_count: int
    weight_reads: tuple[int, ...]


def _ancestors(roots: Iterable[fx.Node]) -> set[fx.Node]:
    """``roots`` and every node they read, directly or not (an explicit stack, no recursion)."""
    found: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in found:
            continue
        found.add(node)
        stack.extend(node.all_input_nodes)
    return found


def _mutates(node: fx.Node) -> bool:
    """Whether an op node writes to one of its arguments (an aten overload whose schema says so)."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _attribute(owner: fx.GraphModule, node: fx.Node) -> object:
    """What a ``get_attr`` node names: a higher-order op's subgraph (``fw_graph0``, ``mask_graph0``) or a
    constant tensor."""
    value: object = owner
    for name in str(node.target).split("."):
        value = getattr(value, name, None)
    if not isinstance(value, fx.GraphModule | torch.Tensor):
        kind = "nothing" if value is None else type(value).__name__
        raise UnsplittableBackward(
            f"the backward's get_attr node {node.target} names {kind}, not a subgraph or a tensor"
        )
    return value


def _check_ops(graph: fx.Graph, needed: set[fx.Node], where: str) -> None:
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if _mutates(node):
            raise UnsplittableBackward(f"{where} mutates a tensor in place ({node.target})")
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            raise UnsplittableBackward(
                f"{where} draws random numbers ({node.target}): it is no function of the saved values "
                "alone, and I then W would draw them in another order than the whole backward"
            )
        if node not in needed and node.is_impure():
            raise UnsplittableBackward(f"{where} runs {node.target} for its side effect")
        if node.op not in ("call_function", "call_method"):
            raise UnsplittableBackward(f"{where} holds a {node.op} node ({node.target})")


def _check_splittable(backward: fx.GraphModule, outputs: Sequence[object]) -> None:
    for position, value in enumerate(outputs):
        if value is not None and not isinstance(value, fx.Node):
            raise UnsplittableBackward(
                f"the backward's output {position} is {type(value).__name__}, not a graph value or None"
            )
    _check_ops(
        backward.graph, _ancestors(value for value in outputs if isinstance(value, fx.Node)), "the backward"
    )
    # the subgraphs of higher-order ops, and theirs in turn (an explicit stack): every op in them runs
    # wherever the op that calls them runs
    stack = [(backward, node) for node in backward.graph.nodes if node.op == "get_attr"]
    seen: set[int] = set()
    while stack:
        owner, node = stack.pop()
        subgraph = _attribute(owner, node)
        if not isinstance(subgraph, fx.GraphModule) or id(subgraph) in seen:
            continue
        seen.add(id(subgraph))
        subgraph_output = next(n for n in subgraph.graph.nodes if n.op == "output")
        _check_ops(subgraph.graph, _ancestors([subgraph_output]), f"the backward's subgraph {node.target}")
        stack.extend((subgraph, inner) for inner in subgraph.graph.nodes if inner.op == "get_attr")


def _calls_subgraph(node: fx.Node) -> bool:
    """Whether ``node`` calls ``torch.ops.higher_order.invoke_subgraph`` (a nested compile region)."""
    name = getattr(node.target, "name", None)
    return node.op == "call_function" and callable(name) and name() == "invoke_subgraph"


def _inline_subgraph_calls(backward: fx.GraphModule) -> fx.GraphModule:
    """``backward`` with every ``invoke_subgraph`` call replaced by the ops of its subgraph (calls nested in
    subgraphs too, one level per pass), or ``backward`` itself when it holds none."""
    module = backward
    while any(_calls_subgraph(node) for node in module.graph.nodes):
        module = _inline_one_level(module)
    return module


def _inline_one_level(module: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    attributes: dict[str, object] = {}
    environment: dict[fx.Node, object] = {}
    call_results: dict[fx.Node, Sequence[object]] = {}

    def copy_attribute(owner: fx.GraphModule, node: fx.Node, prefix: str) -> fx.Node:
        value = _attribute(owner, node)
        name = f"{prefix}{node.target}".replace(".", "_")
        while attributes.get(name, value) is not value:
            name += "_"
        attributes[name] = value
        copied = graph.get_attr(name)
        copied.meta = dict(node.meta)
        return copied

    for node in module.graph.nodes:
        if node.op == "get_attr":
            environment[node] = copy_attribute(module, node, "")
        elif _calls_subgraph(node):
            subgraph = _attribute(module, node.args[0])
            operands = [environment[a] if isinstance(a, fx.Node) else a for a in node.args[2:]]
            call_results[node] = _copy_subgraph(
                node,
                subgraph,
                operands,
                graph,
                lambda inner, owner=subgraph, prefix=f"{node.name}_": copy_attribute(owner, inner, prefix),
            )
        elif node.target is operator.getitem and node.args[0] in call_results:
            environment[node] = call_results[node.args[0]][node.args[1]]
        else:
            if any(argument in call_results for argument in node.all_input_nodes):
                raise UnsplittableBackward(
                    f"the backward reads the whole tuple a subgraph call returns ({node.name})"
                )
            environment[node] = graph.node_copy(node, lambda argument: environment[argument])
    for node in list(graph.nodes):  # the subgraphs the inlined calls named
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)
    kept = {str(node.target) for node in graph.nodes if node.op == "get_attr"}
    return fx.GraphModule({name: value for name, value in attributes.items() if name in kept}, graph)


def _copy_subgraph(
    call: fx.Node,
    subgraph: object,
    operands: Sequence[object],
    graph: fx.Graph,
    copy_attribute: Callable[[fx.Node], fx.Node],
) -> Sequence[object]:
    """Copy the ops of ``subgraph`` into ``graph``, its placeholders bound to ``operands``; return what its
    output returns (the values that replace ``call``'s getitems)."""
    if not isinstance(subgraph, fx.GraphModule):
        raise UnsplittableBackward(f"the backward's subgraph call {call.name} names no subgraph")
    placeholders = [node for node in subgraph.graph.nodes if node.op == "placeholder"]
    if len(placeholders) != len(operands):
        raise UnsplittableBackward(
            f"the backward's subgraph call {call.name} passes {len(operands)} values to a subgraph of "
            f"{len(placeholders)} arguments"
        )
    environment: dict[fx.Node, object] = dict(zip(placeholders, operands, strict=True))
    results: object = ()
    for node in subgraph.graph.nodes:
        if node.op == "get_attr":
            environment[node] = copy_attribute(node)
        elif node.op == "output":
            results = fx.map_arg(node.args[0], lambda argument: environment[argument])
        elif node.op != "placeholder":
            environment[node] = graph.node_copy(node, lambda argument: environment[argument])
    return results if isinstance(results, tuple | list) else (results,)


def _with_tuple_parts(nodes: set[fx.Node]) -> set[fx.Node]:
    """``nodes`` and every ``getitem`` of a multi-output op among them, and the getitems of those (a
    higher-order op returns tuples of tuples), so that no graph hands a tuple on: the parts of one op (a
    ``convolution_backward``'s input and weight gradients, ``flex_attention_backward``'s dq, dk, dv and
    captured-tensor gradients) run where the op runs."""
    found = set(nodes)
    stack = list(nodes)
    while stack:
        for user in stack.pop().users:
            if user.target is operator.getitem and user not in found:
                found.add(user)
                stack.append(user)
    return found


def _copy(nodes: Sequence[fx.Node], environment: dict[fx.Node, fx.Node], graph: fx.Graph) -> None:
    """Copy ``nodes`` into ``graph``; a ``get_attr`` node one of them reads is copied first, once per graph."""
    for node in nodes:
        _copy_attributes(node.all_input_nodes, environment, graph)
        environment[node] = graph.node_copy(node, lambda argument: environment[argument])


def _copy_attributes(nodes: Iterable[fx.Node], environment: dict[fx.Node, fx.Node], graph: fx.Graph) -> None:
    for node in nodes:
        if node.op == "get_attr" and node not in environment:
            environment[node] = graph.node_copy(node)


def partition_backward(backward: fx.GraphModule, weight_positions: Iterable[int]) -> BackwardPartition:
    """Cut ``backward`` into an I graph and a W graph (module docstring).

    Args:
        backward: AOTAutograd's backward graph of a region (placeholders: saved tensors and tangents;
            output: a tuple with one gradient or None per forward input).
        weight_positions: positions in that tuple of the weight gradients (the forward inputs that are
            parameters); the other non-None entries are input gradients.

    Returns:
        A :class:`BackwardPartition`; ``backward`` is left unchanged (``invoke_subgraph`` calls are inlined
        in a copy). Each part's ``GraphModule`` holds the
        subgraphs its ``get_attr`` nodes name (``torch.fx.GraphModule`` copies them from ``backward``).

    Raises:
        UnsplittableBackward: the graph or a higher-order op's subgraph mutates a tensor in place, runs an op
            for its side effect alone, draws random numbers, holds a node other than an op (a ``get_attr``
            that names no subgraph, a ``call_module``), or returns something other than one value or None
            per gradient.
    """
    backward = _inline_subgraph_calls(backward)
    graph = backward.graph
    output_node = next(node for node in graph.nodes if node.op == "output")
    outputs = output_node.args[0]
    if not isinstance(outputs, tuple | list):
        raise UnsplittableBackward("the backward does not return a tuple of gradients")
    _check_splittable(backward, outputs)
    weights = set(weight_positions)
    input_positions = tuple(p for p, value in enumerate(outputs) if value is not None and p not in weights)
    weight_positions_found = tuple(p for p, value in enumerate(outputs) if value is not None and p in weights)

    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    # get_attr nodes are no computation: each part copies those its ops read (_copy), none is handed on
    in_input_graph = {
        node
        for node in _with_tuple_parts(_ancestors(outputs[p] for p in input_positions))
        if node.op != "get_attr"
    }
    in_weight_graph = {
        node
        for node in _ancestors(outputs[p] for p in weight_positions_found)
        if node not in in_input_graph and node.op != "get_attr"
    }
    weight_outputs = {outputs[p] for p in weight_positions_found}
    computed_in_input = [node for node in graph.nodes if node in in_input_graph and node.op != "placeholder"]
    boundary = [
        node
        for node in computed_in_input
        if node in weight_outputs or any(user in in_weight_graph for user in node.users)
    ]
    weight_reads = tuple(
        position
        for position, node in enumerate(placeholders)
        if node in weight_outputs or any(user in in_weight_graph for user in node.users)
    )

    input_graph = fx.Graph()
    environment: dict[fx.Node, fx.Node] = {}
    for node in placeholders:
        environment[node] = input_graph.node_copy(node)
    _copy(computed_in_input, environment, input_graph)
    _copy_attributes((outputs[p] for p in input_positions), environment, input_graph)
    input_graph.output(
        tuple(environment[outputs[p]] for p in input_positions) + tuple(environment[n] for n in boundary)
    )

    weight_graph = fx.Graph()
    environment = {}
    for index, node in enumerate(boundary):
        copied = weight_graph.placeholder(f"boundary_{index}")
        copied.meta = dict(node.meta)
        environment[node] = copied
    for position in weight_reads:
        environment[placeholders[position]] = weight_graph.node_copy(placeholders[position])
    _copy(
        [node for node in graph.nodes if node in in_weight_graph and node.op != "placeholder"],
        environment,
        weight_graph,
    )
    _copy_attributes((outputs[p] for p in weight_positions_found), environment, weight_graph)
    weight_graph.output(tuple(environment[outputs[p]] for p in weight_positions_found))
    for part in (input_graph, weight_graph):
        part.lint()
    return BackwardPartition(
        input_graph=fx.GraphModule(backward, input_graph),
        weight_graph=fx.GraphModule(backward, weight_graph),
        input_positions=input_positions,
        weight_positions=weight_positions_found,
        boundary_count=len(boundary),
        weight_reads=weight_reads,
    )
