"""Pipeline specs: one string that names a model cut into pipeline stages, its loss and one whole batch.

Every pipeline command takes a *pipeline spec* - ``graphkit verify-pipeline``, ``graphkit costs``,
``graphkit timeline``, ``graphkit compare-schedules`` - and so do :func:`graphkit.pipelining.verify_pipeline`,
:func:`graphkit.measure.costs.spec_costs` and :func:`graphkit.pipelining.recording.record_schedules`.
It has one of three forms:

``path/to/file.py:function`` or ``package.module:function``
    A function that returns a :class:`PipelineModel` (or the tuple ``(stages, loss_fn, inputs, target)``).
    It may declare the keyword parameters ``num_stages`` (how many stages the command needs) and
    ``batch_size`` (the whole batch, which the command splits into microbatches); it gets those it
    declares. It must build the same model every time it is called (seed it, or let graphkit seed it:
    every command calls it under ``torch.manual_seed(0)``, on every rank).
``zoo-pipeline:NAME``
    A built-in pipeline of this module (:data:`PIPELINES`): ``zoo-pipeline:mlp`` (MLP blocks of Linear,
    GELU, Linear, width 64) and ``zoo-pipeline:mlp_wide`` (width 512, hidden 2048: milliseconds of compute
    per pass). Both take ``num_stages`` and ``batch_size``.
``hf:gpt2[?key=value&...]`` and ``hf:llama[?key=value&...]``
    A Hugging Face GPT-2 or Llama (``transformers``, random weights, dropout off, eager attention) cut into
    ``num_stages`` stages: stage 0 embeds token ids, every stage computes its own causal mask (and, for
    Llama, rotary position embeddings), the last stage ends with the final norm and ``lm_head``; the loss
    is the cross entropy of the logits against random token ids. The head is not tied to the embedding, so
    that no parameter spans two ranks. Keys of ``hf:gpt2`` (:func:`gpt2_pipeline`): ``n_layer`` (default
    ``num_stages``), ``n_embd`` (32), ``n_head`` (4), ``vocab_size`` (128), ``seq`` (8), ``seed`` (0). Keys
    of ``hf:llama`` (:func:`llama_pipeline`): ``num_hidden_layers`` (default ``num_stages``),
    ``hidden_size`` (32), ``num_attention_heads`` (4), ``num_key_value_heads`` (2), ``intermediate_size``
    (64), ``vocab_size`` (128), ``seq`` (8), ``seed`` (0), ``tie_word_embeddings`` (0; 1 only with one
    stage). Both also take the other's layer, width and head names (``n_layer`` / ``num_hidden_layers``,
    ...), as the model specs of :mod:`graphkit.models.huggingface` do.

What the function returns:

- ``stages``: a list of ``nn.Module``, stage 0 first. Stage ``i`` receives the outputs of stage ``i - 1`` as
  positional arguments (a tuple is spread), as ``torch.distributed.pipelining.PipelineStage`` passes them;
- ``loss_fn(output, target) -> scalar tensor`` of the last stage's output and one microbatch of the
  target, as the schedules call it (an ``nn.Module`` may hold parameters: they get gradients too);
- ``inputs``: the positional arguments of stage 0 for the **whole batch** (dimension 0 is the batch);
- ``target``: the target of the whole batch (dimension 0 is the batch), or None (a loss that ignores it).

The batch is split into equal microbatches along dimension 0, as ``torch.distributed.pipelining``
splits it (:meth:`PipelineModel.microbatches`). What each command asks for:

- ``verify-pipeline`` / :func:`~graphkit.pipelining.verification.verify_pipeline`: ``num_stages`` =
  stages per rank (``--stages-per-rank``, 2) x pipeline ranks; ``batch_size`` = 2 rows per microbatch x
  microbatches x data-parallel replicas;
- ``costs``: ``--num-stages`` and ``--batch-size``, else the function's own defaults, else
  :data:`DEFAULT_NUM_STAGES` and :data:`DEFAULT_MICROBATCH_SIZE`; the batch is split into ``--microbatches``
  (default 1: the whole batch is the microbatch measured) and the first one is measured;
- ``timeline`` / ``compare-schedules``: ``num_stages`` as the schedules need - one per rank for GPipe and
  1F1B, two per rank for the V schedules (ZBV, DualPipeV), ``--stages-per-rank`` (2) per rank for the
  interleaved ones; for several schedules the least common multiple, the schedules that need fewer
  chaining consecutive stage modules into one stage, so every schedule runs the same modules;
  ``batch_size`` = ``--batch-size``, else :data:`DEFAULT_MICROBATCH_SIZE` rows x ``--microbatches``.

A function that does not declare ``num_stages`` must return as many stages as the command needs; one that
does not declare ``batch_size`` must return a batch that splits into the command's microbatches.
:func:`load_stage_or_pipeline` takes a model spec (:mod:`graphkit.models.specs`, one stage) or a
pipeline spec, for ``graphkit costs``. Every mistake raises :class:`~graphkit.models.specs.SpecError`
saying what was wrong and how to fix it.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from graphkit.models.huggingface import _ARCHITECTURES as _HF_ARCHITECTURES
from graphkit.models.huggingface import (
    _FALSE_WORDS,
    _TRUE_WORDS,
    _import_transformers,
    _position_ids,
    _run_gpt2_blocks,
    _run_rotary_layers,
)
from graphkit.models.specs import (
    SpecError,
    _check_result,
    _import_file,
    _import_module,
    _looks_like_path,
    _on_sys_path,
    load_spec,
)

__all__ = [
    "DEFAULT_MICROBATCH_SIZE",
    "DEFAULT_NUM_STAGES",
    "PIPELINES",
    "PIPELINE_ARCHITECTURES",
    "GPT2PipelineStage",
    "LlamaPipelineStage",
    "PipelineModel",
    "gpt2_pipeline",
    "hf_pipeline",
    "llama_pipeline",
    "load_pipeline_spec",
    "load_stage_or_pipeline",
    "mlp_pipeline",
    "mlp_wide_pipeline",
]

DEFAULT_NUM_STAGES = 2
"""Stages built where the caller needs no particular number and the function has no default of its own."""

DEFAULT_MICROBATCH_SIZE = 8
"""Rows per microbatch where the caller gives no batch size (and, for ``costs``, the function has no default)."""

_HINT = (
    "return PipelineModel(stages, loss_fn, inputs, target) or the tuple (stages, loss_fn, inputs, target): "
    "a list of nn.Module, loss_fn(output, target), stage 0's inputs for the whole batch, its target or None"
)


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

    @property
    def batch_size(self) -> int:
        """The size of dimension 0 of the first tensor input (1 when no input is a batched tensor)."""
        first = next((value for value in self.inputs if isinstance(value, Tensor) and value.dim()), None)
        return int(first.shape[0]) if first is not None else 1

    def microbatches(self, count: int) -> list[tuple[tuple[Any, ...], Any]]:
        """The batch split into ``count`` equal microbatches along dimension 0: ``[(inputs, target), ...]``.

        Each tensor is split as ``torch.distributed.pipelining`` splits it (``tensor_split`` along
        dimension 0) and copied, so that a microbatch owns its storage; other values are passed to every
        microbatch as they are. A target of None stays None.

        Raises:
            SpecError: ``count`` is below 1, or the batch does not split into ``count`` equal parts.
        """
        if count < 1:
            raise SpecError(f"a batch splits into at least 1 microbatch, not {count}")
        sizes = {int(value.shape[0]) for value in (*self.inputs, self.target) if _batched(value)}
        if any(size % count for size in sizes):
            raise SpecError(
                f"the batch (dimension 0 of size {', '.join(map(str, sorted(sizes)))}) does not split into "
                f"{count} equal microbatches; pass a batch size that is a multiple of {count}, or declare "
                "batch_size in the spec function"
            )

        def split(value: Any) -> list[Any]:
            if not _batched(value):
                return [value] * count
            return [part.clone() for part in value.tensor_split(count)]

        inputs = list(zip(*(split(value) for value in self.inputs), strict=True)) or [()] * count
        return list(zip((tuple(part) for part in inputs), split(self.target), strict=True))

    def microbatch(self, count: int = 1, index: int = 0) -> tuple[tuple[Any, ...], Any]:
        """``(inputs, target)`` of microbatch ``index`` when the batch is split into ``count`` (see :meth:`microbatches`)."""
        return self.microbatches(count)[index]

    def schedule_target(self) -> Tensor:
        """The target to pass to a schedule's ``step``: :attr:`target`, or zeros of the batch size for None

        (the schedules index one target per microbatch; a loss without a target ignores them)."""
        return self.target if self.target is not None else torch.zeros(self.batch_size)

    def schedule_loss_fn(self) -> Callable[..., Tensor]:
        """The loss to give a schedule with :meth:`schedule_target`: :attr:`loss_fn`, or, for a target of
        None, a function that calls ``loss_fn(output, None)`` whatever placeholder target it is given."""
        if self.target is not None:
            return self.loss_fn
        loss_fn = self.loss_fn
        return lambda output, _placeholder, **kwargs: loss_fn(output, None, **kwargs)


def _batched(value: Any) -> bool:
    return isinstance(value, Tensor) and value.dim() > 0


# --- loading -------------------------------------------------------------------------------------------------
def load_pipeline_spec(
    spec: str | Callable[..., Any],
    *,
    num_stages: int | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
) -> PipelineModel:
    """Build the pipeline a spec names (see the module docstring).

    Args:
        spec: ``path/to/file.py:function``, ``package.module:function``, ``zoo-pipeline:NAME``,
            ``hf:gpt2[?...]``, ``hf:llama[?...]``, or the function itself.
        num_stages: how many stages the caller needs (passed to functions that declare it, and then
            required of the result); None: the function's own default, else :data:`DEFAULT_NUM_STAGES`
            (any count is then accepted from a function that does not declare it).
        batch_size: the whole batch size the caller will split (passed to functions that declare it);
            None: the function's own default, else :data:`DEFAULT_MICROBATCH_SIZE`.
        seed: call the function under ``torch.manual_seed(seed)`` (the global RNG is restored after), so
            that every call - on every rank - builds the same weights; None: as the RNG stands.

    Returns:
        A :class:`PipelineModel` (``inputs`` always a tuple).

    Raises:
        SpecError: a malformed spec, a missing file, module, function or built-in pipeline, an ``hf:`` spec
            with an architecture not cut into stages or a bad key or value, a function that raises, or one
            that returns something other than a pipeline of ``num_stages`` stages.
        ImportError: an ``hf:`` spec without ``transformers`` installed (extra ``models``).
    """
    if seed is None:
        return _load(spec, num_stages, batch_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _load(spec, num_stages, batch_size)


def _load(spec: Any, num_stages: int | None, batch_size: int | None) -> PipelineModel:
    if callable(spec):
        name = getattr(spec, "__name__", "function")
        return _checked(name, _call(name, spec, num_stages, batch_size), num_stages)
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(
            "a pipeline spec must be path/to/file.py:function, package.module:function, zoo-pipeline:NAME, "
            f"hf:gpt2 or hf:llama; got {spec!r}"
        )
    spec = spec.strip()
    if spec.startswith("hf:"):
        stages = num_stages if num_stages is not None else DEFAULT_NUM_STAGES
        batch = batch_size if batch_size is not None else DEFAULT_MICROBATCH_SIZE
        return _checked(spec, hf_pipeline(spec, num_stages=stages, batch_size=batch), stages)
    if spec.startswith("zoo-pipeline:"):
        return _checked(spec, _call(spec, _builtin(spec), num_stages, batch_size), num_stages)
    if spec.startswith("zoo:"):  # a model spec: one stage, no loss or batch to cut into a pipeline
        name = spec[len("zoo:") :]
        instead = f"zoo-pipeline:{name}" if name in PIPELINES else f"zoo-pipeline:{next(iter(PIPELINES))}"
        raise SpecError(
            f"{spec!r} is a model spec (one stage); a pipeline command takes a pipeline spec: {instead}, "
            f"zoo-pipeline:NAME ({', '.join(PIPELINES)}), hf:gpt2?..., hf:llama?... or path/to/file.py:function "
            "returning (stages, loss_fn, inputs, target) - see docs/pipeline_specs.md; graphkit list names "
            "the built-in ones"
        )
    function = _function_of(spec)
    return _checked(spec, _call(spec, function, num_stages, batch_size), num_stages)


def _builtin(spec: str) -> Callable[..., Any]:
    name = spec[len("zoo-pipeline:") :]
    if name not in PIPELINES:
        raise SpecError(f"unknown built-in pipeline {name!r} in {spec!r}; known: {', '.join(PIPELINES)}")
    return PIPELINES[name]


def _function_of(spec: str) -> Callable[..., Any]:
    target, colon, function_name = spec.rpartition(":")
    if not colon or not target or not function_name:
        raise SpecError(
            f"pipeline spec {spec!r} names no function: write path/to/file.py:function, "
            "package.module:function, zoo-pipeline:NAME, hf:gpt2 or hf:llama (the function returns "
            "(stages, loss_fn, inputs, target))"
        )
    if _looks_like_path(target):
        module = _import_file(spec, Path(target))
        function = getattr(module, function_name, None)
        if callable(function):
            folder = Path(target).resolve().parent

            def in_its_folder(**arguments: Any) -> Any:  # it may import files next to it
                with _on_sys_path(folder):
                    return function(**arguments)

            in_its_folder.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
            return in_its_folder
    else:
        module = _import_module(spec, target)
        function = getattr(module, function_name, None)
    if not callable(function):
        raise SpecError(f"pipeline spec {spec!r}: {module.__name__} has no function {function_name!r}")
    return function


def _declared(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return {}


def _arguments(
    function: Callable[..., Any], num_stages: int | None, batch_size: int | None
) -> dict[str, int]:
    """What to pass: each declared parameter the caller has a value for, or that has no default."""
    parameters = _declared(function)
    fallbacks = {"num_stages": DEFAULT_NUM_STAGES, "batch_size": DEFAULT_MICROBATCH_SIZE}
    arguments = {}
    for name, value in (("num_stages", num_stages), ("batch_size", batch_size)):
        if name not in parameters:
            continue
        if value is not None:
            arguments[name] = value
        elif parameters[name].default is inspect.Parameter.empty:
            arguments[name] = fallbacks[name]
    return arguments


def _call(spec: Any, function: Callable[..., Any], num_stages: int | None, batch_size: int | None) -> Any:
    required = [
        name
        for name, parameter in _declared(function).items()
        if name not in ("num_stages", "batch_size")
        and parameter.default is inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if required:
        raise SpecError(
            f"pipeline spec {spec!r}: the function requires {required!r}; a pipeline spec function may "
            "declare only num_stages and batch_size (give the others defaults)"
        )
    try:
        return function(**_arguments(function, num_stages, batch_size))
    except SpecError:
        raise
    except Exception as error:
        raise SpecError(
            f"pipeline spec {spec!r}: the function raised {type(error).__name__}: {error}"
        ) from error


def _checked(spec: Any, result: Any, num_stages: int | None) -> PipelineModel:
    if isinstance(result, tuple | list) and len(result) == 4:
        stages, loss_fn, inputs, target = result
        if not isinstance(stages, list | tuple):
            raise SpecError(f"pipeline spec {spec!r}: the stages are a {type(stages).__name__}; {_HINT}")
        result = PipelineModel(list(stages), loss_fn, inputs, target)
    if not isinstance(result, PipelineModel):
        got = type(result).__name__ + (
            f" of length {len(result)}" if isinstance(result, tuple | list) else ""
        )
        raise SpecError(f"pipeline spec {spec!r} returned a {got}; {_HINT}")
    if not result.stages or not all(isinstance(stage, nn.Module) for stage in result.stages):
        raise SpecError(f"pipeline spec {spec!r}: the stages must be a non-empty list of nn.Module; {_HINT}")
    if num_stages is not None and len(result.stages) != num_stages:
        raise SpecError(
            f"pipeline spec {spec!r} returned {len(result.stages)} stages but {num_stages} are needed; "
            "declare a num_stages parameter and build that many"
        )
    if not callable(result.loss_fn):
        raise SpecError(f"pipeline spec {spec!r}: loss_fn is a {type(result.loss_fn).__name__}; {_HINT}")
    if isinstance(result.inputs, Tensor):
        result.inputs = (result.inputs,)
    if not isinstance(result.inputs, tuple | list):
        raise SpecError(
            f"pipeline spec {spec!r}: inputs is a {type(result.inputs).__name__}, not a tuple of stage 0's "
            f"positional arguments; {_HINT}"
        )
    result.inputs = tuple(result.inputs)
    if result.target is not None and not isinstance(result.target, Tensor):
        raise SpecError(
            f"pipeline spec {spec!r}: the target is a {type(result.target).__name__}, not a tensor"
        )
    return result


def load_stage_or_pipeline(
    spec: str,
    *,
    pipeline: bool | None = None,
    num_stages: int | None = None,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> PipelineModel | tuple[nn.Module, Any]:
    """A :class:`PipelineModel` when ``spec`` names a pipeline, else the ``(module, inputs)`` of a model spec.

    Used by ``graphkit costs``, which measures one stage or every stage of a pipeline.

    Args:
        spec: a model spec (:func:`graphkit.models.specs.load_spec`) or a pipeline spec (module docstring).
        pipeline: True: a pipeline spec (``hf:gpt2`` and ``hf:llama`` are ones only so); False: a model
            spec; None: decide: ``zoo:`` and ``hf:`` are model specs, ``zoo-pipeline:`` a pipeline, and a
            file or module function is a pipeline when it declares ``num_stages`` or ``batch_size`` or returns a
            :class:`PipelineModel` or ``(list of modules, loss_fn, inputs, target)`` (it is called once).
        num_stages, batch_size, seed: as :func:`load_pipeline_spec` (for a pipeline).

    Raises:
        SpecError: as :func:`load_pipeline_spec` and :func:`graphkit.models.specs.load_spec`.
    """
    if pipeline is True:
        return load_pipeline_spec(spec, num_stages=num_stages, batch_size=batch_size, seed=seed)
    stripped = spec.strip() if isinstance(spec, str) else spec
    if pipeline is False or not isinstance(stripped, str) or ":" not in stripped:
        return load_spec(spec)
    if stripped.startswith(("zoo:", "hf:")):
        return load_spec(stripped)
    if stripped.startswith("zoo-pipeline:"):
        return load_pipeline_spec(stripped, num_stages=num_stages, batch_size=batch_size, seed=seed)
    function = _function_of(stripped)
    if {"num_stages", "batch_size"} & set(_declared(function)):
        return load_pipeline_spec(function, num_stages=num_stages, batch_size=batch_size, seed=seed)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        result = _call(stripped, function, None, None)
    if _is_pipeline_result(result):
        return _checked(stripped, result, num_stages)
    return _check_result(stripped, stripped.rpartition(":")[2] + "()", result)


def _is_pipeline_result(result: Any) -> bool:
    """Whether a spec function's result is a pipeline (a list of modules first), not ``(module, inputs)``."""
    if isinstance(result, PipelineModel):
        return True
    return (
        isinstance(result, tuple | list)
        and len(result) == 4
        and isinstance(result[0], list | tuple)
        and bool(result[0])
        and all(isinstance(stage, nn.Module) for stage in result[0])
    )


