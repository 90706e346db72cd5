"""graphkit.integrations.torchtitan against torchtitan's own code (torchtitan 0.3.0, in the newest-torch
environment that scripts/test_newest_torch.sh sets up): install() and what it patches, pinned by contract
tests, and torchtitan's llama3 debugmodel through its pipeline_llm on 2 gloo ranks, ZBV, against a full
backward of the unsplit model. Skipped, with the reason, where torchtitan is not installed; the refusal
without torchtitan runs everywhere."""

from __future__ import annotations

import logging
import sys

import pytest

from graphkit.integrations import torchtitan as graphkit_torchtitan
from graphkit.integrations.torchtitan import SUPPORTED_TORCHTITAN, TorchtitanIntegrationError

try:
    import torchtitan  # noqa: F401
except ImportError:
    HAS_TORCHTITAN = False
else:
    HAS_TORCHTITAN = True

needs_torchtitan = pytest.mark.skipif(
    not HAS_TORCHTITAN,
    reason=f"torchtitan is not installed here (scripts/test_newest_torch.sh installs torchtitan "
    f"{SUPPORTED_TORCHTITAN} into .venv-newest)",
)


@pytest.fixture
def uninstalled():
    """Each test starts and ends with torchtitan's own names in place."""
    graphkit_torchtitan.uninstall()
    yield
    graphkit_torchtitan.uninstall()


def test_install_without_torchtitan_says_what_to_install(monkeypatch, uninstalled):
    monkeypatch.setitem(sys.modules, "torchtitan", None)  # import torchtitan raises ImportError
    with pytest.raises(
        TorchtitanIntegrationError, match=f"pip install --no-deps torchtitan=={SUPPORTED_TORCHTITAN}"
    ):
        graphkit_torchtitan.install()
    assert graphkit_torchtitan.installed() is None


# -- contract: what install() patches, in torchtitan's release ------------------------------------------


@needs_torchtitan
def test_contract_torchtitan_release_is_the_supported_one():
    import torchtitan

    assert torchtitan.__version__ == SUPPORTED_TORCHTITAN, (
        f"torchtitan {torchtitan.__version__} is installed; graphkit.integrations.torchtitan is tested with "
        f"{SUPPORTED_TORCHTITAN}: rerun these contract tests and update SUPPORTED_TORCHTITAN"
    )


@needs_torchtitan
def test_contract_torchtitan_builds_stages_and_chooses_backends_by_module_level_names():
    import torchtitan.distributed.compile as compile_module
    import torchtitan.distributed.pipeline_parallel as pipeline_module
    from torch.distributed.pipelining import PipelineStage as TorchPipelineStage

    assert pipeline_module.PipelineStage is TorchPipelineStage
    assert "PipelineStage" in pipeline_module._pipeline_module_split.__code__.co_names
    assert "_pipeline_module_split" in pipeline_module.pipeline_llm.__code__.co_names
    assert "_maybe_regional_inductor_backend" in compile_module.apply_compile.__code__.co_names


@needs_torchtitan
def test_contract_torchtitan_refuses_other_backends_on_flex_models_without_install(uninstalled):
    """The refusal install() lifts for graphkit's backends (torchtitan's _maybe_regional_inductor_backend)."""
    from torchtitan.distributed.compile import _maybe_regional_inductor_backend

    flex_model = _flex_model()
    with pytest.raises(ValueError, match="neither 'inductor' nor 'aot_eager'"):
        _maybe_regional_inductor_backend(flex_model, "graphkit_split")
    assert _maybe_regional_inductor_backend(flex_model, "inductor") == "inductor"


def _flex_model():
    import torch
    from torchtitan.models.llama3 import model_registry

    with torch.device("meta"):
        return model_registry("debugmodel", attn_backend="flex").model.build()


# -- install() -------------------------------------------------------------------------------------------


@needs_torchtitan
def test_install_patches_both_names_logs_one_line_and_is_idempotent(caplog, uninstalled):
    import torchtitan.distributed.compile as compile_module
    import torchtitan.distributed.pipeline_parallel as pipeline_module
    from torch.distributed.pipelining import PipelineStage as TorchPipelineStage

    from graphkit.pipelining import PipelineStage

    original_chooser = compile_module._maybe_regional_inductor_backend
    caplog.set_level(logging.INFO)
    installation = graphkit_torchtitan.install()
    lines = [record.getMessage() for record in caplog.records if "graphkit" in record.getMessage()]
    assert lines == [installation.summary]
    assert installation.summary.startswith(f"graphkit on torchtitan {SUPPORTED_TORCHTITAN}: ")
    assert "graphkit.pipelining.PipelineStage" in lines[0] and "graphkit_split_eager" in lines[0]
    assert pipeline_module.PipelineStage is PipelineStage

    flex_model = _flex_model()
    for backend in ("graphkit_split", "graphkit_split_eager"):
        assert compile_module._maybe_regional_inductor_backend(flex_model, backend) == backend
    assert compile_module._maybe_regional_inductor_backend(flex_model, "inductor") == "inductor"
    with pytest.raises(ValueError, match="neither 'inductor' nor 'aot_eager'"):  # others: torchtitan's answer
        compile_module._maybe_regional_inductor_backend(flex_model, "eager")
    import torch._dynamo

    assert {"graphkit_split", "graphkit_split_eager"} <= set(torch._dynamo.list_backends(exclude_tags=()))

    caplog.clear()
    assert graphkit_torchtitan.install() is installation
    assert not [record for record in caplog.records if "graphkit" in record.getMessage()]
    assert pipeline_module.PipelineStage is PipelineStage

    graphkit_torchtitan.uninstall()
    assert pipeline_module.PipelineStage is TorchPipelineStage
    assert compile_module._maybe_regional_inductor_backend is original_chooser
    assert graphkit_torchtitan.installed() is None


