"""Model specs at real-model scale, for ``graphkit render``/``inspect`` timings and bench/draw_scale.py.

    graphkit render bench/scale_models.py:recurrence -o recurrence.svg
    graphkit inspect bench/scale_models.py:gpt2_stage -o gpt2-report

- :func:`recurrence`: one ``nn.Linear`` cell applied 1500 times with a residual,
  ``h = h + tanh(cell(h))``: about 6000 autograd nodes that no module depth collapses (every step is
  the same module), the case repeated-structure folding is for;
- :func:`gpt2_stage`: a 12-layer GPT-2 middle stage (``hf:gpt2?stage=middle&n_layer=12``, width 768,
  sequences of 64 tokens), about 640 nodes.
"""

from __future__ import annotations

import torch
from torch import nn

STEPS = 1500


class Recurrence(nn.Module):
    """``h = h + tanh(cell(h))`` for ``steps`` steps; input ``h`` float32 ``(2, 16)``, output the same."""

    def __init__(self, steps: int = STEPS, width: int = 16) -> None:
        super().__init__()
        self.steps = steps
        self.cell = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            h = h + torch.tanh(self.cell(h))
        return h


def recurrence() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The 1500-step residual recurrence (about 6000 nodes)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Recurrence(), (torch.randn(2, 16, requires_grad=True),)


def gpt2_stage() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A 12-layer GPT-2 middle stage at GPT-2 small's width (768), 64 tokens, random weights."""
    from graphkit.models.specs import load_spec

    return load_spec("hf:gpt2?stage=middle&n_layer=12&n_embd=768&n_head=12&seq=64&batch=1")
