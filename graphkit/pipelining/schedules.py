"""The one schedule vocabulary of graphkit: names, classes, stage placement, stage counts, building.

Every ``torch.distributed.pipelining`` schedule is known by its class name without the ``Schedule`` prefix,
case ignored (``1F1B``, ``GPipe``, ``Interleaved1F1B``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``,
``DualPipeV``, ...), plus graphkit's own, all run by ``_PipelineScheduleRuntime`` from a compute-only CSV file (loaded with
``_load_csv`` as a user's CSV schedule would be), with separate I and W actions:

- ``CSV``: a simple deadlock-free order over several stages per rank (:func:`io_schedule_rows`);
- ``ZBH1``, ``ZBH2``: the ZB paper's handcrafted schedules, one stage per rank (1F1B's placement and
  messages; :mod:`graphkit.pipelining.planning.generation`);
- ``Adaptive``: the ZB paper's adaptive scheduler (:func:`~graphkit.pipelining.planning.adaptive_schedule`)
  with F, I and W costing the same and no memory limit; ``graphkit plan`` builds it from measured costs and a
  memory limit and passes that order down as it is (and writes it as a CSV, which ``csv:PATH`` runs);
- ``CostAware``: full backwards B where nothing waits on them, I then W where an early I pays
  (:func:`~graphkit.pipelining.planning.cost_aware_schedule`) with F = I = W = 1 and a full backward of 1.5
  (the split a third dearer than B); ``graphkit plan`` builds it from measured costs;
- ``csv:PATH``: a user's CSV file (its stage placement is read from the file);
- a :class:`~graphkit.pipelining.planning.actions.ScheduleOrder`: a schedule as data, run as it is.

The generated ones come from the one registry, :mod:`graphkit.pipelining.planning.registry`. A ``csv:PATH``
name is read once, into a :class:`~graphkit.pipelining.planning.actions.ScheduleOrder`, by
:func:`resolve_schedule`; every function here takes the name, the class or the order.

Where the stages live (as PyTorch's own ``generate_stage_to_rank_mapping`` places them):

- single-stage schedules (``GPipe``, ``1F1B``) and the generated ones (``ZBH1``, ``ZBH2``, ``Adaptive``,
  ``CostAware``): one stage per rank, stage ``s`` on rank ``s``;
- V-shaped schedules (``ZBVZeroBubble``, ``DualPipeV``): two stages per rank, stage ``s`` on rank ``s`` for
  ``s < ranks`` and on ``2 * ranks - 1 - s`` after;
- the other multi-stage (looped) schedules and ``CSV``: ``stages_per_rank`` stages per rank (default two),
  stage ``s`` on rank ``s % ranks``.

Errors: an unknown name raises :class:`UnknownScheduleError` (a ``ValueError``) whose message lists the
known names.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.distributed.pipelining import schedules as torch_schedules

from graphkit.pipelining.planning.actions import ScheduleOrder
from graphkit.pipelining.planning.generation import gpipe, one_f_one_b
from graphkit.pipelining.planning.registry import GENERATED_SCHEDULES, generated_order, is_generated

__all__ = [
    "GENERATED_SCHEDULES",
    "SCHEDULE_NAMES",
    "UnknownScheduleError",
    "build_schedule",
    "check_microbatches",
    "check_ranks",
    "common_stage_count",
    "io_schedule_rows",
    "is_single_stage",
    "resolve_schedule",
    "schedule_class",
    "schedule_name",
    "schedule_order",
    "stage_count",
    "stage_indices",
]

Schedule = str | type | ScheduleOrder
"""What names a schedule here: a name, a ``torch.distributed.pipelining`` class, or a parsed order."""

SCHEDULE_NAMES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", "CSV")
"""The schedules with separate I and W actions over several stages per rank, whose W graphkit's split runs
(``csv:PATH`` too); ``GENERATED_SCHEDULES`` (:mod:`graphkit.pipelining.planning.registry`) are the ones with
one stage per rank."""

_V_SHAPED = frozenset({"ZBVZeroBubble", "DualPipeV"})


class UnknownScheduleError(ValueError):
    """A schedule name that neither ``torch.distributed.pipelining`` nor graphkit knows."""


def _known_names() -> list[str]:
    """Every schedule name: PyTorch's registered schedule classes (their names without ``Schedule``) and CSV."""
    names = [
        cls.__name__.removeprefix("Schedule")
        for cls in torch_schedules.__dict__.values()
        if _is_schedule(cls)
    ]
    return sorted(set(names) | {"CSV", *GENERATED_SCHEDULES}, key=str.lower)


