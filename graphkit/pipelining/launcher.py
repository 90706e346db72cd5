"""The one way graphkit starts ranks: a free port, a process group, a deadline, and only its own children.

- :func:`run_on_processes` starts R processes (``multiprocessing`` "spawn"), each of which joins a process
  group over ``127.0.0.1`` on a free port (gloo on the CPU, NCCL on CUDA with rank ``r`` on GPU
  ``r % device_count``), with a short process-group timeout, calls the function, and sends its result back.
  The parent waits until every result is in or the deadline passes; then it ends the children it started
  (and only those), so a hung collective never outlives the call.
- :func:`process_group` joins (and afterwards leaves) such a group from the calling process;
  :func:`local_process_group` makes a world-size-1 gloo group with no port at all (a ``HashStore``), for
  running every stage of a pipeline in one process.

Children find the caller's modules as the caller does: "spawn" gives them the parent's ``sys.path`` and
working folder. They run under the allocator :mod:`graphkit.measure.allocator` tunes (glibc's malloc without
``mmap`` or trimming: fresh tensors do not page-fault), unless ``GRAPHKIT_ALLOCATOR=default`` or
``allocator="default"`` says to leave it as they start with it.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from graphkit.measure.allocator import allocator_choice, environment_for_processes, tune_allocator

__all__ = [
    "LaunchError",
    "free_port",
    "local_process_group",
    "process_group",
    "run_on_processes",
    "usable_cores",
]


class LaunchError(RuntimeError):
    """A process failed, the processes did not finish before the deadline, or none could start.

    ``rank`` is the failed process's rank (None otherwise), ``detail`` its error text; ``timed_out`` is
    True when the deadline passed.
    """

    def __init__(
        self, message: str, *, rank: int | None = None, detail: str = "", timed_out: bool = False
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.timed_out = timed_out
        self.detail = detail or message


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _loopback_interface() -> str | None:
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


@contextlib.contextmanager
def process_group(
    rank: int,
    world_size: int,
    port: int,
    *,
    device: torch.device | str = "cpu",
    timeout_s: float = 30.0,
) -> Iterator[None]:
    """Join a process group of ``world_size`` ranks on ``tcp://127.0.0.1:port`` for the duration.

    gloo on the CPU, NCCL when ``device`` is CUDA; gloo is kept on the loopback interface. A group that
    already exists with ``world_size`` ranks is used as it is (and not destroyed).

    Raises:
        RuntimeError: a group of another size already exists.
    """
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RuntimeError(
                f"a process group of {dist.get_world_size()} ranks is already initialised; run with "
                f"{dist.get_world_size()} ranks or outside it"
            )
        yield
        return
    interface = _loopback_interface()
    if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = interface  # keep gloo on 127.0.0.1
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    gloo = torch.device(device).type != "cuda"
    dist.init_process_group(
        backend="gloo" if gloo else "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        if gloo:
            # gloo returns from joining once this rank's own connections stand: a rank whose work is
            # short could leave (closing them) while a slower peer still connects its full mesh, which
            # then fails with "Connection closed by peer"; nobody starts before everyone has joined
            dist.barrier()
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def local_process_group() -> Iterator[None]:
    """A world-size-1 gloo process group (no ports: a ``HashStore``) for the duration, unless one exists."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


