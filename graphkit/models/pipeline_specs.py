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
    that no parameter spans two ranks (cut by :mod:`graphkit.models.huggingface_stages`). Keys of
    ``hf:gpt2`` (:func:`gpt2_pipeline`): ``n_layer`` (default ``num_stages``), ``n_embd`` (32), ``n_head``
    (4), ``vocab_size`` (128), ``seq`` (8), ``seed`` (0). Keys of ``hf:llama`` (:func:`llama_pipeline`):
    ``num_hidden_layers`` (default ``num_stages``), ``hidden_size`` (32), ``num_attention_heads`` (4),
    ``num_key_value_heads`` (2), ``intermediate_size`` (64), ``vocab_size`` (128), ``seq`` (8), ``seed`` (0),
    ``tie_word_embeddings`` (0; 1 only with one stage). Both also take the other's layer, width and head names (``n_layer`` / ``num_hidden_layers``,
    ...), as the model specs of :mod:`graphkit.models.huggingface` do.

Both built-in forms also take ``compile=split`` (``zoo-pipeline:mlp?compile=split``): each stage's blocks are
compiled with graphkit's splitting backend, whose backward splits into a compiled I and a compiled W
(:mod:`graphkit.models.compiling`; ``split-eager``, ``inductor`` and ``aot_eager`` too).

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

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from graphkit.models.compiling import compile_blocks, split_compile_key
from graphkit.models.huggingface_stages import (
    PIPELINE_ARCHITECTURES,
    GPT2PipelineStage,
    LlamaPipelineStage,
    gpt2_stages,
    hf_stages,
    llama_stages,
)
from graphkit.models.specs import (
    SpecError,
    check_model_result,
    import_spec_file,
    import_spec_module,
    load_spec,
    looks_like_path,
    missing_function_error,
    on_sys_path,
    required_arguments,
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
    "schedule_loss_and_target",
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
        return _batch_size(self.inputs)

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
        return schedule_loss_and_target(self.loss_fn, self.inputs, self.target)[1]

    def schedule_loss_fn(self) -> Callable[..., Tensor]:
        """The loss to give a schedule with :meth:`schedule_target`: :attr:`loss_fn`, or, for a target of
        None, a function that calls ``loss_fn(output, None)`` whatever placeholder target it is given."""
        return schedule_loss_and_target(self.loss_fn, self.inputs, self.target)[0]


def schedule_loss_and_target(
    loss_fn: Callable[..., Tensor], inputs: tuple[Any, ...], target: Any
) -> tuple[Callable[..., Tensor], Any]:
    """The loss and target to give a schedule's ``step`` for ``inputs`` (dimension 0 is the batch).

    ``loss_fn`` and ``target`` as they are; for a target of None (a loss that ignores it), zeros with one
    row per batch row - the schedules split a target into one per microbatch - and a loss that calls
    ``loss_fn(output, None)`` whatever placeholder target it is given, as a full backward calls it.
    """
    if target is not None:
        return loss_fn, target
    return (lambda output, _placeholder, **kwargs: loss_fn(output, None, **kwargs)), torch.zeros(
        _batch_size(inputs)
    )


def _batch_size(inputs: tuple[Any, ...]) -> int:
    first = next((value for value in inputs if isinstance(value, Tensor) and value.dim()), None)
    return int(first.shape[0]) if first is not None else 1


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
    if spec.startswith(("hf:", "zoo-pipeline:")):
        spec, compile_value = split_compile_key(spec)
        if compile_value is not None:  # build as without the key, then compile each stage's blocks
            model = _load(spec, num_stages, batch_size)
            compile_blocks(model.stages, compile_value)
            return model
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


def _function_of(spec: str, kind: str = "pipeline spec") -> Callable[..., Any]:
    """The function a file or module spec names; ``kind`` is how errors name the spec (``"spec"`` when it may be
    a model spec too)."""
    target, colon, function_name = spec.rpartition(":")
    if not colon or not target or not function_name:
        raise SpecError(
            f"{kind} {spec!r} names no function: write path/to/file.py:function, "
            "package.module:function, zoo-pipeline:NAME, hf:gpt2 or hf:llama (the function returns "
            "(stages, loss_fn, inputs, target))"
        )
    if looks_like_path(target):
        module = import_spec_file(spec, Path(target), kind=kind)
        function = getattr(module, function_name, None)
        if callable(function):
            folder = Path(target).resolve().parent

            def in_its_folder(**arguments: Any) -> Any:  # it may import files next to it
                with on_sys_path(folder):
                    return function(**arguments)

            in_its_folder.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
            return in_its_folder
    else:
        module = import_spec_module(spec, target, kind=kind)
        function = getattr(module, function_name, None)
    if not callable(function):
        raise missing_function_error(kind, spec, module, function_name)
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
    required = required_arguments(function, given=("num_stages", "batch_size"))
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
    function = _function_of(stripped, kind="spec")
    if {"num_stages", "batch_size"} & set(_declared(function)):
        return load_pipeline_spec(function, num_stages=num_stages, batch_size=batch_size, seed=seed)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        result = _call(stripped, function, None, None)
    if _is_pipeline_result(result):
        return _checked(stripped, result, num_stages)
    return check_model_result(stripped, stripped.rpartition(":")[2] + "()", result)


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


def hf_pipeline(spec: str, *, num_stages: int, batch_size: int) -> PipelineModel:
    """A Hugging Face model cut into ``num_stages`` stages: ``hf:gpt2[?...]`` or ``hf:llama[?...]``.

    The :class:`PipelineModel` of :func:`graphkit.models.huggingface_stages.hf_stages`, which dispatches to
    :func:`~graphkit.models.huggingface_stages.gpt2_stages` or
    :func:`~graphkit.models.huggingface_stages.llama_stages` (their docstrings list the keys).

    Raises:
        SpecError: an architecture that is not cut into stages (the message lists those that are), and as
            the architecture's function.
        ImportError: ``transformers`` is not installed (extra ``models``).
    """
    return PipelineModel(*hf_stages(spec, num_stages=num_stages, batch_size=batch_size))


def gpt2_pipeline(spec: str, *, num_stages: int, batch_size: int) -> PipelineModel:
    """GPT-2 cut into ``num_stages`` stages (``hf:gpt2[?...]``): the :class:`PipelineModel` of
    :func:`graphkit.models.huggingface_stages.gpt2_stages` (its docstring lists the keys and errors)."""
    return PipelineModel(*gpt2_stages(spec, num_stages=num_stages, batch_size=batch_size))


def llama_pipeline(spec: str, *, num_stages: int, batch_size: int) -> PipelineModel:
    """Llama cut into ``num_stages`` stages (``hf:llama[?...]``): the :class:`PipelineModel` of
    :func:`graphkit.models.huggingface_stages.llama_stages` (its docstring lists the keys and errors)."""
    return PipelineModel(*llama_stages(spec, num_stages=num_stages, batch_size=batch_size))
