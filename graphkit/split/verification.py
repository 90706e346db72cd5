"""Check that graphkit's split backward (B then W) gives exactly the gradients of a full backward.

:func:`verify_split` runs the stage's forward twice from the same inputs and random state: once followed
by an ordinary full backward (the reference), once followed by :func:`graphkit.split.backward_input`
and :func:`graphkit.split.backward_weight`. Every floating output that requires grad receives the same
seeded random cotangent in both runs. Every stage-input gradient and every parameter gradient is
compared, and the FLOPs of each phase are counted (:class:`graphkit.split.flops.FlopCounter`), also per
*opaque Node* (:mod:`graphkit.analysis.opaque`: activation checkpoints, compiled regions, custom
Functions, ``linalg.solve`` with a learned matrix): the report names each one with its FLOPs in the full
backward, in B and in W, so a user sees where B + W costs more than a full backward, and which
parameters received their gradient in B already (reentrant checkpoints).

Tolerances (relative to the largest magnitude of the reference gradient):

- float64: 1e-9. B + W adds the same terms as a full backward, only sometimes in another order, so
  the results differ by a few rounding errors (~1e-15); any wrong, missing or double-counted term
  changes them by O(1).
- float32: 1e-4, which leaves room for reordered sums over deep stages (errors ~1e-6) while still
  catching a wrong contribution.
- bfloat16 / float16 (or autocast to them): 2e-2, for the same reason at 8-11 bits of mantissa.
"""

from __future__ import annotations

import contextlib
import copy
import html
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from graphkit.analysis.opaque import opaque_nodes
from graphkit.analysis.parameter_groups import param_groups
from graphkit.graph.autograd_graph import capture
from graphkit.graph.tensors import flatten_tensors, unflatten_like
from graphkit.split.backward import backward_full, backward_input, backward_weight
from graphkit.split.checkpointing import Recompute
from graphkit.split.flops import FlopCounter, flops_per_node

__all__ = [
    "GradientCheck",
    "OpaqueNodeCost",
    "VerifyReport",
    "call_stage",
    "fresh_inputs",
    "tolerance_for",
    "verify_split",
]

_TOLERANCES = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def tolerance_for(dtype: torch.dtype) -> float:
    """Relative tolerance used for gradients of ``dtype`` (see module docstring)."""
    return _TOLERANCES.get(dtype, 1e-4)


@dataclass(slots=True, frozen=True)
class GradientCheck:
    """One compared gradient. ``status``: ``ok``, ``wrong``, ``missing`` (split gave none where the full
    backward gave one) or ``unexpected`` (the other way round). Errors are absolute and relative to the
    largest reference magnitude; None when either side has no gradient."""

    name: str
    status: str
    max_abs_err: float | None
    max_rel_err: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
        }


@dataclass(slots=True, frozen=True)
class OpaqueNodeCost:
    """An opaque Node (:mod:`graphkit.analysis.opaque`) and the FLOPs its backward cost in each run.

    ``flops`` has ``full``, ``b`` and ``w`` (FLOPs a Node triggers inside its backward, such as a
    checkpoint's recomputation, count for it); ``repeated`` is ``b + w - full``, the work B + W does twice.
    """

    node: str
    op: str
    kind: str
    meaning: str
    flops: dict[str, int]

    @property
    def repeated(self) -> int:
        return self.flops["b"] + self.flops["w"] - self.flops["full"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "op": self.op,
            "kind": self.kind,
            "meaning": self.meaning,
            "flops": dict(self.flops),
            "repeated_flops": self.repeated,
        }


