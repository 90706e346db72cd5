"""What ``graphkit inspect`` finds out about a model spec, before anything is written.

:func:`collect` loads a model spec (see :mod:`graphkit.models.specs`), captures its autograd graph with
module paths (:func:`graphkit.trace`), computes the parameter groups (:func:`graphkit.param_groups`), checks
the split backward against a full backward and counts the FLOPs of each phase (:func:`graphkit.verify_split`),
and draws the graph (:mod:`graphkit.drawing.diagram`); the result is one :class:`Inspection`.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from inspect import signature
from pathlib import Path
from typing import Any

import torch

from graphkit.analysis.parameter_groups import ParamGroups, param_groups
from graphkit.analysis.uncounted_flops import FlopCoverage, flop_coverage
from graphkit.drawing.collapsing import choose_collapse_depth
from graphkit.drawing.diagram import draw
from graphkit.drawing.rendering import GraphvizNotFoundError, RenderTimeoutError, render
from graphkit.graph.autograd_graph import AutogradGraph
from graphkit.graph.tensors import flatten_tensors, unflatten_like
from graphkit.graph.tracing import trace
from graphkit.measure.flops import PhaseFlops
from graphkit.measure.verification import VerifyReport, verify_split
from graphkit.models.specs import (
    SpecError,
    load_spec,
    load_spec_on,
    meta_forward_error,
    meta_graph_note,
    spec_inputs_as_call,
)
from graphkit.models.zoo import DEFAULT_MODEL
from graphkit.split.backward import backward_input, backward_weight

__all__ = [
    "DEFAULT_SPEC",
    "FILES",
    "MAX_NODES",
    "META_VERIFY_NOTE",
    "STEPS",
    "Inspection",
    "collect",
    "meta_backward_error",
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

META_VERIFY_NOTE = (
    "not run: on the meta device tensors have shapes but no values, and verifying the split compares "
    "gradient values. Run without --device meta (on cpu or cuda) to verify"
)
"""Why an inspection on the ``meta`` device has no verification."""

_DOT_TIMEOUT_S = 60.0


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
        verify: the split-versus-full check, with FLOPs per phase; None on the ``meta`` device, which has
            no values to compare (:data:`META_VERIFY_NOTE`).
        device, dtype: where and in which dtype the check ran (``"cpu"``, ``"float32"``, ``"meta"``).
        counted_flops: FlopCounterMode's backward FLOPs ``{"full", "b", "w"}`` (-1: not counted).
        coverage: what those counts miss (:func:`graphkit.analysis.uncounted_flops.flop_coverage`).
        dot_source: DOT source of the diagram.
        svg: the laid-out diagram, or None when Graphviz is missing, too slow or failed.
        diagram_note: why ``svg`` is None (install instructions), else None.
        collapse_depth: module depth the diagram is collapsed at (None: every node drawn).
        graph_note: why this graph differs from the same model's on another device ("" when it does not;
            :func:`graphkit.models.specs.meta_graph_note`).
        timings: seconds spent in each step, by step name.
    """

    spec: str
    module_class: str
    inputs: list[dict[str, Any]]
    graph: AutogradGraph
    groups: ParamGroups
    verify: VerifyReport | None
    device: str
    dtype: str
    counted_flops: dict[str, int] = field(default_factory=lambda: {"full": -1, "b": -1, "w": -1})
    coverage: FlopCoverage = field(default_factory=FlopCoverage)
    dot_source: str = ""
    svg: str | None = None
    diagram_note: str | None = None
    collapse_depth: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    graph_note: str = ""

    # --- derived facts ------------------------------------------------------------------------------
    @property
    def flops(self) -> dict[str, int]:
        """Backward FLOPs ``{"full", "b", "w"}``: counted plus estimated from shapes (-1: not counted)."""
        return self.coverage.totals(self.counted_flops)

    @property
    def verified(self) -> bool:
        """True when the split was checked (not on the meta device)."""
        return self.verify is not None

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
            "graph_note": self.graph_note,
            "skipped_outputs": list(self.graph.graph.get("skipped_outputs", [])),
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
            "ok": self.verify.ok if self.verify is not None else None,
            "verdict": ("OK" if self.verify.ok else "FAILED") if self.verify is not None else "NOT RUN",
            "verify_note": None if self.verify is not None else META_VERIFY_NOTE,
            "wrong": [check.name for check in self.verify.failures] if self.verify is not None else [],
            "flops": {"counted": dict(self.counted_flops), "total": self.flops, **self.coverage.to_dict()},
            "diagram": {
                "svg": self.svg is not None,
                "collapse_depth": self.collapse_depth,
                "note": self.diagram_note,
            },
        }


