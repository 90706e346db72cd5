"""What the tests expect from the installed torch, where PyTorch changed it between the releases CI tests.

CI runs the suite on torch 2.13 (the set-up's default) and on the newest release (``TESTED_TORCH``, from
``graphkit.pipelining``). A test that pins PyTorch's own behaviour reads it from here,
keyed on the first release that behaves the new way, so each torch is held to what it does:

- :func:`torch_at_least` compares the installed torch with a release ("2.15", "2.14.1").
- :func:`fixed_in` is a strict xfail for a PyTorch failure that release fixed: the test fails (as
  expected) before it and must pass from it on; an XPASS before it, or a failure after it, fails the run.
- The constants below name each difference and the release that brought it.
"""

from __future__ import annotations

import re

import pytest
import torch


def _release(version: str) -> tuple[int, ...]:
    """``"2.15.0+cu132"`` -> ``(2, 15, 0)``; a pre-release or nightly counts as its release."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    assert match, version
    return tuple(int(part) for part in match.group().split("."))


TORCH = _release(torch.__version__)


def torch_at_least(release: str) -> bool:
    """Whether the installed torch is ``release`` or newer (local labels such as ``+cpu`` ignored)."""
    wanted = _release(release)
    return TORCH + (0,) * max(0, len(wanted) - len(TORCH)) >= wanted


def fixed_in(release: str, reason: str) -> pytest.MarkDecorator:
    """A strict xfail for a PyTorch failure fixed in ``release``: expected before it, an error after it."""
    return pytest.mark.xfail(
        not torch_at_least(release), strict=True, reason=f"{reason} (PyTorch fixed it in torch {release})"
    )


# nn.Linear on a 3-D input flattens it, runs addmm and reshapes the result back. Up to 2.14 the reshape is a
# view of addmm's output (ViewBackward0); from 2.15 it is an _unsafe_view, whose output is no view
# (UnsafeViewBackward0). A transpose of it stays a view (TransposeBackward0) on both.
LINEAR_3D_UNSAFE_VIEW = "2.15"
LINEAR_3D_OUTPUT_NODE = "UnsafeViewBackward0" if torch_at_least(LINEAR_3D_UNSAFE_VIEW) else "ViewBackward0"
LINEAR_3D_OUTPUT_IS_VIEW = not torch_at_least(LINEAR_3D_UNSAFE_VIEW)

# The tracing frontend's stage (build_stage, _PipelineStage) warms up its P2P links before the first step.
# Up to 2.14 it sends a dummy tensor to every neighbour stage, also to one on this same rank, which gloo
# cannot do ("Pair is not connected"): one-process pipelines and V placements fail. From 2.15 the
# schedule's set-up connects only stages on different ranks (_initialize_pipeline_distributed_state).
TRACED_WARMUP_ON_ONE_RANK = "2.15"