# --- zoo-pipeline: built-in pipelines ------------------------------------------------------------------------
class MLPStage(nn.Module):
    """Linear (``width -> hidden``), GELU, Linear (``hidden -> width``); input and output ``(rows, width)``."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.activation = nn.GELU()
        self.down = nn.Linear(hidden, width)

    def forward(self, features: Tensor) -> Tensor:
        return self.down(self.activation(self.up(features)))


def _mean_square(output: Tensor, target: Tensor) -> Tensor:
    return (output.float() ** 2).mean()


def mlp_pipeline(
    num_stages: int = 4, batch_size: int = 32, *, width: int = 64, hidden: int = 256
) -> PipelineModel:
    """``zoo-pipeline:mlp``: ``num_stages`` :class:`MLPStage` blocks (width 64, hidden 256), float32, seeded (0), on the CPU.

    Inputs: ``features`` of shape ``(batch_size, width)``, not requiring grad; the loss is
    ``mean(output ** 2)`` (the target, zeros of shape ``(batch_size,)``, is ignored).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        stages: list[nn.Module] = [MLPStage(width, hidden) for _ in range(num_stages)]
        features = torch.randn(batch_size, width)
    return PipelineModel(stages, _mean_square, (features,), torch.zeros(batch_size))


def mlp_wide_pipeline(num_stages: int = 4, batch_size: int = 64) -> PipelineModel:
    """``zoo-pipeline:mlp_wide``: :func:`mlp_pipeline` with width 512 and hidden 2048 (milliseconds per pass)."""
    return mlp_pipeline(num_stages, batch_size, width=512, hidden=2048)


