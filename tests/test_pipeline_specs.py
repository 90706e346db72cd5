"""The one pipeline spec format: built-in, file, hf:gpt2 and hf:llama pipelines, the microbatches a batch splits into,
model specs to ``graphkit costs``, the stage counts the schedule commands ask for, and clear SpecErrors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from cli_commands import commands_taking_pipeline_spec  # tests/cli_commands.py, beside this file
from torch import nn

from graphkit.cli import main
from graphkit.measure.costs import spec_costs
from graphkit.models.pipeline_specs import (
    DEFAULT_MICROBATCH_SIZE,
    PipelineModel,
    load_pipeline_spec,
    load_stage_or_pipeline,
)
from graphkit.models.specs import SpecError

PIPELINE_FILE = """
import torch
from torch import nn

CALLS = []


def make(num_stages, batch_size):
    CALLS.append((num_stages, batch_size))
    stages = [nn.Sequential(nn.Linear(3, 3), nn.Tanh()) for _ in range(num_stages)]
    return stages, lambda output, target: ((output - target) ** 2).sum(), (torch.randn(batch_size, 3),), torch.randn(batch_size, 3)


def fixed():
    return [nn.Linear(3, 3), nn.Linear(3, 3)], lambda output, target: output.sum(), (torch.randn(6, 3),), None


def needs_more(num_stages, width):
    raise AssertionError("never called")


def not_a_pipeline():
    return {"stages": []}


def raises(num_stages):
    raise RuntimeError("no GPU here")


def model():
    return nn.Linear(3, 2), (torch.randn(4, 3, requires_grad=True),)
"""


@pytest.fixture
def pipeline_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_pipeline.py"
    path.write_text(PIPELINE_FILE)
    return path


def run_stages(stages: list[nn.Module], inputs: tuple) -> torch.Tensor:
    values = inputs
    for stage in stages:
        output = stage(*values)
        values = output if isinstance(output, tuple) else (output,)
    return values[0]


def test_builtin_pipelines_take_num_stages_and_batch_size():
    model = load_pipeline_spec("zoo-pipeline:mlp", num_stages=3, batch_size=12)
    assert isinstance(model, PipelineModel) and len(model.stages) == 3
    assert model.inputs[0].shape == (12, 64) and model.target.shape == (12,)
    default = load_pipeline_spec("zoo-pipeline:mlp")  # the function's own defaults
    assert len(default.stages) == 4 and default.batch_size == 32
    wide = load_pipeline_spec("zoo-pipeline:mlp_wide", num_stages=2, batch_size=4)
    assert wide.stages[0].up.weight.shape == (2048, 512)
    again = load_pipeline_spec("zoo-pipeline:mlp", num_stages=3, batch_size=12)
    assert all(torch.equal(a, b) for a, b in zip(model.inputs, again.inputs, strict=True))  # seeded
    with pytest.raises(SpecError, match="unknown built-in pipeline 'nope'.*known: mlp, mlp_wide"):
        load_pipeline_spec("zoo-pipeline:nope")


def test_a_file_function_gets_the_num_stages_and_batch_size_it_declares(pipeline_file: Path):
    model = load_pipeline_spec(f"{pipeline_file}:make", num_stages=4, batch_size=10, seed=0)
    assert len(model.stages) == 4 and model.inputs[0].shape == (10, 3) and model.target.shape == (10, 3)
    again = load_pipeline_spec(f"{pipeline_file}:make", num_stages=4, batch_size=10, seed=0)
    assert torch.equal(model.stages[2][0].weight, again.stages[2][0].weight)  # the seed makes ranks agree
    # no requirement from the caller, no default in the function: the module's fallbacks
    fallback = load_pipeline_spec(f"{pipeline_file}:make")
    assert len(fallback.stages) == 2 and fallback.batch_size == DEFAULT_MICROBATCH_SIZE
    fixed = load_pipeline_spec(f"{pipeline_file}:fixed", num_stages=2, batch_size=99)
    assert len(fixed.stages) == 2 and fixed.target is None and fixed.schedule_target().shape == (6,)


def test_the_batch_splits_into_microbatches_along_dimension_zero(pipeline_file: Path):
    model = load_pipeline_spec(f"{pipeline_file}:make", num_stages=2, batch_size=12, seed=0)
    parts = model.microbatches(4)
    assert [inputs[0].shape for inputs, _ in parts] == [(3, 3)] * 4
    assert torch.equal(torch.cat([inputs[0] for inputs, _ in parts]), model.inputs[0])
    assert torch.equal(torch.cat([target for _, target in parts]), model.target)
    inputs, target = model.microbatch(4, index=2)
    assert torch.equal(inputs[0], model.inputs[0][6:9]) and torch.equal(target, model.target[6:9])
    # a microbatch owns its storage (byte counts of saved tensors must not see the whole batch)
    assert inputs[0].untyped_storage().nbytes() == inputs[0].numel() * inputs[0].element_size()
    with pytest.raises(SpecError, match="does not split into 5 equal microbatches"):
        model.microbatches(5)


def test_hf_gpt2_is_cut_into_the_stages_asked_for():
    pytest.importorskip("transformers")
    model = load_pipeline_spec("hf:gpt2?n_layer=4&seq=6", num_stages=2, batch_size=3, seed=0)
    assert len(model.stages) == 2 and model.inputs[0].shape == (3, 6)
    logits = run_stages(model.stages, model.inputs)
    assert logits.shape == (3, 6, 128)
    assert model.loss_fn(logits, model.target).dim() == 0
    with pytest.raises(SpecError, match="cannot fill 4 stages"):
        load_pipeline_spec("hf:gpt2?n_layer=2", num_stages=4, batch_size=4)
    with pytest.raises(SpecError, match="unknown key 'depth'"):
        load_pipeline_spec("hf:gpt2?depth=2", num_stages=2, batch_size=4)


def full_llama(layers: int, *, tied: bool = False) -> nn.Module:
    """The unsplit LlamaForCausalLM that hf:llama's defaults describe, built from its own config under seed 0."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize(("num_stages", "layers_per_stage"), [(1, [4]), (2, [2, 2]), (4, [1, 1, 1, 1])])
