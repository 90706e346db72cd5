"""Check graphkit's split backward on your own model: B then W must give a full backward's gradients.

    .venv/bin/python examples/verify_custom_model.py
    .venv/bin/graphkit verify examples/verify_custom_model.py:make_stage     # the same model, from the command line

The model below has the parts that make a split backward hard: one weight used by two layers (its gradient
sums two contributions), a custom ``torch.autograd.Function`` whose backward computes only what
``ctx.needs_input_grad`` asks for (graphkit sets it per phase: the input path's gradient in B, the weight's
in W), and a learned temperature that is an output of its own. Replace it with yours: ``make_stage`` returns ``(module, inputs)``, with the inputs
that require grad being the stage inputs. Exit status 1 when a gradient differs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import graphkit


class ScaledTanh(torch.autograd.Function):
    """``tanh(x) * scale`` with a hand-written backward that computes only the gradients asked for."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        t = torch.tanh(x)
        ctx.save_for_backward(t, scale)
        return t * scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        t, scale = ctx.saved_tensors
        grad_x = grad * scale * (1 - t * t) if ctx.needs_input_grad[0] else None
        grad_scale = (grad * t).sum(0) if ctx.needs_input_grad[1] else None
        return grad_x, grad_scale


class CustomStage(nn.Module):
    """A middle pipeline stage: ``(batch, 16)`` hidden states in; hidden states and a temperature out."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.shared = nn.Parameter(torch.randn(width, width) / width**0.5)  # used twice
        self.scale = nn.Parameter(torch.ones(2 * width))
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        mixed = hidden @ self.shared
        gated = ScaledTanh.apply(self.up(mixed), self.scale)
        out = hidden + self.down(gated) @ self.shared.T
        return {"hidden": out, "temperature": self.log_temperature.exp()}


def make_stage() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model spec function: ``(module, inputs)``."""
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = CustomStage()
    hidden = torch.randn(8, 16, generator=generator).requires_grad_()
    return model, (hidden,)


def main() -> int:
    model, inputs = make_stage()
    _, graph = graphkit.trace(model, *inputs)
    groups = graphkit.param_groups(graph)
    print(groups)
    print()
    failed = False
    for dtype in (torch.float32, torch.float64):
        report = graphkit.verify_split(model, inputs, dtype=dtype)
        print(report.table())
        print()
        failed |= not report.ok
    if failed:
        print("split backward differs from the full backward", flush=True)
        return 1
    print("split backward matches the full backward in float32 and float64")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