PIPELINES: dict[str, Callable[..., PipelineModel]] = {"mlp": mlp_pipeline, "mlp_wide": mlp_wide_pipeline}
"""The built-in pipelines, by the NAME of ``zoo-pipeline:NAME``."""

PIPELINE_ARCHITECTURES: dict[str, str] = {
    "gpt2": "GPT-2: embeddings on the first stage, ln_f and an untied lm_head on the last (n_layer, n_embd, n_head, vocab_size, seq, seed)",
    "llama": "Llama: embeddings on the first stage, rotary embeddings and a causal mask on each, the final norm "
    "and lm_head on the last (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, "
    "intermediate_size, vocab_size, tie_word_embeddings, seq, seed)",
}
"""The architectures a pipeline spec ``hf:ARCH`` cuts into stages, with a one-line description of each."""


# --- hf: Hugging Face models cut into stages -----------------------------------------------------------------
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


def hf_pipeline(spec: str, *, num_stages: int, batch_size: int) -> PipelineModel:
    """A Hugging Face model cut into ``num_stages`` stages: ``hf:gpt2[?...]`` or ``hf:llama[?...]``.

    Dispatches to :func:`gpt2_pipeline` or :func:`llama_pipeline` (their docstrings list the keys).

    Raises:
        SpecError: an architecture that is not cut into stages (the message lists those that are), and as
            the architecture's function.
        ImportError: ``transformers`` is not installed (extra ``models``).
    """
    arch = _hf_architecture(spec)
    if arch not in _HF_PIPELINES:
        raise SpecError(
            f"pipeline spec {spec!r}: hf:{arch} is not cut into pipeline stages; the architectures that are: "
            f"{', '.join(f'hf:{name}' for name in _HF_PIPELINES)} (every hf: architecture is a model spec for "
            "capture, groups, verify, render and costs)"
        )
    return _HF_PIPELINES[arch](spec, num_stages=num_stages, batch_size=batch_size)


