"""A model whose own forward raises (a wrong shape), as a model spec and as a pipeline spec: the graphkit
commands say so in one line naming the spec, with exit status 2 (tests/test_cli.py)."""

from __future__ import annotations

import torch
from torch import nn


class WrongShape(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) @ torch.ones(5, 5)  # 4 columns times 5 rows: raises


def make() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return WrongShape(), (torch.randn(2, 4, requires_grad=True),)


def pipeline(num_stages: int, batch_size: int):
    stages = [WrongShape() for _ in range(num_stages)]
    return stages, lambda output, target: output.sum(), (torch.randn(batch_size, 4),), None


def make_sequential() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """Two layers that do not fit: PyTorch's own Linear raises, no frame of this file is on the stack."""
    return nn.Sequential(nn.Linear(5, 4), nn.Linear(5, 4)), (torch.randn(2, 5, requires_grad=True),)


class MaskedWrite(nn.Module):
    """Writes a learned row into the rows a boolean mask picks: the forward runs on the meta device, its
    backward (the row's gradient: grad[mask], PyTorch's nonzero) cannot."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.row = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x).clone()
        y[torch.ones(x.shape[0], dtype=torch.bool, device=x.device)] = self.row
        return torch.tanh(y)


def make_masked_write() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return MaskedWrite(), (torch.randn(3, 4, requires_grad=True),)