def _check_device(device: str | None) -> None:
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"--device {device!r} is not a device name (cpu, cuda, cuda:1, ...): {error}"
        ) from None
    if parsed.type not in ("cpu", "cuda", "meta", "mps", "xpu"):
        raise ValueError(f"--device {device}: graphkit inspect runs on cpu, cuda or meta, not {parsed.type}")
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


def _meta_backward_flops(
    outputs: Any, module: torch.nn.Module, stage_inputs: list[torch.Tensor]
) -> dict[str, int]:
    """Backward FLOPs on the meta device, counted from shapes (:class:`graphkit.measure.flops.PhaseFlops`):
    ``{"full", "b", "w"}``.

    A full backward (ones as cotangents, the graph kept), then the split's B and W phases
    (:func:`graphkit.backward_input`, :func:`graphkit.backward_weight`) on the same graph; no value is
    read, so nothing is verified. B and W are -1 when the split cannot run there.

    Raises:
        RuntimeError: the full backward cannot run on the meta device (PyTorch's error, such as the
            NotImplementedError of its meta ``nonzero``, which boolean indexing reaches).
    """
    roots = [tensor for _, tensor in flatten_tensors(outputs) if tensor.requires_grad]
    leaves = [parameter for parameter in module.parameters() if parameter.requires_grad] + stage_inputs
    cotangents = [torch.ones_like(root) for root in roots]
    flops = PhaseFlops()
    with flops.counting("full"):
        torch.autograd.grad(roots, leaves, cotangents, retain_graph=True, allow_unused=True)
    try:
        with flops.counting("b"):
            state = backward_input(roots, cotangents, inputs=stage_inputs or None, params=module)
        with flops.counting("w"):
            backward_weight(state)
    except Exception:  # noqa: BLE001 - a split that cannot run on meta leaves B and W uncounted
        flops.forget("b", "w")
    return flops.backward()


def meta_backward_error(spec: str, error: BaseException) -> SpecError:
    """The one-line refusal of an inspection on the meta device whose full backward cannot run there
    (``error``: what PyTorch raised; its meta ``nonzero``, reached by boolean indexing in a backward, has no
    data-independent result)."""
    lines = str(error).strip().splitlines()
    first = lines[0].split(". ")[0][:200] if lines else ""  # its first sentence
    reason = f"{type(error).__name__}: {first}"
    return SpecError(
        f"the backward of {spec!r} cannot run on the meta device ({reason}), so graphkit inspect cannot count "
        "its FLOPs from shapes: run it on cpu (with a smaller config if it is too large), or draw the graph "
        "alone with graphkit render --device meta"
    )


