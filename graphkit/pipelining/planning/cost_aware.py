"""Split the backward only where it pays: per rank and microbatch, a full backward B or I then W.

Zero-bubble schedules split every backward into I (input gradients, what the previous stage waits for) and
W (weight gradients, which can wait). That fills 1F1B's bubble with W's, but it costs ``I + W - B`` on every
microbatch; where the split backward costs more than the full one (graphkit's split on a CPU: ``I + W`` is
1.2 to 1.45 ``B`` on the stages measured in ``docs/choosing_a_schedule.md``) splitting everything can lose
more than the bubble it fills. :func:`cost_aware_schedule` decides per microbatch instead, for one stage per
rank (stage ``i`` on rank ``i``, 1F1B's messages), scoring every order it tries with
:func:`~graphkit.pipelining.planning.simulator.simulate` under the same costs, link model and memory limit:

1. **Candidates**: 1F1B (every backward full), ZB-H1 and ZB-H2 (every backward split,
   :mod:`~graphkit.pipelining.planning.generation`) and the adaptive order
   (:func:`~graphkit.pipelining.planning.adaptive.adaptive_schedule`, which fits limits below 1F1B's peak),
   those within the memory limit. The result is never predicted slower than the best of them.
2. **1F1B with the last k microbatches split**, ``k`` chosen per rank by coordinate descent (each rank's
   ``k`` in turn, ``0 .. min(m, 2p)``, until no rank's changes): an early I unblocks the previous rank in the
   cool-down, where 1F1B leaves its bubble, and the W's run at the end of the rank's list.
3. **W's into idle time**: each W moves to the first gap of its rank's predicted timeline, after its I, long
   enough to hold it (``W`` plus ``overhead``); a move that would lengthen the step is undone.
4. **Local search per microbatch**, from the best order so far: split a full backward (I in its place, W
   into the first gap as in 3) or join an I and its W into a full backward, one (rank, microbatch) at a
   time, kept when the predicted step gets shorter within the memory limit; passes until none helps.

Every stage accumulates its weight gradients in microbatch order - its B's and W's run in microbatch order,
as in 1F1B and ZB-H1 - so the gradients are bit for bit those of a full backward over the batch: a W never
moves before the previous microbatch's B or W, and an I joins its W into a B only where that keeps the order.

Memory is counted as :mod:`graphkit.pipelining.planning.cost_model` describes: a split microbatch holds
``weight_bytes`` from its I until its W, a full backward frees everything at once, so splitting fewer
microbatches also holds less. The search is a heuristic (the ZB paper's ILP is not solved); it needs no
torch; every rank that runs it by name builds it, in 1 to 3 s for 8 ranks x 16 microbatches and about 15 s for
16 x 32 on a loaded 2-core machine (`bench/cost_aware.py`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

from graphkit.pipelining.planning.actions import Action, ScheduleError
from graphkit.pipelining.planning.adaptive import _limits, adaptive_schedule
from graphkit.pipelining.planning.cost_model import CommModel, StageCost, stage_costs
from graphkit.pipelining.planning.generation import one_f_one_b, zb_h1, zb_h2
from graphkit.pipelining.planning.simulator import simulate

__all__ = ["cost_aware_schedule", "split_last"]

Order = dict[int, list[Action]]


def split_last(num_ranks: int, microbatches: int, split: Sequence[int]) -> Order:
    """1F1B with the backwards of the last ``split[r]`` microbatches of rank ``r`` split into I then W, their
    W's at the end of the rank's list (in microbatch order).

    ``split[r] = 0`` everywhere is 1F1B itself.

    Raises:
        ValueError: fewer than one rank or microbatch, or ``split`` not one count in ``0 .. microbatches``
            per rank.
    """
    if len(split) != num_ranks or any(not 0 <= count <= microbatches for count in split):
        raise ValueError(
            f"split must give 0 .. {microbatches} for each of {num_ranks} ranks, got {list(split)}"
        )
    order = one_f_one_b(num_ranks, microbatches)
    for rank, row in order.items():
        first_split = microbatches - split[rank]
        order[rank] = [
            Action(rank, "I", a.microbatch) if a.kind == "B" and a.microbatch >= first_split else a
            for a in row
        ] + [Action(rank, "W", mb) for mb in range(first_split, microbatches)]
    return order


class _Search:
    """Scores orders with :func:`simulate` (step, then the highest peak), keeps the best within the limits."""

    def __init__(
        self, costs: list[StageCost], microbatches: int, limits: list[float], comm: CommModel, overhead: float
    ) -> None:
        self.costs, self.microbatches, self.limits = costs, microbatches, limits
        self.comm, self.overhead = comm, overhead
        self.best: tuple[float, int] | None = None
        self.best_order: Order | None = None

    def score(self, order: Order) -> tuple[float, int] | None:
        """(step seconds, highest peak bytes), None when a rank's peak is over its limit."""
        result = simulate(
            order, self.costs, self.comm, microbatches=self.microbatches, overhead=self.overhead
        )
        peaks = result.peak_memory_bytes
        if any(peak > limit for peak, limit in zip(peaks, self.limits, strict=True)):
            return None
        return result.step_seconds, max(peaks)

    def offer(self, order: Order, score: tuple[float, int] | None = None) -> tuple[float, int] | None:
        """Score ``order`` (unless given) and keep it if it beats the best so far; returns its score."""
        score = self.score(order) if score is None else score
        if score is not None and (self.best is None or score < self.best):
            self.best, self.best_order = score, {rank: list(row) for rank, row in order.items()}
        return score

    def timeline(self, order: Order, rank: int) -> list[tuple[float, float]]:
        """(start, end) of each action of ``rank``, in its order."""
        result = simulate(
            order, self.costs, self.comm, microbatches=self.microbatches, overhead=self.overhead
        )
        return [(action.start, action.end) for action in result.rank_actions(rank)]

    def place_weight(self, order: Order, rank: int, microbatch: int) -> Order:
        """``order`` with rank's W of ``microbatch`` moved into the first gap that holds it after its I and
        after the weight gradients of the microbatch before (a B or a W: they accumulate in order)."""
        row = order[rank]
        position = row.index(Action(rank, "W", microbatch))
        after = row.index(Action(rank, "I", microbatch))
        if microbatch > 0:
            after = max(after, _weight_position(row, rank, microbatch - 1))
        times = self.timeline(order, rank)
        need = self.costs[rank].seconds("W") + self.overhead
        for index in range(after + 1, position):
            gap_start = times[index - 1][1] + self.overhead
            if times[index][0] - gap_start >= need - 1e-12:
                moved = row[:position] + row[position + 1 :]
                moved.insert(index, row[position])
                return {**order, rank: moved}
        return order

    def compact(self, order: Order, score: tuple[float, int]) -> tuple[Order, tuple[float, int]]:
        """Every W moved into idle time where that does not lengthen the step (:meth:`place_weight`)."""
        for rank in order:
            for microbatch in [a.microbatch for a in order[rank] if a.kind == "W"]:
                moved = self.place_weight(order, rank, microbatch)
                if moved is order:
                    continue
                moved_score = self.score(moved)
                if moved_score is not None and moved_score[0] <= score[0]:
                    order, score = moved, moved_score
        return order, score

    def toggle(self, order: Order, rank: int, microbatch: int) -> Order:
        """Split rank's full backward of ``microbatch`` (W just before the next microbatch's weight gradients,
        then into a gap) or join its I and W into a full backward where that keeps them in order."""
        row = order[rank]
        full = Action(rank, "B", microbatch)
        if full in row:
            split = [Action(rank, "I", microbatch) if a == full else a for a in row]
            later = _weight_position(split, rank, microbatch + 1)
            split.insert(len(split) if later < 0 else later, Action(rank, "W", microbatch))
            return self.place_weight({**order, rank: split}, rank, microbatch)
        weight = Action(rank, "W", microbatch)
        if microbatch > 0 and _weight_position(row, rank, microbatch - 1) > row.index(
            Action(rank, "I", microbatch)
        ):
            return order  # the previous microbatch's W runs after this I: a B here would overtake it
        joined = [full if a == Action(rank, "I", microbatch) else a for a in row if a != weight]
        return {**order, rank: joined}


