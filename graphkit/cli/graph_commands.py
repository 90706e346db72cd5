"""``graphkit capture``, ``graphkit groups`` and ``graphkit list``: the autograd graph of a spec, its
parameter groups, and the specs there are."""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from pathlib import Path
from typing import Any

from graphkit.cli.options import add_json_option, add_model_spec
from graphkit.cli.spec_tracing import trace_spec
from graphkit.cli.terminal import print_table

__all__ = ["add_capture_command", "add_groups_command", "add_list_command", "pipeline_description"]


# --- capture -----------------------------------------------------------------------------------------------
def add_capture_command(commands: Any) -> None:
    capture = commands.add_parser("capture", help="capture the autograd graph and print a summary")
    add_model_spec(capture)
    formats = capture.add_mutually_exclusive_group()
    formats.add_argument("--json", action="store_true", help="print node-link JSON instead of the summary")
    formats.add_argument("--graphml", metavar="FILE", help="also write GraphML to FILE")
    formats.add_argument("--dot", metavar="FILE", help="also write DOT source to FILE")
    capture.set_defaults(run=run_capture)


def run_capture(arguments: argparse.Namespace) -> int:
    _, _, graph = trace_spec(arguments.spec)
    if arguments.json:
        print(graph.to_json(indent=1))
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
    if note := skipped_outputs_note(graph):
        print(note)
    if summary["saved_bytes_total"] is not None:
        print(f"saved tensors: {summary['saved_bytes_total']:,} bytes")
    parameters = graph.parameter_nodes()
    rows = [("parameter", "node", "shape")]
    for name, node in parameters.items():
        shapes = graph.nodes[node].get("shapes") or [()]
        rows.append((name, node, "x".join(str(size) for size in shapes[0]) or "scalar"))
    print_table(rows)
    if summary["unused_params"]:
        print(f"unused parameters: {', '.join(summary['unused_params'])}")
    for label, path in (("GraphML", arguments.graphml), ("DOT", arguments.dot)):
        if path:
            print(f"wrote {label} to {path}")
    return 0


# --- groups ------------------------------------------------------------------------------------------------
def add_groups_command(commands: Any) -> None:
    groups = commands.add_parser("groups", help="list the parameter groups of the split backward")
    add_model_spec(groups)
    add_json_option(groups)
    groups.set_defaults(run=run_groups)


def run_groups(arguments: argparse.Namespace) -> int:
    from graphkit.analysis.parameter_groups import param_groups, tensor_names

    _, _, graph = trace_spec(arguments.spec)
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
                ", ".join(tensor_names(graph, group.params)),
                intermediates or "-",
                ", ".join(map(str, group.flags)) or "-",
            )
        )
    print_table(rows, wrap={1: 64, 2: 40})
    if not graph.inputs:
        print(textwrap.fill(no_input_gradient_note(len(groups)), 110))
    if note := skipped_outputs_note(graph):
        print(note)
    if groups.unused_params:
        print(f"unused parameters: {', '.join(groups.unused_params)}")
    for line in groups.opaque_lines():
        print(line)
    return 0


def skipped_outputs_note(graph: Any) -> str:
    """One line naming the outputs that are no tensors (an int in a dict), which the graph leaves out."""
    skipped = graph.graph.get("skipped_outputs") or []
    if not skipped:
        return ""
    names = ", ".join(f"{entry['name']} ({entry['type']})" for entry in skipped)
    return f"outputs left out, as no tensors (no gradient flows through them): {names}"


def no_input_gradient_note(group_count: int) -> str:
    """Why a model whose inputs need no gradient (token ids, a first stage) is all W: one line."""
    return (
        "no input requires grad (token ids, or a first stage's data): there is no input gradient for B to "
        "compute, so every parameter's gradient is W's work"
        + (", in one group" if group_count == 1 else "")
        + "; give an input requires_grad=True (a middle stage's hidden states, hf:...?stage=middle) to see B and W share it"
    )


# --- list --------------------------------------------------------------------------------------------------
def add_list_command(commands: Any) -> None:
    listing = commands.add_parser(
        "list", help="list the zoo models, the hf: architectures and the built-in pipeline specs"
    )
    add_json_option(listing)
    listing.set_defaults(run=run_list)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :func:`mlp_pipeline`, :class:`~module.MLPStage`


def pipeline_description(name: str, function: Any) -> str:
    """The first line of a built-in pipeline function's docstring, as plain text.

    The line's own ``zoo-pipeline:NAME:`` lead-in is left out, reStructuredText roles and literals become
    their text, and a reference to another built-in pipeline's function becomes its spec.
    """
    from graphkit.models.pipeline_specs import PIPELINES

    specs = {builtin.__name__: f"zoo-pipeline:{other}" for other, builtin in PIPELINES.items()}
    line = (function.__doc__ or function.__name__).strip().splitlines()[0].strip()
    line = _ROLE.sub(lambda match: specs.get(match[1], match[1].rpartition(".")[2]), line)
    line = line.replace("``", "")
    return line.removeprefix(f"zoo-pipeline:{name}:").strip()


def run_list(arguments: argparse.Namespace) -> int:
    from graphkit.models import zoo
    from graphkit.models.huggingface import KNOWN_ARCHITECTURES
    from graphkit.models.pipeline_specs import PIPELINE_ARCHITECTURES, PIPELINES

    zoo_rows = [(f"zoo:{name}", model.description) for name, model in zoo.MODELS.items()]
    hf_rows = [(f"hf:{name}", description) for name, description in KNOWN_ARCHITECTURES.items()]
    pipeline_rows = [
        (f"zoo-pipeline:{name}", pipeline_description(name, function)) for name, function in PIPELINES.items()
    ]
    hf_pipeline_rows = [(f"hf:{name}", description) for name, description in PIPELINE_ARCHITECTURES.items()]
    if arguments.json:
        payload = {
            "zoo": dict(zoo_rows),
            "hf": dict(hf_rows),
            "zoo-pipeline": dict(pipeline_rows),
            "hf-pipeline": dict(hf_pipeline_rows),
        }
        print(json.dumps(payload, indent=1))
        return 0
    print("built-in models (zoo:NAME):")
    print_table([("spec", "what it is"), *zoo_rows], wrap_last=True)
    print()
    print("Hugging Face architectures (hf:ARCH[?key=value&...], needs the 'models' extra; no download):")
    print_table([("spec", "what it is"), *hf_rows], wrap_last=True)
    print()
    print("Also: path/to/file.py:function or package.module:function returning (module, inputs).")
    print(
        "Examples: graphkit inspect zoo:gpt_stage; graphkit render 'hf:llama?stage=middle&n_layer=2' -o llama.svg"
    )
    print()
    print("built-in pipelines (zoo-pipeline:NAME):")
    print_table([("pipeline spec", "what it is"), *pipeline_rows], wrap_last=True)
    print()
    print(
        "Hugging Face architectures cut into pipeline stages (hf:ARCH[?key=value&...], the 'models' extra):"
    )
    print_table([("pipeline spec", "what it is"), *hf_pipeline_rows], wrap_last=True)
    print()
    print(
        "Also: path/to/file.py:function or package.module:function returning (stages, loss_fn, inputs, target)."
    )
    print(
        "Pipeline specs go to plan, timeline, compare-schedules, verify-pipeline and costs "
        "(hf: with costs --pipeline)."
    )
    print("Example: graphkit verify-pipeline 'hf:gpt2?n_layer=4' --ranks 2")
    return 0
