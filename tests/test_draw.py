"""Diagrams: clusters per parameter group, highlight, collapse, per-use copies, rendering and its errors.

Golden DOT files live in ``tests/golden/``; regenerate them with ``GRAPHKIT_UPDATE_GOLDEN=1 pytest
tests/test_draw.py`` (or ``pytest --update-golden``) and review the diff.
"""

from __future__ import annotations

import os
import re
import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
import torch

import graphkit
from graphkit.analysis.parameter_groups import param_groups
from graphkit.drawing.diagram import draw, groups_diagram
from graphkit.drawing.labels import format_bytes
from graphkit.drawing.palette import PALETTE, PATTERNS, group_style
from graphkit.drawing.rendering import GraphvizNotFoundError, RenderTimeoutError, render
from graphkit.graph.autograd_graph import AutogradGraph
from graphkit.models import zoo

GOLDEN = Path(__file__).parent / "golden"
SVG = "{http://www.w3.org/2000/svg}"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs the Graphviz 'dot' program")


def traced(name: str) -> AutogradGraph:
    module, inputs = zoo.build(name)
    if isinstance(inputs, dict):
        _, graph = graphkit.trace(module, **inputs)
    else:
        _, graph = graphkit.trace(module, *inputs)
    return graph


def svg_of(graph: AutogradGraph, **options: Any) -> ElementTree.Element:
    return ElementTree.fromstring(draw(graph, **options).pipe(format="svg"))


def svg_groups(root: ElementTree.Element, kind: str) -> dict[str, ElementTree.Element]:
    """SVG ``<g>`` elements whose class list holds ``kind`` ("cluster", "node"), keyed by their title."""
    found = {}
    for element in root.iter(f"{SVG}g"):
        if kind in element.get("class", "").split():
            found[element.find(f"{SVG}title").text] = element
    return found


def classes(element: ElementTree.Element) -> set[str]:
    return set(element.get("class", "").split())


def cluster_bodies(source: str) -> dict[str, set[str]]:
    """Node ids declared inside each ``subgraph cluster_group_<i>`` of DOT ``source``."""
    bodies: dict[str, set[str]] = {}
    current = None
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("subgraph cluster_group_"):
            current = stripped.split()[1]
            bodies[current] = set()
        elif stripped == "}" and current is not None:
            current = None
        elif (
            current is not None
            and "[" in stripped
            and "->" not in stripped
            and "=" not in stripped.split("[")[0]
        ):
            bodies[current].add(stripped.split(" [")[0].strip('"'))
    return bodies


