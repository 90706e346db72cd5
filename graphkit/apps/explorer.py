"""Explore an autograd graph and its parameter groups in a notebook: an ipywidgets app.

:func:`explore` shows the diagram of :func:`graphkit.drawing.diagram.draw` with controls around it:

- **the diagram** zooms (mouse wheel, or the +/- buttons) and pans (drag) - svg-pan-zoom, vendored in
  ``graphkit/drawing/templates``, nothing fetched at run time. Clicking a node selects it; clicking a
  collapsed module opens it one level; clicking a group's box selects the group;
- **group picker**: paints one parameter group in colour and fades the others (``highlight_group``),
  brings it into view, and lists the group's parameters, intermediates and flags;
- **node search**: a text box that suggests matching nodes as you type (op, parameter name, module path
  or id); the picked node is outlined, brought into view and described - op, autograd class, shapes and
  dtypes, saved tensors and their bytes, module path, parameter names - with its group and why (parameter
  leaf, weight-only node, intermediate, input path);
- **collapse depth** slider: draw every module at that depth of the module tree as one node (0: no
  collapsing); **fold repeats**: draw repeated structure (a loop over one module, identical blocks) once,
  with a count;
- **label toggles**: shapes, saved bytes and module paths on the node labels;
- **legend**, folded until clicked, beside the diagram;
- **verify** button: runs :func:`graphkit.verify_split` (split B then W against a full backward) and shows
  its table of gradient errors and FLOPs per phase. It needs the module and its inputs, so it is enabled
  when ``explore`` was given a model spec, a ``(module, inputs)`` pair, or ``module=`` and ``inputs=``
  (and not on the meta device, which has no values to compare).

Only plain ipywidgets are used; the diagram's zoom and clicks are a small script that travels with the
diagram's HTML (see :func:`graphkit.apps.panels.diagram_html`), so the app works in JupyterLab and
Notebook 7; where a front end does not run it, the pickers still do everything. The pieces that are not
widgets - :func:`~graphkit.analysis.node_roles.node_role` and the HTML panels of
:mod:`graphkit.apps.panels` - are plain functions and work without ipywidgets.

ipywidgets is an optional dependency: ``pip install 'graphkit[notebook]'``.
"""

from __future__ import annotations

import html
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from graphkit.analysis.closures import input_closure
from graphkit.analysis.node_roles import node_role
from graphkit.analysis.parameter_groups import ParamGroup, param_groups
from graphkit.apps import panels
from graphkit.drawing.collapsing import choose_collapse_depth, drawn_node_count
from graphkit.drawing.folding import folded_node_count
from graphkit.drawing.plan import plan_diagram
from graphkit.drawing.rendering import render
from graphkit.graph.autograd_graph import AutogradGraph
from graphkit.graph.tracing import trace
from graphkit.measure.verification import verify_split
from graphkit.models.specs import load_spec, spec_inputs_as_call

__all__ = ["Explorer", "explore"]

INSTALL_HINT = "pip install 'graphkit[notebook]'"


