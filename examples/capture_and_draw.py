"""Capture the autograd graph of a small transformer stage, print what it holds, and draw it.

    .venv/bin/python examples/capture_and_draw.py                 # writes gpt_stage.svg and gpt_stage.dot here
    .venv/bin/python examples/capture_and_draw.py -o out/ --collapse 2

Needs Graphviz's ``dot`` for the SVG (``apt-get install graphviz``); the ``.dot`` file is written without it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import graphkit
from graphkit.drawing import render
from graphkit.models import zoo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=".", help="folder for gpt_stage.svg and gpt_stage.dot")
    parser.add_argument(
        "--collapse", type=int, default=None, metavar="DEPTH", help="collapse modules at DEPTH"
    )
    arguments = parser.parse_args()

    model, (hidden,) = zoo.gpt_stage()  # hidden states (2, 8, 32) in, two transformer blocks, hidden out
    output, graph = graphkit.trace(model, hidden)

    summary = graph.summary()
    print(f"{summary['nodes']} nodes, {summary['edges']} edges, {summary['parameters']} parameters")
    print(f"saved for the backward: {summary['saved_bytes_total']:,} bytes")
    ops = Counter(op for _, op in graph.nodes(data="op"))
    print("most frequent ops:", ", ".join(f"{op} x{count}" for op, count in ops.most_common(5)))

    # The graph is a networkx.MultiDiGraph: edges run producer -> consumer; nodes carry the details.
    (stage_input,) = graph.nodes_of_kind("stage_input")
    print(f"stage input {stage_input}: shape {graph.nodes[stage_input]['shapes'][0]}")
    biggest = max(graph.nodes, key=lambda node: graph.nodes[node].get("saved_bytes") or 0)
    data = graph.nodes[biggest]
    print(f"largest saved tensors: {data['op']} in {data['module_path']}, {data['saved_bytes']:,} bytes")

    folder = Path(arguments.output)
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in ("dot", "svg"):
        path = render(graph, folder / f"gpt_stage.{suffix}", collapse_depth=arguments.collapse)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
