"""Predict a pipeline schedule's step from per-stage costs: every action's start and end on every rank.

:func:`simulate` takes a schedule (any per-rank order :func:`~graphkit.pipelining.planning.actions.schedule_actions`
reads: a PyTorch schedule's ``pipeline_order`` or ``pipeline_order_with_comms``, a CSV's rows, lists of
strings), the costs of each stage (:class:`~graphkit.pipelining.planning.cost_model.StageCost`) and a link model
(:class:`~graphkit.pipelining.planning.cost_model.CommModel`), and returns a :class:`Simulation`: the predicted
timeline, the step time, the bubble fraction of each rank, the peak activation memory of each rank and the
messages that cross ranks. No process, no process group, no torch.

The model:

- each rank runs its list in order, one action at a time; an action starts as soon as its rank is free
  and its inputs are there; every rank starts at time 0 and the step ends when the last action does;
- F of stage ``s`` needs F of stage ``s - 1`` (same microbatch); I or B of stage ``s`` needs its own F
  and I-or-B of stage ``s + 1`` (the last stage: its own F only); W needs its own I;
- a dependency between stages on different ranks arrives one message later
  (:meth:`CommModel.seconds` of the F's ``output_bytes`` or the backward's ``input_grad_bytes``);
  within a rank it arrives at once. Messages overlap compute (sends never block the sender);
- memory per rank as :mod:`graphkit.pipelining.planning.cost_model` counts it (F allocates at its start, backwards
  free at their end).

The placement (which rank runs which stage) is read from the lists. Each rank advances a pointer through
its list and parks on the one input it waits for; finishing an action wakes the rank parked on it, so the
work is linear in the number of actions (64 ranks x 256 microbatches of 1F1B, 49k actions: well under a
second, ``bench/simulate.py``). A schedule no rank can advance raises :class:`DeadlockError` naming the
waiting actions; one missing an action, or running one twice, raises :class:`IncompleteScheduleError`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphkit.pipelining.planning.actions import Action, ScheduleError, TimedAction, schedule_actions
from graphkit.pipelining.planning.cost_model import CommModel, StageCost, stage_costs
from graphkit.pipelining.planning.timelines import RankTimeline, ScheduleTimeline

__all__ = [
    "DeadlockError",
    "IncompleteScheduleError",
    "Simulation",
    "Waiting",
    "recorded_durations",
    "simulate",
]


@dataclass(slots=True, frozen=True)
class Waiting:
    """A rank that cannot move: it stands at ``action`` (``position`` in its list), which needs ``needs``.

    ``needs_rank``: the rank whose list holds ``needs`` (None if none does).
    """

    rank: int
    position: int
    action: Action
    needs: Action
    needs_rank: int | None

    def __str__(self) -> str:
        where = "no rank runs it" if self.needs_rank is None else f"on rank {self.needs_rank}"
        if self.needs_rank == self.rank:
            where = f"on rank {self.rank} itself, later in its own order"
        return (
            f"rank {self.rank} waits at {self.action} (position {self.position}) for {self.needs} ({where})"
        )


class DeadlockError(ScheduleError):
    """No rank can run its next action. ``waiting``: every stuck rank, what it stands at, what it needs."""

    def __init__(self, waiting: list[Waiting]) -> None:
        self.waiting = waiting
        lines = "\n".join(f"  {item}" for item in waiting)
        super().__init__(f"the schedule deadlocks: {len(waiting)} rank(s) cannot progress\n{lines}")


class IncompleteScheduleError(ScheduleError):
    """The lists lack an action every microbatch needs, or hold one twice. ``problems``: one line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n".join(f"  {line}" for line in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"the schedule is incomplete ({len(problems)} problem(s)):\n{shown}{more}")


