"""Collapsing by module path: which module a node folds into at a depth, and how many nodes a drawing has.

``collapse_key("blocks.0.attn.qkv", 2) == "blocks.0"``; :func:`choose_collapse_depth` picks the deepest
depth whose drawing fits a node budget. Module paths come from :func:`graphkit.trace`.
"""

from __future__ import annotations

from collections.abc import Collection

from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = ["choose_collapse_depth", "collapse_key", "collapsible_path", "drawn_node_count"]


# --- collapse by module path --------------------------------------------------------------------------------
def collapse_key(module_path: str | None, depth: int, expanded: Collection[str] = ()) -> str | None:
    """The module a node collapses into at ``depth``: the first ``depth`` parts of its module path.

    None when the node stays as it is: no module path, the top-level module (``""``) or a module shallower
    than ``depth``. ``collapse_key("blocks.0.attn.qkv", 2) == "blocks.0"``. A module in ``expanded`` is
    opened one level: its submodules collapse instead (``"blocks.0.attn"`` with ``expanded={"blocks.0"}``),
    and nodes made by the expanded module itself are drawn as they are.
    """
    if not module_path:
        return None
    parts = module_path.split(".")
    if len(parts) < depth:
        return None
    while depth <= len(parts) and ".".join(parts[:depth]) in expanded:
        depth += 1
    if depth > len(parts):
        return None
    return ".".join(parts[:depth])


def collapsible_path(graph: AutogradGraph, node: str) -> str | None:
    data = graph.nodes[node]
    if str(data["kind"]) == NodeKind.STAGE_INPUT.value:
        return None  # stage inputs are endpoints: always drawn
    return data.get("module_path")


def drawn_node_count(graph: AutogradGraph, collapse_depth: int | None, expanded: Collection[str] = ()) -> int:
    """Nodes :func:`~graphkit.drawing.diagram.draw` lays out at ``collapse_depth`` (None: no collapse), stage-output markers included.

    Proxy copies of shared nodes and the legend are not counted.
    """
    keys: set[str] = set()
    kept = 0
    for node in graph.nodes:
        key = (
            collapse_key(collapsible_path(graph, node), collapse_depth, expanded) if collapse_depth else None
        )
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