def collect(
    spec: str | None = None,
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    collapse_depth: int | None = None,
    max_nodes: int = MAX_NODES,
    fold: bool | None = None,
    timeout_s: float = _DOT_TIMEOUT_S,
    step: Callable[[str], Any] | None = None,
) -> Inspection:
    """Run every step of :func:`inspect` except writing the report.

    Args:
        spec: a model spec (default :data:`DEFAULT_SPEC`).
        device: run the trace and the check there (``"cpu"``, ``"cuda"``, ...; default: where the model is).
            ``"meta"`` builds the model on the meta device: graph, groups, saved bytes, FLOPs and the
            diagram come from shapes alone (no memory used), and the split is not verified.
        dtype: cast the parameters and floating inputs (``torch.float32`` or ``torch.float64``).
        collapse_depth: draw modules at this depth of the module tree as one node each (>= 1); None
            collapses (or folds repeated structure) only past ``max_nodes`` nodes.
        max_nodes: node budget of the diagram (>= 1).
        fold: fold repeated structure (see :func:`graphkit.drawing.diagram.draw`); None: when needed.
        timeout_s: seconds Graphviz may lay out the diagram before a smaller one is drawn (then again).
        step: a context-manager factory called with each step name (progress reporting); None: silent.

    Returns:
        An :class:`Inspection`.

    Raises:
        graphkit.models.specs.SpecError: the spec cannot be loaded (or not on the meta device), or on the meta
            device its forward reads tensor values or its backward cannot run (:func:`meta_backward_error`).
        ValueError: ``collapse_depth < 1``, ``max_nodes < 1``, or ``device`` is unknown or unavailable.
        graphkit.graph.tensors.GraphkitInputError: the model's outputs have no autograd graph.
    """
    spec = spec or DEFAULT_SPEC
    if collapse_depth is not None and collapse_depth < 1:
        raise ValueError(f"--collapse must be a module depth >= 1, got {collapse_depth}")
    if max_nodes < 1:
        raise ValueError(f"--max-nodes must be >= 1, got {max_nodes}")
    _check_device(device)
    on_meta = device is not None and torch.device(device).type == "meta"
    step = step or (lambda _name: contextmanager(lambda: (yield))())
    timings: dict[str, float] = {}

    @contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        with step(name):
            yield
        timings[name] = time.perf_counter() - start

    with timed(STEPS[0]):
        module, inputs = load_spec_on(spec, "meta") if on_meta else load_spec(spec)
    with timed(STEPS[1]):
        traced_module, traced_inputs = module, inputs
        if not on_meta and (device is not None or dtype is not None):
            traced_module = copy.deepcopy(module).to(device=device, dtype=dtype)
            traced_inputs = _cast(inputs, device, dtype)
        elif on_meta and dtype is not None:
            traced_module = module.to(dtype=dtype)
            traced_inputs = _cast(inputs, None, dtype)
        args, kwargs = spec_inputs_as_call(traced_inputs)
        try:
            outputs, graph = trace(traced_module, *args, **kwargs)
        except RuntimeError as error:
            clear = meta_forward_error(spec, error) if on_meta else None
            if clear is None:
                raise
            raise clear from error
    with timed(STEPS[2]):
        groups = param_groups(graph)
        coverage = flop_coverage(graph)
    with timed(STEPS[3]):
        if on_meta:
            report = None
            stage_inputs = [tensor for _, tensor in flatten_tensors((args, kwargs)) if tensor.requires_grad]
            try:
                counted = _meta_backward_flops(outputs, traced_module, stage_inputs)
            except RuntimeError as error:  # NotImplementedError too
                raise meta_backward_error(spec, error) from error
            parameter = next(iter(traced_module.parameters()), None)
            run_dtype = str(parameter.dtype if parameter is not None else torch.float32).removeprefix(
                "torch."
            )
        else:
            report = verify_split(module, inputs, dtype=dtype, device=device)
            counted = dict(report.flops)
    inspection = Inspection(
        spec=spec,
        module_class=type(module).__name__,
        inputs=_describe_inputs(module, traced_inputs),  # as cast for the trace and the check
        graph=graph,
        groups=groups,
        verify=report,
        device=report.device if report is not None else "meta",
        dtype=report.dtype if report is not None else run_dtype,
        counted_flops=counted,
        coverage=coverage,
        timings=timings,
        graph_note=meta_graph_note(module) if on_meta else "",
    )
    with timed(STEPS[4]):
        if fold:
            inspection.collapse_depth = None
        elif collapse_depth is not None:
            inspection.collapse_depth = collapse_depth
        else:
            inspection.collapse_depth = choose_collapse_depth(graph, max_nodes)[0]
        options = {"collapse_depth": collapse_depth, "max_nodes": max_nodes, "fold": fold, "title": spec}
        digraph = draw(graph, list(groups), **options)
        inspection.dot_source = digraph.source
        if "repeated structure folded" in digraph.source:
            inspection.collapse_depth = None
        notes: list[str] = []
        try:
            with tempfile.TemporaryDirectory(prefix="graphkit-") as scratch:
                path = render(
                    graph,
                    Path(scratch) / FILES["svg"],
                    list(groups),
                    timeout_s=timeout_s,
                    progress=notes.append,
                    **options,
                )
                inspection.svg = path.read_text(encoding="utf-8")
            fallback = [note for note in notes if "did not lay out" in note]
            if fallback:
                inspection.diagram_note = fallback[-1]
        except (GraphvizNotFoundError, RenderTimeoutError) as error:
            inspection.diagram_note = str(error)
        except RuntimeError as error:  # dot itself failed: keep the rest of the report
            inspection.diagram_note = f"{error}. The DOT source is still written."
    return inspection
