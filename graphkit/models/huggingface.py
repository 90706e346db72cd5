"""Hugging Face ``transformers`` models, built from small configs with random weights, as graphkit model specs.

A spec ``hf:ARCH[?key=value&...]`` names an architecture and, optionally, overrides. :func:`load_hf_spec`
builds the model from its config class directly (``GPT2Config(...)`` then ``GPT2LMHeadModel(config)``): no
checkpoint, no download, no network access. Examples::

    hf:gpt2                         GPT-2 with its tied head, token ids in, logits out
    hf:llama?stage=middle           the decoder layers of a Llama, hidden states in, hidden states out
    hf:gpt2?n_layer=4&seq=16        four blocks, sequences of 16 tokens
    hf:mixtral?num_local_experts=8  a sparse mixture of experts with eight experts per layer

Keys:

* any field of the architecture's config class (``n_layer``, ``hidden_size``, ``num_key_value_heads``, ...),
  including the config's own aliases (``num_hidden_layers`` for GPT-2's ``n_layer``) and the GPT-2 style
  names ``n_layer``, ``n_head`` and ``n_embd`` on every architecture. The value is converted to the type of
  the field's default (int, float, bool: ``true``/``false``/``1``/``0``); ``none`` sets ``None``.
* ``attn_implementation`` (default ``eager``, so attention is plain matmul and softmax ops in the autograd
  graph) and, for mixture-of-experts models, ``experts_implementation`` (default ``eager``).
* ``stage``: ``whole`` (default) or ``middle``;
  ``batch`` (default 2), ``seq`` (default 8): the shape of the generated inputs;
  ``seed`` (default 0): the seed of weights and inputs.

Stages:

* ``whole``: the full model with its head. Inputs are integer token ids of shape ``(batch, seq)`` (``int64``),
  which need no gradient, so the module is a first pipeline stage (stage 0). The output is
  ``{"logits": Tensor(batch, seq, vocab_size)}``; losses, caches, router logits and auxiliary losses are not
  computed.
* ``middle``: the transformer layers only (no embedding, no final norm, no head), as a pipeline stage in the
  middle of a model: the input ``hidden_states`` (float32, ``(batch, seq, hidden_size)``) requires grad and the
  output is ``{"hidden_states": Tensor(batch, seq, hidden_size)}``. Attention masks, rotary position
  embeddings (Llama, Mixtral) and T5's relative position bias are computed inside the stage, from its own
  submodules, exactly as the full model computes them.

Parameter names are those of the ``transformers`` model: the whole GPT-2 has ``transformer.h.0.attn.c_attn.weight``
and a middle Llama stage ``layers.0.self_attn.q_proj.weight`` (the names inside ``model.layers``). Tied
parameters are one :class:`torch.nn.Parameter` reachable under several names, so ``named_parameters()``
lists each once, under its first name (``transformer.wte.weight`` for GPT-2's head, ``shared.weight`` for
T5's embeddings and head).

Every build is deterministic: weights and inputs are drawn inside :func:`torch.random.fork_rng` from the
spec's seed, so the same spec gives identical weights and inputs and the global random state is untouched.
All dropout probabilities default to zero, so forward calls are deterministic too (Mixtral's router jitter
is zero as well).

The layer runners of the middle stages (:func:`run_gpt2_blocks`, :func:`run_rotary_layers`,
:func:`position_ids_of`), :func:`default_config`, :func:`import_transformers`, the spec grammar
(:func:`hf_architecture`, :func:`hf_query`) and the boolean words of a spec value (:data:`TRUE_WORDS`,
:data:`FALSE_WORDS`) are public: :mod:`graphkit.models.huggingface_stages`
builds the pipeline stages of ``hf:gpt2`` and ``hf:llama`` from them.

``transformers`` is an optional dependency (``pip install 'graphkit[models]'``); it is imported only when a
spec is loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "FALSE_WORDS",
    "KNOWN_ARCHITECTURES",
    "STAGES",
    "TRUE_WORDS",
    "HFSpec",
    "default_config",
    "hf_architecture",
    "hf_query",
    "import_transformers",
    "load_hf_spec",
    "parse_hf_spec",
    "position_ids_of",
    "run_gpt2_blocks",
    "run_rotary_layers",
]

PREFIX = "hf:"
"""The scheme that marks a Hugging Face model spec."""

STAGES = ("whole", "middle")
"""The stages a spec can ask for: the whole model, or its transformer layers only."""

# The layer call signatures and mask helpers used below are those of transformers 5.
_MINIMUM_TRANSFORMERS_MAJOR = 5
_SPECIAL_KEYS = ("stage", "batch", "seq", "seed")
_IMPLEMENTATION_KEYS = ("attn_implementation", "experts_implementation")
_GPT2_STYLE_ALIASES = {
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_embd": "hidden_size",
}
# Config fields that describe a checkpoint or the output format, not the model: never useful in a spec.
_META_FIELDS = frozenset(
    {
        "transformers_version",
        "architectures",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "dtype",
        "id2label",
        "label2id",
        "problem_type",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "use_cache",
        "rope_parameters",
    }
)
TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
"""The words a spec value may use for True (lower case): ``true``, ``1``, ``yes``, ``on``."""

FALSE_WORDS = frozenset({"false", "0", "no", "off"})
"""The words a spec value may use for False (lower case): ``false``, ``0``, ``no``, ``off``."""


@dataclass(slots=True, frozen=True)
class _Architecture:
    """How to build one architecture.

    Attributes:
        description: one line for command-line help.
        config_class: name of the config class in ``transformers``.
        model_class: name of the model class with a head, built whole and then split into graphkit modules.
        defaults: config fields of the tiny default model.
        positions_field: config field bounding the sequence length, or None (relative positions).
        is_mixture_of_experts: whether ``experts_implementation`` applies.
    """

    description: str
    config_class: str
    model_class: str
    defaults: dict[str, Any]
    positions_field: str | None
    is_mixture_of_experts: bool = False


_ARCHITECTURES: dict[str, _Architecture] = {
    "gpt2": _Architecture(
        description="GPT-2 decoder, learned positions, head tied to the token embedding (GPT2LMHeadModel)",
        config_class="GPT2Config",
        model_class="GPT2LMHeadModel",
        defaults={
            "vocab_size": 128,
            "n_positions": 64,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "summary_first_dropout": 0.0,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
        positions_field="n_positions",
    ),
    "llama": _Architecture(
        description="Llama decoder, rotary positions, RMSNorm, SwiGLU, grouped-query attention (LlamaForCausalLM)",
        config_class="LlamaConfig",
        model_class="LlamaForCausalLM",
        defaults={
            "vocab_size": 128,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        positions_field="max_position_embeddings",
    ),
    "bert": _Architecture(
        description="BERT encoder with its masked-language-model head tied to the word embedding (BertForMaskedLM)",
        config_class="BertConfig",
        model_class="BertForMaskedLM",
        defaults={
            "vocab_size": 128,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
        positions_field="max_position_embeddings",
    ),
    "t5": _Architecture(
        description="T5 encoder-decoder, relative position bias shared across layers, tied embeddings and head",
        config_class="T5Config",
        model_class="T5ForConditionalGeneration",
        defaults={
            "vocab_size": 128,
            "d_model": 32,
            "d_kv": 8,
            "d_ff": 64,
            "num_layers": 2,
            "num_heads": 4,
            "relative_attention_num_buckets": 8,
            "relative_attention_max_distance": 16,
            "dropout_rate": 0.0,
            "decoder_start_token_id": 0,
        },
        positions_field=None,
    ),
    "mixtral": _Architecture(
        description="Mixtral sparse mixture of experts: Llama-style attention, top-2 routing over 4 experts",
        config_class="MixtralConfig",
        model_class="MixtralForCausalLM",
        defaults={
            "vocab_size": 128,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 64,
            "attention_dropout": 0.0,
            "router_jitter_noise": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        positions_field="max_position_embeddings",
        is_mixture_of_experts=True,
    ),
}

KNOWN_ARCHITECTURES: dict[str, str] = {name: arch.description for name, arch in _ARCHITECTURES.items()}
"""The architectures a spec ``hf:ARCH`` can name, with a one-line description of each."""


def default_config(arch: str) -> dict[str, Any]:
    """The config fields of the tiny default model of ``arch`` (one of :data:`KNOWN_ARCHITECTURES`), a new dict.

    These are the fields a spec ``hf:ARCH`` starts from before its overrides (attention implementation
    aside): small widths, two layers, every dropout probability zero.

    Raises:
        KeyError: ``arch`` is not one of :data:`KNOWN_ARCHITECTURES`.
    """
    return dict(_ARCHITECTURES[arch].defaults)


@dataclass(slots=True, frozen=True)
class HFSpec:
    """A parsed spec ``hf:ARCH[?key=value&...]``.

    Attributes:
        arch: the architecture, one of :data:`KNOWN_ARCHITECTURES`.
        stage: ``"whole"`` or ``"middle"``.
        batch: number of sequences in the generated inputs (>= 1).
        seq: tokens per sequence in the generated inputs (>= 1).
        seed: seed of the random weights and inputs.
        overrides: config keys and their raw string values, in spec order, not yet converted.
    """

    arch: str
    stage: str = "whole"
    batch: int = 2
    seq: int = 8
    seed: int = 0
    overrides: tuple[tuple[str, str], ...] = ()


def parse_hf_spec(spec: str) -> HFSpec:
    """Parse ``hf:ARCH[?key=value&...]`` (the ``hf:`` prefix may be left out) into an :class:`HFSpec`.

    Checks the architecture, the special keys (``stage``, ``batch``, ``seq``, ``seed``) and the shape of the
    query; config keys are checked by :func:`load_hf_spec`, which needs ``transformers`` for that.

    Raises:
        ValueError: unknown architecture (the message lists the known ones), a piece of the query without
            ``=``, a key given twice, an unknown stage, or a non-integer / non-positive batch, seq or seed.
    """
    arch = hf_architecture(spec)
    if arch not in _ARCHITECTURES:
        close = difflib.get_close_matches(arch, list(_ARCHITECTURES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown Hugging Face architecture {arch!r} in spec {spec!r}.{hint} "
            f"Known architectures: {', '.join(_ARCHITECTURES)}."
        )
    values: dict[str, str] = {}
    for key, value in hf_query(spec):
        if key in values:
            raise ValueError(f"key {key!r} is given twice in spec {spec!r}")
        values[key] = value

    stage = values.pop("stage", "whole").lower()
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} in spec {spec!r}; expected one of: {', '.join(STAGES)}")
    batch = _parse_count(values.pop("batch", "2"), "batch", spec, minimum=1)
    seq = _parse_count(values.pop("seq", "8"), "seq", spec, minimum=1)
    seed = _parse_count(values.pop("seed", "0"), "seed", spec, minimum=0)
    return HFSpec(arch=arch, stage=stage, batch=batch, seq=seq, seed=seed, overrides=tuple(values.items()))


def hf_architecture(spec: str) -> str:
    """The ARCH of ``hf:ARCH[?key=value&...]``, in lower case (the ``hf:`` prefix may be left out)."""
    text = spec.strip()
    if text.startswith(PREFIX):
        text = text[len(PREFIX) :]
    return text.partition("?")[0].strip().lower()


def hf_query(spec: str) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of ``hf:ARCH?key=value&...``, in spec order, stripped; empty pieces
    (``a=1&&b=2``) are skipped. Keys are not checked here: a model spec and a pipeline spec take different
    ones.

    Raises:
        ValueError: a piece without ``=`` or without a key.
    """
    pairs = []
    for piece in spec.partition("?")[2].split("&"):
        if not piece.strip():
            continue
        key, equals, value = piece.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key:
            raise ValueError(f"spec {spec!r}: expected key=value, got {piece!r}")
        pairs.append((key, value))
    return pairs


