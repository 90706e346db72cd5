"""Which schedule to run: every schedule simulated from measured costs, ranked, and (optionally) run for real.

:func:`plan_schedules` takes a pipeline spec (its costs measured with :func:`graphkit.measure.costs.spec_costs`)
or a costs JSON as ``graphkit costs --json`` writes it (measured elsewhere, e.g. on a GPU machine), and
simulates (:func:`~graphkit.pipelining.planning.simulate`) on ``ranks`` ranks with ``microbatches``
microbatches:

- every built-in ``torch.distributed.pipelining`` schedule that fits the ranks (``GPipe``, ``1F1B``: one stage
  per rank; ``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``:
  two), their orders read by :func:`graphkit.pipelining.schedules.schedule_order`;
- graphkit's generated ones, one stage per rank: ``ZBH1``, ``ZBH2`` and the adaptive schedule built from these
  costs under the memory limit (written as a CSV and run as ``csv:PATH``).

The result (:class:`SchedulePlan`) ranks them by predicted step (schedules over ``memory_limit`` last), with
the ratio to 1F1B, the bubble, the peak activation memory per rank and the messages per step; it prints as
a table, shows itself as HTML in a notebook and gives JSON. With ``run=True`` it records 1F1B and the
``top`` best schedules for real (:func:`graphkit.pipelining.recording.record_schedules`) and adds the
measured step and a second prediction fed the recorded per-action durations (which isolates what the
runtime adds between actions). :meth:`SchedulePlan.what_if` simulates the same per-stage costs on more ranks
and microbatches.

What the model assumes (:mod:`graphkit.pipelining.planning.simulator`): each rank runs its actions in order;
an action starts when its rank is free and its inputs have arrived; a message costs
``latency + bytes / bandwidth`` (:class:`CommModel`, :data:`DEFAULT_COMM`) and overlaps compute; the runtime
spends ``overhead`` seconds on each rank after every compute action (:data:`DEFAULT_OVERHEAD`, issuing the
sends and receives of the action and its own bookkeeping). Costs are per stage: with the pipeline measured at
``2 x ranks`` stages (what the two-stage-per-rank schedules run), a one-stage-per-rank schedule's stage is two
consecutive measured stages (seconds and bytes added). A full backward B costs I + W (graphkit's stage runs
B as one autograd pass, a little cheaper on some models). Recompute in W (activation checkpointing with
``recompute="in-w"``) is each stage's ``recompute`` seconds, added to every W.
"""

from __future__ import annotations

import html
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from graphkit.measure.costs import spec_costs
from graphkit.models.specs import SpecError
from graphkit.pipelining.launcher import LaunchError, usable_cores
from graphkit.pipelining.planning.actions import Action, ScheduleError, write_schedule_csv
from graphkit.pipelining.planning.adaptive import adaptive_schedule
from graphkit.pipelining.planning.cost_model import CommModel, StageCost
from graphkit.pipelining.planning.generation import zb_h1, zb_h2
from graphkit.pipelining.planning.simulator import Simulation, recorded_durations, simulate
from graphkit.pipelining.recording import record_schedules
from graphkit.pipelining.schedules import GENERATED_SCHEDULES, is_single_stage, schedule_name, schedule_order

__all__ = [
    "BUILT_IN_SCHEDULES",
    "DEFAULT_COMM",
    "DEFAULT_OVERHEAD",
    "PlannedSchedule",
    "RuntimeCalibration",
    "SchedulePlan",
    "calibrate_runtime",
    "costs_from_json",
    "costs_from_recorded",
    "first_stage_as_run",
    "measure_runtime",
    "merge_stage_costs",
    "plan_schedules",
    "predict_recorded",
    "runtime_overhead",
    "slowed",
]

BUILT_IN_SCHEDULES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
"""PyTorch's schedules the planner simulates (one stage per rank for the first two, two for the others)."""

DEFAULT_COMM = CommModel(latency=100e-6, bandwidth=1.0e9, rendezvous=True)
"""A documented default for messages between two gloo ranks on 127.0.0.1 (CPU): 100 microseconds and 1 GB/s,
paid when the receiver reaches the action that needs the message (rendezvous: gloo sends once the
receive is posted, and the runtime posts it just before that action). ``plan --run`` replaces it with a
latency measured on the recorded schedules (:func:`calibrate_runtime`). Pass your own :class:`CommModel` for
another link (NCCL over NVLink: ~10 us, ~100 GB/s)."""

DEFAULT_OVERHEAD = 1.0e-3
"""Seconds ``torch.distributed.pipelining``'s runtime adds on a rank to each compute action, with gloo on the
CPU: the gap after it (issuing the action's sends, posting the next one's receives, the runtime's Python)
and what running inside the runtime adds to the pass itself. Measured by ``plan --run``
(:func:`runtime_overhead`) on a 2-core machine at load average 1: 0.44 to 0.68 ms between actions and
0.55 to 0.85 ms inside each, for ``hf:gpt2?n_layer=4`` and ``zoo-pipeline:mlp_wide`` on 2 ranks; give
``--overhead`` the value measured on yours (GPUs with NCCL: tens of microseconds)."""


@dataclass(slots=True)
class PlannedSchedule:
    """One schedule as the planner saw it.

    Attributes:
        name: what to run it by (``1F1B``, ``ZBH1``, ``Adaptive``: graphkit's runs ``csv`` below).
        stages_per_rank: 1 or 2. simulation: the prediction from the costs.
        fits_memory: whether its peak activation memory stays within the memory limit on every rank.
        csv: the file holding its order (generated schedules; every schedule once written with ``output``).
        measured_seconds: the recorded step (with ``run``), its slowest rank; None if not run.
        recorded_prediction_seconds: the step simulated from the recorded per-action durations; None if not run.
        error: why it could not be simulated (then ``simulation`` is None).
    """

    name: str
    stages_per_rank: int
    simulation: Simulation | None
    fits_memory: bool = True
    csv: str | None = None
    measured_seconds: float | None = None
    recorded_prediction_seconds: float | None = None
    error: str | None = None
    order: dict[int, list[str]] = field(default_factory=dict, repr=False)

    @property
    def predicted_seconds(self) -> float:
        return self.simulation.step_seconds if self.simulation is not None else math.inf

    @property
    def run_name(self) -> str:
        """The name ``record_schedules`` and ``verify-pipeline`` take: ``csv:PATH`` for a cost-built order."""
        return f"csv:{self.csv}" if self.name == "Adaptive" and self.csv else self.name


