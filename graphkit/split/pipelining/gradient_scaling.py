"""Dividing the gradient of a parameter that several stages on one rank share: once per step, not once per stage.

A schedule of ``torch.distributed.pipelining`` scales the gradients at the end of each stage's backwards
(``scale_grads(num_microbatches)``, from the last backward's action or ``perform_reduce_grad``), and a
stage divides every parameter of its module (``_PipelineStageBase.scale_grads`` in
``torch/distributed/pipelining/stage.py``). A parameter held by two stages on one rank - tied input and
output embeddings on the first and last stage of a V schedule - is divided twice, the first time while the
other stage is still adding to it: a wrong gradient. graphkit's stages divide such a parameter once, when
the last of the stages that share it in this step has finished its backwards.

Which stages share a parameter in a step: a schedule calls ``clear_runtime_states()`` on each of its stages
when a step starts, before any forward (``PipelineScheduleSingle.step``, ``PipelineScheduleMulti.step``
in ``torch/distributed/pipelining/schedules.py``), with ``has_backward`` set; a stage of a step with a
backward joins every parameter of its module there (:meth:`SharedGradientScaling.join`). Its
``scale_grads`` then divides at once the parameters no other joined stage holds, and a shared one when
every stage that joined it has scaled (:meth:`SharedGradientScaling.scale`). A stage that joins again
while the last round is incomplete (a step that raised) starts a new round.
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
    """The stages that hold one parameter in the current step, and those of them that scaled already."""

    joined: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    scaled: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)


class SharedGradientScaling:
    """The parameters held by graphkit's stages in this process, and which stages scaled them this step."""

    def __init__(self) -> None:
        # by identity: a WeakKeyDictionary would compare tensors with ==
        self._rounds: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._lock = threading.Lock()

    def join(self, stage: Any, parameters: Iterable[torch.Tensor]) -> None:
        """``stage`` starts a step with a backward over ``parameters``."""
        with self._lock:
            for parameter in parameters:
                current = self._rounds.get(parameter)
                if current is None:
                    current = self._rounds[parameter] = _Round()
                elif stage in current.joined or stage in current.scaled:
                    current.joined, current.scaled = weakref.WeakSet(), weakref.WeakSet()  # a new round
                current.joined.add(stage)

    def scale(self, stage: Any, parameters: Iterable[torch.Tensor], factor: float) -> None:
        """``stage`` finished its backwards of this step: divide each gradient by ``factor`` once.

        A parameter no other stage joined is divided now; a shared one when its last stage scales.
        """
        ready = []
        with self._lock:
            for parameter in parameters:
                current = self._rounds.get(parameter)
                if current is None or stage not in current.joined or len(current.joined) == 1:
                    ready.append(parameter)
                    continue
                current.scaled.add(stage)
                if all(holder in current.scaled for holder in current.joined):
                    current.joined, current.scaled = weakref.WeakSet(), weakref.WeakSet()
                    ready.append(parameter)
        with torch.no_grad():
            for parameter in ready:
                if parameter.grad is not None:
                    parameter.grad.div_(factor)


shared_gradient_scaling = SharedGradientScaling()
"""The process-wide record that graphkit's pipeline stages share."""
