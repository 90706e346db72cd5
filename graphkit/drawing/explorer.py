"""Explore an autograd graph and its parameter groups in a notebook: an ipywidgets app.

:func:`explore` shows the diagram of :func:`graphkit.drawing.diagram.draw` with controls around it:

- **group picker**: paints one parameter group in colour and fades the others (``highlight_group``), and
  lists the group's parameters, intermediates and flags;
- **node picker**: outlines the node in the diagram and shows what it is - op, autograd class, shapes and
  dtypes, saved tensors and their bytes, module path, parameter names - and which group it belongs to and
  why (parameter leaf, weight-only node, intermediate, input path);
- **collapse depth** slider: draw every module at that depth of the module tree as one node (0: no
  collapsing);
- **label toggles**: shapes, saved bytes and module paths on the node labels;
- **verify** button: runs :func:`graphkit.verify_split` (split B then W against a full backward) and shows
  its table of gradient errors and FLOPs per phase. It needs the module and its inputs, so it is enabled
  when ``explore`` was given a model spec, a ``(module, inputs)`` pair, or ``module=`` and ``inputs=``.

Only plain ipywidgets are used (no custom JavaScript), so the app works in JupyterLab, classic Notebook
(7 and later), VS Code and voila. The pieces that are not widgets - :func:`node_role` and the HTML panels -
are plain functions and work without ipywidgets.

ipywidgets is an optional dependency: ``pip install 'graphkit[notebook]'``.
"""

from __future__ import annotations

import html
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from graphkit.analysis.closures import input_closure
from graphkit.analysis.parameter_groups import FLAG_MEANINGS, ParamGroup, param_groups
from graphkit.drawing.collapsing import choose_collapse_depth, collapse_key, drawn_node_count
from graphkit.drawing.labels import format_bytes
from graphkit.drawing.rendering import render
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = [
    "ROLES",
    "Explorer",
    "NodeRole",
    "explore",
    "group_html",
    "node_html",
    "node_role",
]

INSTALL_HINT = "pip install 'graphkit[notebook]'"

ROLES: tuple[str, ...] = (
    "parameter leaf",
    "weight-only",
    "intermediate",
    "stage input",
    "input path",
    "outside every group",
)
"""What a node can be, as :func:`node_role` reports it."""


_PANEL_STYLE = "font-size: 12px; line-height: 1.45;"
_TABLE_STYLE = "border-collapse: collapse; font-size: 12px;"
_CELL_STYLE = "padding: 1px 8px 1px 0; vertical-align: top; text-align: left;"


# --- what a node is ----------------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class NodeRole:
    """Where a node stands in the split backward.

    Attributes:
        role: one of :data:`ROLES`.
        group: index of the parameter group the node belongs to, or None.
        reason: one or two sentences saying why, in terms of the input and parameter closures.
    """

    role: str
    group: int | None
    reason: str


def _group_of(groups: Sequence[ParamGroup], node: str) -> tuple[ParamGroup | None, str | None]:
    for group in groups:
        if node in group.param_nodes:
            return group, "parameter leaf"
        if node in group.intermediates:
            return group, "intermediate"
        if node in group.weight_only_nodes:
            return group, "weight-only"
    return None, None


