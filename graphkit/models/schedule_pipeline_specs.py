"""Pipeline specs: one string that names the stages of a pipeline, one microbatch of inputs and a loss.

A *pipeline spec* has the forms of a model spec (:mod:`graphkit.models.specs`) for files and modules,
``path/to/file.py:function`` or ``package.module:function``, plus ``zoo-pipeline:NAME`` for the
built-in pipelines of this module (``zoo-pipeline:mlp``: four small stages of Linear, GELU, Linear;
``zoo-pipeline:mlp_wide``: the same, wide enough for milliseconds of compute per pass). The function
takes no arguments and returns::

    (stages, microbatch_inputs, loss_fn)            # or
    (stages, microbatch_inputs, loss_fn, target)

- ``stages``: a list of ``nn.Module``, in pipeline order; stage ``i + 1`` is called with the outputs of
  stage ``i`` (a tensor, or a tuple of tensors passed as positional arguments), as
  ``torch.distributed.pipelining.PipelineStage`` does;
- ``microbatch_inputs``: a tuple of the first stage's positional tensors for **one microbatch**
  (a batch of ``N`` microbatches is built by repeating it along dimension 0);
- ``loss_fn``: ``loss_fn(output, target) -> scalar tensor`` on the last stage's output, as
  ``torch.distributed.pipelining`` schedules call it; None for a pipeline without a loss (the last
  stage's outputs then get cotangents of ones);
- ``target`` (optional): one microbatch of the loss's target; without it the loss is called with a
  placeholder ``torch.zeros(batch)`` it is expected to ignore.

Every mistake raises :class:`~graphkit.models.specs.SpecError` saying what was wrong and how to fix it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.models.specs import (
    SpecError,
    _check_result,
    _check_takes_no_arguments,
    _import_file,
    _import_module,
    _looks_like_path,
    _on_sys_path,
    load_spec,
)

__all__ = [
    "PIPELINES",
    "PipelineSpec",
    "check_pipeline",
    "is_pipeline_result",
    "load_pipeline_spec",
    "load_stage_or_pipeline",
    "mlp_pipeline",
    "mlp_wide_pipeline",
]

_SHAPE_HINT = (
    "return (stages, microbatch_inputs, loss_fn) or (stages, microbatch_inputs, loss_fn, target): a list "
    "of nn.Module, a tuple of tensors for one microbatch, and loss_fn(output, target) or None"
)


@dataclass(slots=True)
class PipelineSpec:
    """What a pipeline spec names: the stages, one microbatch of first-stage inputs, the loss."""

    stages: list[nn.Module]
    microbatch_inputs: tuple[Any, ...]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    target: torch.Tensor | None = None

    def microbatch_size(self) -> int:
        """The size of dimension 0 of the first tensor input (1 when no input is a tensor)."""
        first = next((value for value in self.microbatch_inputs if isinstance(value, torch.Tensor)), None)
        return int(first.shape[0]) if first is not None and first.dim() else 1

    def batch(self, microbatches: int) -> tuple[tuple[Any, ...], torch.Tensor]:
        """``(args, target)`` of a whole batch: each tensor repeated ``microbatches`` times along dim 0."""
        args = tuple(
            torch.cat([value.detach()] * microbatches) if isinstance(value, torch.Tensor) else value
            for value in self.microbatch_inputs
        )
        target = self.target if self.target is not None else torch.zeros(self.microbatch_size())
        return args, torch.cat([target] * microbatches)


class _MLPStage(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.activation = nn.GELU()
        self.down = nn.Linear(hidden, width)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(features)))


def _mean_square(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output.float() ** 2).mean()


def mlp_pipeline(
    num_stages: int = 4, width: int = 64, hidden: int = 256, microbatch_size: int = 32
) -> tuple[list[nn.Module], tuple[torch.Tensor], Callable[[Any, Any], torch.Tensor]]:
    """A pipeline of ``num_stages`` MLP blocks (Linear, GELU, Linear), float32, seeded, on the CPU.

    Returns ``(stages, (features,), loss_fn)`` with ``features`` of shape ``(microbatch_size, width)``
    and ``loss_fn(output, target) = mean(output ** 2)`` (the target is ignored).
    """
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        stages: list[nn.Module] = [_MLPStage(width, hidden) for _ in range(num_stages)]
        features = torch.randn(microbatch_size, width)
    finally:
        torch.random.set_rng_state(generator_state)
    return stages, (features,), _mean_square


def mlp_wide_pipeline() -> tuple[list[nn.Module], tuple[torch.Tensor], Callable[[Any, Any], torch.Tensor]]:
    """:func:`mlp_pipeline` with width 512, hidden 2048 and 64 rows: milliseconds of compute per pass."""
    return mlp_pipeline(num_stages=4, width=512, hidden=2048, microbatch_size=64)


PIPELINES: dict[str, Callable[[], Any]] = {"mlp": mlp_pipeline, "mlp_wide": mlp_wide_pipeline}
"""The built-in pipelines, by the NAME of ``zoo-pipeline:NAME``."""


def load_pipeline_spec(spec: str) -> PipelineSpec:
    """Build the pipeline a spec names (see the module docstring for the forms and the return value).

    Raises:
        SpecError: the spec is malformed, the file or function is missing, the function needs arguments
            or raises, or it returns something other than ``(list of nn.Module, tuple, loss_fn[, target])``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"a pipeline spec must be a non-empty string; got {spec!r}")
    spec = spec.strip()
    if spec.startswith("zoo-pipeline:"):
        name = spec[len("zoo-pipeline:") :]
        if name not in PIPELINES:
            raise SpecError(f"unknown built-in pipeline {name!r} in {spec!r}; known: {', '.join(PIPELINES)}")
        return check_pipeline(spec, PIPELINES[name]())
    return check_pipeline(spec, _call_function(spec))