# --- golden files --------------------------------------------------------------------------------------------
GOLDEN_CASES = {
    "mlp": ("mlp", {}),
    "lstm": ("lstm", {}),
    "gpt_stage_depth3": ("gpt_stage", {"collapse_depth": 3}),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_dot_source_matches_golden_file(case: str, request: pytest.FixtureRequest) -> None:
    name, options = GOLDEN_CASES[case]
    source = draw(traced(name), title=f"zoo:{name}", **options).source
    path = GOLDEN / f"draw_{case}.dot"
    update = os.environ.get("GRAPHKIT_UPDATE_GOLDEN") == "1" or request.config.getoption(
        "--update-golden", default=False
    )
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
        return
    assert path.exists(), f"missing golden file {path}: run with GRAPHKIT_UPDATE_GOLDEN=1"
    assert source == path.read_text(encoding="utf-8")


def test_same_model_traced_twice_gives_identical_dot() -> None:
    first = draw(traced("gpt_stage"), collapse_depth=3).source
    second = draw(traced("gpt_stage"), collapse_depth=3).source
    assert first == second


# --- clusters ------------------------------------------------------------------------------------------------
@needs_dot
@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_svg_has_one_cluster_per_parameter_group(name: str) -> None:
    graph = traced(name)
    groups = param_groups(graph)
    digraph = draw(graph, groups)
    root = ElementTree.fromstring(digraph.pipe(format="svg"))

    clusters = svg_groups(root, "cluster")
    assert sorted(clusters) == sorted(f"cluster_group_{group.index}" for group in groups)
    # Each cluster holds exactly its group's parameter leaves and weight-only nodes.
    bodies = cluster_bodies(digraph.source)
    for group in groups:
        assert bodies[f"cluster_group_{group.index}"] == {*group.param_nodes, *group.weight_only_nodes}
    # Every captured node is drawn once (no collapse at this size), plus one marker per stage output.
    nodes = svg_groups(root, "node")
    assert set(graph.nodes) <= set(nodes)
    outputs = [title for title, element in nodes.items() if "graphkit-stage-output" in classes(element)]
    assert len(outputs) == len(graph.outputs)
    inputs = {title for title, element in nodes.items() if "graphkit-stage-input" in classes(element)}
    assert inputs == {endpoint.node for endpoint in graph.inputs}
    # Intermediates carry their group's class.
    for group in groups:
        for node in group.intermediates:
            assert {f"graphkit-group-{group.index}", "graphkit-intermediate"} <= classes(nodes[node])


def test_groups_false_draws_no_cluster_and_no_legend() -> None:
    source = draw(traced("mlp"), groups=False).source
    assert "cluster_group" not in source
    assert "parameter groups" not in source
    assert "graphkit-intermediate" not in source


def test_parameter_names_and_shapes_are_in_the_labels() -> None:
    graph = traced("mlp")
    source = draw(graph).source
    # Sequential layer "0": a (32, 16) weight and a (32,) bias, named relative to the cluster's module.
    assert "group 0 \u00b7 0.*" in source
    assert '<b>weight</b><br/><font point-size="9" color="#5A5A5A">(32, 16)</font>' in source
    assert '<b>bias</b><br/><font point-size="9" color="#5A5A5A">(32)</font>' in source


def test_multi_output_intermediate_lists_the_outputs_whose_gradients_are_captured() -> None:
    graph = traced("lstm")
    (rnn,) = [node for node, data in graph.nodes(data=True) if data["num_outputs"] > 1]
    produced = sorted({output_nr for _, _, output_nr in graph.out_edges(rnn, data="output_nr")})
    assert produced == [0, 1, 2]
    source = draw(graph).source
    assert "captures grads of outputs 0, 1, 2" in source
    # Edges out of the multi-output node are labelled with the output index.
    for output_nr in produced:
        assert re.search(rf"{rnn} -> n\d+ \[[^\]]*taillabel={output_nr}", source)


def test_show_saved_and_show_module_add_lines() -> None:
    graph = traced("gpt_stage")
    node, data = next((node, data) for node, data in graph.nodes(data=True) if data["op"] == "addmm")
    plain = draw(graph).source
    detailed = draw(graph, show_saved=True, show_module=True).source
    saved_kib = data["saved_bytes"] / 1024
    assert f"saved {saved_kib:.1f} KiB" in detailed and f"saved {saved_kib:.1f} KiB" not in plain
    assert data["module_path"] in detailed.split(f"\t{node} [")[1].split("\n")[0]
    assert data["module_path"] not in plain.split(f"\t{node} [")[1].split("\n")[0]


# --- highlight -----------------------------------------------------------------------------------------------
@needs_dot
def test_highlight_paints_one_group_and_fades_the_others() -> None:
    graph = traced("gpt_stage")
    groups = param_groups(graph)
    plain = svg_of(graph)
    highlighted = svg_of(graph, highlight_group=3)
    assert ElementTree.tostring(plain) != ElementTree.tostring(highlighted)

    def fills(root: ElementTree.Element) -> dict[str, str]:
        result = {}
        for title, cluster in svg_groups(root, "cluster").items():
            shape = cluster.find(f"{SVG}path")
            if shape is None:
                shape = cluster.find(f"{SVG}polygon")
            result[title] = shape.get("fill").upper()
        return result

    plain_fills, highlighted_fills = fills(plain), fills(highlighted)
    for group in groups:
        title = f"cluster_group_{group.index}"
        assert plain_fills[title] == group_style(group.index).tint
        cluster = svg_groups(highlighted, "cluster")[title]
        if group.index == 3:
            assert highlighted_fills[title] == group_style(3).tint
            assert "graphkit-highlight" in classes(cluster)
        else:
            assert highlighted_fills[title] == group_style(group.index, faded=True).tint
            assert "graphkit-faded" in classes(cluster)
        assert f"graphkit-group-{group.index}" in classes(cluster)


def test_highlight_of_a_missing_group_is_an_error() -> None:
    graph = traced("mlp")
    with pytest.raises(ValueError, match="highlight_group=7"):
        draw(graph, highlight_group=7)


# --- palette -------------------------------------------------------------------------------------------------
def test_group_styles_stay_distinct_past_the_palette() -> None:
    count = len(PALETTE) * len(PATTERNS)
    styles = [group_style(index) for index in range(count)]
    assert len({(style.colour, style.pattern) for style in styles}) == count
    assert [style.pattern for style in styles[: len(PALETTE)]] == ["solid"] * len(PALETTE)
    assert styles[len(PALETTE)].pattern == "dashed"


def test_the_first_eighteen_groups_differ_by_colour_not_only_by_border() -> None:
    from graphkit.drawing.palette import luminance

    styles = [group_style(index) for index in range(18)]
    assert len({style.colour for style in styles}) == 18 and {style.pattern for style in styles} == {"solid"}

    def distance(first: str, second: str) -> float:
        a = [int(first[i : i + 2], 16) for i in (1, 3, 5)]
        b = [int(second[i : i + 2], 16) for i in (1, 3, 5)]
        return sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5

    fills = [style.fill for style in styles]
    closest = min(distance(a, b) for i, a in enumerate(fills) for b in fills[i + 1 :])
    assert closest > 20, closest  # no two fills a reader would take for one
    assert all(0 < luminance(style.colour) < 0.65 for style in styles)  # borders stay visible on white


# --- collapse ------------------------------------------------------------------------------------------------
@needs_dot
def test_collapsed_module_lists_the_groups_inside_it() -> None:
    graph = traced("gpt_stage")
    groups = param_groups(graph)
    root = svg_of(graph, collapse_depth=2)
    nodes = svg_groups(root, "node")
    assert svg_groups(root, "cluster") == {}  # every group's nodes sit inside blocks.0 / blocks.1
    for block in ("blocks.0", "blocks.1"):
        expected = {
            group.index for group in groups if all(name.startswith(block + ".") for name in group.params)
        }
        assert len(expected) == 6
        found = {
            int(name.rsplit("-", 1)[1])
            for name in classes(nodes[f"module.{block}"])
            if name.startswith("graphkit-group-")
        }
        assert found == expected
    # Nothing under a module path survives except the stage input and the output marker.
    drawn = {title for title, element in nodes.items() if "graphkit-module" not in classes(element)}
    assert drawn == {"output.0", graph.inputs[0].node} | {
        node for node, path in graph.nodes(data="module_path") if path is not None and "." not in path
    }


def drawn_nodes(root: ElementTree.Element) -> int:
    """Nodes laid out in an SVG, not counting per-use copies."""
    return sum(1 for element in svg_groups(root, "node").values() if "graphkit-proxy" not in classes(element))


@needs_dot
def test_node_budget_collapses_to_the_deepest_depth_that_fits() -> None:
    graph = traced("gpt_stage")
    full = drawn_nodes(svg_of(graph, max_nodes=None))
    assert full == graph.number_of_nodes() + len(graph.outputs)
    digraph = draw(graph, max_nodes=60)
    depth = int(re.search(r"collapsed at depth (\d+)", digraph.source).group(1))
    assert f"{full} nodes &gt; max_nodes=60" in digraph.source  # HTML label: ">" escaped
    assert drawn_nodes(ElementTree.fromstring(digraph.pipe(format="svg"))) <= 60
    assert drawn_nodes(svg_of(graph, collapse_depth=depth + 1)) > 60
    assert "collapsed" not in draw(graph, max_nodes=full).source


def test_collapse_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="collapse_depth must be >= 1"):
        draw(traced("mlp"), collapse_depth=0)


