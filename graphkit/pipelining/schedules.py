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
  memory limit and writes it as a CSV, run as ``csv:PATH``;
- ``CostAware``: full backwards B where nothing waits on them, I then W where an early I pays
  (:func:`~graphkit.pipelining.planning.cost_aware_schedule`) with F = I = W = 1 and a full backward of 1.5
  (the split a third dearer than B); build it from measured costs and run it as ``csv:PATH``;
- ``csv:PATH``: a user's CSV file (its stage placement is read from the file).

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

import csv
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.distributed.pipelining import schedules as torch_schedules

from graphkit.pipelining.planning import (
    adaptive_schedule,
    cost_aware_schedule,
    gpipe,
    one_f_one_b,
    read_schedule_csv,
    zb_h1,
    zb_h2,
)
from graphkit.pipelining.planning.cost_model import StageCost
from graphkit.pipelining.timelines import compute_labels

__all__ = [
    "SCHEDULE_NAMES",
    "UnknownScheduleError",
    "build_schedule",
    "GENERATED_SCHEDULES",
    "check_microbatches",
    "check_ranks",
    "common_stage_count",
    "generated_rows",
    "io_schedule_rows",
    "is_single_stage",
    "schedule_class",
    "schedule_name",
    "schedule_order",
    "stage_count",
    "stage_indices",
]

GENERATED_SCHEDULES = ("ZBH1", "ZBH2", "Adaptive", "CostAware")
"""graphkit's generated schedules: one stage per rank, I and W actions (``CostAware``: and full backwards B),
run from a CSV."""

SCHEDULE_NAMES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", "CSV")
"""The schedules with separate I and W actions over several stages per rank, whose W graphkit's split runs
(``csv:PATH`` too); :data:`GENERATED_SCHEDULES` are the ones with one stage per rank."""

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


def schedule_name(name: str | type) -> str:
    """The canonical name of a schedule (``"ZBVZeroBubble"``, ``"1F1B"``, ``"CSV"``, ``"csv:PATH"``).

    ``name`` is a name (case and a ``Schedule`` prefix ignored) or a schedule class.

    Raises:
        UnknownScheduleError: an unknown name (the message lists the known ones).
    """
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


def schedule_class(name: str | type) -> type:
    """The ``torch.distributed.pipelining`` class that runs schedule ``name`` (CSV ones:
    ``_PipelineScheduleRuntime``).

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
    """
    if isinstance(name, type):
        return name
    canonical = schedule_name(name)
    if canonical in ("CSV", *GENERATED_SCHEDULES) or canonical.startswith("csv:"):
        return torch_schedules._PipelineScheduleRuntime
    return torch_schedules.get_schedule_class(canonical)


def is_single_stage(name: str | type) -> bool:
    """Whether schedule ``name`` runs one stage per rank (``GPipe``, ``1F1B`` and :data:`GENERATED_SCHEDULES`)."""
    if not isinstance(name, type) and schedule_name(name) in GENERATED_SCHEDULES:
        return True
    return issubclass(schedule_class(name), torch_schedules.PipelineScheduleSingle)


def _is_v_shaped(name: str | type) -> bool:
    cls = schedule_class(name)
    return issubclass(cls, torch_schedules.ScheduleZBVZeroBubble | torch_schedules.ScheduleDualPipeV)


def stage_count(name: str | type, ranks: int, stages_per_rank: int = 2) -> int:
    """How many stages the pipeline has under schedule ``name`` on ``ranks`` ranks: ``ranks`` for single-stage
    schedules, ``2 * ranks`` for V-shaped ones, ``stages_per_rank * ranks`` for the others; for ``csv:PATH``
    the stages its file names.

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
    """
    canonical = schedule_name(name)
    if canonical.startswith("csv:"):
        rows = _read_rows(Path(canonical[4:]))
        return len({_stage_of(action) for row in rows for action in row if action})
    if is_single_stage(canonical):
        return ranks
    if _is_v_shaped(canonical):
        return 2 * ranks
    return stages_per_rank * ranks