@dataclass(slots=True)
class SchedulePlan:
    """The planner's answer: every schedule ranked, best first (see :func:`plan_schedules`).

    ``timelines`` (with ``run``): for each recorded schedule, its predicted step
    (:meth:`Simulation.to_schedule_timeline`) then its recorded one, for ``graphkit.drawing.timeline``.
    """

    spec: str | None
    ranks: int
    microbatches: int
    costs: list[StageCost]
    comm: CommModel
    overhead: float
    memory_limit: float | None
    schedules: list[PlannedSchedule]
    load: str = ""
    stage_costs: list[StageCost] | None = field(default=None, repr=False)
    measured_costs: list[StageCost] | None = field(default=None, repr=False)
    timelines: list[Any] = field(default_factory=list, repr=False)
    measured_overhead: dict[str, Any] | None = None
    overhead_source: str = "given"
    # with run: how the steps were recorded (steps per schedule, threads per rank, ranks pinned to cores)
    recording: dict[str, Any] | None = None

    def by_name(self, name: str) -> PlannedSchedule:
        for item in self.schedules:
            if item.name.lower() == name.lower():
                return item
        raise KeyError(name)

    @property
    def baseline(self) -> PlannedSchedule:
        return self.by_name("1F1B")

    @property
    def best(self) -> PlannedSchedule:
        """The schedule with the shortest predicted step within the memory limit."""
        return self.schedules[0]

    @property
    def measured_best(self) -> PlannedSchedule | None:
        """The schedule with the shortest recorded step (with ``run``), else None."""
        measured = [item for item in self.schedules if item.measured_seconds is not None]
        return min(measured, key=lambda item: item.measured_seconds or math.inf, default=None)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per schedule (JSON-ready): name, predicted and measured step, bubble, peak memory, ..."""
        base = self.baseline.predicted_seconds
        measured_base = self.baseline.measured_seconds
        rows = []
        for item in self.schedules:
            simulation = item.simulation
            row: dict[str, Any] = {
                "schedule": item.name,
                "run_as": item.run_name,
                "stages_per_rank": item.stages_per_rank,
                "predicted_step_seconds": item.predicted_seconds if simulation is not None else None,
                "predicted_vs_1f1b": item.predicted_seconds / base
                if simulation is not None and base
                else None,
                "bubble_fraction": simulation.bubble_fraction if simulation is not None else None,
                "peak_memory_bytes": list(simulation.peak_memory_bytes) if simulation is not None else None,
                "messages_per_step": simulation.messages if simulation is not None else None,
                "fits_memory": item.fits_memory,
                "csv": item.csv,
                "measured_step_seconds": item.measured_seconds,
                "measured_vs_1f1b": (
                    item.measured_seconds / measured_base
                    if item.measured_seconds is not None and measured_base
                    else None
                ),
                "predicted_from_recorded_seconds": item.recorded_prediction_seconds,
                "error": item.error,
            }
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "ranks": self.ranks,
            "microbatches": self.microbatches,
            "memory_limit": self.memory_limit,
            "comm": {
                "latency": self.comm.latency,
                "bandwidth": self.comm.bandwidth,
                "rendezvous": self.comm.rendezvous,
                "send_seconds": self.comm.send_seconds,
            },
            "overhead_seconds": self.overhead,
            "overhead_source": self.overhead_source,
            "best": self.best.run_name,
            "load": self.load,
            "measured_overhead": self.measured_overhead,
            "recording": self.recording,
            "costs": [asdict(cost) for cost in self.measured_costs or self.costs],
            "stage_costs": None if self.stage_costs is None else [asdict(cost) for cost in self.stage_costs],
            "schedules": self.rows(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=_json_number)

    def _cells(self) -> tuple[list[str], list[list[str]]]:
        measured = any(item.measured_seconds is not None for item in self.schedules)
        header = ["#", "schedule", "st/rank", "predicted ms", "vs 1F1B", "bubble", "peak MB/rank", "msgs"]
        if measured:
            header += ["measured ms", "vs 1F1B", "pred/meas", "from rec. ms", "rec/meas"]
        body = []
        for position, row in enumerate(self.rows(), 1):
            if row["error"] is not None:
                body.append([str(position), row["schedule"], str(row["stages_per_rank"]), row["error"]])
                continue
            peaks = "/".join(f"{value / 1e6:.1f}" for value in row["peak_memory_bytes"])
            cells = [
                str(position),
                row["schedule"] + ("" if row["fits_memory"] else " (over memory)"),
                str(row["stages_per_rank"]),
                f"{row['predicted_step_seconds'] * 1e3:.2f}",
                _ratio(row["predicted_vs_1f1b"]),
                f"{row['bubble_fraction']:.1%}",
                peaks,
                str(row["messages_per_step"]),
            ]
            if measured:
                m = row["measured_step_seconds"]
                r = row["predicted_from_recorded_seconds"]
                cells += [
                    f"{m * 1e3:.2f}" if m is not None else "-",
                    _ratio(row["measured_vs_1f1b"]),
                    _ratio(row["predicted_step_seconds"] / m) if m else "-",
                    f"{r * 1e3:.2f}" if r is not None else "-",
                    _ratio(r / m) if r is not None and m else "-",
                ]
            body.append(cells)
        return header, body

    def table(self) -> str:
        """The ranked table as plain text, under a line saying what was planned and with which model."""
        header, body = self._cells()
        widths = [max(len(row[i]) for row in [header, *body] if i < len(row)) for i in range(len(header))]
        lines = [self._title()]
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(header, widths, strict=True)))
        for row in body:
            if len(row) < len(header):
                lines.append("  ".join(row))
                continue
            lines.append("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
        lines.append(self._verdict())
        return "\n".join(lines)

    def _title(self) -> str:
        limit = f", memory limit {self.memory_limit:,.0f} B" if self.memory_limit is not None else ""
        head = f"{self.spec or 'costs'}: {self.ranks} ranks, {self.microbatches} microbatches{limit}; model"
        if self.overhead_source.startswith("calibrated"):
            return f"{head} {self.overhead_source}"
        return (
            f"{head}: messages {self.comm.latency * 1e6:.0f} us"
            + (
                f" + bytes / {self.comm.bandwidth / 1e9:.2g} GB/s"
                if math.isfinite(self.comm.bandwidth)
                else " each"
            )
            + (" when received" if self.comm.rendezvous else "")
            + f", runtime {self.overhead * 1e6:.0f} us per action ({self.overhead_source})"
        )

    def _verdict(self) -> str:
        best, base = self.best, self.baseline
        text = (
            f"best predicted: {best.name} ({best.predicted_seconds * 1e3:.2f} ms, "
            f"{_ratio(best.predicted_seconds / base.predicted_seconds)} of 1F1B)"
        )
        winner = self.measured_best
        if winner is not None and base.measured_seconds:
            text += (
                f"; best measured: {winner.name} ({winner.measured_seconds * 1e3:.2f} ms, "
                f"{_ratio((winner.measured_seconds or 0) / base.measured_seconds)} of 1F1B)"
            )
        measured = self.measured_overhead
        if measured and measured.get("between") is not None:
            inside = measured.get("inside")
            text += (
                f"\nruntime gaps recorded: median {measured['between'] * 1e6:.0f} us between actions "
                f"({measured['gaps']} gaps with nothing to wait for)"
                + (
                    f", median {inside * 1e6:+.0f} us inside each action against graphkit costs"
                    if inside is not None
                    else ""
                )
                + f"; modelled (means, see the title): {self.overhead * 1e6:.0f} us per action"
            )
        if self.load:
            text += f"\nload while measuring: {self.load}"
        return text

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        header, body = self._cells()
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
        rows = []
        for row in body:
            if len(row) < len(header):
                cells = "".join(f"<td>{html.escape(cell)}</td>" for cell in row[:3])
                cells += f'<td colspan="{len(header) - 3}">{html.escape(row[3])}</td>'
            else:
                cells = "".join(f"<td>{html.escape(cell)}</td>" for cell in row)
            rows.append(f"<tr>{cells}</tr>")
        return (
            f"<div><p>{html.escape(self._title())}</p><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table><p>{html.escape(self._verdict())}</p></div>"
        )

    def what_if(
        self,
        ranks: Sequence[int] = (8, 16, 32, 64),
        microbatches: Sequence[int] | None = None,
        schedules: Sequence[str] = ("1F1B", "Interleaved1F1B", "ZBVZeroBubble", "ZBH1", "ZBH2", "Adaptive"),
    ) -> list[dict[str, Any]]:
        """The same per-stage costs on more ranks: each one-stage-per-rank stage costs this plan's mean stage,
        each stage of a two-stage-per-rank schedule half of it. ``microbatches``: per rank count, the counts
        to try (default: this plan's and ``4 x ranks``). One dict per (ranks, microbatches, schedule):
        predicted step, ratio to 1F1B, bubble, peak memory of rank 0."""
        mean = _mean_cost(self.measured_costs or self.costs)
        half = _scaled(mean, 0.5)
        results = []
        for p in ranks:
            counts = list(microbatches) if microbatches is not None else sorted({self.microbatches, 4 * p})
            for m in counts:
                baseline = None
                for name in schedules:
                    try:
                        item = _simulate_named(
                            name, p, m, mean, half, self.comm, self.overhead, self.memory_limit
                        )
                    except (ScheduleError, ValueError) as error:
                        results.append({"ranks": p, "microbatches": m, "schedule": name, "error": str(error)})
                        continue
                    simulation = item.simulation
                    assert simulation is not None
                    if name == "1F1B":
                        baseline = simulation.step_seconds
                    results.append(
                        {
                            "ranks": p,
                            "microbatches": m,
                            "schedule": name,
                            "predicted_step_seconds": simulation.step_seconds,
                            "predicted_vs_1f1b": simulation.step_seconds / baseline if baseline else None,
                            "bubble_fraction": simulation.bubble_fraction,
                            "peak_memory_bytes_rank0": simulation.peak_memory_bytes[0],
                        }
                    )
        return results


def what_if_table(rows: list[dict[str, Any]]) -> str:
    """:meth:`SchedulePlan.what_if`'s rows as plain text."""
    lines = [
        f"{'ranks':>5}  {'mb':>4}  {'schedule':<22}  {'step ms':>10}  {'vs 1F1B':>7}  {'bubble':>6}  {'rank-0 MB':>9}"
    ]
    for row in rows:
        if "error" in row:
            lines.append(
                f"{row['ranks']:>5}  {row['microbatches']:>4}  {row['schedule']:<22}  {row['error']}"
            )
            continue
        lines.append(
            f"{row['ranks']:>5}  {row['microbatches']:>4}  {row['schedule']:<22}  "
            f"{row['predicted_step_seconds'] * 1e3:>10.2f}  {_ratio(row['predicted_vs_1f1b']):>7}  "
            f"{row['bubble_fraction']:>6.1%}  {row['peak_memory_bytes_rank0'] / 1e6:>9.1f}"
        )
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON")


# --- costs ---------------------------------------------------------------------------------------------------
def costs_from_json(data: dict[str, Any] | str | os.PathLike[str]) -> list[StageCost]:
    """Per-stage costs from what ``graphkit costs --json`` writes (``PipelineCosts.to_dict()``), or its file.

    F, I (``backward_input``), W (``backward_weight``) seconds; ``activation_bytes``; ``b_keeps_bytes`` as
    what I keeps for W; ``input_grad_bytes``; the bytes stage ``s`` sends forward are the input gradients of
    stage ``s + 1`` (same tensors' shapes); ``full_backward_seconds`` (a full backward, 1F1B's B) where
    measured, else B costs I + W. An optional ``recompute_seconds`` per stage is added to its W.

    Raises:
        ValueError: no ``stages`` list; OSError: the file cannot be read.
    """
    if not isinstance(data, dict):
        data = json.loads(Path(data).read_text())
    stages = data.get("stages")
    if not stages:
        raise ValueError("a costs JSON needs a 'stages' list, as `graphkit costs --json` writes it")
    result = []
    for index, stage in enumerate(stages):
        following = stages[index + 1] if index + 1 < len(stages) else None
        result.append(
            StageCost(
                forward=float(stage["forward"]["seconds"]),
                backward_input=float(stage["backward_input"]["seconds"]),
                backward_weight=float(stage["backward_weight"]["seconds"]),
                full_backward=(
                    float(stage["full_backward_seconds"])
                    if stage.get("full_backward_seconds") is not None
                    else None
                ),
                activation_bytes=int(stage.get("activation_bytes", 0)),
                weight_bytes=int(stage.get("b_keeps_bytes", 0)),
                recompute=float(stage.get("recompute_seconds", 0.0)),
                output_bytes=int(following.get("input_grad_bytes", 0)) if following else 0,
                input_grad_bytes=int(stage.get("input_grad_bytes", 0)) if index > 0 else 0,
            )
        )
    return result


def merge_stage_costs(costs: Sequence[StageCost], stages: int) -> list[StageCost]:
    """``costs`` of consecutive stages added into ``stages`` stages (seconds and kept bytes added; the
    bytes sent are the last one's forward and the first one's backward).

    Raises:
        ValueError: ``stages`` does not divide the number of costs.
    """
    if stages < 1 or len(costs) % stages:
        raise ValueError(f"{len(costs)} measured stages do not merge into {stages}")
    size = len(costs) // stages
    merged = []
    for index in range(stages):
        group = costs[index * size : (index + 1) * size]
        full = [item.full_backward for item in group]
        merged.append(
            StageCost(
                forward=sum(item.forward for item in group),
                backward_input=sum(item.backward_input for item in group),
                backward_weight=sum(item.backward_weight for item in group),
                full_backward=None if None in full else sum(full),  # type: ignore[arg-type]
                activation_bytes=sum(item.activation_bytes for item in group),
                weight_bytes=sum(item.weight_bytes for item in group),
                recompute=sum(item.recompute for item in group),
                output_bytes=group[-1].output_bytes,
                input_grad_bytes=group[0].input_grad_bytes,
            )
        )
    return merged


def first_stage_as_run(costs: Sequence[StageCost]) -> list[StageCost]:
    """The costs as PyTorch's runtime spends them: the first stage has no input gradient to compute, so its
    I does nothing and its W is a full backward (``torch.distributed.pipelining`` runs W on stage 0 as a
    full backward, and so does graphkit's stage). The other stages are unchanged."""
    if not costs:
        return []
    first = costs[0]
    full = (
        first.full_backward
        if first.full_backward is not None
        else first.backward_input + first.backward_weight
    )
    return [replace(first, backward_input=_NOTHING, backward_weight=full, full_backward=full), *costs[1:]]


_NOTHING = 1e-6  # seconds of an I with nothing to compute (the adaptive scheduler needs I to take time)


def _mean_cost(costs: Sequence[StageCost]) -> StageCost:
    n = len(costs)
    return StageCost(
        forward=sum(c.forward for c in costs) / n,
        backward_input=sum(c.backward_input for c in costs) / n,
        backward_weight=sum(c.backward_weight for c in costs) / n,
        activation_bytes=sum(c.activation_bytes for c in costs) // n,
        weight_bytes=sum(c.weight_bytes for c in costs) // n,
        recompute=sum(c.recompute for c in costs) / n,
        full_backward=(
            None
            if any(c.full_backward is None for c in costs)
            else sum(c.full_backward or 0.0 for c in costs) / n
        ),
        output_bytes=max(c.output_bytes for c in costs),
        input_grad_bytes=max(c.input_grad_bytes for c in costs),
    )


def _scaled(cost: StageCost, factor: float) -> StageCost:
    return replace(
        cost,
        forward=cost.forward * factor,
        backward_input=cost.backward_input * factor,
        backward_weight=cost.backward_weight * factor,
        recompute=cost.recompute * factor,
        full_backward=cost.full_backward * factor if cost.full_backward is not None else None,
        activation_bytes=int(cost.activation_bytes * factor),
        weight_bytes=int(cost.weight_bytes * factor),
    )


# --- simulating every schedule ------------------------------------------------------------------------------
def _simulate_named(
    name: str,
    ranks: int,
    microbatches: int,
    one: StageCost | Sequence[StageCost],
    two: StageCost | Sequence[StageCost],
    comm: CommModel,
    overhead: float,
    memory_limit: float | None,
) -> PlannedSchedule:
    """Simulate schedule ``name``: ``one`` are the costs of one stage per rank, ``two`` of two."""

    if name == "Adaptive":
        order = {
            rank: [str(action) for action in row]
            for rank, row in adaptive_schedule(one, ranks, microbatches, memory_limit, comm).items()
        }
    elif name == "ZBH1":
        order = {rank: [str(a) for a in row] for rank, row in zb_h1(ranks, microbatches).items()}
    elif name == "ZBH2":
        order = {rank: [str(a) for a in row] for rank, row in zb_h2(ranks, microbatches).items()}
    else:
        order = schedule_order(name, ranks, microbatches)
    single = name in GENERATED_SCHEDULES or is_single_stage(name)
    simulation = simulate(
        order, one if single else two, comm, microbatches=microbatches, name=name, overhead=overhead
    )
    fits = memory_limit is None or max(simulation.peak_memory_bytes) <= memory_limit
    return PlannedSchedule(name, 1 if single else 2, simulation, fits, order=order)


def predict_recorded(
    timeline: Any,
    costs: StageCost | Sequence[StageCost] | None = None,
    *,
    comm: CommModel | None = None,
    overhead: float | None = None,
) -> Simulation:
    """The step :func:`simulate` predicts for a recorded step's own order, fed its recorded per-action
    durations: what the model explains of the recorded step once the actions' own times are known.

    ``overhead``: seconds the runtime adds after each action (a number); None (the default) takes them
    from the recording too: after each action, the gap before the rank's next action where that one had
    nothing to wait for (its inputs were computed before), else the rank's median such gap; the time
    before the rank's first action and after its last (splitting the batch, the last sends' waits) are
    added to them as well. What remains between predicted and recorded is then the waiting the model
    predicts from the data flow. ``costs``: only their bytes matter (message sizes, memory); default none.
    """
    order = {rank.rank: rank.compute_order() for rank in timeline.ranks}
    durations = recorded_durations(timeline)
    tails: dict[int, float] = {}
    if overhead is None:
        gaps = _free_gaps(timeline)
        for rank in timeline.ranks:
            actions = rank.compute_actions()
            if not actions:
                continue
            rank_gaps = gaps[rank.rank]
            typical = _median([gap for gap in rank_gaps if gap is not None]) or 0.0
            for position, item in enumerate(actions):
                label = Action(item.stage_index, item.kind, item.microbatch)
                after = rank_gaps[position] if position < len(rank_gaps) else None
                durations[label] += (
                    (after if after is not None else typical) if position < len(actions) - 1 else 0.0
                )
            if actions[0].stage_index == 0 and actions[0].kind == "F":  # the first rank starts the step
                first = Action(0, "F", actions[0].microbatch)
                durations[first] += actions[0].start
            tails[rank.rank] = max(rank.step_seconds - actions[-1].end, 0.0)
    simulation = simulate(
        order,
        costs if costs is not None else StageCost(0.0, 0.0, 0.0),
        comm,
        microbatches=timeline.microbatches,
        name=timeline.schedule,
        durations=durations,
        overhead=overhead or 0.0,
    )
    if tails:  # each rank's step ends its recorded tail after its last action
        simulation.step_seconds = max(
            simulation.rank_actions(rank)[-1].end + tail
            for rank, tail in tails.items()
            if simulation.rank_actions(rank)
        )
    return simulation


def _free_gaps(timeline: Any) -> dict[int, list[float | None]]:
    """Per rank, after each compute action but the last: the gap before the next one if the next had
    nothing to wait for (every input it needs ended before this one did), else None."""
    ends = _action_ends(timeline)
    last = timeline.num_stages - 1
    gaps: dict[int, list[float | None]] = {}
    for rank in timeline.ranks:
        actions = rank.compute_actions()
        found: list[float | None] = []
        for before, after in zip(actions, actions[1:], strict=False):
            free = all(ends.get(need, math.inf) <= before.end for need in _inputs_of(after, last))
            found.append(after.start - before.end if free else None)
        gaps[rank.rank] = found
    return gaps


def _action_ends(timeline: Any) -> dict[tuple[str, int, int], float]:
    """When each compute action of a recorded step ended, keyed ``(kind, stage, microbatch)``; an I or a
    B also as ``("G", stage, microbatch)``: the input gradient it sends."""
    ends: dict[tuple[str, int, int], float] = {}
    for rank in timeline.ranks:
        for item in rank.compute_actions():
            if item.kind in ("I", "B"):
                ends[("G", item.stage_index, item.microbatch)] = item.end
            ends[(item.kind, item.stage_index, item.microbatch)] = item.end
    return ends


def _inputs_of(item: Any, last: int) -> list[tuple[str, int, int]]:
    """What a compute action needs computed first, as :func:`_action_ends` keys them (``last``: the
    last stage's index): F the previous stage's F, W its own I, I or B its own F and the next stage's
    input gradient."""
    stage, mb = item.stage_index, item.microbatch
    if item.kind == "F":
        return [("F", stage - 1, mb)] if stage > 0 else []
    if item.kind == "W":
        return [("I", stage, mb)]
    return [("F", stage, mb)] + ([("G", stage + 1, mb)] if stage < last else [])


def measure_runtime(timelines: Any, comm: CommModel | None = None) -> tuple[float, CommModel]:
    """The runtime's overhead per action, per message sent and per message received, read off recorded steps.

    ``timelines``: one recorded step or several (their gaps are pooled). Only gaps where the rank waited
    for no computation count: the next action needs nothing its rank had not finished or that another
    rank had not computed before.

    - overhead: the mean gap after an action that sends nothing to another rank, before one that needs
      nothing from another rank (the runtime's own bookkeeping).
    - ``send_seconds``: the mean such gap after an action that sends to another rank, less the overhead.
    - latency: under a rendezvous link (:class:`CommModel` with ``rendezvous=True``, which gloo is), a
      message is paid from the later of its sender's end and its receiver's readiness (the previous
      action's end plus overhead and sends); the latency is the mean of what each action fed from another
      rank waited beyond that point (never below 0). It includes the message's size (a recorded step
      does not know its bytes), so the returned model's bandwidth is infinite: the messages between the
      stages of one pipeline have about the same size.

    Means, not medians: a step is their sum, and the occasional long gap (a garbage collection, the
    operating system's scheduling) is part of what the runtime costs. Steps without such gaps give
    :data:`DEFAULT_OVERHEAD`, and ``comm`` (default :data:`DEFAULT_COMM`) where no message is measured.
    """
    base = comm or DEFAULT_COMM
    steps = list(timelines) if isinstance(timelines, list | tuple) else [timelines]
    quiet: list[float] = []  # gaps after an action that sent nothing to another rank
    sending: list[float] = []  # gaps after one that did
    remote: list[tuple[float, bool, float, float]] = []  # (previous end, it sent, start, input computed)
    for timeline in steps:
        _runtime_gaps(timeline, quiet, sending, remote)
    if not quiet and not sending:
        return DEFAULT_OVERHEAD, base
    overhead = sum(quiet) / len(quiet) if quiet else 0.0
    send_seconds = max(sum(sending) / len(sending) - overhead, 0.0) if sending else 0.0
    if not remote:
        return overhead, replace(base, send_seconds=send_seconds)
    waits = [
        start - max(previous_end + overhead + (send_seconds if sent else 0.0), computed)
        for previous_end, sent, start, computed in remote
    ]
    latency = max(sum(waits) / len(waits), 0.0)
    return overhead, CommModel(latency, math.inf, rendezvous=True, send_seconds=send_seconds)


def _runtime_gaps(
    timeline: Any,
    quiet: list[float],
    sending: list[float],
    remote: list[tuple[float, bool, float, float]],
) -> None:
    """Add ``timeline``'s gaps to the lists of :func:`measure_runtime`."""
    ends = _action_ends(timeline)
    rank_of_stage = {
        item.stage_index: rank.rank for rank in timeline.ranks for item in rank.compute_actions()
    }
    last = timeline.num_stages - 1

    def sends_away(item: Any, rank: int) -> bool:
        if item.kind == "F":
            return item.stage_index < last and rank_of_stage.get(item.stage_index + 1, rank) != rank
        if item.kind in ("I", "B"):
            return item.stage_index > 0 and rank_of_stage.get(item.stage_index - 1, rank) != rank
        return False

    for rank in timeline.ranks:
        actions = rank.compute_actions()
        for before, after in zip(actions, actions[1:], strict=False):
            needs = _inputs_of(after, last)
            sent = sends_away(before, rank.rank)
            crossing = [need for need in needs if rank_of_stage.get(need[1], rank.rank) != rank.rank]
            if crossing:
                if crossing[0] in ends:
                    remote.append((before.end, sent, after.start, ends[crossing[0]]))
            elif all(ends.get(need, math.inf) <= before.end for need in needs):
                (sending if sent else quiet).append(after.start - before.end)


def costs_from_recorded(timelines: Sequence[Any], num_stages: int) -> list[StageCost] | None:
    """Per-stage costs read from recorded steps of ``num_stages`` stages: the median recorded seconds of
    each stage's F, I, W and B over every recorded step that ran that many stages (None if none did, or a
    stage lacks F or a backward). A B never recorded costs I + W, an I or W never recorded splits B
    evenly; bytes are not recorded (zero). Plan with them to ask what the machine's own action times say."""
    seconds: dict[tuple[int, str], list[float]] = {}
    for timeline in timelines:
        if timeline.num_stages != num_stages:
            continue
        for rank in timeline.ranks:
            for item in rank.compute_actions():
                seconds.setdefault((item.stage_index, item.kind), []).append(item.end - item.start)
    costs = []
    for stage in range(num_stages):
        f, i, w, b = (_median(seconds.get((stage, kind), [])) for kind in "FIWB")
        if f is None or (b is None and (i is None or w is None)):
            return None
        if i is None or w is None:
            i = w = (b or 0.0) / 2
        costs.append(StageCost(f, max(i, _NOTHING), w, full_backward=b if b is not None else i + w))
    return costs


def runtime_overhead(
    timelines: Sequence[Any], costs: Sequence[StageCost] | dict[int, Sequence[StageCost]] | None = None
) -> dict[str, float | int | None]:
    """What the runtime adds to each compute action, measured from recorded steps.

    - ``between``: the median gap on a rank between the end of one compute action and the start of the
      next, over the pairs where the next one's inputs had all been computed before the previous one ended
      (so the rank waited for nothing but the runtime: issuing the sends of the action before, the
      receives of the next, its own bookkeeping); ``gaps``: how many such pairs.
    - ``inside``: with ``costs`` (per stage; or ``{num_stages: costs}`` for timelines of several stage
      counts), the median of recorded action seconds minus the cost model's seconds for that action (what
      running inside the runtime adds to the computation itself, and what the machine's load does to it);
      ``actions``: how many were compared.

    The simulator's ``overhead`` is ``between + inside``: both happen once per action on its rank.
    """
    gaps: list[float] = []
    inside: list[float] = []
    for timeline in timelines:
        gaps += [gap for rank_gaps in _free_gaps(timeline).values() for gap in rank_gaps if gap is not None]
        per_stage = None
        if costs is not None:
            per_stage = costs.get(timeline.num_stages) if isinstance(costs, dict) else costs
            if per_stage is not None and len(per_stage) != timeline.num_stages:
                per_stage = None
        if per_stage is not None:
            for rank in timeline.ranks:
                for item in rank.compute_actions():
                    inside.append((item.end - item.start) - per_stage[item.stage_index].seconds(item.kind))
    return {
        "between": _median(gaps),
        "gaps": len(gaps),
        "inside": _median(inside),
        "actions": len(inside),
    }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def plan_schedules(
    pipeline: str | None = None,
    *,
    ranks: int,
    microbatches: int,
    costs: Any = None,
    memory_limit: float | None = None,
    comm: CommModel | None = None,
    overhead: float | None = None,
    batch_size: int | None = None,
    schedules: Sequence[str] | None = None,
    run: bool = False,
    steps: int = 3,
    top: int = 3,
    output: str | os.PathLike[str] | None = None,
    threads: int = 1,
    timeout_s: float = 600.0,
    repeat: int = 10,
    pin_cores: bool = False,
) -> SchedulePlan:
    """Simulate every schedule that fits ``ranks`` from measured costs and rank them; optionally run the best.

    Args:
        pipeline: a pipeline spec (``zoo-pipeline:mlp_wide``, ``hf:gpt2?n_layer=4``, ``path/file.py:fn``); its
            costs are measured at ``2 x ranks`` stages (at ``ranks`` where it cannot be cut so finely: then
            only the one-stage-per-rank schedules are planned) unless ``costs`` is given. Needed for ``run``.
        ranks, microbatches: the pipeline's ranks and microbatches per step.
        costs: a costs JSON (path or dict, ``graphkit costs --json``) or a sequence of
            :class:`StageCost`: ``ranks`` stages (then only one-stage-per-rank schedules are planned) or
            ``2 x ranks``.
        memory_limit: activation bytes each rank may hold; the adaptive schedule is built under it, and a
            schedule over it ranks last. None: no limit.
        comm: the message model (default :data:`DEFAULT_COMM`). overhead: seconds per action the runtime
            adds. With ``run`` and neither ``comm`` nor ``overhead`` given, the schedules to record are
            chosen with :data:`DEFAULT_COMM` and :data:`DEFAULT_OVERHEAD`, then every prediction is made
            again with the runtime calibrated on the recorded 1F1B step (:func:`calibrate_runtime`:
            overhead, message latency and the passes' slowdown beside the other ranks), the other
            schedules' from the costs and that calibration alone.
        batch_size: the whole batch of the pipeline spec (default: 8 rows per microbatch).
        schedules: the names to plan (default: :data:`BUILT_IN_SCHEDULES` and ``ZBH1``, ``ZBH2``, ``Adaptive``).
        run: record 1F1B and the ``top`` best predicted schedules for real, ``steps`` steps each, on ``ranks``
            gloo processes (one thread each), and add the measured steps.
        output: a folder for ``best.csv`` (the best schedule's order, for ``csv:PATH``), every generated
            schedule's CSV, ``plan.json`` and, with ``run``, ``recorded.json`` (the recorded steps).
        threads, timeout_s: of the recorded run. repeat: timed microbatches per pass when measuring costs.
        pin_cores: with ``run``, the recorded ranks each run on one CPU core (Linux; see
            :func:`~graphkit.pipelining.recording.record_schedules`): steadier measured steps on a CPU
            machine with a core per rank. The output's load line and ``plan.json`` (``recording``) say so.

    Returns:
        A :class:`SchedulePlan`, best first.

    Raises:
        ValueError: neither a pipeline nor costs, costs for a number of stages that does not fit,
            ``run`` without a pipeline spec, or ``pin_cores`` where the platform cannot pin (checked first).
        graphkit.pipelining.recording.TimelineError: with ``run``, a recorded rank failed or the run
            passed ``timeout_s``.
    """
    if pipeline is None and costs is None:
        raise ValueError("plan_schedules needs a pipeline spec or costs")
    if run and not isinstance(pipeline, str):
        raise ValueError("run=True records the schedules: give the pipeline as a spec string")
    if ranks < 1 or microbatches < 1:
        raise ValueError(f"ranks and microbatches must be at least 1, got {ranks} and {microbatches}")
    if run and pin_cores and ranks > 1:
        try:
            usable_cores()  # refused now, not after minutes of measuring costs
        except LaunchError as error:
            raise ValueError(str(error)) from None
    batch_size = batch_size if batch_size is not None else 8 * microbatches
    if costs is None:
        try:
            measured = spec_costs(
                pipeline,  # type: ignore[arg-type]
                pipeline=True,
                num_stages=2 * ranks,
                batch_size=batch_size,
                microbatches=microbatches,
                repeat=repeat,
            )
        except SpecError:  # a model too small for two stages per rank: the one-stage-per-rank schedules only
            measured = spec_costs(
                pipeline,  # type: ignore[arg-type]
                pipeline=True,
                num_stages=ranks,
                batch_size=batch_size,
                microbatches=microbatches,
                repeat=repeat,
            )
        per_stage = costs_from_json(measured.to_dict())
    elif isinstance(costs, str | os.PathLike | dict):
        per_stage = costs_from_json(costs)
    else:
        per_stage = list(costs)
    if len(per_stage) == 2 * ranks:
        one, two = merge_stage_costs(per_stage, ranks), list(per_stage)
    elif len(per_stage) == ranks:
        one, two = per_stage, None
    elif len(per_stage) % ranks == 0:
        one, two = merge_stage_costs(per_stage, ranks), None
        if len(per_stage) % (2 * ranks) == 0:
            two = merge_stage_costs(per_stage, 2 * ranks)
    else:
        raise ValueError(
            f"costs for {len(per_stage)} stages do not fit {ranks} ranks: give {ranks} or {2 * ranks} stages"
        )
    measured_one = list(one)
    one = first_stage_as_run(one)
    two = first_stage_as_run(two) if two is not None else None
    calibrate = run and overhead is None and comm is None
    overhead_source = "given" if overhead is not None else "default: gloo on the CPU"
    overhead = DEFAULT_OVERHEAD if overhead is None else overhead
    comm = comm or DEFAULT_COMM
    names = list(schedules) if schedules is not None else [*BUILT_IN_SCHEDULES, "ZBH1", "ZBH2", "Adaptive"]
    planned = []
    for name in names:
        try:
            canonical = schedule_name(name)
            if two is None and not (canonical in ("ZBH1", "ZBH2", "Adaptive") or is_single_stage(canonical)):
                raise ValueError(f"needs costs of {2 * ranks} stages")
            planned.append(
                _simulate_named(canonical, ranks, microbatches, one, two or one, comm, overhead, memory_limit)
            )
        except (ScheduleError, ValueError, RuntimeError, AssertionError) as error:
            planned.append(PlannedSchedule(name, 0, None, False, error=f"not planned: {error}"))
    planned.sort(key=lambda item: (not item.fits_memory, item.predicted_seconds))
    folder = Path(output) if output is not None else Path(tempfile.mkdtemp(prefix="graphkit-plan-"))
    folder.mkdir(parents=True, exist_ok=True)
    for item in planned:
        if item.simulation is not None and item.name in ("ZBH1", "ZBH2", "Adaptive"):
            path = folder / f"{item.name.lower()}.csv"
            write_schedule_csv(item.order, path)
            item.csv = str(path)
    plan = SchedulePlan(
        pipeline if isinstance(pipeline, str) else None,
        ranks,
        microbatches,
        one,
        comm,
        overhead,
        memory_limit,
        planned,
        stage_costs=two,
        measured_costs=measured_one,
        overhead_source=overhead_source,
    )
    if plan.best.simulation is not None:
        write_schedule_csv(plan.best.order, folder / "best.csv")
    if run:
        _run(
            plan,
            pipeline,  # type: ignore[arg-type]
            batch_size,
            steps,
            top,
            folder if output is not None else None,
            threads,
            timeout_s,
            pin_cores,
        )
        if calibrate:
            _calibrate(plan, two)
            if plan.best.simulation is not None:
                write_schedule_csv(plan.best.order, folder / "best.csv")
    if output is not None:
        (folder / "plan.json").write_text(plan.to_json())
    return plan


@dataclass(slots=True, frozen=True)
class RuntimeCalibration:
    """What running inside ``torch.distributed.pipelining`` on this machine adds to the measured costs.

    Attributes:
        overhead: seconds the runtime spends on a rank after each action (the simulator's ``overhead``).
        comm: the message model, rendezvous, with the fitted latency.
        slowdown: recorded action seconds over ``graphkit costs`` seconds (summed over the actions): what
            running beside the other ranks (sharing cores, caches and memory bandwidth) does to each pass.
        step_overhead: seconds of the step outside its first action's start and its last action's end
            (splitting the batch into microbatches, the last messages' waits), added to every prediction.
    """

    overhead: float
    comm: CommModel
    slowdown: float
    step_overhead: float = 0.0

    def describe(self) -> str:
        return (
            f"{self.overhead * 1e6:.0f} us per action, +{self.comm.send_seconds * 1e6:.0f} us per send, "
            f"messages {self.comm.latency * 1e6:.0f} us when received, passes x{self.slowdown:.2f}, "
            f"{self.step_overhead * 1e3:.2f} ms per step outside the actions"
        )


def calibrate_runtime(
    timelines: Any, costs: Sequence[StageCost] | dict[int, Sequence[StageCost]], comm: CommModel | None = None
) -> RuntimeCalibration:
    """Fit the runtime's overhead, message latency, slowdown and per-step overhead to recorded steps.

    ``timelines``: one recorded step or several; ``costs``: per stage as run (:func:`first_stage_as_run`),
    or ``{num_stages: costs}`` for steps of several stage counts. ``slowdown`` is the steps' recorded
    compute seconds over the seconds ``costs`` give the same actions (a ratio of sums, as a step is a sum;
    a faster run gives a factor below 1); overhead and latency come from :func:`measure_runtime`;
    ``step_overhead`` is the mean over the steps of what each spends outside its actions.

    Raises:
        ValueError: no costs for a step's number of stages, or a step without actions.
    """
    steps = list(timelines) if isinstance(timelines, list | tuple) else [timelines]
    by_count = costs if isinstance(costs, dict) else {len(costs): costs}
    recorded_seconds = modelled_seconds = 0.0
    outside: list[float] = []
    for timeline in steps:
        per_stage = by_count.get(timeline.num_stages)
        if per_stage is None or len(per_stage) != timeline.num_stages:
            raise ValueError(
                f"no costs for the {timeline.num_stages} stages of the recorded {timeline.schedule}"
            )
        actions = [item for rank in timeline.ranks for item in rank.compute_actions()]
        if not actions:
            raise ValueError(f"the recorded {timeline.schedule} has no compute actions")
        for item in actions:
            modelled = per_stage[item.stage_index].seconds(item.kind)
            if modelled > _NOTHING:
                recorded_seconds += item.end - item.start
                modelled_seconds += modelled
        span = max(item.end for item in actions) - min(item.start for item in actions)
        outside.append(max(timeline.step_seconds - span, 0.0))
    overhead, measured = measure_runtime(steps, comm)
    slowdown = recorded_seconds / modelled_seconds if modelled_seconds > 0 else 1.0
    return RuntimeCalibration(overhead, measured, slowdown, sum(outside) / len(outside))


def slowed(costs: Sequence[StageCost], factor: float) -> list[StageCost]:
    """``costs`` with every pass's seconds multiplied by ``factor`` (bytes unchanged)."""
    return [
        replace(
            cost,
            forward=cost.forward * factor,
            backward_input=cost.backward_input * factor,
            backward_weight=cost.backward_weight * factor,
            full_backward=None if cost.full_backward is None else cost.full_backward * factor,
            recompute=cost.recompute * factor,
        )
        for cost in costs
    ]


def _calibrate(plan: SchedulePlan, two: Sequence[StageCost] | None) -> None:
    """Re-predict every schedule of ``plan`` with the runtime calibrated on the other recorded steps.

    Leave one out: a schedule's overhead, message latency, slowdown and per-step overhead
    (:func:`calibrate_runtime`) come from the recorded steps of the other schedules with as many stages
    per rank (the runtime's work per action depends on the layout: on two stages per rank every action
    talks to the other rank), else from all the others - never from its own recording (only if it is
    the one schedule recorded). They were recorded in the same rounds, so the machine's drift touches
    them alike. Each schedule keeps the order it was recorded with."""
    recorded = {
        item.schedule.removesuffix(" recorded"): item
        for item in plan.timelines
        if item.schedule.endswith(" recorded")
    }
    if not recorded:
        return
    layout = {item.name: item.stages_per_rank for item in plan.schedules}
    by_count: dict[int, Sequence[StageCost]] = {plan.ranks: plan.costs}
    if two is not None:
        by_count[2 * plan.ranks] = two
    one = plan.costs
    for item in plan.schedules:
        if item.simulation is None:
            continue
        others = {name: step for name, step in recorded.items() if name != item.name}
        peers = [step for name, step in others.items() if layout.get(name) == item.stages_per_rank]
        peers = peers or list(others.values()) or [recorded[item.name]]
        calibration = calibrate_runtime(peers, by_count)
        costs = one if item.stages_per_rank == 1 else two or one
        item.simulation = simulate(
            item.order,
            slowed(costs, calibration.slowdown),
            calibration.comm,
            microbatches=plan.microbatches,
            name=item.name,
            overhead=calibration.overhead,
        )
        item.simulation.step_seconds += calibration.step_overhead
        item.fits_memory = (
            plan.memory_limit is None or max(item.simulation.peak_memory_bytes) <= plan.memory_limit
        )
    plan.schedules.sort(key=lambda item: (not item.fits_memory, item.predicted_seconds))
    pooled = calibrate_runtime(list(recorded.values()), by_count)
    plan.comm, plan.overhead = pooled.comm, pooled.overhead
    plan.overhead_source = (
        "calibrated on the recorded schedules (each predicted from the others), all of them: "
        + pooled.describe()
    )
    predicted = {item.name: item.simulation for item in plan.schedules if item.simulation is not None}
    for position, item in enumerate(plan.timelines):
        name = item.schedule.removesuffix(" predicted")
        if item.schedule.endswith(" predicted") and name in predicted:
            redrawn = predicted[name].to_schedule_timeline()
            redrawn.schedule = item.schedule
            plan.timelines[position] = redrawn


def _load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return ""
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


def _run(
    plan: SchedulePlan,
    pipeline: str,
    batch_size: int,
    steps: int,
    top: int,
    output: Path | None,
    threads: int,
    timeout_s: float,
    pin_cores: bool = False,
) -> None:
    """Record 1F1B and the ``top`` best predicted schedules; fill in measured and recorded-fed predictions."""

    # the top best besides 1F1B, which is always recorded (the baseline of every ratio)
    chosen = [item for item in plan.schedules if item.simulation is not None and item is not plan.baseline][
        :top
    ]
    chosen.append(plan.baseline)
    load_before = _load_average()
    timelines = record_schedules(
        pipeline,
        [item.run_name for item in chosen],
        microbatches=plan.microbatches,
        ranks=plan.ranks,
        threads=threads,
        timeout_s=timeout_s,
        steps=steps,
        batch_size=batch_size,
        pin_cores=pin_cores,
    )
    plan.load = f"{load_before} before, {_load_average()} after"
    plan.recording = {"steps": steps, "threads": threads, "pin_cores": pin_cores}
    if pin_cores:
        plan.load += "; each rank pinned to one core" + (
            " (ranks sharing cores: fewer cores than ranks)" if plan.ranks > len(usable_cores()) else ""
        )
    by_count: dict[int, Sequence[StageCost]] = {plan.ranks: plan.costs}
    if plan.stage_costs is not None:
        by_count[2 * plan.ranks] = plan.stage_costs
    plan.measured_overhead = runtime_overhead(timelines, by_count)
    for item, timeline in zip(chosen, timelines, strict=True):
        item.measured_seconds = timeline.step_seconds
        item.recorded_prediction_seconds = predict_recorded(timeline, comm=plan.comm).step_seconds
    for item, timeline in zip(chosen, timelines, strict=True):
        assert item.simulation is not None
        predicted = item.simulation.to_schedule_timeline()
        predicted.schedule = f"{item.name} predicted"
        timeline.schedule = f"{item.name} recorded"
        plan.timelines += [predicted, timeline]
    if output is not None:
        (output / "recorded.json").write_text(
            json.dumps([timeline.to_dict() for timeline in timelines], indent=1)
        )
