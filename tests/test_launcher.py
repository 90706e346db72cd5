"""The process launcher: ranks pinned to cores on request, and a clear refusal where pinning is impossible."""

from __future__ import annotations

import os

import pytest

from graphkit.cli import main as cli_main
from graphkit.pipelining import planner, recording
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


def test_pinning_where_the_platform_cannot_is_refused_before_any_rank_starts(monkeypatch) -> None:
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    with pytest.raises(LaunchError, match="pin_cores needs os.sched_setaffinity.*run without pinning"):
        run_on_processes(cores_of_this_process, (), world_size=2, deadline=5, pin_cores=True)
    with pytest.raises(recording.TimelineError, match="pin_cores needs os.sched_setaffinity"):
        recording.record_schedules("zoo-pipeline:mlp", ["1F1B"], microbatches=2, ranks=2, pin_cores=True)


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
