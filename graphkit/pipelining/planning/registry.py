"""The one registry of graphkit's generated schedules: one stage per rank, run from their order.

Each entry builds every rank's compute actions from the pipeline's shape and, where it uses them, the
stages' costs, a memory limit and the link model:

- ``ZBH1``, ``ZBH2``: the ZB paper's handcrafted schedules (:mod:`graphkit.pipelining.planning.generation`);
- ``Adaptive``: the ZB paper's adaptive scheduler (:func:`~graphkit.pipelining.planning.adaptive.adaptive_schedule`),
  from the given costs (F, I and W costing the same when none are given) under the memory limit.

:func:`generated_order` returns a :class:`~graphkit.pipelining.planning.actions.ScheduleOrder`: what
``graphkit.pipelining.schedules`` runs with PyTorch's ``_PipelineScheduleRuntime`` and the planner simulates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from graphkit.pipelining.planning.actions import Action, ScheduleOrder
from graphkit.pipelining.planning.adaptive import adaptive_schedule
from graphkit.pipelining.planning.cost_model import CommModel, StageCost
from graphkit.pipelining.planning.generation import zb_h1, zb_h2

__all__ = ["GENERATED_SCHEDULES", "generated_order", "is_generated"]

_UNIT_COST = StageCost(1.0, 1.0, 1.0, activation_bytes=1, weight_bytes=1)

Generator = Callable[
    [int, int, StageCost | Sequence[StageCost], float | None, CommModel | None], dict[int, list[Action]]
]


def _adaptive(
    ranks: int,
    microbatches: int,
    costs: StageCost | Sequence[StageCost],
    memory_limit: float | None,
    comm: CommModel | None,
) -> dict[int, list[Action]]:
    return adaptive_schedule(costs, ranks, microbatches, memory_limit, comm)


GENERATED_SCHEDULES: dict[str, Generator] = {
    "ZBH1": lambda ranks, microbatches, *_: zb_h1(ranks, microbatches),
    "ZBH2": lambda ranks, microbatches, *_: zb_h2(ranks, microbatches),
    "Adaptive": _adaptive,
}
"""graphkit's generated schedules by name: ``GENERATED_SCHEDULES[name](ranks, microbatches, costs,
memory_limit, comm)`` -> ``{rank: [Action, ...]}``; one stage per rank, separate I and W actions."""


def is_generated(name: Any) -> bool:
    """Whether ``name`` (case ignored) is one of :data:`GENERATED_SCHEDULES`."""
    return isinstance(name, str) and any(name.lower() == known.lower() for known in GENERATED_SCHEDULES)


def generated_order(
    name: str,
    ranks: int,
    microbatches: int,
    costs: StageCost | Sequence[StageCost] | None = None,
    memory_limit: float | None = None,
    comm: CommModel | None = None,
) -> ScheduleOrder:
    """The order of generated schedule ``name`` on ``ranks`` ranks (one stage each) and ``microbatches``.

    ``costs`` (one :class:`StageCost` or one per stage, seconds and bytes), ``memory_limit`` (activation
    bytes per rank) and ``comm`` matter to ``Adaptive`` only; without costs F, I and W each cost 1.

    Raises:
        KeyError: ``name`` is not a generated schedule (the message lists them).
        ValueError: fewer than one rank or microbatch, costs for another number of stages.
    """
    for known, generator in GENERATED_SCHEDULES.items():
        if known.lower() == name.lower():
            order = generator(ranks, microbatches, _UNIT_COST if costs is None else costs, memory_limit, comm)
            return ScheduleOrder.from_actions(known, order)
    raise KeyError(f"{name!r} is not one of graphkit's generated schedules {', '.join(GENERATED_SCHEDULES)}")
