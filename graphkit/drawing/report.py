"""``graphkit inspect``: from a model spec to a verified, drawn split backward in one call.

:func:`inspect` loads a model spec (see :mod:`graphkit.models.specs`), captures its autograd graph with module paths
(:func:`graphkit.trace`), computes the parameter groups (:func:`graphkit.param_groups`), checks the split
backward against a full backward and counts the FLOPs of each phase (:func:`graphkit.verify_split`), draws the
graph (:mod:`graphkit.drawing.diagram`) and writes a report folder::

    DIR/index.html      one self-contained page: summary, group table, diagram, verification, FLOPs chart
    DIR/graph.svg       the diagram (needs the Graphviz ``dot`` program)
    DIR/graph.dot       the diagram's DOT source (always written)
    DIR/graph.graphml   the captured graph, for networkx, Gephi, yEd ...
    DIR/report.json     spec, summary, groups, unused_params, verify, files

The terminal gets a progress line per step and a short summary table (``rich`` when installed, plain text
otherwise). The pieces are usable on their own: :func:`collect` runs the steps and returns an
:class:`Inspection`, :func:`report_json` and :func:`report_html` turn it into the two documents.
"""

from __future__ import annotations

import copy
import html
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from inspect import signature
from pathlib import Path
from typing import Any, TextIO

import torch

from graphkit.analysis.parameter_groups import FLAG_MEANINGS, GroupFlag, ParamGroups, param_groups
from graphkit.drawing.labels import format_bytes
from graphkit.graph.autograd_graph import AutogradGraph
from graphkit.graph.tensors import flatten_tensors, unflatten_like
from graphkit.graph.tracing import trace
from graphkit.models.specs import load_spec, spec_inputs_as_call
from graphkit.models.zoo import DEFAULT_MODEL
from graphkit.split.verification import VerifyReport, verify_split

__all__ = [
    "DEFAULT_SPEC",
    "FILES",
    "Inspection",
    "collect",
    "inspect",
    "report_html",
    "report_json",
    "write_report",
]

DEFAULT_SPEC = f"zoo:{DEFAULT_MODEL}"
"""The model :func:`inspect` looks at when no spec is given."""

FILES: dict[str, str] = {
    "html": "index.html",
    "svg": "graph.svg",
    "dot": "graph.dot",
    "graphml": "graph.graphml",
    "json": "report.json",
}
"""The files of a report folder, by kind."""

MAX_NODES = 400
"""Node budget of the diagram: larger graphs are collapsed by module (see :func:`graphkit.drawing.diagram.draw`)."""

STEPS = ("load model", "capture graph", "parameter groups", "verify split", "draw diagram", "write files")

_DOT_TIMEOUT_S = 120.0
_LISTED_NAMES = 8


@dataclass(slots=True)
class Inspection:
    """Everything :func:`collect` found out about one model spec.

    Attributes:
        spec: the model spec.
        module_class: class name of the module the spec built.
        inputs: one dict per input tensor: ``name`` (as the graph and the verification name it: ``"0"`` for
            the first positional argument), ``argument`` (the ``forward`` parameter it is passed to),
            ``shape`` (list of ints), ``dtype`` (str), ``requires_grad`` (stage inputs require grad).
        graph: the captured graph (:func:`graphkit.trace`).
        groups: its parameter groups.
        verify: the split-versus-full check, with FLOPs per phase.
        device, dtype: where and in which dtype the check ran (``"cpu"``, ``"float32"``).
        dot_source: DOT source of the diagram.
        svg: the laid-out diagram, or None when Graphviz is missing, too slow or failed.
        diagram_note: why ``svg`` is None (install instructions), else None.
        collapse_depth: module depth the diagram is collapsed at (None: every node drawn).
        timings: seconds spent in each step, by step name.
    """

    spec: str
    module_class: str
    inputs: list[dict[str, Any]]
    graph: AutogradGraph
    groups: ParamGroups
    verify: VerifyReport
    device: str
    dtype: str
    dot_source: str = ""
    svg: str | None = None
    diagram_note: str | None = None
    collapse_depth: int | None = None
    timings: dict[str, float] = field(default_factory=dict)

    # --- derived facts ------------------------------------------------------------------------------
    def parameter_sizes(self) -> dict[str, int]:
        """Number of values of each parameter tensor, keyed by its node id (a tied parameter counts once)."""
        sizes: dict[str, int] = {}
        for node in set(self.graph.parameter_nodes().values()):
            shapes = self.graph.nodes[node].get("shapes") or [()]
            sizes[node] = math.prod(shapes[0])
        return sizes

    def tied_parameters(self) -> list[list[str]]:
        """Names of each parameter reachable under several names (``[["wte.weight", "lm_head.weight"]]``)."""
        return [list(names) for _, names in self.graph.nodes(data="param_names") if names and len(names) > 1]

    def summary(self) -> dict[str, Any]:
        """The counts a person asks first (the ``summary`` of ``report.json``)."""
        graph_summary = self.graph.summary()
        sizes = self.parameter_sizes()
        outputs = []
        for endpoint in self.graph.outputs:
            data = self.graph.nodes[endpoint.node]
            shapes, dtypes = data.get("shapes") or [], data.get("dtypes") or []
            outputs.append(
                {
                    "name": endpoint.name,
                    "shape": list(shapes[endpoint.output_nr]) if endpoint.output_nr < len(shapes) else None,
                    "dtype": dtypes[endpoint.output_nr] if endpoint.output_nr < len(dtypes) else None,
                }
            )
        return {
            "model": self.module_class,
            "nodes": graph_summary["nodes"],
            "edges": graph_summary["edges"],
            "node_kinds": graph_summary["kinds"],
            "parameters": len(sizes),
            "parameter_values": sum(sizes.values()),
            "tied_parameters": self.tied_parameters(),
            "groups": len(self.groups),
            "inputs": self.inputs,
            "stage_inputs": graph_summary["inputs"],
            "outputs": outputs,
            "saved_bytes_total": graph_summary["saved_bytes_total"],
            "device": self.device,
            "dtype": self.dtype,
            "ok": self.verify.ok,
            "verdict": "OK" if self.verify.ok else "FAILED",
            "wrong": [check.name for check in self.verify.failures],
            "diagram": {
                "svg": self.svg is not None,
                "collapse_depth": self.collapse_depth,
                "note": self.diagram_note,
            },
        }


