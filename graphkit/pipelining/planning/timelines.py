"""What a schedule step ran on every rank, and when, as plain data: recorded by
:mod:`graphkit.pipelining.recording`, predicted by :mod:`graphkit.pipelining.planning.simulator`, drawn by
:mod:`graphkit.drawing.timeline`.

Each rank's actions are :class:`~graphkit.pipelining.planning.actions.TimedAction` records: the one
:class:`~graphkit.pipelining.planning.actions.Action` record with its times. Kinds of actions (PyTorch's
names): ``F`` forward, ``I`` input-gradient backward (B in the ZB paper), ``W`` weight-gradient backward,
``B`` full backward, ``SEND_F`` / ``RECV_F`` activations, ``SEND_B`` / ``RECV_B`` gradients. Times are
seconds since the step's start on each rank; memory in bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graphkit.pipelining.planning.actions import TimedAction

__all__ = ["RankTimeline", "ScheduleTimeline", "TimelineError"]


class TimelineError(RuntimeError):
    """A schedule could not be recorded (bad arguments, a failed or stuck rank); the message says why."""


@dataclass(slots=True)
class RankTimeline:
    """What one rank ran in the recorded step, and the schedule's own compute order for it."""

    rank: int
    stages: list[int]
    actions: list[TimedAction]
    step_seconds: float
    peak_memory_bytes: int | None
    expected_order: list[str] = field(default_factory=list)
    expected_comms: list[str] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)

    def compute_actions(self) -> list[TimedAction]:
        return [action for action in self.actions if action.is_compute]

    def compute_order(self) -> list[str]:
        """Labels of the compute actions in the order they ran (``["0F0", "0F1", "0I0", ...]``)."""
        return [action.label for action in self.compute_actions()]

    def comm_order(self) -> list[str]:
        """Labels of the sends and receives in the order they were issued (``["0SEND_F0", ...]``)."""
        return [action.label for action in self.actions if action.phase == "issue"]

    def compute_seconds(self) -> float:
        return sum(action.end - action.start for action in self.compute_actions())


@dataclass(slots=True)
class ScheduleTimeline:
    """One recorded step of one schedule on every rank.

    Attributes:
        schedule: the schedule's name, as graphkit names schedules (``ZBVZeroBubble``, ``1F1B``, ``ZBH1``).
        microbatches: microbatches per step; num_stages: pipeline stages.
        ranks: one :class:`RankTimeline` per rank, by rank.
        device: where the stages ran; memory_method: how memory was sampled.
        setup_seconds: when the recorded step is a schedule's first (``verify-pipeline --timeline`` with
            one step), the time before any rank's first action: PyTorch's first ``step`` sets the stages
            up and infers the shapes they send and receive before it runs an action. 0 otherwise (the
            ``timeline`` command runs an unrecorded step first). It is drawn and labelled, and left out of
            the bubble fractions.
    """

    schedule: str
    microbatches: int
    num_stages: int
    ranks: list[RankTimeline]
    device: str = "cpu"
    memory_method: str = ""
    setup_seconds: float = 0.0

    @property
    def step_seconds(self) -> float:
        """The step's wall time: the longest rank's."""
        return max((rank.step_seconds for rank in self.ranks), default=0.0)

    @property
    def bubble_fraction(self) -> float:
        """Share of rank-time not spent computing: ``1 - sum(compute seconds) / (ranks * step seconds)``
        (the step's seconds without :attr:`setup_seconds`)."""
        total = (self.step_seconds - self.setup_seconds) * len(self.ranks)
        return 1.0 - sum(rank.compute_seconds() for rank in self.ranks) / total if total > 0 else 0.0

    def rank_bubble_fraction(self, rank: int) -> float:
        """One rank's share of the step spent not computing (without :attr:`setup_seconds`)."""
        step = self.step_seconds - self.setup_seconds
        return 1.0 - self.ranks[rank].compute_seconds() / step if step > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """Step time, bubble fraction and peak memory per rank: what :func:`compare` puts side by side."""
        return {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "ranks": len(self.ranks),
            "step_seconds": self.step_seconds,
            "setup_seconds": self.setup_seconds,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": [rank.peak_memory_bytes for rank in self.ranks],
            "rank_bubble_fraction": [self.rank_bubble_fraction(rank.rank) for rank in self.ranks],
            "recorded_step_seconds": self.ranks[0].step_times if self.ranks else [],
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready), with :meth:`summary` under ``"summary"``."""
        return {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "num_stages": self.num_stages,
            "ranks": [
                {
                    "rank": rank.rank,
                    "stages": list(rank.stages),
                    "actions": [action.to_dict() for action in rank.actions],
                    "step_seconds": rank.step_seconds,
                    "peak_memory_bytes": rank.peak_memory_bytes,
                    "expected_order": list(rank.expected_order),
                    "expected_comms": list(rank.expected_comms),
                    "step_times": list(rank.step_times),
                }
                for rank in self.ranks
            ],
            "device": self.device,
            "memory_method": self.memory_method,
            "setup_seconds": self.setup_seconds,
            "summary": self.summary(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScheduleTimeline:
        """Rebuild a timeline from :meth:`to_dict` (the ``summary`` key is ignored)."""
        ranks = [
            RankTimeline(
                rank=rank["rank"],
                stages=list(rank["stages"]),
                actions=[TimedAction.from_dict(action) for action in rank["actions"]],
                step_seconds=rank["step_seconds"],
                peak_memory_bytes=rank["peak_memory_bytes"],
                expected_order=list(rank.get("expected_order", [])),
                expected_comms=list(rank.get("expected_comms", [])),
                step_times=list(rank.get("step_times", [])),
            )
            for rank in data["ranks"]
        ]
        return cls(
            data["schedule"],
            data["microbatches"],
            data["num_stages"],
            ranks,
            data.get("device", "cpu"),
            data.get("memory_method", ""),
            data.get("setup_seconds", 0.0),
        )

    @classmethod
    def merge(cls, parts: Sequence[ScheduleTimeline]) -> ScheduleTimeline:
        """One step's timelines recorded on separate ranks, as one: every rank of every part, by rank.

        The schedule, microbatches, stages, device and memory method are the first part's; the set-up time
        is the shortest any part saw (the step's actions began on every rank after it).

        Raises:
            TimelineError: no parts.
        """
        if not parts:
            raise TimelineError("no recorded ranks to merge into a timeline")
        first = parts[0]
        return cls(
            first.schedule,
            first.microbatches,
            first.num_stages,
            sorted((rank for part in parts for rank in part.ranks), key=lambda rank: rank.rank),
            first.device,
            first.memory_method,
            min(part.setup_seconds for part in parts),
        )

    def _repr_svg_(self) -> str:
        from graphkit.drawing.timeline import timeline_svg

        return timeline_svg(self)
