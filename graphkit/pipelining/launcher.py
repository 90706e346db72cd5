"""Run one function on R local processes that form a gloo process group, with a deadline.

:func:`run_on_processes` starts R processes (``multiprocessing`` "spawn"), each of which joins a gloo process
group over ``127.0.0.1`` on a free port, with a short process-group timeout, calls the function, and sends its
result back. The parent waits until every result is in or the deadline passes; then it ends the children it
started (and only those), so a hung collective never outlives the call.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["LaunchError", "free_port", "run_on_processes"]


class LaunchError(RuntimeError):
    """A process failed, or the processes did not finish before the deadline."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _child(
    rank: int,
    world_size: int,
    port: int,
    group_timeout: float,
    function: Callable[..., Any],
    arguments: tuple[Any, ...],
    results: Any,
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=group_timeout),
        )
        try:
            outcome = ("ok", function(*arguments))
        finally:
            dist.destroy_process_group()
    except BaseException as error:  # reported to the parent, which raises
        outcome = ("error", f"rank {rank}: {type(error).__name__}: {error}\n{traceback.format_exc()}")
    results.put((rank, *outcome))


def run_on_processes(
    function: Callable[..., Any],
    arguments: tuple[Any, ...],
    *,
    world_size: int,
    deadline: float = 120.0,
    group_timeout: float = 30.0,
) -> list[Any]:
    """Call ``function(*arguments)`` on ``world_size`` new processes joined in one gloo process group.

    Args:
        function: a module-level function (it is pickled by name), called after the process group exists.
        arguments: its arguments (picklable).
        world_size: the number of processes.
        deadline: seconds after which the children still running are ended and LaunchError is raised.
        group_timeout: the process group's timeout in seconds (a collective waiting longer fails).

    Returns:
        Each rank's return value, by rank.

    Raises:
        LaunchError: a rank raised (the message holds its traceback), exited without a result, or the
            deadline passed.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    children = [
        context.Process(
            target=_child,
            args=(rank, world_size, port, group_timeout, function, arguments, results),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for child in children:
        child.start()
    collected: dict[int, Any] = {}
    failures: list[str] = []
    end = time.monotonic() + deadline
    try:
        while len(collected) + len(failures) < world_size:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise LaunchError(
                    f"{world_size - len(collected)} of {world_size} processes did not finish within "
                    f"{deadline:g} s; they were ended"
                    + (f"; first failure: {failures[0]}" if failures else "")
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
                    raise LaunchError(
                        f"process {dead[0]} exited with status {children[dead[0]].exitcode} without a result"
                        + (f"; first failure: {failures[0]}" if failures else "")
                    ) from None
                continue
            if status == "ok":
                collected[rank] = value
            else:
                failures.append(value)
        if failures:
            raise LaunchError(failures[0])
        return [collected[rank] for rank in range(world_size)]
    finally:
        for child in children:
            child.join(timeout=max(0.0, min(5.0, end - time.monotonic())))
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join(timeout=2)
            if child.is_alive():
                child.kill()
                child.join(timeout=2)
        with contextlib.suppress(Exception):
            results.close()
