"""graphkit.capture: nodes, edges and attributes against hand-built graphs and an independent traversal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import models
import networkx as nx
import pytest
import torch
from torch import nn
from torch.autograd.graph import Node

import graphkit
from graphkit.graph import _autograd
from graphkit.graph.autograd_graph import AutogradGraph, GraphEndpoint, NodeKind, capture, gradient_edge
from graphkit.graph.tensors import GraphkitInputError
from graphkit.models import zoo

ZOO_NAMES = list(zoo.MODELS)


def zoo_inputs(name: str) -> tuple[nn.Module, dict[str, Any]]:
    """A zoo model with its inputs as a dict (positional arguments named by position)."""
    module, inputs = zoo.build(name)
    if isinstance(inputs, tuple):
        inputs = {str(position): value for position, value in enumerate(inputs)}
    return module, inputs


def forward(module: nn.Module, inputs: dict[str, Any]) -> Any:
    if all(key.isdigit() for key in inputs):
        return module(*inputs.values())
    return module(**inputs)


def nodes_with(graph: AutogradGraph, *keys: str) -> dict[str, tuple[Any, ...]]:
    """``{node id: (attribute values ...)}`` for the given attribute names."""
    return {node: tuple(data[key] for key in keys) for node, data in graph.nodes(data=True)}


def edge_list(graph: AutogradGraph) -> list[tuple[str, str, int, int]]:
    """``[(producer, consumer, output_nr, input_nr)]`` sorted."""
    return sorted(
        (producer, consumer, data["output_nr"], data["input_nr"])
        for producer, consumer, data in graph.edges(data=True)
    )


def independent_walk(
    roots: list[Node], stop: set[Node]
) -> tuple[set[Node], Counter[tuple[Node, Node, int, int]]]:
    """Every Node reachable from ``roots`` over ``next_functions`` (a set and a stack, depth first) and the
    multiset of edges ``(producer, consumer, output_nr, input_nr)``; Nodes in ``stop`` are not expanded."""
    seen: set[Node] = set(roots)
    stack = list(roots)
    edges: Counter[tuple[Node, Node, int, int]] = Counter()
    while stack:
        node = stack.pop()
        if node in stop:
            continue
        for input_nr, (producer, output_nr) in enumerate(node.next_functions):
            if producer is None:
                continue
            edges[(producer, node, output_nr, input_nr)] += 1
            if producer not in seen:
                seen.add(producer)
                stack.append(producer)
    return seen, edges


def assert_matches_independent_walk(graph: AutogradGraph, outputs: Any, inputs: dict[str, Any]) -> None:
    roots = [gradient_edge(tensor).node for tensor in models.output_tensors(outputs)]
    stop = {
        gradient_edge(tensor).node
        for tensor in inputs.values()
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad
    }
    nodes, edges = independent_walk(roots, stop)
    assert graph.number_of_nodes() == len(nodes)
    assert graph.number_of_edges() == sum(edges.values())
    assert set(graph.autograd_nodes.values()) == nodes
    captured = Counter(
        (graph.autograd_nodes[producer], graph.autograd_nodes[consumer], data["output_nr"], data["input_nr"])
        for producer, consumer, data in graph.edges(data=True)
    )
    assert captured == edges
    for node_id, node in graph.autograd_nodes.items():
        assert graph.nodes[node_id]["name"] == type(node).__name__


# --- hand-built graphs ------------------------------------------------------------------------------------
def test_square_has_two_parallel_edges_with_input_nr_0_and_1() -> None:
    module, inputs = models.square()
    graph = capture(module(**inputs), inputs=inputs, module=module)

    assert nodes_with(graph, "name", "op", "kind", "num_outputs", "shapes") == {
        "n0": ("MulBackward0", "mul", NodeKind.STAGE_OUTPUT, 1, [(3,)]),
        "n1": ("AccumulateGrad", "accumulate_grad", NodeKind.STAGE_INPUT, 1, [(3,)]),
    }
    assert edge_list(graph) == [("n1", "n0", 0, 0), ("n1", "n0", 0, 1)]
    assert sorted(graph["n1"]["n0"]) == [0, 1]  # the multigraph key is input_nr
    assert graph.inputs == [GraphEndpoint("x", "n1", 0)]
    assert graph.outputs == [GraphEndpoint("output", "n0", 0)]
    assert graph.nodes["n1"]["input_names"] == ["x"]
    assert graph.nodes["n0"]["output_names"] == ["output"]


def test_linear_is_addmm_of_bias_input_and_transposed_weight() -> None:
    module, inputs = models.linear()
    graph = capture(module(**inputs), inputs=inputs, module=module)

    assert nodes_with(graph, "name", "op", "kind", "param_names", "shapes", "dtypes") == {
        "n0": ("AddmmBackward0", "addmm", NodeKind.STAGE_OUTPUT, [], [(2, 3)], ["float32"]),
        "n1": ("AccumulateGrad", "accumulate_grad", NodeKind.PARAMETER, ["bias"], [(3,)], ["float32"]),
        "n2": ("AccumulateGrad", "accumulate_grad", NodeKind.STAGE_INPUT, [], [(2, 4)], ["float32"]),
        "n3": ("TBackward0", "t", NodeKind.OP, [], [(4, 3)], ["float32"]),
        "n4": ("AccumulateGrad", "accumulate_grad", NodeKind.PARAMETER, ["weight"], [(3, 4)], ["float32"]),
    }
    assert edge_list(graph) == [
        ("n1", "n0", 0, 0),
        ("n2", "n0", 0, 1),
        ("n3", "n0", 0, 2),
        ("n4", "n3", 0, 0),
    ]
    assert graph.parameter_nodes() == {"bias": "n1", "weight": "n4"}
    assert graph.autograd_nodes["n4"].variable is module.weight
    assert graph.nodes_of_kind(NodeKind.PARAMETER) == ["n1", "n4"]
    # reverse_view is autograd order: the addmm points at what its next_functions hold.
    assert sorted(graph.reverse_view().successors("n0")) == ["n1", "n2", "n3"]


def test_chunk_outputs_are_consumed_with_output_nr_0_and_1() -> None:
    module, inputs = models.chunk_pair()
    graph = capture(module(**inputs), inputs=inputs, module=module)

    assert nodes_with(graph, "name", "num_outputs", "shapes") == {
        "n0": ("AddBackward0", 1, [(2, 2)]),
        "n1": ("TanhBackward0", 1, [(2, 2)]),
        "n2": ("SigmoidBackward0", 1, [(2, 2)]),
        "n3": ("SplitBackward0", 2, [(2, 2), (2, 2)]),
        "n4": ("AccumulateGrad", 1, [(2, 4)]),
    }
    assert edge_list(graph) == [
        ("n1", "n0", 0, 0),
        ("n2", "n0", 0, 1),
        ("n3", "n1", 0, 0),
        ("n3", "n2", 1, 0),
        ("n4", "n3", 0, 0),
    ]


def test_a_parameter_registered_under_two_names_lists_both() -> None:
    module = nn.Module()
    module.encoder = nn.Linear(3, 3, bias=False)
    module.decoder = nn.Linear(3, 3, bias=False)
    module.decoder.weight = module.encoder.weight
    x = torch.randn(2, 3, requires_grad=True)
    graph = capture(module.decoder(module.encoder(x)), inputs=x, module=module)

    leaves = {node: names for node, names in nodes_with(graph, "param_names").items() if names[0]}
    assert list(leaves.values()) == [(["encoder.weight", "decoder.weight"],)]
    assert graph.parameter_nodes() == dict.fromkeys(["encoder.weight", "decoder.weight"], next(iter(leaves)))


def test_leaf_without_module_is_a_leaf_and_unused_parameters_are_listed() -> None:
    weight = torch.randn(3, requires_grad=True)
    x = torch.randn(3, requires_grad=True)
    graph = capture(x * weight, inputs={"x": x})
    assert nodes_with(graph, "kind", "param_names") == {
        "n0": (NodeKind.STAGE_OUTPUT, []),
        "n1": (NodeKind.STAGE_INPUT, []),
        "n2": (NodeKind.LEAF, []),
    }

    module = nn.ModuleDict({"used": nn.Linear(3, 3), "unused": nn.Linear(3, 3), "frozen": nn.Linear(3, 3)})
    module["frozen"].requires_grad_(False)
    graph = capture(module["used"](x), inputs=x, module=module)
    assert graph.graph["unused_params"] == ["unused.weight", "unused.bias"]


def test_a_non_leaf_stage_input_stops_the_walk() -> None:
    """What produced a non-leaf input belongs to an earlier stage and is not captured."""
    earlier = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    hidden = torch.tanh(earlier(x))
    later = nn.Linear(3, 3)
    unused_input = torch.randn(3, requires_grad=True)
    graph = capture(later(hidden), inputs={"hidden": hidden, "unused": unused_input}, module=later)

    assert sorted(name for (name,) in nodes_with(graph, "name").values()) == sorted(
        ["AddmmBackward0", "AccumulateGrad", "TanhBackward0", "TBackward0", "AccumulateGrad"]
    )
    tanh = next(node for node, (name,) in nodes_with(graph, "name").items() if name == "TanhBackward0")
    assert graph.nodes[tanh]["kind"] == NodeKind.STAGE_INPUT
    assert graph.in_degree(tanh) == 0
    assert graph.inputs == [GraphEndpoint("hidden", tanh, 0)]  # the unused input is not in the graph


def test_a_parameter_returned_as_output_is_its_own_leaf_node() -> None:
    module = models.ParamOnlyOutput()
    graph = capture(module.log_temperature, module=module)
    assert nodes_with(graph, "name", "kind", "param_names", "output_names") == {
        "n0": ("AccumulateGrad", NodeKind.PARAMETER, ["log_temperature"], ["output"]),
    }
    assert graph.outputs == [GraphEndpoint("output", "n0", 0)]


def test_custom_function_node_is_flagged_and_keeps_its_class_name() -> None:
    module, inputs = models.custom_multi_output()
    graph = capture(module(**inputs), inputs=inputs, module=module)
    custom = [node for node, data in graph.nodes(data=True) if data["is_custom_function"]]
    assert [graph.nodes[node]["name"] for node in custom] == ["ScaleAndShiftBackward"]
    assert graph.nodes[custom[0]]["op"] == "ScaleAndShift"
    assert graph.nodes[custom[0]]["num_outputs"] == 2
    assert sorted(data["output_nr"] for _, _, data in graph.out_edges(custom[0], data=True)) == [0, 1]


# --- an independent traversal ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_graph_equals_an_independent_walk_of_next_functions(name: str) -> None:
    module, inputs = zoo_inputs(name)
    outputs = forward(module, inputs)
    graph = capture(outputs, inputs=inputs, module=module)
    assert_matches_independent_walk(graph, outputs, inputs)
    named = {name for names in nx.get_node_attributes(graph, "param_names").values() for name in names}
    assert named == {name for name, _ in module.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("name", list(models.KINDS))
def test_small_model_graph_equals_an_independent_walk_of_next_functions(name: str) -> None:
    module, inputs = models.KINDS[name]()
    outputs = module(**inputs)
    assert_matches_independent_walk(capture(outputs, inputs=inputs, module=module), outputs, inputs)


# --- determinism ----------------------------------------------------------------------------------------
def exports(graph: AutogradGraph, path: Path) -> tuple[str, str, bytes]:
    graph.to_graphml(path)
    return graph.to_dot(), json.dumps(graph.to_dict(), sort_keys=True), path.read_bytes()


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_two_captures_of_fresh_identical_models_export_identically(name: str, tmp_path: Path) -> None:
    results = []
    for attempt in range(2):
        module, inputs = zoo_inputs(name)
        results.append(
            exports(
                capture(forward(module, inputs), inputs=inputs, module=module),
                tmp_path / f"{attempt}.graphml",
            )
        )
    assert results[0] == results[1]


@pytest.mark.parametrize("name", list(models.KINDS))
def test_two_traces_of_fresh_identical_small_models_export_identically(name: str, tmp_path: Path) -> None:
    results = []
    for attempt in range(2):
        module, inputs = models.KINDS[name]()
        _, graph = graphkit.trace(module, **inputs)
        results.append(exports(graph, tmp_path / f"{attempt}.graphml"))
    assert results[0] == results[1]


def test_ids_and_exports_do_not_depend_on_the_process_or_its_hash_seed(tmp_path: Path) -> None:
    """Node ids come from the walk order, never from ``id()`` or set order: a new process agrees."""
    script = (
        "import json, sys\n"
        "from graphkit import capture\n"
        "from graphkit.models import zoo\n"
        "module, inputs = zoo.build('gpt')\n"
        "graph = capture(module(*inputs), inputs=inputs, module=module)\n"
        "sys.stdout.write(graph.to_dot() + json.dumps(graph.to_dict(), sort_keys=True))\n"
    )
    module, inputs = zoo.build("gpt")
    graph = capture(module(*inputs), inputs=inputs, module=module)
    expected = graph.to_dot() + json.dumps(graph.to_dict(), sort_keys=True)
    for seed in ("1", "2"):
        environment = dict(
            os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(Path(graphkit.__file__).parents[1])
        )
        result = subprocess.run(
            [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True
        )
        assert result.stdout == expected


# --- deep graphs ----------------------------------------------------------------------------------------
def test_a_2000_step_recurrence_captures_without_recursion_error() -> None:
    module, inputs = models.recurrence(2000)
    outputs = module(**inputs)
    graph = capture(outputs, inputs=inputs, module=module)

    assert graph.number_of_nodes() == 2 * 2000 + 2
    assert graph.number_of_edges() == 3 * 2000
    assert Counter(name for _, name in graph.nodes(data="name")) == {
        "MmBackward0": 2000,
        "TanhBackward0": 2000,
        "AccumulateGrad": 2,
    }
    weight = graph.parameter_nodes()["weight"]
    assert graph.out_degree(weight) == 2000
    assert_matches_independent_walk(graph, outputs, inputs)
    assert len(graph.to_dot().splitlines()) == 3 + graph.number_of_nodes() + graph.number_of_edges() + 1


def test_a_256_layer_transformer_encoder_captures_without_recursion_error() -> None:
    module, inputs = models.transformer_encoder(256)
    outputs = module(**inputs)
    graph = capture(outputs, inputs=inputs, module=module)

    assert graph.number_of_nodes() > 13_000
    assert_matches_independent_walk(graph, outputs, inputs)
    assert len(graph.parameter_nodes()) == len(list(module.named_parameters())) == 256 * 12
    assert graph.graph["unused_params"] == []


# --- bad input ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (None, "the output is NoneType, not a tensor"),
        (3, "the output is int, not a tensor"),
        ("logits", "the output is str, not a tensor"),
        ([], "the output holds no tensor (got list)"),
        ({}, "the output holds no tensor (got dict)"),
        ({"loss": None, "step": 3}, "the output holds no tensor (got dict)"),
        (object(), "the output holds no tensor (got object)"),
        (torch.ones(2), "no output tensor requires grad (output)"),
        ({"a": torch.ones(2), "b": [torch.zeros(1)]}, "no output tensor requires grad (a, b.0)"),
    ],
)
def test_bad_outputs_raise_a_clear_error(outputs: Any, message: str) -> None:
    with pytest.raises(GraphkitInputError) as error:
        capture(outputs)
    assert message in str(error.value)
    assert "pass the tensor(s) the model returned" in str(error.value) or "torch.no_grad()" in str(
        error.value
    )


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_a_forward_without_grad_says_how_to_fix_it(context: Any) -> None:
    module, inputs = models.linear()
    with context():
        outputs = module(**inputs)
    with pytest.raises(
        GraphkitInputError, match=r"not under torch\.no_grad\(\) or torch\.inference_mode\(\)"
    ):
        capture(outputs, inputs=inputs, module=module)


def test_an_integer_output_has_no_grad_fn() -> None:
    module, inputs = models.linear()
    with pytest.raises(GraphkitInputError, match="no output tensor requires grad"):
        capture(module(**inputs).argmax(-1))


def test_gradient_edge_of_a_tensor_without_grad_says_how_to_fix_it() -> None:
    with pytest.raises(GraphkitInputError, match=r"requires_grad_\(\)"):
        gradient_edge(torch.ones(2))
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    assert gradient_edge(y).node is y.grad_fn
    assert (type(gradient_edge(x).node).__name__, gradient_edge(x).output_nr) == ("AccumulateGrad", 0)


# --- saved tensors ---------------------------------------------------------------------------------------
def test_addmm_saved_tensors_have_names_shapes_and_bytes() -> None:
    module, inputs = models.linear()
    graph = capture(module(**inputs), inputs=inputs, module=module)
    addmm = graph.nodes["n0"]
    assert addmm["saved_tensors"] == [
        {"name": "mat1", "shape": (2, 4), "dtype": "float32", "bytes": 2 * 4 * 4},
        {"name": "mat2", "shape": (4, 3), "dtype": "float32", "bytes": 4 * 3 * 4},
    ]
    assert addmm["saved_bytes"] == 80
    assert addmm["saved_reason"] is None
    assert graph.nodes["n3"]["saved_tensors"] == []  # TBackward0 saves nothing
    assert graph.nodes["n1"]["saved_bytes"] == 0  # a leaf saves nothing
    assert graph.graph["saved_bytes_total"] == 80


def test_saved_bytes_total_counts_a_tensor_saved_twice_once() -> None:
    module, inputs = models.square()
    graph = capture(module(**inputs), inputs=inputs, module=module)
    assert [entry["name"] for entry in graph.nodes["n0"]["saved_tensors"]] == ["other", "self"]
    assert graph.nodes["n0"]["saved_bytes"] == 2 * 3 * 4
    assert graph.graph["saved_bytes_total"] == 3 * 4


def test_custom_function_saved_tensors_are_named_by_position() -> None:
    module, inputs = models.custom_multi_output()
    graph = capture(module(**inputs), inputs=inputs, module=module)
    custom = next(data for _, data in graph.nodes(data=True) if data["is_custom_function"])
    assert custom["saved_tensors"] == [
        {"name": "saved_tensors[0]", "shape": (3, 4), "dtype": "float32", "bytes": 48},
        {"name": "saved_tensors[1]", "shape": (4,), "dtype": "float32", "bytes": 16},
    ]


def test_saved_tensors_are_none_with_a_reason_after_backward_freed_the_graph() -> None:
    module, inputs = models.linear()
    outputs = module(**inputs)
    outputs.sum().backward()
    graph = capture(outputs, inputs=inputs, module=module)

    addmm = graph.nodes["n0"]
    assert addmm["saved_tensors"] is None
    assert addmm["saved_bytes"] is None
    assert addmm["saved_reason"] == _autograd.FREED_GRAPH_REASON
    assert "retain_graph=True" in addmm["saved_reason"]
    assert graph.nodes["n3"]["saved_tensors"] == []  # nothing was saved, so nothing was freed
    assert edge_list(graph) == [
        ("n1", "n0", 0, 0),
        ("n2", "n0", 0, 1),
        ("n3", "n0", 0, 2),
        ("n4", "n3", 0, 0),
    ]
    assert addmm["shapes"] == [(2, 3)]


def test_checkpointed_saved_tensors_are_not_unpacked_so_the_forward_is_not_rerun() -> None:
    """Non-reentrant checkpointing packs saved tensors with hooks; unpacking them recomputes the block."""
    module, inputs = models.nested()
    calls = []

    def block(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return module.blocks[1](module.blocks[0](x))

    x = inputs["x"]
    hidden = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    graph = capture(hidden, inputs=x, module=module)
    assert len(calls) == 1

    relu = graph.nodes["n0"]
    assert relu["name"] == "ReluBackward0"
    assert (relu["saved_tensors"], relu["saved_bytes"]) == (None, None)
    assert relu["saved_reason"] == _autograd.HOOKED_SAVED_TENSORS_REASON
    assert graph.graph["saved_bytes_total"] == 0
    # The graph still works, and gives the gradient of the plain forward.
    (gradient,) = torch.autograd.grad(hidden.sum(), x)
    assert len(calls) == 2
    (expected,) = torch.autograd.grad(module.blocks[1](module.blocks[0](x)).sum(), x)
    torch.testing.assert_close(gradient, expected)


def test_saved_tensors_hooks_are_not_run_by_capture() -> None:
    unpacked = []

    def pack(tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        return ("offloaded", tensor.clone())

    def unpack(packed: tuple[str, torch.Tensor]) -> torch.Tensor:
        unpacked.append(packed[0])
        return packed[1]

    x = torch.randn(3, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = torch.tanh(x) * x
    graph = capture(y, inputs=x)
    assert unpacked == []
    assert [data["saved_reason"] for _, data in graph.nodes(data=True) if data["kind"] != "stage_input"] == [
        _autograd.HOOKED_SAVED_TENSORS_REASON,
        _autograd.HOOKED_SAVED_TENSORS_REASON,
    ]


def test_details_false_gives_the_structure_only() -> None:
    module, inputs = models.linear()
    graph = capture(module(**inputs), inputs=inputs, module=module, details=False)
    assert edge_list(graph) == [
        ("n1", "n0", 0, 0),
        ("n2", "n0", 0, 1),
        ("n3", "n0", 0, 2),
        ("n4", "n3", 0, 0),
    ]
    assert "saved_tensors" not in graph.nodes["n0"]
    assert "shapes" not in graph.nodes["n0"]
    assert graph.graph["saved_bytes_total"] is None


# --- exports ---------------------------------------------------------------------------------------------
def test_graphml_reads_back_with_networkx(tmp_path: Path) -> None:
    module, inputs = models.chunk_pair()
    graph = capture(module(**inputs), inputs=inputs, module=module)
    path = tmp_path / "graph.graphml"
    graph.to_graphml(path)
    read = nx.read_graphml(path, force_multigraph=True)

    assert sorted(read.nodes) == sorted(graph.nodes)
    assert sorted(
        (producer, consumer, data["output_nr"], data["input_nr"])
        for producer, consumer, data in read.edges(data=True)
    ) == edge_list(graph)
    split = read.nodes["n3"]
    assert (split["name"], split["op"], split["kind"], split["num_outputs"]) == (
        "SplitBackward0",
        "split",
        "op",
        2,
    )
    assert json.loads(split["shapes"]) == [[2, 2], [2, 2]]
    assert json.loads(read.nodes["n4"]["input_names"]) == ["x"]
    assert json.loads(read.graph["inputs"]) == [{"name": "x", "node": "n4", "output_nr": 0}]


def test_json_is_node_link_data_with_nodes_and_edges() -> None:
    module, inputs = models.linear()
    graph = capture(module(**inputs), inputs=inputs, module=module)
    data = graph.to_dict()
    assert json.loads(json.dumps(data)) == data  # plain JSON values only
    text = graph.to_json()  # an export: JSON text, as networkx users expect of to_json
    assert isinstance(text, str) and json.loads(text) == data
    assert json.loads(graph.to_json(indent=1)) == data and "\n" in graph.to_json(indent=1)

    assert [node["id"] for node in data["nodes"]] == ["n0", "n1", "n2", "n3", "n4"]
    assert data["nodes"][1]["kind"] == "parameter"
    assert data["nodes"][1]["param_names"] == ["bias"]
    assert data["nodes"][0]["shapes"] == [[2, 3]]
    assert sorted(
        (edge["source"], edge["target"], edge["output_nr"], edge["input_nr"]) for edge in data["edges"]
    ) == edge_list(graph)
    assert data["directed"] is True and data["multigraph"] is True
    assert data["graph"]["outputs"] == [{"name": "output", "node": "n0", "output_nr": 0}]
    rebuilt = nx.node_link_graph(data, edges="edges")
    assert rebuilt.number_of_edges() == graph.number_of_edges()


def test_dot_lists_every_node_and_edge_and_renders_with_graphviz() -> None:
    module, inputs = models.square()
    graph = capture(module(**inputs), inputs=inputs, module=module)
    assert graph.to_dot() == (
        "digraph autograd {\n"
        "  rankdir=BT;\n"
        '  node [shape=box, fontname="Helvetica"];\n'
        '  n0 [label="mul\\n(3)", kind="stage_output"];\n'
        '  n1 [label="accumulate_grad\\n(3)", kind="stage_input"];\n'
        "  n1 -> n0 [output_nr=0, input_nr=0];\n"
        "  n1 -> n0 [output_nr=0, input_nr=1];\n"
        "}\n"
    )
    if shutil.which("dot") is None:
        pytest.skip("the graphviz `dot` binary is not installed")
    module, inputs = models.linear()
    dot = capture(module(**inputs), inputs=inputs, module=module).to_dot()
    plain = subprocess.run(["dot", "-Tplain"], input=dot, text=True, capture_output=True, check=True).stdout
    lines = plain.splitlines()
    assert sum(line.startswith("node ") for line in lines) == 5
    assert sum(line.startswith("edge ") for line in lines) == 4


def test_summary_counts_nodes_edges_parameters_and_kinds() -> None:
    module, inputs = models.param_only_output()
    graph = capture(module(**inputs), inputs=inputs, module=module)
    assert graph.summary() == {
        "nodes": 7,
        "edges": 5,
        "parameters": 3,
        "kinds": {"op": 1, "parameter": 3, "stage_input": 1, "stage_output": 2},
        "inputs": ["x"],
        "outputs": ["hidden", "temperature"],
        "unused_params": [],
        "saved_bytes_total": graph.graph["saved_bytes_total"],
        "skipped_outputs": [],
    }
    # addmm saves x (3 x 4) and weight.t() (4 x 4); exp saves its result (a scalar): 48 + 64 + 4 bytes.
    assert graph.graph["saved_bytes_total"] == 48 + 64 + 4


# --- nested and mapping outputs -------------------------------------------------------------------------
class Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


def test_nested_outputs_are_named_by_their_path() -> None:
    x = torch.randn(3, requires_grad=True)
    outputs = {"logits": x * 2, "extra": [None, Pair(x.exp(), torch.zeros(1))], "step": 3}
    graph = capture(outputs, inputs={"x": x})
    assert [endpoint.name for endpoint in graph.outputs] == ["logits", "extra.1.0"]
    assert [graph.nodes[endpoint.node]["name"] for endpoint in graph.outputs] == [
        "MulBackward0",
        "ExpBackward0",
    ]


def test_hugging_face_model_output_is_a_mapping_of_named_outputs() -> None:
    modeling_outputs = pytest.importorskip("transformers.modeling_outputs")
    x = torch.randn(2, 3, requires_grad=True)
    hidden = [torch.tanh(x), torch.sigmoid(x)]
    output = modeling_outputs.CausalLMOutput(loss=None, logits=hidden[1] * 2, hidden_states=tuple(hidden))
    assert isinstance(output, Mapping)
    graph = capture(output, inputs=x)
    assert [endpoint.name for endpoint in graph.outputs] == ["logits", "hidden_states.0", "hidden_states.1"]
    assert [graph.nodes[endpoint.node]["name"] for endpoint in graph.outputs] == [
        "MulBackward0",
        "TanhBackward0",
        "SigmoidBackward0",
    ]
    sigmoid = graph.outputs[2].node
    assert graph.nodes[sigmoid]["output_names"] == ["hidden_states.1"]
    assert graph.nodes[sigmoid]["kind"] == NodeKind.STAGE_OUTPUT


def test_one_node_behind_two_outputs_lists_both_names() -> None:
    module, inputs = models.linear()
    first, second = module(**inputs).chunk(2, dim=0)  # two outputs of one SplitBackward0, output_nr 0 and 1
    graph = capture({"first": first, "second": second}, inputs=inputs, module=module)
    assert graph.outputs == [GraphEndpoint("first", "n0", 0), GraphEndpoint("second", "n0", 1)]
    assert graph.nodes["n0"]["output_names"] == ["first", "second"]
