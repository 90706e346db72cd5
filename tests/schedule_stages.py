"""Stand-in stages for reading a PyTorch schedule's ``pipeline_order`` without running it."""

from __future__ import annotations

from types import SimpleNamespace

import torch


def fake_stage(
    index: int, num_stages: int, rank: int | None = None, ranks: int | None = None
) -> SimpleNamespace:
    """What PyTorch's schedule constructors read from a stage to build ``pipeline_order``; ``rank`` and
    ``ranks`` default to one stage per rank (``index`` and ``num_stages``)."""
    return SimpleNamespace(
        stage_index=index,
        num_stages=num_stages,
        group_rank=index if rank is None else rank,
        group_size=num_stages if ranks is None else ranks,
        is_first=index == 0,
        is_last=index == num_stages - 1,
        submod=torch.nn.Identity(),
        stage_index_to_group_rank=None,
    )