def check_microbatches(name: str | type, microbatches: int) -> None:
    """Refuse ``microbatches`` that a ``csv:PATH`` schedule was not written for (other schedules take any).

    PyTorch's runtime otherwise stops inside the step, on one rank, with an assertion that names neither
    the file nor the option to change.

    Raises:
        ValueError: the file's actions name microbatches 0 .. N - 1 and ``microbatches`` is not N; a cell
            that is no action (:class:`~graphkit.pipelining.planning.actions.ScheduleError`).
    """
    if isinstance(name, type):
        return
    canonical = schedule_name(name)
    if not canonical.startswith("csv:"):
        return
    numbers = {action.microbatch for row in read_schedule_csv(canonical[4:]).values() for action in row}
    if numbers and max(numbers) + 1 != microbatches:
        raise ValueError(
            f"{canonical} holds the actions of {max(numbers) + 1} microbatches (0 .. {max(numbers)}), "
            f"not {microbatches}: run it with --microbatches {max(numbers) + 1} (the count it was planned "
            "for), or plan again for this count"
        )


def check_ranks(name: str | type, ranks: int) -> None:
    """Refuse a ``csv:PATH`` schedule whose rows are not ``ranks`` (one row per pipeline rank; others take any).

    Without this check the ranks start, and the first rank without a row of its own stops with an
    ``IndexError`` after the others have built their stages.

    Raises:
        ValueError: the file holds another number of rows than ``ranks``; OSError: it cannot be read.
    """
    if isinstance(name, type):
        return
    canonical = schedule_name(name)
    if not canonical.startswith("csv:"):
        return
    rows = len(_read_rows(Path(canonical[4:])))
    if rows != ranks:
        raise ValueError(
            f"{canonical} holds {rows} rows, one per pipeline rank, not {ranks}: run it with --ranks {rows} "
            f"(the ranks it was planned for), or plan again for {ranks} ranks"
        )


def stage_indices(name: str | type, rank: int, ranks: int, stages_per_rank: int = 2) -> list[int]:
    """The stage indices rank ``rank`` of ``ranks`` holds under schedule ``name``, ascending.

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
        ValueError: a V-shaped schedule (``ZBVZeroBubble``, ``DualPipeV``) with other than two stages per rank.
    """
    canonical = schedule_name(name)
    if canonical.startswith("csv:"):
        rows = _read_rows(Path(canonical[4:]))
        return sorted({_stage_of(action) for action in rows[rank] if action})
    if is_single_stage(canonical):
        return [rank]
    if _is_v_shaped(canonical):
        if stages_per_rank != 2:
            raise ValueError(f"{canonical} places exactly two stages on each rank, not {stages_per_rank}")
        return sorted({rank, 2 * ranks - 1 - rank})
    return [rank + loop * ranks for loop in range(stages_per_rank)]


def common_stage_count(names: Sequence[str | type], ranks: int, stages_per_rank: int = 2) -> int:
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
    name: str | type,
    stages: Sequence[Any],
    microbatches: int,
    loss_fn: Callable[..., Any] | None,
    *,
    ranks: int,
    **options: Any,
) -> Any:
    """Build schedule ``name`` over this rank's ``stages``.

    Args:
        name: a schedule name (see the module's docstring), ``csv:PATH``, or a schedule class.
        stages: this rank's pipeline stages, in ascending stage order (one for a single-stage schedule).
        microbatches: microbatches per step.
        loss_fn: ``loss_fn(output, target)`` of the last stage.
        ranks: the pipeline's process-group size.
        options: more keyword arguments for the schedule's constructor (``scale_grads=...``).

    Raises:
        UnknownScheduleError: an unknown schedule name.
    """
    canonical = schedule_name(name)
    cls = schedule_class(name)
    if canonical in GENERATED_SCHEDULES:
        rows = generated_rows(canonical, ranks, microbatches)
        return _runtime_from_rows(rows, stages, microbatches, loss_fn, options)
    if issubclass(cls, torch_schedules.PipelineScheduleSingle):
        return cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn, **options)
    if cls is not torch_schedules._PipelineScheduleRuntime:
        return cls(list(stages), microbatches, loss_fn=loss_fn, **options)
    schedule = torch_schedules._PipelineScheduleRuntime(
        list(stages), microbatches, loss_fn=loss_fn, **options
    )
    if canonical.startswith("csv:"):
        schedule._load_csv(canonical[4:])
        return schedule
    rows = io_schedule_rows(stages[0].num_stages, ranks, microbatches)
    _load_rows(schedule, rows)
    return schedule