def load_hf_spec(spec: str) -> tuple[nn.Module, dict[str, Tensor]]:
    """Build the model and inputs that ``spec`` (``hf:ARCH[?key=value&...]``) describes.

    The model is float32, on the CPU, in training mode (all dropout probabilities zero unless overridden), with
    random weights drawn from the spec's seed; see the module docstring for the grammar and the stages.

    Returns:
        ``(module, inputs)`` where ``inputs`` is a dict of keyword arguments for ``module``:

        * ``stage=whole``: ``{"input_ids": int64 (batch, seq)}``, plus ``"decoder_input_ids"`` (same shape) for
          T5; ``module(**inputs)`` returns ``{"logits": float32 (batch, seq, vocab_size)}``.
        * ``stage=middle``: ``{"hidden_states": float32 (batch, seq, hidden_size), requires_grad=True}``;
          ``module(**inputs)`` returns ``{"hidden_states": float32 (batch, seq, hidden_size)}``.

        The module has an attribute ``config``: the ``transformers`` config it was built from.

    Raises:
        ImportError: ``transformers`` is not installed, or older than 5 (the message says what to install).
        ValueError: unknown architecture or key (with the closest valid keys), a value that does not convert to
            the field's type, or ``seq`` larger than the architecture's explicitly set position limit.
    """
    parsed = parse_hf_spec(spec)
    arch = _ARCHITECTURES[parsed.arch]
    transformers = import_transformers()
    config_class = getattr(transformers, arch.config_class)
    model_class = getattr(transformers, arch.model_class)

    fields = dict(arch.defaults)
    fields["attn_implementation"] = "eager"
    if arch.is_mixture_of_experts:
        fields["experts_implementation"] = "eager"
    explicit = _convert_overrides(parsed, arch, config_class, fields)
    fields.update(explicit)
    if arch.positions_field is not None and fields[arch.positions_field] < parsed.seq:
        if arch.positions_field in explicit:
            raise ValueError(
                f"seq={parsed.seq} is longer than {arch.positions_field}={fields[arch.positions_field]} "
                f"in spec {spec!r}; raise {arch.positions_field} or shorten seq"
            )
        fields[arch.positions_field] = parsed.seq
    config = config_class(**fields)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(parsed.seed)
        model = model_class(config)
        module = _BUILDERS[(parsed.arch, parsed.stage)](model)
        if parsed.stage == "whole":
            inputs = {"input_ids": torch.randint(0, config.vocab_size, (parsed.batch, parsed.seq))}
            if parsed.arch == "t5":
                inputs["decoder_input_ids"] = torch.randint(0, config.vocab_size, (parsed.batch, parsed.seq))
        else:
            hidden_states = torch.randn(parsed.batch, parsed.seq, config.hidden_size)
            inputs = {"hidden_states": hidden_states.requires_grad_()}
    return module, inputs


