"""Pipeline specs for graphkit's pipelining tests: one function per kind of stage graph.

Each function takes ``num_stages`` and ``batch_size`` and returns ``(stages, loss_fn, inputs, target)``
(see :mod:`graphkit.models.pipeline_specs`); the checker calls it under a fixed seed. Every stage holds
the kind of graph the function is named after: the kinds on which PyTorch's own zero-bubble split is
known to fail (shared and tied weights, view outputs, multi-output nodes, a parameter-only output, a
checkpointed block, a parameter inside ``loss_fn``), plus plain MLP and transformer stages.
"""

from __future__ import annotations

from typing import Any

import torch
from models import ScaleAndShift  # tests/models.py, beside this file
from torch import Tensor, nn

from graphkit.models.pipeline_specs import PipelineModel

WIDTH = 4


def _squared_error(output: Tensor, target: Tensor) -> Tensor:
    return ((output - target) ** 2).sum()


def _batch(batch_size: int, *shape: int) -> tuple[Tensor, Tensor]:
    return torch.randn(batch_size, *shape), torch.randn(batch_size, *shape)


def _pipeline(
    stages: list[nn.Module], batch_size: int, *shape: int, loss_fn: Any = _squared_error
) -> PipelineModel:
    inputs, target = _batch(batch_size, *(shape or (WIDTH,)))
    return PipelineModel(stages, loss_fn, (inputs,), target)


class Dense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.linear(x))


def mlp(num_stages: int, batch_size: int) -> PipelineModel:
    """Plain Linear + tanh stages."""
    return _pipeline([Dense() for _ in range(num_stages)], batch_size)


def transformer(num_stages: int, batch_size: int) -> PipelineModel:
    """One ``nn.TransformerEncoderLayer`` (d=8, 2 heads, no dropout) per stage; inputs (batch, 3, 8)."""
    stages = [
        nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        for _ in range(num_stages)
    ]
    return _pipeline(stages, batch_size, 3, 8)


class _Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(WIDTH) + 0.5)


