"""The ``graphkit`` command: a thin shell over the library.

Subcommands::

    graphkit capture SPEC [--json | --graphml FILE | --dot FILE]
    graphkit groups  SPEC [--json]
    graphkit verify  SPEC [--dtype float32|float64] [--device cpu|cuda] [--seed N] [--autocast bfloat16]
                     [--recompute in-w|keep-from-b] [--json]
    graphkit render  SPEC -o OUT.{svg,png,pdf,dot} [--collapse DEPTH] [--max-nodes N]
    graphkit inspect [SPEC] [-o DIR] [--device ...] [--dtype ...] [--collapse DEPTH]
    graphkit bench   SPEC [--repeat N] [--threads N] [--json]

SPEC is ``zoo:NAME``, ``path/to/file.py:function``, ``package.module:function`` or ``hf:ARCH?key=value``
(see :mod:`graphkit.models.specs`). Exit status: 0 on success, 1 when a verification fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["main"]

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _load(spec: str) -> tuple[torch.nn.Module, Any]:
    from graphkit.models.specs import load_spec

    return load_spec(spec)


def _trace(spec: str) -> tuple[torch.nn.Module, Any, Any]:
    from graphkit.graph.tracing import trace
    from graphkit.models.specs import spec_inputs_as_call

    module, inputs = _load(spec)
    args, kwargs = spec_inputs_as_call(inputs)
    outputs, graph = trace(module, *args, **kwargs)
    return module, outputs, graph


def _print_table(rows: Sequence[Sequence[str]], out: Any = None) -> None:
    out = out or sys.stdout
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(rows[0]))]
    for position, row in enumerate(rows):
        print(
            "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )
        if position == 0:
            print("  ".join("-" * width for width in widths), file=out)


# --- subcommands -------------------------------------------------------------------------------------------
def _capture(arguments: argparse.Namespace) -> int:
    _, _, graph = _trace(arguments.spec)
    if arguments.json:
        print(json.dumps(graph.to_json(), indent=1))
        return 0
    if arguments.graphml:
        graph.to_graphml(arguments.graphml)
    if arguments.dot:
        Path(arguments.dot).write_text(graph.to_dot())
    summary = graph.summary()
    print(f"autograd graph of {arguments.spec}: {summary['nodes']} nodes, {summary['edges']} edges")
    print("node kinds: " + ", ".join(f"{kind} {count}" for kind, count in summary["kinds"].items()))
    ops: dict[str, int] = {}
    for _, op in graph.nodes(data="op"):
        ops[op] = ops.get(op, 0) + 1
    top = sorted(ops.items(), key=lambda item: (-item[1], item[0]))[:8]
    print("most frequent ops: " + ", ".join(f"{op} {count}" for op, count in top))
    print(f"stage inputs: {', '.join(summary['inputs']) or '(none require grad)'}")
    print(f"stage outputs: {', '.join(summary['outputs'])}")
    if summary["saved_bytes_total"] is not None:
        print(f"saved tensors: {summary['saved_bytes_total']:,} bytes")
    parameters = graph.parameter_nodes()
    rows = [("parameter", "node", "shape")]
    for name, node in parameters.items():
        shapes = graph.nodes[node].get("shapes") or [()]
        rows.append((name, node, "x".join(str(size) for size in shapes[0]) or "scalar"))
    _print_table(rows)
    if summary["unused_params"]:
        print(f"unused parameters: {', '.join(summary['unused_params'])}")
    for label, path in (("GraphML", arguments.graphml), ("DOT", arguments.dot)):
        if path:
            print(f"wrote {label} to {path}")
    return 0


def _groups(arguments: argparse.Namespace) -> int:
    from graphkit.analysis.parameter_groups import param_groups

    _, _, graph = _trace(arguments.spec)
    groups = param_groups(graph)
    if arguments.json:
        payload = {
            "nodes": graph.number_of_nodes(),
            "edges": graph.number_of_edges(),
            **groups.to_dict(),
        }
        print(json.dumps(payload, indent=1))
        return 0
    print(f"{len(groups)} parameter groups in {arguments.spec} ({graph.number_of_nodes()} nodes)")
    rows = [("group", "parameters", "intermediates", "flags")]
    for group in groups:
        intermediates = ", ".join(f"{node} {graph.nodes[node]['op']}" for node in group.intermediates)
        if group.output_entries:
            outputs = ", ".join(f"output {entry.name}" for entry in group.output_entries)
            intermediates = f"{intermediates}, {outputs}" if intermediates else outputs
        rows.append(
            (
                str(group.index),
                ", ".join(group.params),
                intermediates or "-",
                ", ".join(map(str, group.flags)) or "-",
            )
        )
    _print_table(rows)
    if groups.unused_params:
        print(f"unused parameters: {', '.join(groups.unused_params)}")
    for line in groups.opaque_lines():
        print(line)
    return 0


def _verify(arguments: argparse.Namespace) -> int:
    from graphkit.split.verification import verify_split

    module, inputs = _load(arguments.spec)
    report = verify_split(
        module,
        inputs,
        dtype=DTYPES[arguments.dtype] if arguments.dtype else None,
        device=arguments.device,
        seed=arguments.seed,
        autocast_dtype=DTYPES[arguments.autocast] if arguments.autocast else None,
        recompute=arguments.recompute,
    )
    if arguments.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report.table())
    return 0 if report.ok else 1


def _render(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.rendering import render

    _, _, graph = _trace(arguments.spec)
    path = render(graph, arguments.output, collapse_depth=arguments.collapse, max_nodes=arguments.max_nodes)
    print(f"wrote {path}")
    return 0


def _inspect(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.report import inspect

    return inspect(
        arguments.spec,
        output=Path(arguments.output),
        device=arguments.device,
        dtype=DTYPES[arguments.dtype] if arguments.dtype else None,
        collapse_depth=arguments.collapse,
    )


def _bench(arguments: argparse.Namespace) -> int:
    from graphkit.split.benchmark import bench_spec

    return bench_spec(
        arguments.spec, repeat=arguments.repeat, as_json=arguments.json, threads=arguments.threads
    )


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``graphkit`` command (also used to document the CLI)."""
    parser = argparse.ArgumentParser(
        prog="graphkit",
        description="See, analyse and split PyTorch autograd graphs.",
        epilog="SPEC: zoo:NAME | path/to/file.py:function | package.module:function | hf:ARCH?key=value",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    capture = commands.add_parser("capture", help="capture the autograd graph and print a summary")
    capture.add_argument("spec", metavar="SPEC")
    formats = capture.add_mutually_exclusive_group()
    formats.add_argument("--json", action="store_true", help="print node-link JSON instead of the summary")
    formats.add_argument("--graphml", metavar="FILE", help="also write GraphML to FILE")
    formats.add_argument("--dot", metavar="FILE", help="also write DOT source to FILE")
    capture.set_defaults(run=_capture)

    groups = commands.add_parser("groups", help="list the parameter groups of the split backward")
    groups.add_argument("spec", metavar="SPEC")
    groups.add_argument("--json", action="store_true", help="print JSON")
    groups.set_defaults(run=_groups)

    verify = commands.add_parser(
        "verify", help="check split (B then W) against a full backward; exit 1 if not equal"
    )
    verify.add_argument("spec", metavar="SPEC")
    verify.add_argument("--dtype", choices=["float32", "float64"], help="cast the model and inputs")
    verify.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: where the model is)")
    verify.add_argument("--seed", type=int, default=0, help="seed of the random cotangents (default 0)")
    verify.add_argument(
        "--autocast", choices=["bfloat16", "float16"], help="run the forward under torch.autocast"
    )
    verify.add_argument(
        "--recompute",
        choices=["in-w", "keep-from-b"],
        default="in-w",
        help="when W gets the saved tensors of activation checkpoints: recompute them (default) or keep B's",
    )
    verify.add_argument("--json", action="store_true", help="print JSON")
    verify.set_defaults(run=_verify)

    render = commands.add_parser("render", help="draw the graph with its parameter groups")
    render.add_argument("spec", metavar="SPEC")
    render.add_argument("-o", "--output", required=True, help="OUT.svg, .png, .pdf or .dot")
    render.add_argument(
        "--collapse", type=int, default=None, metavar="DEPTH", help="collapse modules deeper than DEPTH"
    )
    render.add_argument(
        "--max-nodes", type=int, default=400, metavar="N", help="collapse automatically past N nodes"
    )
    render.set_defaults(run=_render)

    inspect = commands.add_parser("inspect", help="capture, group, verify, measure and draw: an HTML report")
    inspect.add_argument(
        "spec",
        metavar="SPEC",
        nargs="?",
        default=None,
        help="model spec (default: the zoo's GPT-style stage)",
    )
    inspect.add_argument("-o", "--output", default="graphkit-report", metavar="DIR", help="report folder")
    inspect.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: where the model is)")
    inspect.add_argument("--dtype", choices=["float32", "float64"], help="cast the model and inputs")
    inspect.add_argument(
        "--collapse", type=int, default=None, metavar="DEPTH", help="collapse modules deeper than DEPTH"
    )
    inspect.set_defaults(run=_inspect)

    bench = commands.add_parser("bench", help="time full backward against B and W")
    bench.add_argument("spec", metavar="SPEC")
    bench.add_argument("--repeat", type=int, default=10)
    bench.add_argument(
        "--threads", type=int, help="intra-op CPU threads (default: PyTorch's; 1 gives steadier ratios)"
    )
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``graphkit`` command; returns the exit status."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    try:
        return arguments.run(arguments)
    except (ValueError, ImportError, OSError) as error:  # SpecError, GraphkitInputError, files
        print(f"graphkit {arguments.command}: error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        if type(error).__name__ in {"GraphvizNotFoundError", "RenderTimeoutError"}:
            print(f"graphkit {arguments.command}: error: {error}", file=sys.stderr)
            return 2
        raise
