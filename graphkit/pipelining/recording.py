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
recorded steps (in rounds over the schedules; the median one is kept), each after a barrier; times are
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
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "COMPUTE_KINDS",
    "STAGE_CLASSES",
    "RankTimeline",
    "RecordedAction",
    "ScheduleRecorder",
    "ScheduleTimeline",
    "TimelineError",
    "build_schedule",
    "memory_probe",
    "pipeline_stage_count",
    "record_rank_step",
    "record_schedules",
    "schedule_comm_order",
    "schedule_compute_order",
    "schedule_stage_count",
    "stage_assignment",
]

COMPUTE_KINDS = ("F", "I", "W", "B")
"""The kinds of action that compute (the rest communicate)."""

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


class TimelineError(RuntimeError):
    """A schedule could not be recorded (bad arguments, a failed or stuck rank); the message says why."""


@dataclass(slots=True)
class RecordedAction:
    """One action a rank ran. Times in seconds since the recorded step began on that rank.

    ``phase``: ``run`` for compute, ``issue`` or ``wait`` for communication. ``memory_bytes``: memory in
    use when it ended, relative to the step's start (see the module docstring), or None.
    """

    kind: str
    stage_index: int
    microbatch: int
    start: float
    end: float
    phase: str = "run"
    memory_bytes: int | None = None

    @property
    def label(self) -> str:
        """PyTorch's action name, ``1F0``: stage, kind, microbatch."""
        return f"{self.stage_index}{self.kind}{self.microbatch}"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS


