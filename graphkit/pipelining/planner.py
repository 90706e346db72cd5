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
a table, shows itself as HTML in a notebook and gives JSON. With ``run=True`` it records for real
(:func:`graphkit.pipelining.recording.record_schedules`, in rounds whose orders balance position and predecessor) what the prediction
cannot tell apart (:func:`graphkit.pipelining.record_selection.choose_recorded`: every schedule within
the prediction's error of the best, each splitting schedule's own placement, 1F1B twice as an A/A
control; then a run-off, in new processes, of what that recording could not decide), and adds the
measured step, the run's noise floor and a second prediction fed the recorded
per-action durations (which isolates what the runtime adds between actions). :meth:`SchedulePlan.what_if` simulates the same per-stage costs on more ranks
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

import json
import os
import statistics
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graphkit.measure import paired_rounds
from graphkit.measure.competing_load import (
    OtherProcesses,
    other_processes_warning,
    watching_other_processes,
)
from graphkit.measure.costs import spec_costs
from graphkit.measure.timing import busy_machine_warning, load_average, rounds_to_decide
from graphkit.models.specs import SpecError
from graphkit.pipelining.launcher import LaunchError, usable_cores
from graphkit.pipelining.planning import calibration, cost_model
from graphkit.pipelining.planning.actions import ScheduleError
from graphkit.pipelining.planning.calibration import (
    DEFAULT_COMM,
    DEFAULT_OVERHEAD,
    calibrate_runtime,
    predict_recorded,
    runtime_overhead,
)
from graphkit.pipelining.planning.cost_model import (
    CommModel,
    StageCost,
    costs_from_json,
    costs_from_measured,
    first_stage_as_run,
    merge_stage_costs,
    slowed,
)
from graphkit.pipelining.planning.registry import GENERATED_SCHEDULES, is_generated
from graphkit.pipelining.planning.simulator import simulate
from graphkit.pipelining.planning.timelines import ScheduleTimeline
from graphkit.pipelining.record_selection import (
    DEFAULT_PREDICTION_ERROR,
    DEFAULT_RECORD_BUDGET_S,
    RecordingChoice,
    choose_recorded,
)
from graphkit.pipelining.recording import following_rounds, record_schedules
from graphkit.pipelining.remembered_error import remember_error, remembered_error, setup_key
from graphkit.pipelining.schedule_plan import (
    BUILT_IN_SCHEDULES,
    PROCESS_SETS,
    RUNOFF_MARGIN,
    SIGNIFICANCE,
    PlannedSchedule,
    SchedulePlan,
    check_memory_limit,
    free_split_ratio,
    process_set_sizes,
    simulate_schedule,
)
from graphkit.pipelining.schedules import is_single_stage, schedule_name, stage_count

__all__ = [
    "AUTO_FIRST_ROUNDS",
    "AUTO_MOST_ROUNDS",
    "BUILT_IN_SCHEDULES",
    "RUNOFF_STANDARD_ERROR",
    "PlannedSchedule",
    "SchedulePlan",
    "plan_schedules",
]

AUTO_FIRST_ROUNDS = 15
"""With ``steps="auto"``, the rounds recorded first; then as many more as the closest schedule needs."""

AUTO_MOST_ROUNDS = 301
"""With ``steps="auto"``, the most rounds recorded (a 2-core machine records about 3 rounds a second of a
pipeline with 150 ms steps and six schedules: about 10 minutes)."""

AUTO_LEAST_ROUNDS = 5
"""With ``steps="auto"``, the fewest rounds recorded at once (each recording starts the ranks anew)."""

