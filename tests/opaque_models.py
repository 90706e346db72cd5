"""Stages with opaque Nodes for the tests: checkpointed blocks (non-reentrant and reentrant) and a
torch.compile'd submodule. Every block's forward counts its runs in :data:`FORWARDS`, so a test can
count recomputations."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

FORWARDS = {"count": 0}


class Block(nn.Module):
    """A pre-norm residual MLP block that counts its forwards."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.first = nn.Linear(width, 2 * width)
        self.second = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        FORWARDS["count"] += 1
        return x + self.second(torch.tanh(self.first(self.norm(x))))


class CheckpointedStage(nn.Module):
    """Four blocks, each wrapped in ``checkpoint(..., use_reentrant=False)`` (or not at all)."""

    def __init__(self, width: int = 8, checkpointed: bool = True, **checkpoint_options) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(4))
        self.checkpointed = checkpointed
        self.options = checkpoint_options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False, **self.options) if self.checkpointed else block(x)
        return x


class ReentrantStage(nn.Module):
    """A Linear, then four blocks under checkpoint(..., use_reentrant=True), then a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.before = nn.Linear(8, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.after = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.before(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return self.after(x)


class CompiledStage(nn.Module):
    """Linear, a compiled Linear-Tanh-Linear, Linear."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.before = nn.Linear(8, 8)
        self.inner = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))
        self.compiled = torch.compile(self.inner, backend=backend)
        self.after = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.compiled(self.before(x)))
