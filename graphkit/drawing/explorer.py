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
(7 and later), VS Code and voila. The pieces that are not widgets - :func:`~graphkit.analysis.node_roles.node_role`
and the HTML panels of :mod:`graphkit.drawing.panels` - are plain functions and work without ipywidgets.

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
from graphkit.drawing import panels
from graphkit.drawing.collapsing import choose_collapse_depth, collapse_key, drawn_node_count
from graphkit.drawing.rendering import render
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = ["Explorer", "explore"]

INSTALL_HINT = "pip install 'graphkit[notebook]'"


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

        self.info_panel.value = panels.overview_html(graph, self.groups, self.unused_params)
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
        else:
            self.info_panel.value = panels.group_html(self.graph, self.groups[index])
        self._redraw()

    def _on_node(self, change: Mapping[str, Any]) -> None:
        node = change["new"]
        self.node_panel.value = (
            "" if node is None else panels.node_html(self.graph, self.groups, node, self._closure)
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
                self.diagram.value = panels.error_html("cannot draw", error)
                return
            svg = svg[svg.find("<svg") :]  # drop the XML prologue and DOCTYPE
            self._svg_cache[key] = svg
        node = self.node_picker.value
        if node is not None:
            svg = _mark_selected(svg, {self._drawn_id(node, options["collapse_depth"])})
        self._current_svg = svg
        self.diagram.value = panels.selection_style_html() + svg
        drawn = drawn_node_count(self.graph, options["collapse_depth"])
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
