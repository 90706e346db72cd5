"""Parameter groups on every known-hard kind of graph, against hand-written answers and a brute-force oracle."""

from __future__ import annotations

import json
import random
from typing import Any

import models
import pytest
import torch
from torch import nn
from torch_versions import LINEAR_3D_OUTPUT_NODE

import graphkit
from graphkit.analysis.closures import (
    WeightSideEdge,
    input_closure,
    intermediates,
    parameter_closure,
    reverse_adjacency,
    weight_leaves,
    weight_only_nodes,
    weight_only_subgraph,
)
from graphkit.analysis.parameter_groups import GroupFlag, ParamGroups, param_groups
from graphkit.graph.autograd_graph import AutogradGraph, capture
from graphkit.models import zoo

SHARED = GroupFlag.SHARED_PARAMETER
MULTI_OUTPUT = GroupFlag.MULTI_OUTPUT_INTERMEDIATE
PARAMETER_ONLY = GroupFlag.PARAMETER_ONLY_OUTPUT
CUSTOM = GroupFlag.CUSTOM_FUNCTION


def build(kind: str, **options: Any) -> tuple[nn.Module, dict[str, Any], Any, AutogradGraph, ParamGroups]:
    module, inputs = getattr(models, kind)(**options)
    outputs = module(**inputs)
    graph = capture(outputs, inputs=inputs, module=module)
    return module, inputs, outputs, graph, param_groups(graph)


def summary(
    graph: AutogradGraph, groups: ParamGroups
) -> list[tuple[tuple[str, ...], list[str], tuple[str, ...]]]:
    """``[(parameter names, intermediate ops, flags)]`` per group, in group order."""
    return [
        (group.params, [graph.nodes[node]["op"] for node in group.intermediates], tuple(group.flags))
        for group in groups
    ]


def node_of(graph: AutogradGraph, autograd_node: Any) -> str:
    """The id of a live autograd Node in ``graph``."""
    return next(node for node, live in graph.autograd_nodes.items() if live is autograd_node)


def zoo_model(name: str) -> tuple[nn.Module, dict[str, Any], Any]:
    module, inputs = zoo.build(name)
    if isinstance(inputs, tuple):
        outputs = module(*inputs)
        inputs = {str(position): value for position, value in enumerate(inputs)}
    else:
        outputs = module(**inputs)
    return module, inputs, outputs


# --- the known-hard kinds, by hand ----------------------------------------------------------------------
@pytest.mark.parametrize("shared_first", [False, True])
def test_a_shared_parameter_registered_after_the_layers_forms_its_own_group(shared_first: bool) -> None:
    module, _, outputs, graph, groups = build("shared_late", shared_first=shared_first)
    names = [name for name, _ in module.named_parameters()]
    assert names.index("shared.scale") == (0 if shared_first else 4)

    # forward order: first layer, the scale after it, the second layer, the scale again
    assert summary(graph, groups) == [
        (("first.bias", "first.weight"), ["addmm"], ()),
        (("shared.scale",), ["mul", "mul"], (SHARED,)),
        (("second.bias", "second.weight"), ["addmm"], ()),
    ]
    scale = groups[1]
    outer_mul = outputs.grad_fn
    inner_mul = outer_mul.next_functions[0][0].next_functions[1][0].next_functions[0][0]
    assert type(inner_mul).__name__ == "MulBackward0"
    assert set(scale.intermediates) == {node_of(graph, outer_mul), node_of(graph, inner_mul)}
    assert scale.shared_params == ("shared.scale",)
    leaf = graph.parameter_nodes()["shared.scale"]
    assert scale.weight_side_edges == {node: (WeightSideEdge(1, leaf, 0),) for node in scale.intermediates}
    assert [group.index for group in groups] == [0, 1, 2]


def test_a_parameter_only_output_is_the_entry_of_its_own_group() -> None:
    _, _, outputs, graph, groups = build("param_only_output")
    assert summary(graph, groups) == [
        (("linear.bias", "linear.weight"), ["addmm"], ()),
        (("log_temperature",), [], (PARAMETER_ONLY,)),
    ]
    temperature = groups[1]
    assert [entry.name for entry in temperature.output_entries] == ["temperature"]
    assert temperature.output_entries[0].node == node_of(graph, outputs["temperature"].grad_fn)
    assert [graph.nodes[node]["op"] for node in temperature.weight_only_nodes] == ["exp"]
    assert groups[0].output_entries == ()


