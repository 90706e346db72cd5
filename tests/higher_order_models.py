"""Blocks whose compiled backward holds higher-order ops, for the splitting backend's tests and specs.

- :class:`FlexBlock`: attention with ``flex_attention`` (a score_mod capturing a learned tensor, a causal
  ``BlockMask``); its backward calls ``flex_attention_backward`` with get_attr subgraphs. On the CPU,
  ``flex_attention`` refuses inputs that require grad: the tests bypass that check (``flex_on_cpu``).
- :class:`CheckpointedBlock`: activation checkpointing with dropout inside the compiled region.
- :class:`NestedRegionBlock`: ``torch.compiler.nested_compile_region`` (``invoke_subgraph``).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["CheckpointedBlock", "FlexBlock", "NestedRegionBlock"]


class FlexBlock(nn.Module):
    """Attention with flex_attention: q, k, v and output projections, a causal BlockMask (mask_mod), and a
    score_mod that adds an ALiBi-like bias from a learned per-head slope (a parameter the score_mod
    captures, whose gradient flex_attention_backward itself returns)."""

    def __init__(self, width: int = 8, heads: int = 2, length: int = 32) -> None:
        super().__init__()
        from torch.nn.attention.flex_attention import create_block_mask

        self.heads = heads
        self.query, self.key, self.value, self.out = (nn.Linear(width, width) for _ in range(4))
        self.slopes = nn.Parameter(torch.linspace(-0.5, 0.5, heads))
        self.block_mask = create_block_mask(
            lambda batch, head, q, kv: q >= kv, None, None, length, length, device="cpu", BLOCK_SIZE=16
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        batch, length, width = x.shape
        slopes = self.slopes

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

        def alibi(score, b, head, q, kv):
            return score + slopes[head] * (kv - q)

        attended = flex_attention(
            heads(self.query(x)),
            heads(self.key(x)),
            heads(self.value(x)),
            score_mod=alibi,
            block_mask=self.block_mask,
        )
        return x + self.out(attended.transpose(1, 2).reshape(batch, length, width))


class CheckpointedBlock(nn.Module):
    """Two MLPs with dropout, each under non-reentrant activation checkpointing inside the compiled region:
    AOTAutograd recomputes them in the backward, dropout with the RNG state the forward saved."""

    def __init__(self, width: int = 8, dropout: float = 0.5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.first = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(dropout))
        self.second = nn.Sequential(nn.Linear(2 * width, width), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.utils.checkpoint.checkpoint(self.first, self.norm(x), use_reentrant=False)
        return x + torch.utils.checkpoint.checkpoint(self.second, hidden, use_reentrant=False)


class NestedRegionBlock(nn.Module):
    """Two MLPs, each called through ``torch.compiler.nested_compile_region`` (an ``invoke_subgraph`` call
    whose backward subgraph computes the MLP's input and weight gradients together)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._mlp(self.mlps[0], self.norm(x))
        return x + self._mlp(self.mlps[1], x)

    @staticmethod
    def _mlp(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return _nested_region(mlp, x)


def _call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


_nested_region = (
    torch.compiler.nested_compile_region(_call) if hasattr(torch.compiler, "nested_compile_region") else _call
)
