"""Wall-clock time of one call on a device: the benchmarks' and the stage costs' one timer.

CUDA kernels run asynchronously, so the device is synchronized before the clock starts and before it
stops; on the CPU the call is simply timed with :func:`time.perf_counter`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["synchronize", "timed"]


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(
    function: Callable[[], Any], device: torch.device, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, Any]:
    """``(seconds, result)`` of ``function()``, with ``device`` synchronized around the call.

    ``clock``: :func:`time.perf_counter` (wall time), or :func:`time.thread_time` - the calling thread's
    CPU time, which leaves out the time other processes hold the core: steadier on a loaded machine,
    and right for a CPU stage with one intra-op thread (the autograd engine then runs on the caller's
    thread); never for CUDA, whose kernels it would not see."""
    synchronize(device)
    start = clock()
    result = function()
    synchronize(device)
    return clock() - start, result