def test_a_multi_output_custom_function_is_flagged_twice() -> None:
    _, _, outputs, graph, groups = build("custom_multi_output")
    assert summary(graph, groups) == [(("weight",), ["ScaleAndShift"], (MULTI_OUTPUT, CUSTOM))]
    custom = groups[0].intermediates[0]
    assert groups.intermediates[custom].num_outputs == 2
    assert groups.intermediates[custom].is_custom_function
    assert groups[0].weight_side_edges[custom] == (WeightSideEdge(1, graph.parameter_nodes()["weight"], 0),)
    assert outputs.grad_fn.next_functions[0][0] is graph.autograd_nodes[custom]


def test_an_lstm_returning_out_h_c_has_one_three_output_intermediate() -> None:
    _, _, outputs, graph, groups = build("lstm")
    assert [group.params for group in groups] == [
        ("lstm.bias_hh_l0", "lstm.bias_ih_l0", "lstm.weight_hh_l0", "lstm.weight_ih_l0")
    ]
    assert groups[0].flags == (MULTI_OUTPUT,)
    (kernel,) = groups[0].intermediates
    # The one intermediate is the node all three outputs come from, through output_nr 0, 1 and 2.
    producers = {(graph.autograd_nodes[endpoint.node].next_functions[0]) for endpoint in graph.outputs}
    assert {(node_of(graph, node), output_nr) for node, output_nr in producers} == {
        (kernel, 0),
        (kernel, 1),
        (kernel, 2),
    }
    assert graph.nodes[kernel]["num_outputs"] == 3
    parameters = graph.parameter_nodes()
    assert groups[0].weight_side_edges[kernel] == tuple(
        WeightSideEdge(input_nr, parameters[name], 0)
        for input_nr, name in enumerate(
            ["lstm.weight_ih_l0", "lstm.weight_hh_l0", "lstm.bias_ih_l0", "lstm.bias_hh_l0"], start=1
        )
    )


def test_one_weight_used_three_times_in_a_chain_has_three_intermediates() -> None:
    _, _, outputs, graph, groups = build("chain")
    assert summary(graph, groups) == [(("weight",), ["mm", "mm", "mm"], (SHARED,))]
    expected = []
    node = outputs.grad_fn
    while node is not None and type(node).__name__ != "AccumulateGrad":
        if type(node).__name__ == "MmBackward0":
            expected.append(node_of(graph, node))
        node = node.next_functions[0][0]
    assert sorted(groups[0].intermediates) == sorted(expected)
    leaf = graph.parameter_nodes()["weight"]
    assert all(edges == (WeightSideEdge(1, leaf, 0),) for edges in groups[0].weight_side_edges.values())


def test_view_outputs_leave_the_group_at_the_addmm() -> None:
    _, _, outputs, graph, groups = build("view_outputs")
    assert summary(graph, groups) == [(("linear.bias", "linear.weight"), ["addmm"], ())]
    assert [graph.nodes[endpoint.node]["name"] for endpoint in graph.outputs] == [
        LINEAR_3D_OUTPUT_NODE,
        "TransposeBackward0",
    ]
    assert graph.autograd_nodes[groups[0].intermediates[0]] is outputs[0].grad_fn.next_functions[0][0]


def test_integer_and_no_grad_inputs_make_an_empty_input_closure() -> None:
    _, _, _, graph, groups = build("integer_inputs")
    assert graph.inputs == []
    assert input_closure(graph) == set()
    assert intermediates(graph) == {}
    assert summary(graph, groups) == [
        (("embedding.weight", "proj.bias", "proj.weight"), [], (PARAMETER_ONLY,))
    ]
    assert [entry.name for entry in groups[0].output_entries] == ["output"]
    # Every node of the graph is weight-only: the whole backward is the W phase.
    assert weight_only_nodes(graph) == set(graph.nodes)


def test_a_detached_branch_joins_the_input_path_at_the_add() -> None:
    _, _, outputs, graph, groups = build("detached_branch")
    assert summary(graph, groups) == [
        (("main.bias", "main.weight"), ["addmm"], ()),
        (("side.bias", "side.weight"), ["add"], ()),
    ]
    side = groups[1]
    assert side.intermediates == (node_of(graph, outputs.grad_fn),)
    assert sorted(graph.nodes[node]["op"] for node in side.weight_only_nodes) == ["addmm", "t"]
    side_addmm = node_of(graph, outputs.grad_fn.next_functions[1][0])
    assert side.weight_side_edges[side.intermediates[0]] == (WeightSideEdge(1, side_addmm, 0),)


def test_an_in_place_op_on_the_input_path_is_the_intermediate_of_its_parameter() -> None:
    _, _, outputs, graph, groups = build("in_place")
    assert summary(graph, groups) == [
        (("first.bias", "first.weight"), ["addmm"], ()),
        (("gain",), ["mul"], ()),
        (("second.bias", "second.weight"), ["addmm"], ()),
    ]
    in_place_mul = outputs.grad_fn.next_functions[1][0]
    assert groups[1].intermediates == (node_of(graph, in_place_mul),)


