"""Two FlexAttention blocks compiled with graphkit's splitting backend (``"aot_eager"``), for ``graphkit verify``.

On the CPU, ``flex_attention`` refuses inputs that require grad before it runs; graphkit's tests bypass that
check around the command (``flex_on_cpu`` in ``tests/test_splitting_backend.py``).
"""

from __future__ import annotations

import torch
from higher_order_models import FlexBlock  # tests/higher_order_models.py
from torch import nn

from graphkit.split.compile_backend import splitting_backend


def build() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    blocks = nn.Sequential(FlexBlock(), FlexBlock())
    for block in blocks:
        block.compile(backend=splitting_backend("aot_eager"))
    return blocks, (torch.randn(2, 32, 8, requires_grad=True),)
