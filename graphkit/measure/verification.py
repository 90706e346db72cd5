"""Check that graphkit's split backward (B then W) gives exactly the gradients of a full backward.

:func:`verify_split` runs the stage's forward twice from the same inputs and random state: once followed
by an ordinary full backward (the reference), once followed by :func:`graphkit.split.backward_input`
and :func:`graphkit.split.backward_weight`. Both run on the user's module itself (no copy: pruned
modules, tensor hooks and leaves kept outside the module stay as they are); its buffers, any parameter
the forward changed in place, and the random state are restored before the second forward (a forward
may update buffers: batch norm's running statistics, spectral norm's power iteration; or parameters:
``nn.Embedding(max_norm=...)``), and the parameters, their ``.grad`` and the buffers are restored at
the end. Before each forward and each backward, every random number generator a model commonly draws
from is seeded alike: torch's (CPU, and the CUDA device it runs on), numpy's global one (when numpy is
installed) and Python's ``random`` (a model may draw its masks from any of them: Wav2Vec2's SpecAugment
uses ``np.random``); their states are saved before and restored after, so the caller's random streams go
on as if verify had not run. When the two forwards still give different outputs (a random source graphkit
cannot seed, state that changes between calls), the gradients of the two runs cannot be compared, and
:class:`NondeterministicForwardError` says so instead of reporting them as wrong. Every floating or complex
output that requires grad receives the same seeded random cotangent in both runs. Every stage-input gradient
and the gradient of every leaf the outputs reach (registered parameters or not) is compared - complex ones as
complex values; a leaf the forward itself makes (``h = x[:, None]; h.requires_grad = True``, as transformers'
audio encoders do) is a new tensor in each run, and the split run's is compared with the reference run's at
the same place of the graph - and the FLOPs of each phase are counted
(:class:`graphkit.measure.flops.PhaseFlops`), also per *opaque Node* (:mod:`graphkit.analysis.opaque`:
activation checkpoints, compiled regions, custom Functions, ``linalg.solve`` with a learned matrix): the
report names each one with its FLOPs in the full backward, in B and in W, so a user sees where B + W costs
more than a full backward, and which parameters received their gradient in B already (reentrant checkpoints).

Each gradient is compared by :func:`graphkit.measure.gradient_check.compare_gradients` (the comparison
``verify_pipeline`` uses too). Tolerances (relative to the largest magnitude of the reference gradient):

- float64: 1e-9. B + W adds the same terms as a full backward, only sometimes in another order, so
  the results differ by a few rounding errors (~1e-15); any wrong, missing or double-counted term
  changes them by O(1).
- float32: 1e-4, which leaves room for reordered sums over deep stages (errors ~1e-6) while still
  catching a wrong contribution.
- bfloat16 / float16 (or autocast to them): 2e-2, for the same reason at 8-11 bits of mantissa.

NaN and inf compare by place: where the full backward's gradient holds them (a row of attention masked out
entirely, an overflow), the split's must hold the same ones at the same places, and the finite rest is
compared as above; ``extra["nonfinite"]`` names those gradients and the table says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import random
import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from graphkit.analysis.opaque import opaque_nodes
from graphkit.analysis.parameter_groups import param_groups
from graphkit.analysis.uncounted_flops import FlopCoverage, flop_coverage
from graphkit.graph import _autograd
from graphkit.graph.autograd_graph import capture
from graphkit.graph.tensors import GraphkitInputError, flatten_tensors, unflatten_like
from graphkit.measure.flops import NOT_COUNTED, PhaseFlops
from graphkit.measure.gradient_check import GradientCheck, compare_gradients
from graphkit.measure.stage_inputs import call_stage, cast_floating, fresh_inputs, stage_input_tensors
from graphkit.models.devices import checked_device
from graphkit.split.backward import backward_full, backward_input, backward_weight
from graphkit.split.checkpointing import Recompute, recompute_policy

__all__ = ["NondeterministicForwardError", "OpaqueNodeCost", "VerifyReport", "tolerance_for", "verify_split"]

_TOLERANCES = {
    torch.float64: 1e-9,
    torch.float32: 1e-4,
    torch.bfloat16: 2e-2,
    torch.float16: 2e-2,
    torch.complex128: 1e-9,
    torch.complex64: 1e-4,
    torch.complex32: 2e-2,
}


class NondeterministicForwardError(GraphkitInputError):
    """Two forwards of the stage from the same inputs, parameters, buffers and seeded random state gave
    different outputs, so :func:`verify_split` cannot compare a split backward with a full one (each would
    differentiate another function). Raised instead of a report of wrong gradients."""


def tolerance_for(dtype: torch.dtype) -> float:
    """Relative tolerance used for gradients of ``dtype`` (see module docstring)."""
    return _TOLERANCES.get(dtype, 1e-4)


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
        return all(check.ok for check in [*self.inputs, *self.params])

    @property
    def failures(self) -> list[GradientCheck]:
        """The checks that are not ``ok``."""
        return [check for check in [*self.inputs, *self.params] if not check.ok]

    def verdict(self) -> str:
        """One sentence, the same in ``graphkit verify`` and ``graphkit inspect``: ``OK: all 17 gradients
        match (16 parameters, 1 input)`` or ``FAILED: 2 of 17 gradients differ (...)``."""
        total = len(self.inputs) + len(self.params)
        counts = f"{_count(len(self.params), 'parameter')}, {_count(len(self.inputs), 'input')}"
        if self.ok:
            return f"OK: all {total} gradients match ({counts})"
        return f"FAILED: {len(self.failures)} of {total} gradients differ ({counts})"

    @property
    def flops_partial(self) -> bool:
        """Whether the FLOP totals leave out nodes FlopCounterMode cannot count (``flops_coverage``)."""
        return bool(self.extra.get("flops_coverage", {}).get("partial"))

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
        rows = [("kind", "name", "status", "max_abs_error", "relative_error")]
        for kind, checks in (("input", self.inputs), ("param", self.params)):
            rows.extend(
                (kind, c.name, c.status, _number(c.max_abs_error), _number(c.relative_error)) for c in checks
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
        note = self.extra.get("flops_coverage", {}).get("note")
        if note:  # as graphkit inspect says it: "partial: 1 node(s) not counted (MatmulTanh)"
            lines.append(f"FLOPs {note}" if note.startswith("partial") else f"FLOPs: {note}")
        lines.extend(self._opaque_lines())
        nonfinite = self.extra.get("nonfinite")
        if nonfinite:
            listed = ", ".join(nonfinite[:4]) + (f" (+{len(nonfinite) - 4})" if len(nonfinite) > 4 else "")
            lines.append(
                f"NaN or inf in the full backward's gradients too (compared by place, the rest by value): {listed}"
            )
        lines.append(
            f"{self.verdict()} ({self.dtype}, {self.device}, rel tol {self.tolerance:g}, {self.groups} groups)"
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
                    f"<td style='color:{colour}'>{check.status}</td><td>{_number(check.max_abs_error)}</td>"
                    f"<td>{_number(check.relative_error)}</td></tr>"
                )
        verdict = "OK" if self.ok else "FAILED"
        flops = self.flops
        notes = "".join(f"<li>{html.escape(line.strip())}</li>" for line in self._opaque_lines())
        return (
            f"<p><b>{verdict}</b>: split backward vs full backward ({self.dtype}, {self.device}, relative "
            f"tolerance {self.tolerance:g}, {self.groups} groups). FLOPs full {flops['full']:,}, "
            f"B {flops['b']:,}, W {flops['w']:,}.</p>"
            "<table><thead><tr><th>kind</th><th>name</th><th>status</th><th>max abs error</th>"
            f"<th>relative error</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
            + (f"<ul>{notes}</ul>" if notes else "")
        )


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _ratio(numerator: int, denominator: int) -> str:
    return f"{numerator / denominator:.3f}" if denominator else "-"


@contextlib.contextmanager
def _borrowed(
    module: torch.nn.Module, dtype: torch.dtype | None, device: torch.device | None
) -> Iterator[tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]]:
    """The user's own module, moved and cast as asked, with everything restored on exit (errors too).

    Yields the buffers, to reset between the two forwards with :func:`_reset`, and each parameter with a
    copy of its values as moved and cast, to reset with :func:`_reset_changed` (a forward may change a
    parameter in place: ``nn.Embedding(max_norm=...)`` renormalizes rows). Restored: every parameter's
    data and ``.grad`` (the same Parameter objects, so hooks and pruning stay; values a forward changed in
    place put back), every buffer (the original tensors, with their values of before).
    """
    parameters = list(module.parameters())
    saved_parameters = [(parameter, parameter.data, parameter.grad) for parameter in parameters]
    saved_buffers = [
        (owner, name, buffer, buffer.detach().clone())
        for owner in module.modules()
        for name, buffer in owner.named_buffers(recurse=False)
    ]
    # the parameters the stage runs on without a copy (no move or cast needed): their own storage
    worked_in_place: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        values = []
        with torch.no_grad():
            for parameter, data, _ in saved_parameters:
                moved = data if device is None else data.to(device)
                working = moved if dtype is None else cast_floating(moved, dtype)
                parameter.data = working
                parameter.grad = None
                values.append((parameter, working.clone()))
                if working is data:
                    worked_in_place.append((data, values[-1][1]))
            for owner, name, buffer, _ in saved_buffers:
                moved = buffer if device is None else buffer.to(device)
                setattr(owner, name, moved if dtype is None else cast_floating(moved, dtype))
        yield [getattr(owner, name) for owner, name, _, _ in saved_buffers], values
    finally:
        with torch.no_grad():
            for parameter, data, grad in saved_parameters:
                parameter.data = data
                parameter.grad = grad
            for data, value in worked_in_place:
                if not torch.equal(data, value):
                    data.copy_(value)
            for owner, name, buffer, values_before in saved_buffers:
                buffer.copy_(values_before)
                setattr(owner, name, buffer)


def _snapshot(buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    return [buffer.detach().clone() for buffer in buffers]


def _reset(buffers: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    """Put the buffers back to ``values`` in place (a forward's update of running statistics undone)."""
    with torch.no_grad():
        for buffer, value in zip(buffers, values, strict=True):
            buffer.copy_(value)


def _reset_changed(parameters: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Put back the values of the parameters a forward changed in place (the others stay untouched)."""
    with torch.no_grad():
        for parameter, value in parameters:
            if not torch.equal(parameter, value):
                parameter.copy_(value)


def _reached_leaves(outputs: Any, stage_inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every leaf that requires grad and that the outputs' autograd graph reaches, but the stage inputs,
    in the order of a breadth-first walk from the outputs (each once)."""
    flat = flatten_tensors(outputs)
    roots = [_autograd.gradient_edge(tensor).node for _, tensor in flat if tensor.requires_grad]
    inputs = {id(tensor) for tensor in stage_inputs}
    leaves: list[torch.Tensor] = []
    seen: set[int] = set()
    queue: deque[Any] = deque(roots)
    visited: set[Any] = set()
    while queue:
        node = queue.popleft()
        if node is None or node in visited:
            continue
        visited.add(node)
        if _autograd.is_accumulate_grad(node):
            variable = node.variable
            if id(variable) not in inputs and id(variable) not in seen:
                seen.add(id(variable))
                leaves.append(variable)
            continue
        queue.extend(next_node for next_node, _ in node.next_functions)
    return leaves


def _leaf_names(module: torch.nn.Module, leaves: list[torch.Tensor]) -> list[str]:
    """A parameter's first name in ``module``; ``unregistered[i] (shape)`` for a leaf outside it."""
    names: dict[int, str] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), name)
    result = []
    unregistered = 0
    for leaf in leaves:
        name = names.get(id(leaf))
        if name is None:
            name = f"unregistered[{unregistered}] {tuple(leaf.shape)}"
            unregistered += 1
        result.append(name)
    return result


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
        module: the stage. Both runs use it in place (no copy); its parameters, their ``.grad`` and its
            buffers are restored afterwards, also when an error is raised.
        inputs: a tuple of positional arguments or a dict of keyword arguments (a single tensor works
            too); floating tensors with ``requires_grad=True`` are the stage inputs.
        dtype: cast parameters, buffers and floating inputs to this dtype, and complex ones to the
            complex dtype of its precision (default: leave as they are).
        device: run on this device (``"cpu"``, ``"cuda"``...; default: where the module is).
        seed: seeds the random cotangents and the random state of both forwards (dropout).
        autocast_dtype: run the forwards under ``torch.autocast`` to this dtype (e.g. ``torch.bfloat16``).
        recompute: passed to :func:`graphkit.split.backward_input` (when W recomputes non-reentrant
            activation checkpoints).

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is True when every gradient matches within the tolerance
        of the gradients' dtype (see module docstring). ``report.params`` has one check per leaf the
        outputs reach: registered parameters by name, other leaves as ``unregistered[i] (shape)``.

    Raises:
        graphkit.graph.tensors.GraphkitInputError: ``module`` is not a module, ``dtype`` or
            ``autocast_dtype`` not a ``torch.dtype``, the module's outputs have no autograd graph, or
            ``device`` is not a device name or a CUDA device this torch cannot use.
        NondeterministicForwardError: the two forwards gave different outputs although every random
            generator verify seeds was seeded alike (see the module docstring): nothing to compare.
        ValueError: ``recompute`` is not a :class:`~graphkit.split.checkpointing.Recompute` value.
    """
    if not isinstance(module, torch.nn.Module):
        raise GraphkitInputError(
            f"verify_split needs the stage as a torch.nn.Module, got {type(module).__name__}; wrap a function "
            "in a module whose forward calls it, with its parameters registered"
        )
    for name, value in (("dtype", dtype), ("autocast_dtype", autocast_dtype)):
        if value is not None and not isinstance(value, torch.dtype):
            raise GraphkitInputError(
                f"{name} must be a torch.dtype such as torch.float64, got {value!r} ({type(value).__name__})"
            )
    device = None if device is None else checked_device(device, GraphkitInputError)
    recompute = recompute_policy(recompute)
    with _borrowed(module, dtype, device) as (buffers, parameter_values):
        return _verify_in_place(
            module, buffers, parameter_values, inputs, dtype, device, seed, autocast_dtype, recompute
        )


def _verify_in_place(
    stage: torch.nn.Module,
    buffers: list[torch.Tensor],
    parameter_values: list[tuple[torch.Tensor, torch.Tensor]],
    inputs: Any,
    dtype: torch.dtype | None,
    device: torch.device | None,
    seed: int,
    autocast_dtype: torch.dtype | None,
    recompute: Recompute,
) -> VerifyReport:
    run_device = device or next((p.device for p in stage.parameters()), torch.device("cpu"))
    initial_buffers = _snapshot(buffers)

    cuda_devices = [run_device] if run_device.type == "cuda" else []

    def seeded_backward() -> contextlib.AbstractContextManager[None]:
        # the full backward and the split's B and W start from one random state, so a checkpointed
        # region that does not restore the forward's (preserve_rng_state=False) draws the same in both
        return _seeded_random_state(seed + 1, cuda_devices)

    def forward() -> tuple[Any, Any]:
        _reset(buffers, initial_buffers)  # a forward may update buffers: both start from the same ones
        _reset_changed(parameter_values)  # and parameters a forward changed in place
        prepared = fresh_inputs(inputs, dtype, device)
        with _seeded_random_state(seed, cuda_devices):  # torch, numpy and Python's random alike
            if autocast_dtype is not None:
                with torch.autocast(device_type=run_device.type, dtype=autocast_dtype):
                    outputs = call_stage(stage, prepared)
            else:
                outputs = call_stage(stage, prepared)
        return prepared, outputs

    prepared, outputs = forward()
    flat_outputs = flatten_tensors(outputs)
    # the module's parameters (reached or not), then any other leaf the outputs reach
    registered = [p for _, p in stage.named_parameters() if p.requires_grad]
    known = {id(p) for p in registered}
    reached = _reached_leaves(outputs, [tensor for _, tensor in stage_input_tensors(prepared)])
    leaves = registered + [leaf for leaf in reached if id(leaf) not in known]
    flat_outputs = flatten_tensors(outputs)
    # the module's parameters (reached or not), then any other leaf the outputs reach
    registered = [p for _, p in stage.named_parameters() if p.requires_grad]
    known = {id(p) for p in registered}
    reached = _reached_leaves(outputs, [tensor for _, tensor in stage_input_tensors(prepared)])
    outside = [leaf for leaf in reached if id(leaf) not in known]
    leaves = registered + outside
    names = _leaf_names(stage, leaves)
    saved_grads = [leaf.grad for leaf in leaves]  # of leaves outside the module; restored at the end
    # the leaves of the split run, in the order of ``leaves``: the same tensors, but for leaves the forward
    # makes anew each time (``h = x[:, None]; h.requires_grad = True``)
    split_leaves: list[torch.Tensor | None] = list(leaves)
    parameters = [(name, p) for name, p in stage.named_parameters() if p.requires_grad]
    dominant = _dominant_dtype(parameters) if parameters else _dominant_leaf_dtype(leaves)
    tolerance = tolerance_for(autocast_dtype or dtype or dominant)
    generator = torch.Generator().manual_seed(seed)
    cotangents = [_cotangent(tensor, generator) for _, tensor in flat_outputs]
    # what the second forward must give again (the outputs that receive a cotangent)
    reference_outputs = [
        (name, None if cotangent is None else tensor.detach().clone())
        for (name, tensor), cotangent in zip(flat_outputs, cotangents, strict=True)
    ]
    cotangent_structure = (
        cotangents[0] if isinstance(outputs, torch.Tensor) else unflatten_like(outputs, cotangents)
    )
    try:
        for leaf in leaves:
            leaf.grad = None
        full_graph = capture(outputs, inputs=prepared, details=False)
        opaque = opaque_nodes(full_graph)  # node ids are the same in every run of the stage
        # what FlopCounterMode's totals leave out, as graphkit inspect says it (these totals add no estimates)
        coverage = flop_coverage(full_graph)
        coverage = FlopCoverage([dataclasses.replace(item, estimated=None) for item in coverage.not_counted])
        full_watched = {node: full_graph.autograd_nodes[node] for node in opaque}
        flops = PhaseFlops()
        with flops.counting("full", full_watched), seeded_backward():
            reference_inputs = backward_full(outputs, cotangent_structure, prepared)
        reference_params = [None if leaf.grad is None else leaf.grad.detach().clone() for leaf in leaves]
        del outputs, full_graph, full_watched
        grads_in_b: list[str] = []

        def split_run(count_flops: bool) -> tuple[Any, Any, int]:
            for leaf in leaves:
                leaf.grad = None
            prepared, outputs = forward()
            _check_same_forward(reference_outputs, outputs, tolerance)
            made = [
                leaf
                for leaf in _reached_leaves(outputs, [t for _, t in stage_input_tensors(prepared)])
                if id(leaf) not in known
            ]
            split_leaves[:] = registered + _matching_leaves(outside, made)
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
            counting = flops.counting if count_flops else _not_counting
            with counting("b", watched), warnings.catch_warnings():
                # the report names the parameters a reentrant checkpoint serves in B (grads_in_b)
                warnings.filterwarnings("ignore", message=".*reentrant activation checkpoint")
                with seeded_backward():
                    state = backward_input(outputs, cotangent_structure, prepared, recompute=recompute)
                    # W goes on from the random state B left, as a full backward goes on after B's part
                    after_b = _random_states()
            grads_in_b[:] = [
                name
                for name, leaf in zip(names, split_leaves, strict=True)
                if leaf is not None and leaf.grad is not None
            ]
            regions = state.checkpoint_regions
            del outputs
            with counting("w", watched), seeded_backward():
                _set_random_states(after_b)
                backward_weight(state)
            del watched
            if regions is not None:
                extra["recomputations"] = dict(regions.recomputations)
                extra["recompute"] = str(Recompute(recompute))
            return prepared, state, groups

        extra: dict[str, Any] = {"flops_coverage": coverage.to_dict(), "flops_partial": coverage.partial}
        try:
            prepared, state, groups = split_run(count_flops=True)
        except RuntimeError as error:
            # Counting FLOPs runs a dispatch mode over every op, which some ops or PyTorch releases may
            # refuse. Verify the gradients without it, and say the FLOPs are missing.
            flops.forget("b", "w")
            prepared, state, groups = split_run(count_flops=False)
            reason = str(error).splitlines()[0][:160]
            extra["flops_note"] = (
                f"B and W FLOPs not counted: FlopCounterMode failed with this model ({reason})"
            )
        split_params = [
            None if leaf is None or leaf.grad is None else leaf.grad.detach().clone() for leaf in split_leaves
        ]
    finally:
        for leaf, grad in zip(leaves, saved_grads, strict=True):
            leaf.grad = grad

    parameters = [(name, p) for name, p in stage.named_parameters() if p.requires_grad]
    dominant = _dominant_dtype(parameters) if parameters else _dominant_leaf_dtype(leaves)
    tolerance = tolerance_for(autocast_dtype or dtype or dominant)
    input_names = [name for name, tensor in stage_input_tensors(prepared)]
    input_names = [name for name, tensor in stage_input_tensors(prepared)]
    input_checks = [
        compare_gradients(name, reference, split, tolerance)
        for name, reference, split, (_, tensor) in zip(
            input_names, reference_inputs, state.input_grads, stage_input_tensors(prepared), strict=True
        )
        if tensor.requires_grad
    ]
    param_checks = [
        compare_gradients(name, reference, split, tolerance)
        for name, reference, split in zip(names, reference_params, split_params, strict=True)
    ]
    references = [
        reference
        for reference, (_, tensor) in zip(reference_inputs, stage_input_tensors(prepared), strict=True)
        if tensor.requires_grad
    ] + reference_params
    nonfinite = [
        check.name
        for check, reference in zip([*input_checks, *param_checks], references, strict=True)
        if reference is not None and not bool(torch.isfinite(reference).all())
    ]
    if nonfinite:  # the model's own NaN or inf, which the split gives at the same places (else "wrong")
        extra["nonfinite"] = nonfinite
    return VerifyReport(
        inputs=input_checks,
        params=param_checks,
        flops=flops.backward(),
        groups=groups,
        dtype=str(autocast_dtype or dtype or dominant).removeprefix("torch."),
        device=str(run_device),
        tolerance=tolerance,
        extra=extra,
        opaque=[
            OpaqueNodeCost(entry.node, entry.op, str(entry.kind), entry.meaning, flops.of_node(node))
            for node, entry in opaque.items()
            if flops.b != NOT_COUNTED
        ],
        grads_in_b=grads_in_b,
    )


def _check_same_forward(
    reference: list[tuple[str, torch.Tensor | None]], outputs: Any, tolerance: float
) -> None:
    """Raise :class:`NondeterministicForwardError` when the split run's forward gave other outputs than the
    reference run's (``reference``: their values, None for an output without cotangent)."""
    flat = flatten_tensors(outputs)
    if [name for name, _ in flat] != [name for name, _ in reference]:
        difference = f"outputs {[name for name, _ in reference]} first, {[name for name, _ in flat]} then"
    else:
        checks = [
            compare_gradients(name, value, tensor, tolerance)
            for (name, value), (_, tensor) in zip(reference, flat, strict=True)
            if value is not None
        ]
        wrong = next((check for check in checks if check.status != "ok"), None)
        if wrong is None:
            return
        difference = (
            f"output {wrong.name!r}: shapes differ"
            if wrong.max_abs_error is None
            else f"output {wrong.name!r}: max |difference| {wrong.max_abs_error:.3g}, "
            f"{wrong.relative_error:.3g} of its largest value"
        )
    raise NondeterministicForwardError(
        f"the stage gave different outputs in verify's two forwards, from the same inputs, parameters, buffers "
        f"and seeds ({difference}), so a split backward of one cannot be compared with a full backward of the "
        "other: the forward draws random numbers verify cannot seed (it seeds torch, numpy's global generator "
        "and Python's random alike before each forward) or depends on state that changes between calls. Make "
        "the forward repeatable for the check (module.eval(), a generator seeded inside the forward) and verify "
        "again"
    )


