"""The notebook explorer: node roles, panels, and the ipywidgets app driven from code.

The SVG the explorer shows is parsed as XML; group membership is checked against facts derived by hand
from the models' structure (``zoo.mlp`` is ``Linear(16, 32), GELU, Linear(32, 8)``), saved tensors against
the live autograd Nodes' ``_saved_*`` attributes.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree

import pytest
import torch

import graphkit
from graphkit.analysis.node_roles import ROLES, node_role
from graphkit.analysis.parameter_groups import FLAG_MEANINGS
from graphkit.apps.explorer import explore
from graphkit.apps.panels import group_html, node_html
from graphkit.models import zoo

pytest.importorskip("ipywidgets")

SVG = "{http://www.w3.org/2000/svg}"


def traced(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], graphkit.AutogradGraph]:
    module, inputs = zoo.build(name)
    _, graph = graphkit.trace(module, *inputs)
    return module, inputs, graph


def svg_groups(svg: str) -> list[tuple[str, set[str], ElementTree.Element]]:
    """``(title, classes, element)`` of every node and cluster ``<g>`` of a graphviz SVG."""
    root = ElementTree.fromstring(svg)
    found = []
    for element in root.iter(f"{SVG}g"):
        classes = set((element.get("class") or "").split())
        if "node" in classes or "cluster" in classes:
            title = element.find(f"{SVG}title")
            found.append((title.text if title is not None else "", classes, element))
    return found


def svg_text(svg: str) -> list[str]:
    root = ElementTree.fromstring(svg)
    return [element.text or "" for element in root.iter(f"{SVG}text")]


def role_of(graph: graphkit.AutogradGraph, groups: list, node: str) -> tuple[str, int | None]:
    role = node_role(graph, groups, node)
    return role.role, role.group


def node_by(graph: graphkit.AutogradGraph, **attributes: object) -> str:
    (node,) = [
        node for node, data in graph.nodes(data=True) if all(data.get(k) == v for k, v in attributes.items())
    ]
    return node


# --- roles, without widgets ------------------------------------------------------------------------------
def test_node_roles_of_a_two_layer_perceptron_match_its_structure() -> None:
    _, _, graph = traced("mlp")
    groups = graphkit.param_groups(graph)
    first = next(group.index for group in groups if "0.weight" in group.params)
    second = next(group.index for group in groups if "2.weight" in group.params)
    assert first != second

    weight = node_by(graph, param_names=["0.weight"])
    bias = node_by(graph, param_names=["0.bias"])
    (transpose,) = list(graph.successors(weight))  # Linear uses weight.t()
    (first_addmm,) = list(graph.successors(transpose))
    gelu = node_by(graph, op="gelu")
    (stage_input,) = graph.nodes_of_kind("stage_input")

    assert graph.nodes[transpose]["op"] == "t" and graph.nodes[first_addmm]["op"] == "addmm"
    assert role_of(graph, groups, weight) == ("parameter leaf", first)
    assert role_of(graph, groups, bias) == ("parameter leaf", first)
    assert role_of(graph, groups, transpose) == ("weight-only", first)
    role = node_role(graph, groups, first_addmm)
    assert (role.role, role.group) == ("intermediate", first)
    assert f"next_functions[2] \u2192 t ({transpose})" in role.reason  # addmm(bias, x, weight.t())
    assert f"next_functions[0] \u2192 0.bias ({bias})" in role.reason
    assert role_of(graph, groups, gelu) == ("input path", None)
    assert role_of(graph, groups, stage_input) == ("stage input", None)
    second_addmm = node_by(graph, op="addmm", kind="stage_output")
    assert role_of(graph, groups, second_addmm) == ("intermediate", second)
    assert {node_role(graph, groups, node).role for node in graph.nodes} <= set(ROLES)


def test_a_parameter_only_output_is_weight_only_and_says_it_is_an_output() -> None:
    _, _, graph = traced("param_only_output")
    groups = graphkit.param_groups(graph)
    scale = node_by(graph, param_names=["logit_scale"])
    (exp,) = list(graph.successors(scale))
    assert graph.nodes[exp]["op"] == "exp"
    role = node_role(graph, groups, exp)
    assert role.role == "weight-only"
    assert groups[role.group].params == ("logit_scale",)
    panel = node_html(graph, groups, exp)
    assert "stage output" in panel and "logit_scale" in panel


def test_node_panel_lists_saved_tensors_from_the_autograd_node() -> None:
    _, _, graph = traced("gpt_stage")
    groups = graphkit.param_groups(graph)
    node = node_by(graph, op="addmm", module_path="blocks.0.attn.proj")
    live = graph.autograd_nodes[node]
    mat1, mat2 = live._saved_mat1, live._saved_mat2  # the oracle: PyTorch's own saved tensors
    panel = node_html(graph, groups, node)
    for name, tensor in (("mat1", mat1), ("mat2", mat2)):
        shape = "(" + ", ".join(str(size) for size in tensor.shape) + ")"
        assert f">{name}<" in panel and f">{shape}<" in panel
        assert f">{tensor.numel() * tensor.element_size():,} B<" in panel
    total = (mat1.numel() + mat2.numel()) * 4
    assert f"({total:,} B)" in panel
    assert "blocks.0.attn.proj" in panel and "AddmmBackward0" in panel
    assert "group" in panel and "intermediate" in panel


def test_group_panel_explains_a_shared_parameter() -> None:
    _, _, graph = traced("shared_late")
    groups = graphkit.param_groups(graph)
    (shared,) = [group for group in groups if group.params == ("shared.scale",)]
    panel = group_html(graph, shared)
    assert "shared-parameter" in panel and FLAG_MEANINGS["shared-parameter"] in panel
    assert len(shared.intermediates) == 2
    for node in shared.intermediates:
        assert f"({node})" in panel


# --- the app ---------------------------------------------------------------------------------------------
def test_explore_without_ipywidgets_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, graph = traced("mlp")
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'graphkit\[notebook\]'"):
        explore(graph)


def test_picking_a_group_highlights_its_cluster_and_fades_the_others() -> None:
    module, inputs, graph = traced("gpt_stage")
    explorer = explore(graph)
    groups = explorer.groups
    assert [value for _, value in explorer.group_picker.options] == [None, *range(len(groups))]

    clusters = [
        (classes, element) for _, classes, element in svg_groups(explorer.svg) if "cluster" in classes
    ]
    assert len(clusters) == len(groups)
    assert not any({"graphkit-highlight", "graphkit-faded"} & classes for classes, _ in clusters)

    explorer.group_picker.value = 4  # as a click in the dropdown does
    highlighted, faded = [], []
    for classes, element in [(c, e) for _, c, e in svg_groups(explorer.svg) if "cluster" in c]:
        index = int(element.get("id").rsplit("-", 1)[1])
        assert f"graphkit-group-{index}" in classes
        (highlighted if "graphkit-highlight" in classes else faded).append((index, element))
        assert ("graphkit-highlight" in classes) != ("graphkit-faded" in classes)
    assert [index for index, _ in highlighted] == [4]
    assert sorted(index for index, _ in faded) == [index for index in range(len(groups)) if index != 4]
    fill = {index: element.find(f"{SVG}path").get("fill") for index, element in highlighted + faded}
    assert len({fill[index] for index, _ in faded}) == 1 and fill[4] not in {fill[i] for i, _ in faded}
    for name in groups[4].params:
        assert name in explorer.info_panel.value
    assert "group 4 highlighted" in explorer.status.value

    explorer.select_group(None)
    assert not any(
        {"graphkit-highlight", "graphkit-faded"} & classes for _, classes, _ in svg_groups(explorer.svg)
    )


def test_picking_a_node_outlines_it_and_fills_the_detail_panel() -> None:
    _, _, graph = traced("gpt_stage")
    explorer = explore(graph)
    node = node_by(graph, op="addmm", module_path="blocks.0.attn.proj")
    labels = list(explorer.node_search.options)
    assert len(labels) == graph.number_of_nodes()
    assert all(label.startswith(f"{node} \u00b7 ") for node, label in zip(graph.nodes, labels, strict=True))
    (label,) = [label for label in labels if label.startswith(f"{node} \u00b7 ")]
    assert "intermediate" in label and "blocks.0.attn.proj" in label

    explorer.node_search.value = label  # as picking it from the suggestions does
    assert explorer.selected_node == node
    selected = [title for title, classes, _ in svg_groups(explorer.svg) if "graphkit-selected" in classes]
    assert selected == [node]
    assert explorer.node_panel.value == node_html(graph, explorer.groups, node)

    explorer.collapse_slider.value = 2  # the node now lives inside the drawn module "blocks.0"
    selected = [title for title, classes, _ in svg_groups(explorer.svg) if "graphkit-selected" in classes]
    assert selected == ["module.blocks.0"]

    explorer.select_node(None)
    assert explorer.node_panel.value == ""
    assert not any("graphkit-selected" in classes for _, classes, _ in svg_groups(explorer.svg))


def test_collapse_slider_draws_modules_as_single_nodes() -> None:
    _, _, graph = traced("gpt_stage")
    explorer = explore(graph)
    assert explorer.collapse_slider.value == 0  # 125 nodes fit the default budget of 400
    assert explorer.collapse_slider.max == 4  # blocks.0.attn.qkv

    titles = {title for title, classes, _ in svg_groups(explorer.svg) if "node" in classes}
    assert set(graph.nodes) <= titles
    assert not any(title.startswith("module.") for title in titles)

    explorer.collapse_slider.value = 1
    titles = {title for title, classes, _ in svg_groups(explorer.svg) if "node" in classes}
    (stage_input,) = graph.nodes_of_kind("stage_input")
    assert "module.blocks" in titles and stage_input in titles
    assert not set(graph.nodes) - {stage_input} & titles
    assert explorer.draw_options()["collapse_depth"] == 1


def test_collapse_starts_at_the_depth_that_fits_max_nodes() -> None:
    _, _, graph = traced("gpt_stage")
    explorer = explore(graph, max_nodes=60)
    assert explorer.collapse_slider.value >= 1
    titles = {title for title, classes, _ in svg_groups(explorer.svg) if "node" in classes}
    assert len(titles - {"legend"}) <= 60


def test_label_toggles_add_and_remove_label_lines() -> None:
    _, (hidden,), graph = traced("gpt_stage")
    explorer = explore(graph)
    shape = "(" + ", ".join(str(size) for size in hidden.shape) + ")"
    assert shape in svg_text(explorer.svg)
    assert not any(text.startswith("saved ") for text in svg_text(explorer.svg))
    assert "blocks.0.attn.proj" not in svg_text(explorer.svg)

    explorer.saved_toggle.value = True
    explorer.module_toggle.value = True
    explorer.shapes_toggle.value = False
    texts = svg_text(explorer.svg)
    assert any(text.startswith("saved ") for text in texts)
    assert "blocks.0.attn.proj" in texts
    assert shape not in texts


def test_verify_button_shows_the_error_table() -> None:
    explorer = explore("zoo:mlp")
    assert not explorer.verify_button.disabled
    module = explorer.module
    explorer.verify_button.click()
    report = explorer.report
    assert report is not None and report.ok
    panel = explorer.verify_panel.value
    assert "<b>OK</b>" in panel
    names = [name for name, _ in module.named_parameters()]
    assert [check.name for check in report.params] == names
    for name in names:
        assert f"<td>{name}</td>" in panel
    assert panel.count("<tr>") == 1 + len(names) + 1  # header, parameters, the stage input
    assert all(parameter.grad is None for parameter in module.parameters())  # verify works on a copy
    assert not explorer.verify_button.disabled and explorer.verify_button.description == "verify split"


def test_verify_is_disabled_without_a_module() -> None:
    _, _, graph = traced("mlp")
    explorer = explore(graph)
    assert explorer.verify_button.disabled
    with pytest.raises(ValueError, match="needs the module and its inputs"):
        explorer.verify()


def test_explore_accepts_a_module_and_inputs_in_every_form() -> None:
    module, (x,), graph = traced("mlp")
    for given in [(module, (x,)), (module, x)]:
        explorer = explore(given)
        assert explorer.graph.number_of_nodes() == graph.number_of_nodes()
        assert not explorer.verify_button.disabled
    explorer = explore(graph, module=module, inputs=(x,))
    assert explorer.verify().ok


def test_explore_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match="AutogradGraph"):
        explore(torch.zeros(3))


def test_explorer_displays_as_a_widget() -> None:
    explorer = explore("zoo:mlp")
    bundle = explorer._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.app.model_id
    classes = set(explorer.app._dom_classes)
    assert "graphkit-explorer" in classes


def test_without_graphviz_the_diagram_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, graph = traced("mlp")
    monkeypatch.setenv("PATH", "")  # no `dot` to find
    explorer = explore(graph)
    assert "cannot draw: GraphvizNotFoundError" in explorer.diagram.value
    assert "apt-get install graphviz" in explorer.diagram.value
    assert explorer.svg == ""
    explorer.select_group(0)  # the controls keep working
    assert "0.weight" in explorer.info_panel.value


# --- the explorer at real-model scale --------------------------------------------------------------------
def drawn_titles(svg: str) -> set[str]:
    return {title for title, classes, _ in svg_groups(svg) if "node" in classes}


def test_the_explorer_starts_on_every_group_and_the_stage_output() -> None:
    _, _, graph = traced("gpt_stage")
    explorer = explore(graph)
    assert explorer.group_picker.index == 0 and explorer.group_picker.label == "all groups"
    (output,) = graph.outputs
    assert explorer.selected_node == output.node
    assert explorer.node_search.value.startswith(f"{output.node} \u00b7 ")
    assert explorer.node_panel.value == node_html(graph, explorer.groups, output.node)
    legend = explorer.legend_panel.value
    assert legend.startswith("<details class='graphkit-legend'") and " open" not in legend.split(">")[0]
    assert legend.count("<tr>") == len(explorer.groups)
    assert "parameter groups" not in explorer.svg  # the legend is beside the picture, not in it


def test_clicks_in_the_picture_select_nodes_and_groups_and_open_modules() -> None:
    _, _, graph = traced("gpt_stage")
    explorer = explore(graph, collapse_depth=1)
    assert "module.blocks" in drawn_titles(explorer.svg)

    explorer.click_target.value = "node:module.blocks@1"  # what the diagram's script writes on a click
    assert explorer.expanded == {"blocks"}
    titles = drawn_titles(explorer.svg)
    assert {"module.blocks.0", "module.blocks.1"} <= titles and "module.blocks" not in titles

    node = node_by(graph, op="addmm", module_path="blocks.0.attn.proj")
    explorer.collapse_slider.value = 0  # a new depth closes what was opened
    assert explorer.expanded == set()
    explorer.click_target.value = f"node:{node}@2"
    assert explorer.selected_node == node
    selected = [title for title, classes, _ in svg_groups(explorer.svg) if "graphkit-selected" in classes]
    assert selected == [node]

    explorer.click_target.value = "group:3@3"
    assert explorer.group_picker.value == 3
    assert 'data-focus="#graphkit-group-3, .graphkit-group-3"' in explorer.diagram.value
    explorer.click("output.0")
    assert explorer.selected_node == graph.outputs[0].node
    with pytest.raises(KeyError, match="not a node"):
        explorer.select_node("n99999")


def test_the_diagram_carries_its_zoom_library_and_click_script() -> None:
    from graphkit.drawing.templating import TEMPLATES

    _, _, graph = traced("mlp")
    explorer = explore(graph)
    html = explorer.diagram.value
    library = (TEMPLATES / "svg-pan-zoom.min.js").read_text()
    assert "<script type='text/plain' class='graphkit-library'>" in html and library[-200:] in html
    assert "window.graphkitAttach" in html and 'onerror="' in html
    assert (
        html.count("</script") == 2
    )  # the two text elements end where they should: nothing inside ends them
    assert 'src="data:,"' in html  # the handler's image fetches nothing


def test_a_long_recurrence_opens_folded() -> None:
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "bench"))
    from scale_models import Recurrence

    torch.manual_seed(0)
    _, graph = graphkit.trace(Recurrence(600), torch.randn(2, 16, requires_grad=True))
    explorer = explore(graph)
    assert explorer.fold_toggle.value is True
    assert len(drawn_titles(explorer.svg)) < 40
    assert any(title.startswith("fold.") for title in drawn_titles(explorer.svg))
    fold = next(title for title in drawn_titles(explorer.svg) if title.startswith("fold."))
    explorer.click(fold)  # a fold selects the first node it stands for
    assert explorer.selected_node is not None
    assert [t for t, c, _ in svg_groups(explorer.svg) if "graphkit-selected" in c] == [fold]


def test_verify_is_disabled_on_the_meta_device() -> None:
    from graphkit.models.specs import load_spec_on

    module, inputs = load_spec_on("zoo:mlp", "meta")
    explorer = explore((module, inputs))
    assert explorer.verify_button.disabled and "meta device" in explorer.verify_button.tooltip