@dataclass(slots=True)
class VerifyReport:
    """Result of :func:`verify_split`.

    Attributes:
        ok: every gradient has status ``ok``.
        inputs, params: one :class:`GradientCheck` per stage input / parameter.
        flops: FLOPs of the ``full`` backward and of the ``b`` and ``w`` phases (``-1`` when they could not
            be counted; ``extra["flops_note"]`` says why).
        groups: number of parameter groups.
        dtype, device, tolerance: the settings of the run.
        opaque: the opaque Nodes with their FLOPs per run (empty when the FLOPs could not be counted).
        grads_in_b: parameters whose ``.grad`` the B phase already set (a reentrant checkpoint's).
    """

    inputs: list[GradientCheck]
    params: list[GradientCheck]
    flops: dict[str, int]
    groups: int
    dtype: str
    device: str
    tolerance: float
    extra: dict[str, Any] = field(default_factory=dict)
    opaque: list[OpaqueNodeCost] = field(default_factory=list)
    grads_in_b: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.status == "ok" for check in [*self.inputs, *self.params])

    @property
    def failures(self) -> list[GradientCheck]:
        """The checks that are not ``ok``."""
        return [check for check in [*self.inputs, *self.params] if check.status != "ok"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``ok``, ``inputs``, ``params``, ``flops``, ``groups``, ``dtype``, ``device``, ``tolerance``."""
        return {
            "ok": self.ok,
            "inputs": [check.to_dict() for check in self.inputs],
            "params": [check.to_dict() for check in self.params],
            "flops": dict(self.flops),
            "groups": self.groups,
            "dtype": self.dtype,
            "device": self.device,
            "tolerance": self.tolerance,
            "opaque_nodes": [cost.to_dict() for cost in self.opaque],
            "grads_in_b": list(self.grads_in_b),
            **self.extra,
        }

    def table(self) -> str:
        """A plain-text table: one row per gradient, then FLOPs and the verdict."""
        rows = [("kind", "name", "status", "max_abs_err", "max_rel_err")]
        for kind, checks in (("input", self.inputs), ("param", self.params)):
            rows.extend(
                (kind, c.name, c.status, _number(c.max_abs_err), _number(c.max_rel_err)) for c in checks
            )
        widths = [max(len(row[column]) for row in rows) for column in range(5)]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        lines.insert(1, "  ".join("-" * width for width in widths))
        flops = self.flops
        if flops["b"] < 0:
            lines.append(
                f"FLOPs full={flops['full']:,}; {self.extra.get('flops_note', 'B and W not counted')}"
            )
        else:
            lines.append(
                f"FLOPs full={flops['full']:,} B={flops['b']:,} W={flops['w']:,} "
                f"(B+W)/full={_ratio(flops['b'] + flops['w'], flops['full'])}"
            )
        lines.extend(self._opaque_lines())
        lines.append(
            f"{'OK' if self.ok else 'FAILED'}: {len(self.failures)} of {len(self.inputs) + len(self.params)} "
            f"gradients differ ({self.dtype}, {self.device}, rel tol {self.tolerance:g}, {self.groups} groups)"
        )
        return "\n".join(lines)

    def _opaque_lines(self) -> list[str]:
        """Where B + W repeats work (one line per opaque Node), and the parameters served in B."""
        lines = []
        if self.opaque:
            lines.append("opaque nodes (FLOPs full / B / W; repeated = B + W - full):")
            lines.extend(
                f"  {cost.node} {cost.op} [{cost.kind}]: {cost.flops['full']:,} / {cost.flops['b']:,} / "
                f"{cost.flops['w']:,}, repeated {cost.repeated:,}"
                for cost in self.opaque
            )
            meanings = {cost.kind: cost.meaning for cost in self.opaque}
            lines.extend(f"  [{kind}] {meaning}" for kind, meaning in meanings.items())
        recomputations = self.extra.get("recomputations")
        if recomputations:
            lines.append(
                f"checkpointed regions recomputed: {recomputations['b']} in B, {recomputations['w']} in W "
                f"(recompute={self.extra.get('recompute')!r})"
            )
        if self.grads_in_b:
            lines.append(
                "parameters given their gradient in B (reentrant checkpoint, not deferred to W): "
                + ", ".join(self.grads_in_b)
            )
        return lines

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        body = []
        for kind, checks in (("input", self.inputs), ("param", self.params)):
            for check in checks:
                colour = "#1b7837" if check.status == "ok" else "#b2182b"
                body.append(
                    f"<tr><td>{kind}</td><td>{html.escape(check.name)}</td>"
                    f"<td style='color:{colour}'>{check.status}</td><td>{_number(check.max_abs_err)}</td>"
                    f"<td>{_number(check.max_rel_err)}</td></tr>"
                )
        verdict = "OK" if self.ok else "FAILED"
        flops = self.flops
        notes = "".join(f"<li>{html.escape(line.strip())}</li>" for line in self._opaque_lines())
        return (
            f"<p><b>{verdict}</b>: split backward vs full backward ({self.dtype}, {self.device}, relative "
            f"tolerance {self.tolerance:g}, {self.groups} groups). FLOPs full {flops['full']:,}, "
            f"B {flops['b']:,}, W {flops['w']:,}.</p>"
            "<table><thead><tr><th>kind</th><th>name</th><th>status</th><th>max abs err</th>"
            f"<th>max rel err</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
            + (f"<ul>{notes}</ul>" if notes else "")
        )


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _ratio(numerator: int, denominator: int) -> str:
    return f"{numerator / denominator:.3f}" if denominator else "-"


def _compare(
    name: str, reference: torch.Tensor | None, split: torch.Tensor | None, tolerance: float
) -> GradientCheck:
    if reference is None and split is None:
        return GradientCheck(name, "ok", None, None)
    if reference is None:
        return GradientCheck(name, "unexpected", None, None)
    if split is None:
        return GradientCheck(name, "missing", None, None)
    if reference.shape != split.shape:
        return GradientCheck(name, "wrong", None, None)
    reference64 = reference.detach().to(torch.float64)
    difference = (
        (split.detach().to(torch.float64) - reference64).abs().max().item() if reference.numel() else 0.0
    )
    scale = reference64.abs().max().item() if reference.numel() else 0.0
    relative = difference / scale if scale > 0 else (0.0 if difference == 0 else float("inf"))
    status = "ok" if relative <= tolerance else "wrong"
    return GradientCheck(name, status, difference, relative)


def fresh_inputs(value: Any, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Any:
    """Fresh leaf copies of the input tensors in ``value`` (same structure and requires_grad), moved to
    ``device`` and, for floating tensors, cast to ``dtype`` when given. Non-tensor entries stay as they are."""
    tensors = flatten_tensors(value) if not isinstance(value, torch.Tensor) else [("input", value)]
    prepared = []
    for _, tensor in tensors:
        copy_ = tensor.detach().clone()
        if device is not None:
            copy_ = copy_.to(device)
        if dtype is not None and copy_.is_floating_point():
            copy_ = copy_.to(dtype)
        prepared.append(copy_.requires_grad_(tensor.requires_grad))
    return prepared[0] if isinstance(value, torch.Tensor) else unflatten_like(value, prepared)


def call_stage(module: torch.nn.Module, inputs: Any) -> Any:
    """``module(**inputs)`` for a dict, ``module(*inputs)`` for a tuple or list, else ``module(inputs)``."""
    if isinstance(inputs, Mapping):
        return module(**inputs)
    if isinstance(inputs, (tuple, list)):
        return module(*inputs)
    return module(inputs)


def verify_split(
    module: torch.nn.Module,
    inputs: Any,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    seed: int = 0,
    autocast_dtype: torch.dtype | None = None,
    recompute: Recompute | str = Recompute.IN_W,
) -> VerifyReport:
    """Run split (B then W) and full backward on ``module`` and compare every gradient.

    Args:
        module: the stage. It is deep-copied, so its own parameters and ``.grad`` are not touched.
        inputs: a tuple of positional arguments or a dict of keyword arguments (a single tensor works
            too); floating tensors with ``requires_grad=True`` are the stage inputs.
        dtype: cast parameters and floating inputs to this dtype (default: leave as they are).
        device: run on this device (``"cpu"``, ``"cuda"``...; default: where the module is).
        seed: seeds the random cotangents and the random state of both forwards (dropout).
        autocast_dtype: run the forwards under ``torch.autocast`` to this dtype (e.g. ``torch.bfloat16``).
        recompute: passed to :func:`graphkit.split.backward_input` (when W recomputes non-reentrant
            activation checkpoints).

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is True when every gradient matches within the tolerance
        of the gradients' dtype (see module docstring).

    Raises:
        graphkit.graph.tensors.GraphkitInputError: the module's outputs have no autograd graph.
    """
    device = torch.device(device) if device is not None else None
    stage = copy.deepcopy(module)
    if device is not None or dtype is not None:
        stage = stage.to(device=device, dtype=dtype) if dtype is not None else stage.to(device=device)
    run_device = device or next((p.device for p in stage.parameters()), torch.device("cpu"))
    parameters = [(name, p) for name, p in stage.named_parameters() if p.requires_grad]

    def forward() -> tuple[Any, Any]:
        prepared = fresh_inputs(inputs, dtype, device)
        with torch.random.fork_rng(devices=[run_device] if run_device.type == "cuda" else []):
            torch.manual_seed(seed)
            if autocast_dtype is not None:
                with torch.autocast(device_type=run_device.type, dtype=autocast_dtype):
                    outputs = call_stage(stage, prepared)
            else:
                outputs = call_stage(stage, prepared)
        return prepared, outputs

    for _, parameter in parameters:
        parameter.grad = None
    prepared, outputs = forward()
    flat_outputs = (
        flatten_tensors(outputs) if not isinstance(outputs, torch.Tensor) else [("output", outputs)]
    )
    generator = torch.Generator().manual_seed(seed)
    cotangents = [
        torch.randn(tensor.shape, generator=generator, dtype=torch.float64).to(tensor.dtype).to(tensor.device)
        if tensor.requires_grad and tensor.is_floating_point()
        else None
        for _, tensor in flat_outputs
    ]
    cotangent_structure = (
        cotangents[0] if isinstance(outputs, torch.Tensor) else unflatten_like(outputs, cotangents)
    )

    full_graph = capture(outputs, inputs=prepared, details=False)
    opaque = opaque_nodes(full_graph)  # node ids are the same in every run of the stage
    full_watched = {node: full_graph.autograd_nodes[node] for node in opaque}
    with FlopCounter() as full_counter, _per_node(full_counter, full_watched) as full_nodes:
        reference_inputs = backward_full(outputs, cotangent_structure, prepared)
    reference_params = {name: None if p.grad is None else p.grad.detach().clone() for name, p in parameters}
    del outputs, full_graph, full_watched
    node_flops: dict[str, dict[str, int]] = {}
    grads_in_b: list[str] = []

    def split_run(count_flops: bool) -> tuple[Any, Any, int, int, int]:
        for _, parameter in parameters:
            parameter.grad = None
        prepared, outputs = forward()
        graph = capture(outputs, inputs=prepared, details=False)
        groups = len(param_groups(graph))
        watched = (
            {
                node: graph.autograd_nodes[node]
                for node, entry in opaque.items()
                if node in graph.autograd_nodes and graph.nodes[node]["op"] == entry.op
            }
            if count_flops
            else {}
        )
        del graph
        input_counter = FlopCounter() if count_flops else contextlib.nullcontext()
        weight_counter = FlopCounter() if count_flops else contextlib.nullcontext()
        with input_counter, _per_node(input_counter, watched) as b_nodes, warnings.catch_warnings():
            # the report names the parameters a reentrant checkpoint serves in B (grads_in_b)
            warnings.filterwarnings("ignore", message=".*reentrant activation checkpoint")
            state = backward_input(outputs, cotangent_structure, prepared, recompute=recompute)
        grads_in_b[:] = [name for name, p in parameters if p.grad is not None]
        regions = state._checkpoints
        del outputs
        with weight_counter, _per_node(weight_counter, watched) as w_nodes:
            backward_weight(state)
        del watched
        if regions is not None:
            extra["recomputations"] = dict(regions.recomputations)
            extra["recompute"] = str(Recompute(recompute))
        if not count_flops:
            return prepared, state, groups, -1, -1
        node_flops.update(
            {
                node: {"full": full_nodes.get(node, 0), "b": b_nodes.get(node, 0), "w": w_nodes.get(node, 0)}
                for node in opaque
            }
        )
        return prepared, state, groups, input_counter.get_total_flops(), weight_counter.get_total_flops()

    extra: dict[str, Any] = {}
    try:
        prepared, state, groups, b_flops, w_flops = split_run(count_flops=True)
    except RuntimeError as error:
        # Counting FLOPs runs a dispatch mode over every op, which some ops or PyTorch releases may
        # refuse. Verify the gradients without it, and say the FLOPs are missing.
        node_flops.clear()
        prepared, state, groups, b_flops, w_flops = split_run(count_flops=False)
        reason = str(error).splitlines()[0][:160]
        extra["flops_note"] = f"B and W FLOPs not counted: FlopCounterMode failed with this model ({reason})"

    tolerance = tolerance_for(autocast_dtype or dtype or _dominant_dtype(parameters))
    input_names = [name for name, tensor in _named(prepared)]
    input_checks = [
        _compare(name, reference, split, tolerance)
        for name, reference, split, (_, tensor) in zip(
            input_names, reference_inputs, state.input_grads, _named(prepared), strict=True
        )
        if tensor.requires_grad
    ]
    param_checks = [_compare(name, reference_params[name], p.grad, tolerance) for name, p in parameters]
    return VerifyReport(
        inputs=input_checks,
        params=param_checks,
        flops={
            "full": int(full_counter.get_total_flops()),
            "b": int(b_flops),
            "w": int(w_flops),
        },
        groups=groups,
        dtype=str(autocast_dtype or dtype or _dominant_dtype(parameters)).removeprefix("torch."),
        device=str(run_device),
        tolerance=tolerance,
        extra=extra,
        opaque=[
            OpaqueNodeCost(entry.node, entry.op, str(entry.kind), entry.meaning, node_flops[node])
            for node, entry in opaque.items()
            if node in node_flops
        ],
        grads_in_b=grads_in_b,
    )


def _per_node(counter: Any, nodes: dict[str, Any]) -> Any:
    return flops_per_node(counter, nodes) if nodes else contextlib.nullcontext({})


def _named(value: Any) -> list[tuple[str, torch.Tensor]]:
    return [("input", value)] if isinstance(value, torch.Tensor) else flatten_tensors(value)


def _dominant_dtype(parameters: list[tuple[str, torch.nn.Parameter]]) -> torch.dtype:
    return parameters[0][1].dtype if parameters else torch.get_default_dtype()