@dataclass(slots=True)
class Simulation:
    """A predicted step.

    Attributes:
        name: what was simulated (a schedule's name). num_ranks, num_stages, microbatches: its shape.
        placement: stage index -> rank.
        per_rank: each rank's actions in its order, with their predicted times (seconds since the step
            began) and the activation bytes alive on the rank when each ends.
        step_seconds: the step time (makespan: the last action's end).
        busy_seconds: per rank, seconds spent computing.
        peak_memory_bytes: per rank, the most activation bytes alive at once.
        messages: point-to-point messages per step between different ranks; message_bytes: their bytes.
    """

    name: str
    num_ranks: int
    num_stages: int
    microbatches: int
    placement: dict[int, int]
    per_rank: list[list[TimedAction]]
    step_seconds: float
    busy_seconds: list[float]
    peak_memory_bytes: list[int]
    messages: int
    message_bytes: int

    @property
    def actions(self) -> list[TimedAction]:
        """Every action, rank by rank, each rank's in its order."""
        return [action for row in self.per_rank for action in row]

    def rank_actions(self, rank: int) -> list[TimedAction]:
        """The actions of ``rank`` in its order."""
        return self.per_rank[rank]

    @property
    def idle_seconds(self) -> list[float]:
        """Per rank, seconds of the step not spent computing."""
        return [self.step_seconds - busy for busy in self.busy_seconds]

    @property
    def rank_bubble_fractions(self) -> list[float]:
        """Per rank, idle seconds / step seconds."""
        step = self.step_seconds
        return [idle / step if step > 0 else 0.0 for idle in self.idle_seconds]

    @property
    def rank_span_seconds(self) -> list[float]:
        """Per rank, seconds from its first action's start to its last action's end (0 with no actions).

        The ZB paper counts a rank's bubble inside this span (``span - busy``): when consecutive steps
        overlap (no synchronized optimizer step), ``max(rank_span_seconds)`` is the step period."""
        spans = []
        for rank in range(self.num_ranks):
            actions = self.rank_actions(rank)
            spans.append(actions[-1].end - actions[0].start if actions else 0.0)
        return spans

    @property
    def bubble_fraction(self) -> float:
        """All ranks' idle seconds / (ranks x step seconds)."""
        total = self.step_seconds * self.num_ranks
        return sum(self.idle_seconds) / total if total > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """Step time, bubble and peak memory per rank, messages: plain data (JSON-ready)."""
        return {
            "schedule": self.name,
            "ranks": self.num_ranks,
            "stages": self.num_stages,
            "microbatches": self.microbatches,
            "step_seconds": self.step_seconds,
            "bubble_fraction": self.bubble_fraction,
            "rank_bubble_fraction": self.rank_bubble_fractions,
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "messages": self.messages,
            "message_bytes": self.message_bytes,
        }

    def table(self) -> str:
        """A plain-text table: one row per rank (busy, idle, bubble, peak memory) under a header line."""
        lines = [
            f"{self.name}: {self.num_ranks} ranks, {self.num_stages} stages, {self.microbatches} microbatches; "
            f"step {self.step_seconds:.6g} s, bubble {self.bubble_fraction:.1%}, "
            f"{self.messages} messages ({self.message_bytes} bytes)",
            f"{'rank':>4}  {'busy s':>12}  {'idle s':>12}  {'bubble':>7}  {'peak bytes':>12}",
        ]
        for rank in range(self.num_ranks):
            lines.append(
                f"{rank:>4}  {self.busy_seconds[rank]:>12.6g}  {self.idle_seconds[rank]:>12.6g}  "
                f"{self.rank_bubble_fractions[rank]:>7.1%}  {self.peak_memory_bytes[rank]:>12}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_schedule_timeline(self) -> Any:
        """The prediction as a recorded-timeline ``ScheduleTimeline``, so graphkit's timeline drawing
        (``timeline_svg``) shows predicted and recorded steps side by side. Every rank's step is the
        predicted step time (its idle tail shows); ``device`` is ``"predicted"``."""
        ranks = []
        for rank in range(self.num_ranks):
            actions = self.rank_actions(rank)
            ranks.append(
                RankTimeline(
                    rank=rank,
                    stages=sorted(stage for stage, owner in self.placement.items() if owner == rank),
                    actions=list(actions),
                    step_seconds=self.step_seconds,
                    peak_memory_bytes=self.peak_memory_bytes[rank],
                    expected_order=[a.label for a in actions],
                )
            )
        return ScheduleTimeline(
            schedule=self.name,
            microbatches=self.microbatches,
            num_stages=self.num_stages,
            ranks=ranks,
            device="predicted",
            memory_method="simulated activation bytes (graphkit.pipelining.planning)",
        )


def _placement(actions: dict[int, list[Action]]) -> tuple[dict[int, int], int, int]:
    """Stage -> rank, the number of stages and of microbatches, read from the lists."""
    placement: dict[int, int] = {}
    microbatches = 0
    for rank, row in actions.items():
        for action in row:
            if action.stage < 0 or action.microbatch < 0:
                raise ScheduleError(f"rank {rank}: {action} has a negative stage or microbatch")
            owner = placement.setdefault(action.stage, rank)
            if owner != rank:
                raise ScheduleError(f"stage {action.stage} runs on rank {owner} and on rank {rank}")
            microbatches = max(microbatches, action.microbatch + 1)
    if not placement:
        raise ScheduleError("the schedule has no compute actions")
    num_stages = max(placement) + 1
    absent = sorted(set(range(num_stages)) - set(placement))
    if absent:
        raise IncompleteScheduleError([f"stage {stage} has no actions on any rank" for stage in absent])
    return placement, num_stages, microbatches


def _completeness_problems(actions: dict[int, list[Action]], num_stages: int, microbatches: int) -> list[str]:
    """What breaks "every (stage, microbatch) has one F and either one B or one I and one W, nothing twice"."""
    counts = Counter(action for row in actions.values() for action in row)
    in_range = all(action.microbatch < microbatches for action in counts)
    if in_range and len(counts) == sum(map(len, actions.values())):  # nothing twice: count per stage and kind
        per_kind = Counter((stage, kind) for stage, kind, _ in counts)
        if all(
            per_kind[stage, "F"] == microbatches
            and (
                (per_kind[stage, "B"] == microbatches and not per_kind[stage, "I"] + per_kind[stage, "W"])
                or (per_kind[stage, "I"] == per_kind[stage, "W"] == microbatches and not per_kind[stage, "B"])
            )
            for stage in range(num_stages)
        ):
            return []  # every action once, in range, and the counts add up: complete
    problems = [f"{action} runs {n} times" for action, n in counts.items() if n > 1]
    for stage in range(num_stages):
        for mb in range(microbatches):
            has = {kind for kind in "FIWB" if Action(stage, kind, mb) in counts}
            if "F" not in has:
                problems.append(f"{stage}F{mb} is missing: stage {stage} never runs microbatch {mb} forward")
            if "B" in has and has & {"I", "W"}:
                problems.append(f"stage {stage} microbatch {mb} has both a full backward B and a split I/W")
            elif "B" not in has:
                if "I" not in has:
                    problems.append(
                        f"{stage}I{mb} (or {stage}B{mb}) is missing: microbatch {mb} is never backwarded"
                    )
                if "W" not in has:
                    problems.append(
                        f"{stage}W{mb} is missing: the weight gradient of microbatch {mb} never runs"
                    )
    return problems


def simulate(
    schedule: Any,
    costs: StageCost | Sequence[StageCost],
    comm: CommModel | None = None,
    *,
    microbatches: int | None = None,
    name: str | None = None,
    durations: Mapping[Any, float] | None = None,
    overhead: float = 0.0,
) -> Simulation:
    """Predict one step of ``schedule`` with per-stage ``costs`` and link model ``comm`` (default: free).

    Args:
        schedule: per-rank action lists (see :func:`~graphkit.pipelining.planning.actions.schedule_actions`).
        costs: one :class:`StageCost` for every stage, or one per stage (index = stage).
        comm: message cost between ranks; None: messages take no time.
        microbatches: microbatches per step; None: one more than the largest the lists name. Given, an
            action on a microbatch outside ``0 .. microbatches - 1`` is a problem.
        name: the name the result carries (default: the schedule object's class name, else "schedule").
        durations: seconds of single actions, overriding ``costs`` for them: ``{Action or "0F1": seconds}``
            (:func:`recorded_durations` reads them from a recorded step).
        overhead: seconds the runtime spends on each rank after each compute action besides computing
            (its own bookkeeping; ``comm.send_seconds`` more after an action that sends to another rank):
            the rank's next action starts no earlier;
            counted as idle, not busy, as a recorded timeline counts it. Messages leave at the action's end.

    Returns:
        The :class:`Simulation`; seconds and bytes in the units of ``costs``.

    Raises:
        ScheduleError: unreadable actions, a stage on two ranks, costs for the wrong number of stages.
        IncompleteScheduleError: an action missing or repeated.
        DeadlockError: the order cannot run; the message names every waiting rank and what it needs.
    """
    if name is None:
        name = type(schedule).__name__ if hasattr(schedule, "pipeline_order") else "schedule"
    actions = schedule_actions(schedule)
    placement, num_stages, named = _placement(actions)
    if microbatches is None:
        microbatches = named
    outside = sorted(
        {str(action) for row in actions.values() for action in row if action.microbatch >= microbatches}
    )
    problems = [f"{label} names a microbatch outside 0 .. {microbatches - 1}" for label in outside]
    problems += _completeness_problems(actions, num_stages, microbatches)
    if problems:
        raise IncompleteScheduleError(problems)
    try:
        per_stage = stage_costs(costs, num_stages)
    except ValueError as error:
        raise ScheduleError(str(error)) from None
    comm = comm or CommModel()
    num_ranks = len(actions)

    duration = {kind: [cost.seconds(kind) for cost in per_stage] for kind in "FIWB"}
    if not (overhead >= 0 and overhead != float("inf")):
        raise ValueError(f"overhead must be finite seconds >= 0, got {overhead!r}")
    seconds_of = [[duration[kind][stage] for stage, kind, _ in actions[rank]] for rank in range(num_ranks)]
    if durations:
        given = {
            (item if isinstance(item, Action) else Action.parse(str(item))): value
            for item, value in durations.items()
        }
        for rank in range(num_ranks):
            row = seconds_of[rank]
            for position, action in enumerate(actions[rank]):
                if action in given:
                    row[position] = given[action]
    # arrival delay of stage s's F output at stage s+1, and of stage s's input gradient at stage s-1
    forward_delay = [
        comm.seconds(per_stage[s].output_bytes)
        if s + 1 < num_stages and placement[s] != placement[s + 1]
        else 0.0
        for s in range(num_stages)
    ]
    backward_delay = [
        comm.seconds(per_stage[s].input_grad_bytes) if s > 0 and placement[s] != placement[s - 1] else 0.0
        for s in range(num_stages)
    ]
    rendezvous = comm.rendezvous
    # what the rank spends after an action sending its result to another rank: F forward, I or B backward
    send_after = comm.send_seconds
    forward_send = [
        send_after if s + 1 < num_stages and placement[s] != placement[s + 1] else 0.0
        for s in range(num_stages)
    ]
    backward_send = [
        send_after if s > 0 and placement[s] != placement[s - 1] else 0.0 for s in range(num_stages)
    ]
    last = num_stages - 1
    f_end: list[list[float | None]] = [[None] * microbatches for _ in range(num_stages)]
    grad_end: list[list[float | None]] = [[None] * microbatches for _ in range(num_stages)]  # I or B
    i_end: list[list[float | None]] = [[None] * microbatches for _ in range(num_stages)]

    pointer = [0] * num_ranks
    free_at = [0.0] * num_ranks
    starts: list[list[float]] = [[] for _ in range(num_ranks)]
    parked: dict[tuple[str, int, int], int] = {}  # (table, stage, microbatch) -> the rank waiting on it
    blocked_on: dict[int, tuple[str, int, int]] = {}
    stack = list(range(num_ranks - 1, -1, -1))

    while stack:
        rank = stack.pop()
        row = actions[rank]
        position = pointer[rank]
        clock = free_at[rank]
        rank_starts = starts[rank]
        rank_seconds = seconds_of[rank]
        while position < len(row):
            stage, kind, mb = row[position]
            ready = clock
            need: tuple[str, int, int] | None = None
            if kind == "F":
                if stage > 0:
                    arrival = f_end[stage - 1][mb]
                    if arrival is None:
                        need = ("F", stage - 1, mb)
                    elif rendezvous:
                        ready = max(ready, arrival) + forward_delay[stage - 1]
                    else:
                        ready = max(ready, arrival + forward_delay[stage - 1])
            elif kind == "W":
                done = i_end[stage][mb]
                if done is None:
                    need = ("I", stage, mb)
                else:
                    ready = max(ready, done)
            else:  # I or B
                done = f_end[stage][mb]
                if done is None:
                    need = ("F", stage, mb)
                else:
                    ready = max(ready, done)
                    if stage < last:
                        arrival = grad_end[stage + 1][mb]
                        if arrival is None:
                            need = ("G", stage + 1, mb)
                        elif rendezvous:
                            ready = max(ready, arrival) + backward_delay[stage + 1]
                        else:
                            ready = max(ready, arrival + backward_delay[stage + 1])
            if need is not None:
                parked[need] = rank
                blocked_on[rank] = need
                break
            end = ready + rank_seconds[position]
            rank_starts.append(ready)
            clock = end + overhead
            position += 1
            if kind == "F":
                keys: tuple[tuple[str, int, int], ...] = (("F", stage, mb),)
                f_end[stage][mb] = end
                clock += forward_send[stage]
            elif kind == "W":
                keys = ()
            else:
                grad_end[stage][mb] = end
                clock += backward_send[stage]
                keys = (("G", stage, mb),)
                if kind == "I":
                    i_end[stage][mb] = end
                    keys = (("G", stage, mb), ("I", stage, mb))
            for key in keys:
                waiter = parked.pop(key, None)
                if waiter is not None:
                    del blocked_on[waiter]
                    stack.append(waiter)
        pointer[rank] = position
        free_at[rank] = clock

    stuck = [rank for rank in range(num_ranks) if pointer[rank] < len(actions[rank])]
    if stuck:
        raise DeadlockError(_waiting(actions, placement, pointer, blocked_on, stuck))
    return _result(name, actions, placement, num_stages, microbatches, per_stage, seconds_of, starts)


def _waiting(
    actions: dict[int, list[Action]],
    placement: dict[int, int],
    pointer: list[int],
    blocked_on: dict[int, tuple[str, int, int]],
    stuck: list[int],
) -> list[Waiting]:
    """What each stuck rank stands at and the action it needs (an I it needs may also be a B)."""
    present = {action for row in actions.values() for action in row}
    waiting = []
    for rank in stuck:
        table, stage, mb = blocked_on[rank]
        if table == "G":
            needs = Action(stage, "I", mb) if Action(stage, "I", mb) in present else Action(stage, "B", mb)
        else:
            needs = Action(stage, table, mb)
        needs_rank = placement.get(stage) if needs in present else None
        waiting.append(Waiting(rank, pointer[rank], actions[rank][pointer[rank]], needs, needs_rank))
    return waiting


def _result(
    name: str,
    actions: dict[int, list[Action]],
    placement: dict[int, int],
    num_stages: int,
    microbatches: int,
    per_stage: list[StageCost],
    seconds_of: list[list[float]],
    starts: list[list[float]],
) -> Simulation:
    """Timeline, busy time, memory and messages from the start times the simulation found."""
    predicted: list[list[TimedAction]] = []
    busy: list[float] = []
    peaks: list[int] = []
    messages = 0
    message_bytes = 0
    step = 0.0
    for rank in range(len(actions)):
        timed: list[TimedAction] = []
        alive = 0
        peak = 0
        rank_busy = 0.0
        for action, start, seconds in zip(actions[rank], starts[rank], seconds_of[rank], strict=True):
            stage, kind, _ = action
            cost = per_stage[stage]
            end = start + seconds
            rank_busy += seconds
            if kind == "F":
                alive += cost.activation_bytes
                peak = max(peak, alive)
                if stage + 1 < num_stages and placement[stage + 1] != rank:
                    messages += 1
                    message_bytes += cost.output_bytes
            else:
                if kind == "I":
                    alive -= cost.activation_bytes - cost.weight_bytes
                elif kind == "W":
                    alive -= cost.weight_bytes
                else:
                    alive -= cost.activation_bytes
                if kind != "W" and stage > 0 and placement[stage - 1] != rank:
                    messages += 1
                    message_bytes += cost.input_grad_bytes
            timed.append(TimedAction(action, start, end, "run", alive))
            step = max(step, end)
        predicted.append(timed)
        busy.append(rank_busy)
        peaks.append(peak)
    return Simulation(
        name=name,
        num_ranks=len(actions),
        num_stages=num_stages,
        microbatches=microbatches,
        placement=dict(sorted(placement.items())),
        per_rank=predicted,
        step_seconds=step,
        busy_seconds=busy,
        peak_memory_bytes=peaks,
        messages=messages,
        message_bytes=message_bytes,
    )


def recorded_durations(timeline: ScheduleTimeline) -> dict[Action, float]:
    """Every compute action's recorded seconds in a recorded step: ``{Action: seconds}``, for
    :func:`simulate`'s ``durations``."""
    return {
        item.action: item.seconds
        for rank in timeline.ranks
        for item in rank.actions
        if item.phase == "run" and item.is_compute
    }