def import_transformers() -> Any:
    """Import ``transformers``; raise an ImportError naming the extra to install when it is missing or too old."""
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "Hugging Face model specs (hf:...) need the 'transformers' package: pip install 'graphkit[models]'"
        ) from error
    major = int(re.match(r"\d+", transformers.__version__).group())
    if major < _MINIMUM_TRANSFORMERS_MAJOR:
        raise ImportError(
            f"Hugging Face model specs (hf:...) need transformers {_MINIMUM_TRANSFORMERS_MAJOR} or newer, "
            f"found {transformers.__version__}: pip install --upgrade 'transformers>={_MINIMUM_TRANSFORMERS_MAJOR}'"
        )
    return transformers


def _parse_count(value: str, key: str, spec: str, *, minimum: int) -> int:
    """Parse an integer special key, at least ``minimum``; raise ValueError naming the key otherwise."""
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{key} must be an integer in spec {spec!r}, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{key} must be at least {minimum} in spec {spec!r}, got {number}")
    return number


def _convert_overrides(
    parsed: HFSpec, arch: _Architecture, config_class: type, defaults: dict[str, Any]
) -> dict[str, Any]:
    """Map each override key to its canonical config field and convert its value to the field's type.

    Raises:
        ValueError: unknown key (the message suggests the closest valid keys), or a value that does not convert.
    """
    default_config = config_class(**defaults)
    field_names = [
        field.name for field in dataclasses.fields(config_class) if field.name not in _META_FIELDS
    ] + list(_IMPLEMENTATION_KEYS[: 2 if arch.is_mixture_of_experts else 1])
    aliases: dict[str, str] = {}
    for alias, target in _GPT2_STYLE_ALIASES.items():
        if alias not in field_names:
            aliases[alias] = target
    attribute_map: dict[str, str] = getattr(config_class, "attribute_map", {})
    for alias, target in list(aliases.items()):
        aliases[alias] = attribute_map.get(target, target)
    aliases.update(attribute_map)

    converted: dict[str, Any] = {}
    for key, raw in parsed.overrides:
        field = aliases.get(key, key)
        if field not in field_names:
            valid = sorted(set(field_names) | set(aliases) | set(_SPECIAL_KEYS))
            close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
            raise ValueError(
                f"unknown key {key!r} for hf:{parsed.arch}.{hint} Valid keys: {', '.join(_SPECIAL_KEYS)} and the "
                f"fields of transformers.{arch.config_class}: {', '.join(sorted(field_names))}."
            )
        if field in converted:
            raise ValueError(f"config field {field!r} is set twice (through {key!r}) for hf:{parsed.arch}")
        default = defaults[field] if field in defaults else getattr(default_config, field, None)
        converted[field] = _convert_value(raw, default, key)
    return converted