def test_hf_llama_stages_compute_the_logits_and_loss_of_the_unsplit_model(
    num_stages: int, layers_per_stage: list[int]
):
    model = load_pipeline_spec(
        "hf:llama?num_hidden_layers=4&seq=6", num_stages=num_stages, batch_size=3, seed=0
    )
    assert [len(stage.layers) for stage in model.stages] == layers_per_stage
    assert model.inputs[0].shape == (3, 6) and model.inputs[0].dtype == torch.int64
    assert model.target.shape == (3, 6)
    full = full_llama(4).double()
    for stage in model.stages:
        stage.double()
    assert model.stages[0].embed_tokens.weight.equal(full.model.embed_tokens.weight)
    assert model.stages[-1].lm_head.weight.equal(full.lm_head.weight)
    assert model.stages[-1].lm_head.weight.data_ptr() != model.stages[0].embed_tokens.weight.data_ptr()
    logits = run_stages(model.stages, model.inputs)
    expected = full(input_ids=model.inputs[0], use_cache=False).logits
    assert logits.dtype == torch.float64 and torch.equal(logits, expected)
    loss = model.loss_fn(logits, model.target)
    assert torch.equal(loss, nn.functional.cross_entropy(expected.reshape(-1, 128), model.target.reshape(-1)))
    # every stage's rotary embedding is its own buffer-only module: no parameter, no shared object
    rotaries = [stage.rotary_emb for stage in model.stages]
    assert len({id(rotary) for rotary in rotaries}) == num_stages
    assert not any(list(rotary.parameters()) for rotary in rotaries)


def test_hf_llama_takes_its_config_keys_and_the_gpt2_style_aliases():
    pytest.importorskip("transformers")
    spec = (
        "hf:llama?n_layer=3&n_embd=64&n_head=8&num_key_value_heads=4&intermediate_size=96&vocab_size=50&seq=5"
    )
    model = load_pipeline_spec(spec, num_stages=3, batch_size=2, seed=0)
    config = model.stages[0].config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (3, 64, 8)
    assert (config.num_key_value_heads, config.intermediate_size, config.vocab_size) == (4, 96, 50)
    assert config._attn_implementation == "eager" and config.attention_dropout == 0.0
    assert run_stages(model.stages, model.inputs).shape == (2, 5, 50)
    other_seed = load_pipeline_spec(spec + "&seed=1", num_stages=3, batch_size=2, seed=0)
    assert (
        not other_seed.stages[1]
        .layers[0]
        .mlp.up_proj.weight.equal(model.stages[1].layers[0].mlp.up_proj.weight)
    )


