"""verify_split on the zoo, on Hugging Face models built from configs, and on a deliberately broken model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphkit.models import zoo
from graphkit.models.specs import load_spec
from graphkit.split.verification import verify_split

BROKEN = f"{Path(__file__).parent / 'specs' / 'broken_split.py'}:build"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_models_verify(name, dtype):
    module, inputs = zoo.build(name)
    report = verify_split(module, inputs, dtype=dtype)
    assert report.ok, report.table()
    assert report.params, "every zoo model has parameters"
    if name != "custom_function":
        assert report.flops["b"] + report.flops["w"] == report.flops["full"]


HF_SPECS = [
    "hf:gpt2",  # whole model: tied LM head, stage 0
    "hf:gpt2?stage=middle",
    "hf:llama?stage=middle",
    "hf:bert",
    "hf:mixtral?stage=middle",  # MoE
    "hf:t5",  # shared relative position bias and tied embeddings
]


@pytest.mark.parametrize("spec", HF_SPECS)
def test_transformers_models_verify_in_float64(spec):
    pytest.importorskip("transformers")
    module, inputs = load_spec(spec)
    report = verify_split(module, inputs, dtype=torch.float64)
    assert report.ok, report.table()
    assert report.flops["b"] + report.flops["w"] == report.flops["full"]
    statuses = {check.status for check in report.params}
    assert statuses == {"ok"}


def test_report_dict_has_the_documented_keys():
    module, inputs = zoo.build("mlp")
    data = verify_split(module, inputs).to_dict()
    assert {"ok", "inputs", "params", "flops", "groups"} <= set(data)
    assert set(data["flops"]) == {"full", "b", "w"}
    for entry in data["inputs"] + data["params"]:
        assert set(entry) == {"name", "status", "max_abs_err", "max_rel_err"}
    assert data["groups"] == 2


def test_a_wrong_weight_gradient_fails_and_names_the_parameter():
    module, inputs = load_spec(BROKEN)
    report = verify_split(module, inputs, dtype=torch.float64)
    assert not report.ok
    assert [check.name for check in report.failures] == ["weight"]
    assert report.failures[0].status == "wrong"
    assert report.failures[0].max_rel_err == pytest.approx(1.0)
    assert "FAILED" in report.table() and "weight" in report._repr_html_()


def test_verify_leaves_the_users_module_untouched():
    module, inputs = zoo.build("mlp")
    before = {name: parameter.detach().clone() for name, parameter in module.named_parameters()}
    verify_split(module, inputs, dtype=torch.float64)
    for name, parameter in module.named_parameters():
        assert parameter.grad is None and parameter.dtype == torch.float32
        assert torch.equal(parameter, before[name])


def test_verify_handles_activation_checkpointing_even_when_flops_cannot_be_counted():
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    torch.manual_seed(0)
    report = verify_split(Checkpointed(), (torch.randn(3, 4, requires_grad=True),), dtype=torch.float64)
    assert report.ok, report.table()
    assert report.flops["full"] > 0
    if report.flops["b"] < 0:  # PyTorch refused FlopCounterMode during the recomputation
        assert "not counted" in report.extra["flops_note"] and "not counted" in report.table()
    else:
        assert report.flops["b"] + report.flops["w"] >= report.flops["full"]
