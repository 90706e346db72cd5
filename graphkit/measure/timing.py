"""Wall-clock time of one call on a device: the benchmarks' and the stage costs' one timer; and the
machine's load, which every measured figure is read against.

CUDA kernels run asynchronously, so the device is synchronized before the clock starts and before it
stops; on the CPU the call is simply timed with :func:`time.perf_counter`. :func:`load_average` says the
load a figure was taken at, :func:`busy_machine_warning` what to expect of figures taken on a machine busier
than its cores.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphkit.measure.competing_load import NOTICEABLE_CORES, watching_other_processes

__all__ = [
    "LOAD_SAMPLE_SECONDS",
    "busy_machine_warning",
    "fewest_wins_beyond_chance",
    "load_average",
    "rounds_to_decide",
    "sign_test_p_value",
    "synchronize",
    "t_test_p_value",
    "timed",
]


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


def load_average() -> str:
    """The 1, 5 and 15 minute load averages and the CPU count, as one line ("" where unknown)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return ""
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


LOAD_SAMPLE_SECONDS = 0.5
"""How long :func:`busy_machine_warning` watches the CPU before it believes a load average above the cores,
in seconds."""


def busy_machine_warning(sample_seconds: float = LOAD_SAMPLE_SECONDS) -> str:
    """A warning when other processes compete for the machine's cores now, with the error to expect; empty
    when the machine is not that busy or the load cannot be read.

    Two readings must agree: the 1-minute load average is above the cores, and other processes
    (:func:`~graphkit.measure.competing_load.watching_other_processes`, over ``sample_seconds`` of sleep)
    use more than :data:`~graphkit.measure.competing_load.NOTICEABLE_CORES` now. The load average alone
    lags by a minute: a plan started right after another run ended read 2.04 on 2 cores while nothing else
    ran (its recording then measured 0.01 cores of other processes). Where ``/proc/stat`` cannot be read
    (not Linux) the load average decides alone.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cores = os.cpu_count() or 1
    if load <= cores:
        return ""
    with watching_other_processes() as others:
        time.sleep(sample_seconds)
    if others.cores is not None and others.cores <= NOTICEABLE_CORES:
        return ""  # the tail of processes that have ended
    now = f", other processes use {others.cores:.2f} cores now" if others.cores is not None else ""
    return (
        f"the load average is {load:.1f} on {cores} cores{now}: other processes compete for the CPU, so "
        f"measured costs and steps may be off by up to about {(load - cores) / load:.0%} (the share of demand "
        "beyond the cores) and rankings closer than that are not to be trusted; measure on a quiet machine"
    )


def sign_test_p_value(wins: int, rounds: int) -> float:
    """One-sided sign test: the chance of ``wins`` or more wins in ``rounds`` paired rounds were both sides
    equally fast (each round a fair coin), ``sum(C(rounds, k) for k >= wins) / 2**rounds``; 1.0 for no rounds.

    A schedule that won 17 of 31 interleaved rounds against 1F1B scores 0.36 (chance would do it one time in
    three); 21 of 31 scores 0.035. Ties count as losses. The exact binomial tail (as
    ``scipy.stats.binomtest(wins, rounds, alternative="greater")``), with :func:`math.comb`.

    Raises:
        ValueError: ``wins`` outside ``0..rounds``.
    """
    if not 0 <= wins <= rounds:
        raise ValueError(f"wins must be between 0 and rounds ({rounds}), got {wins}")
    if rounds == 0:
        return 1.0
    return sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2**rounds


def t_test_p_value(values: Sequence[float], bound: float = 0.0) -> float:
    """One-sided one-sample t-test: the chance that ``values`` would lie this far below ``bound`` on average
    were their mean ``bound`` (independent draws, about normal): Student's t with ``len(values) - 1``
    degrees of freedom at ``(mean - bound) / (stdev / sqrt(n))``. 1.0 with fewer than two values; with no
    spread, 0.0 below ``bound`` and 1.0 at or above it.

    graphkit tests the median round ratios of several sets of processes with it (logarithms, against 0):
    each set is one draw of what its processes happen to get, so the sets, not the rounds, are the
    independent replicates. Six sets at 0.912x, 0.958x, 0.931x, 0.940x, 1.006x and 0.953x score 0.0063.
    The t distribution's integral for whole degrees of freedom in closed form: Abramowitz and Stegun (1964),
    Handbook of Mathematical Functions, 26.7.3 (odd) and 26.7.4 (even); as
    ``scipy.stats.ttest_1samp(values, bound, alternative="less").pvalue``.
    """
    count = len(values)
    if count < 2:
        return 1.0
    mean = statistics.fmean(values)
    spread = statistics.stdev(values)
    if spread == 0.0:
        return 0.0 if mean < bound else 1.0
    t = (mean - bound) / (spread / math.sqrt(count))
    inside = _student_t_inside(abs(t), count - 1)  # P(|T| < |t|)
    return (1.0 - inside) / 2.0 if t < 0 else (1.0 + inside) / 2.0


def _student_t_inside(t: float, freedom: int) -> float:
    """P(|T| < t) for Student's t with ``freedom`` (whole, at least 1) degrees of freedom, ``t >= 0``
    (Abramowitz and Stegun 26.7.3 and 26.7.4, with theta = atan(t / sqrt(freedom)))."""
    theta = math.atan(t / math.sqrt(freedom))
    sine, cosine = math.sin(theta), math.cos(theta)
    squared = cosine * cosine
    if freedom % 2 == 1:
        total, term = 0.0, cosine
        for index in range((freedom - 1) // 2):  # cos, (2/3) cos^3, (2 4)/(3 5) cos^5, ... cos^(freedom-2)
            if index:
                term *= squared * (2 * index) / (2 * index + 1)
            total += term
        return 2.0 / math.pi * (theta + sine * total) if freedom > 1 else 2.0 * theta / math.pi
    total, term = 0.0, 1.0
    for index in range(freedom // 2):  # 1, (1/2) cos^2, (1 3)/(2 4) cos^4, ... cos^(freedom-2)
        if index:
            term *= squared * (2 * index - 1) / (2 * index)
        total += term
    return sine * total


def fewest_wins_beyond_chance(rounds: int, significance: float) -> int | None:
    """The fewest wins of ``rounds`` whose :func:`sign_test_p_value` is below ``significance``; None when
    even winning every round is not (too few rounds: 4 of 4 scores 0.0625)."""
    return next((wins for wins in range(rounds + 1) if sign_test_p_value(wins, rounds) < significance), None)


def rounds_to_decide(win_fraction: float, significance: float, most: int = 5_000) -> int | None:
    """About how many paired rounds a one-sided sign test needs to tell a side that wins ``win_fraction``
    of the rounds (the effect measured: 9 of 15 is 0.6) from chance below ``significance``: the fewest
    rounds ``n`` whose expected wins, ``floor(win_fraction * n)``, pass :func:`sign_test_p_value` (found by
    doubling ``n``, then trying each ``n`` up to 512 rounds, beyond by bisection: the tail decreases in
    ``n`` at a fixed fraction but for the floor's steps, so there the answer can be a round or two off). None when ``win_fraction`` is 0.5 or less (no number of
    rounds decides a coin) or more than ``most`` rounds would be needed.

    At 0.05, a side that wins 0.6 of the rounds needs about 80 of them (48 wins of 80 score 0.047), one
    that wins 0.9 needs 8 (7 of 8 score 0.035); at 0.05 / 3, one that won 9 of 15 needs 125.

    Raises:
        ValueError: ``win_fraction`` outside 0..1 or ``significance`` outside (0, 1).
    """
    if not 0.0 <= win_fraction <= 1.0:
        raise ValueError(f"win_fraction must be between 0 and 1, got {win_fraction}")
    if not 0.0 < significance < 1.0:
        raise ValueError(f"significance must be between 0 and 1 (exclusive), got {significance}")
    if win_fraction <= 0.5:
        return None

    def decides(rounds: int) -> bool:
        return sign_test_p_value(math.floor(win_fraction * rounds + 1e-9), rounds) < significance

    low, high = 0, 4  # decides(low) does not hold (0 rounds score 1.0); double high until it does
    while not decides(high):
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    if high <= 512:  # few enough to try each: the floor's steps make the tail not quite monotone
        return next(rounds for rounds in range(1, high + 1) if decides(rounds))
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if decides(middle) else (middle, high)
    return high