def test_hf_llama_ties_its_head_to_the_embedding_only_inside_one_stage():
    pytest.importorskip("transformers")
    model = load_pipeline_spec(
        "hf:llama?num_hidden_layers=2&tie_word_embeddings=1", num_stages=1, batch_size=2
    )
    (stage,) = model.stages
    assert stage.lm_head.weight is stage.embed_tokens.weight
    full = full_llama(2, tied=True)
    assert torch.equal(run_stages(model.stages, model.inputs), full(input_ids=model.inputs[0]).logits)
    with pytest.raises(SpecError, match="tie_word_embeddings=1 ties stage 0's embedding to the last stage's"):
        load_pipeline_spec("hf:llama?tie_word_embeddings=1", num_stages=2, batch_size=2)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "hf:llama?depth=2",
            "unknown key 'depth' for hf:llama cut into stages; valid keys: num_hidden_layers, ",
        ),
        ("hf:llama?batch=4", r"unknown key 'batch'.*comes from the command"),
        ("hf:llama?stage=middle", r"unknown key 'stage'.*belongs to model specs"),
        (
            "hf:gpt2?num_key_value_heads=2",
            r"unknown key 'num_key_value_heads' for hf:gpt2.*valid keys: n_layer",
        ),
        ("hf:llama?num_hidden_layers=1", "1 layers cannot fill 2 stages; raise num_hidden_layers"),
        ("hf:llama?hidden_size=30", "hidden_size=30 is not a multiple of num_attention_heads=4"),
        (
            "hf:llama?num_key_value_heads=3",
            "num_attention_heads=4 is not a multiple of num_key_value_heads=3",
        ),
        ("hf:llama?hidden_size=12", "3 wide; rotary position embeddings need an even width"),
        ("hf:gpt2?n_embd=30", "n_embd=30 is not a multiple of n_head=4"),
        ("hf:llama?seq=0", "seq must be at least 1, got 0"),
        ("hf:llama?seed=-1", "seed must be at least 0"),
        ("hf:llama?vocab_size=many", "vocab_size='many' is not an integer"),
        ("hf:llama?tie_word_embeddings=maybe", "is not a boolean"),
        ("hf:llama?seq", "expected key=value, got 'seq'"),
        ("hf:llama?n_layer=2&num_hidden_layers=2", "num_hidden_layers is given twice"),
        ("hf:bert", "hf:bert is not cut into pipeline stages; the architectures that are: hf:gpt2, hf:llama"),
    ],
)
def test_bad_hf_pipeline_specs_say_what_is_wrong_and_what_is_valid(spec: str, message: str):
    pytest.importorskip("transformers")
    with pytest.raises(SpecError, match=message):
        load_pipeline_spec(spec, num_stages=2, batch_size=4)


def test_model_specs_and_pipeline_specs_both_go_to_costs(pipeline_file: Path):
    module, inputs = load_stage_or_pipeline(f"{pipeline_file}:model")
    assert isinstance(module, nn.Linear) and inputs[0].shape == (4, 3)
    module, _ = load_stage_or_pipeline("zoo:mlp")
    assert isinstance(module, nn.Module)
    assert isinstance(load_stage_or_pipeline(f"{pipeline_file}:make"), PipelineModel)  # declares them
    assert isinstance(load_stage_or_pipeline(f"{pipeline_file}:fixed"), PipelineModel)  # returns one
    assert isinstance(load_stage_or_pipeline("zoo-pipeline:mlp"), PipelineModel)
    one_stage = spec_costs("zoo:mlp", repeat=1, warmup=0)
    assert len(one_stage.stages) == 1
    # a microbatch of the whole batch: 16 rows in 4 microbatches, F of stage 0 is two 4-row matrix products
    costs = spec_costs("zoo-pipeline:mlp", num_stages=2, batch_size=16, microbatches=4, repeat=1, warmup=0)
    assert len(costs.stages) == 2
    assert costs.stages[0].forward.flops == 2 * (2 * 4 * 64 * 256)
    assert costs.stages[1].input_grad_bytes == 4 * 64 * 4  # float32 gradient of a 4-row input


def test_hf_specs_are_model_specs_to_costs_unless_asked_for_a_pipeline():
    pytest.importorskip("transformers")
    module, _ = load_stage_or_pipeline("hf:gpt2")
    assert isinstance(module, nn.Module)
    model = load_stage_or_pipeline("hf:gpt2?n_layer=2", pipeline=True, num_stages=2, batch_size=2)
    assert isinstance(model, PipelineModel) and len(model.stages) == 2
    model = load_stage_or_pipeline("hf:llama?num_hidden_layers=2", pipeline=True, num_stages=2, batch_size=2)
    assert isinstance(model, PipelineModel) and len(model.stages) == 2


def test_pipeline_options_on_a_model_spec_are_refused_not_dropped(
    pipeline_file: Path, capsys: pytest.CaptureFixture[str]
):
    # zoo:mlp is one stage on its own inputs: a stage count or batch would silently not apply
    for keywords, named in [
        ({"num_stages": 4}, "num_stages=4 (--num-stages)"),
        ({"batch_size": 16}, "batch_size=16 (--batch-size)"),
        ({"microbatches": 2}, "microbatches=2 (--microbatches)"),
    ]:
        with pytest.raises(SpecError, match=re.escape(named) + " applies to pipeline specs only$"):
            spec_costs("zoo:mlp", repeat=1, warmup=0, **keywords)
    with pytest.raises(SpecError, match="is a model spec"):
        spec_costs(f"{pipeline_file}:model", num_stages=2, repeat=1, warmup=0)  # a file's model function
    assert main(["costs", "zoo:mlp", "--num-stages", "4", "--microbatches", "2"]) == 2
    err = capsys.readouterr().err
    assert "'zoo:mlp' is a model spec" in err
    assert "num_stages=4 (--num-stages), microbatches=2 (--microbatches) apply to pipeline specs only" in err