def load_stage_or_pipeline(spec: str) -> PipelineSpec | tuple[nn.Module, Any]:
    """A :class:`PipelineSpec` when ``spec`` names a pipeline, else the ``(module, inputs)`` of a model spec.

    ``zoo:`` and ``hf:`` specs are model specs; ``zoo-pipeline:`` specs are pipelines; a file or module
    function is a pipeline when it returns a list of modules first (it is called once).

    Raises:
        SpecError: as :func:`load_pipeline_spec` and :func:`graphkit.models.specs.load_spec`.
    """
    stripped = spec.strip() if isinstance(spec, str) else spec
    if not isinstance(stripped, str) or stripped.startswith(("zoo:", "hf:")) or ":" not in stripped:
        return load_spec(spec)
    if stripped.startswith("zoo-pipeline:"):
        return load_pipeline_spec(stripped)
    result = _call_function(stripped)
    if is_pipeline_result(result):
        return check_pipeline(stripped, result)
    return _check_result(stripped, stripped.rpartition(":")[2] + "()", result)


def _call_function(spec: str) -> Any:
    target, colon, function_name = spec.rpartition(":")
    if not colon or not target or not function_name:
        raise SpecError(
            f"pipeline spec {spec!r} names no function: write path/to/file.py:function, "
            "package.module:function or zoo-pipeline:NAME"
        )
    if _looks_like_path(target):
        module = _import_file(spec, Path(target))
        with _on_sys_path(Path(target).resolve().parent):
            return _call(spec, module, function_name)
    return _call(spec, _import_module(spec, target), function_name)


def _call(spec: str, module: Any, function_name: str) -> Any:
    function = getattr(module, function_name, None)
    if function is None or not callable(function):
        raise SpecError(f"pipeline spec {spec!r}: {module.__name__} has no function {function_name!r}")
    _check_takes_no_arguments(spec, function_name, function)
    try:
        result = function()
    except Exception as error:
        raise SpecError(
            f"pipeline spec {spec!r}: calling {function_name}() raised {type(error).__name__}: {error}"
        ) from error
    return result


def is_pipeline_result(result: Any) -> bool:
    """Whether a spec function's result looks like a pipeline (a list of modules first), not a model."""
    return (
        isinstance(result, tuple | list)
        and len(result) in (3, 4)
        and isinstance(result[0], list | tuple)
        and bool(result[0])
        and all(isinstance(stage, nn.Module) for stage in result[0])
    )


def check_pipeline(spec: str, result: Any) -> PipelineSpec:
    """Check a spec function's result and wrap it in a :class:`PipelineSpec` (SpecError when malformed)."""
    if not isinstance(result, tuple | list) or len(result) not in (3, 4):
        raise SpecError(f"pipeline spec {spec!r} returned a {type(result).__name__}; {_SHAPE_HINT}")
    stages, inputs, loss_fn, *rest = result
    if (
        not isinstance(stages, list | tuple)
        or not stages
        or not all(isinstance(s, nn.Module) for s in stages)
    ):
        raise SpecError(
            f"pipeline spec {spec!r}: the stages are not a non-empty list of nn.Module; {_SHAPE_HINT}"
        )
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, tuple | list):
        raise SpecError(
            f"pipeline spec {spec!r}: microbatch_inputs is a {type(inputs).__name__}, not a tuple of the "
            f"first stage's positional tensors; {_SHAPE_HINT}"
        )
    if loss_fn is not None and not callable(loss_fn):
        raise SpecError(f"pipeline spec {spec!r}: loss_fn is a {type(loss_fn).__name__}; {_SHAPE_HINT}")
    target = rest[0] if rest else None
    if target is not None and not isinstance(target, torch.Tensor):
        raise SpecError(f"pipeline spec {spec!r}: the target is a {type(target).__name__}, not a tensor")
    return PipelineSpec(list(stages), tuple(inputs), loss_fn, target)
