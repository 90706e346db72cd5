"""Capture a PyTorch autograd graph into a networkx ``MultiDiGraph``.

``capture(outputs)`` walks ``grad_fn.next_functions`` from the outputs (iteratively: graphs with millions of
nodes are fine) and returns an :class:`AutogradGraph`, a ``networkx.MultiDiGraph`` whose

- **nodes** are the autograd Nodes (``AddmmBackward0``, ``AccumulateGrad`` ...), keyed by a deterministic
  id (``"n0"``, ``"n1"``, ... in breadth-first order from the outputs: the same model with the same shapes
  gives the same ids and the same exports, run after run);
- **edges** run in data-flow direction, producer -> consumer, one per entry of the consumer's
  ``next_functions`` (so ``x * x`` has two parallel edges). Edge attributes: ``output_nr`` (which forward
  output of the producer flows along the edge) and ``input_nr`` (the position of the edge in the
  consumer's ``next_functions``; also the multigraph edge key).

``graph.reverse_view()`` gives the autograd order (consumer -> producer), the direction the backward runs.

Node attributes (all plain Python values, so every networkx algorithm and writer works):

========================  ===========================================================================
``name``                  autograd class name, ``"AddmmBackward0"``
``op``                    short forward op name, ``"addmm"``; ``"accumulate_grad"`` for leaves
``kind``                  a :class:`NodeKind` value: op, parameter, leaf, stage_input, stage_output
``param_names``           names from ``module.named_parameters()`` (every name of a shared parameter)
``shapes``/``dtypes``     shape (tuple) and dtype (str) of each forward output of the node
``num_outputs``           number of forward outputs (gradients the node receives)
``saved_tensors``         list of ``{"name", "shape", "dtype", "bytes"}``; None when freed or hooked
``saved_bytes``           total bytes of the saved tensors (int) or None
``saved_reason``          why ``saved_tensors`` is None, else None
``module_path``           module that created the node (from :func:`graphkit.trace`), else None
``is_custom_function``    True for a Python ``torch.autograd.Function`` node
``output_names``          names of the stage outputs this node produces
``input_names``           names of the stage inputs this node stands for
========================  ===========================================================================
"""

from __future__ import annotations

import enum
import gc
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import torch
from torch.autograd.graph import GradientEdge, Node

from graphkit.graph import _autograd
from graphkit.graph.tensors import GraphkitInputError, flatten_tensors, non_tensor_leaves
from graphkit.graph.walk import NodeWalk, walk_nodes

__all__ = [
    "AutogradGraph",
    "GraphEndpoint",
    "NodeKind",
    "capture",
    "gradient_edge",
    "parameter_names",
]

MODULE_PATH_KEY = "graphkit.module_path"


class NodeKind(enum.StrEnum):
    """What a node of the captured graph stands for."""

    OP = "op"
    PARAMETER = "parameter"
    LEAF = "leaf"
    STAGE_INPUT = "stage_input"
    STAGE_OUTPUT = "stage_output"


@dataclass(slots=True, frozen=True)
class GraphEndpoint:
    """A named stage input or output: the node that stands for it and which of its outputs it is."""

    name: str
    node: str
    output_nr: int


def gradient_edge(tensor: torch.Tensor) -> GradientEdge:
    """The GradientEdge of a tensor that requires grad (its grad_fn, or the AccumulateGrad of a leaf).

    Raises:
        GraphkitInputError: the tensor does not require grad.
    """
    if not tensor.requires_grad:
        raise GraphkitInputError(
            "this tensor does not require grad, so it has no place in the autograd graph; "
            "call .requires_grad_() on it before the forward if its gradient is wanted"
        )
    return _autograd.gradient_edge(tensor)


def parameter_names(module: torch.nn.Module | None) -> dict[int, list[str]]:
    """Map ``id(parameter)`` to every name it has in ``module.named_parameters()`` (shared ones included)."""
    names: dict[int, list[str]] = {}
    if module is None:
        return names
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return names


