"""Real-model scale: folding repeated structure, the layout time budget, render's options and progress,
``graphkit list``, honest FLOPs and the meta device."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphkit.analysis.parameter_groups import param_groups
from graphkit.analysis.uncounted_flops import flop_coverage, rnn_backward_flops
from graphkit.cli import main
from graphkit.drawing import rendering
from graphkit.drawing.diagram import draw
from graphkit.drawing.folding import folded_node_count, repeat_keys
from graphkit.drawing.rendering import RenderTimeoutError, drawn_nodes, render
from graphkit.graph.autograd_graph import AutogradGraph, capture
from graphkit.graph.tracing import trace
from graphkit.models import zoo
from graphkit.models.huggingface import KNOWN_ARCHITECTURES
from graphkit.models.specs import load_spec_on, spec_inputs_as_call

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale_models import Recurrence  # noqa: E402

RECURRENCE = f"{Path(__file__).resolve().parent.parent / 'bench' / 'scale_models.py'}:recurrence"
LLAMA = "hf:llama?stage=middle&n_layer=2&seq=16"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def recurrence_graph(steps: int) -> AutogradGraph:
    torch.manual_seed(0)
    return trace(Recurrence(steps), torch.randn(2, 16, requires_grad=True))[1]


# --- folding ------------------------------------------------------------------------------------------
def test_a_long_recurrence_folds_into_one_node_per_repeated_op() -> None:
    steps = 1500
    graph = recurrence_graph(steps)
    assert graph.number_of_nodes() == 4 * steps + 3  # add, tanh, addmm, t per step; weight, bias, input

    source = draw(graph).source  # past max_nodes, no module depth fits (every step is module "cell")
    assert "repeated structure folded" in source
    folds = {
        match.group(1): int(match.group(2)) for match in re.finditer(r"<b>(\w+) \u00d7(\d+)</b>", source)
    }
    assert set(folds) == {"add", "tanh", "addmm", "t"}
    drawn_ops = {
        op: sum(1 for line in source.split("\n") if re.search(rf"<b>{op}</b>", line)) for op in folds
    }
    for op, repeats in folds.items():  # every node drawn once: folded or on its own
        assert repeats + drawn_ops[op] == steps
    assert drawn_nodes(draw(graph)) < 30


def test_repeat_keys_tell_positions_apart_and_match_identical_blocks() -> None:
    module, (hidden,) = zoo.build("gpt_stage")
    graph = capture(module(hidden), inputs=[hidden], module=module)  # no module paths
    keys = repeat_keys(graph)
    by_name = {graph.nodes[node]["param_names"][0]: keys[node] for node in graph.parameter_nodes().values()}
    assert by_name["blocks.0.mlp.fc.weight"] == by_name["blocks.1.mlp.fc.weight"]
    assert by_name["blocks.0.mlp.fc.weight"] != by_name["blocks.0.mlp.proj.weight"]
    # the two residual adds of a block compute the same op on the same shapes, at different positions
    adds = [node for node in graph.nodes if graph.nodes[node]["op"] == "add"]
    assert len({keys[node] for node in adds}) > 1
    folded = draw(graph, fold=True).source
    assert "blocks.*.mlp.fc.weight \u00d72" in folded
    assert folded_node_count(graph) < graph.number_of_nodes() * 0.7
    with pytest.raises(ValueError, match="rounds"):
        repeat_keys(graph, rounds=-1)


def test_fold_false_never_folds_and_fold_true_always_does() -> None:
    graph = recurrence_graph(30)
    assert "folded" not in draw(graph, fold=False, max_nodes=10).source
    assert "repeated structure folded" in draw(graph, fold=True, max_nodes=None).source


# --- the layout time budget ---------------------------------------------------------------------------
def test_a_layout_past_its_budget_draws_a_smaller_diagram_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = recurrence_graph(200)
    calls: list[int] = []
    real_run_dot = rendering.run_dot

    def slow_first(source: str, output_format: str, timeout_s: float, nodes: int, warn: Any = None) -> bytes:
        calls.append(nodes)
        if len(calls) == 1:
            raise RenderTimeoutError(f"Graphviz 'dot' did not finish laying out {nodes} nodes")
        return real_run_dot(source, output_format, timeout_s, nodes)

    monkeypatch.setattr(rendering, "run_dot", slow_first)
    said: list[str] = []
    path = render(
        graph, tmp_path / "deep" / "er" / "graph.svg", timeout_s=5, progress=said.append, fold=False
    )
    assert path.exists() and len(calls) == 2 and calls[1] < calls[0]
    svg = path.read_text()
    assert "did not lay out" in svg and "folded" in svg
    assert any("laying out" in line for line in said) and any("drawn with repeated" in line for line in said)
    assert not any("Graphviz missing" in line or "not installed" in line for line in said)


def test_a_png_past_graphviz_size_limit_says_it_was_shrunk() -> None:
    said: list[str] = []
    chain = "digraph { " + "; ".join(f"n{i} -> n{i + 1}" for i in range(1200)) + " }"
    png = rendering.run_dot(chain, "png", 60, 1201, said.append)
    assert png[:4] == b"\x89PNG" and any("shrank the picture" in line and ".svg" in line for line in said)


def test_a_timeout_in_inspect_is_reported_as_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphkit.apps.report.inspection import collect
    from graphkit.apps.report.terminal import terminal_rows

    def always_slow(source: str, output_format: str, timeout_s: float, nodes: int, warn: Any = None) -> bytes:
        raise RenderTimeoutError(
            f"Graphviz 'dot' did not finish laying out {nodes} nodes within {timeout_s} s"
        )

    monkeypatch.setattr(rendering, "run_dot", always_slow)
    inspection = collect("zoo:mlp", timeout_s=1)
    assert inspection.svg is None and "did not finish" in inspection.diagram_note
    (diagram,) = [value for label, value in terminal_rows(inspection, tmp_path) if label == "diagram"]
    assert "time budget" in diagram and "Graphviz missing" not in diagram


# --- render's options, progress, folders; list --------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "present", "absent"),
    [
        ((), ["cluster_group_0", "parameter groups", "rankdir=BT", "(2, 8, 32)"], ["graphkit-highlight"]),
        (("--plain",), [], ["cluster_group_0"]),
        (("--highlight", "2"), ["graphkit-highlight", "graphkit-faded"], []),
        (("--saved",), ["saved "], []),
        (("--module-paths",), ["blocks.0.attn.qkv"], []),
        (("--no-shapes",), [], ["(2, 8, 32)"]),
        (("--direction", "LR"), ["rankdir=LR"], ["rankdir=BT"]),
        (("--legend", "off"), ["cluster_group_0"], ["parameter groups"]),
        (("--collapse", "2", "--title", "my stage"), ["module.blocks.0", "my stage"], []),
    ],
)
def test_render_options_match_the_python_api(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, options: tuple[str, ...], present: list, absent: list
) -> None:
    output = tmp_path / "new" / "folder" / "graph.dot"
    status, out, err = run(capsys, "render", "zoo:gpt_stage", "-o", str(output), *options)
    assert status == 0 and output.exists() and f"wrote {output}" in out
    assert "loading zoo:gpt_stage" in err and "captured 125 nodes" in err
    source = output.read_text()
    for text in present:
        assert text in source, text
    for text in absent:
        assert text not in source, text


def test_render_svg_reports_progress_and_folds_a_recurrence(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    output = tmp_path / "out" / "recurrence.svg"
    status, _, err = run(capsys, "render", RECURRENCE, "-o", str(output), "--max-nodes", "300")
    assert status == 0
    assert "captured 6003 nodes" in err and re.search(r"laying out \d\d? nodes", err)
    assert "repeated structure folded" in output.read_text()


def test_render_rejects_highlight_without_groups(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run(
        capsys, "render", "zoo:mlp", "-o", str(tmp_path / "x.dot"), "--plain", "--highlight", "0"
    )
    assert status == 2 and "--highlight needs the groups" in err


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


# --- honest FLOPs -------------------------------------------------------------------------------------
class _UnrolledLSTM(nn.Module):
    """The same LSTM layer as ``nn.LSTM`` (one layer, one direction), written with ``mm``: countable."""

    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        self.lstm = lstm

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (T, B, I)
        hidden = self.lstm.hidden_size
        h = self.h0 = x.new_zeros(x.shape[1], hidden).requires_grad_()  # the kernel's backward makes dh0 too
        c = x.new_zeros(x.shape[1], hidden)
        outputs = []
        for step in x:
            gates = step.mm(self.lstm.weight_ih_l0.t()) + h.mm(self.lstm.weight_hh_l0.t())
            gates = gates + self.lstm.bias_ih_l0 + self.lstm.bias_hh_l0
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs)


def test_lstm_backward_flops_from_shapes_equal_flop_counter_on_the_same_lstm_written_with_mm() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(6, 5)
    x = torch.randn(7, 3, 6, requires_grad=True)
    graph = trace(lstm, x)[1]
    coverage = flop_coverage(graph)
    (kernel,) = coverage.not_counted
    assert kernel.op == "mkldnn_rnn_layer" and kernel.kind == "rnn" and not coverage.partial

    unrolled = _UnrolledLSTM(lstm)
    output = unrolled(x)
    leaves = [x, unrolled.h0, lstm.weight_ih_l0, lstm.weight_hh_l0]
    with FlopCounterMode(display=False) as counter:
        torch.autograd.grad(output, leaves, torch.ones_like(output))
    assert kernel.estimated["full"] == counter.get_total_flops()
    assert kernel.estimated["b"] == kernel.estimated["w"] == counter.get_total_flops() // 2
    assert rnn_backward_flops({"saved_tensors": []}) is None


def test_a_custom_function_is_listed_as_not_counted_and_the_totals_partial(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, _ = run(capsys, "inspect", "zoo:custom_function", "-o", str(tmp_path / "report"))
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    flops = report["flops"]
    assert status == 0 and flops["partial"] is True
    (item,) = flops["not_counted"]
    assert item["op"] == "MatmulTanh" and item["kind"] == "custom" and item["estimated"] is None
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Partial totals" in page and "MatmulTanh" in page


def test_inspect_of_an_lstm_counts_it_from_shapes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, _ = run(capsys, "inspect", "zoo:lstm", "-o", str(tmp_path / "report"))
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    flops = report["flops"]
    assert status == 0 and flops["partial"] is False
    assert flops["counted"]["full"] == 0  # FlopCounterMode sees nothing in the fused kernel
    assert flops["total"]["full"] == flops["estimated_from_shapes"]["full"] > 0
    assert report["summary"]["flops"] == flops
    assert "estimated from shapes (mkldnn_rnn_layer)" in " ".join(out.split())


# --- the meta device ----------------------------------------------------------------------------------
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
