"""The process launcher: ranks pinned to cores on request, and a clear refusal where pinning is impossible."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from graphkit.cli import main as cli_main
from graphkit.pipelining import launcher, planner, recording
from graphkit.pipelining.launcher import LaunchError, run_on_processes

LINUX_AFFINITY = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="pinning to a core needs os.sched_setaffinity (Linux)"
)


def cores_of_this_process() -> list[int]:
    """What a spawned rank reports: the cores it may run on."""
    return sorted(os.sched_getaffinity(0))


@LINUX_AFFINITY
def test_pinned_ranks_each_run_on_their_own_core_dealt_round_robin() -> None:
    cores = sorted(os.sched_getaffinity(0))
    per_rank = run_on_processes(cores_of_this_process, (), world_size=3, deadline=120, pin_cores=True)
    assert per_rank == [[cores[rank % len(cores)]] for rank in range(3)]


@LINUX_AFFINITY
def test_unpinned_ranks_keep_every_core_of_their_parent() -> None:
    cores = sorted(os.sched_getaffinity(0))
    assert run_on_processes(cores_of_this_process, (), world_size=2, deadline=120) == [cores, cores]


@LINUX_AFFINITY
def test_a_rank_that_cannot_be_pinned_fails_with_the_core_it_was_given(monkeypatch) -> None:
    monkeypatch.setattr(launcher, "usable_cores", lambda: [99999])  # a core this machine does not have
    with pytest.raises(LaunchError, match="rank 0 could not be pinned to CPU core 99999") as caught:
        run_on_processes(cores_of_this_process, (), world_size=1, deadline=60, pin_cores=True)
    assert caught.value.rank == 0 and not caught.value.timed_out


def test_pinning_where_the_platform_cannot_is_refused_before_any_rank_starts(monkeypatch) -> None:
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    refusal = "needs os.sched_setaffinity.*leave out --pin-cores"
    with pytest.raises(LaunchError, match=refusal):
        run_on_processes(cores_of_this_process, (), world_size=2, deadline=5, pin_cores=True)
    with pytest.raises(recording.TimelineError, match=refusal):
        recording.record_schedules("zoo-pipeline:mlp", ["1F1B"], microbatches=2, ranks=2, pin_cores=True)
    # refused before measuring any cost
    monkeypatch.setattr(planner, "spec_costs", lambda *_a, **_k: pytest.fail("costs measured first"))
    with pytest.raises(ValueError, match=refusal):
        planner.plan_schedules("zoo-pipeline:mlp", ranks=2, microbatches=2, run=True, pin_cores=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_ranks_without_a_cuda_device_are_refused_before_any_rank_starts() -> None:
    with pytest.raises(LaunchError, match="no CUDA device"):
        run_on_processes(cores_of_this_process, (), world_size=2, deadline=5, device="cuda")
    with pytest.raises(recording.TimelineError, match="no CUDA device"):
        recording.record_schedules("zoo-pipeline:mlp", ["1F1B"], microbatches=2, ranks=2, device="cuda")


def test_pin_cores_flag_reaches_the_recording(monkeypatch, tmp_path) -> None:
    """``graphkit compare-schedules --pin-cores`` and ``graphkit plan --run --pin-cores`` pin the ranks."""
    seen: dict[str, bool] = {}

    def fake_record(*_args, pin_cores=False, **_kwargs):
        seen["record"] = pin_cores
        raise recording.TimelineError("stop here")

    def fake_plan(*_args, pin_cores=False, **_kwargs):
        seen["plan"] = pin_cores
        raise recording.TimelineError("stop here")

    monkeypatch.setattr(recording, "record_schedules", fake_record)
    monkeypatch.setattr(planner, "plan_schedules", fake_plan)
    arguments = ["zoo-pipeline:mlp", "--ranks", "2", "--microbatches", "2", "--pin-cores"]
    assert cli_main(["compare-schedules", *arguments]) == 2
    assert cli_main(["plan", *arguments, "--run", "-o", str(tmp_path)]) == 2
    assert seen == {"record": True, "plan": True}


def sleep_writing_pid(path: str) -> None:
    """A rank that says who it is, then waits far longer than any test."""
    import time

    with open(path, "w") as file:
        file.write(str(os.getpid()))
    time.sleep(600)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads a rank's state from /proc (Linux)")
def test_a_rank_ends_when_the_process_that_started_it_is_killed(tmp_path) -> None:
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "rank.pid"
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from test_launcher import sleep_writing_pid\n"
            "from graphkit.pipelining.launcher import run_on_processes\n"
            f"run_on_processes(sleep_writing_pid, ({str(pid_file)!r},), world_size=1, deadline=120)",
        ]
    )
    try:
        deadline = time.monotonic() + 90
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        rank = int(pid_file.read_text())
        assert _running(rank)
        starter.send_signal(signal.SIGKILL)  # the launcher gets no chance to end its rank
        starter.wait()
        deadline = time.monotonic() + 3 * launcher.PARENT_CHECK_SECONDS + 10
        while _running(rank) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(rank)
    finally:
        starter.kill()
        starter.wait()
        if pid_file.exists() and pid_file.read_text() and _running(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # only the rank this test started