# --- the app -----------------------------------------------------------------------------------------------
def _import_ipywidgets() -> Any:
    try:
        import ipywidgets
    except ImportError as error:
        raise ImportError(
            f"graphkit.apps.explorer.explore needs ipywidgets, which is not installed: {INSTALL_HINT}"
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
    :func:`explore` passes its keywords on to it.

    Keyword Args:
        collapse_depth: initial collapse depth (>= 1); None chooses the least collapsing that draws at
            most ``max_nodes`` nodes.
        max_nodes: node budget for that initial choice.
        show_shapes, show_saved, show_module: initial state of the label toggles.
        rankdir: graphviz layout direction (``"BT"``: inputs at the bottom).
        title: a heading drawn on top of the diagram.
        render_timeout_s: stop Graphviz after this many seconds per layout and say so in place of the
            diagram (then collapse more with the slider).

    Attributes:
        graph: the graph shown.
        groups: its parameter groups.
        module, inputs: what the verify button runs (None when not given).
        app: the top-level ``ipywidgets.VBox``.
        group_picker: ``Dropdown`` (values: group index, or None for every group).
        node_search: ``Combobox`` of node labels (filters as one types); :attr:`selected_node` is the id.
        click_target: a hidden ``Text`` the diagram's script writes clicks into (``node:ID``, ``group:N``).
        collapse_slider: ``IntSlider`` (0: no collapsing); fold_toggle: ``Checkbox`` (fold repeats).
        expanded: module paths opened by a click although the slider collapses them.
        legend_panel: the folded legend.
        shapes_toggle, saved_toggle, module_toggle: ``Checkbox`` widgets for the label lines.
        verify_button: ``Button``; disabled without a module and inputs.
        diagram: ``HTML`` holding the SVG.
        info_panel, node_panel, verify_panel: ``HTML`` panels beside the diagram.
        report: the last :class:`graphkit.measure.verification.VerifyReport`, or None.
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
        self._plan_cache: dict[tuple[Any, ...], Any] = {}
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

        self.group_picker.index = 0  # "all groups" shown, not a blank box
        self._label_of = {node: self._node_label(node) for node in graph.nodes}
        self._node_of = {label: node for node, label in self._label_of.items()}
        self.selected_node: str | None = None
        self.node_search = widgets.Combobox(
            options=list(self._label_of.values()),
            placeholder="search nodes: op, parameter, module or id",
            ensure_option=True,
            description="node",
            layout=wide,
        )
        self.node_search.add_class("graphkit-node-search")
        self.click_target = widgets.Text(layout=widgets.Layout(display="none"))
        self.click_target.add_class("graphkit-click-target")
        self.expanded: set[str] = set()
        self._focus: str | None = None

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
        fold = bool(
            max_nodes
            and drawn_node_count(graph, collapse_depth) > max_nodes
            and folded_node_count(graph) < drawn_node_count(graph, collapse_depth)
        )
        self.fold_toggle = widgets.Checkbox(
            value=fold, description="fold repeats", indent=False, layout=widgets.Layout(width="auto")
        )
        self.fold_toggle.add_class("graphkit-fold-toggle")
        self.shapes_toggle = widgets.Checkbox(value=show_shapes, description="shapes", indent=False)
        self.saved_toggle = widgets.Checkbox(value=show_saved, description="saved bytes", indent=False)
        self.module_toggle = widgets.Checkbox(value=show_module, description="module paths", indent=False)
        for toggle in (self.shapes_toggle, self.saved_toggle, self.module_toggle):
            toggle.layout = widgets.Layout(width="auto", margin="0 12px 0 0")
        on_meta = module is not None and any(parameter.is_meta for parameter in module.parameters())
        can_verify = module is not None and inputs is not None and not on_meta
        self.verify_button = widgets.Button(
            description="verify split",
            icon="check",
            button_style="primary" if can_verify else "",
            disabled=not can_verify,
            tooltip=(
                "run B then W and a full backward, and compare every gradient"
                if can_verify
                else "the module is on the meta device: shapes only, no values to compare"
                if on_meta
                else "needs the module and its inputs: explore('zoo:NAME'), explore((module, inputs)) or "
                "explore(graph, module=..., inputs=...)"
            ),
        )
        self.verify_button.add_class("graphkit-verify-button")
        self.status = widgets.HTML(layout=widgets.Layout(margin="0 0 0 8px"))
        self.status.add_class("graphkit-status")

        self.diagram = widgets.HTML(
            layout=widgets.Layout(
                flex="3 1 480px", overflow="hidden", border="1px solid #DDDDDD", padding="4px"
            )
        )
        self.diagram.add_class("graphkit-diagram")
        self.info_panel = widgets.HTML()
        self.info_panel.add_class("graphkit-info-panel")
        self.node_panel = widgets.HTML()
        self.node_panel.add_class("graphkit-node-panel")
        self.verify_panel = widgets.HTML()
        self.verify_panel.add_class("graphkit-verify-panel")
        self.legend_panel = widgets.HTML(panels.legend_html(self.groups))
        self.legend_panel.add_class("graphkit-legend-panel")
        side = widgets.VBox(
            [self.legend_panel, self.info_panel, self.node_panel, self.verify_panel],
            layout=widgets.Layout(flex="2 1 300px", overflow="auto", max_height="720px", padding="0 0 0 8px"),
        )
        controls = widgets.HBox(
            [
                self.collapse_slider,
                self.fold_toggle,
                self.shapes_toggle,
                self.saved_toggle,
                self.module_toggle,
                self.verify_button,
                self.status,
            ],
            layout=widgets.Layout(flex_flow="row wrap", align_items="center"),
        )
        pickers = widgets.HBox(
            [self.group_picker, self.node_search], layout=widgets.Layout(flex_flow="row wrap")
        )
        body = widgets.HBox([self.diagram, side], layout=widgets.Layout(flex_flow="row wrap", width="100%"))
        self.app = widgets.VBox([pickers, controls, body, self.click_target])
        self.app.add_class("graphkit-explorer")

        self.group_picker.observe(self._on_group, names="value")
        self.node_search.observe(self._on_search, names="value")
        self.click_target.observe(self._on_click, names="value")
        for control in (self.shapes_toggle, self.saved_toggle, self.module_toggle, self.fold_toggle):
            control.observe(self._on_redraw, names="value")
        self.collapse_slider.observe(self._on_collapse, names="value")
        self.verify_button.on_click(lambda _button: self.verify())

        self.info_panel.value = panels.overview_html(graph, self.groups, self.unused_params)
        self.node_panel.value = ""
        self._redraw()
        outputs = graph.outputs
        if outputs:  # start on the stage output: where the backward begins
            self.select_node(outputs[0].node)

    # --- public -------------------------------------------------------------------------------------
    def draw_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`graphkit.drawing.diagram.draw` for the current state of the controls."""
        return {
            "rankdir": self.rankdir,
            "collapse_depth": self.collapse_slider.value or None,
            "max_nodes": None,
            "fold": self.fold_toggle.value,
            "legend": False,
            "expand": tuple(sorted(self.expanded)),
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
        """Show node ``node`` in the detail panel, outline it and bring it into view, as the node search does.

        Raises:
            KeyError: ``node`` is not a node of the graph.
        """
        if node is not None and node not in self._label_of:
            raise KeyError(f"{node!r} is not a node of this graph (ids look like 'n12')")
        self.selected_node = node
        label = self._label_of[node] if node is not None else ""
        if self.node_search.value != label:
            self.node_search.value = label  # _on_search sees the same node and does nothing more
        self.node_panel.value = (
            "" if node is None else panels.node_html(self.graph, self.groups, node, self._closure)
        )
        self._focus = "g.node.graphkit-selected" if node is not None else None
        self._redraw()

    def expand(self, module_path: str) -> None:
        """Open the collapsed module ``module_path`` one level (its submodules collapse instead), as a click does."""
        self.expanded.add(module_path)
        self._focus = None
        self._redraw()

    def click(self, drawn_id: str) -> None:
        """What clicking the drawn node ``drawn_id`` does: select a node, open a module, select a group.

        A collapsed module (``module.blocks.0``) opens one level; a fold of repeats (``fold.3``) selects
        the first node it stands for; a copy of a shared node (``n5.use2``) selects the node; a stage
        output marker (``output.0``) selects the node that produces the output.
        """
        plan = self._plan()
        if drawn_id.startswith("output."):
            position = int(drawn_id.removeprefix("output."))
            self.select_node(self.graph.outputs[position].node)
            return
        base = re.sub(r"\.use\d+$", "", drawn_id)
        module = plan.modules.get(base)
        if module is not None and not module.repeats:
            self.expand(module.path)
        elif module is not None:
            self.select_node(module.members[0])
        elif base in self._label_of:
            self.select_node(base)

    def verify(self) -> Any:
        """Run :func:`graphkit.verify_split` on the module and inputs and show its table.

        Returns:
            The :class:`graphkit.measure.verification.VerifyReport`.

        Raises:
            ValueError: the explorer has no module and inputs.
        """
        if self.module is None or self.inputs is None:
            raise ValueError(
                "verify needs the module and its inputs: call explore('zoo:NAME'), explore((module, inputs)) "
                "or explore(graph, module=..., inputs=...)"
            )
        self.verify_button.disabled = True
        self.verify_button.description = "verifying\u2026"
        self.verify_panel.value = "<i>running the forward twice, a full backward, then B and W\u2026</i>"
        try:
            report = verify_split(self.module, self.inputs)
        except Exception as error:
            self.verify_panel.value = panels.error_html("verify failed", error)
            raise
        finally:
            self.verify_button.disabled = False
            self.verify_button.description = "verify split"
        self.report = report
        flops = report.flops
        ratio = (flops["b"] + flops["w"]) / flops["full"] if flops["full"] else float("nan")
        self.verify_panel.value = panels.verify_html(report._repr_html_(), ratio)
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
            self.info_panel.value = panels.overview_html(self.graph, self.groups, self.unused_params)
            self._focus = None
        else:
            self.info_panel.value = panels.group_html(self.graph, self.groups[index])
            self._focus = f"#graphkit-group-{index}, .graphkit-group-{index}"
        self._redraw()

    def _on_search(self, change: Mapping[str, Any]) -> None:
        node = self._node_of.get(change["new"])
        if node is not None and node != self.selected_node:
            self.select_node(node)

    def _on_click(self, change: Mapping[str, Any]) -> None:
        value = str(change["new"]).rpartition("@")[0] or str(change["new"])
        kind, _, target = value.partition(":")
        if kind == "node" and target:
            self.click(target)
        elif kind == "group" and target.isdigit() and int(target) < len(self.groups):
            self.select_group(int(target))

    def _on_collapse(self, _change: Mapping[str, Any]) -> None:
        self.expanded.clear()  # a new depth: what was opened at the old one no longer applies
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

    def _plan(self) -> Any:
        options = self.draw_options()
        key = (options["collapse_depth"], options["highlight_group"], options["fold"], options["expand"])
        plan = self._plan_cache.get(key)
        if plan is None:
            plan = self._plan_cache[key] = self._new_plan(options)
        return plan

    def _new_plan(self, options: dict[str, Any]) -> Any:
        return plan_diagram(
            self.graph,
            self.groups,
            options["collapse_depth"],
            None,
            options["highlight_group"],
            options["fold"],
            options["expand"],
        )

    def _drawn_id(self, node: str) -> str:
        return self._plan().drawn[node]

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
                self.diagram.value = panels.error_html("cannot draw", error)
                return
            svg = svg[svg.find("<svg") :]  # drop the XML prologue and DOCTYPE
            self._svg_cache[key] = svg
        node = self.selected_node
        if node is not None:
            svg = _mark_selected(svg, {self._drawn_id(node)})
        self._current_svg = svg
        self.diagram.value = panels.diagram_html(svg, focus=self._focus)
        drawn = sum(1 for line in svg.split("\n") if line.startswith('<g id="node'))
        highlight = options["highlight_group"]
        self.status.value = panels.status_html(drawn, highlight)


def _short_names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit})" if len(names) > limit else "")


def explore(
    graph_or_spec: AutogradGraph | str | tuple[torch.nn.Module, Any],
    groups: Sequence[ParamGroup] | None = None,
    *,
    module: torch.nn.Module | None = None,
    inputs: Any = None,
    title: str | None = None,
    **options: Any,
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
        title: a heading drawn on top of the diagram (default: the spec, if one was given).
        options: the other keywords of :class:`Explorer` (``collapse_depth``, ``max_nodes``, ``show_shapes``,
            ``show_saved``, ``show_module``, ``rankdir``, ``render_timeout_s``), with its defaults.

    Returns:
        An :class:`Explorer`; as the last expression of a cell, Jupyter displays it.

    Raises:
        ImportError: ipywidgets is not installed (``pip install 'graphkit[notebook]'``).
        TypeError: ``graph_or_spec`` is none of the accepted forms, or an option :class:`Explorer` does not take.
        graphkit.models.specs.SpecError: the spec cannot be loaded.
        ValueError: ``collapse_depth < 1``.
    """
    _import_ipywidgets()
    graph, module, inputs, spec = _resolve(graph_or_spec, module, inputs)
    return Explorer(
        graph, groups, module=module, inputs=inputs, title=title if title is not None else spec, **options
    )
