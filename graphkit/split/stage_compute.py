"""Per-microbatch compute for one pipeline stage: forward with a cache, then full or split backward.

A pipeline schedule drives a :class:`StageCompute` with microbatch ids::

    stage = StageCompute(module, stage_index=1)
    outputs = stage.forward(0, {"hidden": received})        # cached until its backward
    stage.backward_input(0, {"hidden": grad_from_next})     # B: input gradients only
    send_to_previous(stage.pop_input_grads(0))
    ...
    stage.backward_weight(0)                                # W: later, fills a bubble

Inputs and outputs are dicts of tensors. ``None`` outputs are dropped. A module that returns a lone tensor
has it wrapped as ``{"output": tensor}``; any other non-mapping output (a tuple, a list) raises
:class:`StageError`, since its entries would have no names to send them by.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from graphkit.split.backward import SplitError, SplitState, backward_full, backward_input, backward_weight
from graphkit.split.checkpointing import Recompute, recompute_policy

__all__ = ["StageCompute", "StageError"]


class StageError(RuntimeError):
    """A schedule asked a stage for something out of order (double backward, W before B...)."""


@dataclass(slots=True)
class _Forward:
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]


@dataclass(slots=True)
class _Backward:
    grads: dict[str, torch.Tensor | None]
    requires_grad: set[str]
    split: SplitState | None  # set between B and W
    popped: bool = False


class StageCompute:
    """Forward and backward of one stage, keyed by microbatch id.

    Args:
        module: the stage's module; called as ``module(**inputs, **kwargs)``.
        stage_index: the stage's position in the pipeline (used in error messages).
        recompute: when W gets the saved tensors of non-reentrant activation checkpoints
            (:class:`~graphkit.split.checkpointing.Recompute`, passed to
            :func:`~graphkit.split.backward_input`).

    Raises:
        ValueError: ``recompute`` is not a :class:`~graphkit.split.checkpointing.Recompute` value.
    """

    def __init__(
        self, module: torch.nn.Module, stage_index: int = 0, recompute: Recompute | str = Recompute.IN_W
    ) -> None:
        self.module = module
        self.stage_index = stage_index
        self.recompute = recompute_policy(recompute)
        self._forwards: dict[int, _Forward] = {}
        self._backwards: dict[int, _Backward] = {}

    def _where(self, microbatch: int) -> str:
        return f"stage {self.stage_index}, microbatch {microbatch}"

    # --- forward --------------------------------------------------------------------------------------
    def forward(
        self, microbatch: int, inputs: Mapping[str, torch.Tensor], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """Run the forward of ``microbatch`` and cache its inputs and outputs for the backward.

        Returns:
            The outputs as a dict (``None`` values dropped; a lone tensor as ``{"output": tensor}``).

        Raises:
            StageError: the microbatch already has a cached forward, or the output is a tuple/list.
        """
        if microbatch in self._forwards:
            raise StageError(f"{self._where(microbatch)}: forward ran twice without a backward in between")
        try:
            result = self.module(**inputs, **kwargs)
        except Exception as error:
            raise StageError(f"{self._where(microbatch)}: the module's forward failed: {error}") from error
        if isinstance(result, torch.Tensor):
            outputs = {"output": result}
        elif isinstance(result, Mapping):
            outputs = {name: value for name, value in result.items() if value is not None}
        else:
            raise StageError(
                f"{self._where(microbatch)}: the module returned {type(result).__name__}; a stage must "
                "return a dict of tensors (or a lone tensor) so each output can be sent by name"
            )
        self._forwards[microbatch] = _Forward(dict(inputs), outputs)
        return outputs

    def outputs(self, microbatch: int) -> dict[str, torch.Tensor]:
        """The cached outputs of ``microbatch`` (to send to the next stage), without removing them."""
        found = self._forwards.get(microbatch)
        if found is None:
            raise StageError(f"{self._where(microbatch)}: no forward is cached; run forward first")
        return found.outputs

    # --- backward -------------------------------------------------------------------------------------
    def backward_full(self, microbatch: int, grad_outputs: Mapping[str, torch.Tensor] | None) -> None:
        """Ordinary backward of ``microbatch``: input gradients and parameter gradients at once.

        Args:
            grad_outputs: cotangent per output name; None when the outputs are scalar losses.

        Raises:
            StageError: no cached forward (never ran, or backward already ran for it), or an earlier
                backward of this microbatch id has not finished (W pending, input gradients not popped).
        """
        cached = self._cached_forward(microbatch)
        grads = backward_full(cached.outputs, self._cotangents(cached, grad_outputs), cached.inputs)
        del self._forwards[microbatch]  # only once the backward ran: a rejected call can be retried
        self._backwards[microbatch] = _Backward(
            dict(zip(cached.inputs, grads, strict=True)), _needing(cached), None
        )

    def backward_input(self, microbatch: int, grad_outputs: Mapping[str, torch.Tensor] | None) -> None:
        """B phase of ``microbatch``: input gradients now, parameter gradients left for :meth:`backward_weight`.

        Raises:
            StageError: no cached forward (never ran, or backward already ran for it), or an earlier
                backward of this microbatch id has not finished (W pending, input gradients not popped).
        """
        cached = self._cached_forward(microbatch)
        state = backward_input(
            cached.outputs, self._cotangents(cached, grad_outputs), cached.inputs, recompute=self.recompute
        )
        del self._forwards[microbatch]  # the outputs, and the input path's graph with them, can go now
        grads = dict(zip(cached.inputs, state.input_grads, strict=True))
        self._backwards[microbatch] = _Backward(grads, _needing(cached), state)

    def backward_weight(self, microbatch: int) -> None:
        """W phase of ``microbatch``: accumulate its parameter gradients into ``.grad``.

        Raises:
            StageError: no :meth:`backward_input` ran for this microbatch, or its W already ran; or it ran
                and failed part-way (the message says so: ``.grad`` may then hold part of the
                microbatch's gradients).

        Any error of :func:`graphkit.split.backward_weight` passes through; the state stays with the
        microbatch, so a retry either runs (when W had not started) or says that the earlier W failed.
        """
        record = self._backwards.get(microbatch)
        if record is None or record.split is None:
            raise StageError(
                f"{self._where(microbatch)}: weight backward with no input backward before it (or twice); "
                "run backward_input for this microbatch first"
            )
        state = record.split
        if state.used:  # kept by a W that failed: backward_weight's message says what .grad may hold
            try:
                backward_weight(state)
            except SplitError as error:
                raise StageError(f"{self._where(microbatch)}: {error}") from error
        backward_weight(state)
        record.split = None
        if record.popped:
            del self._backwards[microbatch]

    def pop_input_grads(self, microbatch: int) -> dict[str, torch.Tensor]:
        """Remove and return the input gradients of ``microbatch``, to send to the previous stage.

        Only inputs that require grad are returned (stage 0's token ids have none).

        Raises:
            StageError: no backward ran for this microbatch (or its gradients were already popped), or
            an input that requires grad received no gradient (the outputs do not depend on it, or the
            schedule is malformed).
        """
        record = self._backwards.get(microbatch)
        if record is None or record.popped:
            raise StageError(
                f"{self._where(microbatch)}: no input gradients to pop; run backward_full or "
                "backward_input first, and pop once"
            )
        missing = [name for name in sorted(record.requires_grad) if record.grads.get(name) is None]
        if missing:
            raise StageError(
                f"{self._where(microbatch)}: cannot send a null gradient: input(s) {', '.join(missing)} require "
                "grad but received none (the outputs do not depend on them, or the schedule is malformed)"
            )
        grads = {name: record.grads[name] for name in record.grads if name in record.requires_grad}
        record.popped, record.grads = True, {}
        if record.split is None:
            del self._backwards[microbatch]
        return grads  # type: ignore[return-value]

    # --- helpers --------------------------------------------------------------------------------------
    def _cached_forward(self, microbatch: int) -> _Forward:
        found = self._forwards.get(microbatch)
        if found is None:
            if microbatch in self._backwards:
                raise StageError(f"{self._where(microbatch)}: double backward: backward already ran for it")
            raise StageError(f"{self._where(microbatch)}: no forward is cached; run forward first")
        earlier = self._backwards.get(microbatch)
        # (stage 0's record, with no input that requires grad, holds nothing to lose once W ran)
        if earlier is not None and (
            earlier.split is not None or (earlier.requires_grad and not earlier.popped)
        ):
            # the id came back (a new step) before the earlier backward of it finished: replacing its
            # record would drop its W, or the input gradients the previous stage still waits for
            pending = (
                "its W has not run" if earlier.split is not None else "its input gradients were not popped"
            )
            raise StageError(
                f"{self._where(microbatch)}: an earlier backward of this microbatch id is not finished "
                f"({pending}); finish it (backward_weight, pop_input_grads) before the next backward of "
                "the same id"
            )
        return found

    @staticmethod
    def _cotangents(cached: _Forward, grad_outputs: Mapping[str, torch.Tensor] | None) -> Any:
        if grad_outputs is None:
            return None
        unknown = set(grad_outputs) - set(cached.outputs)
        if unknown:
            raise StageError(
                f"gradients were given for outputs {sorted(unknown)} that the forward did not return "
                f"(outputs: {sorted(cached.outputs)})"
            )
        return {name: grad_outputs.get(name) for name in cached.outputs}


def _needing(cached: _Forward) -> set[str]:
    return {name for name, tensor in cached.inputs.items() if tensor.requires_grad}
