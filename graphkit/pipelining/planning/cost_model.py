"""What the planner assumes each action and each message costs: per-stage seconds and bytes, a link model.

:class:`StageCost` holds one pipeline stage's per-microbatch costs - the seconds of F, I (input-gradient
backward, ``B`` in the ZB paper), W (weight-gradient backward) and a full backward B, and the bytes it
keeps alive between them - in the units ``graphkit costs`` measures (``activation_bytes``,
``b_keeps_bytes``, ``input_grad_bytes``). :class:`CommModel` prices one point-to-point message:
``latency + bytes / bandwidth`` seconds, and nothing between stages that sit on the same rank.

Memory as the simulator counts it, per microbatch on the stage's rank: F adds ``activation_bytes``; I
frees all of them but ``weight_bytes`` (what W still reads); W frees ``weight_bytes``; a full B frees
``activation_bytes``. The ZB paper's ``mem_f``, ``mem_b``, ``mem_w`` are ``activation_bytes``,
``weight_bytes - activation_bytes`` and ``-weight_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CommModel", "StageCost", "stage_costs"]


@dataclass(slots=True, frozen=True)
class StageCost:
    """One stage's per-microbatch costs.

    Attributes:
        forward: F seconds. backward_input: I seconds. backward_weight: W seconds.
        full_backward: seconds of a full backward B; None means ``backward_input + backward_weight``.
        activation_bytes: bytes F keeps alive until the backward (saved tensors).
        weight_bytes: bytes I keeps for W until W runs (``b_keeps_bytes``).
        recompute: seconds W spends recomputing activations first (checkpointing with recompute in W);
            added to every W, not to a full B.
        output_bytes: bytes F sends to the next stage (the activations crossing the boundary).
        input_grad_bytes: bytes I or B sends to the previous stage (gradients of the stage's inputs).

    Raises (on construction):
        ValueError: a negative or non-finite number.
    """

    forward: float
    backward_input: float
    backward_weight: float
    full_backward: float | None = None
    activation_bytes: int = 0
    weight_bytes: int = 0
    recompute: float = 0.0
    output_bytes: int = 0
    input_grad_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("forward", "backward_input", "backward_weight", "full_backward", "recompute"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"StageCost.{name} must be a finite number of seconds >= 0, got {value!r}")
        for name in ("activation_bytes", "weight_bytes", "output_bytes", "input_grad_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"StageCost.{name} must be >= 0 bytes, got {getattr(self, name)!r}")

    def seconds(self, kind: str) -> float:
        """The seconds one action of ``kind`` (F, I, W or B) takes on this stage.

        Raises:
            ValueError: an unknown kind.
        """
        if kind == "F":
            return self.forward
        if kind == "I":
            return self.backward_input
        if kind == "W":
            return self.backward_weight + self.recompute
        if kind == "B":
            if self.full_backward is None:
                return self.backward_input + self.backward_weight
            return self.full_backward
        raise ValueError(f"unknown action kind {kind!r}: expected F, I, W or B")


@dataclass(slots=True, frozen=True)
class CommModel:
    """Seconds of one point-to-point message: ``latency + bytes / bandwidth``; zero within one rank.

    Attributes:
        latency: seconds per message. bandwidth: bytes per second (``inf``: size costs nothing).
        rendezvous: the transfer starts only once the receiver is waiting for it, so a message sent long
            before still costs its seconds when the receiving rank reaches the action that needs it. gloo
            works this way: a send waits for the receiver's notice that its receive is posted, and
            ``torch.distributed.pipelining`` posts a receive just before the action that needs it. False:
            the message travels as soon as it is sent (a receive posted early, a buffered link).
        send_seconds: seconds the sending rank itself spends on each message to another rank after the
            action that produced it (issuing the send, its bookkeeping), before its next action.

    Raises (on construction):
        ValueError: a negative latency or a bandwidth that is not positive.
    """

    latency: float = 0.0
    bandwidth: float = math.inf
    rendezvous: bool = False
    send_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"CommModel.latency must be finite seconds >= 0, got {self.latency!r}")
        if not self.bandwidth > 0:
            raise ValueError(f"CommModel.bandwidth must be > 0 bytes per second, got {self.bandwidth!r}")
        if not (math.isfinite(self.send_seconds) and self.send_seconds >= 0):
            raise ValueError(f"CommModel.send_seconds must be finite seconds >= 0, got {self.send_seconds!r}")

    def seconds(self, num_bytes: int) -> float:
        """Seconds for one message of ``num_bytes`` between two ranks."""
        return self.latency + num_bytes / self.bandwidth


def stage_costs(costs: StageCost | Sequence[StageCost], num_stages: int) -> list[StageCost]:
    """One :class:`StageCost` per stage: ``costs`` repeated when it is a single one.

    Raises:
        ValueError: a sequence whose length is not ``num_stages``.
    """
    if isinstance(costs, StageCost):
        return [costs] * num_stages
    costs = list(costs)
    if len(costs) != num_stages:
        raise ValueError(f"got costs for {len(costs)} stages, the schedule has {num_stages}")
    return costs
