"""Schedules as data, in one home: the action record, parsed schedules and their CSV files, what each action
costs, generating schedules (the ZB paper's, and one that splits the backward only where it pays),
simulating them, recorded and predicted timelines, and calibrating the model.

- :mod:`~graphkit.pipelining.planning.actions`: :class:`Action` (``0F1``), its timing
  (:class:`TimedAction`), the one expansion of PyTorch's composite actions, :class:`ScheduleOrder` (a
  schedule as data) and the one CSV reader and writer;
- :mod:`~graphkit.pipelining.planning.timelines`: what a step ran on every rank and when
  (:class:`ScheduleTimeline`), recorded or predicted;
- :mod:`~graphkit.pipelining.planning.cost_model`: per-stage seconds and bytes, the message cost model, and
  the arithmetic on them (reading a costs JSON, merging stages, scaling);
- :mod:`~graphkit.pipelining.planning.simulator`: :func:`simulate` -> :class:`Simulation` (timeline, step,
  bubble, peak memory, messages);
- :mod:`~graphkit.pipelining.planning.generation`: the handcrafted schedules, one stage per rank;
- :mod:`~graphkit.pipelining.planning.adaptive`: the greedy schedule from costs under a memory limit;
- :mod:`~graphkit.pipelining.planning.cost_aware`: per microbatch a full backward or I then W, where the
  split pays;
- :mod:`~graphkit.pipelining.planning.registry`: the one registry of graphkit's generated schedules;
- :mod:`~graphkit.pipelining.planning.calibration`: what the runtime adds, fitted to recorded steps.

The planner that measures, simulates, ranks and records (``graphkit plan``) sits above this package and
above recording: :mod:`graphkit.pipelining.planner`. Nothing here imports torch, schedules or recording, so
every other part of graphkit can build on it.
"""

from __future__ import annotations

from graphkit.pipelining.planning.actions import (
    COMPUTE_KINDS,
    Action,
    ScheduleError,
    ScheduleOrder,
    TimedAction,
    compute_actions,
    read_schedule_csv,
    schedule_actions,
    write_schedule_csv,
)
from graphkit.pipelining.planning.adaptive import adaptive_schedule
from graphkit.pipelining.planning.cost_aware import cost_aware_schedule, split_last
from graphkit.pipelining.planning.cost_model import CommModel, StageCost
from graphkit.pipelining.planning.generation import SCHEDULES, fold_schedule, gpipe, one_f_one_b, zb_h1, zb_h2
from graphkit.pipelining.planning.registry import GENERATED_SCHEDULES, generated_order
from graphkit.pipelining.planning.simulator import (
    DeadlockError,
    IncompleteScheduleError,
    Simulation,
    Waiting,
    recorded_durations,
    simulate,
)
from graphkit.pipelining.planning.timelines import RankTimeline, ScheduleTimeline, TimelineError

__all__ = [
    "COMPUTE_KINDS",
    "GENERATED_SCHEDULES",
    "SCHEDULES",
    "Action",
    "CommModel",
    "DeadlockError",
    "IncompleteScheduleError",
    "RankTimeline",
    "ScheduleError",
    "ScheduleOrder",
    "ScheduleTimeline",
    "Simulation",
    "StageCost",
    "TimedAction",
    "TimelineError",
    "Waiting",
    "adaptive_schedule",
    "compute_actions",
    "cost_aware_schedule",
    "fold_schedule",
    "generated_order",
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


_DEPRECATED = {"PredictedAction": "TimedAction"}


def __getattr__(name: str) -> object:
    if name in _DEPRECATED:
        import warnings

        warnings.warn(
            f"graphkit.pipelining.planning.{name} is deprecated: predicted and recorded actions are one "
            f"record, {_DEPRECATED[name]} (an Action with its times)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[_DEPRECATED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