def node_role(
    graph: AutogradGraph,
    groups: Sequence[ParamGroup],
    node: str,
    closure_of_inputs: set[str] | None = None,
) -> NodeRole:
    """Say which group ``node`` belongs to and why.

    Args:
        graph: the captured graph.
        groups: its parameter groups (:func:`graphkit.param_groups`).
        node: a node id of ``graph``.
        closure_of_inputs: :func:`graphkit.input_closure` of ``graph``, if already computed.

    Returns:
        A :class:`NodeRole`: a parameter leaf, weight-only node or intermediate of a group; a stage input;
        a node on the input path (its backward runs in the B phase only); or outside every group.

    Raises:
        KeyError: ``node`` is not a node of ``graph``.
    """
    data = graph.nodes[node]
    group, role = _group_of(groups, node)
    if group is not None and role == "parameter leaf":
        names = ", ".join(data.get("param_names") or []) or "an unnamed leaf"
        return NodeRole(
            role,
            group.index,
            f"AccumulateGrad of {names}: the W phase of group {group.index} adds this gradient to .grad. "
            f"The group's gradient leaves the input path at {_entries(graph, group)}.",
        )
    if group is not None and role == "weight-only":
        return NodeRole(
            role,
            group.index,
            f"depends on parameters of group {group.index} and on no stage input (parameter closure minus "
            "input closure): its backward runs in the W phase only.",
        )
    if group is not None and role == "intermediate":
        edges = group.weight_side_edges.get(node, ())
        listed = ", ".join(
            f"next_functions[{edge.input_nr}] \u2192 {_describe(graph, edge.target)}" for edge in edges
        )
        return NodeRole(
            role,
            group.index,
            "depends on a stage input, and its gradient also feeds weights of group "
            f"{group.index} through {listed}. The B phase captures the gradient it receives; the W phase "
            "pushes it along these weight-side edges only.",
        )
    if str(data["kind"]) == NodeKind.STAGE_INPUT.value:
        names = ", ".join(data.get("input_names") or []) or node
        return NodeRole(
            "stage input",
            None,
            f"stands for the stage input {names}: the B phase computes its gradient first, so the "
            "previous stage can go on.",
        )
    closure_of_inputs = input_closure(graph) if closure_of_inputs is None else closure_of_inputs
    if node in closure_of_inputs:
        return NodeRole(
            "input path",
            None,
            "depends on a stage input and feeds no weight directly: its backward runs in the B phase only.",
        )
    return NodeRole(
        "outside every group",
        None,
        "depends on no stage input and belongs to no parameter group (a leaf whose gradient reaches no "
        "parameter group, or a graph without groups).",
    )


def _describe(graph: AutogradGraph, node: str) -> str:
    data = graph.nodes[node]
    names = data.get("param_names") or []
    what = names[0] if names else data.get("op") or data.get("name") or node
    return f"{what} ({node})"


def _entries(graph: AutogradGraph, group: ParamGroup) -> str:
    entries = [_describe(graph, node) for node in group.intermediates]
    entries += [f"stage output {entry.name}" for entry in group.output_entries]
    return ", ".join(entries) or "no entry"


# --- HTML panels -------------------------------------------------------------------------------------------
def _escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ")"


def _bytes(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count:,} B" if count < 1024 else f"{format_bytes(count)} ({count:,} B)"


def _rows(rows: Sequence[tuple[str, str]]) -> str:
    cells = "".join(
        f"<tr><th style='{_CELL_STYLE}'>{_escape(key)}</th><td style='{_CELL_STYLE}'>{value}</td></tr>"
        for key, value in rows
    )
    return f"<table style='{_TABLE_STYLE}'>{cells}</table>"


def node_html(
    graph: AutogradGraph,
    groups: Sequence[ParamGroup],
    node: str,
    closure_of_inputs: set[str] | None = None,
) -> str:
    """An HTML panel describing ``node``: what it computes, what it saved, and its group and why.

    Raises:
        KeyError: ``node`` is not a node of ``graph``.
    """
    data = graph.nodes[node]
    role = node_role(graph, groups, node, closure_of_inputs)
    shapes = data.get("shapes") or []
    dtypes = data.get("dtypes") or []
    outputs = "<br>".join(
        f"{position}: {_escape(_shape(shape))} {_escape(dtype)}"
        for position, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=False))
    )
    rows = [
        ("node", f"<code>{_escape(node)}</code>"),
        (
            "op",
            f"<b>{_escape(data.get('op'))}</b> <span style='color:#5A5A5A'>{_escape(data.get('name'))}</span>",
        ),
        ("kind", _escape(data["kind"])),
        ("outputs", outputs or "-"),
        (
            "module",
            _escape(data["module_path"] or "(top-level module)")
            if data.get("module_path") is not None
            else "-",
        ),
        ("parameters", "<br>".join(_escape(name) for name in data.get("param_names") or []) or "-"),
    ]
    if data.get("is_custom_function"):
        rows.append(("custom Function", "yes: compute what ctx.needs_input_grad asks for in its backward"))
    if data.get("input_names"):
        rows.append(("stage input", _escape(", ".join(data["input_names"]))))
    if data.get("output_names"):
        rows.append(("stage output", _escape(", ".join(data["output_names"]))))
    saved = data.get("saved_tensors")
    if saved is None and "saved_tensors" in data:
        rows.append(("saved tensors", _escape(data.get("saved_reason") or "not available")))
    elif saved:
        saved_rows = "".join(
            f"<tr><td style='{_CELL_STYLE}'>{_escape(entry['name'])}</td>"
            f"<td style='{_CELL_STYLE}'>{_escape(_shape(entry['shape']))}</td>"
            f"<td style='{_CELL_STYLE}'>{_escape(entry['dtype'])}</td>"
            f"<td style='{_CELL_STYLE}'>{entry['bytes']:,} B</td></tr>"
            for entry in saved
        )
        rows.append(
            (
                "saved tensors",
                f"<table style='{_TABLE_STYLE}'>{saved_rows}</table>total {_escape(_bytes(data.get('saved_bytes')))}",
            )
        )
    elif "saved_tensors" in data:
        rows.append(("saved tensors", "none"))
    where = f"group {role.group}: {role.role}" if role.group is not None else role.role
    rows.append(("group", f"<b>{_escape(where)}</b><br>{_escape(role.reason)}"))
    return f"<div class='graphkit-node-panel' style='{_PANEL_STYLE}'>{_rows(rows)}</div>"