def _child(
    rank: int,
    world_size: int,
    port: int,
    group_timeout: float,
    device: str,
    threads: int,
    function: Callable[..., Any],
    arguments: tuple[Any, ...],
    results: Any,
    core: int | None = None,
    allocator: str = "tuned",
) -> None:
    try:
        tune_allocator(allocator)  # first: the tensors this rank makes reuse the memory freed before them
        _end_with_parent()  # after: a thread started before the tuning gets an arena of its own
        if core is not None:
            try:
                _pin_threads(core)
            except OSError as error:
                raise LaunchError(f"rank {rank} could not be pinned to CPU core {core}: {error}") from None
        torch.set_num_threads(threads)
        place = torch.device(device)
        if place.type == "cuda":
            place = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(place)
        with process_group(rank, world_size, port, device=place, timeout_s=group_timeout):
            try:
                outcome = ("ok", function(*arguments))
            except BaseException as error:
                # reported before this rank leaves the group, so that the parent hears of it before the
                # peers' "connection reset" errors that leaving causes
                results.put((rank, "error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
                results.close()
                results.join_thread()
                return
    except BaseException as error:  # joining or leaving the group failed: reported to the parent
        outcome = ("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
    results.put((rank, *outcome))


PARENT_CHECK_SECONDS = 1.0
"""How often a spawned rank checks that the process that started it still runs."""


def _end_with_parent() -> None:
    """End this rank (exit status 1) once the process that started it is gone: a parent killed (Ctrl-C twice,
    ``kill``, a CI job cancelled) cannot end its ranks, and a rank left waiting for a dead peer would spin
    in the process group until its timeout, taking a core from whatever runs next. A daemon thread polls
    the parent's pid every :data:`PARENT_CHECK_SECONDS` (portable where ``prctl(PR_SET_PDEATHSIG)`` is not)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_SECONDS)
            if os.getppid() != parent:  # re-parented: the parent is gone
                os._exit(1)

    threading.Thread(target=watch, name="graphkit-parent-watch", daemon=True).start()


def _pin_threads(core: int) -> None:
    """Run this process on ``core`` only: every thread it has now (``/proc/self/task``; a thread the
    interpreter's start-up left) and, through the calling thread's mask, every thread it starts later
    (the process group's, the intra-op pool's)."""
    os.sched_setaffinity(0, {core})
    with contextlib.suppress(OSError):  # no /proc: the calling thread's mask is what there is
        for thread in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(thread), {core})


def usable_cores() -> list[int]:
    """The CPU cores this process may run on, ascending: what ``pin_cores`` deals out to the ranks.

    Raises:
        LaunchError: the platform cannot pin a process to a core (no ``os.sched_setaffinity``: pinning is
            Linux's). Callers check this before any costly work.
    """
    if not hasattr(os, "sched_setaffinity"):
        raise LaunchError(
            "pinning ranks to cores needs os.sched_setaffinity, which this platform lacks (it is Linux's); "
            "leave out --pin-cores (pin_cores=False)"
        )
    return sorted(os.sched_getaffinity(0))


def run_on_processes(
    function: Callable[..., Any],
    arguments: tuple[Any, ...],
    *,
    world_size: int,
    deadline: float = 120.0,
    group_timeout: float = 30.0,
    device: torch.device | str = "cpu",
    threads: int = 1,
    pin_cores: bool = False,
    allocator: str | None = None,
) -> list[Any]:
    """Call ``function(*arguments)`` on ``world_size`` new processes joined in one process group.

    Args:
        function: a module-level function (it is pickled by name), called after the process group exists.
        arguments: its arguments (picklable).
        world_size: the number of processes.
        deadline: seconds after which the children still running are ended and LaunchError is raised.
        group_timeout: the process group's timeout in seconds (a collective waiting longer fails).
        device: ``cpu`` (gloo) or ``cuda`` (NCCL; rank ``r`` on GPU ``r % device_count``).
        threads: intra-op CPU threads per process (1 keeps ranks from competing for cores).
        pin_cores: run rank ``r`` on one CPU core only, the ``r``-th of :func:`usable_cores` (round robin
            when there are fewer cores than ranks: ranks then share cores), with all its threads (with
            ``threads`` > 1 they share that core too): the process group's message threads then wait for
            their own rank's core instead of taking another rank's (Linux only; for CPU ranks: it does not
            know which cores sit next to which GPU).
            On a 2-core machine with 2 gloo ranks (``bench/plan.py``, GPT-2 stages): steadier steps
            (step-to-step variation 16% -> 14%) and the planner's worst error over ten schedules 0.09 to
            0.18 in five runs, against 0.20 to 0.25 in four unpinned ones. With more ranks than cores the
            ranks share cores either way (pinned in pairs measured no steadier).
        allocator: ``"tuned"``: each process tunes glibc's malloc before anything else (no ``mmap``, no
            trimming: :func:`graphkit.measure.allocator.tune_allocator`; it also starts with
            ``MALLOC_*_`` variables that say so); ``"default"``: left as the process starts with it; None:
            ``GRAPHKIT_ALLOCATOR``, else ``"tuned"``. A preloaded jemalloc or TCMalloc is left as it is.

    Returns:
        Each rank's return value, by rank.

    Raises:
        LaunchError: a rank raised (the message holds its traceback; ``rank`` says which), exited without a
            result, or the deadline passed; ``pin_cores`` where the platform cannot pin a process to a core
            (before any rank starts) or a rank could not be pinned; ``cuda`` without a CUDA device.
        graphkit.measure.allocator.AllocatorError: an unknown ``allocator`` or ``GRAPHKIT_ALLOCATOR``
            (before any rank starts).
    """
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise LaunchError(
            f"device {device} was asked for, but this machine has no CUDA device torch can use; run on "
            "the CPU (gloo) or on a machine with GPUs"
        )
    cores = usable_cores() if pin_cores else None
    choice = allocator_choice(allocator)  # an unknown choice: refused before any rank starts
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    children = [
        context.Process(
            target=_child,
            args=(rank, world_size, port, group_timeout, str(device), threads, function, arguments, results),
            kwargs={"core": None if cores is None else cores[rank % len(cores)], "allocator": choice},
            daemon=True,
        )
        for rank in range(world_size)
    ]
    with environment_for_processes(choice):  # what glibc reads as each child starts
        for child in children:
            child.start()
    collected: dict[int, Any] = {}
    failures: list[tuple[int, str]] = []
    stopped = False  # by a failure, the deadline or the parent's own exception: end the children at once
    end = time.monotonic() + deadline
    try:
        while len(collected) + len(failures) < world_size:
            remaining = end - time.monotonic()
            if remaining <= 0:
                first = f"; first failure: rank {failures[0][0]}: {failures[0][1]}" if failures else ""
                raise LaunchError(
                    f"{world_size - len(collected)} of {world_size} processes did not finish within "
                    f"{deadline:g} s; they were ended{first}",
                    timed_out=True,
                )
            try:
                rank, status, value = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [
                    rank
                    for rank, child in enumerate(children)
                    if not child.is_alive() and child.exitcode not in (0, None) and rank not in collected
                ]
                if dead:
                    first = f"; first failure: rank {failures[0][0]}: {failures[0][1]}" if failures else ""
                    raise LaunchError(
                        f"process {dead[0]} exited with status {children[dead[0]].exitcode} without a result"
                        + first,
                        rank=dead[0],
                    ) from None
                continue
            if status == "ok":
                collected[rank] = value
            else:
                failures.append((rank, value))
                break  # its peers would wait for it until the process group's timeout: end them now
        if failures:
            rank, text = failures[0]
            raise LaunchError(f"rank {rank}: {text}", rank=rank, detail=text)
        return [collected[rank] for rank in range(world_size)]
    except BaseException:  # also Ctrl-C in the parent: end the children at once, not after 5 s each
        stopped = True
        raise
    finally:
        for child in children:
            child.join(timeout=0.5 if stopped else max(0.0, min(5.0, end - time.monotonic())))
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join(timeout=2)
            if child.is_alive():
                child.kill()
                child.join(timeout=2)
        with contextlib.suppress(Exception):
            results.close()