def _matching_leaves(reference: list[torch.Tensor], split: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """For each leaf outside the module that the reference run reached, the split run's leaf in its place.

    The same tensor where the split run reached it too (a leaf kept outside the module); else the split
    run's next leaf that the reference run did not reach, in the order of :func:`_reached_leaves` (a leaf the
    forward makes, a new tensor in each run at the same place of the graph); None when none is left.
    """
    reference_ids = {id(leaf) for leaf in reference}
    split_ids = {id(leaf) for leaf in split}
    made = iter([leaf for leaf in split if id(leaf) not in reference_ids])
    return [leaf if id(leaf) in split_ids else next(made, None) for leaf in reference]


@contextlib.contextmanager
def _seeded_random_state(seed: int, cuda_devices: list[torch.device]) -> Iterator[None]:
    """torch's generators (CPU and ``cuda_devices``), numpy's global one (when numpy imports) and Python's
    ``random`` seeded with ``seed`` for the block; their states before it are restored after it."""
    numpy_random = _numpy_random()
    python_state = random.getstate()
    numpy_state = numpy_random.get_state() if numpy_random is not None else None
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        random.seed(seed)
        if numpy_random is not None:
            numpy_random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy_random is not None:
                numpy_random.set_state(numpy_state)


def _random_states() -> tuple[torch.Tensor, Any, Any]:
    """The states of torch's CPU generator, numpy's global one (None without numpy) and Python's random."""
    numpy_random = _numpy_random()
    return (
        torch.get_rng_state(),
        numpy_random.get_state() if numpy_random is not None else None,
        random.getstate(),
    )


def _set_random_states(states: tuple[torch.Tensor, Any, Any]) -> None:
    """Put back what :func:`_random_states` read."""
    torch_state, numpy_state, python_state = states
    torch.set_rng_state(torch_state)
    numpy_random = _numpy_random()
    if numpy_random is not None and numpy_state is not None:
        numpy_random.set_state(numpy_state)
    random.setstate(python_state)


def _numpy_random() -> Any:
    """``numpy.random``, or None when numpy is not installed (torch does not need it)."""
    try:
        import numpy.random
    except ImportError:
        return None
    return numpy.random


def _cotangent(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor | None:
    """A seeded random cotangent for a floating or complex output that requires grad, else None."""
    if not tensor.requires_grad or not (tensor.is_floating_point() or tensor.is_complex()):
        return None
    dtype = torch.complex128 if tensor.is_complex() else torch.float64
    return torch.randn(tensor.shape, generator=generator, dtype=dtype).to(tensor.dtype).to(tensor.device)


def _dominant_leaf_dtype(leaves: list[torch.Tensor]) -> torch.dtype:
    return leaves[0].dtype if leaves else torch.get_default_dtype()


def _not_counting(phase: str, nodes: Mapping[str, Any]) -> contextlib.nullcontext[None]:
    """Stands in for :meth:`PhaseFlops.counting` in a run that counts nothing."""
    return contextlib.nullcontext()


def _dominant_dtype(parameters: list[tuple[str, torch.nn.Parameter]]) -> torch.dtype:
    return parameters[0][1].dtype if parameters else torch.get_default_dtype()
