"""The ``graphkit`` command: a thin shell over the library.

Subcommands::

    graphkit capture SPEC [--json | --graphml FILE | --dot FILE]
    graphkit groups  SPEC [--json]
    graphkit verify  SPEC [--dtype float32|float64] [--device cpu|cuda] [--seed N] [--autocast bfloat16]
                     [--recompute in-w|keep-from-b] [--json]
    graphkit render  SPEC -o OUT.{svg,png,pdf,dot} [--collapse DEPTH] [--max-nodes N] [--fold | --no-fold]
                     [--highlight GROUP] [--plain] [--saved] [--module-paths] [--no-shapes]
                     [--direction BT|TB|LR|RL] [--legend auto|on|off] [--device cpu|meta|...] [--timeout S]
    graphkit inspect [SPEC] [-o DIR] [--device cpu|cuda|meta] [--dtype ...] [--collapse DEPTH] [--max-nodes N]
    graphkit list    [--json]
    graphkit bench   SPEC [--repeat N] [--threads N] [--json]
    graphkit costs   SPEC|PIPELINE_SPEC [--pipeline] [--num-stages N] [--batch-size B] [--microbatches M]
                     [--device ...] [--repeat N] [--warmup N] [--threads N] [--json]
    graphkit timeline PIPELINE_SPEC --schedule NAME [--microbatches N] [--ranks R] [--stage graphkit|torch]
                     -o OUT.{svg,png,html,json}
    graphkit compare-schedules PIPELINE_SPEC [--schedules A,B,...] [--microbatches N] [--ranks R] [-o DIR]
    graphkit verify-pipeline PIPELINE_SPEC --schedule NAME --microbatches N [--ranks R] [--ddp | --fsdp]
                     [--steps N] [--stages-per-rank K] [--stage graphkit|torch] [--timeline OUT] [--json]

SPEC is ``zoo:NAME``, ``path/to/file.py:function``, ``package.module:function`` or ``hf:ARCH?key=value``
(see :mod:`graphkit.models.specs`); PIPELINE_SPEC is ``path/to/file.py:function``, ``package.module:function``,
``zoo-pipeline:NAME`` or ``hf:gpt2?key=value`` (one format for every pipeline command, see
:mod:`graphkit.models.pipeline_specs`). Exit status: 0 on success, 1 when a verification fails, 2 on bad input.
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


def _trace(spec: str, device: str | None = None) -> tuple[torch.nn.Module, Any, Any]:
    from graphkit.graph.tracing import trace
    from graphkit.models.specs import load_spec_on, meta_forward_error, spec_inputs_as_call

    module, inputs = load_spec_on(spec, device) if device is not None else _load(spec)
    args, kwargs = spec_inputs_as_call(inputs)
    try:
        outputs, graph = trace(module, *args, **kwargs)
    except RuntimeError as error:
        clear = meta_forward_error(spec, error) if device is not None else None
        if clear is None:
            raise
        raise clear from error
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

    if arguments.device is not None and torch.device(arguments.device).type == "meta":
        raise ValueError(
            "verify compares gradient values, and tensors on the meta device have shapes but no values: "
            "run it on cpu or cuda. 'graphkit inspect SPEC --device meta' shows the graph, groups and FLOPs"
        )

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


def _progress(command: str) -> Any:
    """A function that prints one progress line (with the seconds since the command started) to stderr."""
    import time

    start = time.perf_counter()

    def say(text: str) -> None:
        print(
            f"graphkit {command}: [{time.perf_counter() - start:6.2f} s] {text}", file=sys.stderr, flush=True
        )

    return say


_LEGEND = {"auto": "auto", "on": True, "off": False}


def _render(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.rendering import render

    say = _progress("render")
    say(f"loading {arguments.spec}" + (f" on {arguments.device}" if arguments.device else ""))
    _, _, graph = _trace(arguments.spec, arguments.device)
    say(f"captured {graph.number_of_nodes()} nodes; drawing")
    groups = False if arguments.plain else None
    if arguments.plain and arguments.highlight is not None:
        raise ValueError("--highlight needs the groups: leave out --plain")
    path = render(
        graph,
        arguments.output,
        groups,
        timeout_s=arguments.timeout,
        progress=say,
        collapse_depth=arguments.collapse,
        max_nodes=arguments.max_nodes,
        fold=arguments.fold,
        highlight_group=arguments.highlight,
        show_saved=arguments.saved,
        show_module=arguments.module_paths,
        show_shapes=not arguments.no_shapes,
        rankdir=arguments.direction,
        legend=_LEGEND[arguments.legend],
        title=arguments.title,
    )
    say("done")
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
        max_nodes=arguments.max_nodes,
        fold=arguments.fold,
        timeout_s=arguments.timeout,
    )


def _list(arguments: argparse.Namespace) -> int:
    from graphkit.models import zoo
    from graphkit.models.huggingface import KNOWN_ARCHITECTURES

    zoo_rows = [(f"zoo:{name}", model.description) for name, model in zoo.MODELS.items()]
    hf_rows = [(f"hf:{name}", description) for name, description in KNOWN_ARCHITECTURES.items()]
    if arguments.json:
        print(json.dumps({"zoo": dict(zoo_rows), "hf": dict(hf_rows)}, indent=1))
        return 0
    print("built-in models (zoo:NAME):")
    _print_table([("spec", "what it is"), *zoo_rows])
    print()
    print("Hugging Face architectures (hf:ARCH[?key=value&...], needs the 'models' extra; no download):")
    _print_table([("spec", "what it is"), *hf_rows])
    print()
    print("Also: path/to/file.py:function or package.module:function returning (module, inputs).")
    print(
        "Examples: graphkit inspect zoo:gpt_stage; graphkit render 'hf:llama?stage=middle&n_layer=2' -o llama.svg"
    )
    return 0


def _fold_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-nodes",
        type=int,
        default=400,
        metavar="N",
        help="past N drawn nodes, collapse modules (or fold repeated structure) automatically (default 400)",
    )
    folding = parser.add_mutually_exclusive_group()
    folding.add_argument(
        "--fold",
        dest="fold",
        action="store_true",
        default=None,
        help="draw repeated structure (a loop over one module, identical blocks) once, with a count",
    )
    folding.add_argument("--no-fold", dest="fold", action="store_false", help="never fold repeated structure")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds Graphviz may take to lay out the diagram before a smaller one is drawn (default 60)",
    )


def _bench(arguments: argparse.Namespace) -> int:
    from graphkit.split.benchmark import bench_spec

    return bench_spec(
        arguments.spec, repeat=arguments.repeat, as_json=arguments.json, threads=arguments.threads
    )


def _costs(arguments: argparse.Namespace) -> int:
    from graphkit.split.costs import spec_costs

    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    costs = spec_costs(
        arguments.spec,
        pipeline=True if arguments.pipeline else None,
        num_stages=arguments.num_stages,
        batch_size=arguments.batch_size,
        microbatches=arguments.microbatches,
        repeat=arguments.repeat,
        warmup=arguments.warmup,
        device=arguments.device,
    )
    if arguments.json:
        print(costs.to_json())
    else:
        print(f"per-microbatch costs of {arguments.spec} ({len(costs.stages)} stage(s))")
        print(costs.table())
    return 0


def _record(arguments: argparse.Namespace, schedules: list[str]) -> list[Any]:
    from graphkit.split.schedule_recording import TimelineError, record_schedules

    try:
        return record_schedules(
            arguments.spec,
            schedules,
            microbatches=arguments.microbatches,
            ranks=arguments.ranks,
            device=arguments.device,
            threads=arguments.threads,
            timeout_s=arguments.timeout,
            stage=arguments.stage,
            stage_class=arguments.stage_class,
            steps=arguments.steps,
            stages_per_rank=arguments.stages_per_rank,
            batch_size=arguments.batch_size,
        )
    except TimelineError as error:  # bad schedule, stages that do not divide, a failed rank: exit 2
        raise ValueError(str(error)) from error


def _timeline(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.timeline import write_timeline

    (timeline,) = _record(arguments, [arguments.schedule])
    stage = arguments.stage_class or arguments.stage
    note = (
        f"graphkit timeline {arguments.spec} --schedule {arguments.schedule} --ranks {arguments.ranks} "
        f"({stage} stages)"
    )
    for output in arguments.output:
        print(f"wrote {write_timeline(timeline, output, title=f'{timeline.schedule} timeline', note=note)}")
    print(
        f"{timeline.schedule}: {timeline.microbatches} microbatches on {len(timeline.ranks)} rank(s), "
        f"step {timeline.step_seconds * 1e3:.3f} ms, bubble {100 * timeline.bubble_fraction:.1f}%"
    )
    return 0


def _compare_schedules(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.timeline import comparison_table, write_timeline

    schedules = [name.strip() for name in arguments.schedules.split(",") if name.strip()]
    timelines = _record(arguments, schedules)
    print(comparison_table(timelines))
    if arguments.json:
        print(json.dumps([timeline.summary() for timeline in timelines], indent=1))
    if arguments.output:
        folder = Path(arguments.output)
        folder.mkdir(parents=True, exist_ok=True)
        stage = arguments.stage_class or arguments.stage
        note = f"graphkit compare-schedules {arguments.spec} --ranks {arguments.ranks} ({stage} stages)"
        for name in ("index.html", "timelines.svg", "timelines.png", "timelines.json"):
            write_timeline(timelines, folder / name, title="Schedules compared", note=note)
        print(f"wrote {folder / 'index.html'} (and timelines.svg, .png, .json)")
    return 0


def _verify_pipeline(arguments: argparse.Namespace) -> int:
    from graphkit.split.pipelining.checker import check_pipeline

    data_parallel = "ddp" if arguments.ddp else "fsdp" if arguments.fsdp else None
    result = check_pipeline(
        arguments.spec,
        schedule=arguments.schedule,
        microbatches=arguments.microbatches,
        steps=arguments.steps,
        ranks=arguments.ranks,
        data_parallel=data_parallel,
        stage=arguments.stage,
        stages_per_rank=arguments.stages_per_rank,
        deadline=arguments.deadline,
        timeline=bool(arguments.timeline),
    )
    written = _write_checked_timeline(arguments, result) if arguments.timeline else []
    if arguments.json:
        payload = {
            "schedule": result.case.schedule,
            "microbatches": result.case.microbatches,
            "steps": result.case.steps,
            "ranks": result.ranks,
            "data_parallel": data_parallel,
            "stage": result.case.stage,
            "passed": result.passed,
            "exact": result.exact,
            "error": result.error,
            "backward_calls": result.backward_calls,
            "parameters": [
                {
                    "name": check.name,
                    "max_abs_error": check.max_abs_error,
                    "relative_error": check.relative_error,
                    "bitwise": check.bitwise,
                    "hooks": check.hooks,
                    "expected_hooks": check.expected_hooks,
                }
                for check in result.parameters
            ],
            "timeline": result.timeline.summary() if result.timeline is not None else None,
            "timeline_files": written,
        }
        print(json.dumps(payload, indent=1))
        return 0 if result.passed else 1
    where = f"{result.ranks} process{'es' if result.ranks > 1 else ''}"
    print(
        f"{arguments.spec}: {result.case.schedule}, {result.case.microbatches} microbatches, "
        f"{result.case.steps} step(s), {where}, {result.case.stage} stages"
        + (f", {data_parallel}" if data_parallel else "")
    )
    if result.error is not None:
        print(f"the schedule step failed: {result.error}")
    if result.parameters:
        print(result.table())
    if result.backward_calls:
        calls = result.backward_calls
        print(
            f"backwards run: {calls['input']} B (graphkit), {calls['weight']} W (graphkit), {calls['full']} full"
        )
    for path in written:
        print(f"wrote {path}")
    if result.timeline is not None:
        print(
            f"recorded the last step: {result.timeline.step_seconds * 1e3:.3f} ms, "
            f"bubble {100 * result.timeline.bubble_fraction:.1f}%"
        )
    if result.passed:
        verdict = (
            "exact: every gradient equals the full backward's bit for bit"
            if result.exact
            else ("equal within 1e-10 (data-parallel all-reduce order)")
        )
        print(f"{verdict}; hooks once per microbatch")
    elif result.error is not None:
        print("FAILED")
    else:
        print(f"NOT exact: {_pipeline_failures(result)}")
    return 0 if result.passed else 1


def _pipeline_failures(result: Any) -> str:
    """What made a checked pipeline step fail: wrong gradients, silent or repeated hooks, or both."""
    wrong = [check.name for check in result.parameters if not check.bitwise]
    if result.case.data_parallel is not None:
        wrong = [check.name for check in result.parameters if check.relative_error > 1e-10]
    hooks = [
        check.name
        for check in result.parameters
        if check.hooks is not None and check.hooks != check.expected_hooks
    ]
    reasons = []
    if wrong:
        reasons.append(
            f"{len(wrong)} of {len(result.parameters)} gradients differ ({', '.join(wrong[:3])}"
            + (", ..." if len(wrong) > 3 else "")
            + ")"
        )
    if hooks:
        reasons.append(
            f"post-accumulate-grad hooks did not fire once per microbatch for {len(hooks)} of "
            f"{len(result.parameters)} parameters ({', '.join(hooks[:3])}"
            + (", ..." if len(hooks) > 3 else "")
            + "): DDP would leave their gradients un-averaged"
        )
    return "; ".join(reasons) or "no parameter was compared"


def _write_checked_timeline(arguments: argparse.Namespace, result: Any) -> list[str]:
    """Draw the recorded step of a checked pipeline to each ``--timeline`` file (none if the step failed)."""
    from graphkit.drawing.timeline import write_timeline

    if result.timeline is None:
        print("no timeline: the schedule step did not run to the end", file=sys.stderr)
        return []
    note = (
        f"graphkit verify-pipeline {arguments.spec} --schedule {arguments.schedule} --ranks {arguments.ranks}"
    )
    title = f"{result.timeline.schedule} timeline ({result.case.stage} stages)"
    return [
        str(write_timeline(result.timeline, output, title=title, note=note)) for output in arguments.timeline
    ]


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
    render.add_argument(
        "-o", "--output", required=True, help="OUT.svg, .png, .pdf or .dot (missing folders are created)"
    )
    render.add_argument(
        "--collapse", type=int, default=None, metavar="DEPTH", help="collapse modules deeper than DEPTH"
    )
    _fold_options(render)
    render.add_argument(
        "--highlight", type=int, default=None, metavar="GROUP", help="paint group GROUP, grey the others"
    )
    render.add_argument("--plain", action="store_true", help="the plain graph: no parameter groups")
    render.add_argument("--saved", action="store_true", help="add the bytes of each node's saved tensors")
    render.add_argument("--module-paths", action="store_true", help="add each node's module path")
    render.add_argument("--no-shapes", action="store_true", help="leave out the output shapes")
    render.add_argument(
        "--direction",
        choices=["BT", "TB", "LR", "RL"],
        default="BT",
        help="layout direction (default BT: stage inputs at the bottom)",
    )
    render.add_argument(
        "--legend",
        choices=list(_LEGEND),
        default="auto",
        help="the legend of groups and the key: auto (groups listed up to 24), on, off",
    )
    render.add_argument("--title", default=None, help="a heading on top of the diagram")
    render.add_argument(
        "--device", default=None, help="build the model there: cpu, cuda, meta (shapes only, no memory)"
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
    inspect.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:1 ... (default: where the model is); meta: shapes only, no memory, no verify",
    )
    inspect.add_argument("--dtype", choices=["float32", "float64"], help="cast the model and inputs")
    inspect.add_argument(
        "--collapse", type=int, default=None, metavar="DEPTH", help="collapse modules deeper than DEPTH"
    )
    _fold_options(inspect)
    inspect.set_defaults(run=_inspect)

    listing = commands.add_parser("list", help="list the zoo models and the hf: architectures")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(run=_list)

    bench = commands.add_parser("bench", help="time full backward against B and W")
    bench.add_argument("spec", metavar="SPEC")
    bench.add_argument("--repeat", type=int, default=10)
    bench.add_argument(
        "--threads", type=int, help="intra-op CPU threads (default: PyTorch's; 1 gives steadier ratios)"
    )
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(run=_bench)
    _add_costs_parser(commands)
    _add_timeline_parsers(commands)

    pipeline = commands.add_parser(
        "verify-pipeline",
        help="run a torch.distributed.pipelining schedule step; compare every gradient with a full backward",
        description="Run one real schedule step of PIPELINE_SPEC's stages (two per rank) with graphkit's "
        "PipelineStage and compare every parameter's gradient with a single-process full backward over the "
        "same microbatches. Exit 0 iff every gradient is exact and hooks fired once per microbatch.",
    )
    pipeline.add_argument(
        "spec",
        metavar="PIPELINE_SPEC",
        help="path/to/file.py:function, package.module:function, zoo-pipeline:NAME or hf:gpt2?...",
    )
    pipeline.add_argument(
        "--schedule",
        default="ZBVZeroBubble",
        help="InterleavedZeroBubble, ZBVZeroBubble (default), DualPipeV, CSV or csv:PATH",
    )
    pipeline.add_argument("--microbatches", type=int, default=4, metavar="N", help="microbatches per step")
    pipeline.add_argument("--steps", type=int, default=1, metavar="N", help="schedule steps (SGD in between)")
    pipeline.add_argument(
        "--ranks",
        type=int,
        default=1,
        metavar="R",
        help="processes on 127.0.0.1 (default 1: all stages here)",
    )
    parallel = pipeline.add_mutually_exclusive_group()
    parallel.add_argument("--ddp", action="store_true", help="R/2 pipeline ranks x 2 DDP replicas")
    parallel.add_argument("--fsdp", action="store_true", help="R/2 pipeline ranks x 2 FSDP2 replicas")
    pipeline.add_argument(
        "--stages-per-rank",
        type=int,
        default=2,
        metavar="K",
        help="stages on each rank (default 2; other counts for InterleavedZeroBubble and CSV)",
    )
    pipeline.add_argument(
        "--stage", choices=["graphkit", "torch"], default="graphkit", help="whose PipelineStage to run"
    )
    pipeline.add_argument(
        "--deadline", type=float, default=300.0, metavar="SECONDS", help="end spawned processes after this"
    )
    pipeline.add_argument(
        "--timeline",
        action="append",
        metavar="OUT",
        help="also record the last step and draw it: OUT.svg, .png, .pdf, .html or .json (repeat for several)",
    )
    pipeline.add_argument("--json", action="store_true", help="print JSON")
    pipeline.set_defaults(run=_verify_pipeline)
    return parser


def _add_costs_parser(commands: Any) -> None:
    costs = commands.add_parser(
        "costs", help="time, FLOPs and memory of F, B and W per microbatch, for each stage (scheduler input)"
    )
    costs.add_argument("spec", metavar="SPEC", help="a model spec (one stage) or a pipeline spec")
    costs.add_argument(
        "--pipeline",
        action="store_true",
        help="SPEC is a pipeline spec (needed for hf:gpt2 cut into stages; files are told apart by themselves)",
    )
    costs.add_argument(
        "--num-stages", type=int, metavar="N", help="stages of a pipeline spec (default: its own, else 2)"
    )
    costs.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="whole batch of a pipeline spec (default: its own, else 8)",
    )
    costs.add_argument(
        "--microbatches",
        type=int,
        default=1,
        metavar="M",
        help="split the batch into M microbatches and measure the first (default 1: the whole batch)",
    )
    costs.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: where the model is)")
    costs.add_argument("--repeat", type=int, default=10, help="timed microbatches (medians; default 10)")
    costs.add_argument("--warmup", type=int, default=3, help="untimed microbatches first (default 3)")
    costs.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op CPU threads (default 1, as timeline and compare-schedules: steadier times; 0: PyTorch's)",
    )
    costs.add_argument("--json", action="store_true", help="print JSON (with the schedulers' F/B/W fields)")
    costs.set_defaults(run=_costs)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "spec",
        metavar="PIPELINE_SPEC",
        help="a pipeline spec (zoo-pipeline:mlp, path/to/file.py:function, hf:gpt2 ...)",
    )
    parser.add_argument(
        "--microbatches", type=int, default=4, metavar="N", help="microbatches per step (default 4)"
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=1,
        metavar="R",
        help="1: every stage in this process (default); R: R processes",
    )
    parser.add_argument("--device", default="cpu", help="cpu (gloo, default) or cuda (NCCL)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op CPU threads per rank (default 1)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="deadline of the run in seconds (default 120)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=3,
        metavar="K",
        help="recorded steps per schedule, in rounds; the median one is drawn (default 3)",
    )
    parser.add_argument(
        "--stage",
        choices=["graphkit", "torch"],
        default="graphkit",
        help="whose PipelineStage to run: graphkit's (default) or PyTorch's",
    )
    parser.add_argument(
        "--stage-class",
        metavar="MODULE:CLASS",
        help="another pipeline stage class (overrides --stage)",
    )
    parser.add_argument(
        "--stages-per-rank",
        type=int,
        default=2,
        metavar="K",
        help="stages on each rank of the interleaved schedules (default 2; V schedules: 2, GPipe/1F1B: 1)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="the whole batch, split into the microbatches (default: 8 rows per microbatch)",
    )


def _add_timeline_parsers(commands: Any) -> None:
    timeline = commands.add_parser(
        "timeline", help="record one real step of a pipeline schedule and draw every rank's actions"
    )
    _add_run_options(timeline)
    timeline.add_argument(
        "--schedule",
        required=True,
        metavar="NAME",
        help="1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV ...",
    )
    timeline.add_argument(
        "-o",
        "--output",
        action="append",
        required=True,
        metavar="OUT",
        help="OUT.svg, .png, .pdf, .html or .json (repeat for several)",
    )
    timeline.set_defaults(run=_timeline)

    compare = commands.add_parser(
        "compare-schedules", help="record several schedules on the same stages in one run, side by side"
    )
    _add_run_options(compare)
    compare.add_argument(
        "--schedules",
        default="GPipe,1F1B,Interleaved1F1B,InterleavedZeroBubble,ZBVZeroBubble,DualPipeV",
        metavar="A,B,...",
        help="schedule names, comma-separated (default: GPipe, 1F1B, Interleaved1F1B and the zero-bubble ones)",
    )
    compare.add_argument(
        "-o", "--output", metavar="DIR", help="also write index.html and the pictures to DIR"
    )
    compare.add_argument("--json", action="store_true", help="also print the summaries as JSON")
    compare.set_defaults(run=_compare_schedules)


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
