"""Graphviz diagrams of an autograd graph and its parameter groups.

:func:`draw` turns an :class:`~graphkit.graph.AutogradGraph` into a ``graphviz.Digraph`` (Jupyter shows it
inline); :func:`render` writes it to ``.svg``, ``.png``, ``.pdf`` or ``.dot``. What the picture shows:

- **the input path** (nodes that depend on a stage input: the B phase) in neutral white and grey;
- **parameter groups**, one coloured cluster each (``subgraph cluster_group_<i>``) holding the group's
  parameter leaves and weight-only nodes (what the W phase computes), labelled ``group i`` and the module
  the parameters share;
- **intermediates**, the input-path nodes where a group's weight gradient leaves the input path, outlined
  in the group's colour; with several forward outputs, the label says whose gradients are captured;
- **stage inputs and outputs** as dark house shapes (inputs point down, outputs up);
- **a legend** above the drawing (in the graph label, so its height never stretches the layout): each
  group's parameters and flags (the first 72 groups), and a key to the colours and shapes in use.

Colours come from Paul Tol's *muted* qualitative scheme (:data:`PALETTE`, safe for colour-blind readers);
past its nine colours, border patterns (dashed, bold, dotted, ...) keep groups apart, and every cluster is
labelled with its group number.

**Large graphs.** ``collapse_depth=d`` draws every module at depth ``d`` of the module tree (a module path
with ``d`` dot-separated parts, from :func:`graphkit.trace`) as one node listing the groups inside it; nodes
without a module path, or in shallower modules, stay as they are. With ``collapse_depth=None`` a graph with
more than ``max_nodes`` drawn nodes is collapsed automatically to the deepest depth that fits, and the graph
label says so. A node with more than ``fan_in_limit`` consumers (a weight shared by 100 steps of a
recurrence) is drawn once, plus a small proxy copy next to each consumer: 100 long edges into one node send
``dot``'s crossing minimisation into minutes, 100 short ones do not.

The DOT source is deterministic: the same graph gives byte-identical output.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import graphviz

from graphkit.closures import input_closure
from graphkit.graph import AutogradGraph, NodeKind
from graphkit.groups import ParamGroup, param_groups

__all__ = [
    "FORMATS",
    "PALETTE",
    "PATTERNS",
    "GraphvizNotFoundError",
    "GroupStyle",
    "RenderTimeoutError",
    "choose_collapse_depth",
    "collapse_key",
    "draw",
    "drawn_node_count",
    "format_bytes",
    "group_style",
    "groups_diagram",
    "render",
]

PALETTE: tuple[str, ...] = (
    "#CC6677",  # rose
    "#332288",  # indigo
    "#DDCC77",  # sand
    "#117733",  # green
    "#88CCEE",  # cyan
    "#882255",  # wine
    "#44AA99",  # teal
    "#999933",  # olive
    "#AA4499",  # purple
)
"""Paul Tol's *muted* qualitative colour scheme: distinct for the common forms of colour blindness."""

PATTERNS: tuple[str, ...] = ("solid", "dashed", "bold", "dotted", "bold,dashed", "bold,dotted")
"""Border patterns that tell groups apart once :data:`PALETTE` cycles (group ``i`` uses
``PATTERNS[i // len(PALETTE) % len(PATTERNS)]``)."""

FORMATS: tuple[str, ...] = ("svg", "png", "pdf", "dot")
"""Output formats :func:`render` writes, chosen by the file suffix."""

_FONT = "Helvetica"
_NEUTRAL_BORDER = "#8C8C8C"
_NEUTRAL_EDGE = "#6E6E6E"
_SECONDARY_TEXT = "#5A5A5A"
_ENDPOINT_FILL = "#3B3B3B"
_MODULE_FILL = "#F2F2F2"
_FADED = "#C8C8C8"
_FADED_TEXT = "#9A9A9A"
_FADED_FILL = "#F1F1F1"
_FADED_TINT = "#F8F8F8"
_MAX_NAME_LINES = 3
_MAX_LEGEND_MODULES = 3
_LEGEND_ROWS = 24
_MAX_LEGEND_GROUPS = 3 * _LEGEND_ROWS
_CHIPS_PER_ROW = 8
_MAX_CHIPS = 32


class GraphvizNotFoundError(RuntimeError):
    """The Graphviz ``dot`` program is not installed (or not on ``PATH``)."""


class RenderTimeoutError(RuntimeError):
    """``dot`` did not finish laying out the graph within the time limit."""


@dataclass(slots=True, frozen=True)
class GroupStyle:
    """How one parameter group is painted.

    Attributes:
        index: the group's index.
        colour: border and edge colour (``#RRGGBB``).
        text: a darker shade of ``colour`` for text on white or on ``tint``.
        fill: fill of the group's parameter leaves (``colour`` mixed with white).
        tint: background of the group's cluster (a paler mix).
        pattern: border pattern (one of :data:`PATTERNS`).
    """

    index: int
    colour: str
    text: str
    fill: str
    tint: str
    pattern: str


