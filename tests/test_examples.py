"""Every script in examples/ runs to exit status 0 in a fresh process, and does what it says.

Each example runs with this test run's Python in a temporary working folder, so files it writes land there.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(script: str, *arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_ok(script: str, *arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = run(script, *arguments, cwd=cwd)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def test_every_example_has_a_test_that_runs_it() -> None:
    tested = {
        "capture_and_draw.py",
        "groups_to_json.py",
        "verify_custom_model.py",
        "two_stage_zero_bubble.py",
        "zero_bubble_torchrun.py",
        "torchtitan_train.py",
    }
    assert {path.name for path in EXAMPLES.glob("*.py")} == tested


@pytest.mark.slow
def test_capture_and_draw_writes_an_svg_and_dot_of_the_stage(tmp_path: Path) -> None:
    result = run_ok("capture_and_draw.py", "-o", "out", "--collapse", "2", cwd=tmp_path)
    assert "125 nodes" in result.stdout  # zoo:gpt_stage, two blocks
    svg = ElementTree.parse(tmp_path / "out" / "gpt_stage.svg").getroot()
    titles = {element.text for element in svg.iter("{http://www.w3.org/2000/svg}title")}
    assert {"module.blocks.0", "module.blocks.1"} <= titles  # collapsed at depth 2
    assert (tmp_path / "out" / "gpt_stage.dot").read_text().startswith("digraph")


@pytest.mark.slow
def test_groups_to_json_lists_one_group_per_linear_layer(tmp_path: Path) -> None:
    result = run_ok("groups_to_json.py", "zoo:mlp", cwd=tmp_path)
    data = json.loads(result.stdout)
    # zoo:mlp is Linear(16, 32), GELU, Linear(32, 8): each layer's weight and bias form a group, whose
    # gradient leaves the input path at the layer's addmm.
    assert [group["params"] for group in data["groups"]] == [["0.bias", "0.weight"], ["2.bias", "2.weight"]]
    for group, module in zip(data["groups"], ["0", "2"], strict=True):
        (intermediate,) = group["intermediates"]
        assert intermediate["op"] == "addmm" and intermediate["module"] == module
        assert group["flags"] == []
    assert data["unused_params"] == [] and data["stage_inputs"] == ["0"]

    run_ok("groups_to_json.py", "zoo:mlp", "-o", "groups.json", cwd=tmp_path)
    assert json.loads((tmp_path / "groups.json").read_text()) == data


@pytest.mark.slow
def test_verify_custom_model_checks_both_dtypes_and_works_as_a_spec(tmp_path: Path) -> None:
    result = run_ok("verify_custom_model.py", cwd=tmp_path)
    assert result.stdout.count("OK: all 8 gradients match") == 2
    for flag in ("shared-parameter", "custom-function", "parameter-only-output"):
        assert flag in result.stdout

    command = [
        sys.executable,
        "-m",
        "graphkit",
        "verify",
        f"{EXAMPLES / 'verify_custom_model.py'}:make_stage",
    ]
    cli = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert "OK: all 8 gradients match" in cli.stdout


@pytest.mark.slow
def test_two_stage_loop_runs_w_after_b_and_fails_when_a_w_is_left_out(tmp_path: Path) -> None:
    result = run_ok("two_stage_zero_bubble.py", "--microbatches", "3", cwd=tmp_path)
    assert "all 12 parameter gradients match the full backward" in result.stdout
    rows = re.findall(r"stage (\d): (.*)", result.stdout.split("1F1B")[0])
    for _, row in rows:
        cells = row.split()
        for microbatch in range(3):  # each microbatch: F, then B, then W, on every stage
            assert (
                cells.index(f"F{microbatch}") < cells.index(f"B{microbatch}") < cells.index(f"W{microbatch}")
            )
    assert len(rows) == 2

    broken = run("two_stage_zero_bubble.py", "--microbatches", "3", "--skip-weight", "1", "2", cwd=tmp_path)
    assert broken.returncode == 1
    assert "parameter gradients differ from the full backward" in broken.stdout
    assert "stage 1 head.weight" in broken.stdout and "stage 0" not in broken.stdout.split("differ")[1]


@pytest.mark.slow
def test_zero_bubble_torchrun_trains_on_two_gloo_ranks(tmp_path: Path) -> None:
    from graphkit.pipelining.launcher import free_port

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--nnodes",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(EXAMPLES / "zero_bubble_torchrun.py"),
        "--steps",
        "3",
    ]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(value) for value in re.findall(r"step \d: loss ([0-9.]+)", result.stdout)]
    assert len(losses) == 3 and losses[2] < losses[0]
    assert "rank 1: stages [1, 2] ran 24 I, 24 W " in result.stdout
    assert "and 0 B (full backward)" in result.stdout
    for rank in (0, 1):  # 12 parameters x 4 microbatches x 3 steps: DDP would average every gradient
        assert f"rank {rank}: post-accumulate-grad hooks fired 144 of 144 times" in result.stdout


def test_torchtitan_train_installs_graphkit_into_torchtitan_or_says_what_to_install(tmp_path: Path) -> None:
    result = run("torchtitan_train.py", "--only-install", cwd=tmp_path)
    try:
        import torchtitan  # noqa: F401
    except ImportError:
        assert result.returncode == 1, result.stdout
        assert "pip install --no-deps torchtitan==0.3.0" in result.stderr
        assert "Traceback" not in result.stderr
        return
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("graphkit on torchtitan")]
    assert line.startswith("graphkit on torchtitan 0.3.0: ")
    assert "graphkit.pipelining.PipelineStage" in line and "graphkit_split_eager" in line