# --- many consumers --------------------------------------------------------------------------------------------
def chain_graph(steps: int) -> AutogradGraph:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = zoo.Chain(steps=steps)
        x = torch.randn(4, 8, requires_grad=True)
    _, graph = graphkit.trace(module, x)
    return graph


@needs_dot
def test_hundred_step_shared_weight_chain_renders_with_one_copy_per_use(tmp_path: Path) -> None:
    graph = chain_graph(100)
    (weight,) = graph.parameter_nodes().values()
    consumers = [consumer for _, consumer in graph.out_edges(weight)]
    assert len(consumers) == 100
    path = render(graph, tmp_path / "chain.svg", timeout_s=300)
    root = ElementTree.parse(path).getroot()
    assert list(svg_groups(root, "cluster")) == ["cluster_group_0"]
    nodes = svg_groups(root, "node")
    proxies = [title for title, element in nodes.items() if "graphkit-proxy" in classes(element)]
    assert len(proxies) == 100
    edges = [
        element.find(f"{SVG}title").text for element in root.iter(f"{SVG}g") if "edge" in classes(element)
    ]
    # No edge leaves the weight itself; each copy feeds exactly one of the 100 consumers.
    assert not [edge for edge in edges if edge.startswith(f"{weight}->")]
    fed = sorted(edge.split("->")[1] for edge in edges if edge.split("->")[0] in proxies)
    assert fed == sorted(consumers)