class AutogradGraph(nx.MultiDiGraph):
    """A captured autograd graph: a ``networkx.MultiDiGraph`` with edges producer -> consumer.

    Graph-level attributes live in ``graph.graph`` (``"inputs"``/``"outputs"``: lists of
    :class:`GraphEndpoint` as dicts, ``"unused_params"``: parameter names with no path to any output,
    ``"saved_bytes_total"``: bytes of distinct saved tensors). ``autograd_nodes`` maps node ids to the live
    ``torch.autograd.graph.Node`` objects (only on a graph returned by :func:`capture`; copies and
    subgraph views do not carry it).
    """

    def __init__(self, incoming_graph_data: Any = None, **attr: Any) -> None:
        super().__init__(incoming_graph_data, **attr)
        self.autograd_nodes: dict[str, Node] = {}

    # --- endpoints ------------------------------------------------------------------------------------
    @property
    def inputs(self) -> list[GraphEndpoint]:
        """Stage inputs that require grad, in the order given to :func:`capture`."""
        return [GraphEndpoint(**entry) for entry in self.graph.get("inputs", [])]

    @property
    def outputs(self) -> list[GraphEndpoint]:
        """Stage outputs that require grad, in the order given to :func:`capture`."""
        return [GraphEndpoint(**entry) for entry in self.graph.get("outputs", [])]

    def nodes_of_kind(self, *kinds: NodeKind | str) -> list[str]:
        """Node ids whose ``kind`` is one of ``kinds``, in id order."""
        wanted = {str(kind) for kind in kinds}
        return [node for node, kind in self.nodes(data="kind") if str(kind) in wanted]

    def parameter_nodes(self) -> dict[str, str]:
        """Map every parameter name to the id of its AccumulateGrad node."""
        return {name: node for node, names in self.nodes(data="param_names") for name in names or ()}

    def reverse_view(self) -> nx.MultiDiGraph:
        """A read-only view with edges in autograd order (consumer -> producer), like ``next_functions``."""
        return self.reverse(copy=False)

    # --- export ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Node-link data (``networkx.node_link_data``) with plain, deterministic values: what
        :meth:`to_json` writes, as a dict (``networkx.node_link_graph`` reads it back)."""
        data = nx.node_link_data(_plain_copy(self), edges="edges")
        return json.loads(json.dumps(data, default=str))

    def to_json(self, indent: int | None = None) -> str:
        """The node-link JSON text of :meth:`to_dict` (``indent``: as ``json.dumps``), to write to a file."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_graphml(self, path: str | Path) -> None:
        """Write GraphML (``networkx.write_graphml``); list and tuple attributes become JSON strings."""
        plain = _plain_copy(self)
        for _, data in plain.nodes(data=True):
            for key, value in list(data.items()):
                if value is None:
                    del data[key]
                elif isinstance(value, (list, tuple, dict)):
                    data[key] = json.dumps(value, default=str)
        for key, value in list(plain.graph.items()):
            plain.graph[key] = json.dumps(value, default=str) if not isinstance(value, (int, str)) else value
        nx.write_graphml(plain, str(path))

    def to_dot(self) -> str:
        """Plain DOT source of the graph (for a styled diagram with parameter groups see ``graphkit.draw``)."""
        lines = ["digraph autograd {", "  rankdir=BT;", '  node [shape=box, fontname="Helvetica"];']
        for node, data in self.nodes(data=True):
            label = data["op"]
            if data.get("param_names"):
                label = ", ".join(data["param_names"])
            shapes = data.get("shapes") or []
            if shapes:
                label += "\\n" + " ".join(_format_shape(shape) for shape in shapes)
            lines.append(f'  {node} [label="{_escape(label)}", kind="{data["kind"]}"];')
        for producer, consumer, data in self.edges(data=True):
            lines.append(
                f"  {producer} -> {consumer} [output_nr={data['output_nr']}, input_nr={data['input_nr']}];"
            )
        lines.append("}")
        return "\n".join(lines) + "\n"

    def summary(self) -> dict[str, Any]:
        """Counts a person asks first: nodes, edges, parameters, ops by kind, saved bytes."""
        kinds: dict[str, int] = {}
        for _, kind in self.nodes(data="kind"):
            kinds[str(kind)] = kinds.get(str(kind), 0) + 1
        return {
            "nodes": self.number_of_nodes(),
            "edges": self.number_of_edges(),
            "parameters": len(self.parameter_nodes()),
            "kinds": dict(sorted(kinds.items())),
            "inputs": [endpoint.name for endpoint in self.inputs],
            "outputs": [endpoint.name for endpoint in self.outputs],
            "unused_params": list(self.graph.get("unused_params", [])),
            "saved_bytes_total": self.graph.get("saved_bytes_total"),
            "skipped_outputs": [entry["name"] for entry in self.graph.get("skipped_outputs", [])],
        }

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        # Presentation depends on the graph, never the other way round: drawing loads here, lazily.
        from graphkit.drawing.diagram import draw

        return draw(self)._repr_mimebundle_(include, exclude)


def _plain_copy(graph: AutogradGraph) -> nx.MultiDiGraph:
    plain = nx.MultiDiGraph()
    plain.graph.update({key: value for key, value in graph.graph.items()})
    for node, data in graph.nodes(data=True):
        plain.add_node(node, **{key: _plain(value) for key, value in data.items()})
    for producer, consumer, key, data in graph.edges(keys=True, data=True):
        plain.add_edge(producer, consumer, key=key, **data)
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _format_shape(shape: Iterable[int]) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ")"


