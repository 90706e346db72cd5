"""Record what a ``torch.distributed.pipelining`` schedule really runs: every F, I, W, B, send and receive.

:class:`ScheduleRecorder` wraps, for the duration of a ``with`` block, the per-chunk methods of each stage
(``forward_one_chunk`` -> F, ``backward_one_chunk`` -> B, or I when ``full_backward=False``,
``backward_weight_one_chunk`` -> W) and the point-to-point plumbing the schedules go through
(``stage.get_{fwd,bwd}_{send,recv}_ops`` to learn which ops belong to which action, and the
``_batch_p2p`` / ``_wait_batch_p2p`` helpers of ``torch/distributed/pipelining/schedules.py`` to time
when they are issued and waited for). It works with any stage class - graphkit's ``PipelineStage``
(:mod:`graphkit.pipelining.stage`, the default here), PyTorch's, or another subclass - and every
schedule built on those helpers; everything is restored on exit, also when the
step raises. The private names it relies on are pinned by ``tests/test_recording.py``.

:func:`record_schedules` runs one real schedule step per schedule on a pipeline spec
(:mod:`graphkit.models.pipeline_specs`, built with as many stages as the schedules need) and returns a :class:`ScheduleTimeline` for each: either in this
process, with a world-size-1 gloo group and every stage on rank 0 (``ranks=1``), or in ``ranks`` spawned
processes on 127.0.0.1 (gloo on the CPU, NCCL on CUDA), each with its share of the stages. Every
schedule first runs one unrecorded step (shape inference, first-touch allocations), then ``steps``
recorded steps (in rounds over the schedules, each round in the next order of a design balanced for
position and for the schedule run just before: :func:`~graphkit.measure.paired_rounds.balanced_order`;
the median one is kept), each after a barrier; times are
seconds since that barrier on each rank.

Kinds of actions (PyTorch's names): ``F`` forward, ``I`` input-gradient backward (B in the ZB paper),
``W`` weight-gradient backward, ``B`` full backward, ``SEND_F`` / ``RECV_F`` activations,
``SEND_B`` / ``RECV_B`` gradients. A communication action has two phases: ``issue`` (the call that
starts the op) and ``wait`` (the time the rank blocked on it).

Memory (``memory_bytes`` of each action, sampled as it ends; ``peak_memory_bytes`` of a rank): on CUDA
the caching allocator's ``memory_allocated`` (and ``max_memory_allocated`` for the peak); on the CPU the
bytes glibc's ``mallinfo2`` reports in use (tensors and everything else the process allocates; None
where glibc is not the C library). Both relative to the moment the recorded step started.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib
import inspect
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import schedules as torch_schedules

from graphkit.measure.paired_rounds import balanced_order
from graphkit.models.pipeline_specs import DEFAULT_MICROBATCH_SIZE, PipelineModel, load_pipeline_spec
from graphkit.models.stage_chain import StageChain
from graphkit.pipelining.launcher import (
    LaunchError,
    free_port,
    process_group,
    run_on_processes,
    usable_cores,
)
from graphkit.pipelining.planning.actions import Action, TimedAction, compute_actions
from graphkit.pipelining.planning.timelines import RankTimeline, ScheduleTimeline, TimelineError
from graphkit.pipelining.schedules import (
    Schedule,
    build_schedule,
    check_microbatches,
    check_ranks,
    common_stage_count,
    resolve_schedule,
    schedule_name,
    schedule_order,
    stage_count,
    stage_indices,
)

__all__ = [
    "STAGE_CLASSES",
    "ScheduleRecorder",
    "chained_stage_modules",
    "following_rounds",
    "resolve_stage_class",
    "memory_probe",
    "record_rank_step",
    "record_schedules",
    "schedule_comm_order",
    "schedule_compute_order",
    "schedule_on_rank",
]


_STAGE_METHODS = {
    "forward_one_chunk": "fwd_chunk_id",
    "backward_one_chunk": "bwd_chunk_id",
    "backward_weight_one_chunk": "bwd_chunk_id",
}
_OPS_METHODS = {
    "get_fwd_send_ops": "SEND_F",
    "get_bwd_send_ops": "SEND_B",
    "get_fwd_recv_ops": "RECV_F",
    "get_bwd_recv_ops": "RECV_B",
}


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_probe() -> Callable[[], int] | None:
    """Bytes in use by glibc's malloc (``uordblks + hblkhd`` of ``mallinfo2``), or None without glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _Mallinfo2

    def probe() -> int:
        info = function()
        return int(info.uordblks + info.hblkhd)

    return probe


