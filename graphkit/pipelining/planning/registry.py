"""The one registry of graphkit's generated schedules: one stage per rank, run from their order.

Each entry builds every rank's compute actions from the pipeline's shape and, where it uses them, the
stages' costs, a memory limit and the link model:

- ``ZBH1``, ``ZBH2``: the ZB paper's handcrafted schedules (:mod:`graphkit.pipelining.planning.generation`);
- ``Adaptive``: the ZB paper's adaptive scheduler (:func:`~graphkit.pipelining.planning.adaptive.adaptive_schedule`),
  from the given costs (F, I and W costing the same when none are given) under the memory limit;
- ``CostAware``: a full backward B or I then W per rank and microbatch, split only where the simulator
  predicts it pays (:func:`~graphkit.pipelining.planning.cost_aware.cost_aware_schedule`), from the given
  costs (F = I = W = 1 and B = 1.5 when none are given: the split a third dearer than B).

:func:`generated_order` returns a :class:`~graphkit.pipelining.planning.actions.ScheduleOrder`: what
``graphkit.pipelining.schedules`` runs with PyTorch's ``_PipelineScheduleRuntime`` and the planner simulates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from graphkit.pipelining.planning.actions import Action, ScheduleOrder
from graphkit.pipelining.planning.adaptive import adaptive_schedule
from graphkit.pipelining.planning.cost_aware import cost_aware_schedule
from graphkit.pipelining.planning.cost_model import CommModel, StageCost
from graphkit.pipelining.planning.generation import zb_h1, zb_h2

__all__ = ["GENERATED_SCHEDULES", "GeneratedSchedule", "built_from_costs", "generated_order", "is_generated"]

Generator = Callable[
    [int, int, StageCost | Sequence[StageCost], float | None, CommModel | None, float],
    dict[int, list[Action]],
]


@dataclass(slots=True, frozen=True)
class GeneratedSchedule:
    """One generated schedule: ``build(ranks, microbatches, costs, memory_limit, comm, overhead)`` ->
    ``{rank: [Action, ...]}``, the costs it is built with when none are given (run by name), and whether
    its order depends on them (``uses_costs``: run by name, such a schedule is not the order a plan built
    from measured costs)."""

    build: Generator
    default_costs: StageCost
    uses_costs: bool = True


GENERATED_SCHEDULES: dict[str, GeneratedSchedule] = {
    "ZBH1": GeneratedSchedule(
        lambda ranks, microbatches, *_: zb_h1(ranks, microbatches), StageCost(1.0, 1.0, 1.0), uses_costs=False
    ),
    "ZBH2": GeneratedSchedule(
        lambda ranks, microbatches, *_: zb_h2(ranks, microbatches), StageCost(1.0, 1.0, 1.0), uses_costs=False
    ),
    "Adaptive": GeneratedSchedule(
        lambda ranks, microbatches, costs, limit, comm, _: adaptive_schedule(
            costs, ranks, microbatches, limit, comm
        ),
        StageCost(1.0, 1.0, 1.0, activation_bytes=1, weight_bytes=1),
    ),
    "CostAware": GeneratedSchedule(
        lambda ranks, microbatches, costs, limit, comm, overhead: cost_aware_schedule(
            costs, ranks, microbatches, limit, comm, overhead=overhead
        ),
        StageCost(1.0, 1.0, 1.0, full_backward=1.5),
    ),
}
"""graphkit's generated schedules by name, one stage per rank, run from their order by
``_PipelineScheduleRuntime`` (separate I and W actions; ``CostAware`` full backwards B too)."""


def is_generated(name: Any) -> bool:
    """Whether ``name`` (case ignored) is one of :data:`GENERATED_SCHEDULES`."""
    return isinstance(name, str) and any(name.lower() == known.lower() for known in GENERATED_SCHEDULES)


def built_from_costs(name: Any) -> bool:
    """Whether ``name`` is a generated schedule whose order depends on the costs it is built from
    (``Adaptive``, ``CostAware``; not the handcrafted ``ZBH1``, ``ZBH2``)."""
    return isinstance(name, str) and any(
        name.lower() == known.lower() and generated.uses_costs
        for known, generated in GENERATED_SCHEDULES.items()
    )


def generated_order(
    name: str,
    ranks: int,
    microbatches: int,
    costs: StageCost | Sequence[StageCost] | None = None,
    memory_limit: float | None = None,
    comm: CommModel | None = None,
    overhead: float = 0.0,
) -> ScheduleOrder:
    """The order of generated schedule ``name`` on ``ranks`` ranks (one stage each) and ``microbatches``.

    ``costs`` (one :class:`StageCost` or one per stage, seconds and bytes), ``memory_limit`` (activation
    bytes per rank), ``comm`` and ``overhead`` (seconds the runtime adds per action) matter to ``Adaptive``
    and ``CostAware``; without costs each takes its ``default_costs``.

    Raises:
        KeyError: ``name`` is not a generated schedule (the message lists them).
        ValueError: fewer than one rank or microbatch, costs for another number of stages.
    """
    for known, generated in GENERATED_SCHEDULES.items():
        if known.lower() == name.lower():
            given = generated.default_costs if costs is None else costs
            order = generated.build(ranks, microbatches, given, memory_limit, comm, overhead)
            return ScheduleOrder.from_actions(known, order)
    raise KeyError(f"{name!r} is not one of graphkit's generated schedules {', '.join(GENERATED_SCHEDULES)}")