def _hf_architecture(spec: str) -> str:
    return spec.strip()[len("hf:") :].partition("?")[0].strip().lower()


def _parse_pipeline_query(spec: str, arch: str) -> dict[str, int | bool]:
    """The ``key=value`` pairs of ``spec`` (``hf:ARCH?...``), keyed by their canonical names, values converted.

    Raises:
        SpecError: ``spec`` names another architecture than ``arch``, a piece without ``=``, an unknown key
            (the message lists the valid ones), a key given twice (also through an alias), or a value that is
            not an integer (at least 1; at least 0 for ``seed``) or a boolean where one is expected.
    """
    if _hf_architecture(spec) != arch:
        raise SpecError(f"pipeline spec {spec!r} is not an hf:{arch} spec")
    keys, aliases = _HF_PIPELINE_KEYS[arch], _HF_PIPELINE_ALIASES[arch]
    values: dict[str, int | bool] = {}
    for piece in filter(str.strip, spec.strip().partition("?")[2].split("&")):
        key, equals, value = (part.strip() for part in piece.partition("="))
        if not equals or not key:
            raise SpecError(f"pipeline spec {spec!r}: expected key=value, got {piece!r}")
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
        if value.lower() in _TRUE_WORDS:
            return True
        if value.lower() in _FALSE_WORDS:
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


