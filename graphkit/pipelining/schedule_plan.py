"""The schedule planner's answer as data: every schedule it simulated, ranked, with what was measured.

:class:`PlannedSchedule` is one schedule as the planner saw it (its order, the prediction, the measured
step); :class:`SchedulePlan` all of them, best first, with the costs and the model they were predicted
with (:meth:`SchedulePlan.to_dict` for ``plan.json``; :func:`plan_table` for ``str(plan)``, :func:`plan_html`
in a notebook; :func:`what_if_table` for :meth:`SchedulePlan.what_if`'s rows). :func:`simulate_schedule` simulates one schedule by name, what
:func:`graphkit.pipelining.planner.plan_schedules` and :meth:`SchedulePlan.what_if` do for each.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from graphkit.measure import paired_rounds
from graphkit.measure.timing import (
    fewest_wins_beyond_chance,
    rounds_to_decide,
    sign_test_p_value,
    t_test_p_value,
)
from graphkit.pipelining.planning.actions import ScheduleError, ScheduleOrder
from graphkit.pipelining.planning.cost_model import CommModel, StageCost, free_split, mean_cost, scaled
from graphkit.pipelining.planning.registry import built_from_costs, generated_order, is_generated
from graphkit.pipelining.planning.simulator import Simulation, simulate
from graphkit.pipelining.planning.timelines import ScheduleTimeline
from graphkit.pipelining.remembered_error import error_from_measured, recording_band
from graphkit.pipelining.schedules import is_single_stage, schedule_order

__all__ = [
    "BUILT_IN_SCHEDULES",
    "PlannedSchedule",
    "SchedulePlan",
    "check_memory_limit",
    "free_split_ratio",
    "plan_html",
    "plan_table",
    "process_set_sizes",
    "simulate_schedule",
    "what_if_table",
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

PREDICTED_MARGIN = 0.99
"""Without recorded steps, a schedule is recommended over 1F1B (and said to pay) only when predicted below
this many times 1F1B's step: a prediction within 1% is within the costs' noise, no reason to change."""

SIGNIFICANCE = 0.05
"""With recorded steps, a schedule beats 1F1B only when it was faster in more rounds than chance would give
it this often (a one-sided sign test, :func:`~graphkit.measure.timing.sign_test_p_value`), split among the
schedules recorded against 1F1B (Bonferroni: with 4 of them, each is tested at 0.0125, so that all 4 together
are wrongly picked at most 5% of the time): with one, at 31 rounds 21 wins, at 15 12; with four, 23 and 13."""

RUNOFF_MARGIN = 0.04
"""With recorded steps, schedules that measured within this fraction of the pick's median round ratio to
1F1B (or within the run's noise floor, where that is wider) are recorded again, in new processes, before one
is recommended (:meth:`SchedulePlan.runoff_finalists`). A schedule's ratio moves between sets of processes
by more than the A/A control, whose copies share theirs, can show: over 93 schedules recorded in both sets
of 19 GPT-2 plans (4 and 8 microbatches, 21 rounds each) it moved a median 1.5 points of 1F1B's step, 4.0
at the 90th percentile, 8.3 at most. At 2% a plan left DualPipeV (3.7 points behind its pick in the first
recording) out of its run-off, and a separate run measured DualPipeV 2.3% ahead of the pick."""

PROCESS_SETS = 3
"""A plan records its rounds in this many sets of processes, each one new (new processes, new copies of the
stages): the first recording's rounds and, apart, a run-off's (:func:`process_set_sizes`). A run-off orders
its finalists by the mean over its sets of each set's median round ratio to 1F1B. A schedule's ratio moves
between sets of processes by more than the A/A control's does (GPT-2, five plans, sets of 7 rounds: a median
3.8 points of 1F1B's step against the control's 2.3): part of what a set adds stays for all of its rounds,
which more rounds in one set cannot average out, and more sets do. A model of 8 transformer blocks measured
DualPipeV 1.03x 1F1B in one plan's first recording, a single set, and 0.95x in a separate run: the plan left
it out of its run-off."""

COMPARE_TIMEOUT_S = 120.0
"""``graphkit compare-schedules``' own default ``--timeout``: the check command names another only."""

LEVEL_MARGIN = 0.01
"""Two run-off finalists are level when the run-off's sets of processes cannot tell them apart (a two-sided
t-test over the sets' paired differences is not below :data:`SIGNIFICANCE`) and their mean ratios to 1F1B
lie within this fraction of 1F1B's step; of level finalists the one that holds less memory is recommended
(:attr:`SchedulePlan.recommended`): which of them is faster changes from one set of processes, and one
run, to the next, so no run can promise the order. A wider margin trades speed the run-off did measure
for memory: at 2% a model of 8 transformer blocks was recommended ZBH1 over DualPipeV, level with it by
the t-test over three sets, and a separate run measured ZBH1 2.4% behind. GPT-2 on 2 pinned ranks:
ZBVZeroBubble measured ahead of DualPipeV in 15 of 17 separate comparisons, by up to 3.9 points of 1F1B's
step, while one plan's run-off of 21 rounds measured DualPipeV 1.5 points ahead (its sets: 2.6 points
behind, then 4.3 and 2.8 ahead): a run-off now records as many rounds as ordering them needs
(:data:`~graphkit.pipelining.planner.RUNOFF_STANDARD_ERROR`)."""

RUNOFF_MOST = 3
"""Where 1F1B would be kept, at most this many contenders go to a run-off (the best in the median round)."""

NOISE_MARGIN = 0.97
"""A predicted gain under 3% is not told from the round-to-round noise of a small machine (the docs' runs)."""

MEMORY_NOTE_RATIO = 1.5
"""A pick whose predicted peak memory per rank is above this many times 1F1B's is printed with a note."""


