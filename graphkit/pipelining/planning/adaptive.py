"""The ZB paper's adaptive scheduler: a greedy schedule from measured costs under a per-rank memory limit.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), §3.1 and Appendix: when F, I (the paper's B)
and W cost different times and communication is not free, no handcrafted order stays bubble-free; a
heuristic builds one from the costs instead. :func:`adaptive_schedule` does it for one stage per rank
(stage ``i`` on rank ``i``, 1F1B's messages), in the paper's spirit but with its own construction:

- time runs forward, event by event: the rank whose next action can start earliest goes next, so every
  decision sees the exact times the simulator will predict (same dependencies, same message costs);
- a rank prefers, at the moment it is free: an I that is ready (the critical path runs through I's);
  else an F that is ready, fits the memory limit and keeps the in-flight forwards at most what they were
  when the rank's first I ran (warm-up as many F's as the limit allows and the wait for the first I
  needs, then one F per I, as the paper's warm-up and steady phases); else a pending W - the idle time
  where nothing else can start is what W fills; a rank whose next F does not fit the memory limit runs
  its pending W's to free ``weight_bytes`` first; after its last I it runs the W's left;
- two ways to fill idle time are tried (a W whenever nothing else can start; or only when the W fits in
  the gap before the next known F or I), and the order with the shorter predicted step wins (ties: the
  lower peak memory). The paper's ILP refinement is not done.

Memory is counted as :mod:`graphkit.pipelining.planning.cost_model` describes (F adds ``activation_bytes`` at its
start; I frees all but ``weight_bytes``; W frees the rest).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from graphkit.pipelining.planning.actions import Action, ScheduleError
from graphkit.pipelining.planning.cost_model import CommModel, StageCost, stage_costs
from graphkit.pipelining.planning.generation import zb_h1, zb_h2
from graphkit.pipelining.planning.simulator import simulate

__all__ = ["adaptive_schedule"]

_PRIORITY = {"I": 0, "F": 1, "W": 2}


def _limits(memory_limit: float | Sequence[float] | None, num_ranks: int) -> list[float]:
    if memory_limit is None:
        return [math.inf] * num_ranks
    if isinstance(memory_limit, int | float):
        return [float(memory_limit)] * num_ranks
    limits = [float(value) for value in memory_limit]
    if len(limits) != num_ranks:
        raise ValueError(f"got memory limits for {len(limits)} ranks, the pipeline has {num_ranks}")
    return limits


def _greedy(
    costs: list[StageCost], microbatches: int, limits: list[float], comm: CommModel, fit_gaps: bool
) -> dict[int, list[Action]]:
    """One greedy construction (see the module docstring); ``fit_gaps``: W only where it fits a known gap."""
    p, m = len(costs), microbatches
    f_cost = [c.seconds("F") for c in costs]
    i_cost = [c.seconds("I") for c in costs]
    w_cost = [c.seconds("W") for c in costs]
    f_delay = [comm.seconds(costs[s].output_bytes) for s in range(p)]  # s -> s + 1
    b_delay = [comm.seconds(costs[s].input_grad_bytes) for s in range(p)]  # s -> s - 1
    f_end: list[list[float]] = [[math.nan] * m for _ in range(p)]
    i_end: list[list[float]] = [[math.nan] * m for _ in range(p)]
    clock = [0.0] * p
    forwards, inputs, weights = [0] * p, [0] * p, [0] * p
    memory = [0.0] * p
    cap: list[int | None] = [None] * p
    version = [0] * p
    order: dict[int, list[Action]] = {rank: [] for rank in range(p)}
    heap: list[tuple[float, int, int, int, str]] = []

    def decide(r: int) -> tuple[float, str] | None:
        """Rank r's next action and its start, from what is known now; None: it waits on a neighbour."""
        now = clock[r]
        ready: dict[str, float] = {}
        if inputs[r] < forwards[r]:
            mb = inputs[r]
            arrival = f_end[r][mb] if r == p - 1 else i_end[r + 1][mb] + b_delay[r + 1]
            if not math.isnan(arrival):
                ready["I"] = max(now, f_end[r][mb], arrival)
        f_blocked_by_memory = False
        if forwards[r] < m and (cap[r] is None or forwards[r] - inputs[r] < cap[r]):
            mb = forwards[r]
            arrival = 0.0 if r == 0 else f_end[r - 1][mb] + f_delay[r - 1]
            if memory[r] + costs[r].activation_bytes > limits[r]:
                f_blocked_by_memory = True
            elif not math.isnan(arrival):
                ready["F"] = max(now, arrival)
        has_w = weights[r] < inputs[r]
        for kind in ("I", "F"):
            if ready.get(kind) == now:
                return now, kind
        if has_w:
            next_start = min(ready.values(), default=math.inf)
            last_input_done = inputs[r] == m
            if (
                f_blocked_by_memory
                or last_input_done
                or not fit_gaps
                or next_start == math.inf
                or next_start - now >= w_cost[r]
            ):
                return now, "W"
        if ready:
            kind = min(ready, key=lambda k: (ready[k], _PRIORITY[k]))
            return ready[kind], kind
        return None

    def push(r: int) -> None:
        version[r] += 1
        decision = decide(r)
        if decision is not None:
            heapq.heappush(heap, (decision[0], _PRIORITY[decision[1]], r, version[r], decision[1]))

    for rank in range(p):
        push(rank)
    remaining = 3 * p * m
    while heap:
        start, _, r, seen, kind = heapq.heappop(heap)
        if seen != version[r]:
            continue
        cost = costs[r]
        if kind == "F":
            mb = forwards[r]
            forwards[r] += 1
            memory[r] += cost.activation_bytes
            end = f_end[r][mb] = start + f_cost[r]
        elif kind == "I":
            mb = inputs[r]
            if cap[r] is None:
                cap[r] = forwards[r] - inputs[r]
            inputs[r] += 1
            memory[r] -= cost.activation_bytes - cost.weight_bytes
            end = i_end[r][mb] = start + i_cost[r]
        else:
            mb = weights[r]
            weights[r] += 1
            memory[r] -= cost.weight_bytes
            end = start + w_cost[r]
        clock[r] = end
        order[r].append(Action(r, kind, mb))
        remaining -= 1
        for neighbour in (r - 1, r, r + 1):
            if 0 <= neighbour < p:
                push(neighbour)
    if remaining:
        stuck = ", ".join(
            f"rank {r}: {forwards[r]} F, {inputs[r]} I, {weights[r]} W of {m} "
            f"({memory[r]:.0f} of {limits[r]:.0f} bytes in use)"
            for r in range(p)
            if weights[r] < m
        )
        raise ScheduleError(f"no schedule fits the memory limit: {stuck}")
    return order