def _convert_value(raw: str, default: Any, key: str) -> Any:
    """Convert the string ``raw`` to the type of ``default`` (bool, int, float or str); ``none`` gives None.

    When ``default`` is None the type is guessed: int, then float, then bool words, then the string itself.

    Raises:
        ValueError: ``raw`` is not a value of the default's type, or the field holds a list or dict.
    """
    if raw.lower() in {"none", "null"}:
        return None
    if isinstance(default, bool):
        word = raw.lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ValueError(f"{key} expects a boolean (true/false), got {raw!r}")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{key} expects an integer, got {raw!r}") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{key} expects a number, got {raw!r}") from None
    if isinstance(default, str):
        return raw
    if default is None:
        for parse in (int, float):
            try:
                return parse(raw)
            except ValueError:
                pass
        if raw.lower() in TRUE_WORDS - {"1"}:
            return True
        if raw.lower() in FALSE_WORDS - {"0"}:
            return False
        return raw
    raise ValueError(f"{key} holds a {type(default).__name__}, which a spec cannot set")


# --- whole models ---------------------------------------------------------------------------------------------


class CausalLanguageModel(nn.Module):
    """A decoder-only language model with its head: token ids in, ``{"logits": ...}`` out.

    Holds the ``transformers`` model's submodules under their own names (``transformer`` or ``model`` for the
    layers, ``lm_head`` for the head) and runs them as the ``transformers`` model does, without loss, cache,
    router logits or auxiliary loss.
    """

    def __init__(self, model: nn.Module, backbone_name: str) -> None:
        super().__init__()
        self.config = model.config
        self.backbone_name = backbone_name
        self.add_module(backbone_name, getattr(model, backbone_name))
        self.lm_head = model.lm_head

    def forward(self, input_ids: Tensor) -> dict[str, Tensor]:
        """``input_ids``: int64 (batch, seq). Returns ``{"logits": (batch, seq, vocab_size)}``."""
        backbone = getattr(self, self.backbone_name)
        hidden_states = backbone(input_ids=input_ids, use_cache=False).last_hidden_state
        return {"logits": self.lm_head(hidden_states)}


