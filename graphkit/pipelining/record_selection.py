"""Which schedules ``graphkit plan --run`` records: those the prediction cannot tell apart, and what they need.

A prediction from measured costs is off by some fraction ``e`` of a step (``plan --run`` measures how much,
see :attr:`~graphkit.pipelining.schedule_plan.SchedulePlan.selection_error`). Two schedules whose predictions
are each off by up to ``e``, one too fast and the other too slow, swap order when they were predicted within
``(1 + e) / (1 - e)`` of each other (:func:`~graphkit.pipelining.remembered_error.recording_band`: 22% at
``e`` = 10%), so every schedule predicted within that of the best predicted one may be the fastest:
:func:`choose_recorded` records all of them, as long as a time budget allows, and says which it left out
and why. (A band of ``e`` alone assumed the best predicted schedule exact. Measured on GPT-2, 2 ranks, 4
microbatches: CostAware predicted 0.87x 1F1B and
measured 0.89x, ZBVZeroBubble predicted 0.98x and measured 0.87x, 13% above the best predicted and
outside a 10% band: left out, it was the fastest schedule of the run that checked the pick.) It always
records:

- 1F1B, the baseline of every ratio (and, with a control, a second copy of it: the run's noise floor);
- the best zero-bubble schedule predicted (the one that answers whether splitting pays);
- for every recorded schedule that splits its backwards, the best non-splitting schedule of its placement
  (:data:`PLACEMENTS`: ``1F1B`` or ``GPipe`` for one stage per rank; ``Interleaved1F1B`` or ``LoopedBFS``
  for two, which the V schedules ``ZBVZeroBubble`` and ``DualPipeV`` are compared with too: PyTorch has no
  V schedule that does not split). Only against it does a splitting schedule show what splitting itself
  gains: a two-stage-per-rank schedule can beat 1F1B by its placement alone (half the bubble), without
  any split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from graphkit.pipelining.remembered_error import recording_band
from graphkit.pipelining.schedule_plan import PlannedSchedule

__all__ = [
    "DEFAULT_PREDICTION_ERROR",
    "DEFAULT_RECORD_BUDGET_S",
    "PLACEMENTS",
    "RecordingChoice",
    "best_non_splitting",
    "choose_recorded",
]

DEFAULT_PREDICTION_ERROR = 0.10
"""The fraction of the best predicted step within which schedules are recorded, before a run has measured
the prediction's own error: ``plan --run``'s predictions from ``graphkit costs`` were within 12 to 14% of
the measured step for every schedule, the worst of five pinned runs off by 0.09 to 0.18 (docs:
choosing_a_schedule.md, "Does the prediction hold?"); ratios to 1F1B, which share the runtime's errors, err
less. Used only before any run of a set-up: each ``plan --run`` remembers the error it measured, and the
next one of the same set-up records within that (:mod:`graphkit.pipelining.remembered_error`)."""

DEFAULT_RECORD_BUDGET_S = 600.0
"""Seconds of recorded steps ``plan --run`` spends at most on the schedules within the prediction's error
(estimated from their predicted steps; the schedules it always records count too, but are never left out)."""

PLACEMENTS = {1: "one stage per rank", 2: "two stages per rank"}
"""A schedule's placement, by its stages per rank, as the table's ``st/rank`` column gives it."""


@dataclass(slots=True)
class RecordingChoice:
    """What :func:`choose_recorded` chose.

    Attributes:
        chosen: the schedules to record, 1F1B last, each with ``recorded_because`` set.
        left_out: ``(name, why)`` for every schedule planned within the memory limit and not chosen.
        prediction_error: the error allowed each prediction (a fraction of its step); the band spans
            :func:`~graphkit.pipelining.remembered_error.recording_band` of it.
        budget_s: the time budget in seconds (None: none).
        estimated_s: the chosen schedules' estimated recording time in seconds (the control included).
        control: 1F1B is to be recorded a second time, as the A/A control (not in ``chosen``).
    """

    chosen: list[PlannedSchedule]
    left_out: list[tuple[str, str]] = field(default_factory=list)
    prediction_error: float = DEFAULT_PREDICTION_ERROR
    budget_s: float | None = DEFAULT_RECORD_BUDGET_S
    estimated_s: float = 0.0
    control: bool = False


def best_non_splitting(schedules: Sequence[PlannedSchedule], stages_per_rank: int) -> PlannedSchedule | None:
    """The non-splitting schedule with ``stages_per_rank`` stages per rank and the shortest predicted step
    among those simulated within the memory limit (``schedules`` in any order), or None."""
    candidates = [
        item
        for item in schedules
        if item.simulation is not None
        and item.fits_memory
        and item.same_order_as is None
        and item.stages_per_rank == stages_per_rank
        and not item.splits_backward
    ]
    return min(candidates, key=lambda item: item.predicted_seconds, default=None)


def choose_recorded(
    schedules: Sequence[PlannedSchedule],
    baseline: PlannedSchedule,
    *,
    steps: int,
    prediction_error: float = DEFAULT_PREDICTION_ERROR,
    budget_s: float | None = DEFAULT_RECORD_BUDGET_S,
    top: int | None = None,
    control: bool = True,
) -> RecordingChoice:
    """Choose what ``plan --run`` records (see the module's text) and why.

    Args:
        schedules: every planned schedule, best predicted first (``SchedulePlan.schedules``).
        baseline: 1F1B among them.
        steps: recorded steps per schedule; with the warm-up step, a schedule's recording is estimated at
            ``(steps + 1) x`` its predicted step.
        prediction_error: how far each prediction may be off, a fraction of its step; every schedule
            predicted within :func:`~graphkit.pipelining.remembered_error.recording_band` of it above the
            best predicted step is recorded (0.10: within 22%).
        budget_s: seconds of recording at most, or None; the schedules always recorded count but are never
            left out, the others are taken best predicted first while they fit.
        top: at most this many schedules within the band (None: no cap); what it leaves out is said.
        control: 1F1B is recorded twice (counted in the estimate).

    Raises:
        ValueError: ``prediction_error`` below 0, ``budget_s`` below 0 or ``steps`` below 1.
    """
    if prediction_error < 0 or (budget_s is not None and budget_s < 0) or steps < 1:
        raise ValueError(
            "prediction_error and the record budget must be at least 0 and steps at least 1, got "
            f"{prediction_error}, {budget_s} and {steps}"
        )
    simulated = [
        item
        for item in schedules
        if item.simulation is not None and item.fits_memory and item.same_order_as is None
    ]
    base_seconds = baseline.predicted_seconds

    def ratio(item: PlannedSchedule) -> str:
        return f"predicted {item.predicted_seconds / base_seconds:.2f}x" if base_seconds else "predicted"

    def cost(item: PlannedSchedule) -> float:
        return (steps + 1) * item.predicted_seconds

    best = min((item.predicted_seconds for item in simulated), default=base_seconds)
    band = recording_band(prediction_error)
    limit = best * (1.0 + band)
    best_ratio = best / base_seconds if base_seconds else 1.0
    reasons: dict[str, str] = {}
    chosen: list[PlannedSchedule] = []

    def take(item: PlannedSchedule, why: str) -> None:
        if item in chosen:
            return
        chosen.append(item)
        reasons[item.name] = why

    def partner_of(item: PlannedSchedule) -> PlannedSchedule | None:
        partner = best_non_splitting(simulated, item.stages_per_rank) if item.splits_backward else None
        return partner if partner is not None and partner is not baseline else None

    def take_partner(item: PlannedSchedule) -> None:
        partner = partner_of(item)
        if partner is not None and partner not in chosen:
            take(
                partner,
                f"{ratio(partner)}, the best non-splitting schedule of {PLACEMENTS.get(partner.stages_per_rank, '')}"
                f" ({item.name}'s placement)",
            )

    zero_bubble = next((item for item in simulated if item.splits_backward), None)
    if zero_bubble is not None and zero_bubble is not baseline:
        within = zero_bubble.predicted_seconds <= limit
        take(
            zero_bubble,
            f"{ratio(zero_bubble)}"
            + (f", within {band:.0%} of the best predicted" if within else "")
            + ", the best zero-bubble predicted",
        )
        take_partner(zero_bubble)
    estimated = sum(cost(item) for item in chosen) + cost(baseline) * (2 if control else 1)
    left_out: list[tuple[str, str]] = []
    taken_in_band = 0  # --top caps these; what is always recorded does not count
    for item in simulated:
        if item is baseline or item in chosen:
            continue
        if item.predicted_seconds > limit:
            left_out.append(
                (
                    item.name,
                    f"{ratio(item)}, more than {band:.0%} above the best predicted ({best_ratio:.2f}x)",
                )
            )
            continue
        if top is not None and taken_in_band >= top:
            left_out.append((item.name, f"{ratio(item)}, within the band but beyond --top {top}"))
            continue
        partner = partner_of(item)
        extra = cost(item) + (cost(partner) if partner is not None and partner not in chosen else 0.0)
        if budget_s is not None and estimated + extra > budget_s:
            left_out.append(
                (
                    item.name,
                    f"{ratio(item)}, within the band, but recording it (about {extra:.0f} s) would pass "
                    f"the --record-budget of {budget_s:.0f} s",
                )
            )
            continue
        take(item, f"{ratio(item)}, within {band:.0%} of the best predicted")
        take_partner(item)
        estimated += extra
        taken_in_band += 1
    left_out = [(name, why) for name, why in left_out if name not in reasons]
    left_out += [
        (item.name, "over the memory limit")
        for item in schedules
        if item.simulation is not None and not item.fits_memory and item is not baseline
    ]
    ordered = sorted(chosen, key=lambda item: item.predicted_seconds)
    for item in ordered:
        item.recorded_because = reasons[item.name]
    baseline.recorded_because = "the baseline" + (
        ", recorded twice: the second copy is the A/A control" if control else ""
    )
    return RecordingChoice([*ordered, baseline], left_out, prediction_error, budget_s, estimated, control)
