"""Graphviz diagrams of an autograd graph and its parameter groups.

:func:`draw` turns an :class:`~graphkit.graph.AutogradGraph` into a ``graphviz.Digraph`` (Jupyter shows it
inline); :func:`~graphkit.drawing.rendering.render` writes it to ``.svg``, ``.png``, ``.pdf`` or ``.dot``. What the picture shows:

- **the input path** (nodes that depend on a stage input: the B phase) in neutral white and grey;
- **parameter groups**, one coloured cluster each (``subgraph cluster_group_<i>``) holding the group's
  parameter leaves and weight-only nodes (what the W phase computes), labelled ``group i`` and the module
  the parameters share;
- **intermediates**, the input-path nodes where a group's weight gradient leaves the input path, outlined
  in the group's colour; with several forward outputs, the label says whose gradients are captured;
- **stage inputs and outputs** as dark house shapes (inputs point down, outputs up);
- **a legend** above the drawing (in the graph label, so its height never stretches the layout): each
  group's parameters and flags (with ``legend="auto"``, the default, up to 24 groups; past that one line
  says how many), and a key to the colours and shapes in use. Groups are numbered in forward order.

Colours come from Paul Tol's *muted* qualitative scheme (:data:`PALETTE`, safe for colour-blind readers);
past its nine colours, border patterns (dashed, bold, dotted, ...) keep groups apart, and every cluster is
labelled with its group number.

**Large graphs.** ``collapse_depth=d`` draws every module at depth ``d`` of the module tree (a module path
with ``d`` dot-separated parts, from :func:`graphkit.trace`) as one node listing the groups inside it; nodes
without a module path, or in shallower modules, stay as they are. With ``collapse_depth=None`` a graph with
more than ``max_nodes`` drawn nodes is collapsed automatically to the deepest depth that fits, and the graph
label says so. When no depth fits (a recurrence over one module, a graph without module paths),
repeated structure is folded instead (:mod:`graphkit.drawing.folding`): one node per class of repeats,
marked ``×N``. A node with more than ``fan_in_limit`` consumers (a weight shared by 100 steps of a
recurrence) is drawn once, plus a small proxy copy next to each consumer: 100 long edges into one node send
``dot``'s crossing minimisation into minutes, 100 short ones do not.

The DOT source is deterministic: the same graph gives byte-identical output.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import graphviz

from graphkit.analysis.parameter_groups import ParamGroup
from graphkit.drawing.labels import (
    escape,
    format_bytes,
    format_shape,
    html_label,
    saved_line,
    shape_lines,
    with_uses_note,
)
from graphkit.drawing.legend import graph_label
from graphkit.drawing.palette import (
    ENDPOINT_FILL,
    FONT,
    MODULE_FILL,
    NEUTRAL_BORDER,
    NEUTRAL_EDGE,
    SECONDARY_TEXT,
    cell_border,
    group_style,
    style_words,
)
from graphkit.drawing.plan import (
    CollapsedModule,
    DiagramPlan,
    captured_outputs,
    drawn_parameter_names,
    plan_diagram,
    resolve_groups,
)
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = ["draw", "groups_diagram"]


_MAX_NAME_LINES = 3


_CHIPS_PER_ROW = 8


_MAX_CHIPS = 32


def _node_attributes(
    plan: DiagramPlan, node: str, *, show_saved: bool, show_module: bool, show_shapes: bool
) -> dict[str, str]:
    """Graphviz attributes (label, shape, colours, class) of one uncollapsed node."""
    graph = plan.graph
    data = graph.nodes[node]
    kind = str(data["kind"])
    lines = [(line, SECONDARY_TEXT) for line in shape_lines(data, show_shapes)]
    if show_saved and (saved := saved_line(data)):
        lines.append((saved, SECONDARY_TEXT))
    if show_module and data.get("module_path") is not None:
        lines.append((data["module_path"] or "(top-level module)", SECONDARY_TEXT))
    group = plan.node_group.get(node)

    if kind == NodeKind.STAGE_INPUT.value:
        names = ", ".join(data.get("input_names") or []) or node
        label = html_label(f"input {names}", [(line, "#E6E6E6") for line, _ in lines], title_colour="#FFFFFF")
        return {
            "label": label,
            "shape": "invhouse",
            "style": "filled",
            "fillcolor": ENDPOINT_FILL,
            "color": ENDPOINT_FILL,
            "class": "graphkit-stage-input",
        }
    if kind in (NodeKind.PARAMETER.value, NodeKind.LEAF.value):
        names = drawn_parameter_names(plan, node)
        title = names[0]
        extra = [(name, "#000000") for name in names[1:_MAX_NAME_LINES]]
        if len(names) > _MAX_NAME_LINES:
            extra.append((f"+{len(names) - _MAX_NAME_LINES} more names", SECONDARY_TEXT))
        lines = extra + lines
        if group is None:
            return {
                "label": html_label(title, lines),
                "shape": "box",
                "style": "filled",
                "fillcolor": "#E4E4E4",
                "class": "graphkit-parameter",
            }
        style = plan.style(group)
        return {
            "label": html_label(title, lines),
            "shape": "box",
            "style": style_words("filled", style.pattern),
            "fillcolor": style.fill,
            "color": style.colour,
            "class": f"graphkit-group-{group} graphkit-parameter",
        }

    title = data.get("op") or data.get("name") or node
    if data.get("is_custom_function"):
        lines.append(("custom Function", SECONDARY_TEXT))
    if node in plan.intermediates and group is not None:
        style = plan.style(group)
        captured = captured_outputs(graph, node)
        if data.get("num_outputs", 1) > 1:
            listed = ", ".join(str(position) for position in captured)
            lines.append((f"captures grads of outputs {listed}", style.text))
        lines.append((f"to W of group {group}", style.text))
        return {
            "label": html_label(title, lines),
            "style": style_words("rounded", "filled", style.pattern),
            "fillcolor": "#FFFFFF",
            "color": style.colour,
            "penwidth": "3",
            "class": f"graphkit-group-{group} graphkit-intermediate",
        }
    if group is not None:  # weight-only op: inside the group's cluster
        style = plan.style(group)
        return {
            "label": html_label(title, lines),
            "style": style_words("rounded", "filled", style.pattern),
            "fillcolor": "#FFFFFF",
            "color": style.colour,
            "class": f"graphkit-group-{group} graphkit-weight-only",
        }
    return {"label": html_label(title, lines), "class": "graphkit-input-path"}


def _module_attributes(plan: DiagramPlan, module: CollapsedModule, *, show_saved: bool) -> dict[str, str]:
    """Attributes of a collapsed module node: its path, sizes and one colour chip per group inside.

    A module holding one group only is outlined in that group's colour.
    """
    ops = sum(1 for node in module.members if not plan.graph.nodes[node].get("param_names"))
    counts = f"{ops} op" + ("" if ops == 1 else "s")
    if module.repeats:  # the ×N in the heading says how many; here what each one is
        shapes = plan.graph.nodes[module.members[0]].get("shapes") or []
        counts = " ".join(format_shape(shape) for shape in shapes[:2]) or "folded"
    if module.parameters:
        counts += f", {module.parameters} parameter" + ("" if module.parameters == 1 else "s")
    if show_saved and module.saved_bytes:
        counts += f", saved {format_bytes(module.saved_bytes)}"
    cells = [f'<td align="left"><font point-size="9" color="{SECONDARY_TEXT}">{escape(counts)}</font></td>']
    for index in module.groups[:_MAX_CHIPS]:
        style = plan.style(index)
        cells.append(
            f'<td bgcolor="{style.fill}" {cell_border(style, thin=True)}>'
            f'<font point-size="9" color="{style.text}">{index}</font></td>'
        )
    if len(module.groups) > _MAX_CHIPS:
        more = len(module.groups) - _MAX_CHIPS
        cells.append(f'<td><font point-size="9" color="{SECONDARY_TEXT}">+{more}</font></td>')
    rows = ["<tr>" + "".join(cells[: 1 + _CHIPS_PER_ROW]) + "</tr>"]
    for start in range(1 + _CHIPS_PER_ROW, len(cells), _CHIPS_PER_ROW):
        rows.append("<tr><td></td>" + "".join(cells[start : start + _CHIPS_PER_ROW]) + "</tr>")
    columns = min(len(cells), 1 + _CHIPS_PER_ROW)
    heading = f'<tr><td colspan="{columns}" align="left"><b>{escape(module.path)}</b></td></tr>'
    if module.repeats:  # a fold of repeated structure: the op, how many, and the module
        heading = f'<tr><td colspan="{columns}" align="left"><b>{escape(module.op)} \u00d7{module.repeats}</b></td></tr>'
        if module.path and module.path != module.op:
            heading += (
                f'<tr><td colspan="{columns}" align="left"><font point-size="9" color="{SECONDARY_TEXT}">'
                f"{escape(module.path)}</font></td></tr>"
            )
    label = (
        '<<table border="0" cellborder="0" cellspacing="2" cellpadding="1">'
        + heading
        + "".join(rows)
        + "</table>>"
    )
    kind = "graphkit-fold" if module.repeats else "graphkit-module"
    classes = [kind, *(f"graphkit-group-{index}" for index in module.groups)]
    attributes = {
        "label": label,
        "shape": "box3d",
        "style": "filled",
        "fillcolor": MODULE_FILL,
        "margin": "0.04,0.02",
        "class": " ".join(classes),
    }
    if len(module.groups) == 1:
        style = plan.style(module.groups[0])
        attributes.update(color=style.colour, penwidth="2", style=style_words("filled", style.pattern))
    if plan.highlight is not None and plan.highlight in module.groups:
        attributes.update(color=group_style(plan.highlight).colour, penwidth="3")
    return attributes


def _edge_colour(plan: DiagramPlan, producer: str, consumer: str) -> dict[str, str]:
    """Colour an edge by the group of its producer when the producer is a weight-only node or leaf."""
    module = plan.modules.get(plan.drawn[producer])
    if module is not None:
        group = module.weight_only_group
    elif producer in plan.intermediates:
        group = None
    else:
        group = plan.node_group.get(producer)
    if group is None:
        return {}
    style = plan.style(group)
    attributes = {"color": style.colour}
    if consumer in plan.intermediates or consumer not in plan.node_group:
        attributes["penwidth"] = "2"  # a weight-side edge: the weight gradient leaves the input path here
    return attributes


def draw(
    graph: AutogradGraph,
    groups: Any = None,
    *,
    rankdir: str = "BT",
    collapse_depth: int | None = None,
    max_nodes: int | None = 400,
    show_saved: bool = False,
    show_module: bool = False,
    show_shapes: bool = True,
    title: str | None = None,
    highlight_group: int | None = None,
    fan_in_limit: int = 8,
    fold: bool | None = None,
    legend: bool | str = "auto",
    notes: Sequence[str] = (),
    expand: Collection[str] = (),
) -> graphviz.Digraph:
    """Draw ``graph`` with its parameter groups as a ``graphviz.Digraph`` (Jupyter displays it inline).

    Args:
        graph: a graph from :func:`graphkit.capture` or :func:`graphkit.trace`.
        groups: the parameter groups to draw: None computes :func:`graphkit.param_groups`; False draws
            none (a plain diagram); otherwise a list of :class:`~graphkit.analysis.parameter_groups.ParamGroup` of this graph.
        rankdir: graphviz layout direction; ``"BT"`` puts stage inputs at the bottom and outputs on top
            (edges run in data-flow direction, producer -> consumer).
        collapse_depth: draw every module at this depth of the module tree (>= 1) as one node; None
            collapses only when the graph has more than ``max_nodes`` drawn nodes.
        max_nodes: node budget for automatic collapse (None: no budget).
        show_saved: add the bytes of each node's saved tensors.
        show_module: add each node's module path.
        show_shapes: add the shape of each forward output.
        title: text on top of the diagram (notes about collapsing follow it).
        highlight_group: paint this group in colour and every other group in grey (classes
            ``graphkit-highlight`` / ``graphkit-faded`` on the clusters).
        fan_in_limit: a node with more consumers than this is drawn once plus one small proxy per
            consumer, instead of one long edge per consumer.
        fold: draw repeated structure (a loop over one module, a stack of identical blocks) once per
            class of repeats, with a count (:mod:`graphkit.drawing.folding`, torchview's ``roll`` idea).
            None folds when the graph has more than ``max_nodes`` nodes and no collapse depth brings it
            within them; False never folds.
        legend: True draws the legend of groups and the key of shapes; False draws none (the title and
            notes stay); ``"auto"`` draws the group rows for at most 24 groups (the key always).
        notes: more lines of text under the title (after the notes on collapsing and folding).
        expand: module paths drawn open one level although ``collapse_depth`` collapses them (the
            explorer's click on a collapsed module).

    Returns:
        The diagram; ``.source`` is its DOT text (deterministic), ``.pipe("svg")`` renders it.

    Raises:
        ValueError: ``collapse_depth < 1``, ``max_nodes < 1``, ``fan_in_limit < 1`` or
            ``highlight_group`` is not a group index.
    """
    if fan_in_limit < 1:
        raise ValueError(f"fan_in_limit must be >= 1, got {fan_in_limit}")
    resolved = resolve_groups(graph, groups)
    plan = plan_diagram(graph, resolved, collapse_depth, max_nodes, highlight_group, fold, expand)
    plan.notes.extend(notes)
    options = {"show_saved": show_saved, "show_module": show_module, "show_shapes": show_shapes}

    digraph = graphviz.Digraph("autograd")
    graph_attributes = {
        "rankdir": rankdir,
        "fontname": FONT,
        "fontsize": "11",
        "bgcolor": "white",
        "nodesep": "0.25",
        "ranksep": "0.35",
        "outputorder": "edgesfirst",
        "labelloc": "t",
        "labeljust": "l",
    }
    digraph.attr("graph", **graph_attributes)
    digraph.attr(
        "node",
        shape="box",
        style="rounded,filled",
        fillcolor="white",
        color=NEUTRAL_BORDER,
        fontname=FONT,
        fontsize="11",
        margin="0.08,0.04",
        height="0.3",
    )
    digraph.attr("edge", color=NEUTRAL_EDGE, arrowsize="0.6", fontname=FONT, fontsize="8")

    # Edges between drawn nodes, in graph order; parallel edges through collapsed modules merge.
    edges: list[tuple[str, str, str, str, int]] = []  # (tail, head, producer, consumer, output_nr)
    seen: set[tuple[str, str, int]] = set()
    for producer, consumer, output_nr in graph.edges(data="output_nr"):
        tail, head = plan.drawn[producer], plan.drawn[consumer]
        if tail == head and tail != producer:
            continue  # inside one collapsed module
        if tail != producer or head != consumer:
            if (tail, head, output_nr) in seen:
                continue
            seen.add((tail, head, output_nr))
        edges.append((tail, head, producer, consumer, output_nr))
    consumers: dict[str, set[str]] = {}
    for tail, head, *_ in edges:
        consumers.setdefault(tail, set()).add(head)
    output_endpoints = graph.outputs
    for endpoint in output_endpoints:
        consumers.setdefault(plan.drawn[endpoint.node], set()).add(f"output.{endpoint.name}")
    proxied = {tail for tail, heads in consumers.items() if len(heads) > fan_in_limit}

    # Group clusters: parameter leaves and weight-only nodes that are not collapsed.
    clustered: set[str] = set()
    # Collapsed modules that hold weight-only nodes of one group alone sit in that group's cluster.
    emitted_modules: set[str] = set()
    for group in plan.groups:
        members = []
        for node in graph.nodes:
            drawn_id = plan.drawn[node]
            if drawn_id == node:
                if plan.node_group.get(node) == group.index and node not in plan.intermediates:
                    members.append(node)
            elif drawn_id not in members and plan.modules[drawn_id].weight_only_group == group.index:
                members.append(drawn_id)
        if not members:
            continue
        style = plan.style(group.index)
        state = ""
        if plan.highlight is not None:
            state = " graphkit-highlight" if group.index == plan.highlight else " graphkit-faded"
        prefix = plan.prefixes.get(group.index, "")
        heading_text = f"group {group.index}" + (f" \u00b7 {prefix}.*" if prefix else "")
        with digraph.subgraph(name=f"cluster_group_{group.index}") as cluster:
            cluster.attr(
                label=heading_text,
                style=style_words("rounded", "filled", style.pattern),
                fillcolor=style.tint,
                color=style.colour,
                fontcolor=style.text,
                fontsize="11",
                penwidth="2.5" if group.index == plan.highlight else "1.2",
                id=f"graphkit-group-{group.index}",
                **{"class": f"graphkit-group-{group.index}{state}"},
            )
            for node in members:
                if node in plan.modules:
                    attributes = _module_attributes(plan, plan.modules[node], show_saved=show_saved)
                    emitted_modules.add(node)
                else:
                    attributes = _node_attributes(plan, node, **options)
                    clustered.add(node)
                if node in proxied:
                    attributes["label"] = with_uses_note(attributes["label"], len(consumers[node]))
                cluster.node(node, **attributes)

    # Everything else: the input path, intermediates, stage inputs, collapsed modules.
    for node in graph.nodes:
        drawn_id = plan.drawn[node]
        if drawn_id != node:
            if drawn_id not in emitted_modules:
                emitted_modules.add(drawn_id)
                module_attributes = _module_attributes(plan, plan.modules[drawn_id], show_saved=show_saved)
                if drawn_id in proxied:
                    module_attributes["label"] = with_uses_note(
                        module_attributes["label"], len(consumers[drawn_id])
                    )
                digraph.node(drawn_id, **module_attributes)
            continue
        if node in clustered:
            continue
        attributes = _node_attributes(plan, node, **options)
        if node in proxied:
            attributes["label"] = with_uses_note(attributes["label"], len(consumers[node]))
        # Stage inputs get no rank=source row: with per-use copies that makes dot's layout 50x slower.
        digraph.node(node, **attributes)

    # Stage outputs: a marker per output, side by side at the end, fed by the node that produces it.
    markers: list[tuple[str, dict[str, str]]] = []
    for position, endpoint in enumerate(output_endpoints):
        data = graph.nodes[endpoint.node]
        shapes = data.get("shapes") or []
        lines = []
        if show_shapes and endpoint.output_nr < len(shapes):
            lines.append((format_shape(shapes[endpoint.output_nr]), "#E6E6E6"))
        name = endpoint.name if endpoint.name.startswith("output") else f"output {endpoint.name}"
        marker = f"output.{position}"
        markers.append(
            (
                marker,
                {
                    "label": html_label(name, lines, title_colour="#FFFFFF"),
                    "shape": "house",
                    "style": "filled",
                    "fillcolor": ENDPOINT_FILL,
                    "color": ENDPOINT_FILL,
                    "class": "graphkit-stage-output",
                },
            )
        )
        attributes = _edge_colour(plan, endpoint.node, endpoint.node)
        attributes.pop("penwidth", None)
        if data.get("num_outputs", 1) > 1:
            attributes["taillabel"] = str(endpoint.output_nr)
        digraph.edge(plan.drawn[endpoint.node], marker, **attributes)
    if markers:
        with digraph.subgraph() as row:
            row.attr(rank="sink")
            for marker, attributes in markers:
                row.node(marker, **attributes)

    # Edges; a proxied producer gets one small copy per consumer instead of one long edge each.
    proxy_count: dict[str, int] = {}
    for tail, head, producer, consumer, output_nr in edges:
        attributes = _edge_colour(plan, producer, consumer)
        if plan.drawn[producer] == producer and graph.nodes[producer].get("num_outputs", 1) > 1:
            attributes["taillabel"] = str(output_nr)
        if tail in proxied:
            number = proxy_count[tail] = proxy_count.get(tail, 0) + 1
            proxy = f"{tail}.use{number}"
            digraph.node(proxy, **_proxy_attributes(plan, tail))
            # weight 0: the copy follows its consumer, and never pulls the consumer out of line
            digraph.edge(proxy, head, weight="0", **attributes)
        else:
            digraph.edge(tail, head, **attributes)

    # Last, so that no subgraph above inherits it.
    label = graph_label(plan, title, proxies=bool(proxied), legend=legend)
    if label is not None:
        digraph.attr("graph", label=label)
    return digraph


def _proxy_attributes(plan: DiagramPlan, drawn_id: str) -> dict[str, str]:
    """A small dashed copy of ``drawn_id`` placed next to one of its consumers."""
    module = plan.modules.get(drawn_id)
    if module is not None:
        return {
            "label": escape(module.path),
            "shape": "box3d",
            "style": "filled,dashed",
            "fillcolor": MODULE_FILL,
            "fontsize": "9",
            "height": "0.2",
            "class": "graphkit-proxy",
        }
    data = plan.graph.nodes[drawn_id]
    group = plan.node_group.get(drawn_id)
    if data.get("param_names") or str(data["kind"]) == NodeKind.LEAF.value:
        name = drawn_parameter_names(plan, drawn_id)[0]
        fill = plan.style(group).fill if group is not None else "#E4E4E4"
    else:
        name = data.get("op") or drawn_id
        fill = "#FFFFFF"
    attributes = {
        "label": escape(name),
        "shape": "box",
        "style": "filled,dashed",
        "fillcolor": fill,
        "fontsize": "9",
        "height": "0.2",
        "margin": "0.04,0.02",
        "class": "graphkit-proxy" + (f" graphkit-group-{group}" if group is not None else ""),
    }
    if group is not None:
        attributes["color"] = plan.style(group).colour
    return attributes


def groups_diagram(groups: Sequence[ParamGroup], graph: AutogradGraph, **options: Any) -> graphviz.Digraph:
    """The diagram of ``graph`` with ``groups`` (for a groups list's ``_repr_mimebundle_``/``_repr_svg_``).

    Same as ``draw(graph, groups, **options)``; a graph larger than ``max_nodes`` is collapsed.
    """
    return draw(graph, list(groups), **options)