def test_fan_in_limit_decides_when_copies_are_drawn() -> None:
    graph = chain_graph(3)
    assert "graphkit-proxy" not in draw(graph).source
    assert draw(graph, fan_in_limit=2).source.count("graphkit-proxy") == 3


# --- rendering -----------------------------------------------------------------------------------------------
@needs_dot
@pytest.mark.parametrize("suffix", [".svg", ".png", ".pdf"])
def test_render_writes_the_format_of_the_suffix(tmp_path: Path, suffix: str) -> None:
    path = render(traced("mlp"), tmp_path / f"mlp{suffix}")
    head = path.read_bytes()[:8]
    magic = {".svg": b"<?xml", ".png": b"\x89PNG", ".pdf": b"%PDF"}[suffix]
    assert head.startswith(magic)


def test_render_dot_needs_no_graphviz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = traced("mlp")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    path = render(graph, tmp_path / "mlp.dot", collapse_depth=1)
    assert path.read_text(encoding="utf-8") == draw(graph, collapse_depth=1).source


def test_render_without_dot_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(GraphvizNotFoundError) as raised:
        render(traced("mlp"), tmp_path / "mlp.svg")
    message = str(raised.value)
    for hint in ("apt-get install graphviz", "brew install graphviz", "conda", ".dot"):
        assert hint in message
    assert isinstance(raised.value, RuntimeError)
    assert not (tmp_path / "mlp.svg").exists()


@needs_dot
def test_render_timeout_stops_dot_and_suggests_collapsing(tmp_path: Path) -> None:
    with pytest.raises(RenderTimeoutError, match="--collapse DEPTH") as raised:
        render(traced("gpt_stage"), tmp_path / "slow.svg", timeout_s=1e-6)
    assert "--max-nodes" in str(raised.value)


def test_render_rejects_an_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.svg, \.png, \.pdf, \.dot"):
        render(traced("mlp"), tmp_path / "mlp.jpeg")


# --- notebook display ------------------------------------------------------------------------------------------
@needs_dot
def test_graph_and_groups_display_as_svg() -> None:
    graph = traced("mlp")
    bundle = graph._repr_mimebundle_()
    assert "image/svg+xml" in bundle
    diagram = groups_diagram(param_groups(graph), graph)
    root = ElementTree.fromstring(diagram.pipe(format="svg"))
    assert sorted(svg_groups(root, "cluster")) == ["cluster_group_0", "cluster_group_1"]


def test_byte_sizes_read_as_a_person_would() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(2304) == "2.2 KiB"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"
