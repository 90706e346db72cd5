"""Plan pipeline schedules before running them: simulate any schedule from per-stage costs, generate
GPipe, 1F1B, ZB-H1, ZB-H2, the ZB paper's adaptive schedule and one that splits the backward only where it
pays, and write them for PyTorch's runtime.

- :mod:`~graphkit.pipelining.planning.actions`: the action vocabulary (``0F1``), reading any per-rank order, CSV;
- :mod:`~graphkit.pipelining.planning.cost_model`: per-stage seconds and bytes, the message cost model;
- :mod:`~graphkit.pipelining.planning.simulator`: :func:`simulate` -> :class:`Simulation` (timeline, step, bubble,
  peak memory, messages);
- :mod:`~graphkit.pipelining.planning.generation`: the handcrafted schedules, one stage per rank;
- :mod:`~graphkit.pipelining.planning.adaptive`: the greedy schedule from costs under a memory limit;
- :mod:`~graphkit.pipelining.planning.cost_aware`: per microbatch a full backward or I then W, where the
  split pays;

The planner that measures, simulates, ranks and records (``graphkit plan``) sits above this package and
above recording: :mod:`graphkit.pipelining.planner`. Nothing here imports schedules or recording, so both
can build on it.
"""

from __future__ import annotations

from graphkit.pipelining.planning.actions import (
    COMPUTE_KINDS,
    Action,
    ScheduleError,
    read_schedule_csv,
    schedule_actions,
    write_schedule_csv,
)
from graphkit.pipelining.planning.adaptive import adaptive_schedule
from graphkit.pipelining.planning.cost_aware import cost_aware_schedule, split_last
from graphkit.pipelining.planning.cost_model import CommModel, StageCost
from graphkit.pipelining.planning.generation import SCHEDULES, fold_schedule, gpipe, one_f_one_b, zb_h1, zb_h2
from graphkit.pipelining.planning.simulator import (
    DeadlockError,
    IncompleteScheduleError,
    PredictedAction,
    Simulation,
    Waiting,
    recorded_durations,
    simulate,
)

__all__ = [
    "COMPUTE_KINDS",
    "SCHEDULES",
    "Action",
    "CommModel",
    "DeadlockError",
    "IncompleteScheduleError",
    "PredictedAction",
    "ScheduleError",
    "Simulation",
    "StageCost",
    "Waiting",
    "adaptive_schedule",
    "cost_aware_schedule",
    "fold_schedule",
    "gpipe",
    "one_f_one_b",
    "read_schedule_csv",
    "recorded_durations",
    "schedule_actions",
    "simulate",
    "split_last",
    "write_schedule_csv",
    "zb_h1",
    "zb_h2",
]