class MaskedLanguageModel(nn.Module):
    """BERT with its masked-language-model head (``bert``, ``cls``): token ids in, ``{"logits": ...}`` out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.config = model.config
        self.bert = model.bert
        self.cls = model.cls

    def forward(self, input_ids: Tensor) -> dict[str, Tensor]:
        """``input_ids``: int64 (batch, seq). Returns ``{"logits": (batch, seq, vocab_size)}``."""
        hidden_states = self.bert(input_ids=input_ids).last_hidden_state
        return {"logits": self.cls(hidden_states)}


class EncoderDecoderLanguageModel(nn.Module):
    """T5 (``shared``, ``encoder``, ``decoder``, ``lm_head``): encoder and decoder token ids in, logits out.

    ``shared.weight`` is the one embedding of both stacks and the weight of the head.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.config = model.config
        self.shared = model.shared
        self.encoder = model.encoder
        self.decoder = model.decoder
        self.lm_head = model.lm_head
        self.output_scale = model.model_dim**-0.5 if model.config.scale_decoder_outputs else None

    def forward(self, input_ids: Tensor, decoder_input_ids: Tensor) -> dict[str, Tensor]:
        """Both inputs int64 (batch, seq). Returns ``{"logits": (batch, decoder seq, vocab_size)}``."""
        encoded = self.encoder(input_ids=input_ids).last_hidden_state
        decoded = self.decoder(
            input_ids=decoder_input_ids, encoder_hidden_states=encoded, use_cache=False
        ).last_hidden_state
        if self.output_scale is not None:
            decoded = decoded * self.output_scale
        return {"logits": self.lm_head(decoded)}


