"""Pipeline stage modules run one after another, as one model: the one way graphkit chains stages.

:class:`StageChain` is the model whose forward runs ``stages[0]``, then ``stages[1]`` on its outputs, and so
on, passing values as the pipeline schedules pass them: a tuple output is spread into the next stage's
positional arguments, anything else is its one argument. It is how several consecutive stage modules become
one pipeline stage, and the whole model ``torch.distributed.pipelining.pipeline()`` traces.

:func:`chained_full_backward` is the oracle of every pipeline check: one full backward per microbatch
through the chained stages and ``loss_fn``, then each parameter's gradient divided as the schedules'
``scale_grads`` divides it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["StageChain", "chained_full_backward", "run_chained"]


def run_chained(stages: Iterable[nn.Module], *values: Any) -> Any:
    """Run ``stages`` one after another on ``values`` (stage ``i + 1`` takes stage ``i``'s outputs as its
    positional arguments, a tuple spread); the last stage's output, a 1-tuple unwrapped."""
    for stage in stages:
        output = stage(*values)
        values = output if isinstance(output, tuple) else (output,)
    return values[0] if len(values) == 1 else values


class StageChain(nn.Module):
    """Stage modules run one after another, as one model: ``self.stages[i]`` (see :func:`run_chained`)."""

    def __init__(self, stages: Iterable[nn.Module]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)

    def forward(self, *values: Any) -> Any:
        return run_chained(self.stages, *values)


def chained_full_backward(
    stages: Sequence[nn.Module],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    batches: Iterable[tuple[tuple[Any, ...], Any]],
    divisors: Sequence[int] = (),
) -> None:
    """A full backward per microbatch through ``stages`` chained and ``loss_fn``; gradients accumulate in
    ``.grad``. Then every parameter of the stage modules (not ``loss_fn``'s) is divided by each of
    ``divisors`` in turn, once per parameter even when several stage modules hold it.

    Args:
        stages: the stage modules, in pipeline order.
        loss_fn: ``loss_fn(output, target)`` -> a scalar tensor.
        batches: ``(inputs, target)`` per microbatch, in the order the schedule runs them; ``inputs`` are
            stage 0's positional arguments.
        divisors: what the schedule divides each gradient by (``scale_grads``: the microbatch count, then
            the data-parallel replicas), divided one after another as the runtime does.

    Raises:
        whatever the stages or ``loss_fn`` raise.
    """
    for inputs, target in batches:
        loss_fn(run_chained(stages, *inputs), target).backward()
    if not divisors:
        return
    parameters = list({id(p): p for stage in stages for p in stage.parameters()}.values())
    with torch.no_grad():
        for parameter in parameters:
            if parameter.grad is not None:
                for divisor in divisors:
                    parameter.grad.div_(divisor)
