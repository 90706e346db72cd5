"""Hugging Face model specs: tiny ``transformers`` models built from configs, whole or as a middle stage.

The oracle for every numerical check is the ``transformers`` model itself, built from the same config and
seed: its logits for the whole model, and the hidden states entering its first layer and leaving its last
layer for a middle stage.
"""

from __future__ import annotations

import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from graphkit.models.huggingface import KNOWN_ARCHITECTURES, HFSpec, load_hf_spec, parse_hf_spec  # noqa: E402

ARCHITECTURES = ["gpt2", "llama", "bert", "t5", "mixtral"]

# The transformers model class of each architecture, and where its stack of layers lives in it.
HF_MODEL_CLASS = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "bert": "BertForMaskedLM",
    "t5": "T5ForConditionalGeneration",
    "mixtral": "MixtralForCausalLM",
}
HF_LAYERS = {
    "gpt2": "transformer.h",
    "llama": "model.layers",
    "bert": "bert.encoder.layer",
    "t5": "encoder.block",
    "mixtral": "model.layers",
}
# The stack of layers of a middle stage, as an attribute of the graphkit module.
STAGE_LAYERS = {"gpt2": "h", "llama": "layers", "bert": "layer", "t5": "block", "mixtral": "layers"}


def reference_model(arch: str, config: object, seed: int = 0) -> torch.nn.Module:
    """The transformers model that a spec with this config and seed builds its module from."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return getattr(transformers, HF_MODEL_CLASS[arch])(config)


def hidden_size(module: torch.nn.Module) -> int:
    return module.config.hidden_size


def autograd_node_classes(output: torch.Tensor) -> set[type]:
    """Classes of every Node reachable from ``output.grad_fn`` (explicit stack, no recursion)."""
    stack, seen, classes = [output.grad_fn], set(), set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        classes.add(type(node))
        stack.extend(producer for producer, _ in node.next_functions)
    return classes


# --- whole models ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_whole_model_logits_equal_the_transformers_model(arch: str) -> None:
    module, inputs = load_hf_spec(f"hf:{arch}")
    assert set(inputs) == ({"input_ids", "decoder_input_ids"} if arch == "t5" else {"input_ids"})
    for tensor in inputs.values():
        assert tensor.dtype == torch.int64 and tensor.shape == (2, 8) and not tensor.requires_grad
        assert int(tensor.min()) >= 0 and int(tensor.max()) < module.config.vocab_size

    output = module(**inputs)

    assert list(output) == ["logits"]
    assert output["logits"].shape == (2, 8, module.config.vocab_size)
    assert output["logits"].dtype == torch.float32
    expected = reference_model(arch, module.config)(**inputs).logits
    torch.testing.assert_close(output["logits"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_whole_model_backward_reaches_every_parameter(arch: str) -> None:
    module, inputs = load_hf_spec(f"hf:{arch}")
    logits = module(**inputs)["logits"]
    logits.backward(torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)))

    missing = [name for name, parameter in module.named_parameters() if parameter.grad is None]
    assert missing == []


def test_whole_model_parameter_names_are_those_of_transformers() -> None:
    module, _ = load_hf_spec("hf:llama")
    reference = reference_model("llama", module.config)

    assert dict(module.named_parameters()).keys() == dict(reference.named_parameters()).keys()
    assert "model.layers.1.mlp.gate_proj.weight" in dict(module.named_parameters())


def test_tied_heads_are_one_parameter() -> None:
    gpt2, _ = load_hf_spec("hf:gpt2")
    bert, _ = load_hf_spec("hf:bert")
    t5, _ = load_hf_spec("hf:t5")

    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight
    assert "lm_head.weight" not in dict(gpt2.named_parameters())
    assert bert.cls.predictions.decoder.weight is bert.bert.embeddings.word_embeddings.weight
    assert t5.lm_head.weight is t5.shared.weight
    assert t5.encoder.embed_tokens.weight is t5.shared.weight
    assert t5.decoder.embed_tokens.weight is t5.shared.weight


def test_mixtral_returns_logits_only() -> None:
    module, inputs = load_hf_spec("hf:mixtral")

    output = module(**inputs)

    assert list(output) == ["logits"]
    assert module.config._experts_implementation == "eager"


# --- middle stages --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "options"),
    [(arch, "") for arch in ARCHITECTURES]
    + [("mixtral", "&sliding_window=3"), ("llama", "&attn_implementation=sdpa"), ("gpt2", "&n_layer=3")],
)
def test_middle_stage_equals_the_layers_of_the_transformers_model(arch: str, options: str) -> None:
    module, inputs = load_hf_spec(f"hf:{arch}?stage=middle{options}")
    (hidden_states,) = inputs.values()
    assert list(inputs) == ["hidden_states"]
    assert hidden_states.shape == (2, 8, hidden_size(module)) and hidden_states.dtype == torch.float32
    assert hidden_states.requires_grad and hidden_states.is_leaf

    # Run the full transformers model on token ids; record what enters its first layer and leaves its last.
    reference = reference_model(arch, module.config)
    layers = reference.get_submodule(HF_LAYERS[arch])
    recorded: dict[str, torch.Tensor] = {}

    def record_input(layer: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        recorded["in"] = args[0] if args else kwargs["hidden_states"]

    def record_output(layer: torch.nn.Module, args: tuple, output: object) -> None:
        recorded["out"] = output[0] if isinstance(output, tuple) else output

    layers[0].register_forward_pre_hook(record_input, with_kwargs=True)
    layers[-1].register_forward_hook(record_output)
    token_ids = torch.randint(0, module.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    reference_inputs = {"input_ids": token_ids}
    if arch == "t5":
        reference_inputs["decoder_input_ids"] = token_ids
    with torch.no_grad():
        reference(**reference_inputs)

    output = module(hidden_states=recorded["in"])

    assert list(output) == ["hidden_states"]
    assert output["hidden_states"].shape == recorded["in"].shape
    torch.testing.assert_close(output["hidden_states"], recorded["out"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_middle_stage_backward_gives_input_and_every_parameter_a_gradient(arch: str) -> None:
    module, inputs = load_hf_spec(f"hf:{arch}?stage=middle")
    output = module(**inputs)["hidden_states"]
    output.backward(torch.randn(output.shape, generator=torch.Generator().manual_seed(1)))

    gradient = inputs["hidden_states"].grad
    assert gradient is not None and gradient.shape == inputs["hidden_states"].shape
    assert gradient.abs().sum() > 0
    missing = [name for name, parameter in module.named_parameters() if parameter.grad is None]
    assert missing == []


@pytest.mark.parametrize(
    ("arch", "names"),
    [
        ("gpt2", ["h.0.attn.c_attn.weight", "h.1.mlp.c_proj.bias", "h.1.ln_2.weight"]),
        (
            "llama",
            [
                "layers.0.self_attn.q_proj.weight",
                "layers.1.mlp.down_proj.weight",
                "layers.1.input_layernorm.weight",
            ],
        ),
        ("bert", ["layer.0.attention.self.query.weight", "layer.1.output.LayerNorm.bias"]),
        (
            "t5",
            [
                "block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                "block.1.layer.1.DenseReluDense.wo.weight",
            ],
        ),
        (
            "mixtral",
            [
                "layers.0.mlp.gate.weight",
                "layers.1.mlp.experts.gate_up_proj",
                "layers.1.mlp.experts.down_proj",
            ],
        ),
    ],
)
def test_middle_stage_named_parameters_get_nonzero_gradients(arch: str, names: list[str]) -> None:
    module, inputs = load_hf_spec(f"hf:{arch}?stage=middle")
    output = module(**inputs)["hidden_states"]
    output.backward(torch.randn(output.shape, generator=torch.Generator().manual_seed(1)))

    parameters = dict(module.named_parameters())
    for name in names:
        assert parameters[name].grad is not None, name
        assert parameters[name].grad.abs().sum() > 0, name


def test_t5_stage_reuses_the_position_bias_of_its_first_block() -> None:
    module, inputs = load_hf_spec("hf:t5?stage=middle&num_layers=3")
    cotangent = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    biases: list[torch.Tensor] = []
    for block in module.block:
        block.register_forward_hook(lambda _, args, output: biases.append(output[1]))

    output = module(**inputs)["hidden_states"]

    assert [block.layer[0].SelfAttention.has_relative_attention_bias for block in module.block] == [
        True,
        False,
        False,
    ]
    assert len(biases) == 3 and biases[1] is biases[0] and biases[2] is biases[0]
    (shared_gradient,) = torch.autograd.grad(output, [biases[0]], cotangent)

    # Oracle: give blocks 1 and 2 their own copy of the bias, as leaves; the gradient of the shared bias is the
    # sum of the gradients of the three uses.
    copies: list[torch.Tensor] = []

    def own_copy(block: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        copy = kwargs["position_bias"].detach().clone().requires_grad_()
        copies.append(copy)
        return args, {**kwargs, "position_bias": copy}

    for block in module.block[1:]:
        block.register_forward_pre_hook(own_copy, with_kwargs=True)
    biases.clear()
    output = module(**inputs)["hidden_states"]
    gradients = torch.autograd.grad(output, [biases[0], *copies], cotangent)

    assert len(copies) == 2
    assert all(gradient.abs().sum() > 0 for gradient in gradients)
    torch.testing.assert_close(shared_gradient, sum(gradients), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_graph_is_plain_operations(arch: str) -> None:
    for stage in ("whole", "middle"):
        module, inputs = load_hf_spec(f"hf:{arch}?stage={stage}")
        output = next(iter(module(**inputs).values()))
        custom = [
            cls
            for cls in autograd_node_classes(output)
            if issubclass(cls, torch.autograd.function.BackwardCFunction)
        ]
        assert custom == []


def test_middle_stage_follows_a_dtype_change() -> None:
    module, inputs = load_hf_spec("hf:llama?stage=middle")
    module = module.to(torch.float64)
    hidden_states = inputs["hidden_states"].detach().to(torch.float64).requires_grad_()

    output = module(hidden_states=hidden_states)["hidden_states"]

    assert output.dtype == torch.float64
    reference, _ = load_hf_spec("hf:llama?stage=middle")
    expected = reference(hidden_states=inputs["hidden_states"])["hidden_states"]
    torch.testing.assert_close(output, expected.double(), rtol=1e-4, atol=1e-5)


# --- spec grammar, overrides and determinism ------------------------------------------------------------------


def test_parse_spec_defaults_and_special_keys() -> None:
    assert parse_hf_spec("hf:gpt2") == HFSpec(arch="gpt2")
    assert parse_hf_spec("hf:LLaMA?stage=middle&batch=3&seq=5&seed=7&n_layer=4") == HFSpec(
        arch="llama", stage="middle", batch=3, seq=5, seed=7, overrides=(("n_layer", "4"),)
    )
    assert parse_hf_spec("bert") == HFSpec(arch="bert")


def test_known_architectures_are_described() -> None:
    assert list(KNOWN_ARCHITECTURES) == ARCHITECTURES
    assert all(isinstance(text, str) and text and "\n" not in text for text in KNOWN_ARCHITECTURES.values())


@pytest.mark.parametrize(
    ("spec", "layers"),
    [
        ("hf:gpt2?n_layer=3", 3),
        ("hf:gpt2?num_hidden_layers=3", 3),
        ("hf:llama?num_hidden_layers=3", 3),
        ("hf:llama?n_layer=1", 1),
        ("hf:bert?n_layer=3", 3),
        ("hf:t5?num_layers=3", 3),
        ("hf:mixtral?n_layer=3", 3),
    ],
)
def test_layer_count_override_changes_the_number_of_blocks(spec: str, layers: int) -> None:
    arch = spec[3:].split("?")[0]
    whole, _ = load_hf_spec(spec)
    middle, _ = load_hf_spec(spec + "&stage=middle")

    assert len(whole.get_submodule(HF_LAYERS[arch])) == layers
    assert len(getattr(middle, STAGE_LAYERS[arch])) == layers


def test_overrides_are_converted_to_the_type_of_the_default() -> None:
    module, _ = load_hf_spec(
        "hf:gpt2?layer_norm_epsilon=1e-3&scale_attn_weights=false&n_embd=48&activation_function=relu"
    )

    assert module.config.layer_norm_epsilon == pytest.approx(1e-3)
    assert isinstance(module.config.layer_norm_epsilon, float)
    assert module.config.scale_attn_weights is False
    assert module.config.n_embd == 48 and module.transformer.wte.weight.shape == (128, 48)
    assert module.config.activation_function == "relu"


def test_mixtral_expert_overrides_change_the_expert_weights() -> None:
    module, inputs = load_hf_spec("hf:mixtral?stage=middle&num_local_experts=6&num_experts_per_tok=1")

    assert module.layers[0].mlp.experts.gate_up_proj.shape == (6, 2 * 64, 32)
    assert module.layers[0].mlp.gate.top_k == 1
    assert module(**inputs)["hidden_states"].shape == (2, 8, 32)


def test_batch_and_seq_shape_the_inputs() -> None:
    whole, whole_inputs = load_hf_spec("hf:t5?batch=3&seq=5")
    middle, middle_inputs = load_hf_spec("hf:bert?stage=middle&batch=1&seq=4")

    assert whole_inputs["input_ids"].shape == (3, 5) and whole_inputs["decoder_input_ids"].shape == (3, 5)
    assert whole(**whole_inputs)["logits"].shape == (3, 5, 128)
    assert middle_inputs["hidden_states"].shape == (1, 4, 32)


def test_long_sequences_raise_the_position_limit() -> None:
    module, inputs = load_hf_spec("hf:gpt2?seq=80")

    assert module.config.n_positions == 80
    assert module(**inputs)["logits"].shape == (2, 80, 128)


def test_same_spec_gives_identical_weights_and_inputs() -> None:
    state = torch.random.get_rng_state()
    first, first_inputs = load_hf_spec("hf:mixtral?stage=middle")
    second, second_inputs = load_hf_spec("hf:mixtral?stage=middle")
    other, other_inputs = load_hf_spec("hf:mixtral?stage=middle&seed=1")

    assert torch.equal(torch.random.get_rng_state(), state)
    first_state, second_state, other_state = first.state_dict(), second.state_dict(), other.state_dict()
    assert first_state.keys() == second_state.keys()
    assert all(torch.equal(first_state[name], second_state[name]) for name in first_state)
    assert torch.equal(first_inputs["hidden_states"], second_inputs["hidden_states"])
    assert not torch.equal(
        first_state["layers.0.self_attn.q_proj.weight"], other_state["layers.0.self_attn.q_proj.weight"]
    )
    assert not torch.equal(first_inputs["hidden_states"], other_inputs["hidden_states"])
    torch.testing.assert_close(
        first(**first_inputs)["hidden_states"], second(**second_inputs)["hidden_states"], rtol=0, atol=0
    )


# --- errors ---------------------------------------------------------------------------------------------------


def test_unknown_architecture_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown Hugging Face architecture 'gpt3'") as error:
        load_hf_spec("hf:gpt3")
    for name in ARCHITECTURES:
        assert name in str(error.value)
    assert "Did you mean 'gpt2'?" in str(error.value)


def test_unknown_key_suggests_the_closest_config_field() -> None:
    with pytest.raises(ValueError, match="unknown key 'n_layr' for hf:gpt2") as error:
        load_hf_spec("hf:gpt2?n_layr=3")
    assert "Did you mean 'n_layer'" in str(error.value)
    assert "vocab_size" in str(error.value)

    with pytest.raises(ValueError, match="Did you mean 'num_key_value_heads'"):
        load_hf_spec("hf:llama?num_key_value_head=1")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hf:gpt2?n_layer=two", "n_layer expects an integer, got 'two'"),
        ("hf:gpt2?scale_attn_weights=maybe", "expects a boolean"),
        ("hf:gpt2?resid_pdrop=lots", "expects a number"),
        ("hf:gpt2?stage=first", "unknown stage 'first'"),
        ("hf:gpt2?batch=0", "batch must be at least 1"),
        ("hf:gpt2?seq=x", "seq must be an integer"),
        ("hf:gpt2?n_layer", "expected key=value"),
        ("hf:gpt2?n_layer=2&n_layer=3", "given twice"),
        ("hf:gpt2?n_layer=2&num_hidden_layers=3", "set twice"),
        ("hf:gpt2?n_positions=4&seq=8", "seq=8 is longer than n_positions=4"),
        ("hf:llama?rope_parameters=x", "unknown key 'rope_parameters'"),
    ],
)
def test_bad_values_raise_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_hf_spec(spec)


def test_missing_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)

    with pytest.raises(ImportError, match=r"pip install 'graphkit\[models\]'"):
        load_hf_spec("hf:gpt2")


def test_old_transformers_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers may replace its own entry in sys.modules while loading lazily: patch the current one.
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.46.0")

    with pytest.raises(ImportError, match="need transformers 5 or newer, found 4.46.0"):
        load_hf_spec("hf:gpt2")