def memory_probe(device: torch.device) -> tuple[Callable[[], int] | None, str]:
    """A function returning memory in use in bytes on ``device`` (None where it cannot be measured), and
    how it measures (see the module docstring: CUDA's ``memory_allocated``, glibc's ``mallinfo2``)."""
    if device.type == "cuda":
        return (
            lambda: torch.cuda.memory_allocated(device),
            "CUDA caching allocator: memory_allocated at each action's end, max_memory_allocated for the peak",
        )
    probe = _heap_probe()
    if probe is None:
        return None, "not measured (the C library has no mallinfo2)"
    return probe, "glibc mallinfo2 bytes in use, sampled at each action's end (peak: the largest sample)"


# --- the recorder -----------------------------------------------------------------------------------------
_active: list[ScheduleRecorder] = []


class ScheduleRecorder:
    """Record every action the stages of one rank run inside a ``with`` block.

    Args:
        stages: the stages this rank runs (``torch.distributed.pipelining`` stages or subclasses).
        memory: a function returning memory in use in bytes, sampled when each action ends; or None.
        clock: seconds, monotonic (``time.perf_counter``).

    After the block, :attr:`actions` holds a :class:`~graphkit.pipelining.planning.actions.TimedAction` for
    each action, in the order they ended, times
    relative to :meth:`start` (or to entering the block). One recorder at a time per process.

    Raises:
        TimelineError: a recorder is already active, or a stage lacks the per-chunk methods.
    """

    def __init__(
        self,
        stages: Sequence[Any],
        memory: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.stages = list(stages)
        self.memory = memory
        self.clock = clock
        self.actions: list[TimedAction] = []
        self._origin = 0.0
        self._memory_origin = 0
        self._saved: list[tuple[Any, str, Any]] = []
        self._module_saved: list[tuple[str, Any]] = []
        self._op_tags: dict[int, tuple[Any, Action]] = {}
        self._work_tags: dict[int, tuple[Any, list[Action]]] = {}
        for stage in self.stages:
            missing = [
                name for name in (*_STAGE_METHODS, *_OPS_METHODS) if not callable(getattr(stage, name, None))
            ]
            if missing:
                raise TimelineError(
                    f"{type(stage).__name__} has no {', '.join(missing)}: record stages of "
                    "torch.distributed.pipelining (PipelineStage or a subclass)"
                )

    def start(self) -> None:
        """Make now time zero (and the memory in use now memory zero)."""
        self._origin = self.clock()
        self._memory_origin = self.memory() if self.memory is not None else 0

    def now(self) -> float:
        return self.clock() - self._origin

    def _memory_now(self) -> int | None:
        return self.memory() - self._memory_origin if self.memory is not None else None

    # --- installing and restoring -------------------------------------------------------------------
    def __enter__(self) -> ScheduleRecorder:
        if _active:
            raise TimelineError(
                "a ScheduleRecorder is already recording in this process; record one at a time"
            )
        _active.append(self)
        try:
            for stage in self.stages:
                for name in _STAGE_METHODS:
                    self._patch(stage, name, self._compute_wrapper(stage, name))
                for name, kind in _OPS_METHODS.items():
                    self._patch(stage, name, self._ops_wrapper(stage, name, kind))
            schedules = torch_schedules
            for name, make in (("_batch_p2p", self._batch_wrapper), ("_wait_batch_p2p", self._wait_wrapper)):
                original = getattr(schedules, name)
                self._module_saved.append((name, original))
                setattr(schedules, name, make(original))
        except BaseException:
            self._restore()
            raise
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._restore()

    def _patch(self, stage: Any, name: str, wrapper: Callable[..., Any]) -> None:
        self._saved.append((stage, name, vars(stage).get(name, _MISSING)))
        setattr(stage, name, wrapper)

    def _restore(self) -> None:
        schedules = torch_schedules
        while self._module_saved:
            name, original = self._module_saved.pop()
            setattr(schedules, name, original)
        while self._saved:
            stage, name, previous = self._saved.pop()
            if previous is _MISSING:
                vars(stage).pop(name, None)
            else:
                setattr(stage, name, previous)
        self._op_tags.clear()
        self._work_tags.clear()
        if _active and _active[-1] is self:
            _active.pop()

    # --- wrappers ------------------------------------------------------------------------------------
    def _compute_wrapper(self, stage: Any, name: str) -> Callable[..., Any]:
        original = getattr(stage, name)
        signature = inspect.signature(original)
        chunk_argument = _STAGE_METHODS[name]

        def recorded(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if name == "forward_one_chunk":
                kind = "F"
            elif name == "backward_weight_one_chunk":
                kind = "W"
            else:
                kind = "B" if bound.arguments.get("full_backward", True) else "I"
            start = self.now()
            try:
                return original(*args, **kwargs)
            finally:
                action = Action(int(stage.stage_index), kind, int(bound.arguments[chunk_argument]))
                self.actions.append(TimedAction(action, start, self.now(), "run", self._memory_now()))

        return recorded

    def _ops_wrapper(self, stage: Any, name: str, kind: str) -> Callable[..., Any]:
        original = getattr(stage, name)

        def tagged(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            ops = original(chunk_id, *args, **kwargs)
            for op in ops:
                self._op_tags[id(op)] = (op, Action(int(stage.stage_index), kind, int(chunk_id)))
            return ops

        return tagged

    def _batch_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def batch(p2p_ops: list[Any], *args: Any, **kwargs: Any) -> Any:
            start = self.now()
            works = original(p2p_ops, *args, **kwargs)
            end = self.now()
            tags: list[Action] = []
            for op in p2p_ops:
                found = self._op_tags.pop(id(op), None)
                if found is not None and found[1] not in tags:
                    tags.append(found[1])
            self.actions += [TimedAction(action, start, end, "issue", None) for action in tags]
            for work in works or []:
                self._work_tags[id(work)] = (work, tags)
            return works

        return batch

    def _wait_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def wait(works: list[Any], *args: Any, **kwargs: Any) -> Any:
            start = self.now()
            result = original(works, *args, **kwargs)
            end = self.now()
            tags: list[Action] = []
            for work in works or []:
                found = self._work_tags.pop(id(work), None)
                for tag in found[1] if found is not None else ():
                    if tag not in tags:
                        tags.append(tag)
            memory = self._memory_now()
            self.actions += [TimedAction(action, start, end, "wait", memory) for action in tags]
            return result

        return wait


_MISSING = object()


# --- the schedule's own order ------------------------------------------------------------------------------
def schedule_compute_order(schedule: Any, rank: int) -> list[str]:
    """The compute actions the schedule plans for ``rank``, as labels (``"1I0"``), in its order.

    From ``pipeline_order_with_comms`` (the runtime of multi-stage schedules, what
    ``_PipelineScheduleRuntime._step_microbatches`` executes; ``OVERLAP_F_B`` expanded into its
    sub-actions) or ``pipeline_order`` (single-stage schedules); idle slots (None) are skipped.
    """
    if isinstance(schedule, torch_schedules.Schedule1F1B | torch_schedules.ScheduleGPipe):
        # their step runs graphkit's generation order; Schedule1F1B.pipeline_order names a microbatch too
        # many on its last rank (schedule_order says more)
        order = schedule_order(type(schedule), schedule._num_stages, schedule._n_microbatches)
        return order.labels().get(rank, [])
    order = getattr(schedule, "pipeline_order_with_comms", None) or getattr(schedule, "pipeline_order", None)
    if not order or rank not in order:
        return []
    return [str(action) for action in compute_actions(order[rank])]


def schedule_comm_order(schedule: Any, rank: int) -> list[str]:
    """The sends and receives a multi-stage schedule's runtime issues on ``rank``, as labels, in order.

    From ``pipeline_order_with_comms`` (``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B`` actions); empty
    for single-stage schedules, which issue their communication from code, not from an action list.
    """
    order = getattr(schedule, "pipeline_order_with_comms", None)
    if not order or rank not in order:
        return []
    kinds = set(_OPS_METHODS.values())
    return [
        f"{action.stage_index}{action.computation_type.value}{action.microbatch_index}"
        for action in order[rank]
        if action is not None and action.computation_type.value in kinds
    ]


# --- building stages and schedules ------------------------------------------------------------------------
def chained_stage_modules(
    modules: Sequence[nn.Module], num_stages: int, ranks: int, schedule: str
) -> list[nn.Module]:
    """``modules`` chained into ``num_stages`` stages of consecutive modules, so that every schedule runs the
    same modules in the same order (:func:`~graphkit.pipelining.schedules.common_stage_count` builds enough).

    Raises:
        TimelineError: the modules do not divide evenly into the stages, or the stages among the ranks.
    """
    if len(modules) % num_stages or num_stages % ranks:
        raise TimelineError(
            f"{schedule} on {ranks} rank(s) runs {num_stages} stages, and {len(modules)} stage modules "
            f"do not divide into them; give a multiple of {num_stages} stage modules"
        )
    per_stage = len(modules) // num_stages
    chained = []
    for stage_index in range(num_stages):
        parts = list(modules[stage_index * per_stage : (stage_index + 1) * per_stage])
        chained.append(parts[0] if len(parts) == 1 else StageChain(parts))
    return chained


STAGE_CLASSES = {
    "graphkit": "graphkit.pipelining.stage:PipelineStage",
    "torch": "torch.distributed.pipelining:PipelineStage",
}
"""The stage classes by the names of ``--stage``: graphkit's (the default) and PyTorch's own."""


def resolve_stage_class(stage_class: str | type | None) -> Any:
    """The class for ``graphkit`` (or None), ``torch``, ``package.module:Class`` or a class.

    Raises:
        TimelineError: a name that is none of those, or a class that cannot be imported.
    """
    stage_class = STAGE_CLASSES.get(stage_class, stage_class) if isinstance(stage_class, str) else stage_class
    if stage_class is None:
        stage_class = STAGE_CLASSES["graphkit"]
    if isinstance(stage_class, str):
        module_name, colon, name = stage_class.partition(":")
        if not colon or not name:
            raise TimelineError(f"stage class {stage_class!r}: give graphkit, torch or package.module:Class")
        try:
            return getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as error:
            raise TimelineError(f"stage class {stage_class!r} cannot be imported: {error}") from None
    return stage_class


def schedule_on_rank(
    modules: Sequence[nn.Module],
    schedule: Schedule,
    microbatches: int,
    rank: int,
    ranks: int,
    device: torch.device,
    loss_fn: Callable[..., torch.Tensor] | None,
    stage_class: str | type | None = None,
    stages_per_rank: int = 2,
) -> tuple[Any, list[Any]]:
    """This rank's stages, built from the pipeline's stage ``modules``, and ``schedule`` over them.

    Stages are placed as :mod:`graphkit.pipelining.schedules` says; ``modules`` are chained into as many
    stages as the schedule runs (:func:`chained_stage_modules`). ``stage_class``: ``"graphkit"`` or None
    (graphkit's ``PipelineStage``, the default), ``"torch"`` (PyTorch's), ``"package.module:Class"`` or a
    class. Call inside an initialised default process group of ``ranks`` processes.

    Raises:
        TimelineError: an unknown schedule, modules that do not divide into its stages, or a stage class
            that cannot be imported.
    """
    try:
        num_stages = stage_count(schedule, ranks, stages_per_rank)
        mine = stage_indices(schedule, rank, ranks, stages_per_rank)
    except ValueError as error:
        raise TimelineError(str(error)) from None
    chained = chained_stage_modules(modules, num_stages, ranks, schedule_name(schedule))
    factory = resolve_stage_class(stage_class)
    stages = [factory(chained[index].to(device), index, num_stages, device) for index in mine]
    return build_schedule(schedule, stages, microbatches, loss_fn, ranks=ranks), stages


# --- running ----------------------------------------------------------------------------------------------
def _prepare_schedule(
    pipeline: Any,
    name: Schedule,
    microbatches: int,
    rank: int,
    ranks: int,
    device: torch.device,
    stage_class: str | type | None,
    batch: tuple[tuple[Any, ...], torch.Tensor],
    stages_per_rank: int,
) -> tuple[Any, list[Any], list[nn.Module]]:
    """Build a schedule on fresh copies of the stage modules and run its unrecorded warm-up step."""
    import copy

    modules = [copy.deepcopy(module) for module in pipeline.stages]  # every schedule starts alike
    built, stages = schedule_on_rank(
        modules,
        name,
        microbatches,
        rank,
        ranks,
        device,
        pipeline.schedule_loss_fn(),
        stage_class,
        stages_per_rank,
    )
    args, target = batch
    built.step(*args, target=target)  # shape inference and first allocations
    return built, stages, modules


def record_rank_step(
    schedule: Any,
    stages: Sequence[Any],
    run: Callable[[], Any],
    rank: int,
    device: torch.device | str = "cpu",
    probe: Callable[[], int] | None = None,
) -> RankTimeline:
    """Record what ``run()`` (one step of ``schedule``) does on this rank's ``stages``: a :class:`RankTimeline`.

    Args:
        schedule: the schedule object (its action list gives ``expected_order`` / ``expected_comms``).
        stages: this rank's stages (any ``torch.distributed.pipelining`` stage class).
        run: runs the step, e.g. ``lambda: schedule.step(*inputs, target=target)``.
        rank: this rank's index in the schedule's pipeline (for the schedule's own order).
        device: where the stages run (CUDA is synchronized and its peak memory measured).
        probe: memory in use in bytes, sampled as each action ends (see :func:`memory_probe`), or None.

    Raises:
        whatever ``run()`` raises (the recorder is removed first); TimelineError as :class:`ScheduleRecorder`.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    base_peak = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    with ScheduleRecorder(stages, probe) as recorder:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_seconds = recorder.now()
    samples = [action.memory_bytes for action in recorder.actions if action.memory_bytes is not None]
    if device.type == "cuda":
        peak: int | None = torch.cuda.max_memory_allocated(device) - base_peak
    else:
        peak = max(samples, default=0) if probe is not None else None
    return RankTimeline(
        rank,
        [stage.stage_index for stage in stages],
        sorted(recorder.actions, key=lambda action: action.start),
        step_seconds,
        peak,
        schedule_compute_order(schedule, rank),
        schedule_comm_order(schedule, rank),
    )


def _record_step(
    prepared: tuple[Any, list[Any], list[nn.Module]],
    batch: tuple[tuple[Any, ...], torch.Tensor],
    rank: int,
    device: torch.device,
    probe: Callable[[], int] | None,
) -> RankTimeline:
    """One recorded step of a prepared schedule on this rank, from a clean slate, after a barrier."""
    built, stages, modules = prepared
    args, target = batch
    for module in modules:
        module.zero_grad(set_to_none=True)  # as optimizer.zero_grad(): the step allocates .grad
    for stage in stages:  # free the previous step's outputs now, so that memory zero is a clean slate
        stage.clear_runtime_states()
        stage.output_chunks.clear()
    built._internal_losses.clear()
    gc.collect()
    dist.barrier()
    return record_rank_step(built, stages, lambda: built.step(*args, target=target), rank, device, probe)


def _record_rank(
    pipeline: Any,
    schedules: Sequence[Schedule],
    microbatches: int,
    rank: int,
    ranks: int,
    device: torch.device,
    stage_class: str | type | None,
    steps: int = 1,
    stages_per_rank: int = 2,
) -> list[tuple[str, int, RankTimeline, str]]:
    """Record every schedule on this rank: a warm-up step each, then ``steps`` rounds of one step each.

    The rounds go through the schedules in turn, so a change in the machine's load touches them all
    alike, each round in the next order of a Williams design
    (:func:`~graphkit.measure.paired_rounds.balanced_order`), so that no schedule is
    always the one that runs first after the barrier, nor always right after a given other. Of each schedule's steps the one whose time (its slowest rank's) is the median is kept,
    the same step on every rank; ``step_times`` lists them all.
    """
    probe, method = memory_probe(device)
    pipeline.microbatches(microbatches)  # a batch that does not split evenly: a SpecError now
    args = tuple(value.to(device) if isinstance(value, torch.Tensor) else value for value in pipeline.inputs)
    batch = (args, pipeline.schedule_target().to(device))
    prepared = [
        _prepare_schedule(
            pipeline, name, microbatches, rank, ranks, device, stage_class, batch, stages_per_rank
        )
        for name in schedules
    ]
    rounds: list[list[RankTimeline]] = [[] for _ in prepared]
    for round_index in range(steps):
        for index in balanced_order(round_index, len(prepared)):
            rounds[index].append(_record_step(prepared[index], batch, rank, device, probe))
    results = []
    for name, (built, stages, _), recorded in zip(schedules, prepared, rounds, strict=True):
        times = torch.tensor([timeline.step_seconds for timeline in recorded], dtype=torch.float64)
        times = times.to(device) if device.type == "cuda" else times
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
        step_times = times.cpu().tolist()
        median = sorted(range(steps), key=lambda position: step_times[position])[(steps - 1) // 2]
        chosen = recorded[median]
        chosen.step_times = step_times
        # PyTorch's schedules by their names without "Schedule" ("1F1B", as graphkit plan names them);
        # graphkit's generated ones and CSV files all run as _PipelineScheduleRuntime, so they keep the
        # name they were asked for
        label = schedule_name(type(built))
        if type(built) is torch_schedules._PipelineScheduleRuntime:
            label = label if isinstance(name, type) else schedule_name(name)
        results.append((label, stages[0].num_stages, chosen, method))
    del prepared, rounds
    gc.collect()
    dist.barrier()
    return results


def _load(spec: Any, num_stages: int, batch_size: int) -> PipelineModel:
    return load_pipeline_spec(spec, num_stages=num_stages, batch_size=batch_size, seed=0)


def _record_spawned_rank(
    spec: str, schedules: list[Schedule], microbatches: int, device: str, options: dict[str, Any]
) -> list[tuple[str, int, RankTimeline, str]]:
    """What one spawned rank runs (:func:`~graphkit.pipelining.launcher.run_on_processes` has joined it to
    the group and set its threads and device)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    place = torch.device(device)
    if place.type == "cuda":
        place = torch.device("cuda", torch.cuda.current_device())
    return _record_rank(
        _load(spec, options["num_stages"], options["batch_size"]),
        schedules,
        microbatches,
        rank,
        ranks,
        place,
        options["stage_class"],
        options["steps"],
        options["stages_per_rank"],
    )


def following_rounds(
    earlier: list[ScheduleTimeline], later: list[ScheduleTimeline]
) -> list[ScheduleTimeline]:
    """``later``'s timelines (the latest recorded steps, whose actions are kept), each rank's step times
    preceded by ``earlier``'s: the rounds of several recordings of the same schedules (several sets of
    processes), in order; ``later`` itself where ``earlier`` is empty.

    Raises:
        ValueError: the two recordings hold different numbers of schedules or ranks.
    """
    if not earlier:
        return later
    for before, after in zip(earlier, later, strict=True):
        for old, new in zip(before.ranks, after.ranks, strict=True):
            new.step_times = list(old.step_times) + list(new.step_times)
    return later


def record_schedules(
    pipeline: Any,
    schedules: Sequence[str | type],
    microbatches: int = 4,
    ranks: int = 1,
    *,
    device: str | torch.device = "cpu",
    threads: int = 1,
    timeout_s: float = 120.0,
    stage: str = "graphkit",
    stage_class: str | type | None = None,
    steps: int = 1,
    stages_per_rank: int = 2,
    batch_size: int | None = None,
    pin_cores: bool = False,
) -> list[ScheduleTimeline]:
    """Run one recorded step of each schedule on the same pipeline, in one run; a timeline for each.

    Args:
        pipeline: a pipeline spec (:mod:`graphkit.models.pipeline_specs`), built with
            as many stages as every schedule runs
            (:func:`~graphkit.pipelining.schedules.common_stage_count`) and ``batch_size`` rows, under seed 0
            on every rank; or
            (``ranks=1`` only) a function as a spec takes, or a loaded
            :class:`~graphkit.models.pipeline_specs.PipelineModel` with that many stages.
        schedules: names (``"1F1B"``, ``"Interleaved1F1B"``, ``"ZBVZeroBubble"``, ``"csv:PATH"``, ...),
            classes of ``torch.distributed.pipelining`` schedules, or
            :class:`~graphkit.pipelining.planning.actions.ScheduleOrder` objects (passed to the ranks as
            they are; a ``csv:PATH`` is read here, once).
        microbatches: microbatches per step; the batch is split into them along dimension 0.
        ranks: 1 runs every stage in this process (a world-size-1 gloo group); more spawns that many
            processes on 127.0.0.1, each running its stages (placed as
            :func:`~graphkit.pipelining.schedules.stage_indices` says).
        device: ``cpu`` (gloo) or ``cuda`` (NCCL, rank ``r`` on GPU ``r % device_count``).
        threads: intra-op CPU threads per rank (1 keeps ranks from competing for cores).
        timeout_s: the process group's timeout, and the deadline of the whole run in seconds; past it,
            the spawned ranks are ended.
        stage: ``"graphkit"`` (graphkit's ``PipelineStage``, the default) or ``"torch"`` (PyTorch's).
        stage_class: another stage class (or ``"package.module:Class"``); overrides ``stage``.
        steps: recorded steps per schedule, taken in rounds over the schedules; the timeline kept is the
            median step (by its slowest rank), and ``summary()["recorded_step_seconds"]`` lists them all.
        stages_per_rank: stages per rank of the interleaved schedules (V schedules: always two).
        batch_size: the whole batch; None: :data:`~graphkit.models.pipeline_specs.DEFAULT_MICROBATCH_SIZE`
            rows per microbatch.
        pin_cores: spawned ranks each run on one CPU core (``pin_cores`` of
            :func:`~graphkit.pipelining.launcher.run_on_processes`; Linux): steadier steps on a CPU machine
            with a core per rank. With ``ranks=1`` nothing is spawned and nothing pinned.

    Returns:
        One :class:`ScheduleTimeline` per schedule, in order.

    Raises:
        TimelineError: bad arguments, a rank failed (its error text is included) or the deadline passed;
            ``pin_cores`` where the platform cannot pin (before any rank starts).
        graphkit.models.specs.SpecError: the pipeline spec does not load, or its batch does not split
            into ``microbatches``.
    """
    if microbatches < 1 or ranks < 1 or steps < 1:
        raise TimelineError(
            f"microbatches, ranks and steps must be at least 1, got {microbatches}, {ranks} and {steps}"
        )
    if stage not in STAGE_CLASSES:
        raise TimelineError(f"stage must be one of {', '.join(STAGE_CLASSES)}, got {stage!r}")
    try:
        names = [resolve_schedule(schedule) for schedule in schedules]  # a bad name or file fails early
        num_stages = common_stage_count(names, ranks, stages_per_rank)
        for schedule in names:
            check_microbatches(schedule, microbatches)
            check_ranks(schedule, ranks)
    except ValueError as error:
        raise TimelineError(str(error)) from None
    if pin_cores and ranks > 1:
        try:
            usable_cores()  # a platform that cannot pin is refused before any rank starts
        except LaunchError as error:
            raise TimelineError(str(error)) from None
    batch_size = batch_size if batch_size is not None else DEFAULT_MICROBATCH_SIZE * microbatches
    stage_class = stage_class if stage_class is not None else STAGE_CLASSES[stage]
    resolve_stage_class(stage_class)  # fail early on a class that cannot be imported
    device = torch.device(device)
    if ranks == 1:
        loaded = pipeline if isinstance(pipeline, PipelineModel) else _load(pipeline, num_stages, batch_size)
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with process_group(0, 1, free_port(), device=device, timeout_s=timeout_s):
                recorded = [
                    _record_rank(
                        loaded,
                        names,
                        microbatches,
                        0,
                        1,
                        device,
                        stage_class,
                        steps,
                        stages_per_rank,
                    )
                ]
        finally:
            torch.set_num_threads(previous_threads)
    else:
        if not isinstance(pipeline, str):
            raise TimelineError(
                "spawned ranks load the pipeline themselves: pass a pipeline spec string, not a "
                f"{type(pipeline).__name__}"
            )
        if not isinstance(stage_class, str):
            stage_class = f"{stage_class.__module__}:{stage_class.__qualname__}"
        target, colon, function = pipeline.rpartition(":")
        if colon and (target.endswith(".py") or "/" in target) and not pipeline.startswith("zoo-pipeline:"):
            pipeline = f"{Path(target).resolve()}:{function}"  # the ranks find the caller's file
        options = {
            "stage_class": stage_class,
            "steps": steps,
            "stages_per_rank": stages_per_rank,
            "num_stages": num_stages,
            "batch_size": batch_size,
        }
        try:
            recorded = run_on_processes(
                _record_spawned_rank,
                (pipeline, names, microbatches, str(device), options),
                world_size=ranks,
                deadline=timeout_s,
                group_timeout=timeout_s,
                device=device,
                threads=threads,
                pin_cores=pin_cores,
            )
        except LaunchError as error:
            if error.timed_out:
                raise TimelineError(
                    f"the {ranks} ranks did not finish within {timeout_s:g} s; raise timeout_s "
                    "(--timeout on the command line), or look for a rank stuck in a receive"
                ) from None
            if error.rank is None:  # none could start (a CUDA device asked for where there is none)
                raise TimelineError(str(error)) from None
            raise TimelineError(f"rank {error.rank} failed: {error.detail}") from None
    return [
        ScheduleTimeline.merge(
            [
                ScheduleTimeline(name, microbatches, num_stages, [rank_timeline], str(device), method)
                for name, num_stages, rank_timeline, method in (
                    recorded[rank][position] for rank in range(ranks)
                )
            ]
        )
        for position in range(len(names))
    ]
