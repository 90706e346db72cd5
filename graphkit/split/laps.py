"""Where B's and W's time goes, piece by piece: wall-clock laps, off unless asked for.

:func:`timing_laps` turns them on for the calling thread (or task): within, :func:`backward_input` and
:func:`backward_weight` add the time of each of their pieces (the walk, the plan lookup, the hooks, the
engine call, the formulas, ...) to :attr:`Laps.totals`, keyed ``"b.<piece>"`` and ``"w.<piece>"``. Off,
they mark each piece boundary on :data:`NO_LAPS`, a call that does nothing. ``bench/split_profile.py --breakdown`` prints them per
microbatch against a full backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from time import perf_counter

__all__ = ["NO_LAPS", "Laps", "current_laps", "started_laps", "timing_laps"]


class Laps:
    """Seconds per piece, summed over every B and W run while on; each mark closes the piece before it."""

    __slots__ = ("_clock", "_last", "totals")

    def __init__(self, clock: Callable[[], float] = perf_counter) -> None:
        self.totals: dict[str, float] = {}
        self._clock = clock
        self._last = clock()

    def start(self) -> None:
        """Open a new piece now (at the top of B or W)."""
        self._last = self._clock()

    def __call__(self, piece: str) -> None:
        """Add the time since the last mark to ``piece``."""
        now = self._clock()
        self.totals[piece] = self.totals.get(piece, 0.0) + (now - self._last)
        self._last = now


class _NoLaps:
    """Stands in for :class:`Laps` while nothing is recorded: marks and starts do nothing."""

    __slots__ = ()

    def start(self) -> None:
        pass

    def __call__(self, piece: str) -> None:
        pass


NO_LAPS = _NoLaps()
"""The laps B and W mark when :func:`timing_laps` is off."""

_laps: ContextVar[Laps | None] = ContextVar("graphkit_split_laps", default=None)


def current_laps() -> Laps | None:
    """The laps being recorded in this thread (or task), or None (the usual case)."""
    return _laps.get()


def started_laps() -> Laps | _NoLaps:
    """The laps of this thread (or task), a new piece opened now; :data:`NO_LAPS` when none are recorded.

    B and W call it once at their top and then mark each piece with one call, recording or not."""
    laps = _laps.get()
    if laps is None:
        return NO_LAPS
    laps.start()
    return laps


@contextmanager
def timing_laps(clock: Callable[[], float] = perf_counter) -> Iterator[Laps]:
    """Record the pieces of every B and W run in this thread (or task) within; yields the :class:`Laps`.

    ``clock``: :func:`time.perf_counter`, or :func:`time.thread_time` (see :func:`graphkit.measure.timing.timed`)."""
    laps = Laps(clock)
    token = _laps.set(laps)
    try:
        yield laps
    finally:
        _laps.reset(token)