def _is_schedule(value: Any) -> bool:
    return (
        isinstance(value, type)
        and issubclass(value, torch_schedules._PipelineSchedule)
        and value.__name__.startswith("Schedule")
    )


def schedule_name(name: Schedule) -> str:
    """The canonical name of a schedule (``"ZBVZeroBubble"``, ``"1F1B"``, ``"CSV"``, ``"csv:PATH"``).

    ``name`` is a name (case and a ``Schedule`` prefix ignored), a schedule class, or a
    :class:`~graphkit.pipelining.planning.actions.ScheduleOrder` (its own name).

    Raises:
        UnknownScheduleError: an unknown name (the message lists the known ones).
    """
    if isinstance(name, ScheduleOrder):
        return name.name
    if isinstance(name, type):
        return name.__name__.removeprefix("Schedule")
    if name.lower().startswith("csv:"):
        return "csv:" + name[4:]
    wanted = name.lower().removeprefix("schedule")
    for known in _known_names():
        if known.lower() == wanted:
            return known
    raise UnknownScheduleError(
        f"unknown schedule {name!r}; choose one of {', '.join(_known_names())} or csv:PATH (a compute-only "
        "CSV schedule with F/I/W actions)"
    )


def resolve_schedule(name: Schedule) -> str | type | ScheduleOrder:
    """``name`` made ready to pass down: a ``csv:PATH`` name read into its
    :class:`~graphkit.pipelining.planning.actions.ScheduleOrder` (the one place that parses it); a class or
    an order as they are; any other name canonical.

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
        ScheduleError: the CSV file cannot be read, or a cell is no action (the message names the file).
    """
    if isinstance(name, ScheduleOrder | type):
        return name
    canonical = schedule_name(name)
    if canonical.startswith("csv:"):
        return ScheduleOrder.from_csv(canonical[4:])
    return canonical


def schedule_class(name: Schedule) -> type:
    """The ``torch.distributed.pipelining`` class that runs schedule ``name`` (CSV ones, graphkit's generated
    ones and orders: ``_PipelineScheduleRuntime``).

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
    """
    if isinstance(name, type):
        return name
    resolved = resolve_schedule(name)
    if isinstance(resolved, ScheduleOrder) or resolved == "CSV" or is_generated(resolved):
        return torch_schedules._PipelineScheduleRuntime
    return torch_schedules.get_schedule_class(resolved)


def is_single_stage(name: Schedule) -> bool:
    """Whether schedule ``name`` runs one stage per rank (``GPipe``, ``1F1B``, ``ZBH1``, ``ZBH2``,
    ``Adaptive``; an order whose every rank runs one stage)."""
    resolved = resolve_schedule(name)
    if isinstance(resolved, ScheduleOrder):
        return all(len(resolved.stages_of(rank)) == 1 for rank in range(resolved.num_ranks))
    if is_generated(resolved):
        return True
    return issubclass(schedule_class(resolved), torch_schedules.PipelineScheduleSingle)


def _is_v_shaped(name: Schedule) -> bool:
    cls = schedule_class(name)
    return issubclass(cls, torch_schedules.ScheduleZBVZeroBubble | torch_schedules.ScheduleDualPipeV)


def stage_count(name: Schedule, ranks: int, stages_per_rank: int = 2) -> int:
    """How many stages the pipeline has under schedule ``name`` on ``ranks`` ranks: ``ranks`` for single-stage
    schedules, ``2 * ranks`` for V-shaped ones, ``stages_per_rank * ranks`` for the others; for an order
    (``csv:PATH``) the stages it names.

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
    """
    resolved = resolve_schedule(name)
    if isinstance(resolved, ScheduleOrder):
        return resolved.num_stages
    if is_single_stage(resolved):
        return ranks
    if _is_v_shaped(resolved):
        return 2 * ranks
    return stages_per_rank * ranks


