"""What the planner assumes each action and each message costs: per-stage seconds and bytes, a link model.

:class:`StageCost` holds one pipeline stage's per-microbatch costs - the seconds of F, I (input-gradient
backward, ``B`` in the ZB paper), W (weight-gradient backward) and a full backward B, and the bytes it
keeps alive between them - in the units ``graphkit costs`` measures (``activation_bytes``,
``b_keeps_bytes``, ``input_grad_bytes``). :class:`CommModel` prices one point-to-point message:
``latency + bytes / bandwidth`` seconds, and nothing between stages that sit on the same rank.
:func:`validate_costs_json` checks a costs JSON (``graphkit costs --json``) field by field before the planner
reads it, and names the file and the field when one is missing or wrong.

Memory as the simulator counts it, per microbatch on the stage's rank: F adds ``activation_bytes``; I
frees all of them but ``weight_bytes`` (what W still reads); W frees ``weight_bytes``; a full B frees
``activation_bytes``. The ZB paper's ``mem_f``, ``mem_b``, ``mem_w`` are ``activation_bytes``,
``weight_bytes - activation_bytes`` and ``-weight_bytes``.

The arithmetic on costs lives here too: reading what ``graphkit costs`` measured (:func:`costs_from_json`
for its JSON, :func:`costs_from_measured` for its records), adding consecutive stages into one
(:func:`merge_stage_costs`), the first stage as the runtime spends it (:func:`first_stage_as_run`), the mean
stage and scaled copies (:func:`mean_cost`, :func:`scaled`, :func:`slowed`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "NOTHING_SECONDS",
    "CommModel",
    "CostsFileError",
    "StageCost",
    "costs_from_json",
    "costs_from_measured",
    "first_stage_as_run",
    "free_split",
    "mean_cost",
    "merge_stage_costs",
    "scaled",
    "slowed",
    "stage_costs",
    "validate_costs_json",
]

NOTHING_SECONDS = 1e-6
"""Seconds of an I with nothing to compute (the first stage's; the adaptive scheduler needs I to take time)."""


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


@dataclass(slots=True, frozen=True)
class _Measured:
    """What one measured stage contributes to its :class:`StageCost` (and to its neighbour's bytes)."""

    forward: float
    backward_input: float
    backward_weight: float
    full_backward: float | None
    activation_bytes: int
    weight_bytes: int
    recompute: float
    input_grad_bytes: int


def _linked(stages: Sequence[_Measured]) -> list[StageCost]:
    """Per-stage costs; the bytes stage ``s`` sends forward are the input gradients of stage ``s + 1``
    (the same tensors' shapes), and the first stage sends no input gradient."""
    return [
        StageCost(
            forward=stage.forward,
            backward_input=stage.backward_input,
            backward_weight=stage.backward_weight,
            full_backward=stage.full_backward,
            activation_bytes=stage.activation_bytes,
            weight_bytes=stage.weight_bytes,
            recompute=stage.recompute,
            output_bytes=stages[index + 1].input_grad_bytes if index + 1 < len(stages) else 0,
            input_grad_bytes=stage.input_grad_bytes if index > 0 else 0,
        )
        for index, stage in enumerate(stages)
    ]


def costs_from_measured(stages: Sequence[Any]) -> list[StageCost]:
    """Per-stage costs from the records ``graphkit.measure.costs`` measures (``PipelineCosts.stages``,
    read by attribute): F, I, W seconds (``forward.seconds``, ...), ``full_backward_seconds`` where
    measured (else B costs I + W), ``activation_bytes``, ``b_keeps_bytes`` as what I keeps for W,
    ``input_grad_bytes``."""
    return _linked(
        [
            _Measured(
                float(stage.forward.seconds),
                float(stage.backward_input.seconds),
                float(stage.backward_weight.seconds),
                None if stage.full_backward_seconds is None else float(stage.full_backward_seconds),
                int(stage.activation_bytes),
                int(stage.b_keeps_bytes),
                float(getattr(stage, "recompute_seconds", 0.0)),
                int(stage.input_grad_bytes),
            )
            for stage in stages
        ]
    )


def costs_from_json(data: Mapping[str, Any] | str | os.PathLike[str]) -> list[StageCost]:
    """Per-stage costs from what ``graphkit costs --json`` writes (``PipelineCosts.to_dict()``), or its file.

    The same fields as :func:`costs_from_measured`; an optional ``recompute_seconds`` per stage is added
    to its W.

    Raises:
        ValueError: no ``stages`` list; OSError: the file cannot be read.
    """
    data = validate_costs_json(data)
    stages = data["stages"]
    return _linked(
        [
            _Measured(
                float(stage["forward"]["seconds"]),
                float(stage["backward_input"]["seconds"]),
                float(stage["backward_weight"]["seconds"]),
                None if stage.get("full_backward_seconds") is None else float(stage["full_backward_seconds"]),
                int(stage.get("activation_bytes", 0)),
                int(stage.get("b_keeps_bytes", 0)),
                float(stage.get("recompute_seconds", 0.0)),
                int(stage.get("input_grad_bytes", 0)),
            )
            for stage in stages
        ]
    )


def merge_stage_costs(costs: Sequence[StageCost], stages: int) -> list[StageCost]:
    """``costs`` of consecutive stages added into ``stages`` stages (seconds and kept bytes added; the
    bytes sent are the last one's forward and the first one's backward).

    Raises:
        ValueError: ``stages`` does not divide the number of costs.
    """
    if stages < 1 or len(costs) % stages:
        raise ValueError(f"{len(costs)} measured stages do not merge into {stages}")
    size = len(costs) // stages
    merged = []
    for index in range(stages):
        group = costs[index * size : (index + 1) * size]
        full = [item.full_backward for item in group]
        merged.append(
            StageCost(
                forward=sum(item.forward for item in group),
                backward_input=sum(item.backward_input for item in group),
                backward_weight=sum(item.backward_weight for item in group),
                full_backward=None if None in full else sum(full),  # type: ignore[arg-type]
                activation_bytes=sum(item.activation_bytes for item in group),
                weight_bytes=sum(item.weight_bytes for item in group),
                recompute=sum(item.recompute for item in group),
                output_bytes=group[-1].output_bytes,
                input_grad_bytes=group[0].input_grad_bytes,
            )
        )
    return merged


def first_stage_as_run(costs: Sequence[StageCost]) -> list[StageCost]:
    """The costs as PyTorch's runtime spends them: the first stage has no input gradient to compute, so its
    I does nothing (:data:`NOTHING_SECONDS`) and its W is a full backward (``torch.distributed.pipelining``
    runs W on stage 0 as a full backward, and so does graphkit's stage). The other stages are unchanged."""
    if not costs:
        return []
    first = costs[0]
    full = first.seconds("B")
    return [
        replace(first, backward_input=NOTHING_SECONDS, backward_weight=full, full_backward=full),
        *costs[1:],
    ]


def mean_cost(costs: Sequence[StageCost]) -> StageCost:
    """The mean stage of ``costs`` (seconds and kept bytes averaged; the bytes sent: the largest)."""
    n = len(costs)
    return StageCost(
        forward=sum(c.forward for c in costs) / n,
        backward_input=sum(c.backward_input for c in costs) / n,
        backward_weight=sum(c.backward_weight for c in costs) / n,
        activation_bytes=sum(c.activation_bytes for c in costs) // n,
        weight_bytes=sum(c.weight_bytes for c in costs) // n,
        recompute=sum(c.recompute for c in costs) / n,
        full_backward=(
            None
            if any(c.full_backward is None for c in costs)
            else sum(c.full_backward or 0.0 for c in costs) / n
        ),
        output_bytes=max(c.output_bytes for c in costs),
        input_grad_bytes=max(c.input_grad_bytes for c in costs),
    )


def slowed(costs: Sequence[StageCost], factor: float, weight_factor: float | None = None) -> list[StageCost]:
    """``costs`` with every pass's seconds multiplied by ``factor`` (bytes unchanged), W's by
    ``weight_factor`` where given: what W costs late in a pipeline step. A full backward keeps ``factor``
    (a stage without its own full backward gets ``factor x (I + W)`` as one), and so does the W of a stage
    whose I is nothing (the first stage as run, :func:`first_stage_as_run`: its W is a full backward)."""
    result = []
    for cost in costs:
        full = None if cost.full_backward is None else cost.full_backward * factor
        weight = factor
        if weight_factor is not None and weight_factor != factor:
            full = cost.seconds("B") * factor
            weight = factor if cost.backward_input <= NOTHING_SECONDS else weight_factor
        result.append(
            replace(
                cost,
                forward=cost.forward * factor,
                backward_input=cost.backward_input * factor,
                backward_weight=cost.backward_weight * weight,
                full_backward=full,
                recompute=cost.recompute * factor,
            )
        )
    return result


def free_split(costs: Sequence[StageCost]) -> list[StageCost]:
    """``costs`` as if splitting a backward cost nothing: on every stage but the first, I and W rescaled so
    that I + W equals the full backward B, in the proportion measured (I / (I + W) kept). A bound, not a
    measurement: what a zero-bubble schedule could gain if graphkit's split added no work, which tells a
    bubble too small to fill from a split too dear to fill it. The first stage (as
    :func:`first_stage_as_run` left it: W is a full backward) is unchanged."""
    freed = list(costs[:1])
    for cost in costs[1:]:
        split = cost.backward_input + cost.backward_weight
        share = cost.backward_input / split if split > 0 else 0.5
        full = cost.seconds("B")
        freed.append(replace(cost, backward_input=full * share, backward_weight=full * (1 - share)))
    return freed


def scaled(cost: StageCost, factor: float) -> StageCost:
    """One stage's seconds and kept bytes multiplied by ``factor`` (a stage cut into ``1 / factor``)."""
    (seconds,) = slowed([cost], factor)
    return replace(
        seconds,
        activation_bytes=int(cost.activation_bytes * factor),
        weight_bytes=int(cost.weight_bytes * factor),
    )


class CostsFileError(ValueError):
    """A costs JSON the planner cannot use; the message is one line naming the file and the field."""


_SECONDS = ("forward", "backward_input", "backward_weight")  # {"seconds": ...} each, as graphkit costs writes
_BYTES = ("activation_bytes", "b_keeps_bytes")  # per stage; input_grad_bytes too on every stage but the first
_HOW = "as `graphkit costs PIPELINE_SPEC --json -o FILE` writes it, with --pipeline for hf:gpt2 or hf:llama"


def validate_costs_json(data: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The costs JSON ``data`` (what ``graphkit costs --json`` writes, ``PipelineCosts.to_dict()``), or the one
    in file ``data``, checked for every field the planner reads, before any is read.

    Each stage needs ``forward``, ``backward_input`` and ``backward_weight`` as ``{"seconds": s}`` (finite
    seconds >= 0), ``activation_bytes`` and ``b_keeps_bytes`` (bytes >= 0, no default: a missing one would
    plan zero-byte peaks), and every stage but the first ``input_grad_bytes``. ``full_backward_seconds``
    (null or seconds) and ``recompute_seconds`` are optional.

    Returns:
        The parsed JSON, unchanged.

    Raises:
        CostsFileError (a ``ValueError``): one line naming the file (or "the costs JSON" for a dict) and
            what is wrong: an unreadable, empty or invalid file, no ``stages`` list, a missing or bad field
            (``stages[1].backward_weight.seconds``).
    """
    where = "the costs JSON"
    if not isinstance(data, dict):
        where = str(data)
        try:
            text = Path(data).read_text()
        except OSError as error:
            raise CostsFileError(f"{where}: cannot be read ({error.strerror or error})") from None
        if not text.strip():
            raise CostsFileError(f"{where}: the file is empty, not a costs JSON; measure one {_HOW}")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise CostsFileError(
                f"{where}: not valid JSON ({error.msg}: line {error.lineno} column {error.colno}); "
                f"a costs JSON is {_HOW}"
            ) from None
        if not isinstance(data, dict):
            raise CostsFileError(f"{where}: holds a {type(data).__name__}, not a costs JSON object ({_HOW})")
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise CostsFileError(f"{where}: no 'stages' list (one entry per pipeline stage, {_HOW})")
    for index, stage in enumerate(stages):
        if not isinstance(stage, dict):
            raise CostsFileError(f"{where}: stages[{index}] is a {type(stage).__name__}, not an object")
        for name in _SECONDS:
            entry = stage.get(name)
            value = entry.get("seconds") if isinstance(entry, dict) else None
            _check_number(where, f"stages[{index}].{name}.seconds", value, "seconds")
        for name in _BYTES + (("input_grad_bytes",) if index > 0 else ()):
            _check_number(where, f"stages[{index}].{name}", stage.get(name), "bytes")
        for name in ("full_backward_seconds", "recompute_seconds"):
            if stage.get(name) is not None:
                _check_number(where, f"stages[{index}].{name}", stage[name], "seconds")
    return data


def _check_number(where: str, field: str, value: Any, unit: str) -> None:
    if value is None:
        raise CostsFileError(f"{where}: {field} is missing ({unit}, {_HOW})")
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise CostsFileError(f"{where}: {field} must be a number of {unit} >= 0, got {value!r}")
