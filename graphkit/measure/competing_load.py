"""How much CPU other processes took while graphkit recorded: the load that pinned ranks had to share.

A load average says how many processes wanted the CPU, ranks included, averaged over a minute. A
recording on ranks pinned one core each is hurt by whatever *else* ran on those cores meanwhile: a rank
that waits for a message is woken late when another process holds its core, so a schedule whose messages
lie on its critical path (1F1B) slows down more than one that streams them (GPipe), and every copy of a
schedule recorded in the same rounds (the A/A control) slows alike. The control cannot see it; the pick
then holds in that run and not on a quiet machine. (Seen on a 2-core machine: GPipe measured 0.72x 1F1B
in 11 of 11 rounds while a test suite ran beside the ranks, and 1.01x to 1.07x in two quiet runs after.)

:func:`watching_other_processes` measures it: the machine's busy CPU time (``/proc/stat``, Linux) less the
CPU time of this process and of its children (the spawned ranks, once joined: ``os.times``), over the
wall time, in cores. Elsewhere it reads None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NOTICEABLE_CORES", "OtherProcesses", "other_processes_warning", "watching_other_processes"]

NOTICEABLE_CORES = 0.2
"""Other processes' average use, in cores, above which a recording is said to have shared its cores: a
fifth of a core taken from a pinned rank already moves message-bound steps by several percent."""

_STAT = Path("/proc/stat")
# user, nice, system, idle, iowait, irq, softirq, steal: busy is all but idle and iowait
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(slots=True)
class OtherProcesses:
    """What :func:`watching_other_processes` measured.

    Attributes:
        cores: other processes' average CPU use while watched, in cores (1.0: one core kept busy the whole
            time); None where it cannot be read (not Linux).
        seconds: the wall time watched, in seconds.
    """

    cores: float | None = None
    seconds: float = 0.0

    def describe(self) -> str:
        """``other processes used 0.05 cores while recording``, or "" where unknown."""
        if self.cores is None:
            return ""
        return f"other processes used {max(self.cores, 0.0):.2f} cores while recording"


def _machine_busy_seconds() -> float | None:
    try:
        fields = _STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    values = [int(value) for value in fields[1:]]
    return sum(values[index] for index in _BUSY_FIELDS if index < len(values)) / ticks


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@contextmanager
def watching_other_processes() -> Iterator[OtherProcesses]:
    """Measure, around the ``with`` block, the CPU other processes used (see the module's text).

    The block must wait for the processes it starts (as :func:`graphkit.pipelining.launcher.run_on_processes`
    does): a child still running at the end is counted as another process. The result is filled in when
    the block ends, also on an exception."""
    result = OtherProcesses()
    busy_before, own_before, started = _machine_busy_seconds(), _own_seconds(), time.monotonic()
    try:
        yield result
    finally:
        busy_after = _machine_busy_seconds()
        result.seconds = time.monotonic() - started
        if busy_before is not None and busy_after is not None and result.seconds > 0:
            others = (busy_after - busy_before) - (_own_seconds() - own_before)
            result.cores = others / result.seconds


def other_processes_warning(watched: OtherProcesses) -> str:
    """A warning when other processes used more than :data:`NOTICEABLE_CORES` while recording; "" else."""
    if watched.cores is None or watched.cores <= NOTICEABLE_CORES:
        return ""
    return (
        f"{watched.describe()} (of {os.cpu_count()} CPUs): the ranks shared their cores with them, which "
        "slows schedules whose messages lie on their critical path (1F1B) more than others and every copy "
        "of a schedule alike, so the A/A control cannot show it; what this run measured may not hold on a "
        "quiet machine: record again with nothing else running"
    )
