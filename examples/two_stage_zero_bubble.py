"""Two pipeline stages, four microbatches, B and W in a zero-bubble order - checked against a full backward.

    .venv/bin/python examples/two_stage_zero_bubble.py
    .venv/bin/python examples/two_stage_zero_bubble.py --microbatches 8
    .venv/bin/python examples/two_stage_zero_bubble.py --skip-weight 1 0    # drop stage 1's W of microbatch 0:
                                                                  # the check fails, exit status 1

A small model is cut in two stages, each driven by a :class:`graphkit.split.stage_compute.StageCompute`. One process
plays both stages, one time step at a time, following a zero-bubble schedule: each stage runs a B (input
gradients: the previous stage waits for them) as soon as it can, else a forward, else a pending W (weight
gradients) to fill what would be a bubble. Activations and gradients pass between the stages as they would
over the network: detached copies.

At the end, every parameter's accumulated ``.grad`` is compared with a full backward of the unsplit model
over the same microbatches (float64, relative tolerance 1e-10). Exit status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass

import torch
from torch import nn

from graphkit.split.stage_compute import StageCompute

WIDTH = 16


class FirstStage(nn.Module):
    """Features ``(batch, 8)`` in (no gradient: data), hidden ``(batch, 16)`` out."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        self.block = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU())

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.embed(features)
        return {"hidden": hidden + self.block(hidden)}


class LastStage(nn.Module):
    """Hidden ``(batch, 16)`` and targets ``(batch,)`` in, the mean squared error (a scalar) out."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.Tanh())
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = hidden + self.block(hidden)
        return {"loss": (self.head(hidden).squeeze(-1) - targets).pow(2).mean()}


@dataclass(frozen=True, slots=True)
class Action:
    """One unit of work: ``kind`` is ``F`` (forward), ``B`` (input gradients) or ``W`` (weight gradients)."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def schedule(stages: int, microbatches: int, *, fused: bool = False) -> list[list[Action | None]]:
    """Time steps of a greedy pipeline schedule: per step, one action (or None: idle) per stage.

    A stage runs, in this order of preference: a B whose gradient has arrived (the previous stage waits for
    it), a forward while fewer than ``stages - stage`` microbatches are in flight (bounds the activations
    kept, as 1F1B does), a pending W. Each action takes one time step; its result is usable the step after.
    With ``fused=True`` every W runs right after its B and the gradient leaves the stage only then: the
    ordinary 1F1B schedule with a full backward, for comparison.
    """
    done: set[tuple[str, int, int]] = set()
    forwards = [0] * stages  # next microbatch to forward, per stage
    pending_b: list[list[int]] = [[] for _ in range(stages)]
    pending_w: list[list[int]] = [[] for _ in range(stages)]
    sent = "W" if fused else "B"  # the action after which a stage's input gradient is sent
    steps: list[list[Action | None]] = []
    while len(done) < 3 * stages * microbatches:
        row: list[Action | None] = []
        for stage in range(stages):
            ready_b = [m for m in pending_b[stage] if stage == stages - 1 or (sent, stage + 1, m) in done]
            in_flight = forwards[stage] - sum(1 for m in range(forwards[stage]) if ("B", stage, m) in done)
            m = forwards[stage]
            can_forward = m < microbatches and (stage == 0 or ("F", stage - 1, m) in done)
            if fused and pending_w[stage]:
                row.append(Action("W", stage, pending_w[stage][0]))
            elif ready_b:
                row.append(Action("B", stage, ready_b[0]))
            elif can_forward and in_flight < stages - stage:
                row.append(Action("F", stage, m))
            elif pending_w[stage]:
                row.append(Action("W", stage, pending_w[stage][0]))
            else:
                row.append(None)
        for action in row:  # results become visible at the end of the step
            if action is None:
                continue
            done.add((action.kind, action.stage, action.microbatch))
            if action.kind == "F":
                forwards[action.stage] += 1
                pending_b[action.stage].append(action.microbatch)
            elif action.kind == "B":
                pending_b[action.stage].remove(action.microbatch)
                pending_w[action.stage].append(action.microbatch)
            else:
                pending_w[action.stage].remove(action.microbatch)
        steps.append(row)
    return steps