@dataclass(slots=True)
class RankTimeline:
    """What one rank ran in the recorded step, and the schedule's own compute order for it."""

    rank: int
    stages: list[int]
    actions: list[RecordedAction]
    step_seconds: float
    peak_memory_bytes: int | None
    expected_order: list[str] = field(default_factory=list)
    expected_comms: list[str] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)

    def compute_actions(self) -> list[RecordedAction]:
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
        schedule: the schedule class's name (``ScheduleZBVZeroBubble``).
        microbatches: microbatches per step; num_stages: pipeline stages.
        ranks: one :class:`RankTimeline` per rank, by rank.
        device: where the stages ran; memory_method: how memory was sampled.
    """

    schedule: str
    microbatches: int
    num_stages: int
    ranks: list[RankTimeline]
    device: str = "cpu"
    memory_method: str = ""

    @property
    def step_seconds(self) -> float:
        """The step's wall time: the longest rank's."""
        return max((rank.step_seconds for rank in self.ranks), default=0.0)

    @property
    def bubble_fraction(self) -> float:
        """Share of rank-time not spent computing: ``1 - sum(compute seconds) / (ranks * step seconds)``."""
        total = self.step_seconds * len(self.ranks)
        return 1.0 - sum(rank.compute_seconds() for rank in self.ranks) / total if total > 0 else 0.0

    def rank_bubble_fraction(self, rank: int) -> float:
        """One rank's share of the step spent not computing."""
        step = self.step_seconds
        return 1.0 - self.ranks[rank].compute_seconds() / step if step > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """Step time, bubble fraction and peak memory per rank: what :func:`compare` puts side by side."""
        return {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "ranks": len(self.ranks),
            "step_seconds": self.step_seconds,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": [rank.peak_memory_bytes for rank in self.ranks],
            "rank_bubble_fraction": [self.rank_bubble_fraction(rank.rank) for rank in self.ranks],
            "recorded_step_seconds": self.ranks[0].step_times if self.ranks else [],
        }

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.summary()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScheduleTimeline:
        """Rebuild a timeline from :meth:`to_dict` (the ``summary`` key is ignored)."""
        ranks = [
            RankTimeline(
                rank=rank["rank"],
                stages=list(rank["stages"]),
                actions=[RecordedAction(**action) for action in rank["actions"]],
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
        )

    def _repr_svg_(self) -> str:
        from graphkit.drawing.timeline import timeline_svg

        return timeline_svg(self)


# --- memory probes ----------------------------------------------------------------------------------------
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
def _schedules_module() -> Any:
    from torch.distributed.pipelining import schedules

    return schedules


_active: list[ScheduleRecorder] = []


class ScheduleRecorder:
    """Record every action the stages of one rank run inside a ``with`` block.

    Args:
        stages: the stages this rank runs (``torch.distributed.pipelining`` stages or subclasses).
        memory: a function returning memory in use in bytes, sampled when each action ends; or None.
        clock: seconds, monotonic (``time.perf_counter``).

    After the block, :attr:`actions` holds :class:`RecordedAction` in the order they started, times
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
        self.actions: list[RecordedAction] = []
        self._origin = 0.0
        self._memory_origin = 0
        self._saved: list[tuple[Any, str, Any]] = []
        self._module_saved: list[tuple[str, Any]] = []
        self._op_tags: dict[int, tuple[Any, str, int, int]] = {}
        self._work_tags: dict[int, tuple[Any, list[tuple[str, int, int]]]] = {}
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
            schedules = _schedules_module()
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
        schedules = _schedules_module()
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
                self.actions.append(
                    RecordedAction(
                        kind,
                        int(stage.stage_index),
                        int(bound.arguments[chunk_argument]),
                        start,
                        self.now(),
                        "run",
                        self._memory_now(),
                    )
                )

        return recorded

    def _ops_wrapper(self, stage: Any, name: str, kind: str) -> Callable[..., Any]:
        original = getattr(stage, name)

        def tagged(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            ops = original(chunk_id, *args, **kwargs)
            for op in ops:
                self._op_tags[id(op)] = (op, kind, int(stage.stage_index), int(chunk_id))
            return ops

        return tagged

    def _batch_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def batch(p2p_ops: list[Any], *args: Any, **kwargs: Any) -> Any:
            start = self.now()
            works = original(p2p_ops, *args, **kwargs)
            end = self.now()
            tags: list[tuple[str, int, int]] = []
            for op in p2p_ops:
                found = self._op_tags.pop(id(op), None)
                if found is not None and (found[1], found[2], found[3]) not in tags:
                    tags.append((found[1], found[2], found[3]))
            for kind, stage_index, microbatch in tags:
                self.actions.append(RecordedAction(kind, stage_index, microbatch, start, end, "issue", None))
            for work in works or []:
                self._work_tags[id(work)] = (work, tags)
            return works

        return batch

    def _wait_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def wait(works: list[Any], *args: Any, **kwargs: Any) -> Any:
            start = self.now()
            result = original(works, *args, **kwargs)
            end = self.now()
            tags: list[tuple[str, int, int]] = []
            for work in works or []:
                found = self._work_tags.pop(id(work), None)
                for tag in found[1] if found is not None else ():
                    if tag not in tags:
                        tags.append(tag)
            memory = self._memory_now()
            for kind, stage_index, microbatch in tags:
                self.actions.append(RecordedAction(kind, stage_index, microbatch, start, end, "wait", memory))
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
    order = getattr(schedule, "pipeline_order_with_comms", None) or getattr(schedule, "pipeline_order", None)
    if not order or rank not in order:
        return []
    labels = []
    stack = list(reversed([action for action in order[rank] if action is not None]))
    while stack:
        action = stack.pop()
        if action.sub_actions:
            stack.extend(reversed(action.sub_actions))
            continue
        kind = action.computation_type.value
        if kind in COMPUTE_KINDS:
            labels.append(f"{action.stage_index}{kind}{action.microbatch_index}")
    return labels


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
class _Chain(nn.Module):
    """Consecutive pipeline stages run as one: each one's outputs are the next one's positional inputs."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(modules)

    def forward(self, *args: Any) -> Any:
        result: Any = args
        for part in self.parts:
            result = part(*(result if isinstance(result, tuple) else (result,)))
        return result


def schedule_class(name: str | type) -> type:
    """The schedule class for a name such as ``ZBVZeroBubble``, ``ScheduleZBVZeroBubble`` or ``1f1b``.

    Raises:
        TimelineError: no such schedule in ``torch.distributed.pipelining``.
    """
    if isinstance(name, type):
        return name
    schedules = _schedules_module()
    stripped = name[len("Schedule") :] if name.lower().startswith("schedule") else name
    try:
        return schedules.get_schedule_class(stripped)
    except ValueError as error:
        raise TimelineError(f"unknown schedule {name!r}: {error}") from None


def _is_v_schedule(cls: type) -> bool:
    schedules = _schedules_module()
    return issubclass(cls, schedules.ScheduleZBVZeroBubble | schedules.ScheduleDualPipeV)


def schedule_stage_count(cls: type, ranks: int, stages_per_rank: int = 2) -> int:
    """How many stages schedule class ``cls`` runs on ``ranks`` ranks: one per rank for single-stage
    schedules (GPipe, 1F1B), two per rank for the V schedules (ZBV, DualPipeV), ``stages_per_rank`` per
    rank for the other multi-stage (interleaved) ones."""
    schedules = _schedules_module()
    if issubclass(cls, schedules.PipelineScheduleSingle):
        return ranks
    if _is_v_schedule(cls):
        return 2 * ranks
    return stages_per_rank * ranks


def pipeline_stage_count(schedules: Sequence[str | type], ranks: int, stages_per_rank: int = 2) -> int:
    """How many stage modules to build so that every schedule runs the same ones: the least common
    multiple of :func:`schedule_stage_count` over ``schedules`` (a schedule that needs fewer stages
    chains consecutive modules into one, see :func:`stage_assignment`).

    Raises:
        TimelineError: an unknown schedule, or ``ranks`` or ``stages_per_rank`` below 1.
    """
    import math

    if ranks < 1 or stages_per_rank < 1:
        raise TimelineError(
            f"ranks and stages_per_rank must be at least 1, got {ranks} and {stages_per_rank}"
        )
    counts = [schedule_stage_count(schedule_class(name), ranks, stages_per_rank) for name in schedules]
    return math.lcm(*counts) if counts else ranks


def stage_assignment(
    cls: type, num_modules: int, ranks: int, stages_per_rank: int = 2
) -> tuple[int, list[list[int]]]:
    """``(num_stages, modules of each stage)`` and which stages each rank runs, for a schedule class.

    The schedule runs :func:`schedule_stage_count` stages; consecutive modules are chained into that many
    stages, so every schedule runs the same modules in the same order. Stages are placed as PyTorch
    places them (``loop``: stage ``s`` on rank ``s % ranks``; ``v`` for ZBV and DualPipeV).

    Returns:
        ``(num_stages, stages_of_rank)`` with ``stages_of_rank[r]`` the stage indices of rank ``r``.

    Raises:
        TimelineError: the modules do not divide evenly among the ranks.
    """
    schedules = _schedules_module()
    num_stages = schedule_stage_count(cls, ranks, stages_per_rank)
    if num_modules % num_stages or num_stages % ranks:
        raise TimelineError(
            f"{cls.__name__} on {ranks} rank(s) runs {num_stages} stages, and {num_modules} stage modules "
            f"do not divide into them; give a multiple of {num_stages} stage modules"
        )
    if issubclass(cls, schedules.PipelineScheduleSingle):
        return num_stages, [[rank] for rank in range(ranks)]
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    style = "v" if _is_v_schedule(cls) else "loop"
    mapping = generate_stage_to_rank_mapping(ranks, num_stages, style=style)
    return num_stages, [sorted(s for s, r in mapping.items() if r == rank) for rank in range(ranks)]


STAGE_CLASSES = {
    "graphkit": "graphkit.pipelining.stage:PipelineStage",
    "torch": "torch.distributed.pipelining:PipelineStage",
}
"""The stage classes by the names of ``--stage``: graphkit's (the default) and PyTorch's own."""


def _resolve_stage_class(stage_class: str | type | None) -> Any:
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


def build_schedule(
    modules: Sequence[nn.Module],
    schedule: str | type,
    microbatches: int,
    rank: int,
    ranks: int,
    device: torch.device,
    loss_fn: Callable[..., torch.Tensor] | None,
    stage_class: str | type | None = None,
    stages_per_rank: int = 2,
) -> tuple[Any, list[Any]]:
    """This rank's stages and the schedule over them.

    ``stage_class``: ``"graphkit"`` or None (graphkit's ``PipelineStage``, the default), ``"torch"``
    (PyTorch's), ``"package.module:Class"`` or a class. Call inside an initialised default process group
    of ``ranks`` processes.

    Raises:
        TimelineError: see :func:`stage_assignment` and :func:`_resolve_stage_class`.
    """
    cls = schedule_class(schedule)
    num_stages, stages_of_rank = stage_assignment(cls, len(modules), ranks, stages_per_rank)
    factory = _resolve_stage_class(stage_class)
    per_stage = len(modules) // num_stages
    stages = []
    for stage_index in stages_of_rank[rank]:
        parts = list(modules[stage_index * per_stage : (stage_index + 1) * per_stage])
        module = parts[0] if len(parts) == 1 else _Chain(parts)
        stages.append(factory(module.to(device), stage_index, num_stages, device))
    schedules = _schedules_module()
    if issubclass(cls, schedules.PipelineScheduleSingle):
        built = cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    else:
        built = cls(stages, n_microbatches=microbatches, loss_fn=loss_fn)
    return built, stages


# --- running ----------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _loopback_interface() -> str | None:
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


@contextmanager
def _process_group(
    rank: int, ranks: int, port: int, device: torch.device, timeout_s: float
) -> Iterator[None]:
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != ranks:
            raise TimelineError(
                f"a process group of {dist.get_world_size()} ranks is already initialised; record with "
                f"ranks={dist.get_world_size()} or outside it"
            )
        yield
        return
    interface = _loopback_interface()
    if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = interface  # keep gloo on 127.0.0.1
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=ranks,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _prepare_schedule(
    pipeline: Any,
    name: str,
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
    built, stages = build_schedule(
        modules, name, microbatches, rank, ranks, device, pipeline.loss_fn, stage_class, stages_per_rank
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
    import torch.distributed as dist

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
    schedules: Sequence[str],
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
    alike. Of each schedule's steps the one whose time (its slowest rank's) is the median is kept,
    the same step on every rank; ``step_times`` lists them all.
    """
    import torch.distributed as dist

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
    for _ in range(steps):
        for index, item in enumerate(prepared):
            rounds[index].append(_record_step(item, batch, rank, device, probe))
    results = []
    for (built, stages, _), recorded in zip(prepared, rounds, strict=True):
        times = torch.tensor([timeline.step_seconds for timeline in recorded], dtype=torch.float64)
        times = times.to(device) if device.type == "cuda" else times
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
        step_times = times.cpu().tolist()
        median = sorted(range(steps), key=lambda position: step_times[position])[(steps - 1) // 2]
        chosen = recorded[median]
        chosen.step_times = step_times
        results.append((type(built).__name__, stages[0].num_stages, chosen, method))
    del prepared, rounds
    gc.collect()
    dist.barrier()
    return results


def _load(spec: Any, num_stages: int, batch_size: int) -> Any:
    from graphkit.models.pipeline_specs import load_pipeline_spec

    return load_pipeline_spec(spec, num_stages=num_stages, batch_size=batch_size, seed=0)


def _rank_main(config: dict[str, Any]) -> int:
    """Entry point of a spawned rank (``python -m graphkit.pipelining.recording CONFIG``).

    Records, then writes ``{"payload": ...}`` or ``{"error": text}`` to ``config["result"]``.
    """
    try:
        rank, ranks = config["rank"], config["ranks"]
        torch.set_num_threads(config["threads"])
        device = torch.device(config["device"])
        if device.type == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        with _process_group(rank, ranks, config["port"], device, config["timeout_s"]):
            recorded = _record_rank(
                _load(config["spec"], config["num_stages"], config["batch_size"]),
                config["schedules"],
                config["microbatches"],
                rank,
                ranks,
                device,
                config["stage_class"],
                config["steps"],
                config["stages_per_rank"],
            )
        result: dict[str, Any] = {
            "payload": [
                [name, stages, asdict(timeline), method] for name, stages, timeline, method in recorded
            ]
        }
    except BaseException as error:  # reported to the parent, which raises it
        import traceback

        result = {"error": f"{type(error).__name__}: {error}\n{traceback.format_exc()}"}
    with open(config["result"] + ".partial", "w") as handle:
        json.dump(result, handle)
    os.replace(config["result"] + ".partial", config["result"])
    return 0 if "payload" in result else 1


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
) -> list[ScheduleTimeline]:
    """Run one recorded step of each schedule on the same pipeline, in one run; a timeline for each.

    Args:
        pipeline: a pipeline spec (:mod:`graphkit.models.pipeline_specs`), built with
            :func:`pipeline_stage_count` stages and ``batch_size`` rows, under seed 0 on every rank; or
            (``ranks=1`` only) a function as a spec takes, or a loaded
            :class:`~graphkit.models.pipeline_specs.PipelineModel` with that many stages.
        schedules: names (``"1F1B"``, ``"Interleaved1F1B"``, ``"ZBVZeroBubble"``, ...) or classes of
            ``torch.distributed.pipelining`` schedules.
        microbatches: microbatches per step; the batch is split into them along dimension 0.
        ranks: 1 runs every stage in this process (a world-size-1 gloo group); more spawns that many
            processes on 127.0.0.1, each running its stages (see :func:`stage_assignment`).
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

    Returns:
        One :class:`ScheduleTimeline` per schedule, in order.

    Raises:
        TimelineError: bad arguments, a rank failed (its error text is included) or the deadline passed.
        graphkit.models.specs.SpecError: the pipeline spec does not load, or its batch does not split
            into ``microbatches``.
    """
    from graphkit.models.pipeline_specs import DEFAULT_MICROBATCH_SIZE, PipelineModel

    if microbatches < 1 or ranks < 1 or steps < 1:
        raise TimelineError(
            f"microbatches, ranks and steps must be at least 1, got {microbatches}, {ranks} and {steps}"
        )
    if stage not in STAGE_CLASSES:
        raise TimelineError(f"stage must be one of {', '.join(STAGE_CLASSES)}, got {stage!r}")
    names = [cls.__name__ if isinstance(cls, type) else str(cls) for cls in schedules]
    num_stages = pipeline_stage_count(schedules, ranks, stages_per_rank)  # a bad name fails early
    batch_size = batch_size if batch_size is not None else DEFAULT_MICROBATCH_SIZE * microbatches
    stage_class = stage_class if stage_class is not None else STAGE_CLASSES[stage]
    _resolve_stage_class(stage_class)  # fail early on a class that cannot be imported
    device = torch.device(device)
    if ranks == 1:
        loaded = pipeline if isinstance(pipeline, PipelineModel) else _load(pipeline, num_stages, batch_size)
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with _process_group(0, 1, _free_port(), device, timeout_s):
                recorded = [
                    _record_rank(
                        loaded,
                        list(schedules),
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
        payloads = _spawn(
            pipeline,
            names,
            microbatches,
            ranks,
            device,
            timeout_s,
            threads,
            {
                "stage_class": stage_class,
                "steps": steps,
                "stages_per_rank": stages_per_rank,
                "num_stages": num_stages,
                "batch_size": batch_size,
            },
        )
        recorded = [
            [(name, stages, _rank_from_dict(timeline), method) for name, stages, timeline, method in payload]
            for payload in payloads
        ]
    timelines = []
    for position in range(len(names)):
        per_rank = [recorded[rank][position] for rank in range(ranks)]
        name, schedule_stages, _, method = per_rank[0]
        timelines.append(
            ScheduleTimeline(
                name, microbatches, schedule_stages, [item[2] for item in per_rank], str(device), method
            )
        )
    return timelines


def _rank_from_dict(data: dict[str, Any]) -> RankTimeline:
    return ScheduleTimeline.from_dict(
        {"schedule": "", "microbatches": 0, "num_stages": 0, "ranks": [data]}
    ).ranks[0]


def _spawn(
    spec: str,
    schedules: list[str],
    microbatches: int,
    ranks: int,
    device: torch.device,
    timeout_s: float,
    threads: int,
    options: dict[str, Any],
) -> list[Any]:
    """Run :func:`_rank_main` in ``ranks`` child processes; their payloads by rank.

    Ends only the processes it started: at the deadline, or as soon as one rank fails (the others
    would wait for it until the process group's timeout).
    """
    port = _free_port()
    deadline = time.monotonic() + timeout_s
    # the children import this very graphkit (its folder first on sys.path), and find the caller's
    # modules and files as the caller does (its working folder next on the path, file specs absolute)
    root = str(Path(__file__).resolve().parents[2])
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [root, os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    target, colon, function = spec.rpartition(":")
    if colon and (target.endswith(".py") or "/" in target) and not spec.startswith("zoo-pipeline:"):
        spec = f"{Path(target).resolve()}:{function}"
    with tempfile.TemporaryDirectory(prefix="graphkit-timeline-") as folder:
        children: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
        try:
            for rank in range(ranks):
                config = {
                    "spec": spec,
                    "schedules": schedules,
                    "microbatches": microbatches,
                    "rank": rank,
                    "ranks": ranks,
                    "port": port,
                    "device": str(device),
                    "timeout_s": timeout_s,
                    "threads": threads,
                    **options,
                    "result": str(Path(folder) / f"rank{rank}.json"),
                }
                log = Path(folder) / f"rank{rank}.log"
                with open(log, "wb") as output:
                    process = subprocess.Popen(
                        [sys.executable, "-m", "graphkit.pipelining.recording", json.dumps(config)],
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        cwd=root,
                        env=environment,
                    )
                children.append((process, Path(config["result"]), log))
            while any(process.poll() is None for process, _, _ in children):
                for rank, (process, result, log) in enumerate(children):
                    if process.poll() not in (None, 0):
                        raise TimelineError(f"rank {rank} failed: {_rank_failure(result, log)}")
                if time.monotonic() > deadline:
                    raise TimelineError(
                        f"the {ranks} ranks did not finish within {timeout_s:g} s; raise timeout_s "
                        "(--timeout on the command line), or look for a rank stuck in a receive"
                    )
                time.sleep(0.05)
            payloads = []
            for rank, (process, result, log) in enumerate(children):
                if process.returncode != 0 or not result.exists():
                    raise TimelineError(f"rank {rank} failed: {_rank_failure(result, log)}")
                payloads.append(json.loads(result.read_text())["payload"])
            return payloads
        finally:
            for process, _, _ in children:
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(timeout=5)


def _rank_failure(result: Path, log: Path) -> str:
    if result.exists():
        error = json.loads(result.read_text()).get("error")
        if error:
            return str(error)
    text = log.read_text(errors="replace") if log.exists() else ""
    return text[-2000:] or "it exited without a result"


if __name__ == "__main__":
    sys.exit(_rank_main(json.loads(sys.argv[1])))
