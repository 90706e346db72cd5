"""Dividing the gradient of a parameter that several stages on one rank share: once per step, not once per stage.

A schedule of ``torch.distributed.pipelining`` scales the gradients at the end of each stage's backwards
(``scale_grads(num_microbatches)``, from the last backward's action or ``perform_reduce_grad``), and a
stage divides every parameter of its module (``_PipelineStageBase.scale_grads`` in
``torch/distributed/pipelining/stage.py``). A parameter held by two stages on one rank - tied input and
output embeddings on the first and last stage of a V schedule - is divided twice, the first time while the
other stage is still adding to it: a wrong gradient. graphkit's stages divide such a parameter once, when
the last of the stages that share it in this step has finished its backwards.

Which stages share a parameter in a step: a schedule calls ``clear_runtime_states()`` on each of its stages
when a step starts, one after the other before any forward (``PipelineScheduleSingle.step``,
``PipelineScheduleMulti.step`` in ``torch/distributed/pipelining/schedules.py``), with ``has_backward``
set; a stage of a step with a backward joins every parameter of its module there
(:meth:`SharedGradientScaling.join`). Its ``scale_grads`` then divides at once the parameters no other
stage joined, and a shared one when every stage that joined it has scaled
(:meth:`SharedGradientScaling.scale`).

A round (the stages that hold one parameter in one step) starts over when a stage joins after any stage's
backward or scaling since the round's last join (the next step), or when a stage that joined it joins
again; a stage that joins in the place (stage index) of another supersedes it. So the stages of a step
that raised, or of a pipeline rebuilt over the same modules while the old stages are still alive (an
exception's traceback keeps them), never hold back the division of a later step.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["SharedGradientScaling", "shared_gradient_scaling"]


@dataclass(slots=True)
class _Round:
    """The stages that hold one parameter in the current step (by stage index), and which of them scaled."""

    epoch: int
    joined: dict[Any, weakref.ref[Any]] = field(default_factory=dict)
    scaled: set[Any] = field(default_factory=set)

    def complete(self) -> bool:
        return all(place in self.scaled or stage() is None for place, stage in self.joined.items())


def _place(stage: Any) -> Any:
    """Where a stage sits in its pipeline: its stage index (any object without one is a place of its own)."""
    index = getattr(stage, "stage_index", None)
    return ("stage", index) if isinstance(index, int) else ("object", id(stage))


class SharedGradientScaling:
    """The parameters held by graphkit's stages in this process, and which stages scaled them this step."""

    def __init__(self) -> None:
        # by identity: a WeakKeyDictionary would compare tensors with ==
        self._rounds: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._lock = threading.Lock()
        self._epoch = 0  # counts backwards and scalings: joins between two of them belong to one step

    def note_backward(self) -> None:
        """A stage ran a backward: the next join starts a new step's round."""
        with self._lock:
            self._epoch += 1

    def join(self, stage: Any, parameters: Iterable[torch.Tensor]) -> None:
        """``stage`` starts a step with a backward over ``parameters``."""
        place = _place(stage)
        with self._lock:
            for parameter in parameters:
                current = self._rounds.get(parameter)
                if current is None or current.epoch != self._epoch or _same(current.joined.get(place), stage):
                    current = self._rounds[parameter] = _Round(self._epoch)
                current.joined[place] = weakref.ref(stage)  # supersedes a stage of an older pipeline
                current.scaled.discard(place)

    def scale(self, stage: Any, parameters: Iterable[torch.Tensor], factor: float) -> None:
        """``stage`` finished its backwards of this step: divide each gradient by ``factor`` once.

        A parameter no other stage joined is divided now; a shared one when its last stage scales.
        """
        place = _place(stage)
        ready = []
        with self._lock:
            self._epoch += 1
            for parameter in parameters:
                current = self._rounds.get(parameter)
                if current is None or not _same(current.joined.get(place), stage) or len(current.joined) == 1:
                    ready.append(parameter)
                    continue
                current.scaled.add(place)
                if current.complete():
                    del self._rounds[parameter]
                    ready.append(parameter)
        with torch.no_grad():
            for parameter in ready:
                if parameter.grad is not None:
                    parameter.grad.div_(factor)


def _same(reference: weakref.ref[Any] | None, stage: Any) -> bool:
    return reference is not None and reference() is stage


shared_gradient_scaling = SharedGradientScaling()
"""The process-wide record that graphkit's pipeline stages share."""
