"""The zero-bubble schedules of ``torch.distributed.pipelining`` by name, where their stages live, and a
CSV schedule with I and W actions for ``_PipelineScheduleRuntime``.

Every schedule here places two stages on each rank by default (``num_stages = 2 * ranks``):

- ``InterleavedZeroBubble`` (``ScheduleInterleavedZeroBubble``) and ``CSV``: stage ``s`` on rank ``s % ranks``
  (any number of stages per rank);
- ``ZBVZeroBubble`` (``ScheduleZBVZeroBubble``) and ``DualPipeV`` (``ScheduleDualPipeV``): a V, stage ``s`` on
  rank ``s`` for ``s < ranks`` and on ``2 * ranks - 1 - s`` after.

``CSV`` is graphkit's own compute-only schedule (:func:`io_schedule_rows`), written to a file and loaded
with ``_PipelineScheduleRuntime._load_csv`` as a user's CSV schedule would be; ``csv:PATH`` loads a
user's file instead (its stage placement is read from the file).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.distributed.pipelining import schedules as torch_schedules

__all__ = [
    "SCHEDULE_NAMES",
    "build_schedule",
    "io_schedule_rows",
    "schedule_name",
    "stage_count",
    "stage_indices",
]

SCHEDULE_NAMES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", "CSV")
"""The schedules :func:`build_schedule` knows (``csv:PATH`` too)."""

_V_SHAPED = frozenset({"ZBVZeroBubble", "DualPipeV"})


def schedule_name(name: str) -> str:
    """The canonical name of a schedule: case and a ``Schedule`` prefix are ignored; ``csv:PATH`` is kept.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name.lower().startswith("csv:"):
        return "csv:" + name[4:]
    wanted = name.lower().removeprefix("schedule")
    for known in SCHEDULE_NAMES:
        if known.lower() == wanted:
            return known
    raise ValueError(
        f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)} or csv:PATH (a compute-only "
        "CSV schedule with F/I/W actions)"
    )


def stage_indices(name: str, rank: int, ranks: int, stages_per_rank: int = 2) -> list[int]:
    """The stage indices rank ``rank`` of ``ranks`` holds under schedule ``name``, ascending.

    Raises:
        ValueError: an unknown schedule, or a V-shaped one (``ZBVZeroBubble``, ``DualPipeV``) with other
            than two stages per rank.
    """
    name = schedule_name(name)
    if name.startswith("csv:"):
        rows = _read_rows(Path(name[4:]))
        return sorted({_stage_of(action) for action in rows[rank] if action})
    if name in _V_SHAPED:
        if stages_per_rank != 2:
            raise ValueError(f"{name} places exactly two stages on each rank, not {stages_per_rank}")
        return sorted({rank, 2 * ranks - 1 - rank})
    return [rank + loop * ranks for loop in range(stages_per_rank)]


def stage_count(name: str, ranks: int, stages_per_rank: int = 2) -> int:
    """How many stages the pipeline has under schedule ``name`` (for ``csv:PATH``: the stages its file names)."""
    name = schedule_name(name)
    if name.startswith("csv:"):
        rows = _read_rows(Path(name[4:]))
        return len({_stage_of(action) for row in rows for action in row if action})
    return stages_per_rank * ranks


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
    name: str,
    stages: Sequence[Any],
    microbatches: int,
    loss_fn: Callable[..., Any] | None,
    *,
    ranks: int,
    **options: Any,
) -> Any:
    """Build schedule ``name`` over this rank's ``stages``.

    Args:
        name: one of :data:`SCHEDULE_NAMES` or ``csv:PATH``.
        stages: this rank's pipeline stages, in ascending stage order.
        microbatches: microbatches per step.
        loss_fn: ``loss_fn(output, target)`` of the last stage.
        ranks: the pipeline's process-group size.
        options: more keyword arguments for the schedule's constructor (``scale_grads=...``).

    Raises:
        ValueError: an unknown schedule name.
    """
    name = schedule_name(name)
    if name == "InterleavedZeroBubble":
        return torch_schedules.ScheduleInterleavedZeroBubble(
            list(stages), microbatches, loss_fn=loss_fn, **options
        )
    if name == "ZBVZeroBubble":
        return torch_schedules.ScheduleZBVZeroBubble(list(stages), microbatches, loss_fn=loss_fn, **options)
    if name == "DualPipeV":
        return torch_schedules.ScheduleDualPipeV(list(stages), microbatches, loss_fn=loss_fn, **options)
    schedule = torch_schedules._PipelineScheduleRuntime(
        list(stages), microbatches, loss_fn=loss_fn, **options
    )
    if name.startswith("csv:"):
        schedule._load_csv(name[4:])
        return schedule
    rows = io_schedule_rows(stages[0].num_stages, ranks, microbatches)
    with tempfile.TemporaryDirectory(prefix="graphkit-schedule-") as folder:
        path = Path(folder) / "schedule.csv"
        path.write_text("\n".join(",".join(row) for row in rows) + "\n")
        schedule._load_csv(str(path))
    return schedule


def _read_rows(path: Path) -> list[list[str]]:
    import csv

    with path.open(newline="") as file:
        return [[cell.strip() for cell in row] for row in csv.reader(file)]


def _stage_of(action: str) -> int:
    digits = ""
    for character in action.lstrip("("):
        if not character.isdigit():
            break
        digits += character
    return int(digits)
