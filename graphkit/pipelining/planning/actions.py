"""The schedule vocabulary of the planner: compute actions, per-rank action lists, and their CSV files.

An action is PyTorch's ``_Action`` reduced to what a simulator needs - stage, kind, microbatch - and it
prints the same way (``0F1``: stage 0, forward, microbatch 1). Kinds (PyTorch's names):

- ``F``: forward;
- ``I``: input-gradient backward (``B`` in the ZB paper, ``BACKWARD_INPUT`` in PyTorch);
- ``W``: weight-gradient backward (``BACKWARD_WEIGHT``);
- ``B``: full backward, I and W at once (``FULL_BACKWARD``).

:func:`schedule_actions` reads any per-rank order into ``{rank: [Action, ...]}``: a schedule object's
``pipeline_order`` / ``pipeline_order_with_comms`` (``_Action`` objects and ``None`` gaps), a mapping of
rank to lists of ``_Action``, strings or :class:`Action`, or a list of such lists. Communication and
bookkeeping actions (``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``, ``UNSHARD``, ``RESHARD``,
``REDUCE_GRAD``) are dropped - the data flow implies them - and ``OVERLAP_F_B`` becomes its sub-actions in
order. Nothing here imports torch: ``_Action`` objects are read by their attributes.

:func:`write_schedule_csv` writes the file ``_PipelineScheduleRuntime._load_csv(path, format="compute_only")``
reads (one row per rank, one action string per cell); :func:`read_schedule_csv` reads it back.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from graphkit.pipelining.timelines import COMPUTE_KINDS

__all__ = [
    "COMPUTE_KINDS",
    "Action",
    "ScheduleError",
    "read_schedule_csv",
    "schedule_actions",
    "write_schedule_csv",
]


# Communication and resource actions (the waits are torch 2.15's): implied by the data flow, not timed.
_IMPLIED_KINDS = frozenset(
    {
        "SEND_F",
        "RECV_F",
        "SEND_B",
        "RECV_B",
        "WAIT_SEND_F",
        "WAIT_SEND_B",
        "UNSHARD",
        "RESHARD",
        "REDUCE_GRAD",
        "WAIT_REDUCE_GRAD",
    }
)
# PyTorch's own pattern (schedules.py, _action_regex), the longest kinds first so "RECV_F" is not "R".
_ACTION_PATTERN = re.compile(
    r"^(\d+)(WAIT_REDUCE_GRAD|REDUCE_GRAD|UNSHARD|RESHARD|WAIT_SEND_F|WAIT_SEND_B|SEND_F|RECV_F|SEND_B|RECV_B"
    r"|F|I|B|W)(\d*)$"
)


class ScheduleError(ValueError):
    """A schedule the planner cannot use: an unknown action, a stage on two ranks, a missing action."""


class Action(NamedTuple):
    """One compute action: ``stage`` runs ``kind`` (F, I, W or B) on ``microbatch``. Prints as ``0F1``."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action | None:
        """The action a PyTorch action string names (``"2I0"``); None for an empty cell or an implied kind.

        Raises:
            ScheduleError: the string is not an action, or a compute action lacks its microbatch.
        """
        text = text.strip()
        if not text:
            return None
        if text.startswith("("):  # OVERLAP_F_B written as "(0F1;1B0)OVERLAP_F_B": keep it whole upstream
            raise ScheduleError(f"{text!r}: an OVERLAP_F_B cell; pass it through schedule_actions")
        match = _ACTION_PATTERN.match(text)
        if match is None:
            raise ScheduleError(f"{text!r} is not a pipeline action (expected e.g. '0F1', '2I0', '1W3')")
        stage, kind, microbatch = match.groups()
        if kind in _IMPLIED_KINDS:
            return None
        if not microbatch:
            raise ScheduleError(f"{text!r}: compute action without a microbatch")
        return cls(int(stage), kind, int(microbatch))


def _expand(item: Any) -> list[Action]:
    """The compute actions one schedule cell stands for (none, one, or an OVERLAP_F_B's sub-actions)."""
    if item is None:
        return []
    if isinstance(item, Action):
        return [item]
    if isinstance(item, str):
        text = item.strip()
        if text.startswith("(") and ")" in text:
            inner = text[1 : text.index(")")]
            return [action for part in inner.split(";") for action in _expand(part)]
        action = Action.parse(text)
        return [] if action is None else [action]
    # PyTorch's _Action, read by attribute (no torch import here).
    sub_actions = getattr(item, "sub_actions", None)
    if sub_actions:
        return [action for sub in sub_actions for action in _expand(sub)]
    kind_attr = getattr(item, "computation_type", None)
    if kind_attr is None:
        raise ScheduleError(f"{item!r} is neither an action string, an Action nor PyTorch's _Action")
    kind = getattr(kind_attr, "value", kind_attr)
    if kind in _IMPLIED_KINDS:
        return []
    if kind not in COMPUTE_KINDS:
        raise ScheduleError(f"{item!r}: unknown computation type {kind!r}")
    if item.microbatch_index is None:
        raise ScheduleError(f"{item!r}: compute action without a microbatch")
    return [Action(int(item.stage_index), str(kind), int(item.microbatch_index))]


def schedule_actions(schedule: Any) -> dict[int, list[Action]]:
    """Every rank's compute actions, in order: ``{rank: [Action, ...]}`` with ranks ``0 .. R-1``.

    ``schedule``: a PyTorch schedule object (its ``pipeline_order``, else ``pipeline_order_with_comms``),
    a mapping ``rank -> actions``, or a sequence of per-rank action lists; actions are ``_Action``
    objects, strings such as ``"0F1"``, :class:`Action` or ``None`` (an idle step, dropped).

    Raises:
        ScheduleError: no ranks, ranks not numbered ``0 .. R-1``, or an action that cannot be read.
    """
    order = getattr(schedule, "pipeline_order", None) or getattr(schedule, "pipeline_order_with_comms", None)
    if order is None:
        order = schedule
    if isinstance(order, Mapping):
        items = list(order.items())
    elif isinstance(order, Iterable) and not isinstance(order, str | bytes):
        items = list(enumerate(order))
    else:
        raise ScheduleError(f"cannot read a per-rank action order from {type(schedule).__name__}")
    if not items:
        raise ScheduleError("the schedule has no ranks")
    ranks = sorted(int(rank) for rank, _ in items)
    if ranks != list(range(len(ranks))):
        raise ScheduleError(f"ranks must be numbered 0 .. R-1, got {ranks}")
    return {int(rank): [action for item in row for action in _expand(item)] for rank, row in sorted(items)}


def write_schedule_csv(actions: Mapping[int, Iterable[Any]], path: str | os.PathLike[str]) -> None:
    """Write per-rank action lists as PyTorch's compute-only CSV: row ``r`` holds rank ``r``'s actions.

    ``_PipelineScheduleRuntime(stages, n_microbatches)._load_csv(path, format="compute_only")`` loads it.

    Raises:
        ScheduleError: an action cannot be read (see :func:`schedule_actions`).
    """
    rows = schedule_actions(actions)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        for rank in range(len(rows)):
            writer.writerow([str(action) for action in rows[rank]])


def read_schedule_csv(path: str | os.PathLike[str]) -> dict[int, list[Action]]:
    """Per-rank compute actions from a CSV in PyTorch's format (compute-only or with communication).

    Raises:
        ScheduleError: a cell is not an action; OSError: the file cannot be read.
    """
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    return schedule_actions(rows)
