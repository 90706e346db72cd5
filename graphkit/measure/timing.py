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


def timed(function: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """``(seconds, result)`` of ``function()``, with ``device`` synchronized around the call."""
    synchronize(device)
    start = time.perf_counter()
    result = function()
    synchronize(device)
    return time.perf_counter() - start, result
