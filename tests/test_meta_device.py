"""The meta device: the graph, groups and saved bytes of a CPU run without values; ``inspect`` counts FLOPs
from shapes and does not verify, ``verify`` refuses, a forward that reads values says so, and a stage of
Llama 3 8B's size uses no memory for its weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from graphkit.analysis.parameter_groups import param_groups
from graphkit.cli import main
from graphkit.graph.tracing import trace
from graphkit.models.specs import load_spec_on, spec_inputs_as_call

LLAMA = "hf:llama?stage=middle&n_layer=2&seq=16"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_meta_device_gives_the_graph_groups_and_saved_bytes_of_a_cpu_run() -> None:
    module, inputs = load_spec_on(LLAMA, "meta")
    assert all(parameter.is_meta for parameter in module.parameters())
    args, kwargs = spec_inputs_as_call(inputs)
    _, meta_graph = trace(module, *args, **kwargs)
    module, inputs = load_spec_on(LLAMA, "cpu")
    args, kwargs = spec_inputs_as_call(inputs)
    _, cpu_graph = trace(module, *args, **kwargs)
    # the same ops, except that a reshape of a meta tensor is recorded as a view with another Node class
    alias = {"ReshapeAliasBackward0": "ViewBackward0"}
    assert [alias.get(data["name"], data["name"]) for _, data in meta_graph.nodes(data=True)] == [
        alias.get(data["name"], data["name"]) for _, data in cpu_graph.nodes(data=True)
    ]
    assert list(meta_graph.edges) == list(cpu_graph.edges)
    assert meta_graph.graph["saved_bytes_total"] == cpu_graph.graph["saved_bytes_total"] > 0
    assert [group.params for group in param_groups(meta_graph)] == [
        group.params for group in param_groups(cpu_graph)
    ]


def test_inspect_on_meta_counts_flops_from_shapes_and_does_not_verify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = run(capsys, "inspect", LLAMA, "--device", "meta", "-o", str(tmp_path / "meta"))
    meta = json.loads((tmp_path / "meta" / "report.json").read_text())
    assert status == 0 and meta["verify"] is None and meta["summary"]["verdict"] == "NOT RUN"
    assert "needs real values" in " ".join(out.split())
    status, _, _ = run(capsys, "inspect", LLAMA, "-o", str(tmp_path / "cpu"))
    cpu = json.loads((tmp_path / "cpu" / "report.json").read_text())
    assert meta["flops"]["counted"] == cpu["flops"]["counted"]  # FLOPs follow from shapes alone
    assert meta["summary"]["saved_bytes_total"] == cpu["summary"]["saved_bytes_total"]
    assert len(meta["groups"]) == len(cpu["groups"])
    assert "NOT VERIFIED" in (tmp_path / "meta" / "index.html").read_text()


def test_verify_on_meta_says_it_needs_values(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "verify", "zoo:mlp", "--device", "meta")
    assert status == 2 and "no values" in err and "--device meta" in err


def test_a_llama_3_8b_sized_stage_on_meta_uses_no_memory_for_its_weights(capsys, tmp_path: Path) -> None:
    spec = (
        "hf:llama?stage=middle&hidden_size=4096&intermediate_size=14336&num_attention_heads=32"
        "&num_key_value_heads=8&n_layer=1&seq=2048&batch=1"
    )
    status, _, _ = run(capsys, "render", spec, "--device", "meta", "-o", str(tmp_path / "llama.dot"))
    assert status == 0
    module, inputs = load_spec_on(spec, "meta")
    values = sum(parameter.numel() for parameter in module.parameters())
    assert values == 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096  # one decoder layer
    args, kwargs = spec_inputs_as_call(inputs)
    _, graph = trace(module, *args, **kwargs)
    hidden = math.prod((1, 2048, 4096)) * 4
    assert graph.graph["saved_bytes_total"] > 10 * hidden  # the activations a real run would keep


def test_a_forward_that_reads_values_on_meta_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = run(
        capsys, "render", "hf:gpt2?n_layer=1", "--device", "meta", "-o", str(tmp_path / "g.dot")
    )
    assert status == 2 and "reads tensor values" in err and "stage=middle" in err


MASKED_WRITE = f"{Path(__file__).parent / 'specs' / 'broken_forward.py'}:make_masked_write"


def test_a_backward_that_cannot_run_on_meta_is_one_line_with_exit_2_and_render_still_draws(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # y[mask] = row: the forward runs on meta; the row's gradient, grad[mask], needs PyTorch's meta nonzero
    status, out, err = run(
        capsys, "inspect", MASKED_WRITE, "--device", "meta", "-o", str(tmp_path / "report")
    )
    assert status == 2, (out, err)
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert line.startswith(
        f"graphkit inspect: error: the backward of {MASKED_WRITE!r} cannot run on the meta"
    )
    assert "nonzero" in line and "graphkit render --device meta" in line and "Traceback" not in err
    status, _, _ = run(capsys, "render", MASKED_WRITE, "--device", "meta", "-o", str(tmp_path / "g.dot"))
    assert status == 0 and (tmp_path / "g.dot").read_text().count("->") > 3
    status, _, _ = run(capsys, "inspect", MASKED_WRITE, "-o", str(tmp_path / "cpu"))
    assert status == 0, "on cpu the same model inspects and verifies"