def group_html(graph: AutogradGraph, group: ParamGroup) -> str:
    """An HTML panel describing one parameter group: parameters, intermediates, weight-only ops and flags."""
    intermediates = "<br>".join(_escape(_describe(graph, node)) for node in group.intermediates) or "-"
    outputs = ", ".join(_escape(entry.name) for entry in group.output_entries)
    flags = "<br>".join(
        f"<b>{_escape(flag)}</b>: {_escape(FLAG_MEANINGS.get(str(flag), ''))}" for flag in group.flags
    )
    ops: dict[str, int] = {}
    for node in group.weight_only_nodes:
        op = graph.nodes[node].get("op") or node
        ops[op] = ops.get(op, 0) + 1
    rows = [
        ("parameters", "<br>".join(_escape(name) for name in group.params)),
        ("intermediates", intermediates),
        ("weight-only ops", _escape(", ".join(f"{op} \u00d7{count}" for op, count in ops.items()) or "-")),
    ]
    if outputs:
        rows.append(("parameter-only outputs", outputs))
    if group.shared_params:
        rows.append(("shared", "<br>".join(_escape(name) for name in group.shared_params)))
    rows.append(("flags", flags or "-"))
    return (
        f"<div class='graphkit-group-panel' style='{_PANEL_STYLE}'><b>group {group.index}</b>"
        f"{_rows(rows)}</div>"
    )


def _overview_html(graph: AutogradGraph, groups: Sequence[ParamGroup], unused: Sequence[str]) -> str:
    summary = graph.summary()
    flagged = sum(1 for group in groups if group.flags)
    lines = [
        f"<b>{summary['nodes']}</b> nodes, <b>{summary['edges']}</b> edges, "
        f"<b>{summary['parameters']}</b> parameters in <b>{len(groups)}</b> groups"
        + (f" ({flagged} flagged)" if flagged else ""),
        "stage inputs: " + _escape(", ".join(summary["inputs"]) or "none require grad (a first stage)"),
        "stage outputs: " + _escape(", ".join(summary["outputs"])),
    ]
    if summary.get("saved_bytes_total") is not None:
        lines.append("saved tensors: " + _escape(_bytes(summary["saved_bytes_total"])))
    if unused:
        lines.append("unused parameters: " + _escape(", ".join(unused)))
    lines.append("<i>Pick a group to highlight it, or a node to see what it is.</i>")
    return f"<div class='graphkit-group-panel' style='{_PANEL_STYLE}'>" + "<br>".join(lines) + "</div>"


# --- the app -----------------------------------------------------------------------------------------------
def _import_ipywidgets() -> Any:
    try:
        import ipywidgets
    except ImportError as error:
        raise ImportError(
            f"graphkit.drawing.explorer.explore needs ipywidgets, which is not installed: {INSTALL_HINT}"
        ) from error
    return ipywidgets


def _max_depth(graph: AutogradGraph) -> int:
    return max((len(path.split(".")) for _, path in graph.nodes(data="module_path") if path), default=0)


_NODE_TITLE = re.compile(r'(<g id="[^"]*" class="node)([^"]*)(">\s*<title>)([^<]*)(</title>)')


