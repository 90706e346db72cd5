"""Honest FLOPs: the kernels ``FlopCounterMode`` does not see (a fused LSTM, a custom Function) are listed as
not counted; an LSTM's are estimated from shapes, and a custom Function makes the totals partial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphkit.analysis.uncounted_flops import flop_coverage, rnn_backward_flops
from graphkit.cli import main
from graphkit.graph.tracing import trace


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


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