def test_a_weight_only_chain_reaches_the_input_path_at_the_addmm() -> None:
    _, _, outputs, graph, groups = build("weight_norm")
    assert summary(graph, groups) == [(("bias", "weight"), ["addmm"], ())]
    assert sorted(graph.nodes[node]["op"] for node in groups[0].weight_only_nodes) == [
        "div",
        "linalg_vector_norm",
        "t",
    ]
    addmm = node_of(graph, outputs.grad_fn)
    transpose = node_of(graph, outputs.grad_fn.next_functions[2][0])
    bias = graph.parameter_nodes()["bias"]
    assert groups[0].weight_side_edges == {
        addmm: (WeightSideEdge(0, bias, 0), WeightSideEdge(2, transpose, 0))
    }


def test_closures_of_the_weight_norm_graph() -> None:
    _, inputs, outputs, graph, _ = build("weight_norm")
    by_op = {
        graph.nodes[node]["op"]
        + (
            "" if graph.nodes[node]["kind"] != "parameter" else ":" + graph.nodes[node]["param_names"][0]
        ): node
        for node in graph.nodes
    }
    x = graph.inputs[0].node
    assert input_closure(graph) == {x, by_op["addmm"]}
    assert parameter_closure(graph) == {
        by_op[key]
        for key in (
            "accumulate_grad:weight",
            "accumulate_grad:bias",
            "linalg_vector_norm",
            "div",
            "t",
            "addmm",
        )
    }
    assert weight_only_nodes(graph) == parameter_closure(graph) - {by_op["addmm"]}
    assert set(weight_only_subgraph(graph).nodes) == weight_only_nodes(graph)
    assert sorted(weight_leaves(graph)) == sorted(
        [by_op["accumulate_grad:weight"], by_op["accumulate_grad:bias"]]
    )
    found = intermediates(graph)
    assert list(found) == [by_op["addmm"]]
    assert found[by_op["addmm"]].num_outputs == 1
    assert not found[by_op["addmm"]].is_custom_function
    consumers = reverse_adjacency(graph)
    assert sorted(consumers[by_op["accumulate_grad:weight"]]) == sorted(
        [by_op["div"], by_op["linalg_vector_norm"]]
    )
    assert consumers[by_op["addmm"]] == []


def test_a_chunked_weight_feeds_two_intermediates_through_output_nr_0_and_1() -> None:
    weight = nn.Parameter(torch.randn(4, 4))
    module = nn.Module()
    module.weight = weight
    x = torch.randn(3, 4, requires_grad=True)
    first, second = weight.chunk(2, dim=1)
    outputs = (x @ first) * torch.tanh(x @ second)
    graph = capture(outputs, inputs=x, module=module)
    groups = param_groups(graph)

    assert summary(graph, groups) == [(("weight",), ["mm", "mm"], (SHARED,))]
    split = node_of(graph, outputs.grad_fn.next_functions[0][0].next_functions[1][0])
    assert graph.nodes[split]["name"] == "SplitBackward0"
    assert sorted(groups[0].weight_side_edges.values(), key=lambda edges: edges[0].target_output_nr) == [
        (WeightSideEdge(1, split, 0),),
        (WeightSideEdge(1, split, 1),),
    ]
    assert groups[0].weight_only_nodes == (split,)


def test_unnamed_leaves_and_unused_parameters() -> None:
    x = torch.randn(3, requires_grad=True)
    scale = torch.randn(3, requires_grad=True)
    graph = capture(x * scale, inputs={"x": x})
    groups = param_groups(graph)
    leaf = graph.nodes_of_kind("leaf")[0]
    assert [group.params for group in groups] == [(f"<leaf {leaf}>",)]
    assert groups.unused_params == []

    module = nn.ModuleDict({"used": nn.Linear(3, 3), "unused": nn.Linear(3, 3)})
    graph = capture(module["used"](x), inputs=x, module=module)
    groups = param_groups(graph)
    assert [group.params for group in groups] == [("used.bias", "used.weight")]
    assert groups.unused_params == ["unused.weight", "unused.bias"]


def test_a_2000_step_recurrence_is_one_group_with_2000_intermediates() -> None:
    _, _, _, graph, groups = build("recurrence", steps=2000)
    assert len(groups) == 1
    assert groups[0].params == ("weight",)
    assert len(groups[0].intermediates) == 2000
    assert {graph.nodes[node]["name"] for node in groups[0].intermediates} == {"MmBackward0"}
    assert groups[0].flags == (SHARED,)


# --- partition properties -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_zoo_groups_agree_with_full_backward_and_brute_force(name: str) -> None:
    models.check_param_groups(*zoo_model(name))


