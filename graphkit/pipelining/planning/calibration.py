"""What running inside ``torch.distributed.pipelining`` adds to the measured costs, fitted to recorded steps.

The simulator (:mod:`graphkit.pipelining.planning.simulator`) predicts a step from per-stage costs, a message
model and a per-action overhead. Recorded steps (:class:`~graphkit.pipelining.planning.timelines.ScheduleTimeline`)
tell what the runtime really adds on this machine:

- :func:`measure_runtime`: the runtime's overhead per action, per message sent and per message received,
  read off the gaps where a rank waited for no computation;
- :func:`calibrate_runtime`: that, plus the slowdown of each pass beside the other ranks and the time each
  step spends outside its actions (:class:`RuntimeCalibration`);
- :func:`predict_recorded`: the step the model predicts for a recorded step's own order fed its recorded
  per-action durations (what the model explains once the actions' own times are known);
- :func:`runtime_overhead`: medians of the gaps and of the time inside each action beyond the costs;
- :func:`costs_from_recorded`: per-stage costs read from recorded steps.

:data:`DEFAULT_COMM` and :data:`DEFAULT_OVERHEAD` are what the planner assumes before anything is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from graphkit.pipelining.planning.actions import TimedAction
from graphkit.pipelining.planning.cost_model import NOTHING_SECONDS, CommModel, StageCost
from graphkit.pipelining.planning.simulator import Simulation, recorded_durations, simulate
from graphkit.pipelining.planning.timelines import ScheduleTimeline

__all__ = [
    "DEFAULT_COMM",
    "DEFAULT_OVERHEAD",
    "RuntimeCalibration",
    "calibrate_runtime",
    "costs_from_recorded",
    "measure_runtime",
    "predict_recorded",
    "runtime_overhead",
]


DEFAULT_COMM = CommModel(latency=100e-6, bandwidth=1.0e9, rendezvous=True)
"""A documented default for messages between two gloo ranks on 127.0.0.1 (CPU): 100 microseconds and 1 GB/s,
paid when the receiver reaches the action that needs the message (rendezvous: gloo sends once the
receive is posted, and the runtime posts it just before that action). ``plan --run`` replaces it with a
latency measured on the recorded schedules (:func:`calibrate_runtime`). Pass your own :class:`CommModel` for
another link (NCCL over NVLink: ~10 us, ~100 GB/s)."""


DEFAULT_OVERHEAD = 1.0e-3
"""Seconds ``torch.distributed.pipelining``'s runtime adds on a rank to each compute action, with gloo on the
CPU: the gap after it (issuing the action's sends, posting the next one's receives, the runtime's Python)
and what running inside the runtime adds to the pass itself. Measured by ``plan --run``
(:func:`runtime_overhead`) on a 2-core machine at load average 1: 0.44 to 0.68 ms between actions and
0.55 to 0.85 ms inside each, for ``hf:gpt2?n_layer=4`` and ``zoo-pipeline:mlp_wide`` on 2 ranks; give
``--overhead`` the value measured on yours (GPUs with NCCL: tens of microseconds)."""


@dataclass(slots=True, frozen=True)
class RuntimeCalibration:
    """What running inside ``torch.distributed.pipelining`` on this machine adds to the measured costs.

    Attributes:
        overhead: seconds the runtime spends on a rank after each action (the simulator's ``overhead``).
        comm: the message model, rendezvous, with the fitted latency.
        slowdown: recorded action seconds over ``graphkit costs`` seconds (summed over the actions but the
            W actions where there are any): what running beside the other ranks (sharing cores, caches and
            memory bandwidth) does to each pass.
        step_overhead: seconds of the step outside its first action's start and its last action's end
            (splitting the batch into microbatches, the last messages' waits), added to every prediction.
        weight_slowdown: the same ratio over the W actions alone (a W run late in a step, after other
            passes reused its memory, measured 1.3 to 1.4x its standalone cost on ``mlp_wide``); None when
            the steps recorded no W (then W takes ``slowdown``). The first stage's W, a full backward (its
            I is nothing), counts with the other passes.
    """

    overhead: float
    comm: CommModel
    slowdown: float
    step_overhead: float = 0.0
    weight_slowdown: float | None = None

    @property
    def weight_factor(self) -> float:
        """The factor W's seconds are multiplied by: ``weight_slowdown``, else ``slowdown``."""
        return self.slowdown if self.weight_slowdown is None else self.weight_slowdown

    def describe(self) -> str:
        return (
            f"{self.overhead * 1e6:.0f} us per action, +{self.comm.send_seconds * 1e6:.0f} us per send, "
            f"messages {self.comm.latency * 1e6:.0f} us when received, passes x{self.slowdown:.2f}"
            + (f", W x{self.weight_slowdown:.2f}" if self.weight_slowdown is not None else "")
            + ", "
            f"{self.step_overhead * 1e3:.2f} ms per step outside the actions"
        )


def calibrate_runtime(
    timelines: ScheduleTimeline | Sequence[ScheduleTimeline],
    costs: Sequence[StageCost] | dict[int, Sequence[StageCost]],
    comm: CommModel | None = None,
) -> RuntimeCalibration:
    """Fit the runtime's overhead, message latency, slowdown and per-step overhead to recorded steps.

    ``timelines``: one recorded step or several; ``costs``: per stage as run (:func:`first_stage_as_run`),
    or ``{num_stages: costs}`` for steps of several stage counts. ``slowdown`` is the steps' recorded
    compute seconds over the seconds ``costs`` give the same actions (a ratio of sums, as a step is a sum;
    a faster run gives a factor below 1), over every action but the W actions, which get their own
    ``weight_slowdown`` (None where no W was recorded); overhead and latency come from :func:`measure_runtime`;
    ``step_overhead`` is the mean over the steps of what each spends outside its actions.

    Raises:
        ValueError: no costs for a step's number of stages, or a step without actions.
    """
    steps = list(timelines) if isinstance(timelines, list | tuple) else [timelines]
    by_count = costs if isinstance(costs, dict) else {len(costs): costs}
    recorded_seconds = modelled_seconds = 0.0
    weight_recorded = weight_modelled = 0.0
    outside: list[float] = []
    for timeline in steps:
        per_stage = by_count.get(timeline.num_stages)
        if per_stage is None or len(per_stage) != timeline.num_stages:
            raise ValueError(
                f"no costs for the {timeline.num_stages} stages of the recorded {timeline.schedule}"
            )
        actions = [item for rank in timeline.ranks for item in rank.compute_actions()]
        if not actions:
            raise ValueError(f"the recorded {timeline.schedule} has no compute actions")
        for item in actions:
            modelled = per_stage[item.stage].seconds(item.kind)
            if modelled <= NOTHING_SECONDS:
                continue
            if item.kind == "W" and per_stage[item.stage].backward_input > NOTHING_SECONDS:
                weight_recorded += item.end - item.start
                weight_modelled += modelled
            else:
                recorded_seconds += item.end - item.start
                modelled_seconds += modelled
        span = max(item.end for item in actions) - min(item.start for item in actions)
        outside.append(max(timeline.step_seconds - span, 0.0))
    overhead, measured = measure_runtime(steps, comm)
    weight_slowdown = weight_recorded / weight_modelled if weight_modelled > 0 else None
    slowdown = (
        recorded_seconds / modelled_seconds
        if modelled_seconds > 0
        else weight_slowdown
        if weight_slowdown is not None
        else 1.0
    )
    return RuntimeCalibration(overhead, measured, slowdown, sum(outside) / len(outside), weight_slowdown)


def measure_runtime(
    timelines: ScheduleTimeline | Sequence[ScheduleTimeline], comm: CommModel | None = None
) -> tuple[float, CommModel]:
    """The runtime's overhead per action, per message sent and per message received, read off recorded steps.

    ``timelines``: one recorded step or several (their gaps are pooled). Only gaps where the rank waited
    for no computation count: the next action needs nothing its rank had not finished or that another
    rank had not computed before.

    - overhead: the mean gap after an action that sends nothing to another rank, before one that needs
      nothing from another rank (the runtime's own bookkeeping).
    - ``send_seconds``: the mean such gap after an action that sends to another rank, less the overhead.
    - latency: under a rendezvous link (:class:`CommModel` with ``rendezvous=True``, which gloo is), a
      message is paid from the later of its sender's end and its receiver's readiness (the previous
      action's end plus overhead and sends); the latency is the mean of what each action fed from another
      rank waited beyond that point (never below 0). It includes the message's size (a recorded step
      does not know its bytes), so the returned model's bandwidth is infinite: the messages between the
      stages of one pipeline have about the same size.

    Means, not medians: a step is their sum, and the occasional long gap (a garbage collection, the
    operating system's scheduling) is part of what the runtime costs. Steps without such gaps give
    :data:`DEFAULT_OVERHEAD`, and ``comm`` (default :data:`DEFAULT_COMM`) where no message is measured.
    """
    base = comm or DEFAULT_COMM
    steps = list(timelines) if isinstance(timelines, list | tuple) else [timelines]
    quiet: list[float] = []  # gaps after an action that sent nothing to another rank
    sending: list[float] = []  # gaps after one that did
    remote: list[tuple[float, bool, float, float]] = []  # (previous end, it sent, start, input computed)
    for timeline in steps:
        _runtime_gaps(timeline, quiet, sending, remote)
    if not quiet and not sending:
        return DEFAULT_OVERHEAD, base
    overhead = sum(quiet) / len(quiet) if quiet else 0.0
    send_seconds = max(sum(sending) / len(sending) - overhead, 0.0) if sending else 0.0
    if not remote:
        return overhead, replace(base, send_seconds=send_seconds)
    waits = [
        start - max(previous_end + overhead + (send_seconds if sent else 0.0), computed)
        for previous_end, sent, start, computed in remote
    ]
    latency = max(sum(waits) / len(waits), 0.0)
    return overhead, CommModel(latency, math.inf, rendezvous=True, send_seconds=send_seconds)


def _runtime_gaps(
    timeline: ScheduleTimeline,
    quiet: list[float],
    sending: list[float],
    remote: list[tuple[float, bool, float, float]],
) -> None:
    """Add ``timeline``'s gaps to the lists of :func:`measure_runtime`."""
    ends = _action_ends(timeline)
    rank_of_stage = {item.stage: rank.rank for rank in timeline.ranks for item in rank.compute_actions()}
    last = timeline.num_stages - 1

    def sends_away(item: TimedAction, rank: int) -> bool:
        if item.kind == "F":
            return item.stage < last and rank_of_stage.get(item.stage + 1, rank) != rank
        if item.kind in ("I", "B"):
            return item.stage > 0 and rank_of_stage.get(item.stage - 1, rank) != rank
        return False

    for rank in timeline.ranks:
        actions = rank.compute_actions()
        for before, after in zip(actions, actions[1:], strict=False):
            needs = _inputs_of(after, last)
            sent = sends_away(before, rank.rank)
            crossing = [need for need in needs if rank_of_stage.get(need[1], rank.rank) != rank.rank]
            if crossing:
                if crossing[0] in ends:
                    remote.append((before.end, sent, after.start, ends[crossing[0]]))
            elif all(ends.get(need, math.inf) <= before.end for need in needs):
                (sending if sent else quiet).append(after.start - before.end)


def predict_recorded(
    timeline: ScheduleTimeline,
    costs: StageCost | Sequence[StageCost] | None = None,
    *,
    comm: CommModel | None = None,
    overhead: float | None = None,
) -> Simulation:
    """The step :func:`simulate` predicts for a recorded step's own order, fed its recorded per-action
    durations: what the model explains of the recorded step once the actions' own times are known.

    ``overhead``: seconds the runtime adds after each action (a number); None (the default) takes them
    from the recording too: after each action, the gap before the rank's next action where that one had
    nothing to wait for (its inputs were computed before), else the rank's median such gap; the time
    before the rank's first action and after its last (splitting the batch, the last sends' waits) are
    added to them as well. What remains between predicted and recorded is then the waiting the model
    predicts from the data flow. ``costs``: only their bytes matter (message sizes, memory); default none.
    """
    order = {rank.rank: rank.compute_order() for rank in timeline.ranks}
    durations = recorded_durations(timeline)
    tails: dict[int, float] = {}
    if overhead is None:
        gaps = _free_gaps(timeline)
        for rank in timeline.ranks:
            actions = rank.compute_actions()
            if not actions:
                continue
            rank_gaps = gaps[rank.rank]
            typical = _median([gap for gap in rank_gaps if gap is not None]) or 0.0
            for position, item in enumerate(actions):
                label = item.action
                after = rank_gaps[position] if position < len(rank_gaps) else None
                durations[label] += (
                    (after if after is not None else typical) if position < len(actions) - 1 else 0.0
                )
            if actions[0].stage == 0 and actions[0].kind == "F":  # the first rank starts the step
                first = actions[0].action
                durations[first] += actions[0].start
            tails[rank.rank] = max(rank.step_seconds - actions[-1].end, 0.0)
    simulation = simulate(
        order,
        costs if costs is not None else StageCost(0.0, 0.0, 0.0),
        comm,
        microbatches=timeline.microbatches,
        name=timeline.schedule,
        durations=durations,
        overhead=overhead or 0.0,
    )
    if tails:  # each rank's step ends its recorded tail after its last action
        simulation.step_seconds = max(
            simulation.rank_actions(rank)[-1].end + tail
            for rank, tail in tails.items()
            if simulation.rank_actions(rank)
        )
    return simulation


def _free_gaps(timeline: ScheduleTimeline) -> dict[int, list[float | None]]:
    """Per rank, after each compute action but the last: the gap before the next one if the next had
    nothing to wait for (every input it needs ended before this one did), else None."""
    ends = _action_ends(timeline)
    last = timeline.num_stages - 1
    gaps: dict[int, list[float | None]] = {}
    for rank in timeline.ranks:
        actions = rank.compute_actions()
        found: list[float | None] = []
        for before, after in zip(actions, actions[1:], strict=False):
            free = all(ends.get(need, math.inf) <= before.end for need in _inputs_of(after, last))
            found.append(after.start - before.end if free else None)
        gaps[rank.rank] = found
    return gaps


def _action_ends(timeline: ScheduleTimeline) -> dict[tuple[str, int, int], float]:
    """When each compute action of a recorded step ended, keyed ``(kind, stage, microbatch)``; an I or a
    B also as ``("G", stage, microbatch)``: the input gradient it sends."""
    ends: dict[tuple[str, int, int], float] = {}
    for rank in timeline.ranks:
        for item in rank.compute_actions():
            if item.kind in ("I", "B"):
                ends[("G", item.stage, item.microbatch)] = item.end
            ends[(item.kind, item.stage, item.microbatch)] = item.end
    return ends


def _inputs_of(item: TimedAction, last: int) -> list[tuple[str, int, int]]:
    """What a compute action needs computed first, as :func:`_action_ends` keys them (``last``: the
    last stage's index): F the previous stage's F, W its own I, I or B its own F and the next stage's
    input gradient."""
    stage, mb = item.stage, item.microbatch
    if item.kind == "F":
        return [("F", stage - 1, mb)] if stage > 0 else []
    if item.kind == "W":
        return [("I", stage, mb)]
    return [("F", stage, mb)] + ([("G", stage + 1, mb)] if stage < last else [])


def costs_from_recorded(timelines: Sequence[ScheduleTimeline], num_stages: int) -> list[StageCost] | None:
    """Per-stage costs read from recorded steps of ``num_stages`` stages: the median recorded seconds of
    each stage's F, I, W and B over every recorded step that ran that many stages (None if none did, or a
    stage lacks F or a backward). A B never recorded costs I + W, an I or W never recorded splits B
    evenly; bytes are not recorded (zero). Plan with them to ask what the machine's own action times say."""
    seconds: dict[tuple[int, str], list[float]] = {}
    for timeline in timelines:
        if timeline.num_stages != num_stages:
            continue
        for rank in timeline.ranks:
            for item in rank.compute_actions():
                seconds.setdefault((item.stage, item.kind), []).append(item.end - item.start)
    costs = []
    for stage in range(num_stages):
        f, i, w, b = (_median(seconds.get((stage, kind), [])) for kind in "FIWB")
        if f is None or (b is None and (i is None or w is None)):
            return None
        if i is None or w is None:
            i = w = (b or 0.0) / 2
        costs.append(StageCost(f, max(i, NOTHING_SECONDS), w, full_backward=b if b is not None else i + w))
    return costs


def runtime_overhead(
    timelines: Sequence[ScheduleTimeline],
    costs: Sequence[StageCost] | dict[int, Sequence[StageCost]] | None = None,
) -> dict[str, float | int | None]:
    """What the runtime adds to each compute action, measured from recorded steps.

    - ``between``: the median gap on a rank between the end of one compute action and the start of the
      next, over the pairs where the next one's inputs had all been computed before the previous one ended
      (so the rank waited for nothing but the runtime: issuing the sends of the action before, the
      receives of the next, its own bookkeeping); ``gaps``: how many such pairs.
    - ``inside``: with ``costs`` (per stage; or ``{num_stages: costs}`` for timelines of several stage
      counts), the median of recorded action seconds minus the cost model's seconds for that action (what
      running inside the runtime adds to the computation itself, and what the machine's load does to it);
      ``actions``: how many were compared.

    The simulator's ``overhead`` is ``between + inside``: both happen once per action on its rank.
    """
    gaps: list[float] = []
    inside: list[float] = []
    for timeline in timelines:
        gaps += [gap for rank_gaps in _free_gaps(timeline).values() for gap in rank_gaps if gap is not None]
        per_stage = None
        if costs is not None:
            per_stage = costs.get(timeline.num_stages) if isinstance(costs, dict) else costs
            if per_stage is not None and len(per_stage) != timeline.num_stages:
                per_stage = None
        if per_stage is not None:
            for rank in timeline.ranks:
                for item in rank.compute_actions():
                    inside.append((item.end - item.start) - per_stage[item.stage].seconds(item.kind))
    return {
        "between": _median(gaps),
        "gaps": len(gaps),
        "inside": _median(inside),
        "actions": len(inside),
    }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
