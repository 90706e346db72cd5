"""What a diagram shows, decided before any DOT is written.

:func:`plan_diagram` validates the options of :func:`graphkit.drawing.diagram.draw`, chooses the collapse
depth, and records which group each node belongs to, which nodes are intermediates, and which collapsed
module stands for which nodes (a :class:`DiagramPlan`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from graphkit.analysis.closures import input_closure
from graphkit.analysis.parameter_groups import ParamGroup, param_groups
from graphkit.drawing.collapsing import (
    choose_collapse_depth,
    collapse_key,
    collapsible_path,
    drawn_node_count,
)
from graphkit.drawing.folding import folded_node_count, repeat_keys
from graphkit.drawing.palette import GroupStyle, group_style
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = [
    "CollapsedModule",
    "DiagramPlan",
    "captured_outputs",
    "common_module",
    "drawn_parameter_names",
    "plan_diagram",
    "resolve_groups",
]


_NUMBER = re.compile(r"\d+")


# --- what each node is --------------------------------------------------------------------------------------
@dataclass(slots=True)
class CollapsedModule:
    """A collapsed module: one drawn node for every node whose module path starts with ``path``."""

    path: str
    drawn_id: str
    members: list[str] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    parameters: int = 0
    saved_bytes: int = 0
    weight_only_group: int | None = None  # the group, when every member is a weight-only node or leaf of it
    repeats: int = 0  # a fold of repeated structure: how many nodes it stands for (0: a collapsed module)
    op: str = ""  # a fold's op


@dataclass(slots=True)
class DiagramPlan:
    """Everything :func:`~graphkit.drawing.diagram.draw` decided before writing DOT."""

    graph: AutogradGraph
    groups: list[ParamGroup]
    node_group: dict[str, int]
    intermediates: set[str]
    input_path: set[str]
    drawn: dict[str, str]  # node id -> drawn node id (itself, or a collapsed module's id)
    modules: dict[str, CollapsedModule]  # drawn id -> module
    prefixes: dict[int, str]  # group index -> module shared by its parameters ("" if none)
    highlight: int | None
    notes: list[str]

    def style(self, index: int) -> GroupStyle:
        return group_style(index, faded=self.highlight is not None and index != self.highlight)


def common_module(names: Iterable[str]) -> str:
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


def resolve_groups(graph: AutogradGraph, groups: Any) -> list[ParamGroup]:
    if groups is None:
        return list(param_groups(graph))
    if groups is False:
        return []
    return list(groups)


def drawn_parameter_names(plan: DiagramPlan, node: str) -> list[str]:
    data = plan.graph.nodes[node]
    names = list(data.get("param_names") or [])
    if not names:
        return [f"leaf {node}"]
    prefix = plan.prefixes.get(plan.node_group.get(node, -1), "")
    if prefix:
        names = [name[len(prefix) + 1 :] if name.startswith(prefix + ".") else name for name in names]
    return names


def captured_outputs(graph: AutogradGraph, node: str) -> list[int]:
    """Forward outputs of ``node`` that receive a gradient (have a consumer or are a stage output)."""
    used = {output_nr for _, _, output_nr in graph.out_edges(node, data="output_nr")}
    used.update(endpoint.output_nr for endpoint in graph.outputs if endpoint.node == node)
    return sorted(used)


# --- the drawing ----------------------------------------------------------------------------------------------
def plan_diagram(
    graph: AutogradGraph,
    groups: list[ParamGroup],
    collapse_depth: int | None,
    max_nodes: int | None,
    highlight: int | None,
    fold: bool | None = None,
    expanded: Collection[str] = (),
) -> DiagramPlan:
    """Decide what :func:`~graphkit.drawing.diagram.draw` shows (see its docstring for the options).

    ``fold``: True draws repeated structure once per class of repeats (:mod:`graphkit.drawing.folding`);
    None folds only when no collapse depth brings the graph within ``max_nodes``; False never folds.
    ``expanded``: collapsed modules drawn open one level (see :func:`~graphkit.drawing.collapsing.collapse_key`).
    """
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
    fold_keys: dict[str, str] | None = None
    if fold:
        fold_keys = repeat_keys(graph)
        total = drawn_node_count(graph, None)
        notes.append(
            f"repeated structure folded: {total} nodes drawn as {folded_node_count(graph, fold_keys)}"
        )
        collapse_depth = None
    elif collapse_depth is None and max_nodes is not None:
        depth, count = choose_collapse_depth(graph, max_nodes)
        total = drawn_node_count(graph, None)
        keys = (
            repeat_keys(graph)
            if total > max_nodes and fold is None and (depth is None or count > max_nodes)
            else None
        )
        folded = folded_node_count(graph, keys) if keys is not None else None
        if folded is not None and folded < min(count, total):
            fold_keys = keys
            fits = "" if folded <= max_nodes else ", still over the budget: collapse by hand"
            notes.append(
                f"{total} nodes > max_nodes={max_nodes}: repeated structure folded ({folded} nodes drawn{fits})"
            )
        elif depth is not None:
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
    prefixes = {group.index: common_module(group.params) for group in groups}

    drawn: dict[str, str] = {}
    modules: dict[str, CollapsedModule] = {}
    repeat_count: dict[str, int] = {}
    for key in (fold_keys or {}).values():
        repeat_count[key] = repeat_count.get(key, 0) + 1
    fold_ids: dict[str, str] = {}
    for node in graph.nodes:
        if fold_keys is not None:
            fold_key = fold_keys[node]
            if repeat_count[fold_key] < 2:
                drawn[node] = node
                continue
            drawn_id = fold_ids.setdefault(fold_key, f"fold.{len(fold_ids)}")
            module = modules.get(drawn_id)
            if module is None:
                data = graph.nodes[node]
                path = data.get("module_path") or ""
                names = data.get("param_names") or []
                module = modules[drawn_id] = CollapsedModule(
                    names[0] if names else path,
                    drawn_id,
                    repeats=repeat_count[fold_key],
                    op=names[0] if names else (data.get("op") or ""),
                )
            key = None
        else:
            key = (
                collapse_key(collapsible_path(graph, node), collapse_depth, expanded)
                if collapse_depth
                else None
            )
            if key is None:
                drawn[node] = node
                continue
            drawn_id = f"module.{key}"
            module = modules.get(drawn_id)
            if module is None:
                module = modules[drawn_id] = CollapsedModule(key, drawn_id)
        module.members.append(node)
        drawn[node] = drawn_id
        data = graph.nodes[node]
        if node in node_group and node_group[node] not in module.groups:
            module.groups.append(node_group[node])
        module.parameters += len(data.get("param_names") or [])
        module.saved_bytes += data.get("saved_bytes") or 0
    for module in modules.values():
        module.groups.sort()
        if module.repeats and graph.nodes[module.members[0]].get("param_names"):
            names = {graph.nodes[member]["param_names"][0] for member in module.members}
            if len(names) > 1:  # the same parameter of repeated blocks: h.0.mlp.fc.weight, h.1.mlp...
                module.path = module.op = _NUMBER.sub("*", module.path)
        if len(module.groups) == 1 and all(
            node in node_group and node not in intermediates for node in module.members
        ):
            module.weight_only_group = module.groups[0]
    return DiagramPlan(
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