@pytest.mark.parametrize("name", list(models.KINDS))
def test_small_model_groups_agree_with_full_backward_and_brute_force(name: str) -> None:
    module, inputs = models.KINDS[name]()
    models.check_param_groups(module, inputs, module(**inputs))


def test_two_layer_transformer_encoder_groups_agree_with_brute_force() -> None:
    module, inputs = models.transformer_encoder(2)
    groups = models.check_param_groups(module, inputs, module(**inputs))
    assert len(groups) > 2


@pytest.mark.parametrize("name", [*zoo.MODELS, *(f"models:{kind}" for kind in models.KINDS)])
def test_shuffled_parameter_registration_gives_the_same_partition(name: str) -> None:
    def groups_of(shuffle_seed: int | None) -> tuple[list[str], set[frozenset[str]]]:
        if name.startswith("models:"):
            module, inputs = models.KINDS[name.removeprefix("models:")]()
            outputs = None
        else:
            module, inputs, outputs = zoo_model(name)
        if shuffle_seed is not None:
            models.reregister(module, random.Random(shuffle_seed))
        arguments = list(inputs.values()) if all(key.isdigit() for key in inputs) else None
        outputs = module(*arguments) if arguments is not None else module(**inputs)
        groups = param_groups(capture(outputs, inputs=inputs, module=module))
        names = [parameter for parameter, _ in module.named_parameters(remove_duplicate=False)]
        return names, models.partition(groups)

    order, expected = groups_of(None)
    for seed in range(3):
        shuffled_order, shuffled = groups_of(seed)
        assert sorted(shuffled_order) == sorted(order)
        assert shuffled == expected
    if len(order) > 2:
        assert any(groups_of(seed)[0] != order for seed in range(3)), "the shuffle changed nothing"


def test_random_models_agree_with_the_oracles_on_fixed_seeds() -> None:
    """A fixed sample of :func:`models.random_model` (the hypothesis test explores further)."""
    for seed in range(40):
        module, inputs = models.random_model(seed)
        models.check_param_groups(module, inputs, module(**inputs))


# --- presentation ---------------------------------------------------------------------------------------
def test_to_dict_is_the_json_form() -> None:
    _, _, _, graph, groups = build("param_only_output")
    data = groups.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert [(group["params"], group["flags"]) for group in data["groups"]] == [
        (["linear.bias", "linear.weight"], []),
        (["log_temperature"], ["parameter-only-output"]),
    ]
    assert data["groups"][1]["output_entries"] == ["temperature"]
    assert data["groups"][0]["intermediates"] == list(groups[0].intermediates)
    addmm = groups[0].intermediates[0]
    assert data["groups"][0]["weight_side_edges"][addmm] == [
        {"input_nr": edge.input_nr, "target": edge.target, "target_output_nr": 0}
        for edge in groups[0].weight_side_edges[addmm]
    ]
    assert data["unused_params"] == []


def test_repr_is_a_table_and_html_escapes() -> None:
    _, _, _, graph, groups = build("shared_late")
    lines = repr(groups).splitlines()
    assert lines[0].split() == ["group", "parameters", "intermediates", "flags"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[3].split()[:2] == ["1", "shared.scale"]
    assert lines[3].split()[-1] == "shared-parameter"
    html = groups._repr_html_()
    assert html.count("<tr>") == 1 + len(groups)
    assert "<td>first.bias, first.weight</td>" in html

    module = nn.ModuleDict({"used": nn.Linear(3, 3), "unused<b>": nn.Linear(3, 3)})
    x = torch.randn(2, 3, requires_grad=True)
    groups = param_groups(capture(module["used"](x), inputs=x, module=module))
    assert "unused&lt;b&gt;.weight" in groups._repr_html_()
    assert repr(groups).splitlines()[-1] == "unused parameters: unused<b>.weight, unused<b>.bias"


def test_node_group_maps_every_coloured_node_to_its_group() -> None:
    _, _, _, graph, groups = build("detached_branch")
    for group in groups:
        for node in group.nodes():
            assert groups.node_group[node] == group.index
    assert set(groups.node_group) == {node for group in groups for node in group.nodes()}


def test_group_list_displays_as_a_table_and_the_diagram_in_jupyter():
    module, inputs = zoo.build("shared_late")
    _, graph = graphkit.trace(module, *inputs)
    groups = graphkit.param_groups(graph)
    bundle = groups._repr_mimebundle_()
    table = bundle["text/html"][: bundle["text/html"].index("</table>")]
    assert table.count("<tr>") == len(groups) + 1  # header row and one row per group
    assert bundle["image/svg+xml"].count('class="cluster') == len(groups)
    assert "<svg" in bundle["text/html"] and "shared.scale" in bundle["text/html"]
