"""The private contract between graphkit's pipeline stage and ``torch.distributed.pipelining``.

graphkit's stages (:class:`~graphkit.pipelining.stage.PipelineStage` for the manual frontend,
:class:`~graphkit.pipelining.stage.TracedPipelineStage` for the tracing frontend's ``build_stage``)
override one method of PyTorch's stage classes, ``backward_maybe_with_nosync(backward_type, bwd_kwargs,
last_backward)`` (``torch/distributed/pipelining/stage.py``); both frontends inherit the methods that call
it from ``_PipelineStageBase``. graphkit relies on how the installed torch calls it:

- ``backward_one_chunk`` (a schedule's I action, ``full_backward=False``) calls it with ``"input"`` and a
  ``bwd_kwargs`` holding ``"stage_output"``, ``"output_grads"`` and ``"input_values"``, and keeps the
  second value it returns in ``backward_state`` for W;
- ``backward_weight_one_chunk`` (a W action) calls it with ``"weight"`` and ``bwd_kwargs["param_groups"]``
  (that value), or, on stage 0, with ``"full"``;
- with ``dw_builder`` (a user-supplied W) the I action calls it with ``"full"`` and the W action calls the
  user's runner instead of it.

:func:`check_torch_contract` reads these facts from the compiled methods (their names and constants, so
it needs no source files) on the PyTorch class a graphkit stage extends (``PipelineStage`` or
``_PipelineStage``: a method either overrides is checked as it resolves there) and raises
:class:`PipelineContractError`, naming the torch version, when one no longer holds. The tests pin the same
facts by running real schedules with both frontends.
"""

from __future__ import annotations

import functools
import inspect

import torch

__all__ = ["TESTED_TORCH", "PipelineContractError", "check_torch_contract"]

TESTED_TORCH: tuple[str, ...] = ("2.13", "2.15")
"""The torch releases (major.minor) graphkit's tests run on in CI: the set-up's default, and the newest.

Other releases are not refused: :func:`check_torch_contract` checks the facts graphkit relies on, on whichever
torch is installed, and raises only when one of them no longer holds."""

# method -> (attribute and global names it must use, string constants it must contain)
_CALLERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "backward_one_chunk": (
        frozenset({"backward_maybe_with_nosync", "backward_state", "dw_builder"}),
        frozenset({"input", "full", "stage_output", "output_grads", "input_values"}),
    ),
    "backward_weight_one_chunk": (
        frozenset({"backward_maybe_with_nosync", "backward_state", "dw_builder"}),
        frozenset({"weight", "full", "stage_output", "param_groups"}),
    ),
}
_HOOK = "backward_maybe_with_nosync"
_HOOK_PARAMETERS = ("self", "backward_type", "bwd_kwargs", "last_backward")


class PipelineContractError(RuntimeError):
    """The installed ``torch.distributed.pipelining`` no longer calls the stage the way graphkit plugs in."""


def _string_constants(code: object) -> set[str]:
    found: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        constants = list(current.co_consts)  # type: ignore[attr-defined]
        while constants:
            constant = constants.pop()
            if isinstance(constant, str):
                found.add(constant)
            elif isinstance(constant, tuple | frozenset):  # the keys of a dict display
                constants.extend(constant)
            elif inspect.iscode(constant):
                stack.append(constant)
    return found


@functools.cache
def _contract_problems(base: type) -> tuple[str, ...]:
    problems: list[str] = []
    hook = getattr(base, _HOOK, None)
    if hook is None:
        return (f"{base.__qualname__} has no method {_HOOK}",)
    parameters = tuple(inspect.signature(hook).parameters)
    if parameters != _HOOK_PARAMETERS:
        problems.append(f"{_HOOK} takes {parameters}, not {_HOOK_PARAMETERS}")
    for method_name, (names, constants) in _CALLERS.items():
        method = getattr(base, method_name, None)
        code = getattr(method, "__code__", None)
        if code is None:
            problems.append(f"{base.__qualname__}.{method_name} is missing or not a Python function")
            continue
        missing_names = names - set(code.co_names)
        missing_constants = constants - _string_constants(code)
        if missing_names or missing_constants:
            missing = sorted(missing_names | missing_constants)
            problems.append(f"{method_name} no longer uses {', '.join(map(repr, missing))}")
    return tuple(problems)


def check_torch_contract(base: type | None = None) -> None:
    """Check that the installed torch routes a stage's I and W actions the way graphkit expects.

    Args:
        base: the PyTorch stage class to check, e.g. ``torch.distributed.pipelining.PipelineStage`` or the
            tracing frontend's ``torch.distributed.pipelining.stage._PipelineStage`` (default: their common
            base, ``torch.distributed.pipelining.stage._PipelineStageBase``).

    Raises:
        PipelineContractError: a method is missing, takes other arguments, or no longer routes I / W
            through ``backward_maybe_with_nosync``; the message names the installed torch and the tested
            releases (:data:`TESTED_TORCH`).
    """
    if base is None:
        from torch.distributed.pipelining.stage import _PipelineStageBase

        base = _PipelineStageBase
    problems = _contract_problems(base)
    if problems:
        raise PipelineContractError(
            f"graphkit's pipeline stage cannot plug into torch {torch.__version__}'s {base.__qualname__}: "
            + "; ".join(problems)
            + f". It is tested with torch {' and '.join(TESTED_TORCH)}: install one of those, use torch's own stage "
            "(PipelineStage, build_stage), or call graphkit.pipelining.stage_backward_input / "
            "stage_backward_weight from your own runtime"
        )