def _mix(colour: str, other: str, amount: float) -> str:
    """``colour`` moved ``amount`` (0..1) of the way towards ``other``; both ``#RRGGBB``."""
    first = [int(colour[position : position + 2], 16) for position in (1, 3, 5)]
    second = [int(other[position : position + 2], 16) for position in (1, 3, 5)]
    mixed = [round(a + (b - a) * amount) for a, b in zip(first, second, strict=True)]
    return "#" + "".join(f"{channel:02X}" for channel in mixed)


def _luminance(colour: str) -> float:
    """Relative luminance (0 black .. 1 white) of ``#RRGGBB``, sRGB weights without gamma."""
    red, green, blue = (int(colour[position : position + 2], 16) / 255 for position in (1, 3, 5))
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def _cell_border(style: GroupStyle, *, thin: bool = False) -> str:
    """HTML table cell attributes drawing a border in the group's colour and pattern."""
    width = (2 if thin else 3) if "bold" in style.pattern else (1 if thin else 2)
    attributes = f'color="{style.colour}" border="{width}"'
    for pattern in ("dashed", "dotted"):
        if pattern in style.pattern:
            attributes += f' style="{pattern}"'
    return attributes


def group_style(index: int, *, faded: bool = False) -> GroupStyle:
    """The colours and border pattern of group ``index`` (grey shades when ``faded``).

    Raises:
        ValueError: ``index`` is negative.
    """
    if index < 0:
        raise ValueError(f"group index must be >= 0, got {index}")
    pattern = PATTERNS[index // len(PALETTE) % len(PATTERNS)]
    if faded:
        return GroupStyle(index, _FADED, _FADED_TEXT, _FADED_FILL, _FADED_TINT, pattern)
    base = PALETTE[index % len(PALETTE)]
    # Light members of the palette (sand, cyan) get a darker line so thin borders and edges stay visible.
    colour = base if _luminance(base) < 0.6 else _mix(base, "#000000", 0.22)
    return GroupStyle(
        index=index,
        colour=colour,
        text=_mix(base, "#000000", 0.4),
        fill=_mix(base, "#FFFFFF", 0.55),
        tint=_mix(base, "#FFFFFF", 0.86),
        pattern=pattern,
    )


def _style(*words: str) -> str:
    """Join graphviz style words, dropping ``solid`` and empty words."""
    kept: list[str] = []
    for word in words:
        for part in word.split(","):
            if part and part != "solid" and part not in kept:
                kept.append(part)
    return ",".join(kept) or "solid"


# --- collapse by module path --------------------------------------------------------------------------------
def collapse_key(module_path: str | None, depth: int) -> str | None:
    """The module a node collapses into at ``depth``: the first ``depth`` parts of its module path.

    None when the node stays as it is: no module path, the top-level module (``""``) or a module shallower
    than ``depth``. ``collapse_key("blocks.0.attn.qkv", 2) == "blocks.0"``.
    """
    if not module_path:
        return None
    parts = module_path.split(".")
    if len(parts) < depth:
        return None
    return ".".join(parts[:depth])


def _collapsible(graph: AutogradGraph, node: str) -> str | None:
    data = graph.nodes[node]
    if str(data["kind"]) == NodeKind.STAGE_INPUT.value:
        return None  # stage inputs are endpoints: always drawn
    return data.get("module_path")


def drawn_node_count(graph: AutogradGraph, collapse_depth: int | None) -> int:
    """Nodes :func:`draw` lays out at ``collapse_depth`` (None: no collapse), stage-output markers included.

    Proxy copies of shared nodes and the legend are not counted.
    """
    keys: set[str] = set()
    kept = 0
    for node in graph.nodes:
        key = collapse_key(_collapsible(graph, node), collapse_depth) if collapse_depth else None
        if key is None:
            kept += 1
        else:
            keys.add(key)
    return kept + len(keys) + len(graph.graph.get("outputs", []))


def choose_collapse_depth(graph: AutogradGraph, max_nodes: int) -> tuple[int | None, int]:
    """The deepest collapse depth (the least collapsing) at which the drawing has at most ``max_nodes`` nodes.

    Returns:
        ``(depth, drawn nodes)``: depth None when the whole graph fits; depth 1 when nothing fits (the
        smallest drawing); None also when no node has a module path to collapse by.
    """
    count = drawn_node_count(graph, None)
    if count <= max_nodes:
        return None, count
    deepest = max((len(path.split(".")) for _, path in graph.nodes(data="module_path") if path), default=0)
    if deepest == 0:
        return None, count
    for depth in range(deepest, 0, -1):
        count = drawn_node_count(graph, depth)
        if count <= max_nodes:
            return depth, count
    return 1, count


# --- what each node is --------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Module:
    """A collapsed module: one drawn node for every node whose module path starts with ``path``."""

    path: str
    drawn_id: str
    members: list[str] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    parameters: int = 0
    saved_bytes: int = 0
    weight_only_group: int | None = None  # the group, when every member is a weight-only node or leaf of it


@dataclass(slots=True)
class _Plan:
    """Everything :func:`draw` decided before writing DOT."""

    graph: AutogradGraph
    groups: list[ParamGroup]
    node_group: dict[str, int]
    intermediates: set[str]
    input_path: set[str]
    drawn: dict[str, str]  # node id -> drawn node id (itself, or a collapsed module's id)
    modules: dict[str, _Module]  # drawn id -> module
    prefixes: dict[int, str]  # group index -> module shared by its parameters ("" if none)
    highlight: int | None
    notes: list[str]

    def style(self, index: int) -> GroupStyle:
        return group_style(index, faded=self.highlight is not None and index != self.highlight)


def _common_module(names: Iterable[str]) -> str:
    """The longest dotted module prefix shared by all parameter ``names`` (``""`` if none)."""
    common: list[str] | None = None
    for name in names:
        parts = name.split(".")[:-1]
        if common is None:
            common = parts
            continue
        length = 0
        while length < min(len(common), len(parts)) and common[length] == parts[length]:
            length += 1
        common = common[:length]
    return ".".join(common or [])


def _resolve_groups(graph: AutogradGraph, groups: Any) -> list[ParamGroup]:
    if groups is None:
        return list(param_groups(graph))
    if groups is False:
        return []
    return list(groups)


# --- labels -------------------------------------------------------------------------------------------------
def _text(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _format_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ")"


def format_bytes(count: int) -> str:
    """``count`` bytes for people: ``512 B``, ``95.4 KiB``, ``1.2 GiB``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _html_label(title: str, lines: Sequence[tuple[str, str]] = (), *, title_colour: str | None = None) -> str:
    """An HTML-like graphviz label: a bold title, then small lines given as ``(text, colour)``."""
    head = f"<b>{_text(title)}</b>"
    if title_colour:
        head = f'<font color="{title_colour}">{head}</font>'
    parts = [head]
    for line, colour in lines:
        parts.append(f'<font point-size="9" color="{colour}">{_text(line)}</font>')
    return "<" + "<br/>".join(parts) + ">"


def _shape_lines(data: dict[str, Any], show_shapes: bool) -> list[str]:
    shapes = data.get("shapes") or []
    if not show_shapes or not shapes:
        return []
    if len(shapes) == 1:
        return [_format_shape(shapes[0])]
    lines = [f"{position}: {_format_shape(shape)}" for position, shape in enumerate(shapes[:4])]
    if len(shapes) > 4:
        lines.append(f"... {len(shapes)} outputs")
    return lines


def _saved_line(data: dict[str, Any]) -> str | None:
    if data.get("saved_reason"):
        return "saved: freed"
    saved = data.get("saved_bytes")
    if not saved:
        return None
    return f"saved {format_bytes(saved)}"


def _parameter_names(plan: _Plan, node: str) -> list[str]:
    data = plan.graph.nodes[node]
    names = list(data.get("param_names") or [])
    if not names:
        return [f"leaf {node}"]
    prefix = plan.prefixes.get(plan.node_group.get(node, -1), "")
    if prefix:
        names = [name[len(prefix) + 1 :] if name.startswith(prefix + ".") else name for name in names]
    return names


def _captured_outputs(graph: AutogradGraph, node: str) -> list[int]:
    """Forward outputs of ``node`` that receive a gradient (have a consumer or are a stage output)."""
    used = {output_nr for _, _, output_nr in graph.out_edges(node, data="output_nr")}
    used.update(endpoint.output_nr for endpoint in graph.outputs if endpoint.node == node)
    return sorted(used)


# --- the drawing ----------------------------------------------------------------------------------------------
def _plan(
    graph: AutogradGraph,
    groups: list[ParamGroup],
    collapse_depth: int | None,
    max_nodes: int | None,
    highlight: int | None,
) -> _Plan:
    notes: list[str] = []
    if collapse_depth is not None and collapse_depth < 1:
        raise ValueError(
            f"collapse_depth must be >= 1 (a depth in the module tree), got {collapse_depth}; "
            "pass None to collapse only when the graph exceeds max_nodes"
        )
    if max_nodes is not None and max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    if highlight is not None and not 0 <= highlight < len(groups):
        raise ValueError(
            f"highlight_group={highlight} is not a group index (the graph has {len(groups)} groups)"
        )
    if collapse_depth is None and max_nodes is not None:
        depth, count = choose_collapse_depth(graph, max_nodes)
        total = drawn_node_count(graph, None)
        if depth is not None:
            fits = (
                "" if count <= max_nodes else ", still over the budget: raise max_nodes or collapse by hand"
            )
            notes.append(
                f"{total} nodes > max_nodes={max_nodes}: modules collapsed at depth {depth} "
                f"({count} nodes drawn{fits})"
            )
            collapse_depth = depth
        elif total > max_nodes:
            notes.append(
                f"{total} nodes > max_nodes={max_nodes}, but no node has a module path to collapse by "
                "(capture with graphkit.trace)"
            )
    elif collapse_depth is not None:
        notes.append(f"modules collapsed at depth {collapse_depth}")
    if groups and not graph.nodes_of_kind(NodeKind.STAGE_INPUT):
        notes.append("no stage input requires grad: every node depends on parameters alone (all W phase)")

    node_group: dict[str, int] = {}
    intermediates: set[str] = set()
    for group in groups:
        for node in group.nodes():
            node_group[node] = group.index
        intermediates.update(group.intermediates)
    prefixes = {group.index: _common_module(group.params) for group in groups}

    drawn: dict[str, str] = {}
    modules: dict[str, _Module] = {}
    for node in graph.nodes:
        key = collapse_key(_collapsible(graph, node), collapse_depth) if collapse_depth else None
        if key is None:
            drawn[node] = node
            continue
        drawn_id = f"module.{key}"
        module = modules.get(drawn_id)
        if module is None:
            module = modules[drawn_id] = _Module(key, drawn_id)
        module.members.append(node)
        drawn[node] = drawn_id
        data = graph.nodes[node]
        if node in node_group and node_group[node] not in module.groups:
            module.groups.append(node_group[node])
        module.parameters += len(data.get("param_names") or [])
        module.saved_bytes += data.get("saved_bytes") or 0
    for module in modules.values():
        module.groups.sort()
        if len(module.groups) == 1 and all(
            node in node_group and node not in intermediates for node in module.members
        ):
            module.weight_only_group = module.groups[0]
    return _Plan(
        graph=graph,
        groups=groups,
        node_group=node_group,
        intermediates=intermediates,
        input_path=input_closure(graph),
        drawn=drawn,
        modules=modules,
        prefixes=prefixes,
        highlight=highlight,
        notes=notes,
    )


def _node_attributes(
    plan: _Plan, node: str, *, show_saved: bool, show_module: bool, show_shapes: bool
) -> dict[str, str]:
    """Graphviz attributes (label, shape, colours, class) of one uncollapsed node."""
    graph = plan.graph
    data = graph.nodes[node]
    kind = str(data["kind"])
    lines = [(line, _SECONDARY_TEXT) for line in _shape_lines(data, show_shapes)]
    if show_saved and (saved := _saved_line(data)):
        lines.append((saved, _SECONDARY_TEXT))
    if show_module and data.get("module_path") is not None:
        lines.append((data["module_path"] or "(top-level module)", _SECONDARY_TEXT))
    group = plan.node_group.get(node)

    if kind == NodeKind.STAGE_INPUT.value:
        names = ", ".join(data.get("input_names") or []) or node
        label = _html_label(
            f"input {names}", [(line, "#E6E6E6") for line, _ in lines], title_colour="#FFFFFF"
        )
        return {
            "label": label,
            "shape": "invhouse",
            "style": "filled",
            "fillcolor": _ENDPOINT_FILL,
            "color": _ENDPOINT_FILL,
            "class": "graphkit-stage-input",
        }
    if kind in (NodeKind.PARAMETER.value, NodeKind.LEAF.value):
        names = _parameter_names(plan, node)
        title = names[0]
        extra = [(name, "#000000") for name in names[1:_MAX_NAME_LINES]]
        if len(names) > _MAX_NAME_LINES:
            extra.append((f"+{len(names) - _MAX_NAME_LINES} more names", _SECONDARY_TEXT))
        lines = extra + lines
        if group is None:
            return {
                "label": _html_label(title, lines),
                "shape": "box",
                "style": "filled",
                "fillcolor": "#E4E4E4",
                "class": "graphkit-parameter",
            }
        style = plan.style(group)
        return {
            "label": _html_label(title, lines),
            "shape": "box",
            "style": _style("filled", style.pattern),
            "fillcolor": style.fill,
            "color": style.colour,
            "class": f"graphkit-group-{group} graphkit-parameter",
        }

    title = data.get("op") or data.get("name") or node
    if data.get("is_custom_function"):
        lines.append(("custom Function", _SECONDARY_TEXT))
    if node in plan.intermediates and group is not None:
        style = plan.style(group)
        captured = _captured_outputs(graph, node)
        if data.get("num_outputs", 1) > 1:
            listed = ", ".join(str(position) for position in captured)
            lines.append((f"captures grads of outputs {listed}", style.text))
        lines.append((f"to W of group {group}", style.text))
        return {
            "label": _html_label(title, lines),
            "style": _style("rounded", "filled", style.pattern),
            "fillcolor": "#FFFFFF",
            "color": style.colour,
            "penwidth": "3",
            "class": f"graphkit-group-{group} graphkit-intermediate",
        }
    if group is not None:  # weight-only op: inside the group's cluster
        style = plan.style(group)
        return {
            "label": _html_label(title, lines),
            "style": _style("rounded", "filled", style.pattern),
            "fillcolor": "#FFFFFF",
            "color": style.colour,
            "class": f"graphkit-group-{group} graphkit-weight-only",
        }
    return {"label": _html_label(title, lines), "class": "graphkit-input-path"}


def _module_attributes(plan: _Plan, module: _Module, *, show_saved: bool) -> dict[str, str]:
    """Attributes of a collapsed module node: its path, sizes and one colour chip per group inside.

    A module holding one group only is outlined in that group's colour.
    """
    ops = sum(1 for node in module.members if not plan.graph.nodes[node].get("param_names"))
    counts = f"{ops} op" + ("" if ops == 1 else "s")
    if module.parameters:
        counts += f", {module.parameters} parameter" + ("" if module.parameters == 1 else "s")
    if show_saved and module.saved_bytes:
        counts += f", saved {format_bytes(module.saved_bytes)}"
    cells = [f'<td align="left"><font point-size="9" color="{_SECONDARY_TEXT}">{_text(counts)}</font></td>']
    for index in module.groups[:_MAX_CHIPS]:
        style = plan.style(index)
        cells.append(
            f'<td bgcolor="{style.fill}" {_cell_border(style, thin=True)}>'
            f'<font point-size="9" color="{style.text}">{index}</font></td>'
        )
    if len(module.groups) > _MAX_CHIPS:
        more = len(module.groups) - _MAX_CHIPS
        cells.append(f'<td><font point-size="9" color="{_SECONDARY_TEXT}">+{more}</font></td>')
    rows = ["<tr>" + "".join(cells[: 1 + _CHIPS_PER_ROW]) + "</tr>"]
    for start in range(1 + _CHIPS_PER_ROW, len(cells), _CHIPS_PER_ROW):
        rows.append("<tr><td></td>" + "".join(cells[start : start + _CHIPS_PER_ROW]) + "</tr>")
    columns = min(len(cells), 1 + _CHIPS_PER_ROW)
    label = (
        '<<table border="0" cellborder="0" cellspacing="2" cellpadding="1">'
        f'<tr><td colspan="{columns}" align="left"><b>{_text(module.path)}</b></td></tr>'
        + "".join(rows)
        + "</table>>"
    )
    classes = ["graphkit-module", *(f"graphkit-group-{index}" for index in module.groups)]
    attributes = {
        "label": label,
        "shape": "box3d",
        "style": "filled",
        "fillcolor": _MODULE_FILL,
        "margin": "0.04,0.02",
        "class": " ".join(classes),
    }
    if len(module.groups) == 1:
        style = plan.style(module.groups[0])
        attributes.update(color=style.colour, penwidth="2", style=_style("filled", style.pattern))
    if plan.highlight is not None and plan.highlight in module.groups:
        attributes.update(color=group_style(plan.highlight).colour, penwidth="3")
    return attributes


def _edge_colour(plan: _Plan, producer: str, consumer: str) -> dict[str, str]:
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


def _group_rows(plan: _Plan) -> list[str]:
    """One HTML table row per group: its number in its colours, its parameters by module, its flags."""
    rows = []
    for group in plan.groups:
        style = plan.style(group.index)
        by_module: dict[str, list[str]] = {}
        for name in group.params:
            module, _, leaf = name.rpartition(".")
            by_module.setdefault(module, []).append(leaf)
        lines = []
        for module, leaves in list(by_module.items())[:_MAX_LEGEND_MODULES]:
            joined = ", ".join(leaves)
            lines.append(_text(f"{module}: {joined}" if module else joined))
        if len(by_module) > _MAX_LEGEND_MODULES:
            hidden = sum(len(leaves) for leaves in list(by_module.values())[_MAX_LEGEND_MODULES:])
            lines.append(_text(f"... +{hidden} parameters in {len(by_module) - _MAX_LEGEND_MODULES} modules"))
        if group.flags:
            flags = ", ".join(str(flag) for flag in group.flags)
            lines.append(f'<i><font color="{_SECONDARY_TEXT}">{_text(flags)}</font></i>')
        rows.append(
            f'<tr><td bgcolor="{style.tint}" {_cell_border(style)}>'
            f'<font color="{style.text}"><b>group {group.index}</b></font></td>'
            f'<td align="left" balign="left"><font point-size="10">{"<br/>".join(lines)}</font></td></tr>'
        )
    return rows


def _roles_drawn(plan: _Plan) -> set[str]:
    """Which kinds of node the drawing shows outside collapsed modules (the key lists only those)."""
    roles: set[str] = set()
    for node, kind in plan.graph.nodes(data="kind"):
        if plan.drawn[node] != node:
            continue
        kind = str(kind)
        if kind == NodeKind.STAGE_INPUT.value:
            roles.add("stage input")
        elif kind in (NodeKind.PARAMETER.value, NodeKind.LEAF.value):
            roles.add("parameter")
        elif node in plan.intermediates:
            roles.add("intermediate")
        elif node in plan.node_group:
            roles.add("weight-only")
        else:
            roles.add("input path")
    return roles


def _key_rows(plan: _Plan, *, proxies: bool, pairs_per_row: int = 1) -> list[str]:
    """HTML table rows saying what the colours and shapes mean, ``pairs_per_row`` (sample, meaning) a row."""
    sample = group_style(0)
    roles = _roles_drawn(plan)
    candidates = [
        (
            "input path",
            '<td border="1" color="#8C8C8C">op</td>',
            "input path: depends on a stage input (B phase)",
        ),
        (
            "intermediate",
            f'<td border="3" color="{sample.colour}">op</td>',
            "intermediate: the weight gradient leaves the input path here",
        ),
        (
            "weight-only",
            f'<td bgcolor="{sample.tint}" border="1" color="{sample.colour}">op</td>',
            "weight-only op in its group's box (W phase)",
        ),
        (
            "parameter",
            f'<td bgcolor="{sample.fill}" border="1" color="{sample.colour}">weight</td>',
            "parameter",
        ),
    ]
    key = [(cell, meaning) for role, cell, meaning in candidates if role in roles]
    if "stage input" in roles:
        key.append(
            (
                f'<td bgcolor="{_ENDPOINT_FILL}"><font color="#FFFFFF">input / output</font></td>',
                "stage input (points down) / stage output (points up)",
            )
        )
    else:
        key.append(
            (f'<td bgcolor="{_ENDPOINT_FILL}"><font color="#FFFFFF">output</font></td>', "stage output")
        )
    if plan.modules:
        key.append(
            (f'<td bgcolor="{_MODULE_FILL}" border="1">module</td>', "collapsed module; chips: groups inside")
        )
    if proxies:
        key.append(
            (
                f'<td bgcolor="{sample.fill}" border="1" color="{sample.colour}" style="dashed">'
                '<font point-size="9">weight</font></td>',
                "copy of a node with many consumers (one per use)",
            )
        )
    cells = [
        f'{cell}<td align="left"><font point-size="10">{_text(meaning)}</font></td>' for cell, meaning in key
    ]
    unused = plan.graph.graph.get("unused_params") or []
    rows = [
        "<tr>" + "".join(cells[start : start + pairs_per_row]) + "</tr>"
        for start in range(0, len(cells), pairs_per_row)
    ]
    if unused:
        shown = ", ".join(unused[:6]) + (f" (+{len(unused) - 6})" if len(unused) > 6 else "")
        rows.append(
            f'<tr><td colspan="{2 * pairs_per_row}" align="left"><font point-size="10">unused parameters '
            f"(no path to an output): {_text(shown)}</font></td></tr>"
        )
    return rows


def _table(sections: list[tuple[str, list[str]]], columns: int = 2) -> str:
    """A bordered HTML table: for each section a grey header row, then its rows."""
    body = "".join(
        f'<tr><td colspan="{columns}" bgcolor="#EEEEEE" align="left">{header}</td></tr>' + "".join(rows)
        for header, rows in sections
    )
    return f'<table border="0" cellborder="1" cellspacing="0" cellpadding="3" color="#BBBBBB">{body}</table>'


def _graph_label(plan: _Plan, title: str | None, *, proxies: bool) -> str | None:
    """The graph's HTML label, above the drawing: title, notes, and the legend.

    The legend lives in the graph label rather than in a node so that its height never stretches a rank
    of the layout. Groups are listed in columns of at most ``_LEGEND_ROWS`` rows.
    """
    rows = []
    if title:
        rows.append(f'<tr><td align="left"><font point-size="14"><b>{_text(title)}</b></font></td></tr>')
    for note in plan.notes:
        rows.append(
            f'<tr><td align="left"><font point-size="11" color="{_SECONDARY_TEXT}">{_text(note)}</font></td></tr>'
        )
    key_header = "<b>key</b>"
    if plan.groups:
        group_rows = _group_rows(plan)[:_MAX_LEGEND_GROUPS]
        header = f'<b>parameter groups</b> <font point-size="9">({len(plan.groups)})</font>'
        columns = -(-len(group_rows) // _LEGEND_ROWS)
        if columns == 1:  # one table: the groups, then the key, in the same two columns
            sections = [(header, group_rows), (key_header, _key_rows(plan, proxies=proxies))]
            rows.append(f'<tr><td align="left">{_table(sections)}</td></tr>')
        else:  # balanced group columns side by side (so none is stretched), the key below them
            per_column = -(-len(group_rows) // columns)
            cells = []
            for column in range(columns):
                first = column * per_column
                chunk = group_rows[first : first + per_column]
                span = f' <font point-size="9">{first}-{first + len(chunk) - 1}</font>'
                cells.append(f"<td>{_table([(header + span, chunk)])}</td>")
            rows.append(
                '<tr><td align="left"><table border="0" cellspacing="4" cellpadding="0"><tr>'
                + "".join(cells)
                + "</tr></table></td></tr>"
            )
            key = _key_rows(plan, proxies=proxies, pairs_per_row=columns)
            if len(plan.groups) > _MAX_LEGEND_GROUPS:
                key.append(
                    f'<tr><td colspan="{2 * columns}" align="left"><font point-size="10">groups '
                    f"{_MAX_LEGEND_GROUPS}-{len(plan.groups) - 1} are not listed here: print "
                    "graphkit.param_groups(graph) for all of them</font></td></tr>"
                )
            rows.append(f'<tr><td align="left">{_table([(key_header, key)], 2 * columns)}</td></tr>')
    elif plan.modules:
        rows.append(
            f'<tr><td align="left">{_table([(key_header, _key_rows(plan, proxies=proxies))])}</td></tr>'
        )
    if not rows:
        return None
    return '<<table border="0" cellspacing="0" cellpadding="2">' + "".join(rows) + "</table>>"


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
) -> graphviz.Digraph:
    """Draw ``graph`` with its parameter groups as a ``graphviz.Digraph`` (Jupyter displays it inline).

    Args:
        graph: a graph from :func:`graphkit.capture` or :func:`graphkit.trace`.
        groups: the parameter groups to draw: None computes :func:`graphkit.param_groups`; False draws
            none (a plain diagram); otherwise a list of :class:`~graphkit.groups.ParamGroup` of this graph.
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

    Returns:
        The diagram; ``.source`` is its DOT text (deterministic), ``.pipe("svg")`` renders it.

    Raises:
        ValueError: ``collapse_depth < 1``, ``max_nodes < 1``, ``fan_in_limit < 1`` or
            ``highlight_group`` is not a group index.
    """
    if fan_in_limit < 1:
        raise ValueError(f"fan_in_limit must be >= 1, got {fan_in_limit}")
    resolved = _resolve_groups(graph, groups)
    plan = _plan(graph, resolved, collapse_depth, max_nodes, highlight_group)
    options = {"show_saved": show_saved, "show_module": show_module, "show_shapes": show_shapes}

    digraph = graphviz.Digraph("autograd")
    graph_attributes = {
        "rankdir": rankdir,
        "fontname": _FONT,
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
        color=_NEUTRAL_BORDER,
        fontname=_FONT,
        fontsize="11",
        margin="0.08,0.04",
        height="0.3",
    )
    digraph.attr("edge", color=_NEUTRAL_EDGE, arrowsize="0.6", fontname=_FONT, fontsize="8")

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
                style=_style("rounded", "filled", style.pattern),
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
                    attributes["label"] = _with_uses(attributes["label"], len(consumers[node]))
                cluster.node(node, **attributes)

    # Everything else: the input path, intermediates, stage inputs, collapsed modules.
    for node in graph.nodes:
        drawn_id = plan.drawn[node]
        if drawn_id != node:
            if drawn_id not in emitted_modules:
                emitted_modules.add(drawn_id)
                module_attributes = _module_attributes(plan, plan.modules[drawn_id], show_saved=show_saved)
                if drawn_id in proxied:
                    module_attributes["label"] = _with_uses(
                        module_attributes["label"], len(consumers[drawn_id])
                    )
                digraph.node(drawn_id, **module_attributes)
            continue
        if node in clustered:
            continue
        attributes = _node_attributes(plan, node, **options)
        if node in proxied:
            attributes["label"] = _with_uses(attributes["label"], len(consumers[node]))
        # Stage inputs get no rank=source row: with per-use copies that makes dot's layout 50x slower.
        digraph.node(node, **attributes)

    # Stage outputs: a marker per output, side by side at the end, fed by the node that produces it.
    markers: list[tuple[str, dict[str, str]]] = []
    for position, endpoint in enumerate(output_endpoints):
        data = graph.nodes[endpoint.node]
        shapes = data.get("shapes") or []
        lines = []
        if show_shapes and endpoint.output_nr < len(shapes):
            lines.append((_format_shape(shapes[endpoint.output_nr]), "#E6E6E6"))
        name = endpoint.name if endpoint.name.startswith("output") else f"output {endpoint.name}"
        marker = f"output.{position}"
        markers.append(
            (
                marker,
                {
                    "label": _html_label(name, lines, title_colour="#FFFFFF"),
                    "shape": "house",
                    "style": "filled",
                    "fillcolor": _ENDPOINT_FILL,
                    "color": _ENDPOINT_FILL,
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
    label = _graph_label(plan, title, proxies=bool(proxied))
    if label is not None:
        digraph.attr("graph", label=label)
    return digraph


def _with_uses(label: str, uses: int) -> str:
    """Add 'used N times: one copy per use' under an HTML label."""
    note = f'<font point-size="9" color="{_SECONDARY_TEXT}">used {uses} times: one copy per use</font>'
    inner = label[1:-1]
    if inner.startswith("<table"):
        return (
            '<<table border="0" cellborder="0" cellspacing="0" cellpadding="0">'
            f"<tr><td>{inner}</td></tr><tr><td>{note}</td></tr></table>>"
        )
    return f"<{inner}<br/>{note}>"


def _proxy_attributes(plan: _Plan, drawn_id: str) -> dict[str, str]:
    """A small dashed copy of ``drawn_id`` placed next to one of its consumers."""
    module = plan.modules.get(drawn_id)
    if module is not None:
        return {
            "label": _text(module.path),
            "shape": "box3d",
            "style": "filled,dashed",
            "fillcolor": _MODULE_FILL,
            "fontsize": "9",
            "height": "0.2",
            "class": "graphkit-proxy",
        }
    data = plan.graph.nodes[drawn_id]
    group = plan.node_group.get(drawn_id)
    if data.get("param_names") or str(data["kind"]) == NodeKind.LEAF.value:
        name = _parameter_names(plan, drawn_id)[0]
        fill = plan.style(group).fill if group is not None else "#E4E4E4"
    else:
        name = data.get("op") or drawn_id
        fill = "#FFFFFF"
    attributes = {
        "label": _text(name),
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


# --- rendering ----------------------------------------------------------------------------------------------
_INSTALL_HELP = (
    "the Graphviz 'dot' program is not installed (or not on PATH), so graphkit cannot lay out {what}. "
    "Install Graphviz: 'apt-get install graphviz' (Debian, Ubuntu), 'brew install graphviz' (macOS), "
    "'conda install -c conda-forge graphviz', or see https://graphviz.org/download/. "
    "Writing a .dot file works without it."
)


def _run_dot(source: str, output_format: str, timeout_s: float, nodes: int) -> bytes:
    """Lay out DOT ``source`` with the ``dot`` program and return the ``output_format`` bytes.

    Raises:
        GraphvizNotFoundError: ``dot`` is not on PATH.
        RenderTimeoutError: ``dot`` ran longer than ``timeout_s`` seconds (it is killed).
        RuntimeError: ``dot`` failed (its error output is in the message).
    """
    program = shutil.which("dot")
    if program is None:
        raise GraphvizNotFoundError(_INSTALL_HELP.format(what=f"a .{output_format} file"))
    try:
        completed = subprocess.run(
            [program, f"-T{output_format}"],
            input=source.encode("utf-8"),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RenderTimeoutError(
            f"Graphviz 'dot' did not finish laying out {nodes} nodes within {timeout_s:g} s and was stopped. "
            "Draw less: collapse modules to a depth (collapse_depth=, or --collapse DEPTH on the command "
            "line), lower the node budget (max_nodes=, --max-nodes N), or write .dot and lay it out "
            "yourself"
        ) from None
    if completed.returncode != 0:
        message = completed.stderr.decode("utf-8", "replace").strip()
        raise RuntimeError(f"Graphviz 'dot' failed (exit status {completed.returncode}): {message}")
    return completed.stdout


def render(
    graph: AutogradGraph,
    path: str | Path,
    groups: Any = None,
    *,
    timeout_s: float = 120.0,
    **options: Any,
) -> Path:
    """Draw ``graph`` (see :func:`draw`, which takes ``options``) and write it to ``path``.

    The format comes from the suffix: ``.svg``, ``.png``, ``.pdf`` (laid out by the Graphviz ``dot``
    program, stopped after ``timeout_s`` seconds) or ``.dot`` (the DOT source; needs no Graphviz).

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Raises:
        ValueError: unknown suffix, or a bad option (see :func:`draw`).
        GraphvizNotFoundError: ``dot`` is not installed and the format needs it.
        RenderTimeoutError: layout took longer than ``timeout_s``.
        RuntimeError: ``dot`` failed.
    """
    path = Path(path)
    output_format = path.suffix.lower().removeprefix(".")
    if output_format not in FORMATS:
        known = ", ".join(f".{name}" for name in FORMATS)
        raise ValueError(f"cannot tell the format of {str(path)!r}: the file name must end in one of {known}")
    if output_format != "dot" and shutil.which("dot") is None:
        raise GraphvizNotFoundError(_INSTALL_HELP.format(what=path.name))
    digraph = draw(graph, groups, **options)
    if output_format == "dot":
        path.write_text(digraph.source, encoding="utf-8")
        return path
    nodes = sum(1 for line in digraph.body if " [" in line and " -> " not in line)
    path.write_bytes(_run_dot(digraph.source, output_format, timeout_s, nodes))
    return path
