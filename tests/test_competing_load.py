"""Other processes' CPU use while graphkit records (graphkit.measure.competing_load), and what the plan says
of it: a busy process beside the block is counted, the block's own children are not."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from graphkit.measure import competing_load
from graphkit.measure.competing_load import (
    NOTICEABLE_CORES,
    OtherProcesses,
    other_processes_warning,
    watching_other_processes,
)

BUSY = [sys.executable, "-c", "import time\nwhile time.process_time() < {seconds}: pass"]  # CPU seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat (Linux)")


def busy(seconds: float) -> list[str]:
    return [*BUSY[:2], BUSY[2].format(seconds=seconds)]


def test_a_busy_process_beside_the_block_is_counted_and_the_blocks_own_children_are_not():
    beside = subprocess.Popen(busy(30))
    try:
        time.sleep(0.3)  # started
        with watching_other_processes() as watched:
            time.sleep(1.5)
    finally:
        beside.kill()
        beside.wait()
    assert watched.seconds == pytest.approx(1.5, abs=0.5)
    assert watched.cores > 0.5  # most of one core: the loop never sleeps
    # a child waited for inside the block (as the ranks are) is this process's own: its second of CPU is
    # taken off the machine's busy time (on a quiet machine, own.cores is about 0; the difference is
    # checked, so that a machine busy with something else does not fail it)
    before = competing_load._own_seconds()
    with watching_other_processes() as own:
        subprocess.run(busy(1.0), check=True)
    assert competing_load._own_seconds() - before > 0.95
    assert own.describe().startswith("other processes used ") and own.describe().endswith(
        " cores while recording"
    )


def test_the_warning_names_the_cores_taken_and_what_it_does_to_the_figures():
    assert other_processes_warning(OtherProcesses(None, 10.0)) == ""
    assert other_processes_warning(OtherProcesses(NOTICEABLE_CORES, 10.0)) == ""
    warning = other_processes_warning(OtherProcesses(0.93, 10.0))
    assert warning.startswith("other processes used 0.93 cores while recording (of ")
    assert "so the A/A control cannot show it" in warning
    assert warning.endswith("record again with nothing else running")


def test_unknown_where_the_machine_counts_cannot_be_read(monkeypatch, tmp_path):
    monkeypatch.setattr(competing_load, "_STAT", tmp_path / "missing")
    with watching_other_processes() as watched:
        pass
    assert watched.cores is None and watched.describe() == ""
