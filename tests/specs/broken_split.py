"""A model whose custom Function gives a wrong weight gradient in the W phase only.

graphkit's tests use it to check that `graphkit verify` fails and names the wrong parameters.
"""

from __future__ import annotations

import torch
from torch import nn


class WrongInWeightPhase(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x @ weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_weight = x.t() @ grad
        if not ctx.needs_input_grad[0]:  # only in W, where graphkit asks for the weight's gradient alone
            grad_weight = grad_weight * 2  # the deliberate bug
        return grad @ weight.t(), grad_weight


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.weight = nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return WrongInWeightPhase.apply(torch.tanh(self.first(x)), self.weight)


def build():
    torch.manual_seed(0)
    return Broken(), (torch.randn(2, 4, requires_grad=True),)
