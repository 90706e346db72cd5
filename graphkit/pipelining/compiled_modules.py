"""``torch.compile`` wrappers (``OptimizedModule``) in graphkit's stages under the zero-bubble schedules.

PyTorch's schedules with separate I and W actions (``ScheduleInterleavedZeroBubble``,
``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) refuse any stage whose module holds an
``OptimizedModule``, the wrapper ``torch.compile(module)`` returns: their constructors call
``_check_torch_compile_compatibility(stages, schedule_name)`` (``torch/distributed/pipelining/schedules.py``)
because PyTorch's stage cannot split a compiled region's backward (it crashes in the first I action on
donated buffers, or computes every gradient in I). A region compiled with graphkit's splitting backend
(``backend="graphkit_split"`` or ``"graphkit_split_eager"``, :func:`graphkit.splitting_backend`) runs its
input-gradient part in I and its weight-gradient part in W in graphkit's stages, so those wrappers are
admitted there.

:func:`admit_split_compiled_modules` (called by graphkit's stages when they are built) replaces that module
function, once, by :func:`check_compiled_stages`, which

- leaves PyTorch's stages to PyTorch's own check, unchanged (they still refuse every wrapper);
- admits, in graphkit's stages, wrappers whose backend is graphkit's splitting backend;
- refuses, in graphkit's stages, a wrapper compiled with any other backend with a ``RuntimeError`` that
  names that backend and the one to use.

Nothing else of the schedules changes. ``tests/test_compiled_wrappers.py`` pins the private details relied
on: the schedules call the module-level function by name, and an ``OptimizedModule`` keeps its backend at
the end of ``dynamo_ctx.callback``'s ``_torchdynamo_orig_backend`` chain (``compiler_fn``,
``compiler_name``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.pipelining import schedules as torch_schedules

__all__ = [
    "SPLITTING_BACKEND_PREFIX",
    "admit_split_compiled_modules",
    "check_compiled_stages",
    "compiled_backend",
    "is_split_compiled",
]

SPLITTING_BACKEND_PREFIX = "graphkit_splitting_backend_"
"""The ``__name__`` of every backend :func:`graphkit.splitting_backend` returns starts with this."""

_CHECK_NAME = "_check_torch_compile_compatibility"
_lock = threading.Lock()
_torch_check: Callable[[Sequence[Any], str], None] | None = None
_graphkit_stage_classes: tuple[type, ...] = ()


def compiled_backend(module: torch.nn.Module) -> tuple[str, Callable[..., Any] | None]:
    """The backend an ``OptimizedModule`` was compiled with: ``(name, backend function)``.

    The name is what ``torch.compile`` was given (``"inductor"``, ``"aot_eager"``, ``"graphkit_split"``,
    a function's ``__name__``); the function is what dynamo looked that name up to. ``("unknown", None)``
    when the wrapper does not show it (a torch that stores it elsewhere).
    """
    link: Any = getattr(getattr(module, "dynamo_ctx", None), "callback", None)
    name, function = "unknown", None
    for _ in range(16):  # a short chain of wrappers: CatchErrors -> ConvertFrame -> debug -> the backend
        if link is None:
            break
        name = getattr(link, "compiler_name", None) or name
        function = getattr(link, "compiler_fn", function)
        link = getattr(link, "_torchdynamo_orig_backend", None)
    return str(name), function


def is_split_compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an ``OptimizedModule`` compiled with graphkit's splitting backend."""
    _, function = compiled_backend(module)
    return getattr(function, "__name__", "").startswith(SPLITTING_BACKEND_PREFIX)


def check_compiled_stages(stages: Sequence[Any], schedule_name: str) -> None:
    """The zero-bubble schedules' check of compiled modules, with graphkit's stages admitted (module docstring).

    Args:
        stages: the schedule's stages on this rank.
        schedule_name: the schedule's class name, for the messages.

    Raises:
        RuntimeError: a graphkit stage holds an ``OptimizedModule`` compiled with another backend than
            graphkit's splitting backend (the message names it and the backend to use), or PyTorch's check
            refuses one of PyTorch's stages.
    """
    from torch._dynamo.eval_frame import OptimizedModule

    torch_stages = []
    for stage in stages:
        if not isinstance(stage, _graphkit_stage_classes):
            torch_stages.append(stage)
            continue
        if not isinstance(stage.submod, torch.nn.Module):
            continue
        for name, module in stage.submod.named_modules():
            if isinstance(module, OptimizedModule) and not is_split_compiled(module):
                backend, _ = compiled_backend(module)
                where = f"'{name}'" if name else "the stage module itself"
                raise RuntimeError(
                    f"{schedule_name} runs stage {stage.stage_index}'s I and W actions apart, but "
                    f"{where} ({type(module._orig_mod).__name__}) was compiled with backend {backend!r}, "
                    "whose backward computes every gradient at once. Compile it with "
                    'backend="graphkit_split" (inductor) or "graphkit_split_eager" (aot_eager), '
                    "graphkit's splitting backend"
                )
    if torch_stages and _torch_check is not None:
        _torch_check(torch_stages, schedule_name)


def admit_split_compiled_modules(stage_class: type) -> bool:
    """Install :func:`check_compiled_stages` in place of the schedules' check, once (idempotent, thread-safe).

    Args:
        stage_class: the class of graphkit's stages (the mixin both of them share), whose instances may
            hold wrappers compiled with graphkit's backend.

    Returns:
        True when the installed torch has the check (and it is now graphkit's), False when it has none
        (nothing to admit: its schedules refuse no wrapper).
    """
    global _torch_check, _graphkit_stage_classes
    with _lock:
        if stage_class not in _graphkit_stage_classes:
            _graphkit_stage_classes = (*_graphkit_stage_classes, stage_class)
        current = getattr(torch_schedules, _CHECK_NAME, None)
        if current is None:
            return False
        if current is not check_compiled_stages:
            _torch_check = current
            setattr(torch_schedules, _CHECK_NAME, check_compiled_stages)
        return True