# --- middle stages --------------------------------------------------------------------------------------------


def position_ids_of(hidden_states: Tensor) -> Tensor:
    """Positions ``0 .. seq-1`` as int64 (1, seq), on the device of ``hidden_states`` (batch, seq, hidden)."""
    return torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)


class RotaryDecoderStage(nn.Module):
    """The decoder layers of a Llama or Mixtral (``layers``, ``rotary_emb``): hidden states in and out.

    The causal mask (sliding-window when the config sets ``sliding_window``) and the rotary cos/sin are
    computed from the input's shape, device and dtype, as the full model computes them.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from transformers import masking_utils

        self.config = model.config
        self.layers = model.model.layers
        self.rotary_emb = model.model.rotary_emb
        if getattr(self.config, "sliding_window", None) is None:
            self.make_mask = masking_utils.create_causal_mask
        else:
            self.make_mask = masking_utils.create_sliding_window_causal_mask

    def forward(self, hidden_states: Tensor) -> dict[str, Tensor]:
        """``hidden_states``: (batch, seq, hidden_size). Returns ``{"hidden_states": same shape}``."""
        hidden_states = run_rotary_layers(
            self.layers, self.rotary_emb, self.make_mask, self.config, hidden_states
        )
        return {"hidden_states": hidden_states}


def run_rotary_layers(
    layers: Any, rotary_emb: nn.Module, make_mask: Any, config: Any, hidden_states: Tensor
) -> Tensor:
    """Run Llama-style decoder layers as ``LlamaModel.forward`` runs them, without a KV cache.

    The causal mask (``make_mask``) and the rotary cos/sin (``rotary_emb``, computed once for all layers) come
    from the shape, device and dtype of ``hidden_states`` (batch, seq, hidden_size), positions ``0 .. seq-1``.
    Returns the hidden states after the last layer, same shape.
    """
    position_ids = position_ids_of(hidden_states)
    mask = _causal_mask(make_mask, config, hidden_states, position_ids)
    position_embeddings = rotary_emb(hidden_states, position_ids=position_ids)
    for layer in layers:
        hidden_states = layer(
            hidden_states,
            attention_mask=mask,
            position_ids=position_ids,
            position_embeddings=position_embeddings,
            use_cache=False,
        )
    return hidden_states


def _causal_mask(make_mask: Any, config: Any, hidden_states: Tensor, position_ids: Tensor) -> Any:
    """Call a ``transformers.masking_utils`` mask builder for a stage without a KV cache.

    transformers 5.17 names the cache argument ``past_key_values``; later releases name it ``cache``.
    The positions of a stage are always ``0 .. seq-1`` (one unpadded sequence per row), so they are not
    passed: with them, the builder looks for packed sequences by reading values (``.item()``), which
    tensors on the ``meta`` device do not have.
    """
    del position_ids  # 0 .. seq-1: the builder's default
    cache_argument = "cache" if "cache" in inspect.signature(make_mask).parameters else "past_key_values"
    return make_mask(
        config=config,
        inputs_embeds=hidden_states,
        attention_mask=None,
        position_ids=None,
        **{cache_argument: None},
    )


class GPT2Stage(nn.Module):
    """The blocks of a GPT-2 (``h``): hidden states in and out, under a causal mask."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from transformers import masking_utils

        self.config = model.config
        self.h = model.transformer.h
        self.make_mask = masking_utils.create_causal_mask

    def forward(self, hidden_states: Tensor) -> dict[str, Tensor]:
        """``hidden_states``: (batch, seq, hidden_size). Returns ``{"hidden_states": same shape}``."""
        return {"hidden_states": run_gpt2_blocks(self.h, self.make_mask, self.config, hidden_states)}


