"""The allocator graphkit's processes run under: tuned glibc malloc reuses freed memory (read back from the
page faults a process takes), the opt-out leaves glibc's defaults, an unknown choice is refused, the ranks
the launcher starts and the commands say which one ran."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import graphkit.measure.allocator as allocator_module
from graphkit.cli import main
from graphkit.measure.allocator import (
    ALLOCATOR_VARIABLE,
    TUNED_ENVIRONMENT,
    Allocator,
    AllocatorError,
    allocator_choice,
    current_allocator,
    environment_for_processes,
    tune_allocator,
    untuned_allocator_warning,
)
from graphkit.pipelining.launcher import run_on_processes

GLIBC = pytest.mark.skipif(
    current_allocator().name != "glibc", reason="tunes glibc's malloc; this process's malloc is another one"
)
MEGABYTES = 64  # above glibc's largest dynamic mmap threshold (32 MiB): served from fresh pages by default
ROUNDS = 8
# Tuned, the heap grows by the 1 GiB top pad at once and its pages fault when first touched. The first 64 MiB
# tensors can walk up through them before the blocks freed behind them coalesce into one that fits the next
# (seen: up to 13 of the 16 that fill the pad, in a rank); the warm-up outlasts them.
WARMUP = 20
TUNED = Allocator("glibc", ("no mmap", "no trim"), "graphkit", fresh_pages=False)


def fresh_page_faults(rounds: int = ROUNDS, warmup: int = WARMUP) -> int:
    """The median minor page faults this process takes for one tensor of 64 MiB, made, written and freed,
    over ``rounds`` such tensors after ``warmup``: about one per page when each comes from fresh pages, none
    when the memory freed before is reused (the median: a heap that grows once does not count)."""
    elements = MEGABYTES * 2**20 // 4
    for _ in range(warmup):
        torch.ones(elements)
    faults = []
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(elements)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return int(statistics.median(faults))


def allocator_and_faults() -> tuple[str, int]:
    """What a spawned rank reports: the allocator it runs under and its fresh-page faults."""
    return str(current_allocator()), fresh_page_faults()


def fresh_process(code: str, **environment: str) -> dict:
    """Run ``code`` (which prints one JSON line last) in a fresh Python that imports this folder's modules,
    without GRAPHKIT_ALLOCATOR or MALLOC_* variables unless given."""
    clean = {
        key: value
        for key, value in os.environ.items()
        if key != ALLOCATOR_VARIABLE and not key.startswith("MALLOC_") and key != "GLIBC_TUNABLES"
    }
    clean.update(environment)
    clean["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    completed = subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.splitlines()[-1])


# --- the tuning, read back from page faults -------------------------------------------------------------------
@GLIBC
def test_tuning_in_place_stops_fresh_tensors_from_page_faulting_and_the_opt_out_does_not():
    measured = fresh_process(
        "import json, os\n"
        "from test_allocator import fresh_page_faults\n"
        "from graphkit.measure.allocator import tune_allocator, TUNED_ENVIRONMENT\n"
        "left = tune_allocator('default')\n"
        "untouched = {key: os.environ.get(key) for key in TUNED_ENVIRONMENT}\n"
        "untuned = fresh_page_faults()\n"
        "tuned_allocator = tune_allocator()\n"
        "fresh_page_faults()  # the blocks held on mmap'ed pages before are freed, the heap grows once\n"
        "print(json.dumps({'left': str(left), 'untouched': untouched, 'untuned': untuned,\n"
        "    'tuned': fresh_page_faults(), 'allocator': str(tuned_allocator), 'again': str(tune_allocator()),\n"
        "    'environment': {key: os.environ.get(key) for key in TUNED_ENVIRONMENT}}))\n"
    )
    # glibc's defaults: every 64 MiB tensor on fresh pages, at least 16 faults even with 2 MiB huge pages
    assert measured["untuned"] >= 16, measured
    assert measured["left"] == (
        "glibc malloc, default: large tensors on fresh mmap'ed pages that page-fault on first touch "
        "(allocator='default')"
    )
    assert measured["untouched"] == dict.fromkeys(TUNED_ENVIRONMENT)
    # tuned: the freed memory is reused
    assert measured["tuned"] <= 1, measured
    assert measured["allocator"] == measured["again"] == "glibc malloc, tuned: no mmap, no trim"
    assert measured["environment"] == TUNED_ENVIRONMENT  # what the processes it starts inherit


@GLIBC
def test_a_process_started_with_the_tuned_variables_reuses_freed_memory_and_says_so():
    measured = fresh_process(
        "import json\n"
        "from test_allocator import fresh_page_faults\n"
        "from graphkit.measure.allocator import current_allocator\n"
        "print(json.dumps({'allocator': str(current_allocator()), 'faults': fresh_page_faults()}))\n",
        **TUNED_ENVIRONMENT,
    )
    assert measured["faults"] <= 1, measured
    assert measured["allocator"] == (
        "glibc malloc, tuned by MALLOC_* variables: mmap above 16 GiB, trim above 16 GiB"
    )


@GLIBC
def test_a_rank_started_by_the_launcher_runs_tuned_unless_told_default():
    (tuned,) = run_on_processes(allocator_and_faults, (), world_size=1, deadline=120, allocator="tuned")
    (default,) = run_on_processes(allocator_and_faults, (), world_size=1, deadline=120, allocator="default")
    assert tuned[0] == "glibc malloc, tuned: no mmap, no trim" and tuned[1] <= 1, tuned
    assert default[0].startswith("glibc malloc, default:") and default[1] >= 16, default


# --- what it reads, and the choice ------------------------------------------------------------------------------
@GLIBC
@pytest.mark.parametrize(
    ("environment", "said", "fresh"),
    [
        (
            {},
            "glibc malloc, default: large tensors on fresh mmap'ed pages that page-fault on first touch",
            True,
        ),
        (
            {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "0x40000000"},
            "glibc malloc, tuned by MALLOC_* variables: no mmap, trim above 1 GiB",
            False,
        ),
        (
            {
                "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=2147483648:glibc.malloc.trim_threshold=4294967296"
            },
            "glibc malloc, tuned by MALLOC_* variables: mmap above 2 GiB, trim above 4 GiB",
            False,
        ),
        (  # no mmap but trimmed: freed memory still goes back, and comes back as fresh pages
            {"MALLOC_MMAP_MAX_": "0"},
            "glibc malloc, default: large tensors on fresh mmap'ed pages that page-fault on first touch "
            "(set: no mmap)",
            True,
        ),
        (  # GLIBC_TUNABLES wins over MALLOC_*, as in glibc
            {
                "MALLOC_MMAP_MAX_": "0",
                "MALLOC_TRIM_THRESHOLD_": "17179869184",
                "GLIBC_TUNABLES": "glibc.malloc.mmap_max=65536",
            },
            "glibc malloc, default: large tensors on fresh mmap'ed pages that page-fault on first touch "
            "(set: trim above 16 GiB)",
            True,
        ),
    ],
)
def test_glibc_settings_read_from_the_environment_the_process_started_with(
    monkeypatch, environment, said, fresh
):
    monkeypatch.setattr(allocator_module, "_startup_environment", lambda: environment)
    monkeypatch.setattr(allocator_module, "_RECORD", allocator_module._Record())
    allocator = current_allocator()
    assert str(allocator) == said
    assert allocator.fresh_pages is fresh and allocator.glibc_default is fresh
    assert (untuned_allocator_warning() is None) is not fresh


def test_a_preloaded_allocator_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(allocator_module, "_library_serving_malloc", lambda: "/usr/lib/libjemalloc.so.2")
    called = []
    monkeypatch.setattr(allocator_module.ctypes, "CDLL", lambda *_: called.append(1))
    assert str(tune_allocator("tuned")) == "jemalloc (preloaded), left as it is"
    assert called == [] and untuned_allocator_warning() is None


JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")  # Debian's libjemalloc2


@pytest.mark.skipif(
    not JEMALLOC.is_file(), reason="needs Debian's libjemalloc2 (apt-get install libjemalloc2)"
)
def test_a_really_preloaded_jemalloc_is_found_and_left_as_it_is():
    measured = fresh_process(
        "import json, os\n"
        "from graphkit.measure.allocator import tune_allocator, TUNED_ENVIRONMENT\n"
        "said = str(tune_allocator('tuned'))\n"
        "print(json.dumps({'said': said, 'set': [key for key in TUNED_ENVIRONMENT if key in os.environ]}))\n",
        LD_PRELOAD=str(JEMALLOC),
    )
    assert measured == {"said": "jemalloc (preloaded), left as it is", "set": []}


@pytest.mark.parametrize(("value", "choice"), [(None, "tuned"), ("", "tuned"), (" Default ", "default")])
def test_the_choice_comes_from_the_argument_else_the_variable_else_tuned(monkeypatch, value, choice):
    monkeypatch.delenv(ALLOCATOR_VARIABLE, raising=False)
    if value is not None:
        monkeypatch.setenv(ALLOCATOR_VARIABLE, value)
    assert allocator_choice() == choice
    assert allocator_choice("tuned") == "tuned"  # the argument wins


def test_an_unknown_choice_is_refused_with_the_choices_before_any_rank_starts(monkeypatch, capsys):
    with pytest.raises(AllocatorError, match=r"--allocator='jemalloc' is not an allocator choice: use tuned"):
        allocator_choice("jemalloc")
    monkeypatch.setenv(ALLOCATOR_VARIABLE, "fast")
    for refused in (
        tune_allocator,
        lambda: run_on_processes(pytest.fail, (), world_size=2, deadline=5),
        lambda: environment_for_processes().__enter__(),
    ):
        with pytest.raises(AllocatorError, match=r"GRAPHKIT_ALLOCATOR='fast' is not an allocator choice"):
            refused()
    assert main(["costs", "zoo:mlp", "--repeat", "1", "--warmup", "0"]) == 2
    assert "GRAPHKIT_ALLOCATOR='fast' is not an allocator choice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        main(["costs", "zoo:mlp", "--allocator", "fast"])
    assert stopped.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err


@GLIBC
def test_processes_started_meanwhile_get_the_tuned_variables_or_lose_only_graphkits(monkeypatch):
    monkeypatch.setattr(
        allocator_module, "_RECORD", allocator_module._Record(environment=dict(TUNED_ENVIRONMENT))
    )
    for key in TUNED_ENVIRONMENT:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MALLOC_TOP_PAD_", "4096")  # the user's own
    with environment_for_processes("tuned") as choice:
        assert choice == "tuned" and {key: os.environ[key] for key in TUNED_ENVIRONMENT} == TUNED_ENVIRONMENT
    assert os.environ["MALLOC_TOP_PAD_"] == "4096" and "MALLOC_MMAP_THRESHOLD_" not in os.environ
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", TUNED_ENVIRONMENT["MALLOC_MMAP_THRESHOLD_"])  # graphkit's
    with environment_for_processes("default"):
        assert "MALLOC_MMAP_THRESHOLD_" not in os.environ and os.environ["MALLOC_TOP_PAD_"] == "4096"
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == TUNED_ENVIRONMENT["MALLOC_MMAP_THRESHOLD_"]


# --- the commands and the bench scripts say which allocator ran ------------------------------------------------
STOP = "stopped before running"


def _stop(*_arguments, **_keywords):
    raise ValueError(STOP)


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        ("timeline", ["--schedule", "1F1B", "-o", "unused.svg"]),
        ("compare-schedules", []),
        ("verify-pipeline", []),
        ("plan", []),
        ("costs", []),
    ],
)
@pytest.mark.parametrize("flag", [None, "tuned", "default"])
def test_the_allocator_flag_reaches_the_ranks_and_plan_warns_under_glibcs_defaults(
    monkeypatch, capsys, command, extra, flag
):
    import graphkit.measure.costs as costs
    import graphkit.pipelining.planner as planner
    import graphkit.pipelining.recording as recording
    import graphkit.pipelining.verification as checker

    for module, name in (
        (recording, "record_schedules"),
        (checker, "verify_pipeline"),
        (planner, "plan_schedules"),
        (costs, "spec_costs"),
    ):
        monkeypatch.setattr(module, name, _stop)
    asked = []

    def tune(choice=None):  # this pytest process keeps its own malloc: the choice is only recorded
        asked.append(os.environ.get(ALLOCATOR_VARIABLE))
        return TUNED if allocator_choice(choice) == "tuned" else Allocator("glibc", fresh_pages=True)

    monkeypatch.setattr(allocator_module, "tune_allocator", tune)
    monkeypatch.setattr(allocator_module, "current_allocator", lambda: tune())
    monkeypatch.setenv(ALLOCATOR_VARIABLE, "default")  # restored afterwards, whatever the command sets
    flags = ["--allocator", flag] if flag else []
    assert main([command, "zoo-pipeline:mlp", *extra, *flags]) == 2
    out, err = capsys.readouterr()
    assert STOP in err and out == ""  # refused: no allocator line for what did not run
    expected = flag or "default"
    assert asked[0] == expected  # the ranks follow GRAPHKIT_ALLOCATOR, which the flag sets
    warned = "warning: the processes that measure run under glibc malloc's defaults" in err
    assert warned == (command == "plan" and expected == "default")


def test_each_measuring_command_ends_with_the_allocator_it_ran_under(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(allocator_module, "tune_allocator", lambda choice=None: TUNED)
    costs_file = tmp_path / "costs.json"
    line = "allocator: glibc malloc, tuned: no mmap, no trim"
    quick = ["zoo-pipeline:mlp", "--microbatches", "2", "--batch-size", "4"]
    commands = [
        ["timeline", *quick, "--schedule", "1F1B", "--steps", "1", "-o", str(tmp_path / "t.json")],
        ["compare-schedules", *quick, "--schedules", "1F1B,GPipe", "--steps", "1"],
        ["costs", "zoo-pipeline:mlp", "--num-stages", "4", "--repeat", "1", "--warmup", "0"],
        ["plan", "--costs", str(costs_file), "--ranks", "2", "--microbatches", "4"],
    ]
    assert main([*commands[2], "--json", "-o", str(costs_file)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[-1] == line and line not in out  # under --json: on stderr
    for command in commands:
        assert main(command) == 0, command
        out, err = capsys.readouterr()
        assert out.splitlines()[-1] == line and out.count("allocator:") == 1, (command, out)
    # verify-pipeline times nothing: its verdict stays last, and its ranks still run tuned
    assert main(["verify-pipeline", "zoo-pipeline:mlp", "--microbatches", "2", "--schedule", "ZBH1"]) == 0
    out = capsys.readouterr().out
    assert "allocator:" not in out and out.strip().splitlines()[-1].startswith("exact: ")


def test_under_json_the_allocator_line_goes_to_stderr(monkeypatch, capsys):
    monkeypatch.setattr(allocator_module, "tune_allocator", lambda choice=None: TUNED)
    status = main(["costs", "zoo:mlp", "--repeat", "1", "--warmup", "0", "--json"])
    out, err = capsys.readouterr()
    assert status == 0 and json.loads(out)["stages"]
    assert "allocator: glibc malloc, tuned: no mmap, no trim" in err


def test_every_bench_script_tunes_the_allocator_before_it_runs():
    bench = Path(__file__).resolve().parent.parent / "bench"
    scripts = [
        path for path in sorted(bench.glob("*.py")) if 'if __name__ == "__main__":' in path.read_text()
    ]
    assert len(scripts) >= 10
    for path in scripts:
        entry = path.read_text().split('if __name__ == "__main__":', 1)[1]
        assert entry.index("tune_allocator_for_benchmark()") < entry.index("main()"), path.name


def test_the_bench_line_names_the_allocator(monkeypatch, capsys):
    monkeypatch.setattr(allocator_module, "tune_allocator", lambda choice=None: TUNED)
    assert allocator_module.tune_allocator_for_benchmark() is TUNED
    assert capsys.readouterr().err == "allocator: glibc malloc, tuned: no mmap, no trim\n"