def check_microbatches(name: Schedule, microbatches: int) -> None:
    """Refuse ``microbatches`` that an order (``csv:PATH``) was not written for (other schedules take any).

    PyTorch's runtime otherwise stops inside the step, on one rank, with an assertion that names neither
    the file nor the option to change.

    Raises:
        ValueError: the order's actions name microbatches 0 .. N - 1 and ``microbatches`` is not N; a cell
            that is no action (:class:`~graphkit.pipelining.planning.actions.ScheduleError`).
    """
    resolved = resolve_schedule(name)
    if not isinstance(resolved, ScheduleOrder):
        return
    planned = resolved.microbatches
    if planned and planned != microbatches:
        raise ValueError(
            f"{resolved.name} holds the actions of {planned} microbatches (0 .. {planned - 1}), "
            f"not {microbatches}: run it with --microbatches {planned} (the count it was planned "
            "for), or plan again for this count"
        )


def check_ranks(name: Schedule, ranks: int) -> None:
    """Refuse an order (``csv:PATH``) whose rows are not ``ranks`` (one row per pipeline rank; other
    schedules take any number).

    Without this check the ranks start, and the first rank without a row of its own stops with an
    ``IndexError`` after the others have built their stages.

    Raises:
        ValueError: the order holds another number of rows than ``ranks``; the file cannot be read.
    """
    resolved = resolve_schedule(name)
    if not isinstance(resolved, ScheduleOrder):
        return
    if resolved.num_ranks != ranks:
        raise ValueError(
            f"{resolved.name} holds {resolved.num_ranks} rows, one per pipeline rank, not {ranks}: run it "
            f"with --ranks {resolved.num_ranks} (the ranks it was planned for), or plan again for {ranks} ranks"
        )


def stage_indices(name: Schedule, rank: int, ranks: int, stages_per_rank: int = 2) -> list[int]:
    """The stage indices rank ``rank`` of ``ranks`` holds under schedule ``name``, ascending.

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
        ValueError: a V-shaped schedule (``ZBVZeroBubble``, ``DualPipeV``) with other than two stages per rank.
    """
    resolved = resolve_schedule(name)
    if isinstance(resolved, ScheduleOrder):
        return resolved.stages_of(rank)
    if is_single_stage(resolved):
        return [rank]
    if _is_v_shaped(resolved):
        if stages_per_rank != 2:
            raise ValueError(
                f"{schedule_name(resolved)} places exactly two stages on each rank, not {stages_per_rank}"
            )
        return sorted({rank, 2 * ranks - 1 - rank})
    return [rank + loop * ranks for loop in range(stages_per_rank)]


def common_stage_count(names: Sequence[Schedule], ranks: int, stages_per_rank: int = 2) -> int:
    """How many stage modules to build so that every schedule in ``names`` runs the same ones: the least
    common multiple of :func:`stage_count` over them (a schedule that needs fewer stages chains consecutive
    modules into one).

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
        ValueError: ``ranks`` or ``stages_per_rank`` below 1.
    """
    if ranks < 1 or stages_per_rank < 1:
        raise ValueError(f"ranks and stages_per_rank must be at least 1, got {ranks} and {stages_per_rank}")
    counts = [stage_count(name, ranks, stages_per_rank) for name in names]
    return math.lcm(*counts) if counts else ranks


def io_schedule_rows(num_stages: int, ranks: int, microbatches: int) -> list[list[str]]:
    """A compute-only schedule with separate I and W actions, one row of actions per rank.

    Stage ``s`` runs on rank ``s % ranks``. Each rank runs the forwards of its stages in ascending stage
    order, then the I actions in descending stage order, then the W actions in the same order as the I
    actions: a deadlock-free order (every action's inputs come from an earlier stage's forward or a later
    stage's I), in which each W runs well after its I.
    """
    rows: list[list[str]] = []
    for rank in range(ranks):
        mine = [stage for stage in range(num_stages) if stage % ranks == rank]
        row = [f"{stage}F{mb}" for stage in mine for mb in range(microbatches)]
        row += [f"{stage}I{mb}" for stage in reversed(mine) for mb in range(microbatches)]
        row += [f"{stage}W{mb}" for stage in reversed(mine) for mb in range(microbatches)]
        rows.append(row)
    return rows