def _escape(text: str) -> str:
    return text.replace('"', '\\"')


# --- capture --------------------------------------------------------------------------------------------
def _named_edges(value: Any, role: str, *, require: bool) -> list[tuple[str, GradientEdge]]:
    """Named GradientEdges of the tensors in ``value`` that require grad."""
    if isinstance(value, (int, float, str, bytes)) or value is None:
        if require:
            raise GraphkitInputError(
                f"the {role} is {type(value).__name__}, not a tensor: pass the tensor(s) the model "
                "returned (a tensor, a sequence, a mapping or a nested mix of them)"
            )
        return []
    tensors = flatten_tensors(value, lone_name=role)
    if require and not tensors:
        raise GraphkitInputError(
            f"the {role} holds no tensor (got {type(value).__name__}): pass the tensor(s) the model "
            "returned (a tensor, a sequence, a mapping or a nested mix of them)"
        )
    edges = [(name, _autograd.gradient_edge(tensor)) for name, tensor in tensors if tensor.requires_grad]
    if require and not edges:
        names = ", ".join(name for name, _ in tensors[:5])
        hint = ""
        if all(not (tensor.is_floating_point() or tensor.is_complex()) for _, tensor in tensors):
            hint = " (integer and bool tensors never require grad: return the float tensor they come from)"
        raise GraphkitInputError(
            f"no {role} tensor requires grad ({names}){hint}: they have no grad_fn, so there is no autograd "
            "graph. Run the forward with gradients enabled (not under torch.no_grad() or "
            "torch.inference_mode()) and with parameters or inputs that require grad"
        )
    return edges


def capture(
    outputs: Any,
    *,
    inputs: Any = None,
    module: torch.nn.Module | None = None,
    details: bool = True,
) -> AutogradGraph:
    """Capture the autograd graph behind ``outputs`` into an :class:`AutogradGraph`.

    Args:
        outputs: a tensor, a sequence, a mapping (Hugging Face ``ModelOutput`` included) or a nested mix;
            tensors that do not require grad are skipped, and so are values that are no tensors (an int in
            a dict): ``graph.graph["skipped_outputs"]`` names them.
        inputs: the stage inputs, in the same forms; those that require grad become ``stage_input``
            nodes and the walk stops at them (what produced a non-leaf input belongs to an earlier stage).
        module: the module whose ``named_parameters()`` name the parameter leaves; parameters that require
            grad but have no path to an output are listed in ``graph.graph["unused_params"]``. Op nodes
            get a ``module_path`` only where :func:`graphkit.trace` (which runs the forward itself)
            stamped one: after the forward nothing tells which submodule made an op, so to collapse
            diagrams by module, run the forward through :func:`graphkit.trace` instead.
        details: read saved tensors, shapes and dtypes (False gives only the structure, faster).

    Returns:
        The captured graph; ``graph.autograd_nodes`` holds the live Nodes (which keep the graph alive).

    Raises:
        GraphkitInputError: no tensor in ``outputs``, or none of them requires grad (no grad_fn).

    The traversal is breadth-first with an explicit queue (torchviz's recursive walk overflows Python's
    stack on deep graphs), O(nodes + edges).
    """
    output_edges = _named_edges(outputs, "output", require=True)
    input_edges = _named_edges(inputs, "input", require=False) if inputs is not None else []
    # Capture allocates a few small containers per node. Python's cyclic collector would run passes over
    # them (and over everything else alive) every few hundred allocations; on a 15k-node graph those
    # passes cost as much as the capture itself. Pausing it only defers collection: nothing leaks.
    collector_was_enabled = gc.isenabled()
    gc.disable()
    try:
        graph = _capture(output_edges, input_edges, module, details)
        # outputs that are no tensors (an int in a dict): no gradient flows through them, so the graph
        # leaves them out; it records their names so that the commands say so instead of staying silent
        graph.graph["skipped_outputs"] = [
            {"name": name, "type": kind} for name, kind in non_tensor_leaves(outputs)
        ]
        return graph
    finally:
        if collector_was_enabled:
            gc.enable()