# --- the steps ------------------------------------------------------------------------------------------
class _Progress:
    """One line per step on ``stream``; a ``rich`` progress bar instead when rich is installed and
    ``stream`` is a terminal."""

    def __init__(self, steps: tuple[str, ...], stream: TextIO) -> None:
        self.steps = steps
        self.stream = stream
        self.done = 0
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    SpinnerColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )
            except ImportError:
                return self
            self._rich = Progress(
                SpinnerColumn(),
                TextColumn("[bold]graphkit inspect[/bold] {task.description:<18}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._rich.__enter__()
            self._task = self._rich.add_task(self.steps[0], total=len(self.steps))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc_info)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time one step and report it."""
        position = self.done + 1
        if self._rich is not None:
            self._rich.update(self._task, description=name)
        else:
            print(f"[{position}/{len(self.steps)}] {name} ...", end="", file=self.stream, flush=True)
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            if self._rich is None:
                print(" failed", file=self.stream, flush=True)
            raise
        seconds = time.perf_counter() - start
        self.done += 1
        if self._rich is not None:
            self._rich.update(self._task, advance=1)
        else:
            print(f" {seconds:.2f} s", file=self.stream, flush=True)


def _check_device(device: str | None) -> None:
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"--device {device!r} is not a device name (cpu, cuda, cuda:1, ...): {error}"
        ) from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device {device}: no CUDA device is available to this torch ({torch.__version__}); "
            "leave --device out to run on the CPU"
        )


def _cast(value: Any, device: str | None, dtype: torch.dtype | None) -> Any:
    """Copies of the input tensors in ``value`` on ``device``, floating ones cast to ``dtype``."""
    moved = []
    for _, tensor in flatten_tensors(value):
        copy_ = tensor.detach().to(device=device) if device is not None else tensor.detach()
        if dtype is not None and copy_.is_floating_point():
            copy_ = copy_.to(dtype)
        moved.append(copy_.requires_grad_(tensor.requires_grad))
    return unflatten_like(value, moved)


def _forward_argument_names(module: torch.nn.Module) -> list[str]:
    """Names of the positional parameters of ``module.forward`` (empty when they cannot be read)."""
    try:
        parameters = signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        parameter.name
        for parameter in parameters
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
    ]


def _describe_inputs(
    module: torch.nn.Module, inputs: tuple[Any, ...] | dict[str, Any]
) -> list[dict[str, Any]]:
    """One dict per input tensor: ``name`` (as in the graph and the verification), ``argument`` (the
    parameter of ``forward`` it is passed to), ``shape``, ``dtype``, ``requires_grad``."""
    args, kwargs = spec_inputs_as_call(inputs)
    argument_names = _forward_argument_names(module)
    described = []
    for position, value in [*enumerate(args), *kwargs.items()]:
        argument = str(position)
        if isinstance(position, int):
            argument = argument_names[position] if position < len(argument_names) else f"args[{position}]"
        for name, tensor in flatten_tensors({str(position): value}):
            described.append(
                {
                    "name": name,
                    "argument": argument,
                    "shape": list(tensor.shape),
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "requires_grad": tensor.requires_grad,
                }
            )
    return described


def collect(
    spec: str | None = None,
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    collapse_depth: int | None = None,
    step: Callable[[str], Any] | None = None,
) -> Inspection:
    """Run every step of :func:`inspect` except writing the report.

    Args:
        spec: a model spec (default :data:`DEFAULT_SPEC`).
        device: run the trace and the check there (``"cpu"``, ``"cuda"``, ...; default: where the model is).
        dtype: cast the parameters and floating inputs (``torch.float32`` or ``torch.float64``).
        collapse_depth: draw modules at this depth of the module tree as one node each (>= 1); None
            collapses only past :data:`MAX_NODES` nodes.
        step: a context-manager factory called with each step name (progress reporting); None: silent.

    Returns:
        An :class:`Inspection`.

    Raises:
        graphkit.models.specs.SpecError: the spec cannot be loaded.
        ValueError: ``collapse_depth < 1``, or ``device`` is unknown or unavailable.
        graphkit.graph.tensors.GraphkitInputError: the model's outputs have no autograd graph.
    """
    from graphkit.drawing.collapsing import choose_collapse_depth
    from graphkit.drawing.diagram import draw
    from graphkit.drawing.rendering import GraphvizNotFoundError, RenderTimeoutError, render

    spec = spec or DEFAULT_SPEC
    if collapse_depth is not None and collapse_depth < 1:
        raise ValueError(f"--collapse must be a module depth >= 1, got {collapse_depth}")
    _check_device(device)
    step = step or (lambda _name: contextmanager(lambda: (yield))())
    timings: dict[str, float] = {}

    @contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        with step(name):
            yield
        timings[name] = time.perf_counter() - start

    with timed(STEPS[0]):
        module, inputs = load_spec(spec)
    with timed(STEPS[1]):
        traced_module, traced_inputs = module, inputs
        if device is not None or dtype is not None:
            traced_module = copy.deepcopy(module).to(device=device, dtype=dtype)
            traced_inputs = _cast(inputs, device, dtype)
        args, kwargs = spec_inputs_as_call(traced_inputs)
        _, graph = trace(traced_module, *args, **kwargs)
    with timed(STEPS[2]):
        groups = param_groups(graph)
    with timed(STEPS[3]):
        report = verify_split(module, inputs, dtype=dtype, device=device)
    inspection = Inspection(
        spec=spec,
        module_class=type(module).__name__,
        inputs=_describe_inputs(module, inputs),
        graph=graph,
        groups=groups,
        verify=report,
        device=report.device,
        dtype=report.dtype,
        timings=timings,
    )
    with timed(STEPS[4]):
        inspection.collapse_depth = (
            collapse_depth if collapse_depth is not None else choose_collapse_depth(graph, MAX_NODES)[0]
        )
        options = {"collapse_depth": collapse_depth, "max_nodes": MAX_NODES, "title": spec}
        inspection.dot_source = draw(graph, list(groups), **options).source
        try:
            with tempfile.TemporaryDirectory(prefix="graphkit-") as scratch:
                path = render(
                    graph, Path(scratch) / FILES["svg"], list(groups), timeout_s=_DOT_TIMEOUT_S, **options
                )
                inspection.svg = path.read_text(encoding="utf-8")
        except (GraphvizNotFoundError, RenderTimeoutError) as error:
            inspection.diagram_note = str(error)
        except RuntimeError as error:  # dot itself failed: keep the rest of the report
            inspection.diagram_note = f"{error}. The DOT source is still written."
    return inspection


# --- documents --------------------------------------------------------------------------------------------
def report_json(inspection: Inspection, files: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """The content of ``report.json``.

    Keys: ``spec``; ``summary`` (:meth:`Inspection.summary`); ``groups`` (one dict per group, as
    ``graphkit groups --json`` prints them); ``unused_params``; ``verify`` (exactly
    :meth:`graphkit.split.verification.VerifyReport.to_dict`, as ``graphkit verify --json`` prints it); ``files`` (file
    name of each kind, relative to the report folder; None for a file that was not written).
    """
    groups = inspection.groups.to_dict()
    return {
        "spec": inspection.spec,
        "summary": inspection.summary(),
        "groups": groups["groups"],
        "unused_params": groups["unused_params"],
        "verify": inspection.verify.to_dict(),
        "files": dict(files) if files is not None else dict(FILES),
    }


def write_report(inspection: Inspection, output: Path) -> dict[str, str | None]:
    """Write the report folder: every file of :data:`FILES` (``graph.svg`` only when there is a diagram).

    Returns:
        The ``files`` map of ``report.json``: file name by kind, None for ``svg`` when there is no diagram.
    """
    output.mkdir(parents=True, exist_ok=True)
    files: dict[str, str | None] = dict(FILES)
    if inspection.svg is None:
        files["svg"] = None
    (output / FILES["dot"]).write_text(inspection.dot_source, encoding="utf-8")
    svg_path = output / FILES["svg"]
    if inspection.svg is not None:
        svg_path.write_text(inspection.svg, encoding="utf-8")
    else:
        svg_path.unlink(missing_ok=True)  # a diagram from an earlier run would not match this report
    inspection.graph.to_graphml(output / FILES["graphml"])
    document = report_json(inspection, files)
    (output / FILES["json"]).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    (output / FILES["html"]).write_text(report_html(inspection, files), encoding="utf-8")
    return files


# --- HTML -------------------------------------------------------------------------------------------------
_CSS = """
:root { --ink:#1f2328; --muted:#59636e; --line:#d1d9e0; --soft:#f6f8fa; --ok:#1a7f37; --bad:#cf222e;
        --b:#3f7fbf; --w:#e08a2e; --full:#8c8c8c; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color:var(--ink);
       background:#fff; }
header { padding:20px 32px 12px; border-bottom:1px solid var(--line); background:var(--soft); }
header h1 { margin:0; font-size:22px; }
header h1 code { font-size:20px; }
header p { margin:4px 0 0; color:var(--muted); }
nav { margin-top:10px; font-size:14px; }
nav a { margin-right:16px; color:#0969da; text-decoration:none; }
main { padding:8px 32px 40px; max-width:1400px; }
section { margin-top:28px; }
h2 { font-size:18px; margin:0 0 8px; padding-bottom:4px; border-bottom:1px solid var(--line); }
p.lead { margin:4px 0 12px; color:var(--muted); max-width:90ch; }
code { font:13px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.verdict { display:inline-block; padding:2px 10px; border-radius:12px; font-weight:600; color:#fff; }
.verdict.ok { background:var(--ok); } .verdict.failed { background:var(--bad); }
.callout { border-left:4px solid #bf8700; background:#fff8c5; padding:8px 12px; margin:12px 0;
           max-width:110ch; }
.callout.bad { border-color:var(--bad); background:#ffebe9; }
.overview { display:flex; flex-wrap:wrap; gap:32px; align-items:flex-start; }
#flops { flex:0 1 600px; } #flops p { margin:2px 0 6px; }
dl.facts { display:grid; grid-template-columns:max-content minmax(0, 60ch); gap:4px 16px; margin:0; }
dl.facts dt { color:var(--muted); } dl.facts dd { margin:0; }
table { border-collapse:collapse; font-size:14px; }
th, td { text-align:left; vertical-align:top; padding:5px 10px; border-bottom:1px solid var(--line); }
th { background:var(--soft); font-weight:600; position:sticky; top:0; }
td.number, th.number { text-align:right; font-variant-numeric:tabular-nums; }
.swatch { display:inline-block; width:14px; height:14px; border-radius:3px; margin-right:6px;
          vertical-align:-2px; }
.diagram g.cluster:target > path { stroke-width:5; }
.flag { display:inline-block; padding:0 7px; margin:1px 2px; border-radius:10px; background:#ddf4ff;
        color:#0a3069; font-size:12px; white-space:nowrap; cursor:help; }
.status-ok { color:var(--ok); font-weight:600; } .status-bad { color:var(--bad); font-weight:600; }
tr.failed td { background:#ffebe9; }
details summary { cursor:pointer; color:#0969da; }
.scroll { max-height:560px; overflow:auto; border:1px solid var(--line); border-radius:6px;
          display:inline-block; max-width:100%; }
.diagram { border:1px solid var(--line); border-radius:6px; overflow:auto; max-height:90vh; background:#fff; }
.diagram svg { display:block; }
.diagram.fit svg { max-width:100%; height:auto; margin:0 auto; }
button { font:inherit; font-size:13px; padding:3px 10px; border:1px solid var(--line); border-radius:6px;
         background:var(--soft); cursor:pointer; }
.muted { color:var(--muted); }
ul.legend { margin:8px 0 0; padding-left:20px; color:var(--muted); font-size:14px; max-width:110ch; }
footer { padding:16px 32px; color:var(--muted); font-size:13px; border-top:1px solid var(--line); }
"""

# The only script of the page: switch the diagram between "fit to the page width" and actual size.
_ZOOM_SCRIPT = (
    "(function(){var button=document.getElementById('zoom'),box=document.getElementById('diagram-box');"
    "button.addEventListener('click',function(){var fit=box.classList.toggle('fit');"
    "button.textContent=fit?'Show at actual size':'Fit to the page width';});})();"
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _si(value: float) -> str:
    """``1769472`` -> ``"1.77 M"``."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f}"


def _flop(value: float) -> str:
    """``1769472`` -> ``"1.77 MFLOP"``, ``0`` -> ``"0 FLOP"``."""
    text = _si(value)
    return f"{text}FLOP" if text[-1].isalpha() else f"{text} FLOP"


def _tolerance(value: float) -> str:
    """``1e-4`` -> ``"1e-4"`` (not ``"0.0001"``)."""
    mantissa, _, exponent = f"{value:.0e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def _bytes(count: int | None) -> str:
    return "unknown (the graph was freed)" if count is None else format_bytes(count)


def _shape(shape: list[int] | None) -> str:
    return "?" if shape is None else "(" + ", ".join(str(size) for size in shape) + ")"


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _fold(items: list[str], limit: int, separator: str = ", ") -> str:
    """HTML ``items`` joined by ``separator``; past ``limit``, the rest folds into a ``<details>``."""
    shown = separator.join(items[:limit])
    if len(items) <= limit:
        return shown or "-"
    rest = separator.join(items[limit:])
    return f"{shown} <details><summary>and {len(items) - limit} more</summary>{rest}</details>"


def _names(names: list[str], limit: int = _LISTED_NAMES) -> str:
    """Comma-separated ``<code>`` names; past ``limit``, the rest folds into a ``<details>``."""
    return _fold([f"<code>{_e(name)}</code>" for name in names], limit)


def _flops_note(inspection: Inspection) -> str:
    """A warning when B + W costs noticeably more than the full backward, with the likely reason."""
    flops = inspection.verify.flops
    extra = flops["b"] + flops["w"] - flops["full"]
    if flops["full"] <= 0 or flops["b"] < 0 or extra <= 0.05 * flops["full"]:
        return ""
    custom = any(GroupFlag.CUSTOM_FUNCTION in group.flags for group in inspection.groups)
    reason = (
        "A custom <code>torch.autograd.Function</code> (flag <b>custom-function</b>) computes all its "
        "gradients in both phases unless its backward reads <code>graphkit.current_phase()</code>."
        if custom
        else "Some ops compute more than the gradients their phase needs."
    )
    repeating = sorted(
        (cost for cost in inspection.verify.opaque if cost.repeated > 0), key=lambda cost: -cost.repeated
    )
    if repeating:  # verify_split measured where: name the Nodes, the costliest first
        items = "".join(
            f"<li><code>{_e(cost.node)} {_e(cost.op)}</code> [{_e(cost.kind)}] repeats "
            f"{_flop(cost.repeated)}</li>"
            for cost in repeating[:_LISTED_NAMES]
        )
        meanings = "".join(
            f"<li><b>{_e(kind)}</b>: {_e(meaning)}</li>"
            for kind, meaning in {cost.kind: cost.meaning for cost in repeating}.items()
        )
        reason = f"The work repeated, by Node:<ul>{items}</ul><ul>{meanings}</ul>"
    return (
        f'<div class="callout">B + W costs {_flop(extra)} ({100 * extra / flops["full"]:.0f}%) more than one '
        f"full backward. {reason}</div>"
    )


def _flops_chart(flops: Mapping[str, int]) -> str:
    """FLOPs of full backward, B, W and B + W as horizontal bars in an inline SVG."""
    full, b, w = flops["full"], flops["b"], flops["w"]
    if b < 0 or w < 0:  # not counted (see VerifyReport.extra["flops_note"])
        return f"<p>full backward {_flop(full)}; the B and W phases could not be counted for this model.</p>"
    largest = max(full, b + w, 1)
    bar_width, left, row = 300, 150, 30
    rows = [
        ("full backward", [(full, "var(--full)")]),
        ("B: input grads", [(b, "var(--b)")]),
        ("W: weight grads", [(w, "var(--w)")]),
        ("B + W", [(b, "var(--b)"), (w, "var(--w)")]),
    ]
    parts = [
        f'<svg class="flops" role="img" width="{left + bar_width + 150}" height="{row * len(rows) + 8}" '
        'xmlns="http://www.w3.org/2000/svg" font-family="Helvetica, Arial, sans-serif" font-size="13">',
        "<title>FLOPs of the full backward and of the B and W phases</title>",
    ]
    for position, (label, segments) in enumerate(rows):
        y = 4 + position * row
        parts.append(f'<text x="0" y="{y + 16}" fill="#1f2328">{_e(label)}</text>')
        x = float(left)
        total = 0
        for value, colour in segments:
            width = bar_width * value / largest
            parts.append(
                f'<rect x="{x:.1f}" y="{y + 3}" width="{width:.1f}" height="18" rx="2" style="fill:{colour}"/>'
            )
            x += width
            total += value
        share = f" ({100 * total / full:.0f}%)" if full else ""
        parts.append(f'<text x="{x + 6:.1f}" y="{y + 16}" fill="#59636e">{_flop(total)}{share}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _inline_svg(svg: str) -> str:
    """The ``<svg>`` element of a Graphviz SVG file, without the XML prolog, DOCTYPE and comments."""
    start = svg.find("<svg")
    return svg[start:].strip() if start >= 0 else svg


def _stage_note(inspection: Inspection) -> str:
    flops = inspection.verify.flops
    if inspection.graph.inputs:
        return ""
    return (
        '<div class="callout"><b>No stage input requires grad</b> (the inputs are '
        + ", ".join(f"{_input_label(item)} {_e(item['dtype'])}" for item in inspection.inputs)
        + "), so this is a first pipeline stage: nothing flows back to an earlier stage, the B phase has "
        f"nothing to compute ({_flop(flops['b'])}) and the W phase computes every gradient. To see B and W "
        "share the work, inspect a middle stage: <code>graphkit inspect zoo:gpt_stage</code> or "
        "<code>graphkit inspect 'hf:llama?stage=middle'</code>.</div>"
    )


def _input_label(item: Mapping[str, Any]) -> str:
    """``<code>token_ids</code>``, or ``<code>0</code> (token_ids)`` when the graph's name differs."""
    if item["name"] == item["argument"]:
        return f"<code>{_e(item['name'])}</code>"
    return f"<code>{_e(item['name'])}</code> <span class='muted'>({_e(item['argument'])})</span>"


def _facts(inspection: Inspection, summary: Mapping[str, Any]) -> str:
    verify = inspection.verify
    inputs = "<br>".join(
        f"{_input_label(item)} {_e(item['dtype'])} {_e(_shape(item['shape']))}"
        + (" &middot; requires grad (stage input)" if item["requires_grad"] else " &middot; no grad")
        for item in inspection.inputs
    )
    outputs = "<br>".join(
        f"<code>{_e(item['name'])}</code> {_e(item['dtype'])} {_e(_shape(item['shape']))}"
        for item in summary["outputs"]
    )
    kinds = ", ".join(f"{_e(kind)} {count}" for kind, count in summary["node_kinds"].items())
    tied = "".join(
        "<br>tied: " + " = ".join(f"<code>{_e(name)}</code>" for name in names)
        for names in summary["tied_parameters"]
    )
    unused = inspection.groups.unused_params
    unused_line = f"<br>unused (reach no output): {_names(unused)}" if unused else ""
    checked = len(verify.inputs) + len(verify.params)
    verdict = (
        f'<span class="verdict ok">OK</span> all {checked} gradients match'
        if verify.ok
        else f'<span class="verdict failed">FAILED</span> {len(verify.failures)} of {checked} gradients differ: '
        + ", ".join(f'<a href="#verification"><code>{_e(check.name)}</code></a>' for check in verify.failures)
    )
    rows = [
        ("Model", f"<code>{_e(inspection.spec)}</code> &middot; <code>{_e(inspection.module_class)}</code>"),
        ("Inputs", inputs or "none"),
        ("Outputs", outputs or "none"),
        (
            "Autograd graph",
            f"{summary['nodes']} nodes, {summary['edges']} edges <span class='muted'>({kinds})</span>",
        ),
        (
            "Parameters",
            f"{summary['parameters']} tensors, {summary['parameter_values']:,} values{tied}{unused_line}",
        ),
        ("Saved tensors", _e(_bytes(summary["saved_bytes_total"]))),
        ("Parameter groups", str(summary["groups"])),
        (
            "Split backward",
            f"{verdict} <span class='muted'>(B then W against one full backward; {_e(verify.dtype)}, "
            f"{_e(verify.device)}, relative tolerance {_tolerance(verify.tolerance)})</span>",
        ),
    ]
    return (
        '<dl class="facts">' + "".join(f"<dt>{label}</dt><dd>{value}</dd>" for label, value in rows) + "</dl>"
    )


def _swatch(style: Any) -> str:
    """A small square in a group's colour, with its border pattern (dashed, dotted ...) past nine groups."""
    border = "dashed" if "dashed" in style.pattern else "dotted" if "dotted" in style.pattern else "solid"
    return f'<span class="swatch" style="background:{style.fill};border:2px {border} {style.colour}"></span>'


def _share(part: int, total: int) -> str:
    percent = 100 * part / total if total else 0.0
    return "&lt;1%" if 0 < percent < 1 else f"{percent:.0f}%"


def _group_rows(inspection: Inspection) -> str:
    from graphkit.drawing.palette import group_style

    graph = inspection.graph
    sizes = inspection.parameter_sizes()
    total = sum(sizes.values()) or 1
    svg = inspection.svg or ""
    linked = {
        group.index for group in inspection.groups if f'id="graphkit&#45;group&#45;{group.index}"' in svg
    }
    rows = []
    for group in inspection.groups:
        style = group_style(group.index)
        index = str(group.index)
        if group.index in linked:
            index = f'<a href="#graphkit-group-{group.index}" title="show in the diagram">{index}</a>'
        values = sum(sizes.get(node, 0) for node in set(group.param_nodes))
        entries = [
            f"<code>{_e(graph.nodes[node]['op'])}</code> <span class='muted'>{_e(node)}"
            + (f" in {_e(graph.nodes[node]['module_path'])}" if graph.nodes[node].get("module_path") else "")
            + "</span>"
            for node in group.intermediates
        ]
        entries += [f"stage output <code>{_e(entry.name)}</code>" for entry in group.output_entries]
        flags = (
            " ".join(
                f'<span class="flag" title="{_e(FLAG_MEANINGS.get(str(flag), ""))}">{_e(flag)}</span>'
                for flag in group.flags
            )
            or '<span class="muted">-</span>'
        )
        rows.append(
            f'<tr class="group-row" id="group-{group.index}" data-group="{group.index}">'
            f"<td>{_swatch(style)}{index}</td>"
            f"<td>{_names(list(group.params))}</td>"
            f'<td class="number">{values:,}<br><span class="muted">{_share(values, total)}</span></td>'
            f"<td>{_fold(entries, 4, '<br>')}</td><td>{flags}</td></tr>"
        )
    return "".join(rows)


def _groups_section(inspection: Inspection) -> str:
    used = sorted({str(flag) for group in inspection.groups for flag in group.flags})
    legend = "".join(f"<li><b>{_e(flag)}</b>: {_e(FLAG_MEANINGS.get(flag, ''))}</li>" for flag in used)
    count = len(inspection.groups)
    return (
        '<section id="groups"><h2>Parameter groups</h2>'
        '<p class="lead">A parameter group is a set of weights whose gradients leave the input path at the same '
        "<em>intermediates</em>: the B phase computes the gradients of those intermediates (and of the stage "
        "inputs), the W phase later turns them into weight gradients, every group in one pass. "
        f"This model has {count} group{'s' if count != 1 else ''}; the colours match the diagram.</p>"
        '<div class="scroll"><table class="groups"><thead><tr><th>group</th><th>parameters</th>'
        '<th class="number">values</th><th>intermediates (where W starts)</th><th>flags</th></tr></thead>'
        f"<tbody>{_group_rows(inspection)}</tbody></table></div>"
        + (f'<ul class="legend">{legend}</ul>' if legend else "")
        + "</section>"
    )


def _diagram_section(inspection: Inspection, files: Mapping[str, str | None]) -> str:
    depth = inspection.collapse_depth
    collapsed = (
        f" Modules deeper than depth {depth} are collapsed into one node each "
        f"(<code>graphkit inspect --collapse N</code> chooses another depth)."
        if depth is not None
        else ""
    )
    lead = (
        '<p class="lead">Data flows upwards, from the stage inputs at the bottom to the outputs at the top. '
        "White nodes are on the input path (the B phase); each coloured box is one parameter group's weights "
        "and the ops that touch only weights (the W phase); an outlined node is an intermediate where a "
        f"group's gradient leaves the input path.{collapsed}</p>"
    )
    if inspection.svg is None:
        body = (
            '<div class="callout bad"><b>No diagram:</b> '
            f"{_e(inspection.diagram_note or 'Graphviz could not lay out the graph.')} "
            f'The DOT source is in <a href="{_e(FILES["dot"])}">{_e(FILES["dot"])}</a>; '
            "install Graphviz and run <code>graphkit inspect</code> again to see it here.</div>"
        )
    else:
        body = (
            '<p class="tools"><button type="button" id="zoom">Show at actual size</button> '
            f'<span class="muted">or open <a href="{_e(files.get("svg") or FILES["svg"])}">{_e(FILES["svg"])}</a> '
            "on its own. Hover over a node for its autograd name; click a group number above to find it.</span></p>"
            f'<div class="diagram fit" id="diagram-box">{_inline_svg(inspection.svg)}</div>'
            f"<script>{_ZOOM_SCRIPT}</script>"
        )
    return f'<section id="diagram"><h2>Diagram</h2>{lead}{body}</section>'


def _verify_section(inspection: Inspection) -> str:
    verify = inspection.verify
    rows = []
    for kind, checks in (("input", verify.inputs), ("param", verify.params)):
        for check in checks:
            ok = check.status == "ok"
            rows.append(
                f'<tr class="check{"" if ok else " failed"}"><td>{kind}</td><td><code>{_e(check.name)}</code></td>'
                f'<td class="{"status-ok" if ok else "status-bad"}">{_e(check.status)}</td>'
                f'<td class="number">{_error(check.max_abs_err)}</td>'
                f'<td class="number">{_error(check.max_rel_err)}</td></tr>'
            )
    failed = ""
    if not verify.ok:
        failed = (
            '<div class="callout bad"><b>Split backward differs from the full backward</b> for '
            + ", ".join(f"<code>{_e(check.name)}</code> ({_e(check.status)})" for check in verify.failures)
            + ". A wrong weight gradient with right input gradients usually means a custom "
            "<code>torch.autograd.Function</code> computes something different in the W phase "
            "(see <code>graphkit.current_phase()</code>).</div>"
        )
    return (
        '<section id="verification"><h2>Verification</h2>'
        '<p class="lead">graphkit runs the forward twice from the same inputs and seed: once with a full '
        "backward, once with the split backward (B, then W). Each gradient is compared; errors are absolute "
        f"and relative to the largest reference value. Pass: relative error &le; {_tolerance(verify.tolerance)} "
        f"({_e(verify.dtype)}).</p>{failed}"
        '<div class="scroll"><table class="verification"><thead><tr><th>kind</th><th>name</th><th>status</th>'
        '<th class="number">max abs error</th><th class="number">max rel error</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div></section>"
    )


def _files_section(files: Mapping[str, str | None]) -> str:
    meanings = {
        "svg": "the diagram alone",
        "dot": "the diagram's Graphviz source",
        "graphml": "the captured graph for networkx, Gephi or yEd",
        "json": "everything on this page as data",
    }
    items = "".join(
        f'<li><a href="{_e(name)}">{_e(name)}</a>: {meanings[kind]}</li>'
        for kind, name in files.items()
        if name and kind in meanings
    )
    return f'<section id="files"><h2>Files</h2><ul>{items}</ul></section>'


def report_html(inspection: Inspection, files: Mapping[str, str | None] | None = None) -> str:
    """``index.html``: one self-contained page (inline CSS and SVG; links only to the report's own files).

    Sections: summary with the verdict and the FLOPs chart, the group table (one ``<tr class="group-row">``
    per group), the diagram, the verification table and the file list.
    """
    files = dict(files) if files is not None else dict(FILES)
    summary = inspection.summary()
    verify = inspection.verify
    flops = verify.flops
    title = f"graphkit inspect {inspection.spec}"
    timing = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in inspection.timings.items())
    verdict = (
        '<span class="verdict ok">OK</span>' if verify.ok else '<span class="verdict failed">FAILED</span>'
    )
    overview = (
        '<section id="summary"><h2>Summary</h2>'
        f"{_stage_note(inspection)}"
        f'<div class="overview"><div>{_facts(inspection, summary)}</div>'
        '<div id="flops"><b>Backward FLOPs per phase</b>'
        '<p class="muted">B runs as soon as the output gradient arrives; W can wait '
        "and fill pipeline bubbles. B + W should equal the full backward.</p>"
        f"{_flops_chart(flops)}{_flops_note(inspection)}</div></div></section>"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>graphkit inspect <code>{_e(inspection.spec)}</code> {verdict}</h1>"
        f"<p>{summary['nodes']} autograd nodes &middot; {summary['parameters']} parameters &middot; "
        f"{summary['groups']} parameter group{'s' if summary['groups'] != 1 else ''} &middot; split backward "
        f"{'matches' if verify.ok else 'DIFFERS FROM'} the full backward</p>"
        '<nav><a href="#summary">Summary</a><a href="#groups">Groups</a><a href="#diagram">Diagram</a>'
        '<a href="#verification">Verification</a><a href="#files">Files</a></nav></header>'
        f"<main>{overview}{_groups_section(inspection)}{_diagram_section(inspection, files)}"
        f"{_verify_section(inspection)}{_files_section(files)}</main>"
        f"<footer>Made by graphkit &middot; {_e(timing)}</footer>"
        "</body></html>\n"
    )


# --- terminal ---------------------------------------------------------------------------------------------
def _plain_input(item: Mapping[str, Any]) -> str:
    name = item["name"] if item["name"] == item["argument"] else f"{item['name']} ({item['argument']})"
    grad = "requires grad" if item["requires_grad"] else "no grad"
    return f"{name} {item['dtype']} {_shape(item['shape'])} {grad}"


def _terminal_rows(inspection: Inspection, output: Path) -> list[tuple[str, str]]:
    summary = inspection.summary()
    verify = inspection.verify
    flops = verify.flops
    share = (lambda value: f" ({100 * value / flops['full']:.0f}%)") if flops["full"] else (lambda value: "")
    checked = len(verify.inputs) + len(verify.params)
    tied = "; tied: " + "; ".join(" = ".join(names) for names in summary["tied_parameters"])
    rows = [
        ("model", f"{inspection.spec} ({inspection.module_class})"),
        ("inputs", "; ".join(_plain_input(item) for item in inspection.inputs) or "none"),
        ("graph", f"{summary['nodes']} nodes, {summary['edges']} edges"),
        (
            "parameters",
            f"{summary['parameters']} tensors, {summary['parameter_values']:,} values"
            + (tied if summary["tied_parameters"] else ""),
        ),
        ("groups", str(summary["groups"])),
        (
            "FLOPs",
            f"full backward {_flop(flops['full'])}, B {_flop(flops['b'])}{share(flops['b'])}, "
            f"W {_flop(flops['w'])}{share(flops['w'])}"
            if flops["b"] >= 0
            else f"full backward {_flop(flops['full'])}; B and W not counted (activation checkpointing)",
        ),
        (
            "verify",
            f"{'OK' if verify.ok else 'FAILED'}: {checked - len(verify.failures)} of {checked} gradients match "
            f"({verify.dtype}, {verify.device}, rel tol {_tolerance(verify.tolerance)})",
        ),
        ("diagram", "graph.svg" if inspection.svg is not None else "none (Graphviz missing): graph.dot only"),
        ("report", str(output / FILES["html"])),
    ]
    if inspection.groups.unused_params:
        rows.insert(3, ("unused", ", ".join(inspection.groups.unused_params)))
    return rows


def _print_summary(inspection: Inspection, output: Path, stream: TextIO) -> None:
    rows = _terminal_rows(inspection, output)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        width = max(len(label) for label, _ in rows)
        for label, value in rows:
            print(f"{label.ljust(width)}  {value}", file=stream)
        return
    console = Console(file=stream, highlight=False, soft_wrap=False)
    table = Table(title=f"graphkit inspect {inspection.spec}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for label, value in rows:
        table.add_row(label, value)
    console.print(table)


def inspect(
    spec: str | None = None,
    *,
    output: Path | str,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    collapse_depth: int | None = None,
) -> int:
    """Capture, group, verify, measure and draw the model ``spec`` names; write a report folder.

    Args:
        spec: a model spec (``zoo:NAME``, ``file.py:function``, ``package.module:function``,
            ``hf:ARCH?key=value``); None: :data:`DEFAULT_SPEC`.
        output: the report folder (created; existing report files in it are replaced).
        device: where to run (``"cpu"``, ``"cuda"``, ...; default: where the model is).
        dtype: cast parameters and floating inputs (``torch.float32``, ``torch.float64``).
        collapse_depth: draw modules at this depth of the module tree as one node each; None collapses only
            graphs of more than :data:`MAX_NODES` nodes.

    Returns:
        The exit status: 0 when the split backward matches the full backward, 1 when a gradient differs
        (the wrong ones are printed). A missing Graphviz is a warning, not a failure: the report is written
        without the diagram's SVG.

    Raises:
        graphkit.models.specs.SpecError: the spec cannot be loaded.
        ValueError: bad ``collapse_depth`` or ``device``; ``output`` is a file.
        graphkit.graph.tensors.GraphkitInputError: the model's outputs have no autograd graph.
    """
    spec = spec or DEFAULT_SPEC
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise ValueError(
            f"-o {str(output)!r} is a file; the report needs a folder (it is created if missing)"
        )
    with _Progress(STEPS, sys.stderr) as progress:
        inspection = collect(
            spec,
            device=device,
            dtype=dtype,
            collapse_depth=collapse_depth,
            step=progress.step,
        )
        with progress.step(STEPS[5]):
            start = time.perf_counter()
            write_report(inspection, output)
            inspection.timings[STEPS[5]] = time.perf_counter() - start
    if inspection.diagram_note is not None:
        print(
            f"graphkit inspect: warning: no diagram in the report: {inspection.diagram_note}",
            file=sys.stderr,
        )
    _print_summary(inspection, output, sys.stdout)
    verify = inspection.verify
    if verify.ok:
        print(f"OK: split backward (B then W) matches the full backward. Open {output / FILES['html']}")
        return 0
    wrong = ", ".join(
        f"{check.name} ({check.status}"
        + (f", rel error {check.max_rel_err:.2e}" if check.max_rel_err is not None else "")
        + ")"
        for check in verify.failures
    )
    print(f"FAILED: split backward differs from the full backward for: {wrong}")
    return 1
