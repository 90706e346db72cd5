"""Hugging Face GPT-2 and Llama cut into pipeline stages: the ``hf:gpt2`` and ``hf:llama`` pipeline specs.

A pipeline spec ``hf:gpt2[?key=value&...]`` or ``hf:llama[?key=value&...]`` (:mod:`graphkit.models.pipeline_specs`)
names a ``transformers`` model (random weights, dropout off, eager attention) cut into ``num_stages``
stages: stage 0 embeds token ids, every stage computes its own causal mask (and, for Llama, rotary position
embeddings), the last stage ends with the final norm and ``lm_head``; the loss is the cross entropy of the
logits against random token ids. The head is not tied to the embedding, so that no parameter spans two
ranks. This module parses those specs' keys, spreads the layers over the stages and builds the stage
modules (:class:`GPT2PipelineStage`, :class:`LlamaPipelineStage`), with the layer runners of
:mod:`graphkit.models.huggingface`. It returns the parts of a pipeline, ``(stages, loss_fn, inputs,
target)``; :func:`graphkit.models.pipeline_specs.load_pipeline_spec` makes them a
:class:`~graphkit.models.pipeline_specs.PipelineModel`.

``transformers`` is an optional dependency (``pip install 'graphkit[models]'``); it is imported only when a
pipeline is built.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from graphkit.models.huggingface import (
    FALSE_WORDS,
    TRUE_WORDS,
    default_config,
    hf_architecture,
    hf_query,
    import_transformers,
    position_ids_of,
    run_gpt2_blocks,
    run_rotary_layers,
)
from graphkit.models.specs import SpecError

__all__ = [
    "PIPELINE_ARCHITECTURES",
    "GPT2PipelineStage",
    "LlamaPipelineStage",
    "PipelineParts",
    "gpt2_stages",
    "hf_stages",
    "llama_stages",
]

PipelineParts = tuple[list[nn.Module], Callable[[Tensor, Tensor], Tensor], tuple[Tensor], Tensor]
"""``(stages, loss_fn, inputs, target)``: the stage modules (stage 0 first), the loss of the last stage's
logits against one microbatch of the target, stage 0's int64 token ids for the whole batch and the target
token ids of the whole batch (the tuple a pipeline spec function may return)."""

PIPELINE_ARCHITECTURES: dict[str, str] = {
    "gpt2": "GPT-2: embeddings on the first stage, ln_f and an untied lm_head on the last (n_layer, n_embd, n_head, vocab_size, seq, seed)",
    "llama": "Llama: embeddings on the first stage, rotary embeddings and a causal mask on each, the final norm "
    "and lm_head on the last (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, "
    "intermediate_size, vocab_size, tie_word_embeddings, seq, seed)",
}
"""The architectures a pipeline spec ``hf:ARCH`` cuts into stages, with a one-line description of each."""


# The query keys of each architecture cut into stages, with how a value is read: "count" an integer >= 1,
# "seed" an integer >= 0, "flag" a boolean (1/0, true/false). The names are the config fields that
# graphkit.models.huggingface takes for the same architecture (its GPT-2 style aliases are taken too).
_HF_PIPELINE_KEYS: dict[str, dict[str, str]] = {
    "gpt2": {
        "n_layer": "count",
        "n_embd": "count",
        "n_head": "count",
        "vocab_size": "count",
        "seq": "count",
        "seed": "seed",
    },
    "llama": {
        "num_hidden_layers": "count",
        "hidden_size": "count",
        "num_attention_heads": "count",
        "num_key_value_heads": "count",
        "intermediate_size": "count",
        "vocab_size": "count",
        "tie_word_embeddings": "flag",
        "seq": "count",
        "seed": "seed",
    },
}
_HF_PIPELINE_ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {"num_hidden_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head"},
    "llama": {"n_layer": "num_hidden_layers", "n_embd": "hidden_size", "n_head": "num_attention_heads"},
}
# Keys of a model spec (graphkit.models.huggingface) that a pipeline spec does not take, and why.
_MODEL_SPEC_ONLY_KEYS = {
    "batch": "the batch size comes from the command: rows per microbatch x microbatches",
    "stage": "a pipeline spec cuts the whole model into stages; stage= belongs to model specs",
}


def hf_stages(spec: str, *, num_stages: int, batch_size: int) -> PipelineParts:
    """A Hugging Face model cut into ``num_stages`` stages: ``hf:gpt2[?...]`` or ``hf:llama[?...]``.

    Dispatches to :func:`gpt2_stages` or :func:`llama_stages` (their docstrings list the keys).

    Raises:
        SpecError: an architecture that is not cut into stages (the message lists those that are), and as
            the architecture's function.
        ImportError: ``transformers`` is not installed (extra ``models``).
    """
    arch = hf_architecture(spec)
    if arch not in _HF_STAGES:
        raise SpecError(
            f"pipeline spec {spec!r}: hf:{arch} is not cut into pipeline stages; the architectures that are: "
            f"{', '.join(f'hf:{name}' for name in _HF_STAGES)} (every hf: architecture is a model spec for "
            "capture, groups, verify, render and costs)"
        )
    return _HF_STAGES[arch](spec, num_stages=num_stages, batch_size=batch_size)


def _parse_pipeline_query(spec: str, arch: str) -> dict[str, int | bool]:
    """The ``key=value`` pairs of ``spec`` (``hf:ARCH?...``), keyed by their canonical names, values converted.

    Raises:
        SpecError: ``spec`` names another architecture than ``arch``, a piece without ``=``, an unknown key
            (the message lists the valid ones), a key given twice (also through an alias), or a value that is
            not an integer (at least 1; at least 0 for ``seed``) or a boolean where one is expected.
    """
    if hf_architecture(spec) != arch:
        raise SpecError(f"pipeline spec {spec!r} is not an hf:{arch} spec")
    keys, aliases = _HF_PIPELINE_KEYS[arch], _HF_PIPELINE_ALIASES[arch]
    values: dict[str, int | bool] = {}
    try:
        pairs = hf_query(spec)
    except ValueError as error:
        raise SpecError(f"pipeline {error}") from None
    for key, value in pairs:
        name = aliases.get(key, key)
        if name not in keys:
            why = f" ({_MODEL_SPEC_ONLY_KEYS[key]})" if key in _MODEL_SPEC_ONLY_KEYS else ""
            also = ", ".join(f"{alias} for {target}" for alias, target in aliases.items())
            raise SpecError(
                f"pipeline spec {spec!r}: unknown key {key!r} for hf:{arch} cut into stages{why}; valid keys: "
                f"{', '.join(keys)} (also {also})"
            )
        if name in values:
            raise SpecError(f"pipeline spec {spec!r}: {name} is given twice (through {key!r})")
        values[name] = _pipeline_value(spec, key, value, keys[name])
    return values


def _pipeline_value(spec: str, key: str, value: str, kind: str) -> int | bool:
    if kind == "flag":
        if value.lower() in TRUE_WORDS:
            return True
        if value.lower() in FALSE_WORDS:
            return False
        raise SpecError(f"pipeline spec {spec!r}: {key}={value!r} is not a boolean (1 or 0, true or false)")
    try:
        number = int(value)
    except ValueError:
        raise SpecError(f"pipeline spec {spec!r}: {key}={value!r} is not an integer") from None
    minimum = 0 if kind == "seed" else 1
    if number < minimum:
        raise SpecError(f"pipeline spec {spec!r}: {key} must be at least {minimum}, got {number}")
    return number


def _stage_bounds(spec: str, layers: int, num_stages: int, layers_key: str) -> list[int]:
    """Where each stage's layers start and end: stage ``i`` holds layers ``bounds[i]`` to ``bounds[i + 1]``.

    The layers are spread as evenly as they go (counts differ by at most one), ``num_stages + 1`` bounds.

    Raises:
        SpecError: fewer than one stage, or fewer layers than stages (the message names ``layers_key``).
    """
    if num_stages < 1:
        raise SpecError(f"pipeline spec {spec!r}: a pipeline has at least 1 stage, not {num_stages}")
    if layers < num_stages:
        raise SpecError(
            f"pipeline spec {spec!r}: {layers} layers cannot fill {num_stages} stages; raise {layers_key}"
        )
    return [round(index * layers / num_stages) for index in range(num_stages + 1)]


def _check_heads(spec: str, hidden: tuple[str, int], heads: tuple[str, int]) -> int:
    """The width of one attention head; a SpecError when ``hidden`` is not a multiple of ``heads``."""
    (hidden_key, hidden_size), (heads_key, head_count) = hidden, heads
    if hidden_size % head_count:
        raise SpecError(
            f"pipeline spec {spec!r}: {hidden_key}={hidden_size} is not a multiple of {heads_key}={head_count}"
        )
    return hidden_size // head_count


def _random_tokens(vocab_size: int, batch_size: int, seq: int) -> tuple[Tensor, Tensor]:
    """Token ids and target token ids, int64 ``(batch_size, seq)``, drawn from the current RNG."""
    return (
        torch.randint(0, vocab_size, (batch_size, seq)),
        torch.randint(0, vocab_size, (batch_size, seq)),
    )


def _token_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def gpt2_stages(spec: str, *, num_stages: int, batch_size: int) -> PipelineParts:
    """GPT-2 cut into ``num_stages`` stages (``hf:gpt2[?n_layer=..&n_embd=..&n_head=..&vocab_size=..&seq=..&seed=..]``).

    ``GPT2LMHeadModel`` with random weights drawn from ``seed`` (0), dropout off, eager attention and its head
    *not* tied to the token embedding, so that no parameter spans two stages. Defaults: ``n_layer`` =
    ``num_stages``, ``n_embd`` 32, ``n_head`` 4, ``vocab_size`` 128, ``seq`` 8 (also ``num_hidden_layers``,
    ``hidden_size``, ``num_attention_heads``, as in :mod:`graphkit.models.huggingface`). The stages are
    :class:`GPT2PipelineStage`; the inputs int64 token ids ``(batch_size, seq)``, the loss the cross entropy
    of the logits against random token ids of the same shape.

    Raises:
        SpecError: another architecture than gpt2, an unknown key, a bad value, ``n_embd`` not a multiple of
            ``n_head``, or fewer layers than stages.
        ImportError: ``transformers`` is not installed (extra ``models``).
    """
    values = _parse_pipeline_query(spec, "gpt2")
    layers = values.get("n_layer", num_stages)
    bounds = _stage_bounds(spec, layers, num_stages, "n_layer")
    n_embd, n_head = values.get("n_embd", 32), values.get("n_head", 4)
    _check_heads(spec, ("n_embd", n_embd), ("n_head", n_head))
    seq = values.get("seq", 8)
    transformers = import_transformers()
    config = transformers.GPT2Config(
        vocab_size=values.get("vocab_size", 128),
        n_positions=max(seq, 8),
        n_embd=n_embd,
        n_layer=layers,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(values.get("seed", 0))
        model = transformers.GPT2LMHeadModel(config)
        input_ids, target = _random_tokens(config.vocab_size, batch_size, seq)
    blocks = list(model.transformer.h)
    stages: list[nn.Module] = []
    for index in range(num_stages):
        mine = blocks[bounds[index] : bounds[index + 1]]
        embedding = (model.transformer.wte, model.transformer.wpe) if index == 0 else None
        head = (model.transformer.ln_f, model.lm_head) if index == num_stages - 1 else None
        stages.append(GPT2PipelineStage(config, mine, embedding, head))
    return stages, _token_cross_entropy, (input_ids,), target


class GPT2PipelineStage(nn.Module):
    """Some GPT-2 blocks under a causal mask; stage 0 embeds token ids first, the last applies ``ln_f`` and the head.

    Input: int64 token ids ``(batch, seq)`` on stage 0, float hidden states ``(batch, seq, n_embd)`` after.
    Output: hidden states, or logits ``(batch, seq, vocab_size)`` on the last stage.
    """

    def __init__(
        self,
        config: Any,
        blocks: Sequence[nn.Module],
        embedding: tuple[nn.Module, nn.Module] | None,
        head: tuple[nn.Module, nn.Module] | None,
    ) -> None:
        super().__init__()
        from transformers import masking_utils

        self.config = config
        self.h = nn.ModuleList(blocks)
        self.wte, self.wpe = embedding if embedding is not None else (None, None)
        self.ln_f, self.lm_head = head if head is not None else (None, None)
        self.make_mask = masking_utils.create_causal_mask

    def forward(self, hidden_states: Tensor) -> Tensor:
        if self.wte is not None:
            hidden_states = self.wte(hidden_states) + self.wpe(position_ids_of(hidden_states))
        hidden_states = run_gpt2_blocks(self.h, self.make_mask, self.config, hidden_states)
        if self.ln_f is not None:
            hidden_states = self.lm_head(self.ln_f(hidden_states))
        return hidden_states


def llama_stages(spec: str, *, num_stages: int, batch_size: int) -> PipelineParts:
    """Llama cut into ``num_stages`` stages: ``hf:llama[?key=value&...]``.

    ``LlamaForCausalLM`` with random weights drawn from ``seed`` (0), eager attention and no dropout, built
    small by default from the config of ``hf:llama`` (:mod:`graphkit.models.huggingface`): keys
    ``num_hidden_layers`` (default ``num_stages``), ``hidden_size`` (32), ``num_attention_heads`` (4),
    ``num_key_value_heads`` (2), ``intermediate_size`` (64), ``vocab_size`` (128), ``seq`` (8), ``seed`` (0)
    and ``tie_word_embeddings`` (0; also ``n_layer``, ``n_embd``, ``n_head``). The stages are
    :class:`LlamaPipelineStage`: stage 0 embeds token ids, every stage computes its own causal mask and
    rotary position embeddings (a buffer-only ``LlamaRotaryEmbedding`` each), the last applies the final
    RMSNorm and ``lm_head``. Inputs: int64 token ids ``(batch_size, seq)``; the loss is the cross entropy of
    the logits against random token ids of the same shape.

    ``tie_word_embeddings=1`` makes ``lm_head.weight`` the embedding's weight: one parameter in stage 0 and in
    the last stage. That is accepted with one stage only (sharing inside a stage is exact).
    ``torch.distributed.pipelining`` does not handle a weight tied across stages: on two ranks each stage
    holds its own copy and gets only its part of the gradient (summing them needs an all-reduce between the
    two stages' ranks), and in one process each stage's ``scale_grads`` divides the shared gradient again.

    Raises:
        SpecError: another architecture than llama, an unknown key, a bad value, ``hidden_size`` not a
            multiple of ``num_attention_heads``, ``num_attention_heads`` not a multiple of
            ``num_key_value_heads``, an odd head width (rotary embeddings rotate pairs), fewer layers than
            stages, or ``tie_word_embeddings=1`` with more than one stage.
        ImportError: ``transformers`` is not installed (extra ``models``).
    """
    values = _parse_pipeline_query(spec, "llama")
    layers = values.get("num_hidden_layers", num_stages)
    bounds = _stage_bounds(spec, layers, num_stages, "num_hidden_layers")
    tied = bool(values.get("tie_word_embeddings", False))
    if tied and num_stages > 1:
        raise SpecError(
            f"pipeline spec {spec!r}: tie_word_embeddings=1 ties stage 0's embedding to the last stage's "
            f"lm_head, one weight in two of the {num_stages} stages, which torch.distributed.pipelining does "
            "not handle: on two ranks each stage holds its own copy and the two gradients are never summed "
            "(that needs an all-reduce between the two stages' ranks), and in one process every stage divides "
            "the shared gradient by the microbatch count again. Use tie_word_embeddings=0, or one stage"
        )
    fields: dict[str, Any] = default_config("llama")
    fields.update((key, value) for key, value in values.items() if key not in ("seq", "seed"))
    seq = int(values.get("seq", 8))
    fields.update(
        num_hidden_layers=layers,
        max_position_embeddings=max(seq, fields["max_position_embeddings"]),
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    head_width = _check_heads(
        spec,
        ("hidden_size", fields["hidden_size"]),
        ("num_attention_heads", fields["num_attention_heads"]),
    )
    _check_heads(
        spec,
        ("num_attention_heads", fields["num_attention_heads"]),
        ("num_key_value_heads", fields["num_key_value_heads"]),
    )
    if head_width % 2:
        raise SpecError(
            f"pipeline spec {spec!r}: a head is hidden_size / num_attention_heads = {head_width} wide; rotary "
            "position embeddings need an even width"
        )
    transformers = import_transformers()
    try:
        config = transformers.LlamaConfig(**fields)
    except (TypeError, ValueError) as error:  # the config's own validation
        raise SpecError(f"pipeline spec {spec!r}: transformers.LlamaConfig refused it: {error}") from error
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(values.get("seed", 0)))
        model = transformers.LlamaForCausalLM(config)
        input_ids, target = _random_tokens(config.vocab_size, batch_size, seq)
    layers_list = list(model.model.layers)
    stages: list[nn.Module] = []
    for index in range(num_stages):
        stages.append(
            LlamaPipelineStage(
                config,
                layers_list[bounds[index] : bounds[index + 1]],
                # each stage its own copy: a buffer-only module (inv_freq), so copies share no parameter
                model.model.rotary_emb if index == 0 else copy.deepcopy(model.model.rotary_emb),
                embed_tokens=model.model.embed_tokens if index == 0 else None,
                head=(model.model.norm, model.lm_head) if index == num_stages - 1 else None,
            )
        )
    return stages, _token_cross_entropy, (input_ids,), target


class LlamaPipelineStage(nn.Module):
    """Some Llama decoder layers with their causal mask and rotary positions; stage 0 embeds token ids first,
    the last applies the final RMSNorm (``norm``) and ``lm_head``.

    The layers run as ``LlamaModel.forward`` runs them (positions ``0 .. seq-1``, no KV cache): the mask and
    the rotary cos/sin are computed in the stage from its input's shape, device and dtype, so a stage takes
    and returns one tensor, as ``torch.distributed.pipelining.PipelineStage`` passes them.

    Input: int64 token ids ``(batch, seq)`` on stage 0, float hidden states ``(batch, seq, hidden_size)`` after.
    Output: hidden states, or logits ``(batch, seq, vocab_size)`` on the last stage.
    """

    def __init__(
        self,
        config: Any,
        layers: Sequence[nn.Module],
        rotary_emb: nn.Module,
        *,
        embed_tokens: nn.Module | None = None,
        head: tuple[nn.Module, nn.Module] | None = None,
    ) -> None:
        super().__init__()
        from transformers import masking_utils

        self.config = config
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.rotary_emb = rotary_emb
        self.norm, self.lm_head = head if head is not None else (None, None)
        self.make_mask = masking_utils.create_causal_mask

    def forward(self, hidden_states: Tensor) -> Tensor:
        if self.embed_tokens is not None:
            hidden_states = self.embed_tokens(hidden_states)
        hidden_states = run_rotary_layers(
            self.layers, self.rotary_emb, self.make_mask, self.config, hidden_states
        )
        if self.norm is not None:
            hidden_states = self.lm_head(self.norm(hidden_states))
        return hidden_states


_HF_STAGES: dict[str, Callable[..., PipelineParts]] = {"gpt2": gpt2_stages, "llama": llama_stages}
"""The Hugging Face architectures cut into stages, by the ARCH of ``hf:ARCH``."""