def _weight_position(row: list[Action], stage: int, microbatch: int) -> int:
    """Where ``row`` holds the weight gradients of ``microbatch`` on ``stage`` (its B or W); -1: nowhere."""
    for kind in ("B", "W"):
        action = Action(stage, kind, microbatch)
        if action in row:
            return row.index(action)
    return -1


def cost_aware_schedule(
    costs: StageCost | Sequence[StageCost],
    num_ranks: int,
    microbatches: int,
    memory_limit: float | Sequence[float] | None = None,
    comm: CommModel | None = None,
    *,
    overhead: float = 0.0,
    max_passes: int = 3,
) -> dict[int, list[Action]]:
    """A schedule that splits the backward only where the simulator predicts it pays (module docstring).

    Args:
        costs: one :class:`StageCost` for every stage, or one per stage (seconds and bytes); the full
            backward B's seconds matter (``full_backward``; I + W when None).
        num_ranks: ranks = stages. microbatches: per step.
        memory_limit: activation bytes each rank may hold (one number, or one per rank); None: no limit.
        comm: message costs between ranks (default: free). overhead: seconds the runtime spends after each
            action (as :func:`simulate` takes it).
        max_passes: rounds of the coordinate descent over ``k`` and passes of the per-microbatch search.

    Returns:
        ``{rank: [Action, ...]}`` with F, B or I and W of every microbatch on every rank, in 1F1B's
        placement, B's and W's in microbatch order; its predicted step is at most that of 1F1B, ZB-H1,
        ZB-H2 and :func:`adaptive_schedule` (those within the limit).

    Raises:
        ValueError: fewer than one rank or microbatch, costs or limits for the wrong number of ranks.
        ScheduleError: no order tried fits the memory limit (a limit below one microbatch's activations).
    """
    if num_ranks < 1 or microbatches < 1:
        raise ValueError(f"need at least one rank and one microbatch, got {num_ranks} and {microbatches}")
    per_stage = stage_costs(costs, num_ranks)
    limits = _limits(memory_limit, num_ranks)
    search = _Search(per_stage, microbatches, limits, comm or CommModel(), overhead)
    p, m = num_ranks, microbatches
    for generator in (one_f_one_b, zb_h1, zb_h2):
        search.offer(generator(p, m))
    # the ZB paper's greedy order: under a limit below 1F1B's peak, the one that fits; it refuses a limit
    # nothing fits (ScheduleError) and an F or I that costs no time (ValueError)
    with contextlib.suppress(ScheduleError, ValueError):
        search.offer(adaptive_schedule(per_stage, p, m, memory_limit, comm))

    # 2: 1F1B with the last k microbatches split, k per rank by coordinate descent.
    split = [0] * p
    current = search.score(split_last(p, m, split))
    for _ in range(max_passes):
        changed = False
        for rank in range(p):
            for count in range(min(m, 2 * p) + 1):  # 1F1B's cool-down, where splits pay, is p - 1 deep
                if count == split[rank]:
                    continue
                trial = [*split[:rank], count, *split[rank + 1 :]]
                score = search.offer(split_last(p, m, trial))
                if score is not None and (current is None or score < current):
                    split, current, changed = trial, score, True
        if not changed:
            break
    if current is not None:
        # 3: their W's into idle time.
        order, score = search.compact(split_last(p, m, split), current)
        search.offer(order, score)

    if search.best_order is None:
        smallest = min(
            max(simulate(generator(p, m), per_stage, microbatches=m).peak_memory_bytes)
            for generator in (one_f_one_b, zb_h1, zb_h2)
        )
        raise ScheduleError(
            f"no schedule tried fits the memory limit {memory_limit!r} bytes: the smallest peak of 1F1B, "
            f"ZB-H1 and ZB-H2 is {smallest} bytes on a rank, and the adaptive order does not fit either; "
            "raise the limit"
        )

    # 4: per-microbatch local search from the best order so far.
    order, score = search.best_order, search.best
    assert score is not None
    for _ in range(max_passes):
        improved = False
        for rank in range(p):
            for microbatch in range(m):
                trial = search.toggle(order, rank, microbatch)
                trial_score = search.score(trial)
                if trial_score is not None and trial_score[0] < score[0] - 1e-12 * max(1.0, abs(score[0])):
                    order, score, improved = trial, trial_score, True
        if not improved:
            break
    search.offer(order, score)
    assert search.best_order is not None and math.isfinite(search.best[0])  # type: ignore[index]
    return search.best_order