def adaptive_schedule(
    costs: StageCost | Sequence[StageCost],
    num_ranks: int,
    microbatches: int,
    memory_limit: float | Sequence[float] | None = None,
    comm: CommModel | None = None,
) -> dict[int, list[Action]]:
    """A zero-bubble schedule built greedily from the costs: ``{rank: [Action, ...]}``, stage ``i`` on rank ``i``.

    Args:
        costs: one :class:`StageCost` for every stage, or one per stage (seconds and bytes).
        num_ranks: ranks = stages. microbatches: per step.
        memory_limit: activation bytes each rank may hold (one number, or one per rank); None: no limit.
            1F1B holds ``(p - i) * activation_bytes`` on rank ``i``; twice that buys most of the bubble.
        comm: message costs between ranks (default: free).

    Returns:
        The order whose simulated step is the shortest of the variants tried (see the module docstring);
        every F, I and W of every microbatch, each rank's microbatches in order.

    Raises:
        ValueError: fewer than one rank or microbatch, costs or limits for the wrong number of ranks, or an
            F or I that costs no time (the construction needs time to move forward).
        ScheduleError: a memory limit below one microbatch's activations (nothing can run).
    """
    if num_ranks < 1 or microbatches < 1:
        raise ValueError(f"need at least one rank and one microbatch, got {num_ranks} and {microbatches}")
    per_stage = stage_costs(costs, num_ranks)
    for stage, cost in enumerate(per_stage):
        if cost.forward <= 0 or cost.backward_input <= 0:
            raise ValueError(
                f"stage {stage}: F and I must take time (> 0 s), got {cost.forward}, {cost.backward_input}"
            )
    limits = _limits(memory_limit, num_ranks)
    comm = comm or CommModel()
    candidates = [_greedy(per_stage, microbatches, limits, comm, fit_gaps) for fit_gaps in (False, True)]
    candidates += [zb_h1(num_ranks, microbatches), zb_h2(num_ranks, microbatches)]
    best: tuple[float, int, dict[int, list[Action]]] | None = None
    for order in candidates:
        result = simulate(order, per_stage, comm)
        if any(peak > limit for peak, limit in zip(result.peak_memory_bytes, limits, strict=True)):
            continue  # a handcrafted order over the limit
        key = (result.step_seconds, max(result.peak_memory_bytes))
        if best is None or key < best[:2]:
            best = (*key, order)
    assert best is not None  # the greedy orders respect the limit by construction
    return best[2]
