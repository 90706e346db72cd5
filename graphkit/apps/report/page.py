"""``index.html``: the report page, rendered from ``graphkit/drawing/templates/report.html.j2`` by Jinja2.

The template holds the page's structure and wording; this module turns an
:class:`~graphkit.apps.report.inspection.Inspection` into the plain values the template shows (rows,
bar widths, notes). The page stays one self-contained file: the stylesheet (``report.css``) and the one
script (``report.js``: fit the diagram to the page width or show it at actual size) are inlined, and the
diagram's SVG is embedded as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2

from graphkit.analysis.parameter_groups import FLAG_MEANINGS, GroupFlag, tensor_names
from graphkit.apps.report import formatting
from graphkit.apps.report.inspection import FILES, META_VERIFY_NOTE, Inspection
from graphkit.drawing.palette import group_style
from graphkit.drawing.templating import environment

__all__ = ["report_html"]

LISTED_NAMES = 8
"""Parameter names listed in a table cell before the rest folds into a ``<details>``."""

_FILE_MEANINGS = {
    "svg": "the diagram alone",
    "dot": "the diagram's Graphviz source",
    "graphml": "the captured graph for networkx, Gephi or yEd",
    "json": "everything on this page as data",
}


def _environment() -> jinja2.Environment:
    """graphkit's template environment with the report's number formats as filters."""
    env = environment()
    if "flop" not in env.filters:
        env.filters.update(
            flop=formatting.flop_text,
            tolerance=formatting.tolerance_text,
            error=formatting.error_text,
            bytes_or_unknown=formatting.bytes_or_unknown,
        )
    return env


def _inline_svg(svg: str) -> str:
    """The ``<svg>`` element of a Graphviz SVG file, without the XML prolog, DOCTYPE and comments."""
    start = svg.find("<svg")
    return svg[start:].strip() if start >= 0 else svg


def _share(part: int, total: int) -> str:
    percent = 100 * part / total if total else 0.0
    return "<1%" if 0 < percent < 1 else f"{percent:.0f}%"


def _flops_bars(flops: Mapping[str, int]) -> dict[str, Any] | None:
    """Geometry of the FLOPs chart: one bar per row (full backward, B, W, B + W), widths in pixels."""
    full, b, w = flops["full"], flops["b"], flops["w"]
    if b < 0 or w < 0:  # not counted (see VerifyReport.extra["flops_note"])
        return None
    largest = max(full, b + w, 1)
    bar_width, left, row = 300, 150, 30
    rows = []
    for position, (label, segments) in enumerate(
        [
            ("full backward", [(full, "var(--full)")]),
            ("B: input grads", [(b, "var(--b)")]),
            ("W: weight grads", [(w, "var(--w)")]),
            ("B + W", [(b, "var(--b)"), (w, "var(--w)")]),
        ]
    ):
        x = float(left)
        drawn = []
        for value, colour in segments:
            width = bar_width * value / largest
            drawn.append({"x": f"{x:.1f}", "width": f"{width:.1f}", "colour": colour})
            x += width
        total = sum(value for value, _ in segments)
        rows.append(
            {
                "label": label,
                "y": 4 + position * row,
                "segments": drawn,
                "end": f"{x + 6:.1f}",
                "total": total,
                "share": f" ({100 * total / full:.0f}%)" if full else "",
            }
        )
    return {"width": left + bar_width + 150, "height": row * len(rows) + 8, "rows": rows}


def _extra_flops(inspection: Inspection) -> dict[str, Any] | None:
    """How much more B + W costs than the full backward, when noticeably more, and why: the opaque Nodes
    that repeat work as :func:`graphkit.verify_split` measured them (costliest first, with what each
    kind means), else whether a custom Function is the likely reason."""
    flops = inspection.flops
    extra = flops["b"] + flops["w"] - flops["full"]
    if flops["full"] <= 0 or flops["b"] < 0 or extra <= 0.05 * flops["full"]:
        return None
    measured = inspection.verify.opaque if inspection.verify is not None else []  # meta device: nothing ran
    repeating = sorted((cost for cost in measured if cost.repeated > 0), key=lambda cost: -cost.repeated)
    return {
        "flops": extra,
        "percent": f"{100 * extra / flops['full']:.0f}",
        "custom_function": any(GroupFlag.CUSTOM_FUNCTION in group.flags for group in inspection.groups),
        "repeating": [
            {"node": cost.node, "op": cost.op, "kind": cost.kind, "repeated": cost.repeated}
            for cost in repeating[:LISTED_NAMES]
        ],
        "meanings": {cost.kind: cost.meaning for cost in repeating},
    }


def _group_rows(inspection: Inspection) -> list[dict[str, Any]]:
    graph = inspection.graph
    sizes = inspection.parameter_sizes()
    total = sum(sizes.values()) or 1
    svg = inspection.svg or ""
    rows = []
    for group in inspection.groups:
        style = group_style(group.index)
        values = sum(sizes.get(node, 0) for node in set(group.param_nodes))
        rows.append(
            {
                "index": group.index,
                "linked": f'id="graphkit&#45;group&#45;{group.index}"' in svg,
                "fill": style.fill,
                "colour": style.colour,
                "border": "dashed"
                if "dashed" in style.pattern
                else "dotted"
                if "dotted" in style.pattern
                else "solid",
                "params": tensor_names(graph, group.params),  # tied weights as one tensor: a = b
                "value_count": values,
                "share": _share(values, total),
                "intermediates": [
                    {
                        "op": graph.nodes[node]["op"],
                        "node": node,
                        "module_path": graph.nodes[node].get("module_path"),
                    }
                    for node in group.intermediates
                ],
                "output_entries": [entry.name for entry in group.output_entries],
                "flags": [(str(flag), FLAG_MEANINGS.get(str(flag), "")) for flag in group.flags],
            }
        )
    return rows


def report_html(inspection: Inspection, files: Mapping[str, str | None] | None = None) -> str:
    """``index.html``: one self-contained page (inline CSS and SVG; links only to the report's own files).

    Sections: summary with the verdict and the FLOPs chart, the group table (one ``<tr class="group-row">``
    per group), the diagram, the verification table and the file list.

    Raises:
        jinja2.TemplateError: the installed templates are broken (a packaging error).
    """
    files = dict(files) if files is not None else dict(FILES)
    verify = inspection.verify
    used_flags = sorted({str(flag) for group in inspection.groups for flag in group.flags})
    template = _environment().get_template("report.html.j2")
    return template.render(
        spec=inspection.spec,
        module_class=inspection.module_class,
        inputs=inspection.inputs,
        has_stage_inputs=bool(inspection.graph.inputs),
        summary=inspection.summary(),
        verify=verify,
        verify_note=META_VERIFY_NOTE,
        checks=[("input", check) for check in verify.inputs] + [("param", check) for check in verify.params]
        if verify is not None
        else [],
        flops=inspection.flops,
        flops_bars=_flops_bars(inspection.flops),
        extra_flops=_extra_flops(inspection),
        coverage=inspection.coverage,
        unused_params=list(inspection.groups.unused_params),
        group_rows=_group_rows(inspection),
        flag_legend=[(flag, FLAG_MEANINGS.get(flag, "")) for flag in used_flags],
        collapse_depth=inspection.collapse_depth,
        svg=None if inspection.svg is None else _inline_svg(inspection.svg),
        diagram_note=inspection.diagram_note or "Graphviz could not lay out the graph.",
        files=files,
        default_files=FILES,
        file_meanings=[
            (name, _FILE_MEANINGS[kind]) for kind, name in files.items() if name and kind in _FILE_MEANINGS
        ],
        timing=", ".join(f"{name} {seconds:.2f} s" for name, seconds in inspection.timings.items()),
        listed_names=LISTED_NAMES,
    )