def _mark_selected(svg: str, drawn_ids: set[str]) -> str:
    """Add the class ``graphkit-selected`` to the SVG groups of the drawn nodes ``drawn_ids``."""

    def replace(match: re.Match[str]) -> str:
        if html.unescape(match.group(4)) not in drawn_ids:
            return match.group(0)
        return (
            match.group(1)
            + match.group(2)
            + " graphkit-selected"
            + match.group(3)
            + match.group(4)
            + match.group(5)
        )

    return _NODE_TITLE.sub(replace, svg)


def _resolve(
    graph_or_spec: Any, module: torch.nn.Module | None, inputs: Any
) -> tuple[AutogradGraph, torch.nn.Module | None, Any, str | None]:
    """``(graph, module, inputs, spec)`` from what :func:`explore` was given."""
    from graphkit.graph.tracing import trace
    from graphkit.models.specs import load_spec, spec_inputs_as_call

    spec = None
    if isinstance(graph_or_spec, AutogradGraph):
        return graph_or_spec, module, inputs, None
    if isinstance(graph_or_spec, str):
        spec = graph_or_spec
        module, inputs = load_spec(graph_or_spec)
    elif (
        isinstance(graph_or_spec, tuple)
        and len(graph_or_spec) == 2
        and isinstance(graph_or_spec[0], torch.nn.Module)
    ):
        module, inputs = graph_or_spec
    else:
        raise TypeError(
            "explore() takes an AutogradGraph (from graphkit.capture or graphkit.trace), a model spec string "
            "('zoo:gpt_stage', 'path/to/file.py:function', 'hf:llama?stage=middle') or a (module, inputs) "
            f"pair; got {type(graph_or_spec).__name__}"
        )
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    args, kwargs = spec_inputs_as_call(inputs)
    _, graph = trace(module, *args, **kwargs)
    return graph, module, inputs, spec