def test_hf_pipeline_architectures_without_pipeline_true_say_how_to_cut_them(
    capsys: pytest.CaptureFixture[str],
):
    pytest.importorskip("transformers")
    assert main(["costs", "hf:llama?num_hidden_layers=2", "--num-stages", "2", "--repeat", "1"]) == 2
    assert "pass pipeline=True (graphkit costs --pipeline)" in capsys.readouterr().err


def test_costs_cli_takes_a_pipeline_spec_file_with_its_options(
    pipeline_file: Path, capsys: pytest.CaptureFixture[str]
):
    command = ["costs", f"{pipeline_file}:make", "--num-stages", "3", "--batch-size", "8"]
    assert main([*command, "--microbatches", "2", "--repeat", "1", "--warmup", "0", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["stages"]) == 3
    assert payload["stages"][0]["forward"]["flops"] == 2 * 4 * 3 * 3  # one Linear on 4 rows
    assert main(["costs", f"{pipeline_file}:make", "--microbatches", "3"]) == 2
    assert "does not split into 3 equal microbatches" in capsys.readouterr().err


def test_bad_pipeline_specs_say_what_is_wrong(pipeline_file: Path):
    cases = {
        f"{pipeline_file}:fixed": "returned 2 stages but 4 are needed; declare a num_stages parameter",
        f"{pipeline_file}:needs_more": r"requires \['width'\]; a pipeline spec function may declare only",
        f"{pipeline_file}:not_a_pipeline": "returned a dict; return PipelineModel",
        f"{pipeline_file}:raises": "the function raised RuntimeError: no GPU here",
        f"{pipeline_file}:nothing": "has no function 'nothing'",
        f"{pipeline_file.parent / 'missing.py'}:make": "does not exist",
        "no_function_here": "names no function",
        "": "a pipeline spec must be",
    }
    for spec, message in cases.items():
        with pytest.raises(SpecError, match=message):
            load_pipeline_spec(spec, num_stages=4, batch_size=8)
    with pytest.raises(SpecError, match="loss_fn is a int"):
        load_pipeline_spec(lambda: ([nn.Linear(2, 2)], 3, (torch.zeros(2, 2),), None))
    with pytest.raises(SpecError, match="the stages must be a non-empty list of nn.Module"):
        load_pipeline_spec(lambda: (["not a module"], torch.sum, (torch.zeros(2, 2),), None))


def test_a_mistyped_pipeline_spec_says_pipeline_spec_and_what_the_file_defines(
    pipeline_file: Path, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SpecError) as caught:
        load_pipeline_spec(f"{pipeline_file}:mkae", num_stages=2, batch_size=4)
    message = str(caught.value)
    assert message == (
        f"pipeline spec '{pipeline_file}:mkae': my_pipeline.py has no function 'mkae'; did you mean 'make'? "
        "it defines: make, fixed, needs_more, not_a_pipeline, raises, model"
    )
    missing = pipeline_file.parent / "my_pipelnie.py"
    assert main(["plan", f"{missing}:make", "--ranks", "2"]) == 2
    error = capsys.readouterr().err
    assert f"pipeline spec '{missing}:make': the file" in error and "does not exist" in error
    assert "model spec" not in error
    assert main(["plan", f"{pipeline_file}:mkae"]) == 2
    error = capsys.readouterr().err
    assert "my_pipeline.py has no function 'mkae'; did you mean 'make'?" in error
    assert "graphkit_spec_" not in error
    # costs takes either kind of spec: the message does not guess which
    for spec in (f"{missing}:make", f"{pipeline_file}:mkae"):
        with pytest.raises(SpecError) as caught:
            load_stage_or_pipeline(spec)
        assert str(caught.value).startswith(f"spec '{spec}': ")


def test_the_docs_say_what_every_pipeline_command_asks_its_spec_for(repo_root: Path):
    takes_pipeline_spec = commands_taking_pipeline_spec()
    assert takes_pipeline_spec >= {"plan", "timeline", "verify-pipeline"}
    text = (repo_root / "docs" / "pipeline_specs.md").read_text()
    table = text.split("## What each command asks for", 1)[1].split("\n\n")[1]
    listed = {
        name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z-]+)`", row.split("|")[1])
    }
    assert takes_pipeline_spec | {"costs"} <= listed, "add the missing commands to the table"
    opening = text.split("\n\n", 2)[1]
    named = set(re.findall(r"`graphkit ([a-z-]+)`", opening))
    assert takes_pipeline_spec | {"costs"} <= named, (
        "name every command that takes a pipeline spec at the top"
    )