RUNOFF_STANDARD_ERROR = 0.01
"""A run-off records enough rounds (:func:`_runoff_rounds`) that the standard error of the difference
between two finalists' ratios to 1F1B comes down to this fraction of 1F1B's step: a finalist 2% faster
than the one the run-off puts first is then put behind it by chance about one time in 40. A model of 8
transformer blocks on 2 pinned ranks (150 ms steps) strays by about 8% of a step from round to round
between two finalists, so a run-off of 21 rounds (a standard error of 2.2%) picked schedules that a
separate run measured 2.4 and 2.8% behind the best: 101 rounds bring it to 1%."""


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
    steps: int | str = 15,
    top: int | None = None,
    output: str | os.PathLike[str] | None = None,
    threads: int = 1,
    timeout_s: float = 600.0,
    repeat: int = 10,
    pin_cores: bool = False,
    prediction_error: float | None = None,
    record_budget_s: float | None = DEFAULT_RECORD_BUDGET_S,
    control: bool = True,
    weight_slowdown: float = 1.0,
    runoff: bool = True,
    recording_sets: int = PROCESS_SETS,
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
        run: record for real, ``steps`` steps each in interleaved rounds (default 15; each round starts one
            schedule further on), on ``ranks`` gloo processes (one thread each), and add the measured steps:
            1F1B (twice with ``control``), the best zero-bubble schedule, every schedule predicted within
            :func:`~graphkit.pipelining.remembered_error.recording_band` of ``prediction_error`` (22% for
            10%) of the best predicted step while ``record_budget_s`` allows (at most
            ``top`` of them, None: no cap), and for each recorded schedule that splits its backwards the
            best non-splitting schedule of its placement
            (:func:`~graphkit.pipelining.record_selection.choose_recorded`); the plan says which it left
            out and why. ``steps="auto"``: record :data:`AUTO_FIRST_ROUNDS` rounds, then as many more as
            the schedule closest to beating 1F1B needs at its win fraction, until one is recommended, none
            won most rounds, it would take more than :data:`AUTO_MOST_ROUNDS`, or ``record_budget_s``
            seconds of recording pass (``plan.recording["auto"]`` says which).
        output: a folder for ``best.csv`` (the best schedule's order, for ``csv:PATH``), every generated
            schedule's CSV, ``plan.json`` and, with ``run``, ``recorded.json`` (the recorded steps).
        threads, timeout_s: of the recorded run. repeat: timed microbatches per pass when measuring costs.
        pin_cores: with ``run``, the recorded ranks each run on one CPU core (Linux; see
            :func:`~graphkit.pipelining.recording.record_schedules`): steadier measured steps on a CPU
            machine with a core per rank. The output's load line and ``plan.json`` (``recording``) say so.
        prediction_error: with ``run``, how far each prediction may be off (a fraction of its step);
            schedules within :func:`~graphkit.pipelining.remembered_error.recording_band` of it above the
            best predicted step are recorded. None: the largest worst error the last five ``run`` of the
            same set-up measured, at least 5% (:mod:`~graphkit.pipelining.remembered_error`), else
            :data:`~graphkit.pipelining.record_selection.DEFAULT_PREDICTION_ERROR`. Every run measures
            the error, says when it was larger than the band, and remembers it for the next plan.
        record_budget_s: with ``run``, seconds of recording (estimated from the predicted steps) that the
            schedules within ``prediction_error`` may take; None: no budget.
        control: with ``run``, record 1F1B a second time in the same rounds (an A/A control): the spread
            between the copies is the run's noise floor, and no smaller difference is called.
        recording_sets: with ``run``, the first recording's rounds are recorded in this many sets of new
            processes (new copies of the stages; :func:`~graphkit.pipelining.schedule_plan.process_set_sizes`,
            at least 5 rounds a set), so that what one set's copies happen to get does not decide which
            schedules reach the run-off (default :data:`~graphkit.pipelining.schedule_plan.PROCESS_SETS`;
            a run-off always records in that many).
        runoff: with ``run``, where one recording cannot decide (other schedules within 4%, or the noise
            floor, of the one that would be recommended; schedules that beat 1F1B in most rounds but not
            beyond chance; a splitting pick whose gain over its placement is not beyond chance), record
            those finalists again with 1F1B in new processes and recommend the best of them in those rounds
            (:meth:`SchedulePlan.runoff_finalists`, ``plan.runoff``).
        weight_slowdown: every W's seconds are multiplied by this before anything is simulated or built
            (CostAware, Adaptive): the factor a previous ``--run`` fitted for W in the pipeline, which it
            prints (default 1: W as ``graphkit costs`` measured it standalone).

    Returns:
        A :class:`SchedulePlan`, best first.

    Raises:
        ValueError: neither a pipeline nor costs, costs for a number of stages that does not fit,
            ``run`` without a pipeline spec, ``pin_cores`` where the platform cannot pin (checked first),
            ``steps`` neither a whole number of at least 1 nor ``"auto"``,
            ``prediction_error``, ``record_budget_s`` or ``top`` below 0, ``weight_slowdown`` not above 0,
            ``recording_sets`` below 1.
        graphkit.pipelining.recording.TimelineError: with ``run``, a recorded rank failed or the run
            passed ``timeout_s``.
    """
    if pipeline is None and costs is None:
        raise ValueError("plan_schedules needs a pipeline spec or costs")
    if run and not isinstance(pipeline, str):
        raise ValueError("run=True records the schedules: give the pipeline as a spec string")
    if ranks < 1 or microbatches < 1:
        raise ValueError(f"ranks and microbatches must be at least 1, got {ranks} and {microbatches}")
    if (
        (prediction_error is not None and prediction_error < 0)
        or (record_budget_s is not None and record_budget_s < 0)
        or (top is not None and top < 0)
    ):
        raise ValueError(
            "prediction_error, record_budget_s and top must be at least 0, got "
            f"{prediction_error}, {record_budget_s} and {top}"
        )
    if not weight_slowdown > 0:
        raise ValueError(f"weight_slowdown must be above 0, got {weight_slowdown}")
    if recording_sets < 1:
        raise ValueError(f"recording_sets must be at least 1, got {recording_sets}")
    if run and steps != "auto" and not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps must be a whole number of at least 1 or 'auto', got {steps!r}")
    if run and pin_cores and ranks > 1:
        try:
            usable_cores()  # refused now, not after minutes of measuring costs
        except LaunchError as error:
            raise ValueError(str(error)) from None
    batch_size = batch_size if batch_size is not None else 8 * microbatches
    load_warning = busy_machine_warning() if costs is None or run else ""
    if load_warning:
        warnings.warn(load_warning, RuntimeWarning, stacklevel=2)
    load = ""
    if costs is None:
        load = load_average()
        load = f"{load} (measuring costs)" if load else ""
        per_stage = _measure_costs(pipeline, ranks, microbatches, batch_size, repeat)  # type: ignore[arg-type]
    elif isinstance(costs, str | os.PathLike | dict):
        per_stage = costs_from_json(costs)
    else:
        per_stage = list(costs)
    measured_one, two = _per_layout(per_stage, ranks)
    one = first_stage_as_run(measured_one)
    two = first_stage_as_run(two) if two is not None else None
    if weight_slowdown != 1.0:  # W as the pipeline runs it (a factor an earlier run fitted)
        one = slowed(one, 1.0, weight_slowdown)
        two = slowed(two, 1.0, weight_slowdown) if two is not None else None
    calibrate = run and overhead is None and comm is None
    overhead_source = "given" if overhead is not None else "default: gloo on the CPU"
    overhead = DEFAULT_OVERHEAD if overhead is None else overhead
    comm = comm or DEFAULT_COMM
    names = list(schedules) if schedules is not None else [*BUILT_IN_SCHEDULES, *GENERATED_SCHEDULES]
    planned = [_plan_one(name, ranks, microbatches, one, two, comm, overhead, memory_limit) for name in names]
    _note_same_orders(planned)
    planned.sort(key=_rank_key)
    check_memory_limit(
        planned, memory_limit, lambda limit: _adaptive_fits(limit, ranks, microbatches, one, comm, overhead)
    )
    folder = Path(output) if output is not None else None  # without a folder nothing is written
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        for item in planned:
            if item.simulation is not None and item.order is not None and is_generated(item.name):
                path = folder / f"{item.name.lower()}.csv"
                item.order.write_csv(path)
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
        load_warning=load_warning,
        load=load,
        weight_slowdown=weight_slowdown,
        batch_size=batch_size if isinstance(pipeline, str) else None,
    )
    _write_best(plan, folder)
    if run:
        key = setup_key(pipeline, ranks, microbatches, batch_size, threads, pin_cores)  # type: ignore[arg-type]
        error, plan.prediction_error_source = _prediction_error(prediction_error, key)
        _run(
            plan,
            pipeline,  # type: ignore[arg-type]
            batch_size,
            steps,
            folder,
            threads,
            timeout_s,
            pin_cores,
            choose_recorded(
                plan.schedules,
                plan.baseline,
                steps=AUTO_FIRST_ROUNDS if steps == "auto" else int(steps),
                prediction_error=error,
                budget_s=record_budget_s,
                top=top,
                control=control,
            ),
            runoff=runoff,
            recording_sets=recording_sets,
        )
        if plan.selection_error is not None:
            remember_error(key, plan.selection_error["worst"], plan.selection_error["schedule"])
        if calibrate:
            _calibrate(plan, two)
        _write_best(plan, folder)  # what measured fastest, now
    plan.free_split_vs_1f1b = free_split_ratio(plan)
    if folder is not None:
        (folder / "plan.json").write_text(plan.to_json())
    return plan


def _add_watched(total: OtherProcesses, more: OtherProcesses) -> OtherProcesses:
    """Other processes' use over two recordings (``--steps auto`` records several), weighted by their
    wall times."""
    if more.cores is None:
        return total
    if total.cores is None or not total.seconds:
        return more
    seconds = total.seconds + more.seconds
    return OtherProcesses((total.cores * total.seconds + more.cores * more.seconds) / seconds, seconds)


def _prediction_error(prediction_error: float | None, key: str) -> tuple[float, str]:
    """The error ``plan --run`` allows each prediction when it chooses what to record (a fraction of the
    step; it records within :func:`~graphkit.pipelining.remembered_error.recording_band` of it) and where it
    came from, in words for the plan's output: given, remembered for ``key``, or the default."""
    if prediction_error is not None:
        return prediction_error, "--prediction-error"
    remembered = remembered_error(key)
    if remembered is not None:
        return remembered
    return DEFAULT_PREDICTION_ERROR, (
        "the default: no earlier run of this plan measured its error; --prediction-error to set"
    )


def _measure_costs(
    pipeline: str, ranks: int, microbatches: int, batch_size: int, repeat: int
) -> list[StageCost]:
    """The pipeline's per-stage costs measured at ``2 x ranks`` stages, or ``ranks`` where it cannot be cut
    so finely (then only the one-stage-per-rank schedules are planned)."""
    for num_stages in (2 * ranks, ranks):
        try:
            measured = spec_costs(
                pipeline,
                pipeline=True,
                num_stages=num_stages,
                batch_size=batch_size,
                microbatches=microbatches,
                repeat=repeat,
            )
        except SpecError:  # a model too small for two stages per rank
            if num_stages == ranks:
                raise
            continue
        return costs_from_measured(measured.stages)
    raise AssertionError("unreachable")


def _per_layout(per_stage: list[StageCost], ranks: int) -> tuple[list[StageCost], list[StageCost] | None]:
    """The costs of one stage per rank and, where they can be had, of two stages per rank.

    Raises:
        ValueError: a number of stages that does not fit ``ranks``.
    """
    if len(per_stage) == 2 * ranks:
        return merge_stage_costs(per_stage, ranks), list(per_stage)
    if len(per_stage) == ranks:
        return list(per_stage), None
    if len(per_stage) % ranks == 0:
        two = merge_stage_costs(per_stage, 2 * ranks) if len(per_stage) % (2 * ranks) == 0 else None
        return merge_stage_costs(per_stage, ranks), two
    raise ValueError(
        f"costs for {len(per_stage)} stages do not fit {ranks} ranks: give {ranks} or {2 * ranks} stages"
    )


def _plan_one(
    name: str,
    ranks: int,
    microbatches: int,
    one: list[StageCost],
    two: list[StageCost] | None,
    comm: CommModel,
    overhead: float,
    memory_limit: float | None,
) -> PlannedSchedule:
    """One schedule simulated, or the reason it could not be."""
    try:
        canonical = schedule_name(name)
        if two is None and not (is_generated(canonical) or is_single_stage(canonical)):
            raise ValueError(f"needs costs of {2 * ranks} stages")
        return simulate_schedule(
            canonical, ranks, microbatches, one, two or one, comm, overhead, memory_limit
        )
    except (ScheduleError, ValueError, RuntimeError, AssertionError) as error:
        try:
            per_rank = stage_count(name, ranks) // ranks
        except (ScheduleError, ValueError):
            per_rank = 0  # a name that does not resolve: no layout to show
        return PlannedSchedule(name, per_rank, None, False, error=f"not planned: {error}")


def _rank_key(item: PlannedSchedule) -> tuple[bool, float, bool]:
    """Schedules within the memory limit first, then by predicted step; a generated schedule that came out
    as 1F1B's order after 1F1B."""
    return (not item.fits_memory, item.predicted_seconds, item.same_order_as is not None)


def _note_same_orders(planned: list[PlannedSchedule]) -> None:
    """Mark each generated schedule whose order came out as another's: 1F1B's (``CostAware`` where no split
    pays), or that of a schedule listed before it (``Adaptive``'s search often lands on ``ZBH2``'s or
    ``ZBH1``'s order, and ``CostAware`` on either). It is that schedule: it is not recorded again (two copies
    of one order would only split the rounds' noise between them), and it shares that one's prediction."""
    base = next((item for item in planned if item.name == "1F1B" and item.order is not None), None)
    seen: list[tuple[dict[int, list[str]], str]] = []
    for item in sorted(planned, key=lambda item: item is not base):  # 1F1B's order first, then in order
        if item.order is None:
            continue
        labels = item.order.labels()
        match = next((name for other, name in seen if other == labels), None)
        if match is not None and is_generated(item.name):
            item.same_order_as = match
        elif match is None:
            seen.append((labels, item.name))


def _adaptive_fits(
    limit: float, ranks: int, microbatches: int, one: list[StageCost], comm: CommModel, overhead: float
) -> bool:
    """Whether the Adaptive schedule built under ``limit`` bytes per rank keeps within it."""
    try:
        item = simulate_schedule("Adaptive", ranks, microbatches, one, one, comm, overhead, limit)
    except (ScheduleError, ValueError):
        return False
    return item.fits_memory


def _write_best(plan: SchedulePlan, folder: Path | None) -> None:
    """The recommended schedule's order as ``best.csv`` in ``folder`` (None: nothing is written)."""
    recommended = plan.recommended
    if folder is not None and recommended.simulation is not None and recommended.order is not None:
        recommended.order.write_csv(folder / "best.csv")


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
        fitted = calibrate_runtime(peers, by_count)
        costs = one if item.stages_per_rank == 1 else two or one
        item.simulation = simulate(
            item.order,
            slowed(costs, fitted.slowdown, fitted.weight_factor),
            fitted.comm,
            microbatches=plan.microbatches,
            name=item.name,
            overhead=fitted.overhead,
        )
        item.simulation.step_seconds += fitted.step_overhead
        item.fits_memory = (
            plan.memory_limit is None or max(item.simulation.peak_memory_bytes) <= plan.memory_limit
        )
    for item in plan.schedules:
        if item.same_order_as is not None:  # the same order: the same prediction
            same = plan.by_name(item.same_order_as)
            item.simulation, item.fits_memory = same.simulation, same.fits_memory
    plan.schedules.sort(key=_rank_key)
    pooled = calibrate_runtime(list(recorded.values()), by_count)
    plan.comm, plan.overhead = pooled.comm, pooled.overhead
    if pooled.weight_slowdown is not None:  # relative to the costs as planned (W x plan.weight_slowdown)
        plan.fitted_slowdown = {
            "weight": pooled.weight_slowdown * plan.weight_slowdown,
            "other": pooled.slowdown,
        }
        plan.rebuilt_cost_aware = _rebuilt_cost_aware(
            plan, slowed(one, pooled.slowdown, pooled.weight_factor), pooled.step_overhead
        )
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


def _rebuilt_cost_aware(
    plan: SchedulePlan, calibrated: Sequence[StageCost], step_overhead: float
) -> dict[str, Any] | None:
    """CostAware built again from ``calibrated`` costs (W at its own fitted factor) and the calibrated
    runtime: ``{"same_order": whether it is the order recorded, "predicted_vs_1f1b": its predicted step
    over 1F1B's}``; None where CostAware was not recorded or cannot be built."""
    try:
        recorded = plan.by_name("CostAware")
    except KeyError:
        return None
    if not recorded.measured_steps or recorded.order is None or not plan.baseline.predicted_seconds:
        return None
    try:
        rebuilt = simulate_schedule(
            "CostAware",
            plan.ranks,
            plan.microbatches,
            calibrated,
            calibrated,
            plan.comm,
            plan.overhead,
            plan.memory_limit,
        )
    except (ScheduleError, ValueError):
        return None
    return {
        "same_order": rebuilt.order is not None and rebuilt.order.labels() == recorded.order.labels(),
        "predicted_vs_1f1b": (rebuilt.predicted_seconds + step_overhead) / plan.baseline.predicted_seconds,
        "recorded_predicted_vs_1f1b": recorded.predicted_seconds / plan.baseline.predicted_seconds,
    }


def _run(
    plan: SchedulePlan,
    pipeline: str,
    batch_size: int,
    steps: int | str,
    output: Path | None,
    threads: int,
    timeout_s: float,
    pin_cores: bool,
    choice: RecordingChoice,
    runoff: bool = True,
    recording_sets: int = PROCESS_SETS,
) -> None:
    """Record what ``choice`` chose (and 1F1B a second time, the A/A control, where it says so); fill in
    measured steps (every round's), recorded-fed predictions, the control's steps, what was left out and
    how far the prediction that chose them was off. With ``runoff``, record the schedules too close to the
    pick to tell apart again (:func:`_record_runoff`)."""
    chosen = choice.chosen
    control = choice.control
    plan.left_out = list(choice.left_out)
    plan.prediction_error, plan.record_budget_s = choice.prediction_error, choice.budget_s
    load_before = load_average()
    auto = steps == "auto"
    runnables = [item.runnable for item in chosen] + (["1F1B"] if control else [])
    started = time.monotonic()
    rounds = AUTO_FIRST_ROUNDS if auto else int(steps)
    timelines: list[ScheduleTimeline] = []
    others = OtherProcesses()
    plan.first_recording_sets = []
    while True:
        for size in paired_rounds.process_set_sizes(rounds, recording_sets):  # each set in new processes
            recorded, watched = _record_watched(
                plan, pipeline, runnables, size, batch_size, threads, timeout_s, pin_cores
            )
            others = _add_watched(others, watched)
            timelines = following_rounds(timelines, recorded)
            plan.first_recording_sets.append(size)
        _fill_measured(plan, chosen, timelines, control)
        if not auto:
            break
        done = len(plan.baseline.measured_steps)
        elapsed = time.monotonic() - started
        rounds, why = _auto_rounds(plan, done, elapsed, choice.budget_s)
        if not rounds:
            plan.auto_steps = f"{done} rounds: {why}"
            break
    if runoff:
        finalists = plan.runoff_finalists()
        if finalists:
            watched = _record_runoff(
                plan,
                finalists,
                pipeline,
                batch_size=batch_size,
                control=control,
                threads=threads,
                timeout_s=timeout_s,
                pin_cores=pin_cores,
                budget_left_s=None
                if choice.budget_s is None
                else choice.budget_s - (time.monotonic() - started),
            )
            others = _add_watched(others, watched)
    plan.load = (
        f"{plan.load}; " if plan.load else ""
    ) + f"{load_before} before recording, {load_average()} after"
    if others.cores is not None:
        plan.other_processes_cores = others.cores
        plan.load += f"; {others.describe()}"
        plan.shared_cores_warning = other_processes_warning(others)
    plan.recording = {
        "steps": len(plan.baseline.measured_steps) if auto else steps,
        "threads": threads,
        "pin_cores": pin_cores,
        "timeout_s": timeout_s,
    }
    if auto:
        plan.recording["auto"] = plan.auto_steps
    if pin_cores:
        plan.load += "; each rank pinned to one core" + (
            " (ranks sharing cores: fewer cores than ranks)" if plan.ranks > len(usable_cores()) else ""
        )
    by_count: dict[int, Sequence[StageCost]] = {plan.ranks: plan.costs}
    if plan.stage_costs is not None:
        by_count[2 * plan.ranks] = plan.stage_costs
    if control:
        timelines.pop()  # the A/A copy: its steps are plan.control_steps
    plan.measured_overhead = runtime_overhead(timelines, by_count)
    for item, timeline in zip(chosen, timelines, strict=True):
        item.recorded_prediction_seconds = predict_recorded(timeline, comm=plan.comm).step_seconds
    plan.selection_error = _selection_error(plan, chosen)
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


def _record_watched(
    plan: SchedulePlan,
    pipeline: str,
    runnables: Sequence[Any],
    rounds: int,
    batch_size: int,
    threads: int,
    timeout_s: float,
    pin_cores: bool,
) -> tuple[list[ScheduleTimeline], OtherProcesses]:
    """``rounds`` rounds of ``runnables`` on the plan's ranks and microbatches (:func:`record_schedules`),
    and what other processes used of the CPU meanwhile."""
    with watching_other_processes() as watched:
        timelines = record_schedules(
            pipeline,
            runnables,
            microbatches=plan.microbatches,
            ranks=plan.ranks,
            threads=threads,
            timeout_s=timeout_s,
            steps=rounds,
            batch_size=batch_size,
            pin_cores=pin_cores,
        )
    return timelines, watched


def _record_runoff(
    plan: SchedulePlan,
    finalists: Sequence[PlannedSchedule],
    pipeline: str,
    *,
    batch_size: int,
    control: bool,
    threads: int,
    timeout_s: float,
    pin_cores: bool,
    budget_left_s: float | None,
) -> OtherProcesses:
    """Record ``finalists`` (:meth:`SchedulePlan.runoff_finalists`), the non-splitting schedule of each
    splitting finalist's placement (:meth:`SchedulePlan.placement_baseline`, where it is not 1F1B), 1F1B and,
    with ``control``, 1F1B again, as many rounds as :func:`_runoff_rounds` says (what ordering the
    finalists, or deciding against 1F1B, needs), split into sets (:func:`process_set_sizes`), each in new processes (new copies of the stages, a new process group), and
    add their rounds after the first ones: 1F1B's, the control's and the finalists' lists grow, the other
    schedules' keep the first recording's rounds (paired with 1F1B's first ones). The recommendation then
    orders the finalists by these rounds alone, each set alike (:attr:`SchedulePlan.recommended`).
    Skipped, and said in ``plan.runoff``, where its estimate (the measured steps) passes ``budget_left_s``.
    Returns what other processes used of the CPU meanwhile."""
    base = plan.baseline
    first_rounds = len(base.measured_steps)
    names = [item.name for item in finalists]
    first_pick = plan.recommended.name
    margin = max(plan.noise_floor or 0.0, RUNOFF_MARGIN)
    # each splitting finalist's own placement (its best non-splitting schedule recorded) runs beside it
    # again, so that the zero-bubble line compares them over the run-off's rounds too
    partners: list[PlannedSchedule] = []
    for item in finalists:
        partner = plan.placement_baseline(item) if item.splits_backward else None
        if (
            partner is not None
            and partner is not base
            and partner not in finalists
            and partner not in partners
        ):
            partners.append(partner)
    recorded = [*finalists, *partners]
    recorded_seconds = sum(item.measured_seconds or 0.0 for item in recorded)
    recorded_seconds += (2 if control else 1) * (base.measured_seconds or 0.0)
    rounds, sized = _runoff_rounds(plan, finalists, first_rounds, recorded_seconds, budget_left_s)
    sets = process_set_sizes(rounds)
    estimate = (rounds + len(sets)) * recorded_seconds  # a round's worth to start each set
    if budget_left_s is not None and estimate > budget_left_s:
        plan.runoff = {
            "finalists": names,
            "first_pick": first_pick,
            "margin": margin,
            "skipped": f"recording them again (about {estimate:.0f} s) would pass the --record-budget",
        }
        return OtherProcesses()
    runnables = [item.runnable for item in recorded] + ["1F1B"] + (["1F1B"] if control else [])
    timelines: list[ScheduleTimeline] = []
    watched = OtherProcesses()
    for size in sets:  # each set in new processes: what one set adds to a ratio, the next may not
        more, seen = _record_watched(
            plan, pipeline, runnables, size, batch_size, threads, timeout_s, pin_cores
        )
        timelines = following_rounds(timelines, more)
        watched = _add_watched(watched, seen)
    for item, timeline in zip([*recorded, base], timelines, strict=False):
        item.measured_steps = list(item.measured_steps) + list(timeline.ranks[0].step_times)
        ordered = sorted(item.measured_steps)
        item.measured_seconds = ordered[(len(ordered) - 1) // 2]
    if control:
        plan.control_steps = list(plan.control_steps) + list(timelines[-1].ranks[0].step_times)
    plan.runoff = {
        "finalists": names,
        "rounds": rounds,
        "sized": sized,
        "sets": sets,
        "first_pick": first_pick,
        "margin": margin,
        "placements": [item.name for item in partners],
    }
    return watched


def _runoff_rounds(
    plan: SchedulePlan,
    finalists: Sequence[PlannedSchedule],
    first_rounds: int,
    recorded_seconds: float,
    budget_left_s: float | None,
) -> tuple[int, str]:
    """How many rounds a run-off records, and why: the most of

    - the first recording's rounds;
    - with two finalists or more, as many as bring the standard error of two finalists' difference down to
      :data:`RUNOFF_STANDARD_ERROR` at the spread the first recording measured between them round by round
      (:func:`~graphkit.measure.paired_rounds.round_spread`,
      :func:`~graphkit.measure.paired_rounds.rounds_for_standard_error`), at most :data:`AUTO_MOST_ROUNDS`;
    - where 1F1B would be kept (the run-off is to decide whether any finalist beats it), as many as a sign
      test at the run-off's level would need at the win fraction of the finalist that won the largest
      share of the first recording's rounds (:func:`~graphkit.measure.timing.rounds_to_decide`), unless
      more than :data:`AUTO_MOST_ROUNDS` would (a coin, nearly);

    as far as ``budget_left_s`` leaves at ``recorded_seconds`` a round. Fixed before the run-off records
    anything, from rounds it does not test again: one look at its rounds, not a test repeated until it
    passes."""
    needs: list[tuple[int, str]] = []  # (rounds needed, what needs them, "{needs}" where the verb goes)
    first_sets = [end - start for start, end in plan.process_sets()]  # no run-off yet: the first recording's
    spread = (
        paired_rounds.round_spread([item.measured_steps[:first_rounds] for item in finalists], first_sets)
        if len(finalists) >= 2
        else None
    )
    if spread is not None:
        needs.append(
            (
                paired_rounds.rounds_for_standard_error(spread, RUNOFF_STANDARD_ERROR),
                f"a standard error of {RUNOFF_STANDARD_ERROR:.0%} between two finalists {{needs}} at the "
                f"{spread:.1%} by which a round's difference between them strayed in the first recording",
            )
        )
    if plan.recommended is plan.baseline and finalists:
        level = SIGNIFICANCE / len(finalists)
        best = max(finalists, key=lambda item: _win_fraction(plan.rounds_won(item)))
        won, total = plan.rounds_won(best)
        decide = rounds_to_decide(won / total, level) if total else None
        if decide is not None and decide <= AUTO_MOST_ROUNDS:
            needs.append(
                (
                    decide,
                    f"a sign test at {level:.2g} {{needs}} at {best.name}'s win fraction in the first "
                    f"recording ({won} of {total})",
                )
            )
    if not needs:
        return first_rounds, ""
    needed, why = max(needs)
    rounds = min(needed, AUTO_MOST_ROUNDS)
    limit = f"at most {AUTO_MOST_ROUNDS}"
    if budget_left_s is not None and recorded_seconds > 0:
        fits = int(budget_left_s / recorded_seconds) - PROCESS_SETS  # a round's worth to start each set
        if fits < rounds:
            rounds, limit = fits, "as many as the --record-budget leaves"
    if rounds <= first_rounds:
        return first_rounds, ""
    if rounds == needed:
        return rounds, "as many as " + why.format(needs="needs")
    return rounds, f"{limit} (" + why.format(needs=f"would need about {needed}") + ")"


def _win_fraction(won_of: tuple[int, int]) -> float:
    won, total = won_of
    return won / total if total else 0.0


def _fill_measured(
    plan: SchedulePlan, chosen: Sequence[PlannedSchedule], timelines: list[ScheduleTimeline], control: bool
) -> None:
    """Every recorded round's step into ``chosen`` (and the A/A copy's, the last timeline with ``control``,
    into ``plan.control_steps``); the measured step is the median round's (the lower of two middles)."""
    for item, timeline in zip(chosen, timelines, strict=False):
        item.measured_steps = list(timeline.ranks[0].step_times) if timeline.ranks else []
        ordered = sorted(item.measured_steps)
        item.measured_seconds = ordered[(len(ordered) - 1) // 2] if ordered else timeline.step_seconds
    if control and len(timelines) == len(chosen) + 1 and timelines[-1].ranks:
        plan.control_steps = list(timelines[-1].ranks[0].step_times)


def _auto_rounds(plan: SchedulePlan, done: int, elapsed: float, budget_s: float | None) -> tuple[int, str]:
    """With ``--steps auto``, after ``done`` rounds that took ``elapsed`` seconds: how many more rounds to
    record (0: stop), and why. Stops when a schedule is recommended, when no schedule won most rounds
    against 1F1B, when the closest one would need more than :data:`AUTO_MOST_ROUNDS` rounds
    (:meth:`SchedulePlan.rounds_to_decide`), or when ``budget_s`` seconds of recording would be passed
    (at the rounds' pace so far); else records up to the rounds the closest one needs."""
    recommended = plan.recommended
    if recommended is not plan.baseline:
        return 0, f"decided, {recommended.name} beat 1F1B beyond chance"
    contender = plan.closest_contender()
    if contender is None or 2 * plan.rounds_won(contender)[0] <= plan.rounds_won(contender)[1]:
        return 0, "decided, no schedule was faster than 1F1B in most rounds"
    needed = plan.rounds_to_decide(contender)
    if needed is None or needed > AUTO_MOST_ROUNDS:
        return 0, (
            f"undecided, {contender.name} would need more than {AUTO_MOST_ROUNDS} rounds at its win fraction"
        )
    more = max(needed - done, AUTO_LEAST_ROUNDS)
    if budget_s is not None and done:
        fits = int((budget_s - elapsed) / (elapsed / done))  # the recordings' start-up counted in the pace
        if fits < AUTO_LEAST_ROUNDS:
            return 0, f"undecided, the --record-budget of {budget_s:.0f} s ran out"
        more = min(more, fits)
    return min(more, AUTO_MOST_ROUNDS - done), ""


def _selection_error(plan: SchedulePlan, chosen: Sequence[PlannedSchedule]) -> dict[str, Any] | None:
    """How far the prediction that chose ``chosen`` (before calibration) was from what they measured, as
    ratios to 1F1B: each schedule's predicted ratio over its median round ratio, less 1 (absolute); the
    median and the worst, and which schedule that was. None with fewer than one schedule besides 1F1B."""
    base = plan.baseline
    errors = []
    for item in chosen:
        measured = plan.round_ratio(item)
        if item is base or measured is None or not measured > 0 or not base.predicted_seconds:
            continue
        errors.append((abs(item.predicted_seconds / base.predicted_seconds / measured - 1.0), item.name))
    if not errors:
        return None
    worst, name = max(errors)
    return {"median": statistics.median(error for error, _ in errors), "worst": worst, "schedule": name}


_MOVED = {
    **{name: calibration for name in calibration.__all__},
    **{name: cost_model for name in ("costs_from_json", "first_stage_as_run", "merge_stage_costs", "slowed")},
}


def __getattr__(name: str) -> object:
    """The cost arithmetic and the runtime calibration moved to ``graphkit.pipelining.planning``; their old
    names here still work for one release, with a DeprecationWarning."""
    if name in _MOVED:
        import warnings

        module = _MOVED[name]
        warnings.warn(
            f"graphkit.pipelining.planner.{name} moved to {module.__name__}.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
