"""Pipeline specs: one string that names a model cut into pipeline stages, its loss and one batch.

``graphkit verify-pipeline`` and :func:`graphkit.pipelining.check_pipeline` take a *pipeline spec*:

``path/to/file.py:function`` or ``package.module:function``
    A function that returns a :class:`PipelineModel` (or the tuple ``(stages, loss_fn, inputs, target)``).
    It may declare the keyword parameters ``num_stages`` (how many stages the schedule needs: two per
    rank) and ``batch_size`` (the whole batch: microbatches x data-parallel replicas x 2); it gets those
    it declares. It must build the same model every time it is called (seed it, or let graphkit seed it:
    the checker calls it under a fixed seed on every rank).
``hf:gpt2[?key=value&...]``
    A Hugging Face GPT-2 (``transformers``, random weights, dropout off, head not tied to the embedding,
    so that no parameter spans two ranks) cut into ``num_stages`` stages: stage 0 embeds token ids, the
    last stage ends with ``ln_f`` and ``lm_head``; the loss is the cross entropy of the logits against
    random token ids. Keys: ``n_layer`` (default ``num_stages``), ``n_embd`` (32), ``n_head`` (4),
    ``vocab_size`` (128), ``seq`` (8), ``seed`` (0).

Stage ``i`` receives the outputs of stage ``i - 1`` as positional arguments (stage 0 receives ``inputs``,
one microbatch of them) and returns a tensor or a tuple of tensors; ``loss_fn(output, target)`` of the
last stage's output and one microbatch of ``target`` returns a scalar. The batch is split into equal
microbatches along dimension 0.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from graphkit.models.specs import SpecError, _import_file, _import_module, _looks_like_path, _on_sys_path

__all__ = ["PipelineModel", "load_pipeline_spec"]


@dataclass(slots=True)
class PipelineModel:
    """A model cut into pipeline stages, with its loss and one whole batch.

    Attributes:
        stages: the stage modules, stage 0 first.
        loss_fn: ``loss_fn(output, target) -> scalar tensor``, run on the last stage (an ``nn.Module`` may
            hold parameters: they get gradients too).
        inputs: the positional arguments of stage 0 for the whole batch (dimension 0 is the batch).
        target: the target of the whole batch for ``loss_fn`` (dimension 0 is the batch), or None.
    """

    stages: list[nn.Module]
    loss_fn: Callable[..., Tensor]
    inputs: tuple[Any, ...]
    target: Any = None


def load_pipeline_spec(spec: str | Callable[..., Any], *, num_stages: int, batch_size: int) -> PipelineModel:
    """Build the pipeline a spec names (see the module docstring), with ``num_stages`` stages.

    Args:
        spec: ``path/to/file.py:function``, ``package.module:function``, ``hf:gpt2[?...]``, or the function itself.
        num_stages: how many stages the schedule needs.
        batch_size: the whole batch size the caller will split (passed to functions that declare it).

    Returns:
        A :class:`PipelineModel` with exactly ``num_stages`` stages.

    Raises:
        SpecError: a malformed spec, a missing file, module or function, a function that raises, or one
            that returns something other than a pipeline of ``num_stages`` stages.
    """
    if callable(spec):
        return _checked(
            getattr(spec, "__name__", "function"), _call(spec, spec, num_stages, batch_size), num_stages
        )
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(
            f"a pipeline spec must be path/to/file.py:function, module:function or hf:gpt2; got {spec!r}"
        )
    spec = spec.strip()
    if spec.startswith("hf:"):
        return _checked(spec, gpt2_pipeline(spec, num_stages=num_stages, batch_size=batch_size), num_stages)
    target, colon, function_name = spec.rpartition(":")
    if not colon or not target or not function_name:
        raise SpecError(
            f"pipeline spec {spec!r} names no function: write path/to/file.py:function or module:function "
            "(the function returns (stages, loss_fn, inputs, target))"
        )
    if _looks_like_path(target):
        module = _import_file(spec, Path(target))
        with _on_sys_path(Path(target).resolve().parent):
            function = _function(spec, module, function_name)
            return _checked(spec, _call(spec, function, num_stages, batch_size), num_stages)
    function = _function(spec, _import_module(spec, target), function_name)
    return _checked(spec, _call(spec, function, num_stages, batch_size), num_stages)


def _function(spec: str, module: Any, name: str) -> Callable[..., Any]:
    function = getattr(module, name, None)
    if not callable(function):
        raise SpecError(f"pipeline spec {spec!r}: {module.__name__} has no function {name!r}")
    return function


def _call(spec: Any, function: Callable[..., Any], num_stages: int, batch_size: int) -> Any:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = {}
    offered = {"num_stages": num_stages, "batch_size": batch_size}
    arguments = {name: value for name, value in offered.items() if name in parameters}
    try:
        return function(**arguments)
    except SpecError:
        raise
    except Exception as error:
        raise SpecError(
            f"pipeline spec {spec!r}: the function raised {type(error).__name__}: {error}"
        ) from error


def _checked(spec: Any, result: Any, num_stages: int) -> PipelineModel:
    hint = (
        "return PipelineModel(stages, loss_fn, inputs, target) or the tuple (stages, loss_fn, inputs, target)"
    )
    if isinstance(result, tuple | list) and len(result) == 4:
        stages, loss_fn, inputs, target = result
        result = PipelineModel(list(stages), loss_fn, inputs, target)
    if not isinstance(result, PipelineModel):
        raise SpecError(f"pipeline spec {spec!r} returned a {type(result).__name__}; {hint}")
    if not all(isinstance(stage, nn.Module) for stage in result.stages):
        raise SpecError(f"pipeline spec {spec!r}: every stage must be an nn.Module; {hint}")
    if len(result.stages) != num_stages:
        raise SpecError(
            f"pipeline spec {spec!r} returned {len(result.stages)} stages but the schedule needs {num_stages} "
            "(two per rank); declare a num_stages parameter and build that many"
        )
    if not callable(result.loss_fn):
        raise SpecError(f"pipeline spec {spec!r}: loss_fn is not callable; {hint}")
    if isinstance(result.inputs, Tensor):
        result.inputs = (result.inputs,)
    result.inputs = tuple(result.inputs)
    return result


# --- hf:gpt2 -------------------------------------------------------------------------------------------------
_GPT2_KEYS = {"n_layer", "n_embd", "n_head", "vocab_size", "seq", "seed"}


def gpt2_pipeline(spec: str, *, num_stages: int, batch_size: int) -> PipelineModel:
    """GPT-2 cut into ``num_stages`` stages (``hf:gpt2[?n_layer=..&n_embd=..&n_head=..&vocab_size=..&seq=..&seed=..]``).

    Raises:
        SpecError: another architecture than gpt2, an unknown key, a value that is not an integer, or fewer
            layers than stages.
        ImportError: ``transformers`` is not installed (extra ``models``).
    """
    from graphkit.models.huggingface import _import_transformers

    arch, _, query = spec[len("hf:") :].partition("?")
    if arch != "gpt2":
        raise SpecError(f"pipeline spec {spec!r}: only hf:gpt2 is cut into pipeline stages so far")
    values: dict[str, int] = {}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        if key not in _GPT2_KEYS:
            raise SpecError(
                f"pipeline spec {spec!r}: unknown key {key!r}; valid keys: {', '.join(sorted(_GPT2_KEYS))}"
            )
        try:
            values[key] = int(value)
        except ValueError:
            raise SpecError(f"pipeline spec {spec!r}: {key}={value!r} is not an integer") from None
    layers = values.get("n_layer", num_stages)
    if layers < num_stages:
        raise SpecError(
            f"pipeline spec {spec!r}: {layers} layers cannot fill {num_stages} stages; raise n_layer"
        )
    seq = values.get("seq", 8)
    transformers = _import_transformers()
    config = transformers.GPT2Config(
        vocab_size=values.get("vocab_size", 128),
        n_positions=max(seq, 8),
        n_embd=values.get("n_embd", 32),
        n_layer=layers,
        n_head=values.get("n_head", 4),
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
        input_ids = torch.randint(0, config.vocab_size, (batch_size, seq))
        target = torch.randint(0, config.vocab_size, (batch_size, seq))
    bounds = [round(index * layers / num_stages) for index in range(num_stages + 1)]
    blocks = list(model.transformer.h)
    stages: list[nn.Module] = []
    for index in range(num_stages):
        mine = blocks[bounds[index] : bounds[index + 1]]
        embedding = (model.transformer.wte, model.transformer.wpe) if index == 0 else None
        head = (model.transformer.ln_f, model.lm_head) if index == num_stages - 1 else None
        stages.append(GPT2PipelineStage(config, mine, embedding, head))
    return PipelineModel(stages, _token_cross_entropy, (input_ids,), target)


def _token_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


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
        from graphkit.models.huggingface import _causal_mask

        if self.wte is not None:
            positions = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
            hidden_states = self.wte(hidden_states) + self.wpe(positions)
        position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
        mask = _causal_mask(self.make_mask, self.config, hidden_states, position_ids)
        for block in self.h:
            hidden_states = block(
                hidden_states, attention_mask=mask, use_cache=False, position_ids=position_ids
            )
        if self.ln_f is not None:
            hidden_states = self.lm_head(self.ln_f(hidden_states))
        return hidden_states