def run_gpt2_blocks(blocks: Any, make_mask: Any, config: Any, hidden_states: Tensor) -> Tensor:
    """Run GPT-2 blocks under a causal mask (``make_mask``) as ``GPT2Model.forward`` runs them, without a cache.

    ``hidden_states``: (batch, seq, n_embd), positions ``0 .. seq-1``; returns the same shape.
    """
    position_ids = position_ids_of(hidden_states)
    mask = _causal_mask(make_mask, config, hidden_states, position_ids)
    for block in blocks:
        hidden_states = block(hidden_states, attention_mask=mask, use_cache=False, position_ids=position_ids)
    return hidden_states


class BertStage(nn.Module):
    """The encoder layers of a BERT (``layer``): hidden states in and out, every token attends to every token."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from transformers import masking_utils

        self.config = model.config
        self.layer = model.bert.encoder.layer
        self.make_mask = masking_utils.create_bidirectional_mask

    def forward(self, hidden_states: Tensor) -> dict[str, Tensor]:
        """``hidden_states``: (batch, seq, hidden_size). Returns ``{"hidden_states": same shape}``."""
        mask = self.make_mask(config=self.config, inputs_embeds=hidden_states, attention_mask=None)
        for layer in self.layer:
            hidden_states = layer(hidden_states, attention_mask=mask)
        return {"hidden_states": hidden_states}


class T5EncoderStage(nn.Module):
    """The encoder blocks of a T5 (``block``): hidden states in and out.

    The first block owns ``relative_attention_bias``; the position bias it computes is reused by every later
    block, so that one parameter reaches the output through every layer.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from transformers import masking_utils

        self.config = model.encoder.config
        self.block = model.encoder.block
        self.make_mask = masking_utils.create_bidirectional_mask

    def forward(self, hidden_states: Tensor) -> dict[str, Tensor]:
        """``hidden_states``: (batch, seq, d_model). Returns ``{"hidden_states": same shape}``."""
        mask = self.make_mask(config=self.config, inputs_embeds=hidden_states, attention_mask=None)
        position_bias = None
        for block in self.block:
            hidden_states, position_bias, _ = block(
                hidden_states, attention_mask=mask, position_bias=position_bias
            )
        return {"hidden_states": hidden_states}


_BUILDERS: dict[tuple[str, str], Callable[[nn.Module], nn.Module]] = {
    ("gpt2", "whole"): lambda model: CausalLanguageModel(model, "transformer"),
    ("llama", "whole"): lambda model: CausalLanguageModel(model, "model"),
    ("mixtral", "whole"): lambda model: CausalLanguageModel(model, "model"),
    ("bert", "whole"): MaskedLanguageModel,
    ("t5", "whole"): EncoderDecoderLanguageModel,
    ("gpt2", "middle"): GPT2Stage,
    ("llama", "middle"): RotaryDecoderStage,
    ("mixtral", "middle"): RotaryDecoderStage,
    ("bert", "middle"): BertStage,
    ("t5", "middle"): T5EncoderStage,
}
