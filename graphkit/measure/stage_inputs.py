"""Running one stage as the measuring tools do: on its device, on fresh copies of its inputs.

:func:`verify_split <graphkit.measure.verification.verify_split>`,
:func:`benchmark_split <graphkit.measure.benchmark.benchmark_split>` and
:func:`stage_costs <graphkit.measure.costs.stage_costs>` each run a stage's forward many times: every run
takes fresh leaf copies of the inputs (:func:`fresh_inputs`), so no run's autograd graph or ``.grad``
reaches the next, and calls the stage with them as a spec gives them (:func:`call_stage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from graphkit.graph.tensors import flatten_tensors, unflatten_like

__all__ = ["call_stage", "cast_floating", "fresh_inputs", "placed_stage", "stage_input_tensors"]


def call_stage(module: torch.nn.Module, inputs: Any) -> Any:
    """``module(**inputs)`` for a dict, ``module(*inputs)`` for a tuple or list, else ``module(inputs)``."""
    if isinstance(inputs, Mapping):
        return module(**inputs)
    if isinstance(inputs, (tuple, list)):
        return module(*inputs)
    return module(inputs)


def fresh_inputs(value: Any, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Any:
    """Fresh leaf copies of the input tensors in ``value`` (same structure and requires_grad), moved to
    ``device`` and, when given, cast to ``dtype`` (floating tensors) or to the complex dtype of the same
    precision (complex ones: ``float64`` gives ``complex128``). Non-tensor entries stay as they are."""
    prepared = []
    for _, tensor in flatten_tensors(value):
        copy_ = tensor.detach().clone()
        if device is not None:
            copy_ = copy_.to(device)
        if dtype is not None:
            copy_ = cast_floating(copy_, dtype)
        prepared.append(copy_.requires_grad_(tensor.requires_grad))
    return prepared[0] if isinstance(value, torch.Tensor) else unflatten_like(value, prepared)


def cast_floating(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype`` if floating, in the complex dtype of ``dtype``'s precision if complex, else
    as it is."""
    if tensor.is_floating_point():
        return tensor.to(dtype)
    if tensor.is_complex():
        return tensor.to(_COMPLEX.get(dtype, tensor.dtype))
    return tensor


_COMPLEX = {torch.float64: torch.complex128, torch.float32: torch.complex64, torch.float16: torch.complex32}


def stage_input_tensors(inputs: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors in a stage's inputs with their names (a lone tensor is ``"input"``)."""
    return flatten_tensors(inputs, lone_name="input")


def placed_stage(
    module: torch.nn.Module, device: str | torch.device | None
) -> tuple[torch.device, list[torch.nn.Parameter]]:
    """Move ``module`` to ``device`` (None: where its first parameter is, the CPU without parameters).

    Returns:
        The device, and the module's parameters that require grad.
    """
    placed = (
        torch.device(device)
        if device is not None
        else next((parameter.device for parameter in module.parameters()), torch.device("cpu"))
    )
    module.to(placed)
    return placed, [parameter for parameter in module.parameters() if parameter.requires_grad]
