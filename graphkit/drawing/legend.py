"""The legend above a diagram: one row per parameter group, and a key to the colours and shapes in use.

The legend lives in the graph label rather than in a node, so its height never stretches a rank of
the layout; groups are listed in columns of at most ``LEGEND_ROWS`` rows, the first 72 groups at most.
"""

from __future__ import annotations

from graphkit.drawing.labels import escape
from graphkit.drawing.palette import ENDPOINT_FILL, MODULE_FILL, SECONDARY_TEXT, cell_border, group_style
from graphkit.drawing.plan import DiagramPlan
from graphkit.graph.autograd_graph import NodeKind

__all__ = ["AUTO_LEGEND_GROUPS", "graph_label"]


_MAX_LEGEND_MODULES = 3


_LEGEND_ROWS = 24


_MAX_LEGEND_GROUPS = 3 * _LEGEND_ROWS


def _group_rows(plan: DiagramPlan) -> list[str]:
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
            lines.append(escape(f"{module}: {joined}" if module else joined))
        if len(by_module) > _MAX_LEGEND_MODULES:
            hidden = sum(len(leaves) for leaves in list(by_module.values())[_MAX_LEGEND_MODULES:])
            lines.append(
                escape(f"... +{hidden} parameters in {len(by_module) - _MAX_LEGEND_MODULES} modules")
            )
        if group.flags:
            flags = ", ".join(str(flag) for flag in group.flags)
            lines.append(f'<i><font color="{SECONDARY_TEXT}">{escape(flags)}</font></i>')
        rows.append(
            f'<tr><td bgcolor="{style.tint}" {cell_border(style)}>'
            f'<font color="{style.text}"><b>group {group.index}</b></font></td>'
            f'<td align="left" balign="left"><font point-size="10">{"<br/>".join(lines)}</font></td></tr>'
        )
    return rows


def _roles_drawn(plan: DiagramPlan) -> set[str]:
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


def _key_rows(plan: DiagramPlan, *, proxies: bool, pairs_per_row: int = 1) -> list[str]:
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
                f'<td bgcolor="{ENDPOINT_FILL}"><font color="#FFFFFF">input / output</font></td>',
                "stage input (points down) / stage output (points up)",
            )
        )
    else:
        key.append(
            (f'<td bgcolor="{ENDPOINT_FILL}"><font color="#FFFFFF">output</font></td>', "stage output")
        )
    if plan.modules:
        key.append(
            (
                f'<td bgcolor="{MODULE_FILL}" border="1">module</td>',
                "folded repeats (\u00d7N: how many nodes); chips: groups inside"
                if any(module.repeats for module in plan.modules.values())
                else "collapsed module; chips: groups inside",
            )
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
        f'{cell}<td align="left"><font point-size="10">{escape(meaning)}</font></td>' for cell, meaning in key
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
            f"(no path to an output): {escape(shown)}</font></td></tr>"
        )
    return rows


def _table(sections: list[tuple[str, list[str]]], columns: int = 2) -> str:
    """A bordered HTML table: for each section a grey header row, then its rows."""
    body = "".join(
        f'<tr><td colspan="{columns}" bgcolor="#EEEEEE" align="left">{header}</td></tr>' + "".join(rows)
        for header, rows in sections
    )
    return f'<table border="0" cellborder="1" cellspacing="0" cellpadding="3" color="#BBBBBB">{body}</table>'


AUTO_LEGEND_GROUPS = _LEGEND_ROWS
"""With ``legend="auto"``, the groups are listed up to this many; past it the legend is one line and the key."""


def graph_label(
    plan: DiagramPlan, title: str | None, *, proxies: bool, legend: bool | str = True
) -> str | None:
    """The graph's HTML label, above the drawing: title, notes, and the legend.

    The legend lives in the graph label rather than in a node so that its height never stretches a rank
    of the layout. Groups are listed in columns of at most ``_LEGEND_ROWS`` rows. ``legend``: True lists
    the groups (the first 72) and the key; ``"auto"`` lists them only up to :data:`AUTO_LEGEND_GROUPS`
    groups, else says how many there are (each cluster and chip carries its number); False: no legend.

    Raises:
        ValueError: ``legend`` is none of True, False, ``"auto"``.
    """
    if legend not in (True, False, "auto"):
        raise ValueError(f"legend must be True, False or 'auto', got {legend!r}")
    rows = []
    if title:
        rows.append(f'<tr><td align="left"><font point-size="14"><b>{escape(title)}</b></font></td></tr>')
    for note in plan.notes:
        rows.append(
            f'<tr><td align="left"><font point-size="11" color="{SECONDARY_TEXT}">{escape(note)}</font></td></tr>'
        )
    key_header = "<b>key</b>"
    if legend is False:
        pass
    elif legend == "auto" and len(plan.groups) > AUTO_LEGEND_GROUPS:
        header = (
            f'<b>{len(plan.groups)} parameter groups</b> <font point-size="9">(numbered in forward order on '
            "each box and chip; graphkit groups SPEC lists them)</font>"
        )
        rows.append(
            f'<tr><td align="left">{_table([(header, []), (key_header, _key_rows(plan, proxies=proxies))])}</td></tr>'
        )
    elif plan.groups:
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
    elif plan.modules and legend is not False:
        rows.append(
            f'<tr><td align="left">{_table([(key_header, _key_rows(plan, proxies=proxies))])}</td></tr>'
        )
    if not rows:
        return None
    return '<<table border="0" cellspacing="0" cellpadding="2">' + "".join(rows) + "</table>>"
