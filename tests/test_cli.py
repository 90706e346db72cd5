"""The graphkit command: outputs, JSON forms and exit statuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from graphkit.analysis.parameter_groups import param_groups
from graphkit.cli import main
from graphkit.graph.tracing import trace
from graphkit.models import zoo

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
    "command", ["capture", "groups", "verify", "render", "inspect", "bench", "verify-pipeline"]
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
