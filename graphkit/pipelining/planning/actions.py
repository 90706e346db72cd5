"""Schedules as data: the one action record, its timing, a parsed schedule, and their CSV files.

An :class:`Action` is PyTorch's ``_Action`` reduced to what graphkit needs - stage, kind, microbatch -
and it prints the same way (``0F1``: stage 0, forward, microbatch 1). Compute kinds (PyTorch's names):

- ``F``: forward;
- ``I``: input-gradient backward (``B`` in the ZB paper, ``BACKWARD_INPUT`` in PyTorch);
- ``W``: weight-gradient backward (``BACKWARD_WEIGHT``);
- ``B``: full backward, I and W at once (``FULL_BACKWARD``).

A recorded step also holds communication (``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``), which an
:class:`Action` names the same way (``1RECV_F0``). Generation, simulation, recording and timelines all use
this one record; when an action ran (predicted or recorded) rides beside it in a :class:`TimedAction`.

:func:`compute_actions` is the one expansion of a rank's PyTorch order into compute actions: idle slots
(``None``) and communication and bookkeeping actions (``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``,
``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD`` and torch 2.15's waits) are dropped - the data flow implies them -
and ``OVERLAP_F_B`` becomes its sub-actions in order. :func:`schedule_actions` applies it to every rank.

:class:`ScheduleOrder` is a schedule as data: a name and every rank's compute actions. It is what graphkit
passes down to the ranks, read once from a user's ``csv:PATH`` file (:meth:`ScheduleOrder.from_csv`) or
built by a generator. :func:`write_schedule_csv` writes the file
``_PipelineScheduleRuntime._load_csv(path, format="compute_only")`` reads (one row per rank, one action per
cell); :func:`read_schedule_csv` reads it back. Nothing here imports torch: ``_Action`` objects are read by
their attributes.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "COMPUTE_KINDS",
    "Action",
    "ScheduleError",
    "ScheduleOrder",
    "TimedAction",
    "compute_actions",
    "read_schedule_csv",
    "schedule_actions",
    "write_schedule_csv",
]

COMPUTE_KINDS = ("F", "I", "W", "B")
"""The kinds of action that compute (the one definition: the recorder tells them from communication, the
planner times them); every other kind PyTorch knows is communication or implied by the data flow."""

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
    """A schedule graphkit cannot use: an unknown action, a stage on two ranks, a missing action."""


class Action(NamedTuple):
    """One action: ``stage`` runs ``kind`` on ``microbatch``. Prints as PyTorch names it (``0F1``).

    ``kind``: a compute kind (F, I, W, B) or, in a recorded step, a communication kind (``SEND_F``, ...).
    """

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @property
    def label(self) -> str:
        """PyTorch's action name, ``1F0``: stage, kind, microbatch."""
        return str(self)

    @property
    def is_compute(self) -> bool:
        """Whether the action computes (F, I, W or B) rather than communicates."""
        return self.kind in COMPUTE_KINDS

    @classmethod
    def parse(cls, text: str) -> Action | None:
        """The compute action a PyTorch action string names (``"2I0"``); None for an empty cell or an
        implied (communication, bookkeeping) kind.

        Raises:
            ScheduleError: the string is not an action, or a compute action lacks its microbatch.
        """
        text = text.strip()
        if not text:
            return None
        if text.startswith("("):  # OVERLAP_F_B written as "(0F1;1B0)OVERLAP_F_B": expanded upstream
            raise ScheduleError(f"{text!r}: an OVERLAP_F_B cell; pass it through compute_actions")
        match = _ACTION_PATTERN.match(text)
        if match is None:
            raise ScheduleError(f"{text!r} is not a pipeline action (expected e.g. '0F1', '2I0', '1W3')")
        stage, kind, microbatch = match.groups()
        if kind in _IMPLIED_KINDS:
            return None
        if not microbatch:
            raise ScheduleError(f"{text!r}: compute action without a microbatch")
        return cls(int(stage), kind, int(microbatch))