class Explorer:
    """The app :func:`explore` returns; Jupyter displays it. Its widgets are attributes, so code can drive it.

    Attributes:
        graph: the graph shown.
        groups: its parameter groups.
        module, inputs: what the verify button runs (None when not given).
        app: the top-level ``ipywidgets.VBox``.
        group_picker, node_picker: ``Dropdown`` widgets (values: group index / node id, or None).
        collapse_slider: ``IntSlider`` (0: no collapsing).
        shapes_toggle, saved_toggle, module_toggle: ``Checkbox`` widgets for the label lines.
        verify_button: ``Button``; disabled without a module and inputs.
        diagram: ``HTML`` holding the SVG.
        info_panel, node_panel, verify_panel: ``HTML`` panels beside the diagram.
        report: the last :class:`graphkit.split.verification.VerifyReport`, or None.
        render_timeout_s: seconds Graphviz may take for one layout.
    """

    def __init__(
        self,
        graph: AutogradGraph,
        groups: Sequence[ParamGroup] | None = None,
        *,
        module: torch.nn.Module | None = None,
        inputs: Any = None,
        collapse_depth: int | None = None,
        max_nodes: int = 400,
        show_shapes: bool = True,
        show_saved: bool = False,
        show_module: bool = False,
        rankdir: str = "BT",
        title: str | None = None,
        render_timeout_s: float = 60.0,
    ) -> None:
        widgets = _import_ipywidgets()
        self.graph = graph
        computed = param_groups(graph) if groups is None else groups
        self.groups: list[ParamGroup] = list(computed)
        self.unused_params: list[str] = list(
            getattr(computed, "unused_params", graph.graph.get("unused_params", []))
        )
        self.module = module
        self.inputs = inputs
        self.rankdir = rankdir
        self.title = title
        self.report: Any = None
        self._closure = input_closure(graph)
        self._svg_cache: dict[tuple[Any, ...], str] = {}
        self._current_svg = ""
        self.render_timeout_s = render_timeout_s

        depth_limit = _max_depth(graph)
        if collapse_depth is None:
            collapse_depth = choose_collapse_depth(graph, max_nodes)[0] if max_nodes else None
        if collapse_depth is not None and collapse_depth < 1:
            raise ValueError(f"collapse_depth must be >= 1 or None, got {collapse_depth}")
        initial_depth = min(collapse_depth or 0, depth_limit)

        wide = widgets.Layout(width="auto", flex="1 1 320px")
        group_options: list[tuple[str, int | None]] = [("all groups", None)]
        for group in self.groups:
            label = f"group {group.index}: {_short_names(group.params)}"
            if group.flags:
                label += "  [" + ", ".join(str(flag) for flag in group.flags) + "]"
            group_options.append((label, group.index))
        self.group_picker = widgets.Dropdown(
            options=group_options, value=None, description="group", layout=wide
        )
        self.group_picker.add_class("graphkit-group-picker")

        node_options: list[tuple[str, str | None]] = [("(pick a node)", None)]
        for node in graph.nodes:
            node_options.append((self._node_label(node), node))
        self.node_picker = widgets.Dropdown(options=node_options, value=None, description="node", layout=wide)
        self.node_picker.add_class("graphkit-node-picker")

        self.collapse_slider = widgets.IntSlider(
            value=initial_depth,
            min=0,
            max=max(depth_limit, 1),
            step=1,
            description="collapse",
            disabled=depth_limit == 0,
            continuous_update=False,
            tooltip="draw every module at this depth of the module tree as one node (0: none)",
            layout=widgets.Layout(width="260px"),
        )
        self.collapse_slider.add_class("graphkit-collapse-slider")
        self.shapes_toggle = widgets.Checkbox(value=show_shapes, description="shapes", indent=False)
        self.saved_toggle = widgets.Checkbox(value=show_saved, description="saved bytes", indent=False)
        self.module_toggle = widgets.Checkbox(value=show_module, description="module paths", indent=False)
        for toggle in (self.shapes_toggle, self.saved_toggle, self.module_toggle):
            toggle.layout = widgets.Layout(width="auto", margin="0 12px 0 0")
        can_verify = module is not None and inputs is not None
        self.verify_button = widgets.Button(
            description="verify split",
            icon="check",
            button_style="primary" if can_verify else "",
            disabled=not can_verify,
            tooltip=(
                "run B then W and a full backward, and compare every gradient"
                if can_verify
                else "needs the module and its inputs: explore('zoo:NAME'), explore((module, inputs)) or "
                "explore(graph, module=..., inputs=...)"
            ),
        )
        self.verify_button.add_class("graphkit-verify-button")
        self.status = widgets.HTML(layout=widgets.Layout(margin="0 0 0 8px"))
        self.status.add_class("graphkit-status")

        self.diagram = widgets.HTML(
            layout=widgets.Layout(
                flex="3 1 480px",
                overflow="auto",
                max_height="720px",
                border="1px solid #DDDDDD",
                padding="4px",
            )
        )
        self.diagram.add_class("graphkit-diagram")
        self.info_panel = widgets.HTML()
        self.info_panel.add_class("graphkit-info-panel")
        self.node_panel = widgets.HTML()
        self.node_panel.add_class("graphkit-node-panel")
        self.verify_panel = widgets.HTML()
        self.verify_panel.add_class("graphkit-verify-panel")
        side = widgets.VBox(
            [self.info_panel, self.node_panel, self.verify_panel],
            layout=widgets.Layout(flex="2 1 300px", overflow="auto", max_height="720px", padding="0 0 0 8px"),
        )
        controls = widgets.HBox(
            [
                self.collapse_slider,
                self.shapes_toggle,
                self.saved_toggle,
                self.module_toggle,
                self.verify_button,
                self.status,
            ],
            layout=widgets.Layout(flex_flow="row wrap", align_items="center"),
        )
        pickers = widgets.HBox(
            [self.group_picker, self.node_picker], layout=widgets.Layout(flex_flow="row wrap")
        )
        body = widgets.HBox([self.diagram, side], layout=widgets.Layout(flex_flow="row wrap", width="100%"))
        self.app = widgets.VBox([pickers, controls, body])
        self.app.add_class("graphkit-explorer")

        self.group_picker.observe(self._on_group, names="value")
        self.node_picker.observe(self._on_node, names="value")
        for control in (self.collapse_slider, self.shapes_toggle, self.saved_toggle, self.module_toggle):
            control.observe(self._on_redraw, names="value")
        self.verify_button.on_click(lambda _button: self.verify())

        self.info_panel.value = _overview_html(graph, self.groups, self.unused_params)
        self.node_panel.value = ""
        self._redraw()

    # --- public -------------------------------------------------------------------------------------
    def draw_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`graphkit.drawing.diagram.draw` for the current state of the controls."""
        return {
            "rankdir": self.rankdir,
            "collapse_depth": self.collapse_slider.value or None,
            "max_nodes": None,
            "show_saved": self.saved_toggle.value,
            "show_module": self.module_toggle.value,
            "show_shapes": self.shapes_toggle.value,
            "title": self.title,
            "highlight_group": self.group_picker.value,
        }

    def select_group(self, index: int | None) -> None:
        """Highlight group ``index`` (None: every group in colour), as the group picker does."""
        self.group_picker.value = index

    def select_node(self, node: str | None) -> None:
        """Show node ``node`` in the detail panel and outline it in the diagram, as the node picker does."""
        self.node_picker.value = node

    def verify(self) -> Any:
        """Run :func:`graphkit.verify_split` on the module and inputs and show its table.

        Returns:
            The :class:`graphkit.split.verification.VerifyReport`.

        Raises:
            ValueError: the explorer has no module and inputs.
        """
        if self.module is None or self.inputs is None:
            raise ValueError(
                "verify needs the module and its inputs: call explore('zoo:NAME'), explore((module, inputs)) "
                "or explore(graph, module=..., inputs=...)"
            )
        from graphkit.split.verification import verify_split

        self.verify_button.disabled = True
        self.verify_button.description = "verifying\u2026"
        self.verify_panel.value = "<i>running the forward twice, a full backward, then B and W\u2026</i>"
        try:
            report = verify_split(self.module, self.inputs)
        except Exception as error:
            self.verify_panel.value = (
                f"<div style='color:#b2182b'><b>verify failed</b>: {_escape(type(error).__name__)}: "
                f"{_escape(error)}</div>"
            )
            raise
        finally:
            self.verify_button.disabled = False
            self.verify_button.description = "verify split"
        self.report = report
        flops = report.flops
        ratio = (flops["b"] + flops["w"]) / flops["full"] if flops["full"] else float("nan")
        self.verify_panel.value = (
            f"<div class='graphkit-verify-report' style='{_PANEL_STYLE}'>{report._repr_html_()}"
            f"<p>(B + W) / full FLOPs: {ratio:.3f}</p></div>"
        )
        return report

    @property
    def svg(self) -> str:
        """The SVG text the diagram shows now."""
        return self._current_svg

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.app._repr_mimebundle_(**kwargs)

    # --- callbacks ----------------------------------------------------------------------------------
    def _on_group(self, change: Mapping[str, Any]) -> None:
        index = change["new"]
        if index is None:
            self.info_panel.value = _overview_html(self.graph, self.groups, self.unused_params)
        else:
            self.info_panel.value = group_html(self.graph, self.groups[index])
        self._redraw()

    def _on_node(self, change: Mapping[str, Any]) -> None:
        node = change["new"]
        self.node_panel.value = (
            "" if node is None else node_html(self.graph, self.groups, node, self._closure)
        )
        self._redraw()

    def _on_redraw(self, _change: Mapping[str, Any]) -> None:
        self._redraw()

    # --- drawing ------------------------------------------------------------------------------------
    def _node_label(self, node: str) -> str:
        data = self.graph.nodes[node]
        names = data.get("param_names") or []
        what = names[0] if names else data.get("op") or data.get("name")
        role = node_role(self.graph, self.groups, node, self._closure)
        where = f"group {role.group} {role.role}" if role.group is not None else role.role
        module = f" \u00b7 {data['module_path']}" if data.get("module_path") and not names else ""
        return f"{node} \u00b7 {what}{module} [{where}]"

    def _drawn_id(self, node: str, depth: int | None) -> str:
        data = self.graph.nodes[node]
        if depth and str(data["kind"]) != NodeKind.STAGE_INPUT.value:
            key = collapse_key(data.get("module_path"), depth)
            if key is not None:
                return f"module.{key}"
        return node

    def _render_svg(self, options: dict[str, Any]) -> str:
        """Lay the diagram out with ``dot``, stopped after :attr:`render_timeout_s` seconds."""
        with tempfile.TemporaryDirectory(prefix="graphkit-explore-") as folder:
            path = render(
                self.graph,
                Path(folder) / "diagram.svg",
                self.groups,
                timeout_s=self.render_timeout_s,
                **options,
            )
            return path.read_text(encoding="utf-8")

    def _redraw(self) -> None:
        options = self.draw_options()
        key = tuple(sorted((name, value) for name, value in options.items()))
        svg = self._svg_cache.get(key)
        if svg is None:
            try:
                svg = self._render_svg(options)
            except Exception as error:  # no Graphviz, a layout too slow or failing: say so in its place
                self._current_svg = ""
                self.diagram.value = (
                    f"<div style='color:#b2182b'>cannot draw: {_escape(type(error).__name__)}: "
                    f"{_escape(error)}</div>"
                )
                return
            svg = svg[svg.find("<svg") :]  # drop the XML prologue and DOCTYPE
            self._svg_cache[key] = svg
        node = self.node_picker.value
        if node is not None:
            svg = _mark_selected(svg, {self._drawn_id(node, options["collapse_depth"])})
        self._current_svg = svg
        style = (
            "<style>.graphkit-diagram .graphkit-selected > path, .graphkit-diagram .graphkit-selected > polygon,"
            " .graphkit-diagram .graphkit-selected > ellipse {stroke: #000000; stroke-width: 4px;}</style>"
        )
        self.diagram.value = style + svg
        drawn = drawn_node_count(self.graph, options["collapse_depth"])
        highlight = options["highlight_group"]
        self.status.value = (
            f"<span style='font-size:12px;color:#5A5A5A'>{drawn} nodes drawn"
            + (f", group {highlight} highlighted" if highlight is not None else "")
            + "</span>"
        )


def _short_names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit})" if len(names) > limit else "")


def explore(
    graph_or_spec: AutogradGraph | str | tuple[torch.nn.Module, Any],
    groups: Sequence[ParamGroup] | None = None,
    *,
    module: torch.nn.Module | None = None,
    inputs: Any = None,
    collapse_depth: int | None = None,
    max_nodes: int = 400,
    show_shapes: bool = True,
    show_saved: bool = False,
    show_module: bool = False,
    rankdir: str = "BT",
    title: str | None = None,
    render_timeout_s: float = 60.0,
) -> Explorer:
    """An ipywidgets app to explore an autograd graph, its parameter groups and its split backward.

    Args:
        graph_or_spec: an :class:`~graphkit.graph.AutogradGraph` (from :func:`graphkit.capture` or
            :func:`graphkit.trace`); a model spec string (``"zoo:gpt_stage"``, ``"path/to/file.py:function"``,
            ``"hf:llama?stage=middle"``, see :mod:`graphkit.models.specs`); or a ``(module, inputs)`` pair with
            ``inputs`` a tuple of positional arguments, a dict of keyword arguments or one tensor. Specs
            and pairs are run once with :func:`graphkit.trace`, so nodes carry module paths.
        groups: the parameter groups to show (default: :func:`graphkit.param_groups` of the graph).
        module, inputs: with a graph, the module and inputs the verify button runs.
        collapse_depth: initial collapse depth (>= 1); None chooses the least collapsing that draws at
            most ``max_nodes`` nodes.
        max_nodes: node budget for that initial choice.
        show_shapes, show_saved, show_module: initial state of the label toggles.
        rankdir: graphviz layout direction (``"BT"``: inputs at the bottom).
        title: a heading drawn on top of the diagram (default: the spec, if one was given).
        render_timeout_s: stop Graphviz after this many seconds per layout and say so in place of the
            diagram (then collapse more with the slider).

    Returns:
        An :class:`Explorer`; as the last expression of a cell, Jupyter displays it.

    Raises:
        ImportError: ipywidgets is not installed (``pip install 'graphkit[notebook]'``).
        TypeError: ``graph_or_spec`` is none of the accepted forms.
        graphkit.models.specs.SpecError: the spec cannot be loaded.
        ValueError: ``collapse_depth < 1``.
    """
    _import_ipywidgets()
    graph, module, inputs, spec = _resolve(graph_or_spec, module, inputs)
    return Explorer(
        graph,
        groups,
        module=module,
        inputs=inputs,
        collapse_depth=collapse_depth,
        max_nodes=max_nodes,
        show_shapes=show_shapes,
        show_saved=show_saved,
        show_module=show_module,
        rankdir=rankdir,
        title=title if title is not None else spec,
        render_timeout_s=render_timeout_s,
    )
