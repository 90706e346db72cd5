"""Data parallelism around a split stage's B and W, as PyTorch's pipeline stage does it around its own.

``_PipelineStageBase.backward_maybe_with_nosync`` in ``torch/distributed/pipelining/stage.py`` wraps every
backward of a stage whose module is wrapped in DDP or FSDP2:

- DDP: every backward but the schedule's last runs under ``no_sync()`` (gradients accumulate locally);
  before the last, the reducer is prepared (``prepare_for_backward``), so the gradient hooks of that
  backward all-reduce the accumulated gradients;
- FSDP2 (``FSDPModule``): gradient synchronisation and resharding are switched off for every backward;
  the schedule's ``REDUCE_GRAD`` action (``perform_reduce_grad``) reduces and reshards once at the end.

:func:`data_parallel_backward` does the same around graphkit's B and W. Because graphkit's W runs the
parameters' AccumulateGrad Nodes (PyTorch's W computes weight gradients with ``torch.autograd.grad`` and
never does), DDP's gradient hooks fire in W, and the last W all-reduces like a non-pipelined DDP backward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

__all__ = ["check_data_parallel", "data_parallel_backward"]


def check_data_parallel(module: torch.nn.Module) -> None:
    """Raise if ``module``'s data parallelism cannot follow a split backward.

    Raises:
        ValueError: DDP with ``find_unused_parameters=True``: DDP searches the graph of the outputs it is
            given for unused parameters when the last backward starts, but after the B phase the W phase
            no longer has that graph. Construct DDP with ``find_unused_parameters=False`` (every parameter
            of a stage then needs a gradient in each step).
    """
    if isinstance(module, DistributedDataParallel) and module.find_unused_parameters:
        raise ValueError(
            "graphkit.pipelining.PipelineStage cannot split the backward of a DDP module built with "
            "find_unused_parameters=True (DDP would search a graph the W phase no longer holds); build "
            "DistributedDataParallel(..., find_unused_parameters=False)"
        )


@contextmanager
def data_parallel_backward(module: torch.nn.Module, *, last_backward: bool) -> Iterator[None]:
    """Run one B or W of ``module`` with the DDP / FSDP2 settings of PyTorch's pipeline stage.

    Args:
        module: the stage's module (``PipelineStage.submod``).
        last_backward: whether this is the schedule step's last backward of this stage (the schedule
            says so: only ever for a W or full backward, never for an I action).
    """
    if isinstance(module, DistributedDataParallel):
        check_data_parallel(module)
        if last_backward:
            # outputs matter to the reducer only with find_unused_parameters, which check_data_parallel rules out
            module.reducer.prepare_for_backward([])
            context = nullcontext()
        else:
            context = module.no_sync()
    else:
        if isinstance(module, FSDPModule):
            module.set_is_last_backward(False)
            module.set_reshard_after_backward(False)
            module.set_requires_gradient_sync(False)
        context = nullcontext()
    with context:
        yield
