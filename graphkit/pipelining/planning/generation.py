"""Handcrafted schedules for one stage per rank (stage ``i`` on rank ``i``): GPipe, 1F1B, ZB-H1, ZB-H2.

Each function returns ``{rank: [Action, ...]}``, the per-rank compute order that
:func:`~graphkit.pipelining.planning.simulator.simulate` predicts and
:func:`~graphkit.pipelining.planning.actions.write_schedule_csv` writes for PyTorch's ``_PipelineScheduleRuntime``.
GPipe and 1F1B use a full backward B; ZB-H1 and ZB-H2 split it into I (input gradients, ``B`` in the ZB
paper) and W (weight gradients), with the same messages as 1F1B (one per stage boundary and direction).

The zero-bubble schedules follow Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), §3.1, with
``p`` ranks and ``m >= p`` microbatches (rank ``i`` = stage ``i``, 0-based):

- **ZB-H1**: 1F1B's memory. Rank ``i`` runs ``p - i`` forwards, then each I followed by the W's that
  keep ``i`` weight gradients pending, then the next F; the pending W's fill the cool-down. With
  ``F = I = W = 1`` every rank idles ``p - 1`` (the paper's ``(p-1)(T_F + T_B - T_W)``, a third of
  1F1B's ``(p-1)(T_F + T_B + T_W)``), and rank ``i`` holds at most ``p - i`` microbatches' activations
  (plus ``i`` pending W's: ``(p-i) * activation_bytes + i * weight_bytes``).
- **ZB-H2**: up to twice 1F1B's memory, and in a synchronous step no faster than ZB-H1. Rank ``i`` runs
  ``2p - 1 - 2i`` forwards before its first I, then I, W's keeping ``2i`` pending, F. With unit costs and
  ``m >= 2p - 1`` every rank is busy without a gap from its first action to its last, ``3m`` - the paper's
  bubble ``(p-1)(T_F + T_B - 2T_W) = 0`` counts each rank from its own start - but rank ``i`` starts at
  ``i`` and the step ends when the last rank does: ``3m + p - 1``, ZB-H1's step. The paper's zero bubble
  needs the next step's forwards to start before this step's optimizer step, i.e. the optimizer step's
  synchronization bypassed (its §4, post-validation); PyTorch's runtime, and a training loop calling
  ``step()`` then ``optimizer.step()``, does not do that. Rank ``i`` holds ``(2p - 1 - 2i)
  activation_bytes + 2i weight_bytes`` (rank 0: ``2p - 1`` microbatches against 1F1B's ``p``). With
  ``p <= m < 2p - 2`` the order stays valid (complete, deadlock-free) but is slower than ZB-H1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from graphkit.pipelining.planning.actions import Action, schedule_actions
from graphkit.pipelining.planning.cost_model import StageCost
from graphkit.pipelining.planning.simulator import simulate

__all__ = ["SCHEDULES", "fold_schedule", "gpipe", "one_f_one_b", "zb_h1", "zb_h2"]


def _check(num_ranks: int, microbatches: int) -> None:
    if num_ranks < 1 or microbatches < 1:
        raise ValueError(f"need at least one rank and one microbatch, got {num_ranks} and {microbatches}")


def gpipe(num_ranks: int, microbatches: int) -> dict[int, list[Action]]:
    """GPipe: every forward, then every full backward, in microbatch order.

    Raises:
        ValueError: fewer than one rank or microbatch.
    """
    _check(num_ranks, microbatches)
    return {
        rank: [Action(rank, "F", mb) for mb in range(microbatches)]
        + [Action(rank, "B", mb) for mb in range(microbatches)]
        for rank in range(num_ranks)
    }


def one_f_one_b(num_ranks: int, microbatches: int) -> dict[int, list[Action]]:
    """1F1B (PyTorch's ``Schedule1F1B``): ``p - 1 - i`` warm-up forwards on rank ``i``, then a forward and
    a full backward in turn, then the remaining backwards.

    Raises:
        ValueError: fewer than one rank or microbatch.
    """
    _check(num_ranks, microbatches)
    order = {}
    for rank in range(num_ranks):
        warmup = min(num_ranks - 1 - rank, microbatches)
        row = [Action(rank, "F", mb) for mb in range(warmup)]
        for mb in range(microbatches):
            if warmup + mb < microbatches:
                row.append(Action(rank, "F", warmup + mb))
            row.append(Action(rank, "B", mb))
        order[rank] = row
    return order


def _split_backward(
    num_ranks: int, microbatches: int, warmup: list[int], pending: list[int]
) -> dict[int, list[Action]]:
    """Rank ``i``: ``warmup[i]`` forwards; then per microbatch its I, the W's that keep ``pending[i]``
    weight gradients outstanding, the next F; finally the W's still pending."""
    order = {}
    for rank in range(num_ranks):
        row = [Action(rank, "F", mb) for mb in range(warmup[rank])]
        forwards = warmup[rank]
        waiting: list[int] = []
        for mb in range(microbatches):
            row.append(Action(rank, "I", mb))
            waiting.append(mb)
            while len(waiting) > pending[rank]:
                row.append(Action(rank, "W", waiting.pop(0)))
            if forwards < microbatches:
                row.append(Action(rank, "F", forwards))
                forwards += 1
        row.extend(Action(rank, "W", mb) for mb in waiting)
        order[rank] = row
    return order


def zb_h1(num_ranks: int, microbatches: int) -> dict[int, list[Action]]:
    """ZB-H1 (ZB paper §3.1): 1F1B's in-flight forwards, W's deferred into the cool-down.

    Raises:
        ValueError: fewer than one rank or microbatch.
    """
    _check(num_ranks, microbatches)
    warmup = [min(num_ranks - rank, microbatches) for rank in range(num_ranks)]
    return _split_backward(num_ranks, microbatches, warmup, list(range(num_ranks)))


def zb_h2(num_ranks: int, microbatches: int) -> dict[int, list[Action]]:
    """ZB-H2 (ZB paper §3.1): ``2p - 1 - 2i`` warm-up forwards on rank ``i``, ``2i`` W's kept pending; in a
    synchronous step as long as ZB-H1's, at up to twice the memory (module docstring).

    Raises:
        ValueError: fewer than one rank or microbatch.
    """
    _check(num_ranks, microbatches)
    warmup = [min(2 * num_ranks - 1 - 2 * rank, microbatches) for rank in range(num_ranks)]
    return _split_backward(num_ranks, microbatches, warmup, [2 * rank for rank in range(num_ranks)])


SCHEDULES = {"GPipe": gpipe, "1F1B": one_f_one_b, "ZB-H1": zb_h1, "ZB-H2": zb_h2}
"""The handcrafted generators by name: ``SCHEDULES[name](num_ranks, microbatches)``."""


def fold_schedule(
    schedule: Mapping[int, Sequence[Any]] | Sequence[Sequence[Any]],
    ranks: int,
    costs: StageCost | Sequence[StageCost] | None = None,
) -> dict[int, list[Action]]:
    """A schedule of one stage per rank folded onto fewer ranks: stage ``s`` on rank ``s % ranks`` (the looped
    placement of ``Interleaved1F1B`` and of PyTorch's CSV runtime), each rank running its stages' actions in
    the order of their predicted start (:func:`simulate` with ``costs``, default F = I = W = 1).

    Every dependency of an action starts and ends before it in that order, so the folded order cannot
    deadlock; it is how a 4-stage ZB-H1 runs on 2 ranks (two stages each, looped).

    Raises:
        ValueError: ``ranks`` below 1 or not dividing the number of stages.
        ScheduleError: as :func:`simulate`.
    """
    order = schedule_actions(schedule)
    num_stages = len(order)
    if ranks < 1 or num_stages % ranks:
        raise ValueError(f"{num_stages} stages do not fold onto {ranks} ranks")
    predicted = simulate(order, costs if costs is not None else StageCost(1.0, 1.0, 1.0))
    folded: dict[int, list[tuple[float, int, int, Action]]] = {rank: [] for rank in range(ranks)}
    for position, item in enumerate(predicted.actions):
        folded[item.stage % ranks].append((item.start, item.stage, position, item.action))
    return {rank: [item[3] for item in sorted(items)] for rank, items in folded.items()}