def show(title: str, steps: list[list[Action | None]]) -> None:
    """Print a schedule, one column per time step, and count its idle slots."""
    idle = sum(1 for row in steps for action in row if action is None)
    print(f"{title}: {len(steps)} time steps, {idle} idle slots")
    for index in range(len(steps[0])):
        cells = [str(row[index]) if row[index] else "." for row in steps]
        print(f"  stage {index}: " + " ".join(f"{cell:>2}" for cell in cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument(
        "--skip-weight",
        nargs=2,
        type=int,
        metavar=("STAGE", "MICROBATCH"),
        help="leave out one W phase, to see the check fail",
    )
    arguments = parser.parse_args()

    torch.manual_seed(0)
    first, last = FirstStage().double(), LastStage().double()
    reference_first, reference_last = copy.deepcopy(first), copy.deepcopy(last)
    batches = [
        (torch.randn(4, 8, dtype=torch.float64), torch.randn(4, dtype=torch.float64))
        for _ in range(arguments.microbatches)
    ]

    stages = [StageCompute(first, stage_index=0), StageCompute(last, stage_index=1)]
    received_hidden: dict[int, torch.Tensor] = {}  # stage 1's inputs, as sent by stage 0
    received_grads: dict[int, torch.Tensor] = {}  # stage 0's output gradients, as sent by stage 1
    losses: dict[int, float] = {}
    steps = schedule(len(stages), arguments.microbatches)
    skipped = tuple(arguments.skip_weight) if arguments.skip_weight else None

    for row in steps:
        for action in row:
            if action is None:
                continue
            stage, microbatch = stages[action.stage], action.microbatch
            features, targets = batches[microbatch]
            if action.kind == "F" and action.stage == 0:
                outputs = stage.forward(microbatch, {"features": features})
                received_hidden[microbatch] = outputs["hidden"].detach().requires_grad_()
            elif action.kind == "F":
                outputs = stage.forward(
                    microbatch, {"hidden": received_hidden.pop(microbatch), "targets": targets}
                )
                losses[microbatch] = outputs["loss"].item()
            elif action.kind == "B" and action.stage == 1:
                stage.backward_input(microbatch, None)  # the loss is a scalar: cotangent 1
                received_grads[microbatch] = stage.pop_input_grads(microbatch)["hidden"]
            elif action.kind == "B":
                stage.backward_input(microbatch, {"hidden": received_grads.pop(microbatch)})
                assert stage.pop_input_grads(microbatch) == {}  # features need no gradient
            elif skipped == (action.stage, microbatch):
                continue
            else:
                stage.backward_weight(microbatch)

    print("F forward, B input gradients, W weight gradients; one column per time step")
    show("zero-bubble order (what ran)", steps)
    show(
        "1F1B with a full backward, for comparison", schedule(len(stages), arguments.microbatches, fused=True)
    )
    print(f"mean loss {sum(losses.values()) / len(losses):.4f}")

    for features, targets in batches:  # the reference: full backward of the unsplit model
        reference_last(reference_first(features)["hidden"], targets)["loss"].backward()

    mismatches = []
    pairs = [
        (f"stage {index} {name}", parameter, expected)
        for index, (split, reference) in enumerate([(first, reference_first), (last, reference_last)])
        for (name, parameter), expected in zip(split.named_parameters(), reference.parameters(), strict=True)
    ]
    for name, parameter, expected in pairs:
        if parameter.grad is None:
            mismatches.append(f"{name}: no gradient")
            continue
        error = (parameter.grad - expected.grad).abs().max().item()
        scale = expected.grad.abs().max().item() or 1.0
        if error > 1e-10 * scale:
            mismatches.append(f"{name}: max |split - full| = {error:.3e} (largest gradient {scale:.3e})")
    if mismatches:
        print(f"{len(mismatches)} of {len(pairs)} parameter gradients differ from the full backward:")
        for line in mismatches:
            print("  " + line)
        return 1
    print(f"all {len(pairs)} parameter gradients match the full backward")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
