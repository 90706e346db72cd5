"""Folding repeated structure: a loop over one module, or a stack of identical blocks, drawn once with a count.

torchview's ``roll=True`` draws the repeated calls of one module once; :func:`repeat_keys` does the same
for any autograd graph, module paths or not. Two nodes are *repeats* of each other when they compute
the same op (same kind, op, output shapes, module path and parameter names up to the numbers in them:
``h.3.attn`` and ``h.7.attn`` match) on inputs that are repeats of each other, looked at ``rounds`` producers
deep (Weisfeiler-Lehman colour refinement over the producer edges). The steps of a 1500-step recurrence
all match except the first few (whose inputs reach the stage input within ``rounds`` steps); the blocks
of a GPT stack match block by block. Stage inputs, stage outputs and unnamed leaves never fold.

Drawing every class of repeats as one node turns a 6000-node recurrence into a dozen nodes that
Graphviz lays out in milliseconds; each folded node says how many nodes it stands for.
"""

from __future__ import annotations

import hashlib
import re

from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = ["DEFAULT_ROUNDS", "folded_node_count", "repeat_keys"]

DEFAULT_ROUNDS = 3
"""Producers looked at, in depth, before two nodes count as repeats."""

_NUMBER = re.compile(r"\d+")


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def _base_label(graph: AutogradGraph, node: str) -> str:
    data = graph.nodes[node]
    kind = str(data["kind"])
    if kind in (NodeKind.STAGE_INPUT.value, NodeKind.STAGE_OUTPUT.value) or (
        kind == NodeKind.LEAF.value and not data.get("param_names")
    ):
        return f"unique:{node}"
    names = ",".join(_NUMBER.sub("#", name) for name in data.get("param_names") or [])
    path = _NUMBER.sub("#", data.get("module_path") or "")
    shapes = repr(data.get("shapes") or [])
    return f"{kind}|{data.get('op')}|{shapes}|{path}|{names}"


def repeat_keys(graph: AutogradGraph, rounds: int = DEFAULT_ROUNDS) -> dict[str, str]:
    """A key per node; nodes with the same key are repeats of one another (see the module docstring).

    Args:
        graph: a captured graph.
        rounds: producers looked at in depth (>= 0; 0 compares the nodes alone).

    Returns:
        ``{node id: key}``, deterministic. O(rounds * (nodes + edges)), iterative.

    Raises:
        ValueError: ``rounds < 0``.
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    labels = {node: _digest(_base_label(graph, node)) for node in graph.nodes}
    for _ in range(rounds):
        refined = {}
        for node in graph.nodes:
            inputs = sorted(
                f"{labels[producer]}:{data['output_nr']}:{data['input_nr']}"
                for producer, _, data in graph.in_edges(node, data=True)
            )
            refined[node] = _digest(labels[node] + "(" + ",".join(inputs) + ")")
        labels = refined
    return labels


def folded_node_count(graph: AutogradGraph, keys: dict[str, str] | None = None) -> int:
    """Nodes a folded drawing lays out (one per class of repeats), stage-output markers included.

    ``keys``: the :func:`repeat_keys` of ``graph`` when already computed.
    """
    keys = repeat_keys(graph) if keys is None else keys
    return len(set(keys.values())) + len(graph.graph.get("outputs", []))