@dataclass(slots=True)
class PlannedSchedule:
    """One schedule as the planner saw it.

    Attributes:
        name: what it is called (``1F1B``, ``ZBH1``, ``Adaptive``).
        stages_per_rank: 1 or 2. simulation: the prediction from the costs.
        fits_memory: whether its peak activation memory stays within the memory limit on every rank.
        csv: the file its order was written to (generated schedules), for ``csv:PATH``.
        measured_seconds: the recorded step (with ``run``), its slowest rank; None if not run.
        measured_steps: with ``run``, every recorded step's seconds, round by round (all schedules were
            recorded in the same rounds, so step ``i`` of two schedules ran under the same load).
        recorded_because: with ``run``, why it was chosen for recording (``"the baseline"``, ...).
        recorded_prediction_seconds: the step simulated from the recorded per-action durations; None if not run.
        error: why it could not be simulated (then ``simulation`` is None).
        same_order_as: the schedule whose order it is (a generated schedule that came out as 1F1B's
            order: ``"1F1B"``), None otherwise; it is neither recorded again nor predicted apart.
    """

    name: str
    stages_per_rank: int
    simulation: Simulation | None
    fits_memory: bool = True
    csv: str | None = None
    measured_seconds: float | None = None
    recorded_prediction_seconds: float | None = None
    error: str | None = None
    order: ScheduleOrder | None = field(default=None, repr=False)
    measured_steps: list[float] = field(default_factory=list, repr=False)
    recorded_because: str | None = None
    same_order_as: str | None = None

    @property
    def splits_backward(self) -> bool:
        """Whether the schedule splits any backward into I and W (a zero-bubble schedule) on a stage after
        the first: the first stage's I is nothing and its W one full backward (as PyTorch's runtime runs
        them), so an I and W there are a full backward moved later, not a split."""
        return self.order is not None and any(
            action.kind == "I" and action.stage != 0 for row in self.order.rows for action in row
        )

    @property
    def label(self) -> str:
        """The name as the table shows it: ``CostAware (1F1B's order)`` for a generated schedule that came
        out as another's order."""
        return f"{self.name} ({self.same_order_as}'s order)" if self.same_order_as else self.name

    @property
    def predicted_seconds(self) -> float:
        return self.simulation.step_seconds if self.simulation is not None else math.inf

    @property
    def run_name(self) -> str:
        """What to run it by on the command line: ``csv:PATH`` for a cost-built order, else its name."""
        return f"csv:{self.csv}" if is_generated(self.name) and self.csv else self.name

    @property
    def runnable(self) -> str | ScheduleOrder:
        """What ``record_schedules`` runs: the order itself for graphkit's generated schedules (built from
        these costs), the name for PyTorch's."""
        return self.order if self.order is not None and is_generated(self.name) else self.name


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
    timelines: list[ScheduleTimeline] = field(default_factory=list, repr=False)
    measured_overhead: dict[str, Any] | None = None
    overhead_source: str = "given"
    # with run: how the steps were recorded (steps per schedule, threads per rank, ranks pinned to cores)
    recording: dict[str, Any] | None = None
    # the whole batch (rows), split into the microbatches; None where the plan came from costs alone
    batch_size: int | None = None
    # CostAware's predicted step over 1F1B's were splitting free (I + W = B): see free_split_ratio()
    free_split_vs_1f1b: float | None = None
    # the machine was busier than its cores before measuring: what to expect of the figures
    load_warning: str = ""
    # with run: the run-off among the schedules that measured too close to the pick to tell apart, recorded
    # again in new processes ({"finalists": names, "rounds": run-off rounds, "first_pick": name, "margin":
    # fraction}; "skipped": why, where it was not recorded); see runoff_finalists()
    runoff: dict[str, Any] | None = None
    # with run: other processes' average CPU use while recording, in cores (None: unknown), and the warning
    # given where it was enough to move the figures (graphkit.measure.competing_load)
    other_processes_cores: float | None = None
    shared_cores_warning: str = ""
    # with run: how many rounds each set of processes of the first recording recorded, in order
    # (process_set_sizes; with --steps auto, each recording's); [] where they were one set
    first_recording_sets: list[int] = field(default_factory=list)
    # with run: the A/A control, 1F1B recorded a second time in the same rounds (its steps, round by round)
    control_steps: list[float] = field(default_factory=list, repr=False)
    # with run: (name, why) for every schedule within the memory limit that was not recorded
    left_out: list[tuple[str, str]] = field(default_factory=list)
    # with run: the error allowed each prediction (a fraction of its step; the band recorded is
    # remembered_error.recording_band of it) and the time budget (seconds)
    prediction_error: float | None = None
    # with run: where that band came from (given, remembered from an earlier run of the set-up, the default)
    prediction_error_source: str = ""
    record_budget_s: float | None = None
    # with run: how far the prediction that chose the recorded schedules was from what they measured
    # (ratios to 1F1B): {"median": ..., "worst": ..., "schedule": the worst one}; see selection_error
    selection_error: dict[str, Any] | None = None
    # W's seconds were multiplied by this in every prediction (a W factor measured by an earlier run)
    weight_slowdown: float = 1.0
    # with run: W's recorded seconds over its costs, and the other passes', fitted on every recorded step
    fitted_slowdown: dict[str, float] | None = None
    # with run and steps="auto": how many rounds were recorded and why it stopped
    auto_steps: str | None = None
    # with run: CostAware built again with W at its fitted factor (same order as recorded? its prediction)
    rebuilt_cost_aware: dict[str, Any] | None = None

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
    def best_zero_bubble(self) -> PlannedSchedule | None:
        """The zero-bubble schedule (one that splits backwards into I and W) with the shortest predicted step
        within the memory limit, or None."""
        return next(
            (
                item
                for item in self.schedules
                if item.simulation is not None and item.fits_memory and item.splits_backward
            ),
            None,
        )

    def rounds_won(self, item: PlannedSchedule, against: PlannedSchedule | None = None) -> tuple[int, int]:
        """``(won, rounds)``: in how many of the recorded rounds ``item``'s step was shorter than that of
        ``against`` (default 1F1B)."""
        other = against if against is not None else self.baseline
        return paired_rounds.rounds_won(item.measured_steps, other.measured_steps)

    def round_ratio(self, item: PlannedSchedule, against: PlannedSchedule | None = None) -> float | None:
        """The median over the recorded rounds of ``item``'s step over the step of ``against`` (default
        1F1B) in the same round (the paired figure: a change of load touches both steps of a round); None
        without recorded rounds."""
        other = against if against is not None else self.baseline
        return paired_rounds.median_round_ratio(item.measured_steps, other.measured_steps)

    @property
    def noise_floor(self) -> float | None:
        """The run's noise floor: how far apart the two copies of 1F1B recorded in the same rounds (the A/A
        control) measured in the median round (:func:`~graphkit.measure.paired_rounds.noise_floor`: 0.012
        for 1.2%); no difference this small is called. None without a control."""
        if not self.control_steps or not self.baseline.measured_steps:
            return None
        return paired_rounds.noise_floor(self.control_steps, self.baseline.measured_steps)

    def beyond_noise(self, ratio: float | None) -> bool:
        """Whether a median round ratio is below 1 by more than the noise floor (any amount without one)."""
        return ratio is not None and ratio < 1.0 - (self.noise_floor or 0.0)

    def placement_baseline(self, item: PlannedSchedule) -> PlannedSchedule | None:
        """The recorded non-splitting schedule of ``item``'s placement (as many stages per rank) that
        measured fastest against 1F1B in the median round: what ``item``'s splitting is measured against
        (1F1B or GPipe for one stage per rank; Interleaved1F1B or LoopedBFS for two, the V schedules
        included); None if none was recorded.

        The candidates are compared over the rounds they all have, the first recording's: a run-off
        records the one chosen then again, and its added rounds must not hand the choice to another
        schedule that has only the first ones (a median of 42 rounds against one of 21)."""
        peers = [
            other
            for other in self.schedules
            if other.measured_steps
            and other.fits_memory
            and other.stages_per_rank == item.stages_per_rank
            and not other.splits_backward
        ]
        shared = min((len(other.measured_steps) for other in peers), default=0)
        base = self.baseline.measured_steps[:shared]

        def first_rounds_ratio(other: PlannedSchedule) -> float:
            ratio = paired_rounds.median_round_ratio(other.measured_steps[:shared], base)
            return math.inf if ratio is None else ratio

        return min(peers, key=first_rounds_ratio, default=None)

    def process_sets(self) -> list[tuple[int, int]]:
        """The rounds each set of processes recorded, as ``(start, end)`` indices into 1F1B's (and every
        finalist's) measured steps: each of the first recording's sets (:attr:`first_recording_sets`, one
        where it was one set), then each of the run-off's (:data:`PROCESS_SETS`: new processes, new copies
        of the stages, each)."""
        runoff_sizes = self.runoff_sets()
        first_rounds = len(self.baseline.measured_steps) - sum(runoff_sizes)
        first_sizes = list(self.first_recording_sets)
        if sum(first_sizes) != first_rounds:  # no sets recorded (a plan from costs alone, a test's rounds)
            first_sizes = [first_rounds]
        bounds: list[tuple[int, int]] = []
        start = 0
        for size in [*first_sizes, *runoff_sizes]:
            bounds.append((start, start + size))
            start += size
        return bounds

    @property
    def first_recording_set_count(self) -> int:
        """How many sets of processes the first recording was recorded in (:meth:`process_sets`)."""
        return len(self.process_sets()) - len(self.runoff_sets())

    def runoff_sets(self) -> list[int]:
        """How many rounds each of the run-off's sets of processes recorded, in order; [] without one."""
        runoff = self.runoff or {}
        return list(runoff.get("sets") or ([runoff["rounds"]] if runoff.get("rounds") else []))

    def ratio_by_process_set(self, item: PlannedSchedule, against: PlannedSchedule) -> list[float]:
        """``item``'s median round ratio to ``against`` in each set of processes that recorded both: the
        first recording's sets, then each of the run-off's (new processes, new copies of the stages,
        :meth:`process_sets`); none where they share no round.

        A ratio can move between sets of processes by more than the A/A control shows, since its two
        copies of 1F1B share their processes: GPT-2 at 8 microbatches measured DualPipeV 1.014x
        Interleaved1F1B in one set and 0.977x in the next, while the control's copies were 0.5% apart."""
        ours, theirs = item.measured_steps, against.measured_steps
        ratios = []
        for start, end in self.process_sets():
            if end > start and len(ours) >= end and len(theirs) >= end:
                ratio = paired_rounds.median_round_ratio(ours[start:end], theirs[start:end])
                if ratio is not None:
                    ratios.append(ratio)
        return ratios

    def deciding_sets(self, by_set: list[float]) -> tuple[list[float], str]:
        """Of ``by_set`` (:meth:`ratio_by_process_set`: the first recording's sets, then the run-off's), the
        sets the zero-bubble line tests, and what they are in words: the run-off's alone where it recorded
        more rounds than the first recording (each of its sets then holds more rounds than each of the
        first's, and the first recording chose what it records again: its rounds flatter), else all of
        them, each one draw. A model of 8 transformer blocks measured DualPipeV 0.992x, 1.142x and 1.084x
        Interleaved1F1B in the first recording's three sets of 7 rounds, and 0.972x, 0.976x and 0.969x in the
        run-off's three of 100."""
        runoff = self.runoff_sets()
        first = len(by_set) - len(runoff)
        first_rounds = len(self.baseline.measured_steps) - sum(runoff)
        if runoff and first == self.first_recording_set_count and sum(runoff) > first_rounds:
            return by_set[first:], f"the run-off's {_count_word(len(runoff))} sets"
        return by_set, f"the {_count_word(len(by_set))} sets"

    def runoff_ratios(self, item: PlannedSchedule) -> list[float]:
        """``item``'s median round ratio to 1F1B in each of the run-off's sets of processes, in order; []
        without a run-off or where ``item`` was not recorded in it."""
        runoff = len(self.runoff_sets())
        if not runoff or len(item.measured_steps) < self.process_sets()[-1][1]:
            return []
        return self.ratio_by_process_set(item, self.baseline)[-runoff:]

    def level_with(self, item: PlannedSchedule, other: PlannedSchedule) -> bool:
        """Whether the run-off's sets of processes could not order ``item`` and ``other``: a two-sided
        t-test over the sets' paired differences (logarithms of their ratios to 1F1B, each set one draw,
        :func:`~graphkit.measure.timing.t_test_p_value`) is not below :data:`SIGNIFICANCE`, and their means
        over the sets lie within :data:`LEVEL_MARGIN`; False with fewer than two run-off sets."""
        ours, theirs = self.runoff_ratios(item), self.runoff_ratios(other)
        if len(ours) < 2 or len(ours) != len(theirs):
            return False
        differences = [math.log(mine / its) for mine, its in zip(ours, theirs, strict=True)]
        below = t_test_p_value(differences)
        return (
            2 * min(below, 1.0 - below) >= SIGNIFICANCE
            and abs(statistics.fmean(ours) - statistics.fmean(theirs)) <= LEVEL_MARGIN
        )

    def rounds_to_decide(self, item: PlannedSchedule) -> int | None:
        """About how many rounds a sign test at :attr:`significance` would need to tell ``item`` from 1F1B at
        the win fraction measured (:func:`~graphkit.measure.timing.rounds_to_decide`); None if it won half
        the rounds or fewer, or more than 5,000 would be needed."""
        won, rounds = self.rounds_won(item)
        return rounds_to_decide(won / rounds, self.significance) if rounds else None

    def won_beyond_chance(self, item: PlannedSchedule) -> bool:
        """Whether ``item``'s step was shorter than 1F1B's in more of the recorded rounds than chance would
        give it (sign test below :data:`SIGNIFICANCE`)."""
        won, rounds = self.rounds_won(item)
        return sign_test_p_value(won, rounds) < self.significance

    @property
    def significance(self) -> float:
        """:data:`SIGNIFICANCE` split among the schedules recorded against 1F1B (Bonferroni)."""
        contenders = sum(1 for item in self.schedules if item.measured_steps and item is not self.baseline)
        return SIGNIFICANCE / max(contenders, 1)

    @property
    def splitting_significance(self) -> float:
        """The level the zero-bubble line tests splitting against its placement at: :data:`SIGNIFICANCE` split
        among the splitting schedules recorded (Bonferroni: the line asks one question, of the best of
        them, chosen among that many), not among every schedule as :attr:`significance` is."""
        splitting = sum(1 for item in self.schedules if item.measured_steps and item.splits_backward)
        return SIGNIFICANCE / max(splitting, 1)

    def rounds_needed(self) -> int | None:
        """The fewest rounds won that beat 1F1B beyond chance, over the rounds recorded (None: too few)."""
        return fewest_wins_beyond_chance(len(self.baseline.measured_steps), self.significance)

    @property
    def recommended(self) -> PlannedSchedule:
        """What to run. Without recorded steps, the best predicted schedule where it is predicted at least 1%
        below 1F1B (:data:`PREDICTED_MARGIN`), else 1F1B. With them, the measured:
        the schedule with the shortest median step among those that beat 1F1B's median and its step in
        more recorded rounds than chance would (:meth:`won_beyond_chance`), by more than the noise floor in
        the median round (:attr:`noise_floor`), whose median step is below 1F1B's too; 1F1B when none does
        (keep 1F1B). After a run-off, the finalist of those with the lowest :meth:`runoff_ratio`, or, of it
        and the finalists level with it (:meth:`level_with`), the one with the lowest predicted peak memory
        on its busiest rank."""
        base = self.baseline
        if base.measured_seconds is None:
            best = self.best
            if best is base or not base.fits_memory:
                return best
            return best if best.predicted_seconds < PREDICTED_MARGIN * base.predicted_seconds else base
        level = self.runoff_level()
        if level:  # ordered by the run-off's rounds alone: the first run chose them, so it flatters them
            # of finalists no set of processes could order, the one that holds less memory
            return min(level, key=lambda item: (peak_memory_bytes(item), self.runoff_ratio(item) or math.inf))
        return min(self.eligible_winners(), key=lambda item: self.round_ratio(item) or math.inf, default=base)

    def eligible_winners(self) -> list[PlannedSchedule]:
        """:meth:`measured_winners`, less the finalists of a run-off held because 1F1B would be kept
        (:attr:`runoff_decides_alone`): the first recording chose them for the rounds they won there, so
        only the run-off's rounds can confirm them (:meth:`runoff_level`). A schedule that run-off recorded
        again for its placement was not chosen so, and stays."""
        finalists = set((self.runoff or {}).get("finalists", ())) if self.runoff_decides_alone else set()
        return [item for item in self.measured_winners() if item.name not in finalists]

    def measured_winners(self) -> list[PlannedSchedule]:
        """The recorded schedules that beat 1F1B over every recorded round: within the memory limit, beyond
        the noise floor in the median round, median step below 1F1B's, and faster in more rounds than
        chance would give (:meth:`won_beyond_chance`)."""
        base = self.baseline
        return [
            item
            for item in self.schedules
            if item is not base
            and item.measured_seconds is not None
            and item.fits_memory
            and self.beyond_noise(self.round_ratio(item))
            and item.measured_seconds < (base.measured_seconds or 0)
            and self.won_beyond_chance(item)
        ]

    def runoff_level(self) -> list[PlannedSchedule]:
        """After a run-off, the finalist it confirmed with the lowest :meth:`runoff_ratio` first, then the
        confirmed finalists level with it (:meth:`level_with`); [] without a run-off or where it confirmed
        none. Confirmed: within the memory limit, median step below 1F1B's, beyond the noise floor in the
        run-off's rounds, and among :meth:`eligible_winners` or beyond chance in the run-off's rounds alone
        (:meth:`won_runoff_beyond_chance`)."""
        confirmed = self.runoff_confirmed()
        if not confirmed:
            return []
        fastest = min(confirmed, key=lambda item: self.runoff_ratio(item) or math.inf)
        return [
            fastest,
            *(item for item in confirmed if item is not fastest and self.level_with(item, fastest)),
        ]

    def runoff_confirmed(self) -> list[PlannedSchedule]:
        """The run-off's finalists it confirmed against 1F1B (:meth:`runoff_level`); [] without one."""
        runoff = self.runoff or {}
        if not runoff.get("rounds"):
            return []
        base = self.baseline
        winners = self.eligible_winners()
        return [
            item
            for item in (self.by_name(name) for name in runoff["finalists"])
            if item.fits_memory
            and item.measured_seconds is not None
            and item.measured_seconds < (base.measured_seconds or 0)
            and self.beyond_noise(self.runoff_ratio(item))
            and (item in winners or self.won_runoff_beyond_chance(item))
        ]

    def beats_1f1b(self, item: PlannedSchedule) -> bool:
        """Whether ``item`` passed what :attr:`recommended` asks of a schedule against 1F1B: among
        :meth:`eligible_winners`, or a finalist the run-off confirmed (:meth:`runoff_confirmed`)."""
        return item in self.eligible_winners() or item in self.runoff_confirmed()

    @property
    def runoff_decides_alone(self) -> bool:
        """Whether a run-off was recorded because 1F1B would have been kept (its first pick), so that its
        rounds alone confirm a finalist (:meth:`runoff_level`): the first recording chose the finalists for
        the rounds they won, and those rounds must not count again towards the sign test."""
        runoff = self.runoff or {}
        return bool(runoff.get("rounds")) and runoff.get("first_pick") == self.baseline.name

    def deciding_rounds(self, item: PlannedSchedule) -> tuple[slice, float]:
        """The rounds that decide whether ``item`` beats 1F1B, as a slice of the measured steps, and the
        sign test's level there: after a run-off held because 1F1B would be kept
        (:attr:`runoff_decides_alone`), the run-off's rounds alone at :attr:`runoff_significance` for one of
        its finalists (the first recording chose it for the rounds it won there); else every round, at
        :attr:`significance`."""
        if self.decided_in_runoff(item):
            total = len(self.baseline.measured_steps)
            return slice(total - self.runoff["rounds"], None), self.runoff_significance or 0.0
        return slice(None), self.significance

    def decided_in_runoff(self, item: PlannedSchedule) -> bool:
        """Whether the run-off's rounds alone decide ``item`` against 1F1B: one of the finalists of a run-off
        held because 1F1B would be kept (:attr:`runoff_decides_alone`)."""
        return self.runoff_decides_alone and self.recorded_in_runoff(item)

    def deciding_ratio(self, item: PlannedSchedule) -> float | None:
        """``item``'s ratio to 1F1B over the rounds that decide it (:meth:`deciding_rounds`), as
        :attr:`recommended` reads it: :meth:`runoff_ratio` over the run-off's (the mean of each set's
        median round), else :meth:`round_ratio`."""
        window, _ = self.deciding_rounds(item)
        return self.runoff_ratio(item) if window.start else self.round_ratio(item)

    @property
    def runoff_significance(self) -> float | None:
        """The level a finalist is tested at on the run-off's rounds alone: :data:`SIGNIFICANCE` split among
        the finalists (fresh rounds, after the first run chose them); None without a run-off."""
        runoff = self.runoff or {}
        return SIGNIFICANCE / len(runoff["finalists"]) if runoff.get("rounds") else None

    def won_runoff_beyond_chance(self, item: PlannedSchedule) -> bool:
        """Whether ``item`` beat 1F1B in more of the run-off's rounds alone than chance would give it (sign
        test below :attr:`runoff_significance`); False without a run-off."""
        level = self.runoff_significance
        if level is None:
            return False
        won, total = self.runoff_rounds_won(item)
        return sign_test_p_value(won, total) < level

    def runoff_rounds_won(self, item: PlannedSchedule) -> tuple[int, int]:
        """``(won, rounds)`` against 1F1B over the run-off's rounds alone (the last ones recorded);
        ``(0, 0)`` without a run-off."""
        rounds = (self.runoff or {}).get("rounds")
        if not rounds:
            return 0, 0
        return paired_rounds.rounds_won(item.measured_steps[-rounds:], self.baseline.measured_steps[-rounds:])

    def remeasure_command(self) -> str | None:
        """The ``graphkit compare-schedules`` command that re-measures the recommendation in a separate run:
        1F1B first (the baseline) and again (``--control``), the recommended schedule, and the next three
        recorded schedules that measured fastest against 1F1B, with this plan's ranks, microbatches, batch,
        rounds and pinning; None without recorded steps or a pipeline spec. A pick holds when it measures
        there within twice the comparison's standard error of the best (its ``precision:`` line)."""
        if self.spec is None or not self.baseline.measured_steps or self.recording is None:
            return None
        base = self.baseline
        recommended = self.recommended
        others = sorted(
            (
                item
                for item in self.schedules
                if item.measured_steps and item is not base and item is not recommended
            ),
            key=lambda item: self.round_ratio(item) or math.inf,
        )
        picked = ([recommended] if recommended is not base else []) + others[:3]
        names = ",".join(["1F1B", *(item.run_name for item in picked)])
        rounds = (
            len(base.measured_steps)
            if self.runoff is None or "rounds" not in self.runoff
            else self.runoff["rounds"]
        )
        spec = (
            self.spec
            if all(character.isalnum() or character in "-_.:/" for character in self.spec)
            else f"'{self.spec}'"
        )
        unwritten = [item.name for item in picked if built_from_costs(item.name) and not item.csv]
        # the check's sets record as many rounds as the run-off's: the limit the plan's recordings ran under
        # (the user's --timeout, 600 s by default), not compare-schedules' own 120 s
        timeout = self.recording.get("timeout_s")
        return (
            f"graphkit compare-schedules {spec} --ranks {self.ranks}"
            + (" --pin-cores" if self.recording.get("pin_cores") else "")
            + f" --microbatches {self.microbatches}"
            + (f" --batch-size {self.batch_size}" if self.batch_size else "")
            + f" --steps {rounds}"
            + (f" --process-sets {PROCESS_SETS}" if len(process_set_sizes(rounds)) > 1 else "")
            + f" --control --schedules {names}"
            + (f" --timeout {timeout:g}" if timeout is not None and timeout != COMPARE_TIMEOUT_S else "")
            + (
                f" (plan with -o DIR first: by name, {' and '.join(unwritten)} "
                f"{'is' if len(unwritten) == 1 else 'are'} built anew from default costs, not the "
                "order recorded here)"
                if unwritten
                else ""
            )
        )

    def runoff_ratio(self, item: PlannedSchedule) -> float | None:
        """``item``'s ratio to 1F1B over the run-off's rounds alone (the last ones recorded): the mean over
        the run-off's sets of processes of each one's median round ratio (:meth:`runoff_ratios`), so that
        each set counts alike; None without a run-off."""
        ratios = self.runoff_ratios(item)
        return statistics.fmean(ratios) if ratios else None

    def runoff_finalists(self) -> list[PlannedSchedule]:
        """The schedules to record again, in new processes, before recommending one (see :data:`RUNOFF_MARGIN`):

        - where a schedule would be recommended: it and every other recorded one that measured faster than
          1F1B and within the margin (the noise floor, at least :data:`RUNOFF_MARGIN`) of it in the median
          round, beyond the noise floor or not; [] when none is that close. One run's rounds
          order schedules this close by chance about as often as not on a 2-core machine (GPT-2, 4
          microbatches: the pick measured 0.88x 1F1B in the plan and 0.91x in a separate run, 4% behind a
          schedule it had tied);
        - where a splitting schedule would be recommended with none that close, but it beat its
          placement's non-splitting schedule only beyond the noise floor, not beyond chance
          (:meth:`splitting_undecided`): it alone, so that the zero-bubble line gets the rounds to decide;
        - where 1F1B would be kept: the (at most :data:`RUNOFF_MOST`) schedules that beat 1F1B in most rounds
          and beyond the noise floor, best first, which the first run could not call at the level every
          recorded schedule shares (with ten recorded, 17 of 21 rounds): the run-off tests them on rounds
          of their own at a level split among them alone.
        """
        first = self.recommended
        base = self.baseline
        contenders = []
        for item in self.schedules:
            ratio = self.round_ratio(item)
            won, rounds = self.rounds_won(item)
            if (
                item is not base
                and item.measured_steps
                and item.fits_memory
                and ratio is not None
                and 2 * won > rounds
                and self.beyond_noise(ratio)
            ):
                contenders.append(item)
        contenders.sort(key=lambda item: self.round_ratio(item) or math.inf)
        if first is base:
            return contenders[:RUNOFF_MOST]
        best = self.round_ratio(first)
        if best is None:
            return []
        margin = max(self.noise_floor or 0.0, RUNOFF_MARGIN)
        # close to the pick, a schedule need not have beaten 1F1B beyond the noise floor itself: the pick
        # may not have beaten it by more than the margin either (a model of 8 transformer blocks: CostAware
        # 0.98x 1F1B in the first recording, left out beside DualPipeV's 0.95x, measured best in a
        # separate run)
        close = [
            item
            for item in self.schedules
            if item is not first
            and item is not base
            and item.measured_steps
            and item.fits_memory
            and (self.round_ratio(item) or math.inf) < 1.0
            and (self.round_ratio(item) or math.inf) <= best + margin
        ]
        close.sort(key=lambda item: self.round_ratio(item) or math.inf)
        if close:
            return [first, *close]
        return [first] if self.splitting_undecided(first) else []

    def splitting_undecided(self, item: PlannedSchedule) -> bool:
        """Whether ``item`` splits and measured faster than its placement's non-splitting schedule (not
        1F1B) beyond the noise floor in the median round, but not in enough rounds to call it
        (:attr:`splitting_significance`): the zero-bubble question one more recording may decide."""
        placement = self.placement_baseline(item) if item.splits_backward and item.measured_steps else None
        if placement is None or placement is self.baseline:
            return False
        won, rounds = self.rounds_won(item, placement)
        return self.beyond_noise(self.round_ratio(item, placement)) and not (
            sign_test_p_value(won, rounds) < self.splitting_significance
        )

    @property
    def measured_best(self) -> PlannedSchedule | None:
        """The recorded schedule with the lowest median round ratio to 1F1B (:meth:`round_ratio`; 1F1B's
        own is 1), with ``run``; else None."""
        measured = [item for item in self.schedules if item.measured_seconds is not None]
        return min(measured, key=lambda item: self.round_ratio(item) or math.inf, default=None)

    def closest_contender(self) -> PlannedSchedule | None:
        """The recorded schedule other than 1F1B that won the largest share of its deciding rounds against it
        (:meth:`contest_rounds_won`; ties: the lower ratio over them), or None. Without a run-off every
        schedule's rounds are the same ones, so that is the one that won most rounds. After a run-off a
        finalist's share is of the run-off's rounds alone (the first recording chose the finalists, so its
        rounds flatter them), the others' over every round they recorded."""
        others = [item for item in self.schedules if item.measured_steps and item is not self.baseline]

        def closeness(item: PlannedSchedule) -> tuple[float, float]:
            (won, rounds), ratio, _ = self.contest_rounds_won(item)
            return -won / max(rounds, 1), ratio or math.inf

        return min(others, key=closeness, default=None)

    def contest_rounds_won(self, item: PlannedSchedule) -> tuple[tuple[int, int], float | None, float]:
        """``((won, rounds), ratio, level)``: the rounds that decide whether ``item`` beats 1F1B, its ratio to
        1F1B over them, and the sign test's level there. After a run-off that recorded ``item`` again: the
        run-off's rounds alone, :meth:`runoff_ratio` and :attr:`runoff_significance`; else every recorded
        round, :meth:`round_ratio` and :attr:`significance`."""
        if self.recorded_in_runoff(item):
            return self.runoff_rounds_won(item), self.runoff_ratio(item), self.runoff_significance or 0.0
        return self.rounds_won(item), self.round_ratio(item), self.significance

    def recorded_in_runoff(self, item: PlannedSchedule) -> bool:
        """Whether a run-off recorded ``item`` again (one of its finalists, with rounds recorded)."""
        runoff = self.runoff or {}
        return bool(runoff.get("rounds")) and item.name in runoff.get("finalists", ())

    def rows(self) -> list[dict[str, Any]]:
        """One dict per schedule (JSON-ready): name, predicted and measured step, bubble, peak memory, ..."""
        base = self.baseline.predicted_seconds
        measured_base = self.baseline.measured_seconds
        rows = []
        for item in self.schedules:
            simulation = item.simulation
            row: dict[str, Any] = {
                "schedule": item.name,
                "label": item.label,
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
                "same_order_as": item.same_order_as,
                "measured_step_seconds": item.measured_seconds,
                "measured_vs_1f1b": (
                    item.measured_seconds / measured_base
                    if item.measured_seconds is not None and measured_base
                    else None
                ),
                "median_round_vs_1f1b": self.round_ratio(item) if item.measured_steps else None,
                "rounds_won": list(self.rounds_won(item)) if item.measured_steps else None,
                "sign_test_p": sign_test_p_value(*self.rounds_won(item)) if item.measured_steps else None,
                "predicted_from_recorded_seconds": item.recorded_prediction_seconds,
                "measured_steps": list(item.measured_steps),
                "recorded_because": item.recorded_because,
                "error": item.error,
            }
            rows.append(row)
        return rows

    def zero_bubble_verdict(self) -> str:
        """One line: does zero bubble pay on these stages, and why - each stage's I + W against its full
        backward B (from the measured costs, one stage per rank), the bubble 1F1B leaves (predicted), and
        the best zero-bubble schedule against 1F1B (measured where recorded, else predicted).

        Measured, the gain over 1F1B is told apart: what the schedule's placement gains over 1F1B (the best
        non-splitting schedule recorded with as many stages per rank, :meth:`placement_baseline`) and what
        splitting gains over that placement, both in the same rounds. Zero bubble "pays" only when splitting
        beats its own placement in more rounds than chance would give it (sign test below
        :attr:`significance`) and by more than the noise floor in the median round, and, where a run-off
        recorded both again in new processes, in the median round of each set of processes
        (:meth:`ratio_by_process_set`); where the sets that decide (:meth:`deciding_sets`) disagree on the
        sign and a t-test over them cannot put their mean below 1, it "is not shown to pay"."""
        costs = self.measured_costs or self.costs
        stages = ", ".join(
            f"stage {index} I + W {(cost.backward_input + cost.backward_weight) * 1e3:.3g} ms = "
            f"{(cost.backward_input + cost.backward_weight) / cost.seconds('B'):.2f} x B {cost.seconds('B') * 1e3:.3g} ms"
            for index, cost in enumerate(costs)
            if index > 0 and cost.seconds("B") > 0
        )
        # PyTorch's runtime runs the first stage's I as nothing and its W as one full backward
        stages = "stage 0 none (the first stage sends no input gradient: its W runs as one full backward)" + (
            f", {stages}" if stages else ""
        )
        base = self.baseline
        bubble = base.simulation.bubble_fraction if base.simulation is not None else None
        head = f"splitting costs {stages}" + (
            f"; 1F1B leaves a {bubble:.0%} bubble (predicted)" if bubble is not None else ""
        )
        measured = [
            item
            for item in self.schedules
            if item.splits_backward and item.fits_memory and item.measured_seconds is not None
        ]
        # what was measured speaks over what was predicted; a recommended splitting schedule is the one
        # asked about (a run-off may have ordered it first on rounds of its own)
        recommended = self.recommended
        best = (
            recommended
            if recommended in measured
            else min(
                measured, key=lambda item: self.round_ratio(item) or math.inf, default=self.best_zero_bubble
            )
        )
        if best is None:
            return f"zero bubble: no zero-bubble schedule fits here; {head}"
        floor = self.noise_floor
        reason = ""
        undecided = (
            False  # splitting measured faster than its placement, beyond the noise floor, not beyond chance
        )
        if best.measured_steps:
            placement = self.placement_baseline(best)
            total = len(base.measured_steps)
            window, level = self.deciding_rounds(best)

            def rounds_won(item: PlannedSchedule, against: PlannedSchedule, rounds: slice) -> tuple[int, int]:
                return paired_rounds.rounds_won(item.measured_steps[rounds], against.measured_steps[rounds])

            # what the recommendation reads against 1F1B: each one's own deciding rounds
            ratio = self.deciding_ratio(best) or math.inf
            won, rounds = rounds_won(best, base, window)
            if placement is None:  # nothing of its placement recorded: only 1F1B to compare with
                pays = self.beats_1f1b(best)
                evidence = (
                    f"{best.name} measured {ratio:.2f}x 1F1B in the median round, faster in {won} of {rounds} "
                    f"rounds (p = {sign_test_p_value(won, rounds):.2g}); no non-splitting schedule of its "
                    "placement was recorded, so part of that may be the placement's"
                )
            else:
                placement_window, _ = self.deciding_rounds(placement)
                # the two against each other: over the run-off's rounds where either is decided there and
                # both were recorded in it, else over every round they share
                pair = next(
                    (
                        candidate
                        for candidate in (window, placement_window)
                        if candidate.start
                        and len(best.measured_steps) == total
                        and len(placement.measured_steps) == total
                    ),
                    slice(None),
                )
                split_won, split_rounds = rounds_won(best, placement, pair)
                split_p = sign_test_p_value(split_won, split_rounds)
                placement_ratio = self.deciding_ratio(placement) or math.inf
                placement_won, placement_rounds = rounds_won(placement, base, placement_window)
                if placement is base:  # splitting's gain is its gain over 1F1B: the recommendation's question
                    split_ratio, split_level = ratio, level
                    pays = self.beats_1f1b(best)
                else:
                    split_ratio = (
                        paired_rounds.median_round_ratio(
                            best.measured_steps[pair], placement.measured_steps[pair]
                        )
                        or math.inf
                    )
                    split_level = self.splitting_significance
                    pays = self.beyond_noise(split_ratio) and split_p < split_level
                by_set = self.ratio_by_process_set(best, placement)
                deciding, which = self.deciding_sets(by_set)
                if pair.start:  # the run-off's rounds alone: its sets alone
                    deciding = by_set[-len(self.runoff_sets()) :]
                    which = f"the run-off's {_count_word(len(deciding))} sets"
                # the sets are the independent draws: a sign change among them is outweighed where their
                # mean still lies below 1 beyond chance (a t-test over the sets, at the line's level)
                sets_p = t_test_p_value([math.log(ratio) for ratio in deciding]) if len(deciding) > 2 else 1.0
                sets_disagree = _sets_disagree(deciding) and not sets_p < split_level
                head_to_head = (
                    (
                        f"{best.name} against {placement.name} in the same rounds: {split_ratio:.2f}x in the median "
                        f"round, faster in {split_won} of {split_rounds}, p = {split_p:.2g}"
                    )
                    + (f"; {_by_set(by_set, self.first_recording_set_count)}" if len(by_set) > 1 else "")
                    + (
                        f"; over {which} {_geometric_mean(deciding):.3f}x, t-test p = {sets_p:.2g}"
                        if len(deciding) > 2
                        else ""
                    )
                )
                if placement is base:
                    evidence = (
                        f"{best.name} measured {ratio:.2f}x 1F1B in the median round, faster in {won} of "
                        f"{rounds} rounds (p = {sign_test_p_value(won, rounds):.2g}); it has 1F1B's placement "
                        f"({_placement(best)}), so that is what splitting gains"
                    )
                elif placement.stages_per_rank == base.stages_per_rank:  # GPipe: 1F1B's placement
                    evidence = (
                        f"{best.name} measured {ratio:.2f}x 1F1B in the median round; it has 1F1B's placement "
                        f"({_placement(best)}), where {placement.name}, which splits nothing, measured "
                        f"{placement_ratio:.2f}x 1F1B in the median round (faster in {placement_won} of "
                        f"{placement_rounds}, p = {sign_test_p_value(placement_won, placement_rounds):.2g}); "
                        f"splitting gains {_gain(split_ratio)} "
                        f"over {placement.name} ({head_to_head})"
                    )
                else:
                    evidence = (
                        f"{best.name} measured {ratio:.2f}x 1F1B in the median round; its placement "
                        f"({_placement(best)}) gains {_gain(placement_ratio)} over 1F1B ({placement.name}, "
                        f"which splits nothing: {placement_ratio:.2f}x 1F1B in the median round, faster in "
                        f"{placement_won} of {placement_rounds}, "
                        f"p = {sign_test_p_value(placement_won, placement_rounds):.2g}), "
                        f"splitting gains {_gain(split_ratio)} over its placement ({head_to_head})"
                    )
                placement_wins = placement is not base and self.beats_1f1b(placement)
                # the sets' disagreement stops a "pays", and a "does not pay" where their mean leans to
                # splitting (a tie, or slower in most sets, stays "does not pay")
                if sets_disagree and (pays or statistics.fmean(deciding) < 1.0):
                    pays, undecided = False, True
                    reason = (
                        f"{which} of processes disagree on what splitting gains over its placement "
                        f"({_by_set(by_set, self.first_recording_set_count)})"
                        ": a difference that changes sign "
                        "from one set of processes to the next is not called; re-measure it in new processes "
                        "(the compare-schedules command the plan prints)"
                    )
                elif not pays and placement_wins and not self.beyond_noise(ratio):
                    reason = (
                        f"it does not beat 1F1B, and {placement.name} does without splitting: run "
                        f"{placement.name}"
                    )
                elif not pays and placement_wins and not self.beyond_noise(split_ratio):
                    reason = (
                        f"what it gains over 1F1B is its placement's, not splitting's: {placement.name} "
                        "gains it without splitting"
                    )
                elif (
                    not pays and split_ratio < 1 and floor is not None and not self.beyond_noise(split_ratio)
                ):
                    reason = (
                        f"splitting's {_gain(split_ratio)} over its placement is within the run's noise floor "
                        f"({floor:.1%}, 1F1B against itself)"
                    )
                elif not pays and split_ratio < 1:
                    undecided = True
                    needed = rounds_to_decide(split_won / split_rounds, split_level) if split_rounds else None
                    reason = (
                        f"splitting's {_gain(split_ratio)} over its placement could be chance "
                        f"(p = {split_p:.2g}, not below {split_level:.2g})"
                    ) + (
                        f"; at its win fraction ({split_won} of {split_rounds}) a sign test would need about "
                        f"{needed} rounds to decide (--steps {needed})"
                        if needed is not None and needed > split_rounds
                        else ""
                    )
        else:
            ratio = best.predicted_seconds / base.predicted_seconds
            pays = ratio < PREDICTED_MARGIN  # a prediction within 1% of 1F1B is no reason to split
            evidence = f"{best.name} predicted {ratio:.2f}x 1F1B"
        verdict = "pays" if pays else "is not shown to pay" if undecided else "does not pay"
        reason = reason or (
            "the bubble it fills is worth more than the extra work of splitting"
            if pays
            else "the extra work of splitting costs more than the bubble it fills"
        )
        if pays and best.measured_steps and not self.beats_1f1b(best):  # splitting gains, its placement loses
            reason += (
                f"; yet {best.name} itself did not beat 1F1B as a pick must (it measured {_ratio(ratio)} 1F1B), "
                "so it is not recommended"
            )
        elif pays and best.measured_steps and recommended not in (best, base):  # another placement won
            reason += (
                f"; {recommended.name}, which splits nothing, on {_placement(recommended)}, measured faster still "
                "and is recommended"
            )
        if not base.fits_memory:
            reason = (
                "1F1B itself is over the memory limit, so these ratios compare with a schedule that cannot run: "
                "the schedules that fit hold fewer microbatches in flight, and the ratio is mostly what the limit "
                "costs, not what splitting does"
            )
        bound = self.free_split_vs_1f1b
        if bound is not None and not pays and base.fits_memory:
            reason += f"; were splitting free (I + W = B), CostAware would predict {bound:.3f}x 1F1B: " + (
                "a cheaper split would pay"
                if bound < NOISE_MARGIN
                else f"a cheaper split would gain at most {1 - bound:.1%}, within what one machine's rounds can tell"
                if bound < PREDICTED_MARGIN
                else "the bubble is too small to pay for any split"
            )
        return f"zero bubble {verdict} here ({evidence}): {reason}; {head}"

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
            # "best" (the best predicted) stays for scripts that read it; "recommended" is what to run
            "best": self.best.run_name,
            "best_predicted": self.best.run_name,
            "best_measured": None if self.measured_best is None else self.measured_best.run_name,
            "recommended": self.recommended.run_name,
            "zero_bubble": self.zero_bubble_verdict(),
            "free_split_vs_1f1b": self.free_split_vs_1f1b,
            "noise_floor": self.noise_floor,
            "control_steps": list(self.control_steps),
            "prediction_error": self.prediction_error,
            "prediction_error_source": self.prediction_error_source,
            "record_budget_s": self.record_budget_s,
            "left_out": [{"schedule": name, "why": why} for name, why in self.left_out],
            "selection_error": self.selection_error,
            "weight_slowdown": self.weight_slowdown,
            "fitted_slowdown": self.fitted_slowdown,
            "rebuilt_cost_aware": self.rebuilt_cost_aware,
            "load_warning": self.load_warning,
            "runoff": self.runoff,
            "first_recording_sets": list(self.first_recording_sets),
            "batch_size": self.batch_size,
            "remeasure_command": self.remeasure_command(),
            "other_processes_cores": self.other_processes_cores,
            "shared_cores_warning": self.shared_cores_warning,
            "load": self.load,
            "measured_overhead": self.measured_overhead,
            "recording": self.recording,
            "costs": [asdict(cost) for cost in self.measured_costs or self.costs],
            "stage_costs": None if self.stage_costs is None else [asdict(cost) for cost in self.stage_costs],
            "schedules": self.rows(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=_json_number)

    def table(self) -> str:
        """The ranked table as plain text: what was planned with which model, a row per schedule (times in
        ms, memory in MiB = 2^20 bytes), and the verdict."""
        return plan_table(self)

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        return plan_html(self)

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
        mean = mean_cost(self.measured_costs or self.costs)
        half = scaled(mean, 0.5)
        results = []
        for p in ranks:
            counts = list(microbatches) if microbatches is not None else sorted({self.microbatches, 4 * p})
            for m in counts:
                baseline = None
                for name in schedules:
                    try:
                        item = simulate_schedule(
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


def peak_memory_bytes(item: PlannedSchedule) -> float:
    """``item``'s predicted peak activation memory on its busiest rank, in bytes (inf without a simulation)."""
    if item.simulation is None or not item.simulation.peak_memory_bytes:
        return math.inf
    return float(max(item.simulation.peak_memory_bytes))


def process_set_sizes(rounds: int) -> list[int]:
    """How ``rounds`` rounds of a plan (its first recording's, or a run-off's) are split into sets of
    processes: :data:`PROCESS_SETS` sets, fewer where a set would have under
    :data:`~graphkit.measure.paired_rounds.LEAST_ROUNDS_PER_SET` rounds (21 rounds: ``[7, 7, 7]``; 31:
    ``[11, 10, 10]``; 9: ``[9]``; :func:`~graphkit.measure.paired_rounds.process_set_sizes`)."""
    return paired_rounds.process_set_sizes(rounds, PROCESS_SETS)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON")


# --- costs ---------------------------------------------------------------------------------------------------


# --- simulating every schedule ------------------------------------------------------------------------------
def check_memory_limit(
    planned: list[PlannedSchedule],
    memory_limit: float | None,
    fits_under: Callable[[float], bool] | None = None,
) -> None:
    """Refuse a memory limit no schedule fits, naming the smallest limit one fits.

    Args:
        planned: the schedules simulated under ``memory_limit``.
        memory_limit: bytes per rank, or None (nothing to check).
        fits_under: ``fits_under(limit)``: whether a schedule built under ``limit`` (Adaptive: it holds
            fewer microbatches in flight under a tighter limit) keeps within it. Given, the message names
            the smallest such limit, found by bisection between ``memory_limit`` and the smallest peak
            planned (to 1%); without it, only that peak.

    Raises:
        ValueError: every simulated schedule's peak on some rank is above ``memory_limit``.
    """
    simulated = [item for item in planned if item.simulation is not None]
    if memory_limit is None or not simulated or any(item.fits_memory for item in simulated):
        return
    smallest = min(simulated, key=lambda item: max(item.simulation.peak_memory_bytes))  # type: ignore[union-attr]
    peak = max(smallest.simulation.peak_memory_bytes)  # type: ignore[union-attr]
    fitting, name = peak, smallest.name
    if fits_under is not None:
        low, high = float(memory_limit), float(peak)
        if fits_under(high):  # the bisection needs a limit that fits at its top
            while high - low > 0.01 * high:
                middle = (low + high) / 2
                low, high = (low, middle) if fits_under(middle) else (middle, high)
            if high < peak:
                fitting, name = math.ceil(high), "Adaptive, built under it"
    raise ValueError(
        f"no schedule fits the memory limit of {memory_limit:,.0f} bytes per rank: the smallest limit a "
        f"schedule fits is about {fitting:,} bytes ({fitting / 2**20:.2f} MiB, {name}); give "
        f"--memory-limit {fitting} or more"
    )


def simulate_schedule(
    name: str,
    ranks: int,
    microbatches: int,
    one: StageCost | Sequence[StageCost],
    two: StageCost | Sequence[StageCost],
    comm: CommModel,
    overhead: float,
    memory_limit: float | None,
) -> PlannedSchedule:
    """Simulate schedule ``name`` (canonical: PyTorch's or graphkit's generated) on ``ranks`` ranks: ``one``
    are the costs of one stage per rank, ``two`` of two (seconds, bytes); ``memory_limit`` bytes per rank.

    Raises:
        ScheduleError, ValueError: the schedule cannot be built or simulated with these costs.
    """
    single = is_generated(name) or is_single_stage(name)
    if is_generated(name):
        order = generated_order(name, ranks, microbatches, one, memory_limit, comm, overhead)
    else:
        order = schedule_order(name, ranks, microbatches)
    simulation = simulate(
        order, one if single else two, comm, microbatches=microbatches, name=name, overhead=overhead
    )
    fits = memory_limit is None or max(simulation.peak_memory_bytes) <= memory_limit
    return PlannedSchedule(name, 1 if single else 2, simulation, fits, order=order)


def free_split_ratio(plan: SchedulePlan) -> float | None:
    """CostAware's predicted step over 1F1B's with the plan's costs made free to split
    (:func:`~graphkit.pipelining.planning.cost_model.free_split`: I + W = B on every stage but the first),
    the plan's message model, runtime overhead and memory limit, all three simulated here under the same
    model (never above CostAware's ratio with the costs as measured); None on one rank or where it cannot
    be built. Below 1 by a margin: a cheaper split would pay; about 1: the bubble is too small for any."""
    if plan.ranks < 2:
        return None
    steps = []
    try:
        # 1F1B (which runs no split: the same under both costs), CostAware as the costs are, and freed
        for name, costs in (
            ("1F1B", plan.costs),
            ("CostAware", plan.costs),
            ("CostAware", free_split(plan.costs)),
        ):
            item = simulate_schedule(
                name, plan.ranks, plan.microbatches, costs, costs, plan.comm, plan.overhead, plan.memory_limit
            )
            steps.append(item.predicted_seconds)
    except (ScheduleError, ValueError):
        return None
    base, as_measured, freed = steps
    # a free split can do no worse than the dear one (the generator's search may end elsewhere)
    return min(as_measured, freed) / base if base else None


# --- presentation ---------------------------------------------------------------------------------------
def _cells(plan: SchedulePlan) -> tuple[list[str], list[list[str]]]:
    measured = any(item.measured_seconds is not None for item in plan.schedules)
    header = ["#", "schedule", "st/rank", "predicted ms", "vs 1F1B", "bubble", "peak MiB/rank", "msgs"]
    if measured:
        header += ["measured ms", "median round", "won", "pred/meas", "from rec. ms", "rec/meas"]
    body = []
    for position, row in enumerate(plan.rows(), 1):
        if row["error"] is not None:
            body.append([str(position), row["schedule"], str(row["stages_per_rank"]), row["error"]])
            continue
        peaks = "/".join(f"{value / 2**20:.1f}" for value in row["peak_memory_bytes"])
        cells = [
            str(position),
            row["label"] + ("" if row["fits_memory"] else " (over memory)"),
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
            won = row["rounds_won"]
            cells += [
                f"{m * 1e3:.2f}" if m is not None else "-",
                _ratio(row["median_round_vs_1f1b"]),
                f"{won[0]}/{won[1]}" if won and row["schedule"] != "1F1B" else "-",
                _ratio(row["predicted_step_seconds"] / m) if m else "-",
                f"{r * 1e3:.2f}" if r is not None else "-",
                _ratio(r / m) if r is not None and m else "-",
            ]
        body.append(cells)
    return header, body


def plan_table(plan: SchedulePlan) -> str:
    """The ranked table as plain text, under a line saying what was planned and with which model."""
    header, body = _cells(plan)
    # a not-planned row's reason runs on past the columns: only its first three cells set widths
    widths = [
        max(len(row[i]) for row in [header, *body] if i < len(row) and (i < 3 or len(row) == len(header)))
        for i in range(len(header))
    ]
    lines = [_title(plan)]
    lines.append("  ".join(cell.rjust(width) for cell, width in zip(header, widths, strict=True)))
    for row in body:
        if len(row) < len(header):  # not planned: the reason runs on from the schedule's columns
            named = [cell.rjust(width) for cell, width in zip(row[:3], widths, strict=False)]
            lines.append("  ".join([*named, *row[3:]]))
            continue
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    lines.append(_verdict(plan))
    return "\n".join(lines)


def _title(plan: SchedulePlan) -> str:
    limit = f", memory limit {plan.memory_limit:,.0f} B" if plan.memory_limit is not None else ""
    rows = (
        f" of {plan.batch_size // plan.microbatches} rows (batch {plan.batch_size}, --batch-size)"
        if plan.batch_size
        else ""
    )
    head = f"{plan.spec or 'costs'}: {plan.ranks} ranks, {plan.microbatches} microbatches{rows}{limit}; model"
    if plan.overhead_source.startswith("calibrated"):
        return f"{head} {plan.overhead_source}"
    return (
        f"{head}: messages {plan.comm.latency * 1e6:.0f} us"
        + (
            f" + bytes / {plan.comm.bandwidth / 1e9:.4g} GB/s"
            if math.isfinite(plan.comm.bandwidth)
            else " each"
        )
        + (" when received" if plan.comm.rendezvous else "")
        + f", runtime {plan.overhead * 1e6:.0f} us per action ({plan.overhead_source})"
    )


def _verdict(plan: SchedulePlan) -> str:
    best, base = plan.best, plan.baseline
    text = (
        f"best predicted: {best.name} ({best.predicted_seconds * 1e3:.2f} ms, "
        f"{_ratio(best.predicted_seconds / base.predicted_seconds)} of 1F1B)"
    )
    if base.measured_seconds is None:
        recommended = plan.recommended
        if recommended is base and best is not base:
            text += (
                f"\nrecommended: keep 1F1B - {best.name} is predicted within 1% of it, within the costs' noise "
                "(record both with --run to measure the difference)"
            )
        elif recommended is base:
            text += "\nrecommended: keep 1F1B - no schedule is predicted faster"
        else:
            text += (
                f"\nrecommended: {recommended.name} (the best predicted; --run records it against 1F1B)"
                + _memory_note(plan, recommended)
            )
    winner = plan.measured_best
    if winner is not None and base.measured_seconds:
        won, rounds = plan.rounds_won(winner)
        where = "rounds"
        median = f"{_ratio(plan.round_ratio(winner))} of 1F1B in the median round"
        if plan.decided_in_runoff(winner):  # its first rounds chose it
            won, rounds = plan.runoff_rounds_won(winner)
            where = "rounds of the run-off"
            median += f", {plan.runoff_ratio(winner) or math.inf:.3f}x in the run-off" + (
                " (the mean of its sets' median rounds)" if len(plan.runoff_sets()) > 1 else ""
            )
        text += (
            f"; best measured: {winner.name} (median step {winner.measured_seconds * 1e3:.2f} ms, {median}"
            + (
                f", faster in {won} of {rounds} {where}, p = {sign_test_p_value(won, rounds):.2g}"
                if winner is not base and rounds
                else ""
            )
            + ")"
        )
        recommended = plan.recommended
        if recommended is base:
            text += "\nrecommended: keep 1F1B - " + _none_beat_1f1b(plan)
            contender = plan.closest_contender()
            if contender is not None:
                (won, rounds), ratio, _ = plan.contest_rounds_won(contender)
                if plan.recorded_in_runoff(contender):  # the run-off's rounds alone
                    median = (
                        "its median round"
                        if len(plan.runoff_sets()) == 1
                        else "the mean of its sets' median rounds"
                    )
                    text += (
                        f"; closest (the largest share of rounds won, the run-off's alone for its finalists): "
                        f"{contender.name}, faster in {won} of the run-off's {rounds} rounds "
                        f"(p = {sign_test_p_value(won, rounds):.2g}), {_ratio(ratio)} in the run-off ({median})"
                    )
                else:
                    share = "most rounds won" if plan.runoff is None else "the largest share of rounds won"
                    text += (
                        f"; closest ({share}): {contender.name}, faster in {won} of {rounds} rounds "
                        f"(p = {sign_test_p_value(won, rounds):.2g}), {_ratio(ratio)} in the median round"
                    )
                text += _power_note(plan, contender)
        else:
            if is_generated(recommended.name) and recommended.csv is None:
                how = "plan with -o DIR to write the order built from these costs, then run csv:DIR/best.csv"
            else:
                how = f"run it as --schedule {recommended.run_name}"
            won, rounds = plan.rounds_won(recommended)
            level, where = plan.significance, "rounds"
            if plan.decided_in_runoff(recommended) or (
                not plan.won_beyond_chance(recommended) and plan.won_runoff_beyond_chance(recommended)
            ):
                # confirmed on the run-off's rounds alone, at the level split among its finalists
                won, rounds = plan.runoff_rounds_won(recommended)
                level, where = plan.runoff_significance or level, "rounds of the run-off"
            shown, bound = _apart(sign_test_p_value(won, rounds), level)
            text += (
                f"\nrecommended: {recommended.name} (faster than 1F1B in its median step, in the median round and "
                f"in {won} of {rounds} {where}: p = {shown} that chance did it, below {bound}; {how})"
                + _memory_note(plan, recommended)
            )
            if plan.shared_cores_warning:
                text += " - measured while other processes took CPU from the ranks: see the warning below"
        chosen = [item for item in plan.schedules if item.recorded_because]
        text += "\nrecorded (chosen by the prediction from the costs, before calibration): " + ", ".join(
            f"{item.name} ({item.recorded_because})" for item in chosen
        )
        text += _recording_notes(plan)
    text += "\n" + plan.zero_bubble_verdict()
    measured = plan.measured_overhead
    if measured and measured.get("between") is not None:
        inside = measured.get("inside")
        text += (
            f"\nruntime gaps recorded: median {measured['between'] * 1e6:.0f} us between actions "
            f"({measured['gaps']} gaps with nothing to wait for)"
            + (
                f", actions a median {abs(inside) * 1e6:.0f} us {'longer' if inside >= 0 else 'shorter'} than "
                "graphkit costs measured them"
                if inside is not None
                else ""
            )
            + f"; modelled (means, see the title): {plan.overhead * 1e6:.0f} us per action"
        )
    if plan.load:
        text += f"\nload while measuring: {plan.load}"
        if plan.load_warning:  # said in full before measuring (stderr, or a RuntimeWarning): a reminder here
            text += " - busier than the cores: rankings within the error warned of before measuring are not to be trusted"
    elif plan.load_warning:
        text += f"\nwarning: {plan.load_warning}"
    if plan.shared_cores_warning:
        text += f"\nwarning: {plan.shared_cores_warning}"
    return text


def _runoff_note(plan: SchedulePlan) -> str:
    """With a run-off (:meth:`SchedulePlan.runoff_finalists`): which schedules were recorded again, why, what
    they measured in those rounds alone and what it changed; one line starting a line, else ""."""
    runoff = plan.runoff
    if not runoff:
        return ""
    names = runoff["finalists"]
    listed = _listed(names)
    if len(names) == 1 and names[0] == runoff["first_pick"]:
        why = (
            f"\nrun-off: {listed}, the first run's pick, beat its placement's non-splitting schedule beyond the "
            "noise floor but not beyond chance: recorded again to decide whether zero bubble pays"
        )
    elif runoff["first_pick"] == plan.baseline.name:
        why = (
            f"\nrun-off: {listed} beat 1F1B in most rounds and beyond the noise floor, but not beyond chance at "
            "the level every recorded schedule shares: tested again on rounds of their own at "
            f"{SIGNIFICANCE:.2g} split among them ({SIGNIFICANCE / len(names):.2g})"
        )
    else:
        why = (
            f"\nrun-off: {listed} measured within {runoff['margin']:.1%} of {runoff['first_pick']}, the first "
            "run's pick, against 1F1B in the median round (the noise floor, at least "
            f"{RUNOFF_MARGIN:.0%}): too close for one run to order"
        )
    if "skipped" in runoff:
        return (
            why
            + f"; not recorded again, {runoff['skipped']}: "
            + (
                "1F1B is kept, though any of them may beat it"
                if runoff["first_pick"] == plan.baseline.name
                else "the pick may be any of them"
            )
        )
    finalists = [plan.by_name(name) for name in names]
    rounds = runoff["rounds"]

    sets = plan.runoff_sets()

    def figures(item: PlannedSchedule) -> str:
        won = "{} of {}".format(*plan.runoff_rounds_won(item))
        if len(sets) < 2:
            return f"{item.name} {_ratio(plan.runoff_ratio(item))} ({won})"
        each = ", ".join(f"{ratio:.3f}x" for ratio in plan.runoff_ratios(item))
        return f"{item.name} {plan.runoff_ratio(item) or math.inf:.3f}x ({won}; {each})"

    measured = ", ".join(
        figures(item) for item in sorted(finalists, key=lambda item: plan.runoff_ratio(item) or math.inf)
    )
    sized = f", {runoff['sized']}" if runoff.get("sized") else ""
    where = (
        f"in new processes, {rounds} more rounds{sized}"
        if len(sets) < 2
        else f"in {_count_word(len(sets))} sets of new processes ({_listed([str(size) for size in sets])} rounds: "
        f"{rounds} more rounds{sized}"
    )
    alone = (
        "in those alone against 1F1B"
        if len(sets) < 2
        else "in those alone against 1F1B, the mean of each set's median round (the rounds won; each set's)"
    )
    recommended = plan.recommended
    total = len(plan.baseline.measured_steps)
    if recommended.name in names:
        outcome = f"{recommended.name} is recommended (" + (
            f"the first run picked {runoff['first_pick']})"
            if recommended.name != runoff["first_pick"]
            else "as in the first run)"
        )
    else:
        outcome = "none of them did: " + (
            "keep 1F1B" if recommended is plan.baseline else f"{recommended.name} is recommended"
        )
    placements = list(runoff.get("placements") or [])
    return (
        why
        + "; recorded again with "
        + _listed(["1F1B", *placements])
        + (
            f" (their placement{'s' if len(placements) > 1 else ''}, for the zero-bubble line)"
            if placements
            else ""
        )
        + f" {where}"
        + (
            f", 1F1B's and theirs now count {total})"
            if len(sets) > 1
            else f" (1F1B's and theirs now count {total})"
        )
        + f", {alone}: {measured}; recommended: the best of them there that beat 1F1B beyond the noise floor "
        + (
            f"and beyond chance in the run-off's rounds alone (p < {plan.runoff_significance:.2g}; the first "
            "recording's rounds chose them, so they do not count again)"
            if plan.runoff_decides_alone
            else f"and beyond chance, over all {total} rounds or in the run-off's alone (p < "
            f"{plan.runoff_significance:.2g})"
        )
        + f": {outcome}"
        + _level_note(plan)
    )


def _level_note(plan: SchedulePlan) -> str:
    """Where the run-off's sets of processes could not order the fastest finalist and others
    (:meth:`SchedulePlan.runoff_level`): which, and that the one holding less memory is recommended; else ""."""
    recommended = plan.recommended
    level = plan.runoff_level()
    if len(level) < 2 or recommended not in level:
        return ""
    others = [item for item in level if item is not recommended]
    memory = ", ".join(
        f"{item.name} {peak_memory_bytes(item) / 2**20:.1f} MiB"
        for item in others
        if math.isfinite(peak_memory_bytes(item))
    )
    return (
        f"; {_listed([recommended.name, *(item.name for item in others)])} are level: the run-off's sets of "
        f"processes cannot tell them apart (t-test over the sets, p >= {SIGNIFICANCE:.2g}) and their means lie "
        f"within {LEVEL_MARGIN:.0%}, so which is faster can change from one set of processes, or one run, to "
        "the next"
        + (
            f"; {recommended.name} holds the least memory (predicted peak on the busiest rank "
            f"{peak_memory_bytes(recommended) / 2**20:.1f} MiB, against {memory})"
            if memory and math.isfinite(peak_memory_bytes(recommended))
            else ""
        )
    )


def _sets_disagree(by_set: list[float]) -> bool:
    """Whether the sets of processes disagree on whether a schedule beats another (``by_set``: its median
    round ratio to the other in each set): some measured it faster and some not. One set disagrees with
    nothing."""
    return len(by_set) > 1 and min(by_set) < 1.0 <= max(by_set)


def _by_set(by_set: list[float], first_sets: int) -> str:
    """The per-set figures of :meth:`SchedulePlan.ratio_by_process_set`, the first recording's
    ``first_sets`` first: "1.011x in the first recording's processes, 0.979x in the run-off's" (or "0.99x,
    1.01x and 0.98x in the first recording's three sets of processes, 0.98x, 0.97x and 0.99x in the
    run-off's three")."""
    first, runoff = by_set[:first_sets], by_set[first_sets:]
    text = _listed([f"{ratio:.3f}x" for ratio in first]) + (
        " in the first recording's processes"
        if len(first) == 1
        else f" in the first recording's {_count_word(len(first))} sets of processes"
    )
    if runoff:
        text += (
            ", "
            + _listed([f"{ratio:.3f}x" for ratio in runoff])
            + (" in the run-off's" if len(runoff) == 1 else f" in the run-off's {_count_word(len(runoff))}")
        )
    return text


def _count_word(count: int) -> str:
    return {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}.get(count, str(count))


def _geometric_mean(ratios: list[float]) -> float:
    """The ratios' geometric mean (what the t-test over their logarithms centres on)."""
    return math.exp(statistics.fmean(math.log(ratio) for ratio in ratios))


def _listed(names: list[str]) -> str:
    """``["a"]`` is "a", ``["a", "b"]`` "a and b", ``["a", "b", "c"]`` "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _none_beat_1f1b(plan: SchedulePlan) -> str:
    """Why 1F1B is kept: no schedule beat it by more than the noise floor in the median round, with a median
    step below 1F1B's, in more of its rounds than chance would give; with how many wins were enough for each
    count of rounds recorded. After a run-off held because 1F1B would be kept
    (:attr:`SchedulePlan.runoff_decides_alone`) its finalists had to win the run-off's own rounds, at its
    level; a schedule it recorded again for its placement has more rounds than the rest."""
    groups: dict[tuple[bool, int, float], None] = {}
    for item in plan.schedules:
        if item.measured_steps and item is not plan.baseline:
            if plan.decided_in_runoff(item):
                groups[(True, plan.runoff["rounds"], plan.runoff_significance or 0.0)] = None
            else:
                groups[(False, len(item.measured_steps), plan.significance)] = None
    if not groups:
        groups[(False, len(plan.baseline.measured_steps), plan.significance)] = None
    ordered = sorted(groups, key=lambda group: (not group[0], -group[1]))
    finalists = any(in_runoff for in_runoff, _, _ in ordered)
    others = any(not in_runoff for in_runoff, _, _ in ordered)
    if (
        not finalists
        and len(ordered) == 1
        and fewest_wins_beyond_chance(ordered[0][1], ordered[0][2]) is None
    ):
        _, rounds, level = ordered[0]
        fewest = next(
            count for count in itertools.count(rounds + 1) if fewest_wins_beyond_chance(count, level)
        )
        return (
            f"no schedule measured faster than 1F1B in enough rounds: {rounds} cannot tell a schedule from "
            f"chance at p < {level:.2g}, record {fewest} or more (--steps)"
        )
    terms = []
    for index, (in_runoff, rounds, level) in enumerate(ordered):
        wins = fewest_wins_beyond_chance(rounds, level)
        first_other = finalists and not in_runoff and ordered[index - 1][0]
        whose = "the run-off's finalists: " if in_runoff else ("the others: " if first_other else "")
        count = f"at least {wins} of" if wins is not None else "no count of"
        terms.append(f"{whose}{count} {'its ' if in_runoff else ''}{rounds} rounds at p < {level:.2g}")
    floor = plan.noise_floor
    return (
        "no schedule measured faster than 1F1B"
        + (f" by more than the noise floor ({floor:.1%})" if floor else "")
        + " in the median round, with a median step below 1F1B's, and in more rounds than chance would give "
        f"(sign test, {SIGNIFICANCE} split "
        + (
            "among the schedules recorded, and in the run-off among its finalists"
            if finalists and others
            else "in the run-off among its finalists"
            if finalists
            else "among the schedules recorded"
        )
        + "; wins needed: "
        + "; ".join(terms)
        + ")"
    )


def _power_note(plan: SchedulePlan, contender: PlannedSchedule) -> str:
    """Where 1F1B is kept but ``contender`` measured faster in most rounds: how many rounds a sign test
    would need, at the win fraction measured, to decide; empty otherwise."""
    (won, rounds), ratio, level = plan.contest_rounds_won(contender)
    if not rounds or 2 * won <= rounds:
        return ""
    if sign_test_p_value(won, rounds) < level:  # not the rounds: its median round or step did not beat 1F1B's
        why = (
            "its median step was not below 1F1B's"
            if plan.beyond_noise(ratio)
            else f"it measured {ratio:.3f}x 1F1B there, not below it by more than the noise floor "
            f"({plan.noise_floor or 0.0:.1%})"
        )
        return f"; its wins are already beyond chance (p < {level:.2g}): what kept 1F1B is that {why}"
    # --steps sets the first recording's rounds, tested at the level every recorded schedule shares
    needed = rounds_to_decide(won / rounds, plan.significance)
    fraction = f"{won} of {rounds}, {won / rounds:.0%}" + (
        ", in the run-off" if plan.recorded_in_runoff(contender) else ""
    )
    if needed is None:
        return (
            f"; at its win fraction ({fraction}) more than 5,000 rounds would be needed to decide: too close to "
            "tell on this machine"
        )
    return (
        f"; at its win fraction ({fraction}) a sign test at p < {plan.significance:.2g} would need about "
        f"{needed} rounds to decide (--steps {needed})"
    )


def _recording_notes(plan: SchedulePlan) -> str:
    """With ``run``: what was left out and why, the noise floor from the A/A control, how far the prediction
    that chose the recorded schedules was off, and W's own factor; one line each, each starting a line."""
    text = ""
    if plan.prediction_error is not None:
        budget = (
            f", within a budget of {plan.record_budget_s:.0f} s of recording (--record-budget)"
            if plan.record_budget_s is not None
            else ""
        )
        text += (
            f"\nrecorded every schedule predicted within {recording_band(plan.prediction_error):.0%} of the best "
            f"predicted, where two predictions each off by up to {plan.prediction_error:.0%} can swap order "
            f"({plan.prediction_error_source or '--prediction-error'}){budget}"
        )
        if plan.left_out:
            text += "; left out: " + "; ".join(f"{name} ({why})" for name, why in plan.left_out)
    if plan.auto_steps is not None:
        text += f"\n--steps auto recorded {plan.auto_steps}"
    sets = plan.first_recording_sets
    if len(sets) > 1:
        text += (
            f"\nfirst recording: {sum(sets)} rounds in {_count_word(len(sets))} sets of new processes "
            f"({_listed([str(size) for size in sets])} rounds), so that what one set's copies of the stages "
            "happen to get (memory, a quieter core) does not decide which schedules reach the run-off"
        )
    text += _runoff_note(plan) + _table_rounds_note(plan)
    command = plan.remeasure_command()
    if command is not None:
        text += f"\nto check the pick in a separate run (new processes; the pick holds where it measures within its precision line of the best, twice the comparison's standard error): {command}"
    floor = plan.noise_floor
    if floor is not None:
        copy = PlannedSchedule("1F1B", 1, None, measured_steps=plan.control_steps)
        won, rounds = plan.rounds_won(copy)
        text += (
            f"\nnoise floor: 1F1B recorded twice in the same rounds (A/A) measured "
            f"{plan.round_ratio(copy):.3f}x itself in the median round (the copy faster in {won} of {rounds}): "
            f"no difference within {floor:.1%} is called"
        )
    error = plan.selection_error
    if error is not None and plan.prediction_error is not None:
        worst = error["worst"]
        text += (
            f"\nthe prediction that chose them was off by a median {error['median']:.1%} and at worst "
            f"{worst:.1%} ({error['schedule']}) against the measured ratios to 1F1B: "
            + (
                f"within the {plan.prediction_error:.0%} the recording allowed for"
                if worst <= plan.prediction_error
                else f"beyond the {plan.prediction_error:.0%} the recording allowed for, so a schedule left out "
                "may be faster: "
                f"the next plan of this set-up allows each prediction {error_from_measured(worst):.0%} (remembered; "
                f"or give --prediction-error {error_from_measured(worst):.2f})"
            )
        )
    fitted = plan.fitted_slowdown
    if fitted is not None and fitted.get("other"):
        suggested = round(fitted["weight"] / fitted["other"], 2)  # W's factor over the other passes'
        text += (
            f"\nW in the pipeline: the recorded W ran {fitted['weight']:.2f}x its standalone cost, the other "
            f"passes {fitted['other']:.2f}x theirs (calibrated predictions give W its own factor)"
        )
        if abs(suggested - plan.weight_slowdown) > 0.05 * plan.weight_slowdown:
            text += (
                f"; CostAware was built with W at {plan.weight_slowdown:.2f}x the other passes: plan with "
                f"--weight-slowdown {suggested:.2f} to build it with the W it will meet"
            )
            rebuilt = plan.rebuilt_cost_aware
            if rebuilt is not None:
                text += (
                    " (it keeps the order recorded)"
                    if rebuilt["same_order"]
                    else f" (built so now it comes out another order, predicted "
                    f"{rebuilt['predicted_vs_1f1b']:.2f}x 1F1B against {rebuilt['recorded_predicted_vs_1f1b']:.2f}x "
                    "for the order recorded)"
                )
    return text


def _table_rounds_note(plan: SchedulePlan) -> str:
    """After a run-off: which rows of the table count which rounds (its measured ms, median round and won
    cover each schedule's own rounds, more for those recorded again); a line starting a line, else ""."""
    total = len(plan.baseline.measured_steps)
    again = [
        item.name for item in plan.schedules if item.measured_steps and len(item.measured_steps) == total
    ]
    first = {len(item.measured_steps) for item in plan.schedules if 0 < len(item.measured_steps) < total}
    if not plan.runoff_sets() or not first:
        return ""
    counts = _listed([str(count) for count in sorted(first)])
    return (
        f"\nin the table, measured ms, median round and won are over each schedule's own rounds: {total} for "
        f"{_listed(again)} (recorded again in the run-off), {counts} for the others (the first recording's "
        "alone); the run-off line compares its finalists on its rounds alone"
    )


def _memory_note(plan: SchedulePlan, item: PlannedSchedule) -> str:
    """A warning where ``item`` holds much more memory than 1F1B (GPipe keeps every microbatch's
    activations): speed is not all a pick costs; empty otherwise."""
    base = plan.baseline
    if item is base or item.simulation is None or base.simulation is None:
        return ""
    pairs = list(zip(item.simulation.peak_memory_bytes, base.simulation.peak_memory_bytes, strict=False))
    if not pairs or any(base_peak <= 0 for _, base_peak in pairs):
        return ""
    rank, (peak, base_peak) = max(enumerate(pairs), key=lambda pair: pair[1][0] / pair[1][1])
    if peak <= MEMORY_NOTE_RATIO * base_peak:
        return ""
    return (
        f"; note: on rank {rank} it holds {peak / base_peak:.1f}x 1F1B's peak memory ({peak / 2**20:.1f} against "
        f"{base_peak / 2**20:.1f} MiB): where memory is short, plan with --memory-limit BYTES to rule it out"
    )


def plan_html(plan: SchedulePlan) -> str:
    header, body = _cells(plan)
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
        f"<div><p>{html.escape(_title(plan))}</p><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table><p>{html.escape(_verdict(plan))}</p></div>"
    )


def what_if_table(rows: list[dict[str, Any]]) -> str:
    """:meth:`SchedulePlan.what_if`'s rows as plain text."""
    lines = [
        f"{'ranks':>5}  {'mb':>4}  {'schedule':<22}  {'step ms':>10}  {'vs 1F1B':>7}  {'bubble':>6}  {'rank-0 MiB':>10}"
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
            f"{row['bubble_fraction']:>6.1%}  {row['peak_memory_bytes_rank0'] / 2**20:>10.1f}"
        )
    return "\n".join(lines)


def _gain(ratio: float) -> str:
    """A median round ratio as a gain: 0.95 is "5.0%", 1.02 "-2.0% (slower)"."""
    if not math.isfinite(ratio):
        return "nothing measured"
    return f"{1 - ratio:.1%}" + (" (slower)" if ratio > 1 else "")


def _apart(value: float, level: float) -> tuple[str, str]:
    """A p-value and the level it is tested at, each to two significant figures, or to as many more as tell
    them apart: ``("0.0245", "0.025")``, where two figures would print 0.025 for both."""
    for digits in range(2, 10):
        shown, bound = f"{value:.{digits}g}", f"{level:.{digits}g}"
        if shown != bound:
            break
    return shown, bound


def _placement(item: PlannedSchedule) -> str:
    return {1: "one stage per rank", 2: "two stages per rank"}.get(item.stages_per_rank, "")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
