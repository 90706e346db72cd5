"""The graphkit command: outputs, JSON forms and exit statuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
from cli_commands import commands_taking_pipeline_spec  # tests/cli_commands.py, beside this file

from graphkit.analysis.parameter_groups import param_groups
from graphkit.cli import main
from graphkit.graph.tracing import trace
from graphkit.models import zoo
from graphkit.models.huggingface import KNOWN_ARCHITECTURES

BROKEN = f"{Path(__file__).parent / 'specs' / 'broken_split.py'}:build"


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_capture_prints_a_summary(capsys):
    status, out, _ = run(capsys, "capture", "zoo:mlp")
    module, (x,) = zoo.build("mlp")
    _, graph = trace(module, x)
    assert status == 0
    assert f"{graph.number_of_nodes()} nodes, {graph.number_of_edges()} edges" in out
    for name, _ in module.named_parameters():
        assert name in out


def test_capture_json_and_graphml(capsys, tmp_path):
    status, out, _ = run(capsys, "capture", "zoo:chain", "--json")
    data = json.loads(out)
    assert status == 0 and {"nodes", "edges"} <= set(data)
    status, _, _ = run(capsys, "capture", "zoo:chain", "--graphml", str(tmp_path / "g.graphml"))
    loaded = nx.read_graphml(tmp_path / "g.graphml")
    assert status == 0 and loaded.number_of_nodes() == len(data["nodes"])


def test_groups_json_matches_the_library(capsys):
    status, out, _ = run(capsys, "groups", "zoo:shared_late", "--json")
    data = json.loads(out)
    module, inputs = zoo.build("shared_late")
    _, graph = trace(module, *inputs)
    groups = param_groups(graph)
    assert status == 0
    assert data["nodes"] == graph.number_of_nodes() and data["edges"] == graph.number_of_edges()
    assert [group["params"] for group in data["groups"]] == [list(group.params) for group in groups]
    assert all({"params", "intermediates", "flags"} <= set(group) for group in data["groups"])
    assert data["unused_params"] == []


def test_groups_table(capsys):
    status, out, _ = run(capsys, "groups", "zoo:param_only_output")
    assert status == 0 and "parameter-only-output" in out


def test_verify_exit_status_follows_the_verdict(capsys):
    status, out, _ = run(capsys, "verify", "zoo:chain", "--dtype", "float64", "--json")
    data = json.loads(out)
    assert status == 0 and data["ok"] is True
    assert {"inputs", "params", "flops", "groups"} <= set(data)
    status, out, _ = run(capsys, "verify", BROKEN, "--dtype", "float64")
    assert status == 1
    assert "wrong" in out and "weight" in out and "FAILED" in out


def test_bad_spec_exits_2_with_a_message(capsys):
    status, _, err = run(capsys, "groups", "zoo:does_not_exist")
    assert status == 2 and "known models" in err


def test_python_dash_m_runs_the_cli():
    result = subprocess.run(
        [sys.executable, "-m", "graphkit", "groups", "zoo:mlp"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "parameter groups" in result.stdout


@pytest.mark.parametrize(
    "command",
    [
        "capture",
        "groups",
        "verify",
        "render",
        "inspect",
        "list",
        "bench",
        "costs",
        "timeline",
        "compare-schedules",
        "verify-pipeline",
    ],
)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: graphkit" in capsys.readouterr().out


def test_verify_on_a_cuda_device_this_torch_cannot_use_exits_2_with_one_line(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only build
    status, out, err = run(capsys, "verify", "zoo:chain", "--device", "cuda")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "no CUDA device" in err


CHECKPOINTED = f"{Path(__file__).parent / 'specs' / 'checkpointed_stage.py'}:build"


@pytest.mark.parametrize(("recompute", "in_w"), [("in-w", 2), ("keep-from-b", 0)])
def test_verify_and_groups_name_checkpointed_nodes_and_the_recomputations(capsys, recompute, in_w):
    status, out, _ = run(capsys, "verify", CHECKPOINTED, "--dtype", "float64", "--recompute", recompute)
    assert status == 0, out
    assert "[checkpointed]" in out
    assert f"checkpointed regions recomputed: 2 in B, {in_w} in W (recompute={recompute!r})" in out
    status, out, _ = run(capsys, "groups", CHECKPOINTED)
    assert status == 0 and "opaque-node" in out and "[checkpointed]" in out


# --- graphkit list: pipeline specs ------------------------------------------------------------------------
def test_list_names_every_zoo_model_and_hf_architecture(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "list")
    assert status == 0
    for name in zoo.MODELS:
        assert f"zoo:{name}" in out
    for arch in KNOWN_ARCHITECTURES:
        assert f"hf:{arch}" in out
    status, out, _ = run(capsys, "list", "--json")
    data = json.loads(out)
    assert list(data["zoo"]) == [f"zoo:{name}" for name in zoo.MODELS]
    assert set(data["hf"]) == {f"hf:{arch}" for arch in KNOWN_ARCHITECTURES}


def test_list_prints_the_built_in_pipelines_and_the_hf_architectures_cut_into_stages(capsys):
    from graphkit.models.pipeline_specs import PIPELINE_ARCHITECTURES

    status, out, _ = run(capsys, "list")
    assert status == 0
    lines = out.splitlines()
    start = lines.index("built-in pipelines (zoo-pipeline:NAME):")
    assert lines[start + 1 : start + 5] == [
        "pipeline spec          what it is",
        "---------------------  -----------------------------------------------------------------------------------",
        "zoo-pipeline:mlp       num_stages MLPStage blocks (width 64, hidden 256), float32, seeded (0), on the CPU.",
        "zoo-pipeline:mlp_wide  zoo-pipeline:mlp with width 512 and hidden 2048 (milliseconds per pass).",
    ]
    start = lines.index(
        "Hugging Face architectures cut into pipeline stages (hf:ARCH[?key=value&...], the 'models' extra):"
    )
    rows = lines[start + 3 : start + 3 + len(PIPELINE_ARCHITECTURES)]
    assert [row.split()[0] for row in rows] == [f"hf:{arch}" for arch in PIPELINE_ARCHITECTURES]
    assert rows[0].split(None, 1)[1] == (
        "GPT-2: embeddings on the first stage, ln_f and an untied lm_head on the last "
        "(n_layer, n_embd, n_head, vocab_size, seq, seed)"
    )
    assert lines[:2] == ["built-in models (zoo:NAME):", "spec                   what it is"]  # as before

    status, out, _ = run(capsys, "list", "--json")
    data = json.loads(out)
    assert list(data) == ["zoo", "hf", "zoo-pipeline", "hf-pipeline"]
    assert data["zoo-pipeline"] == {
        "zoo-pipeline:mlp": "num_stages MLPStage blocks (width 64, hidden 256), float32, seeded (0), on the CPU.",
        "zoo-pipeline:mlp_wide": "zoo-pipeline:mlp with width 512 and hidden 2048 (milliseconds per pass).",
    }
    assert list(data["hf-pipeline"]) == [f"hf:{arch}" for arch in PIPELINE_ARCHITECTURES]
    assert data["hf-pipeline"]["hf:gpt2"] == rows[0].split(None, 1)[1]


def test_list_names_every_command_that_takes_a_pipeline_spec(capsys):
    takes_pipeline_spec = commands_taking_pipeline_spec()
    assert "plan" in takes_pipeline_spec
    status, out, _ = run(capsys, "list")
    (line,) = [line for line in out.splitlines() if line.startswith("Pipeline specs go to ")]
    named = set(re.findall(r"[a-z]+(?:-[a-z]+)*", line.split(" go to ", 1)[1].split("(", 1)[0]))
    assert status == 0 and takes_pipeline_spec | {"costs"} <= named


def test_every_listed_pipeline_spec_loads_and_no_other_hf_architecture_does():
    pytest.importorskip("transformers")
    from graphkit.models.huggingface import KNOWN_ARCHITECTURES
    from graphkit.models.pipeline_specs import PIPELINE_ARCHITECTURES, PIPELINES, load_pipeline_spec
    from graphkit.models.specs import SpecError

    listed = [f"zoo-pipeline:{name}" for name in PIPELINES] + [
        f"hf:{arch}" for arch in PIPELINE_ARCHITECTURES
    ]
    for spec in listed:
        pipeline = load_pipeline_spec(spec, num_stages=2, batch_size=4)
        assert len(pipeline.stages) == 2 and pipeline.batch_size == 4, spec
    assert set(PIPELINE_ARCHITECTURES) <= set(KNOWN_ARCHITECTURES)
    for arch in set(KNOWN_ARCHITECTURES) - set(PIPELINE_ARCHITECTURES):
        with pytest.raises(SpecError):
            load_pipeline_spec(f"hf:{arch}", num_stages=2, batch_size=4)


def test_a_pipeline_description_is_its_docstrings_first_line_in_plain_text():
    from graphkit.cli.graph_commands import pipeline_description

    def wide() -> None:
        """``zoo-pipeline:wide``: :func:`mlp_pipeline` with ``n`` :class:`~graphkit.models.MLPStage` blocks.

        More text that is not the description.
        """

    def undocumented() -> None:
        pass

    assert pipeline_description("wide", wide) == "zoo-pipeline:mlp with n MLPStage blocks."
    assert pipeline_description("other", undocumented) == "undocumented"


# --- --timeout of the pipeline commands -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "seconds"),
    [([], 300.0), (["--timeout", "9"], 9.0), (["--deadline", "7"], 7.0), (["--deadline=7.5"], 7.5)],
)
def test_verify_pipeline_timeout_and_its_old_spelling_deadline_reach_the_checker(
    capsys, monkeypatch, options, seconds
):
    import graphkit.pipelining.verification as checker

    passed = {}

    def record_arguments(spec, **keywords):
        passed.update(keywords)
        raise ValueError("stopped before running")

    monkeypatch.setattr(checker, "verify_pipeline", record_arguments)
    status, _, err = run(capsys, "verify-pipeline", "zoo-pipeline:mlp", *options)
    assert status == 2 and "stopped before running" in err
    assert passed["deadline"] == seconds


@pytest.mark.parametrize("command", ["timeline", "compare-schedules"])
@pytest.mark.parametrize(("options", "seconds"), [([], 120.0), (["--timeout", "30"], 30.0)])
def test_timeline_and_compare_schedules_timeout_reaches_the_recorder(
    capsys, monkeypatch, command, options, seconds
):
    import graphkit.pipelining.recording as recording

    passed = {}

    def record_arguments(spec, schedules, **keywords):
        passed.update(keywords)
        raise ValueError("stopped before running")

    monkeypatch.setattr(recording, "record_schedules", record_arguments)
    extra = ["--schedule", "1F1B", "-o", "unused.svg"] if command == "timeline" else []
    status, _, err = run(capsys, command, "zoo-pipeline:mlp", *extra, *options)
    assert status == 2 and "stopped before running" in err
    assert passed["timeout_s"] == seconds


def test_compare_schedules_records_each_set_of_processes_apart_and_prints_each_sets_ratio(
    capsys, monkeypatch
):
    import graphkit.pipelining.recording as recording
    from graphkit.pipelining.planning.timelines import RankTimeline, ScheduleTimeline

    asked = []
    # per set: 1F1B 100 ms; ZBVZeroBubble 90, 96 and 99 ms; the control 100, 103 and 100 ms
    steps_by_set = {
        "1F1B": [100.0, 100.0, 100.0],
        "ZBVZeroBubble": [90.0, 96.0, 99.0],
        "copy": [100.0, 103.0, 100.0],
    }

    def record(spec, schedules, steps=1, **_):
        index = len(asked)
        asked.append(steps)
        timelines = []
        for position, name in enumerate(schedules):
            key = "copy" if position == len(schedules) - 1 and position else name
            times = [steps_by_set[key][index] * 1e-3] * steps
            rank = RankTimeline(0, [0], [], times[0], None, [], [])
            rank.step_times = times
            timelines.append(ScheduleTimeline(name, 4, 2, [rank]))
        return timelines

    monkeypatch.setattr(recording, "record_schedules", record)
    status, out, _ = run(
        capsys,
        "compare-schedules",
        "zoo-pipeline:mlp",
        "--schedules",
        "1F1B,ZBVZeroBubble",
        "--control",
        "--steps",
        "21",
        "--process-sets",
        "3",
    )
    assert status == 0, out
    assert asked == [7, 7, 7]  # three recordings: three sets of new processes
    assert (
        "in 3 sets of new processes of 7, 7 and 7 rounds, each ratio the mean of the sets' median rounds"
        in out
    )
    assert (
        "ZBVZeroBubble: 0.950x in the mean of the sets (0.900x, 0.960x, 0.990x), faster in 21 of 21 rounds"
        in out
    )
    assert "noise floor: 1F1B recorded twice (A/A) measured 1.0% apart in the mean of the sets" in out
    # every round of a set alike: nothing strays from round to round
    assert "precision: a round's difference between two schedules strayed by 0.0% of a step" in out
    status, _, err = run(capsys, "compare-schedules", "zoo-pipeline:mlp", "--process-sets", "0")
    assert status == 2 and "--process-sets must be at least 1" in err


@pytest.mark.parametrize(
    ("command", "default"), [("verify-pipeline", 300), ("timeline", 120), ("compare-schedules", 120)]
)
def test_the_pipeline_commands_document_one_timeout_and_hide_deadline(capsys, monkeypatch, command, default):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help to the terminal width
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    described = (
        "--timeout S wall-clock limit in seconds, after which graphkit ends the processes it started "
        f"with --ranks above 1 (default {default})"
    )
    assert described in " ".join(text.split())
    assert "--deadline" not in text


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("verify-pipeline", "--timeout"),
        ("verify-pipeline", "--deadline"),
        ("timeline", "--timeout"),
        ("compare-schedules", "--timeout"),
        ("render", "--timeout"),  # Graphviz's layout budget
        ("inspect", "--timeout"),
    ],
)
@pytest.mark.parametrize("seconds", ["0", "-5", "nan", "soon"])
def test_a_timeout_that_is_no_positive_number_of_seconds_is_refused(capsys, command, option, seconds):
    extra = {"timeline": ["--schedule", "1F1B", "-o", "unused.svg"], "render": ["-o", "unused.svg"]}.get(
        command, []
    )
    with pytest.raises(SystemExit) as stopped:
        main([command, "zoo-pipeline:mlp", *extra, f"{option}={seconds}"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err
    assert "seconds" in err and "Traceback" not in err


# --- plan --memory-limit ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("4000000", 4_000_000),
        ("4e6", 4_000_000),
        ("2.5e3", 2500),
        ("4MiB", 4 * 1024**2),
        ("4 MiB", 4 * 1024**2),
        ("512KiB", 512 * 1024),
        ("2GiB", 2 * 1024**3),
        ("4MB", 4_000_000),
        ("4GB", 4_000_000_000),
        ("1.5kib", 1536),
        ("300B", 300),
    ],
)
def test_plan_memory_limit_takes_bytes_with_or_without_a_unit(capsys, monkeypatch, text, limit):
    import graphkit.pipelining.planner as planner

    passed = {}

    def record_arguments(spec, **keywords):
        passed.update(keywords)
        raise ValueError("stopped before planning")

    monkeypatch.setattr(planner, "plan_schedules", record_arguments)
    status, _, err = run(capsys, "plan", "--costs", "unused.json", "--memory-limit", text)
    assert status == 2 and "stopped before planning" in err
    assert passed["memory_limit"] == limit


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("-1", "must be a positive number of bytes, got '-1'"),
        ("0", "must be a positive number of bytes, got '0'"),
        ("0MiB", "must be a positive number of bytes"),
        (
            "4 XB",
            "unknown unit 'XB' in '4 XB'; use B, KiB, MiB, GiB (powers of 2) or KB, MB, GB (powers of 10)",
        ),
        ("4Mb/s", "expected a number of bytes such as 4000000, 4e6, 4MB or 4MiB, got '4Mb/s'"),
        ("lots", "expected a number of bytes"),
        ("nan", "expected a number of bytes"),
    ],
)
def test_plan_memory_limit_that_is_no_positive_number_of_bytes_is_refused(capsys, text, said):
    with pytest.raises(SystemExit) as stopped:
        main(["plan", "--costs", "unused.json", "--memory-limit", text])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --memory-limit: {said}" in err and "Traceback" not in err


def test_plan_help_says_which_memory_limit_units_it_takes(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help to the terminal width
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "KiB, MiB, GiB (powers of 2) or KB, MB, GB (powers of 10), e.g. 4MiB" in text


@pytest.mark.parametrize("spec", [[], ["zoo-pipeline:mlp"]])
def test_plan_pin_cores_without_run_is_refused_with_exit_2(capsys, monkeypatch, spec):
    import graphkit.pipelining.planner as planner

    def plan_schedules(spec, **keywords):
        raise AssertionError("planned although --pin-cores came without --run")

    monkeypatch.setattr(planner, "plan_schedules", plan_schedules)
    status, out, err = run(capsys, "plan", *spec, "--costs", "unused.json", "--pin-cores")
    assert status == 2 and out == ""
    assert (
        err
        == "graphkit plan: error: --pin-cores pins the ranks that --run records: add --run, or leave --pin-cores out\n"
    )


def test_verify_pipeline_past_its_timeout_fails_with_a_message_not_a_traceback(capsys, monkeypatch):
    import graphkit.pipelining.verification as checker
    from graphkit.pipelining.launcher import LaunchError

    def too_slow(spec, **keywords):
        raise LaunchError(
            f"2 of 2 processes did not finish within {keywords['deadline']:g} s; they were ended",
            timed_out=True,
        )

    monkeypatch.setattr(checker, "verify_pipeline", too_slow)
    status, out, err = run(capsys, "verify-pipeline", "zoo-pipeline:mlp", "--ranks", "2", "--timeout", "2.5")
    assert status == 1
    assert err.strip() == (
        "graphkit verify-pipeline: error: 2 of 2 processes did not finish within 2.5 s; they were ended; "
        "raise --timeout (now 2.5 s) if the step is only slow"
    )
    assert out.strip() == "FAILED: nothing was verified"

    status, out, _ = run(
        capsys, "verify-pipeline", "zoo-pipeline:mlp", "--ranks", "2", "--timeout", "2", "--json"
    )
    payload = json.loads(out)
    assert status == 1 and payload["ok"] is False and "within 2 s" in payload["error"]


def test_verify_pipeline_names_a_rank_that_died_without_a_timeout_hint(capsys, monkeypatch):
    import graphkit.pipelining.verification as checker
    from graphkit.pipelining.launcher import LaunchError

    def died(spec, **keywords):
        raise LaunchError("process 1 exited with status -9 without a result")

    monkeypatch.setattr(checker, "verify_pipeline", died)
    status, out, err = run(capsys, "verify-pipeline", "zoo-pipeline:mlp", "--ranks", "2")
    assert status == 1 and "process 1 exited with status -9" in err and "--timeout" not in err


def test_list_wraps_its_descriptions_to_a_terminal_and_keeps_one_line_per_row_in_a_pipe(monkeypatch):
    import io

    from graphkit.cli.terminal import print_table

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "60")
    rows = [("spec", "what it is"), ("hf:llama", "Llama: " + "word " * 30), ("hf:gpt2", "short")]
    terminal, pipe = Terminal(), io.StringIO()
    print_table(rows, out=terminal, wrap_last=True)
    print_table(rows, out=pipe, wrap_last=True)
    wrapped = terminal.getvalue().splitlines()
    assert max(len(line) for line in wrapped) <= 59
    assert wrapped[0] == "spec      what it is" and wrapped[1] == "-" * 8 + "  " + "-" * 49
    assert wrapped[2].startswith("hf:llama  Llama: word") and wrapped[3].startswith(" " * 10 + "word")
    assert wrapped[-1] == "hf:gpt2   short"
    assert " ".join(" ".join(wrapped[2:-1]).split()) == "hf:llama " + rows[1][1].strip()  # nothing lost
    assert len(pipe.getvalue().splitlines()) == 4  # header, dashes, one line per row


def test_inspect_help_names_the_model_it_inspects_by_default(capsys, monkeypatch):
    from graphkit.apps.report import DEFAULT_SPEC

    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    assert f"(default: {DEFAULT_SPEC}," in capsys.readouterr().out


def test_verify_on_a_model_whose_hook_the_split_refuses_exits_2_with_the_reason(capsys, tmp_path):
    # a post-hook on an intermediate Node (the Linear's addmm): B refuses it with a SplitError
    spec = tmp_path / "hooked.py"
    spec.write_text(
        "import torch\n"
        "from torch import nn\n\n"
        "class Hooked(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        "        y = self.linear(x)\n"
        "        y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: None)\n"
        "        return torch.tanh(y)\n\n"
        "def make_stage():\n"
        "    return Hooked(), (torch.randn(3, 4, requires_grad=True),)\n"
    )
    status, out, err = run(capsys, "verify", f"{spec}:make_stage", "--dtype", "float64")
    assert status == 2, (out, err)
    assert "graphkit verify: error:" in err and "hook" in err and "Traceback" not in err


BROKEN_FORWARD = Path(__file__).parent / "specs" / "broken_forward.py"


@pytest.mark.parametrize(
    "command",
    [
        ["verify", f"{BROKEN_FORWARD}:make"],
        ["groups", f"{BROKEN_FORWARD}:make"],
        ["capture", f"{BROKEN_FORWARD}:make"],
        ["render", f"{BROKEN_FORWARD}:make", "-o", "{tmp}/x.svg"],
        ["inspect", f"{BROKEN_FORWARD}:make", "-o", "{tmp}/report"],
        ["bench", f"{BROKEN_FORWARD}:make", "--repeat", "1"],
        ["costs", f"{BROKEN_FORWARD}:make", "--repeat", "1", "--warmup", "0"],
        ["verify-pipeline", f"{BROKEN_FORWARD}:pipeline"],
        ["timeline", f"{BROKEN_FORWARD}:pipeline", "--schedule", "1F1B", "-o", "{tmp}/t.svg"],
    ],
    ids=lambda command: command[0],
)
def test_an_error_in_the_users_forward_is_one_line_naming_the_spec_with_exit_2(capsys, tmp_path, command):
    command = [part.replace("{tmp}", str(tmp_path)) for part in command]
    status, out, err = run(capsys, *command)
    assert status == 2, (out, err)
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert line.startswith(f"graphkit {command[0]}: error: the model of {command[1]} raised RuntimeError: ")
    assert "(broken_forward.py:16 in forward)" in line and "--traceback prints the whole traceback" in line
    assert "Traceback" not in err and "not compared" not in out
    status, out, err = run(capsys, *command, "--traceback")
    assert status == 2 and "Traceback (most recent call last)" in err and "broken_forward.py" in err


@pytest.mark.parametrize(
    "command",
    [
        ["verify", f"{BROKEN_FORWARD}:make_sequential"],
        ["inspect", f"{BROKEN_FORWARD}:make_sequential", "-o", "{tmp}/report"],
        ["render", f"{BROKEN_FORWARD}:make_sequential", "-o", "{tmp}/x.svg"],
        ["groups", f"{BROKEN_FORWARD}:make_sequential"],
        ["costs", f"{BROKEN_FORWARD}:make_sequential", "--repeat", "1", "--warmup", "0"],
        ["bench", f"{BROKEN_FORWARD}:make_sequential", "--repeat", "1"],
    ],
    ids=lambda command: command[0],
)
def test_an_error_raised_inside_pytorchs_own_modules_of_the_model_is_the_models_error_too(
    capsys, tmp_path, command
):
    # nn.Sequential(nn.Linear(5, 4), nn.Linear(5, 4)): no frame of the spec's file is on the stack, only
    # torch's, below the module call graphkit made
    command = [part.replace("{tmp}", str(tmp_path)) for part in command]
    status, out, err = run(capsys, *command)
    assert status == 2, (out, err)
    (line,) = [line for line in err.splitlines() if "error:" in line]  # inspect also prints its steps
    assert "Traceback" not in err
    # torch's own message, which newer releases prefix with the op ("addmm: mat1 and mat2 ...")
    pattern = (
        rf"graphkit {command[0]}: error: the model of {re.escape(command[1])} raised RuntimeError: "
        r"(addmm: )?mat1 and mat2 shapes cannot be multiplied \(2x4 and 5x4\) \(linear\.py:"
    )
    assert re.match(pattern, line), line
    assert line.endswith("in forward); --traceback prints the whole traceback")
    status, out, err = run(capsys, *command, "--traceback")
    assert status == 2 and "Traceback (most recent call last)" in err and "linear.py" in err


def test_an_error_graphkit_itself_raises_is_not_blamed_on_the_model(monkeypatch):
    # a TypeError raised in a graphkit frame, as a bug would: the whole traceback, not "the model raised"
    import graphkit.analysis.parameter_groups as parameter_groups
    from graphkit.drawing.timeline import _ticks

    monkeypatch.setattr(parameter_groups, "param_groups", lambda graph: _ticks(None))
    with pytest.raises(TypeError):
        main(["groups", "zoo:mlp"])


@pytest.mark.parametrize(
    "command",
    [
        ["timeline", "zoo:mlp", "--schedule", "1F1B", "-o", "t.svg"],
        ["verify-pipeline", "zoo:mlp"],
        ["compare-schedules", "zoo:mlp"],
    ],
    ids=lambda command: command[0],
)
def test_a_model_spec_given_to_a_pipeline_command_points_at_the_pipeline_spec_form(capsys, command):
    status, out, err = run(capsys, *command)
    assert status == 2, (out, err)
    assert "'zoo:mlp' is a model spec (one stage)" in err and "zoo-pipeline:mlp" in err
    assert "(stages, loss_fn, inputs, target)" in err and "importing module" not in err


def test_costs_still_takes_a_model_spec(capsys):
    status, out, _ = run(capsys, "costs", "zoo:mlp", "--repeat", "1", "--warmup", "0")
    assert status == 0 and "per-microbatch costs of zoo:mlp (1 stage(s))" in out


def test_groups_wraps_long_rows_and_says_why_a_model_without_input_gradients_is_all_w(capsys, tmp_path):
    # token ids need no gradient: B has nothing to compute, every parameter is W's, in one group
    spec = tmp_path / "token_model.py"
    spec.write_text(
        "import torch\n"
        "from torch import nn\n\n"
        "def make():\n"
        "    blocks = [nn.Linear(8, 8) for _ in range(12)]\n"
        "    model = nn.Sequential(nn.Embedding(10, 8), *blocks)\n"
        "    return model, (torch.randint(0, 10, (2, 3)),)\n"
    )
    status, out, _ = run(capsys, "groups", f"{spec}:make")
    assert status == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 140, max(lines, key=len)
    assert "0.weight" in out and "12.bias" in out  # every name still printed, over several lines
    assert "no input requires grad" in out and "every parameter's gradient is W's work" in out.replace(
        "\n", " "
    )


def test_groups_shows_tied_weights_as_one_tensor(capsys):
    status, out, _ = run(capsys, "groups", "zoo:gpt_ends")
    assert status == 0 and "wte.weight = lm_head.weight" in out
    assert "no input requires grad" not in out  # its hidden states require grad


def test_verify_and_inspect_word_the_verdict_alike_and_count_parameters_and_inputs(capsys, tmp_path):
    status, out, _ = run(capsys, "verify", "zoo:gpt_ends")
    assert status == 0
    verdict = "OK: all 17 gradients match (16 parameters, 1 input)"
    assert verdict in out
    status, out, _ = run(capsys, "inspect", "zoo:gpt_ends", "-o", str(tmp_path / "report"))
    assert status == 0 and verdict in " ".join(out.split())  # the terminal table may wrap it
    page = (tmp_path / "report" / "index.html").read_text()
    assert "all 17 gradients match (16 parameters, 1 input)" in page


@pytest.mark.parametrize("model", ["zoo:lstm", "zoo:custom_function"])
def test_verify_and_costs_say_partial_when_flops_were_not_all_counted(capsys, model):
    status, out, _ = run(capsys, "verify", model)
    assert status == 0 and "FLOPs partial: 1 node(s) not counted" in out
    status, out, _ = run(capsys, "verify", model, "--json")
    assert json.loads(out)["flops_partial"] is True
    status, out, _ = run(capsys, "costs", model, "--repeat", "1", "--warmup", "0")
    assert status == 0 and "stage 0 FLOPs partial: 1 node(s) not counted" in out
    status, out, _ = run(capsys, "costs", model, "--repeat", "1", "--warmup", "0", "--json")
    data = json.loads(out)
    assert data["flops_partial"] is True and data["stages"][0]["flops_partial"] is True


def test_verify_and_costs_do_not_say_partial_when_every_flop_was_counted(capsys):
    status, out, _ = run(capsys, "verify", "zoo:mlp")
    assert status == 0 and "partial" not in out
    status, out, _ = run(capsys, "costs", "zoo:mlp", "--repeat", "1", "--warmup", "0", "--json")
    assert json.loads(out)["flops_partial"] is False


def test_a_meta_graph_of_an_lstm_says_why_it_has_more_nodes_than_on_cpu(capsys, tmp_path):
    # the same model: 11 nodes on cpu (one fused mkldnn_rnn_layer), 86 on meta (a time step at a time)
    status, out, err = run(capsys, "render", "zoo:lstm", "--device", "meta", "-o", str(tmp_path / "l.dot"))
    assert status == 0 and "on the meta device PyTorch runs LSTM a time step at a time" in err
    status, out, err = run(capsys, "render", "zoo:lstm", "-o", str(tmp_path / "c.dot"))
    assert status == 0 and "time step" not in err  # on cpu: the graph PyTorch runs there, nothing to say
    status, out, _ = run(capsys, "render", "zoo:mlp", "--device", "meta", "-o", str(tmp_path / "m.dot"))
    assert status == 0 and "time step" not in out
    assert main(["inspect", "zoo:lstm", "--device", "meta", "-o", str(tmp_path / "report")]) == 0
    summary = json.loads((tmp_path / "report" / "report.json").read_text())["summary"]
    assert "a time step at a time" in summary["graph_note"]


def test_an_output_that_is_no_tensor_is_named_not_dropped_silently(capsys, tmp_path):
    spec = tmp_path / "dict_output.py"
    spec.write_text(
        "import torch\n"
        "from torch import nn\n\n"
        "class DictOut(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        "        return {'logits': self.linear(x), 'count': 3}\n\n"
        "def make():\n"
        "    return DictOut(), (torch.randn(2, 4, requires_grad=True),)\n"
    )
    note = "outputs left out, as no tensors (no gradient flows through them): count (int)"
    for command in ("capture", "groups"):
        status, out, _ = run(capsys, command, f"{spec}:make")
        assert status == 0 and note in out, out
    assert main(["inspect", f"{spec}:make", "-o", str(tmp_path / "report")]) == 0
    summary = json.loads((tmp_path / "report" / "report.json").read_text())["summary"]
    assert summary["skipped_outputs"] == [{"name": "count", "type": "int"}]
    assert "count</code> (int)" in (tmp_path / "report" / "index.html").read_text()


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(capsys, monkeypatch):
    from graphkit.pipelining import recording

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(recording, "record_schedules", interrupted)
    status, _, err = run(capsys, "compare-schedules", "zoo-pipeline:mlp", "--ranks", "2")
    assert status == 130 and err.strip() == "graphkit compare-schedules: interrupted"