def _capture(
    output_edges: list[tuple[str, GradientEdge]],
    input_edges: list[tuple[str, GradientEdge]],
    module: torch.nn.Module | None,
    details: bool,
) -> AutogradGraph:
    stop = {edge.node for _, edge in input_edges}
    walk = walk_nodes((edge.node for _, edge in output_edges), stop)

    graph = AutogradGraph()
    names_by_id = parameter_names(module)
    node_ids = [f"n{position}" for position in range(len(walk.nodes))]
    input_nodes = {edge.node for _, edge in input_edges}
    seen_storages: dict[tuple[int, int], int] = {}
    for position, node in enumerate(walk.nodes):
        attributes = _node_attributes(node, names_by_id, input_nodes, details, seen_storages)
        graph.add_node(node_ids[position], **attributes)
        graph.autograd_nodes[node_ids[position]] = node
    for producer, consumer, output_nr, input_nr in walk.edges():
        graph.add_edge(
            node_ids[producer], node_ids[consumer], key=input_nr, output_nr=output_nr, input_nr=input_nr
        )

    endpoints_in = []
    for name, edge in input_edges:
        if edge.node not in walk.index:
            continue  # an input the outputs do not depend on
        node_id = node_ids[walk.index[edge.node]]
        graph.nodes[node_id]["kind"] = NodeKind.STAGE_INPUT
        graph.nodes[node_id]["input_names"].append(name)
        endpoints_in.append({"name": name, "node": node_id, "output_nr": edge.output_nr})
    endpoints_out = []
    for name, edge in output_edges:
        node_id = node_ids[walk.index[edge.node]]
        data = graph.nodes[node_id]
        data["output_names"].append(name)
        if data["kind"] == NodeKind.OP:
            data["kind"] = NodeKind.STAGE_OUTPUT
        endpoints_out.append({"name": name, "node": node_id, "output_nr": edge.output_nr})
    graph.graph["inputs"] = endpoints_in
    graph.graph["outputs"] = endpoints_out
    graph.graph["unused_params"] = _unused_parameters(module, walk)
    graph.graph["saved_bytes_total"] = sum(seen_storages.values()) if details else None
    return graph


def _node_attributes(
    node: Node,
    names_by_id: Mapping[int, list[str]],
    input_nodes: set[Node],
    details: bool,
    seen_storages: dict[tuple[int, int], int],
) -> dict[str, Any]:
    is_leaf = _autograd.is_accumulate_grad(node)
    param_names: list[str] = []
    module_path = None
    if is_leaf:
        variable = node.variable
        param_names = list(names_by_id.get(id(variable), ()))
        kind = NodeKind.PARAMETER if param_names else NodeKind.LEAF
        if param_names:
            module_path = param_names[0].rpartition(".")[0]  # "" for a parameter of the root module
    else:
        kind = NodeKind.OP
        module_path = node.metadata.get(MODULE_PATH_KEY) if node.metadata else None
    if node in input_nodes:
        kind = NodeKind.STAGE_INPUT
    attributes: dict[str, Any] = {
        "name": type(node).__name__,
        "op": _autograd.forward_op_name(node),
        "kind": kind,
        "param_names": param_names,
        "module_path": module_path,
        "is_custom_function": _autograd.is_custom_function(node),
        "output_names": [],
        "input_names": [],
    }
    metadata = _autograd.gradient_metadata(node)
    attributes["num_outputs"] = len(metadata) if metadata is not None else 1
    if not details:
        return attributes
    attributes["shapes"] = [entry.shape for entry in metadata] if metadata else []
    attributes["dtypes"] = [str(entry.dtype).removeprefix("torch.") for entry in metadata] if metadata else []
    saved = None if is_leaf else _autograd.saved_tensors(node)
    if is_leaf:
        attributes.update(saved_tensors=[], saved_bytes=0, saved_reason=None)
    elif saved is None:
        reason = (
            _autograd.HOOKED_SAVED_TENSORS_REASON
            if _autograd.uses_saved_tensor_hooks(node)
            else _autograd.FREED_GRAPH_REASON
        )
        attributes.update(saved_tensors=None, saved_bytes=None, saved_reason=reason)
    else:
        infos, tensors = saved
        attributes["saved_tensors"] = [
            {"name": info.name, "shape": info.shape, "dtype": info.dtype, "bytes": info.bytes}
            for info in infos
        ]
        attributes["saved_bytes"] = sum(info.bytes for info in infos)
        attributes["saved_reason"] = None
        for info, tensor in zip(infos, tensors, strict=True):
            if tensor.numel():
                seen_storages[(_autograd.storage_key(tensor), tensor.storage_offset())] = info.bytes
    return attributes


def _unused_parameters(module: torch.nn.Module | None, walk: NodeWalk) -> list[str]:
    if module is None:
        return []
    reached = {id(node.variable) for node in walk.nodes if _autograd.is_accumulate_grad(node)}
    for node in walk.nodes:  # a reentrant checkpoint's nested backward reaches the parameters inside
        reached.update(id(parameter) for parameter in _autograd.reentrant_checkpoint_parameters(node))
    unused = []
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if parameter.requires_grad and id(parameter) not in reached:
            unused.append(name)
    return unused