# --- hf:gpt2 -------------------------------------------------------------------------------------------------
def gpt2_pipeline(spec: str, *, num_stages: int, batch_size: int) -> PipelineModel:
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
    transformers = _import_transformers()
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
    return PipelineModel(stages, _token_cross_entropy, (input_ids,), target)


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
            hidden_states = self.wte(hidden_states) + self.wpe(_position_ids(hidden_states))
        hidden_states = _run_gpt2_blocks(self.h, self.make_mask, self.config, hidden_states)
        if self.ln_f is not None:
            hidden_states = self.lm_head(self.ln_f(hidden_states))
        return hidden_states


# --- hf:llama ------------------------------------------------------------------------------------------------
def llama_pipeline(spec: str, *, num_stages: int, batch_size: int) -> PipelineModel:
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
    fields: dict[str, Any] = dict(_HF_ARCHITECTURES["llama"].defaults)
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
    transformers = _import_transformers()
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
    return PipelineModel(stages, _token_cross_entropy, (input_ids,), target)


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
        hidden_states = _run_rotary_layers(
            self.layers, self.rotary_emb, self.make_mask, self.config, hidden_states
        )
        if self.norm is not None:
            hidden_states = self.lm_head(self.norm(hidden_states))
        return hidden_states


_HF_PIPELINES: dict[str, Callable[..., PipelineModel]] = {"gpt2": gpt2_pipeline, "llama": llama_pipeline}
"""The Hugging Face architectures cut into stages, by the ARCH of ``hf:ARCH``."""