@dataclass(slots=True)
class TimedAction:
    """An :class:`Action` with when it ran, predicted or recorded: seconds since the step began on its rank.

    ``phase``: ``run`` for compute, ``issue`` or ``wait`` for communication. ``memory_bytes``: memory in
    use when it ended, relative to the step's start (recorded), or activation bytes alive on the rank
    (predicted); None where not measured.
    """

    action: Action
    start: float
    end: float
    phase: str = "run"
    memory_bytes: int | None = None

    @property
    def stage(self) -> int:
        return self.action.stage

    @property
    def kind(self) -> str:
        return self.action.kind

    @property
    def microbatch(self) -> int:
        return self.action.microbatch

    @property
    def label(self) -> str:
        """PyTorch's action name, ``1F0``: stage, kind, microbatch."""
        return str(self.action)

    @property
    def is_compute(self) -> bool:
        return self.action.is_compute

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready): the action's fields, then the timing."""
        return {
            "kind": self.kind,
            "stage": self.stage,
            "microbatch": self.microbatch,
            "start": self.start,
            "end": self.end,
            "phase": self.phase,
            "memory_bytes": self.memory_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimedAction:
        """The inverse of :meth:`to_dict` (files written before the fields were unified name the stage
        ``stage_index``)."""
        stage = data["stage"] if "stage" in data else data["stage_index"]
        return cls(
            Action(int(stage), str(data["kind"]), int(data["microbatch"])),
            float(data["start"]),
            float(data["end"]),
            data.get("phase", "run"),
            data.get("memory_bytes"),
        )


def _torch_action(item: Any) -> tuple[Action | None, list[Any]]:
    """One of PyTorch's ``_Action`` objects, read by attribute: the compute action it is (None if it is
    none), or its sub-actions (``OVERLAP_F_B``)."""
    sub_actions = getattr(item, "sub_actions", None)
    if sub_actions:
        return None, list(sub_actions)
    kind_attr = getattr(item, "computation_type", None)
    if kind_attr is None:
        raise ScheduleError(f"{item!r} is neither an action string, an Action nor PyTorch's _Action")
    kind = getattr(kind_attr, "value", kind_attr)
    if kind in _IMPLIED_KINDS:
        return None, []
    if kind not in COMPUTE_KINDS:
        raise ScheduleError(f"{item!r}: unknown computation type {kind!r}")
    if item.microbatch_index is None:
        raise ScheduleError(f"{item!r}: compute action without a microbatch")
    return Action(int(item.stage_index), str(kind), int(item.microbatch_index)), []


def compute_actions(row: Iterable[Any]) -> list[Action]:
    """One rank's compute actions, in order, from its schedule row: PyTorch ``_Action`` objects, action
    strings (``"0F1"``, ``"(0F1;1B0)OVERLAP_F_B"``), :class:`Action` or ``None`` (an idle step, dropped).
    ``OVERLAP_F_B`` becomes its sub-actions; communication and bookkeeping actions are dropped. An explicit
    stack, no recursion.

    Raises:
        ScheduleError: an item that is no action, or an unknown computation type.
    """
    found: list[Action] = []
    stack = list(reversed(list(row)))
    while stack:
        item = stack.pop()
        if item is None:
            continue
        if isinstance(item, Action):
            found.append(item)
        elif isinstance(item, str):
            text = item.strip()
            if text.startswith("(") and ")" in text:
                stack.extend(reversed(text[1 : text.index(")")].split(";")))
                continue
            action = Action.parse(text)
            if action is not None:
                found.append(action)
        else:
            action, sub_actions = _torch_action(item)
            if action is not None:
                found.append(action)
            stack.extend(reversed(sub_actions))
    return found


def schedule_actions(schedule: Any) -> dict[int, list[Action]]:
    """Every rank's compute actions, in order: ``{rank: [Action, ...]}`` with ranks ``0 .. R-1``.

    ``schedule``: a :class:`ScheduleOrder`, a PyTorch schedule object (its ``pipeline_order``, else
    ``pipeline_order_with_comms``), a mapping ``rank -> actions``, or a sequence of per-rank action lists;
    actions as :func:`compute_actions` reads them.

    Raises:
        ScheduleError: no ranks, ranks not numbered ``0 .. R-1``, or an action that cannot be read.
    """
    if isinstance(schedule, ScheduleOrder):
        return schedule.actions()
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
    return {int(rank): compute_actions(row) for rank, row in sorted(items)}


@dataclass(slots=True, frozen=True)
class ScheduleOrder:
    """A schedule as data: its name and every rank's compute actions, one stage or more per rank.

    Built by graphkit's generators (:mod:`graphkit.pipelining.planning.registry`) or read once from a
    user's CSV file (:meth:`from_csv`); passed down to the ranks as it is (it pickles), where
    ``graphkit.pipelining.schedules.build_schedule`` loads it into ``_PipelineScheduleRuntime``.

    Attributes:
        name: what it is called in tables and timelines (``"ZBH1"``, ``"csv:plan/best.csv"``).
        rows: per rank (index = rank), its compute actions in order.
        path: the CSV file it was read from, if any.
    """

    name: str
    rows: tuple[tuple[Action, ...], ...]
    path: str | None = None

    @classmethod
    def from_actions(cls, name: str, schedule: Any) -> ScheduleOrder:
        """A named order from anything :func:`schedule_actions` reads.

        Raises:
            ScheduleError: as :func:`schedule_actions`.
        """
        actions = schedule_actions(schedule)
        return cls(name, tuple(tuple(actions[rank]) for rank in range(len(actions))))

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str], name: str | None = None) -> ScheduleOrder:
        """The order a CSV schedule file holds (PyTorch's format, compute-only or with communication);
        named ``csv:PATH`` unless ``name`` is given.

        Raises:
            ScheduleError: a cell is no action, or the file cannot be read (the message names the file).
        """
        try:
            with open(path, newline="") as handle:
                rows = list(csv.reader(handle))
        except OSError as error:
            raise ScheduleError(f"cannot read the schedule file {os.fspath(path)!r}: {error}") from None
        try:
            order = cls.from_actions(name or f"csv:{os.fspath(path)}", rows)
        except ScheduleError as error:
            raise ScheduleError(f"{os.fspath(path)}: {error}") from None
        return cls(order.name, order.rows, os.fspath(path))

    def actions(self) -> dict[int, list[Action]]:
        """``{rank: [Action, ...]}``."""
        return {rank: list(row) for rank, row in enumerate(self.rows)}

    def labels(self) -> dict[int, list[str]]:
        """``{rank: ["0F0", "0F1", ...]}``."""
        return {rank: [str(action) for action in row] for rank, row in enumerate(self.rows)}

    @property
    def num_ranks(self) -> int:
        return len(self.rows)

    @property
    def num_stages(self) -> int:
        """How many stages the order names (one more than the highest)."""
        return 1 + max((action.stage for row in self.rows for action in row), default=-1)

    @property
    def microbatches(self) -> int:
        """How many microbatches the order runs (one more than the highest it names)."""
        return 1 + max((action.microbatch for row in self.rows for action in row), default=-1)

    def stages_of(self, rank: int) -> list[int]:
        """The stages rank ``rank`` runs, ascending.

        Raises:
            ScheduleError: the order has no such rank.
        """
        if not 0 <= rank < len(self.rows):
            raise ScheduleError(f"{self.name} holds the actions of {len(self.rows)} ranks, not rank {rank}")
        return sorted({action.stage for action in self.rows[rank]})

    def write_csv(self, path: str | os.PathLike[str]) -> None:
        """Write the order as PyTorch's compute-only CSV (see :func:`write_schedule_csv`)."""
        write_schedule_csv(self.actions(), path)


def write_schedule_csv(actions: Any, path: str | os.PathLike[str]) -> None:
    """Write per-rank action lists as PyTorch's compute-only CSV: row ``r`` holds rank ``r``'s actions.

    ``actions``: anything :func:`schedule_actions` reads. ``_PipelineScheduleRuntime(stages,
    n_microbatches)._load_csv(path, format="compute_only")`` loads the file.

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
        ScheduleError: a cell is not an action, or the file cannot be read.
    """
    return ScheduleOrder.from_csv(path).actions()