def build_schedule(
    name: Schedule,
    stages: Sequence[Any],
    microbatches: int,
    loss_fn: Callable[..., Any] | None,
    *,
    ranks: int,
    **options: Any,
) -> Any:
    """Build schedule ``name`` over this rank's ``stages``.

    Args:
        name: a schedule name (see the module's docstring), ``csv:PATH``, a schedule class, or a
            :class:`~graphkit.pipelining.planning.actions.ScheduleOrder`.
        stages: this rank's pipeline stages, in ascending stage order (one for a single-stage schedule).
        microbatches: microbatches per step.
        loss_fn: ``loss_fn(output, target)`` of the last stage.
        ranks: the pipeline's process-group size.
        options: more keyword arguments for the schedule's constructor (``scale_grads=...``).

    Raises:
        UnknownScheduleError: an unknown schedule name.
    """
    resolved = resolve_schedule(name)
    if is_generated(resolved):
        resolved = generated_order(str(resolved), ranks, microbatches)
    elif resolved == "CSV":
        resolved = ScheduleOrder.from_actions(
            "CSV", io_schedule_rows(stages[0].num_stages, ranks, microbatches)
        )
    if isinstance(resolved, ScheduleOrder):
        return _runtime_from_order(resolved, stages, microbatches, loss_fn, options)
    cls = schedule_class(resolved)
    if issubclass(cls, torch_schedules.PipelineScheduleSingle):
        return cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn, **options)
    return cls(list(stages), microbatches, loss_fn=loss_fn, **options)


def _runtime_from_order(
    order: ScheduleOrder, stages: Sequence[Any], microbatches: int, loss_fn: Any, options: dict[str, Any]
) -> Any:
    """PyTorch's ``_PipelineScheduleRuntime`` loaded with ``order`` through a CSV file, as a user's would be."""
    schedule = torch_schedules._PipelineScheduleRuntime(
        list(stages), microbatches, loss_fn=loss_fn, **options
    )
    with tempfile.TemporaryDirectory(prefix="graphkit-schedule-") as folder:
        path = Path(folder) / "schedule.csv"
        order.write_csv(path)
        schedule._load_csv(str(path))
    return schedule


def schedule_order(name: Schedule, ranks: int, microbatches: int, stages_per_rank: int = 2) -> ScheduleOrder:
    """Every rank's compute actions under schedule ``name``, read without running it: what
    :func:`graphkit.pipelining.planning.simulate` predicts.

    ``GPipe`` and ``1F1B`` come from :mod:`graphkit.pipelining.planning.generation` (the order their ``step``
    runs; ``Schedule1F1B.pipeline_order`` names a microbatch too many on its last rank); the multi-stage
    schedules from the ``pipeline_order`` their constructor computes (over stand-in stages); graphkit's own
    from the registry, and an order (``csv:PATH``) as it is.

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
    """
    from types import SimpleNamespace

    resolved = resolve_schedule(name)
    if isinstance(resolved, ScheduleOrder):
        return resolved
    canonical = schedule_name(resolved)
    if is_generated(canonical):
        return generated_order(canonical, ranks, microbatches)
    if canonical == "CSV":
        return ScheduleOrder.from_actions(
            "CSV", io_schedule_rows(ranks * stages_per_rank, ranks, microbatches)
        )
    if canonical in ("GPipe", "1F1B"):
        return ScheduleOrder.from_actions(
            canonical, (gpipe if canonical == "GPipe" else one_f_one_b)(ranks, microbatches)
        )
    num_stages = stage_count(canonical, ranks, stages_per_rank)
    stages = [
        SimpleNamespace(
            stage_index=index,
            num_stages=num_stages,
            group_rank=0,
            group_size=ranks,
            is_first=index == 0,
            is_last=index == num_stages - 1,
            submod=None,
            stage_index_to_group_rank=None,
        )
        for index in stage_indices(canonical, 0, ranks, stages_per_rank)
    ]
    schedule = schedule_class(canonical)(stages, microbatches)
    order = schedule.pipeline_order
    return ScheduleOrder.from_actions(canonical, [order[rank] for rank in range(ranks)])