def _load_rows(schedule: Any, rows: list[list[str]]) -> None:
    """Load per-rank action strings into a ``_PipelineScheduleRuntime`` through a CSV file, as a user would."""
    with tempfile.TemporaryDirectory(prefix="graphkit-schedule-") as folder:
        path = Path(folder) / "schedule.csv"
        path.write_text("\n".join(",".join(row) for row in rows) + "\n")
        schedule._load_csv(str(path))


def _runtime_from_rows(
    rows: list[list[str]], stages: Sequence[Any], microbatches: int, loss_fn: Any, options: dict[str, Any]
) -> Any:
    schedule = torch_schedules._PipelineScheduleRuntime(
        list(stages), microbatches, loss_fn=loss_fn, **options
    )
    _load_rows(schedule, rows)
    return schedule


def generated_rows(name: str, ranks: int, microbatches: int) -> list[list[str]]:
    """The per-rank action strings of a generated schedule (``ZBH1``, ``ZBH2``, ``Adaptive``, ``CostAware``),
    one stage per rank, as its CSV holds them.

    Raises:
        UnknownScheduleError: ``name`` is not a generated schedule.
    """
    canonical = schedule_name(name)
    if canonical == "ZBH1":
        order = zb_h1(ranks, microbatches)
    elif canonical == "ZBH2":
        order = zb_h2(ranks, microbatches)
    elif canonical == "Adaptive":
        order = adaptive_schedule(
            StageCost(1.0, 1.0, 1.0, activation_bytes=1, weight_bytes=1), ranks, microbatches
        )
    elif canonical == "CostAware":
        order = cost_aware_schedule(StageCost(1.0, 1.0, 1.0, full_backward=1.5), ranks, microbatches)
    else:
        raise UnknownScheduleError(
            f"{name!r} is not one of graphkit's generated schedules {GENERATED_SCHEDULES}"
        )
    return [[str(action) for action in order[rank]] for rank in range(ranks)]


def schedule_order(
    name: str | type, ranks: int, microbatches: int, stages_per_rank: int = 2
) -> dict[int, list[str]]:
    """Every rank's compute actions under schedule ``name`` (``{rank: ["0F0", "0F1", ...]}``), read without
    running it: what :func:`graphkit.pipelining.planning.simulate` predicts.

    ``GPipe`` and ``1F1B`` come from :mod:`graphkit.pipelining.planning.generation` (the order their ``step``
    runs; ``Schedule1F1B.pipeline_order`` names a microbatch too many on its last rank); the multi-stage
    schedules from the ``pipeline_order`` their constructor computes (over stand-in stages); graphkit's own
    and ``csv:PATH`` from their rows.

    Raises:
        UnknownScheduleError: as :func:`schedule_name`.
    """
    from types import SimpleNamespace

    canonical = schedule_name(name)
    if canonical in GENERATED_SCHEDULES:
        return dict(enumerate(generated_rows(canonical, ranks, microbatches)))
    if canonical == "CSV":
        return dict(enumerate(io_schedule_rows(ranks * stages_per_rank, ranks, microbatches)))
    if canonical.startswith("csv:"):
        return dict(enumerate(_read_rows(Path(canonical[4:]))))
    if canonical in ("GPipe", "1F1B"):
        order = (gpipe if canonical == "GPipe" else one_f_one_b)(ranks, microbatches)
        return {rank: [str(action) for action in row] for rank, row in order.items()}
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
    result: dict[int, list[str]] = {}
    for rank in range(ranks):
        result[rank] = compute_labels(order[rank])
    return result


def _read_rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as file:
        return [[cell.strip() for cell in row] for row in csv.reader(file)]


def _stage_of(action: str) -> int:
    digits = ""
    for character in action.lstrip("("):
        if not character.isdigit():
            break
        digits += character
    return int(digits)
