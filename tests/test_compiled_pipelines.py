"""Pipelines of compiled blocks: the compile= key of pipeline specs, and graphkit's PipelineStage running blocks
compiled with graphkit.splitting_backend() exactly (bit for bit against a full backward) under the zero-bubble
schedules, over 2 gloo ranks."""

from __future__ import annotations

import collections

import pytest
import torch

from graphkit.models.compiling import split_compile_key
from graphkit.models.pipeline_specs import load_pipeline_spec
from graphkit.models.specs import SpecError
from graphkit.pipelining.verification import PipelineCase, verify_cases

MLP = "zoo-pipeline:mlp?compile=split-eager"
GPT2 = "hf:gpt2?n_layer=4&compile=split-eager"


def _node_classes(output: torch.Tensor) -> collections.Counter:
    found: collections.Counter = collections.Counter()
    stack, seen = [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        found[type(node).__name__] += 1
        stack.extend(producer for producer, _ in node.next_functions)
    return found


def test_the_compile_key_is_taken_out_of_the_spec_and_checked():
    assert split_compile_key("hf:gpt2?n_layer=4&compile=split&seq=8") == ("hf:gpt2?n_layer=4&seq=8", "split")
    assert split_compile_key("zoo-pipeline:mlp?compile=aot_eager") == ("zoo-pipeline:mlp", "aot_eager")
    assert split_compile_key("zoo-pipeline:mlp") == ("zoo-pipeline:mlp", None)
    with pytest.raises(SpecError, match="compile='fast'; it takes one of split"):
        load_pipeline_spec("zoo-pipeline:mlp?compile=fast", num_stages=2, batch_size=4)
    with pytest.raises(SpecError, match="given twice"):
        split_compile_key("hf:gpt2?compile=split&compile=split")


@pytest.mark.parametrize(("spec", "regions_per_stage"), [(MLP, 1), (GPT2, 2)])
def test_each_block_of_each_stage_becomes_a_split_region(spec: str, regions_per_stage: int):
    torch._dynamo.reset()
    model = load_pipeline_spec(spec, num_stages=2, batch_size=4, seed=0)
    arguments = model.inputs
    for stage in model.stages:
        output = stage(*arguments)
        assert _node_classes(output)["SplitRegionFunctionBackward"] == regions_per_stage
        arguments = (output.detach().requires_grad_(),)


def test_compiled_blocks_are_exact_in_graphkits_pipeline_stage_in_one_process():
    results = verify_cases([PipelineCase(MLP, "ZBVZeroBubble", 4, 1)], ranks=1)
    assert results[0].ok, results[0].table()
    assert results[0].max_relative_error == 0.0


@pytest.mark.slow
def test_compiled_blocks_are_exact_under_the_zero_bubble_schedules_on_two_gloo_ranks():
    # the MLP's stages have every parameter inside their compiled blocks: B runs without a walk there
    schedules = ("ZBVZeroBubble", "InterleavedZeroBubble", "DualPipeV", "ZBH1", "ZBH2", "CostAware")
    cases = [PipelineCase(MLP, schedule, 4, 1) for schedule in schedules]
    cases.append(PipelineCase(GPT2, "ZBVZeroBubble", 4, 1))
    results = verify_cases(cases, ranks=2, deadline=400)
    for result in results:
        assert result.ok, (result.case.schedule, result.error, result.table())
        assert result.ranks == 2 and result.max_relative_error == 0.0
        assert result.backward_calls["input"] > 0 and result.backward_calls["weight"] > 0


@pytest.mark.slow
def test_compiled_blocks_with_ddp_average_like_a_full_backward_on_two_gloo_ranks():
    (result,) = verify_cases(
        [PipelineCase(MLP, "ZBVZeroBubble", 4, 2, data_parallel="ddp")], ranks=2, deadline=400
    )
    assert result.ok, (result.error, result.table())
    assert result.max_relative_error < 1e-12


def test_compile_blocks_splits_blocks_of_pytorchs_own_classes_too():
    """nn.Module.compile leaves an nn.Sequential of torch.nn layers, or an nn.TransformerEncoderLayer, eager
    (dynamo skips the torch.nn frames): compile_blocks compiles their forward instead, in place."""
    from graphkit.models.compiling import compile_blocks
    from graphkit.split import backward_input, backward_weight

    torch.manual_seed(0)
    sequential = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    encoder = torch.nn.Sequential()
    encoder.layers = torch.nn.ModuleList(
        [torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True) for _ in range(2)]
    )
    encoder.forward = lambda x: encoder.layers[1](encoder.layers[0](x))
    for stage, shape in ((sequential, (4, 8)), (encoder, (2, 3, 8))):
        reference = {name: p.detach().clone() for name, p in stage.named_parameters()}
        x = torch.randn(shape, dtype=torch.float32)
        eager_x = x.clone().requires_grad_()
        stage(eager_x).sum().backward()
        expected = {name: p.grad.clone() for name, p in stage.named_parameters()}
        stage.zero_grad(set_to_none=True)
        compile_blocks([stage], "split-eager")
        assert {name: p.detach() for name, p in stage.named_parameters()}.keys() == reference.keys()
        split_x = x.clone().requires_grad_()
        output = stage(split_x)
        assert _node_classes(output)["SplitRegionFunctionBackward"] >= 1, _node_classes(output)
        state = backward_input(output, torch.ones_like(output), inputs=[split_x])
        backward_weight(state)
        torch.testing.assert_close(
            split_x.grad if split_x.grad is not None else state.input_grads[0], eager_x.grad
        )
        for name, parameter in stage.named_parameters():
            torch.testing.assert_close(parameter.grad, expected[name], rtol=1e-5, atol=1e-6)