@needs_torchtitan
def test_install_refuses_a_torchtitan_that_lacks_what_it_patches(monkeypatch, uninstalled):
    import torchtitan
    import torchtitan.distributed.compile as compile_module
    import torchtitan.distributed.pipeline_parallel as pipeline_module

    monkeypatch.setattr(torchtitan, "__version__", "0.9.9", raising=False)
    monkeypatch.delattr(compile_module, "_maybe_regional_inductor_backend")
    with pytest.raises(TorchtitanIntegrationError) as refusal:
        graphkit_torchtitan.install()
    message = str(refusal.value)
    assert f"supports torchtitan {SUPPORTED_TORCHTITAN}" in message
    assert "installed torchtitan 0.9.9 lacks" in message
    assert "torchtitan.distributed.compile._maybe_regional_inductor_backend" in message
    assert graphkit_torchtitan.installed() is None
    assert pipeline_module.PipelineStage.__module__.startswith("torch.")  # nothing half-installed


# -- torchtitan's debugmodel through pipeline_llm on 2 gloo ranks ------------------------------------------


def _run(cases, deadline: float = 500):
    from torchtitan_pipelines import gradient_check_rank

    from graphkit.pipelining.launcher import run_on_processes

    return run_on_processes(gradient_check_rank, (cases,), world_size=2, deadline=deadline, group_timeout=300)


@needs_torchtitan
@pytest.mark.slow
def test_torchtitans_debugmodel_under_zbv_with_graphkits_stage_matches_a_full_backward_on_two_gloo_ranks():
    """Eager (SDPA, FlexAttention), blocks compiled in place by torchtitan's apply_compile with graphkit's
    backends (and with aot_eager, where PyTorch's stage crashes), blocks wrapped by torch.compile
    (OptimizedModule), and parallelize_llama (FSDP2, float32)."""
    from torchtitan_pipelines import TitanCase

    cases = [
        TitanCase(attention="sdpa"),
        TitanCase(attention="flex"),
        TitanCase(attention="sdpa", compile="aot_eager"),  # not split: each block's backward runs whole in I
        TitanCase(attention="sdpa", compile="graphkit_split_eager"),
        TitanCase(attention="sdpa", compile="graphkit_split"),
        TitanCase(attention="flex", compile="graphkit_split_eager"),
        TitanCase(attention="sdpa", compile="wrapper:graphkit_split_eager"),
        TitanCase(attention="flex", fsdp=True),
    ]
    per_rank = _run(cases)
    for rank, results in enumerate(per_rank):
        for case, result in zip(cases, results, strict=True):
            assert not result["missing"], (rank, result)
            assert result["input"] > 0 and result["weight"] > 0, (rank, result)  # graphkit's I and W ran
            if (
                case.compile in (None, "graphkit_split_eager", "wrapper:graphkit_split_eager")
                and not case.fsdp
            ):
                assert result["max_relative_error"] == 0.0, (rank, result)  # bit for bit
            else:  # inductor's kernels, FSDP2's reduce: float32 rounding
                assert result["max_relative_error"] < 1e-5, (rank, result)
            if case.compile and "graphkit" in case.compile:
                assert result["unsplit_regions"] == [], (rank, result)  # every compiled block split, flex too


@needs_torchtitan
@pytest.mark.slow
def test_the_debugmodel_pipeline_spec_is_exact_under_zbv_in_one_process():
    """tests/torchtitan_pipelines.py:debugmodel_pipeline, the spec graphkit plan and the pipeline commands take."""
    from pathlib import Path

    from graphkit.pipelining import PipelineCase, verify_cases

    spec = f"{Path(__file__).resolve().parent / 'torchtitan_pipelines.py'}:debugmodel_pipeline"
    (result,) = verify_cases([PipelineCase(spec, "ZBVZeroBubble", 4)], ranks=1)
    assert result.ok, result.table()
    assert result.max_relative_error == 0.0
    assert result.backward_calls["input"] > 0 and result.backward_calls["weight"] > 0