class SharedLate(nn.Module):
    """``second(tanh(first(x) * scale)) * scale``, ``scale`` registered after ``first`` and ``second``."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(WIDTH, WIDTH)
        self.second = nn.Linear(WIDTH, WIDTH)
        self.shared = _Holder()

    def forward(self, x: Tensor) -> Tensor:
        scale = self.shared.scale
        return torch.tanh(self.second(torch.tanh(self.first(x) * scale)) * scale)


def shared_late(num_stages: int, batch_size: int) -> PipelineModel:
    """A parameter shared by two layers of a stage, registered after their own parameters."""
    return _pipeline([SharedLate() for _ in range(num_stages)], batch_size)


class Tied(nn.Module):
    """One Linear applied three times in a chain: ``h = tanh(linear(h))`` x 3 (tied weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(3):
            x = torch.tanh(self.linear(x))
        return x


def tied(num_stages: int, batch_size: int) -> PipelineModel:
    """Tied weights: one weight used by several chained nodes."""
    return _pipeline([Tied() for _ in range(num_stages)], batch_size)


class ViewOutput(nn.Module):
    """Input (batch, 2, 4); a 3-D Linear whose output is returned as a (contiguous) view."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        hidden = torch.tanh(self.linear(x))
        return hidden.view(hidden.shape)


def view_outputs(num_stages: int, batch_size: int) -> PipelineModel:
    """Stage outputs that are views (PyTorch's split detaches them in place, which raises)."""
    return _pipeline([ViewOutput() for _ in range(num_stages)], batch_size, 2, WIDTH)


class ContiguousGradient(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: gloo sends and receives contiguous tensors
    only, and a batch-first LSTM's input gradient is not (PyTorch sizes its receive buffers from it)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad.contiguous()


class LSTMStage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(WIDTH, WIDTH, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        output, _ = self.lstm(ContiguousGradient.apply(x))
        return output.contiguous()  # gloo sends contiguous tensors only


def lstm(num_stages: int, batch_size: int) -> PipelineModel:
    """An LSTM per stage (a fused kernel node with several outputs); inputs (batch, 3, 4)."""
    return _pipeline([LSTMStage() for _ in range(num_stages)], batch_size, 3, WIDTH)


class CustomFunctionStage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH))

    def forward(self, x: Tensor) -> Tensor:
        scaled, shifted = ScaleAndShift.apply(x, self.weight)
        return scaled * shifted.tanh()


def custom_function(num_stages: int, batch_size: int) -> PipelineModel:
    """A custom ``autograd.Function`` with two outputs and a parameter input, per stage."""
    return _pipeline([CustomFunctionStage() for _ in range(num_stages)], batch_size)


class ParamOnlyOutput(nn.Module):
    """``tanh(linear(x)) * logit_scale.exp()``, plus (but on the last stage) ``temperature.exp() * ones``.

    The second output depends on a parameter alone; the next stage multiplies it into its input.
    """

    def __init__(self, last: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.logit_scale = nn.Parameter(torch.tensor(0.3))
        self.temperature = nn.Parameter(torch.tensor(-0.2))
        self.last = last

    def forward(self, x: Tensor, temperature: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        if temperature is not None:
            x = x * temperature
        hidden = torch.tanh(self.linear(x)) * self.logit_scale.exp()
        if self.last:
            return hidden
        return hidden, self.temperature.exp() * torch.ones(x.shape[0], 1, dtype=x.dtype)


def param_only_output(num_stages: int, batch_size: int) -> PipelineModel:
    """A learned scale on the output path, and a stage output that depends on a parameter alone."""
    stages = [ParamOnlyOutput(last=index == num_stages - 1) for index in range(num_stages)]
    return _pipeline(stages, batch_size)


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False))


def checkpointed(num_stages: int, batch_size: int) -> PipelineModel:
    """A non-reentrant activation-checkpointed block per stage."""
    return _pipeline([Checkpointed() for _ in range(num_stages)], batch_size)


class ScaledLoss(nn.Module):
    """``sum((output * exp(log_scale) + bias - target) ** 2)``: a loss with parameters of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(0.1))
        self.bias = nn.Parameter(torch.full((WIDTH,), 0.05))

    def forward(self, output: Tensor, target: Tensor) -> Tensor:
        return ((output * self.log_scale.exp() + self.bias - target) ** 2).sum()


def loss_parameter(num_stages: int, batch_size: int) -> PipelineModel:
    """Parameters inside ``loss_fn``."""
    return _pipeline([Dense() for _ in range(num_stages)], batch_size, loss_fn=ScaledLoss())


class SharedParameterScale(nn.Module):
    """``tanh(linear(x) * scale)``, ``scale`` one ``nn.Parameter`` that every stage holds (the same object)."""

    def __init__(self, scale: nn.Parameter) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.linear(x) * self.scale)


def shared_across_stages(num_stages: int, batch_size: int) -> PipelineModel:
    """One parameter held by every stage module: ``pipeline()`` copies it into each traced stage.

    Not in :data:`CELLS`: across ranks the manual frontend's stages each hold their own copy (and the
    checker compares each with the whole gradient), while the tracing frontend's copies are summed.
    """
    scale = nn.Parameter(torch.rand(WIDTH) + 0.5)
    return _pipeline([SharedParameterScale(scale) for _ in range(num_stages)], batch_size)


class SharedSubmoduleScale(nn.Module):
    """``tanh(linear(x) * shared.scale)``, ``shared`` one submodule that every stage registers."""

    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.shared = shared

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.linear(x) * self.shared.scale)


def shared_submodule(num_stages: int, batch_size: int) -> PipelineModel:
    """One submodule registered in every stage module: ``pipeline()`` cannot trace it (not in :data:`CELLS`)."""
    shared = _Holder()
    return _pipeline([SharedSubmoduleScale(shared) for _ in range(num_stages)], batch_size)


class RoundStraightThrough(torch.autograd.Function):
    """``round(x)`` whose backward passes the gradient through unchanged (a straight-through estimator)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return torch.round(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad


class QuantizedDense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(RoundStraightThrough.apply(self.linear(x) * 4) / 4)


def straight_through(num_stages: int, batch_size: int) -> PipelineModel:
    """A custom ``autograd.Function`` whose backward is not its forward's derivative (not in :data:`CELLS`):
    ``pipeline()`` traces its forward, ``round``, whose derivative is zero."""
    return _pipeline([QuantizedDense() for _ in range(num_stages)], batch_size)


class TiedEnds(nn.Module):
    """``tanh(ends(tanh(linear(x))))``, where ``ends`` may be a Linear that another stage holds too."""

    def __init__(self, ends: nn.Module) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.ends = ends

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.ends(torch.tanh(self.linear(x))))


def tied_first_and_last(num_stages: int, batch_size: int) -> PipelineModel:
    """The first and the last stage share one Linear, as tied input and output embeddings do.

    A V schedule places both on rank 0, where PyTorch's ``scale_grads`` divides the shared gradient once
    per stage. Not in :data:`CELLS`: its gradient sums two stages' contributions in the schedule's order,
    so it matches a full backward within rounding, not bit for bit.
    """
    ends = nn.Linear(WIDTH, WIDTH)
    last = num_stages - 1
    return _pipeline(
        [TiedEnds(ends if index in (0, last) else nn.Linear(WIDTH, WIDTH)) for index in range(num_stages)],
        batch_size,
    )


CELLS = (
    "mlp",
    "transformer",
    "shared_late",
    "tied",
    "view_outputs",
    "lstm",
    "custom_function",
    "param_only_output",
    "checkpointed",
    "loss_parameter",
)
"""Every kind above, by function name."""
