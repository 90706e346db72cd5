"""graphkit's split backward for the I and W actions of ``torch.distributed.pipelining``'s stages.

A zero-bubble schedule of ``torch.distributed.pipelining`` (``ScheduleInterleavedZeroBubble``,
``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``, a ``_PipelineScheduleRuntime`` loaded from CSV) runs each
microbatch's backward as an I action (input gradients, sent to the previous stage at once) and a later W
action (weight gradients). PyTorch's stages compute them with ``stage_backward_input`` /
``stage_backward_weight`` (``torch/distributed/pipelining/_backward.py``), which give wrong or missing
gradients, or crash, on shared and tied weights, view outputs, parameter-only outputs, parameters inside
``loss_fn``, and never run the parameters' AccumulateGrad Nodes (so DDP's and post-accumulate-grad hooks
stay silent). graphkit's stages run :func:`~graphkit.split.backward.backward_input` and
:func:`~graphkit.split.backward.backward_weight` instead, which give every parameter exactly the gradient
of a full backward. Both of PyTorch's frontends are covered:

- :class:`PipelineStage`, the manual frontend (``torch.distributed.pipelining.PipelineStage``): the user
  cuts the model into stage modules;
- :func:`build_stage` / :class:`TracedPipelineStage`, the tracing frontend (``pipeline()`` then
  ``torch.distributed.pipelining.build_stage``): ``pipeline()`` traces the whole model with
  ``torch.export`` and cuts the graph into stage modules.

Where it plugs in: ``backward_maybe_with_nosync`` is overridden, the method PyTorch's stages call for
every backward (see :mod:`graphkit.pipelining.contract`), and so are ``clear_runtime_states`` and
``scale_grads``, so that a parameter shared by two stages on one rank is divided by the number of
microbatches once per step (:mod:`graphkit.pipelining.gradient_scaling`); the overrides live in one
mixin that both stage classes share. ``"input"`` and ``"weight"`` run graphkit's B and W inside the same DDP / FSDP2
settings as PyTorch's (:mod:`graphkit.pipelining.data_parallel`); ``"full"`` (B actions, and W on
stage 0, which PyTorch runs as a full backward) stays PyTorch's.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage as _TorchPipelineStage
from torch.distributed.pipelining.stage import _PipelineStage as _TorchTracedStage
from torch.nn.parallel import DistributedDataParallel

from graphkit.pipelining.compiled_modules import admit_split_compiled_modules
from graphkit.pipelining.contract import check_torch_contract
from graphkit.pipelining.data_parallel import check_data_parallel, data_parallel_backward
from graphkit.pipelining.gradient_scaling import shared_gradient_scaling
from graphkit.pipelining.stage_backward import split_input_gradients
from graphkit.split.backward import SplitState, backward_weight

__all__ = ["BackwardCalls", "PipelineStage", "TracedPipelineStage", "build_stage"]


@dataclass(slots=True)
class BackwardCalls:
    """How many backwards of each kind a stage ran: graphkit's B (``input``) and W (``weight``), and
    PyTorch's full backward (``full``: B actions, and W on stage 0)."""

    input: int = 0
    weight: int = 0
    full: int = 0


class _SplitBackwardStage:
    """What graphkit's stages add to PyTorch's: I and W run graphkit's B and W (mixed in before PyTorch's class).

    ``_torch_stage`` names the PyTorch stage class it is mixed into: :meth:`_prepare_split_backward`
    checks that class's contract before PyTorch's constructor runs.
    """

    _torch_stage: type
    submod: torch.nn.Module
    backward_calls: BackwardCalls

    def _prepare_split_backward(self, submodule: torch.nn.Module) -> None:
        """Check, before PyTorch's constructor: the installed torch's contract, DDP's settings; admit graphkit's
        compiled wrappers in the zero-bubble schedules (:mod:`graphkit.pipelining.compiled_modules`).

        Raises:
            PipelineContractError: the installed torch no longer routes I / W as graphkit expects.
            ValueError: ``submodule`` is DDP with ``find_unused_parameters=True``.
        """
        check_torch_contract(self._torch_stage)
        check_data_parallel(submodule)
        # the zero-bubble schedules then admit torch.compile(..., backend="graphkit_split") wrappers
        admit_split_compiled_modules(_SplitBackwardStage)
        self.backward_calls = BackwardCalls()

    def backward_maybe_with_nosync(
        self,
        backward_type: str,
        bwd_kwargs: dict,
        last_backward: bool = False,
    ) -> tuple[tuple[torch.Tensor | None, ...], Any]:
        """Run one backward of this stage: graphkit's B (``"input"``) or W (``"weight"``), PyTorch's ``"full"``.

        Args:
            backward_type: ``"input"``, ``"weight"`` or ``"full"``, as PyTorch's stage passes it.
            bwd_kwargs: for ``"input"``: ``stage_output``, ``output_grads``, ``input_values``; for
                ``"weight"``: ``param_groups``, the state the ``"input"`` call returned.
            last_backward: whether the schedule's step ends with this backward (DDP then all-reduces).

        Returns:
            ``(input_grads, state)`` for ``"input"`` (one gradient per input value; the state W needs),
            ``((), None)`` for ``"weight"``, PyTorch's result for ``"full"``.
        """
        shared_gradient_scaling.note_backward()
        if backward_type == "input":
            self.backward_calls.input += 1
            outputs = bwd_kwargs["stage_output"]
            with data_parallel_backward(self.submod, last_backward=last_backward):
                grads, state = split_input_gradients(
                    outputs, bwd_kwargs["output_grads"], bwd_kwargs["input_values"]
                )
            _detach_non_views(outputs)
            # sent to the previous stage: gloo sends contiguous tensors only (an LSTM's input gradient is not)
            return tuple(grad.contiguous() if grad is not None else None for grad in grads), state
        if backward_type == "weight":
            self.backward_calls.weight += 1
            state: SplitState | None = bwd_kwargs["param_groups"]
            with data_parallel_backward(self.submod, last_backward=last_backward):
                if state is not None:
                    backward_weight(state)
            return (), None
        self.backward_calls.full += 1
        return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)  # type: ignore[misc]

    def clear_runtime_states(self) -> None:
        """PyTorch's per-step reset; a step with a backward also notes this stage's parameters as held by it
        (:mod:`graphkit.pipelining.gradient_scaling`), so :meth:`scale_grads` knows which it shares."""
        super().clear_runtime_states()  # type: ignore[misc]
        if self.has_backward:  # type: ignore[attr-defined]
            shared_gradient_scaling.join(self, self.submod.parameters())

    def scale_grads(self, grad_scale_factor: int) -> None:
        """Divide the gradients by ``grad_scale_factor`` as PyTorch's stage does, but a parameter shared with
        other graphkit stages on this rank (tied weights on a V schedule's first and last stage) only once,
        after the last of them finished its backwards (PyTorch's divides it once per stage)."""
        if grad_scale_factor != 1:
            shared_gradient_scaling.scale(self, self.submod.parameters(), grad_scale_factor)


class PipelineStage(_SplitBackwardStage, _TorchPipelineStage):
    """``torch.distributed.pipelining.PipelineStage`` whose I and W actions run graphkit's split backward.

    Construct it exactly as PyTorch's stage: ``PipelineStage(submodule, stage_index, num_stages, device,
    input_args=..., output_args=..., group=..., ...)``; everything else (communication, metadata
    inference, forward, full backward, DDP ``no_sync`` and last-backward reduction, FSDP2's deferred
    reduction) is PyTorch's.

    Differences from PyTorch's stage, in the I and W actions and the end-of-step gradient scaling only:

    - every parameter gets exactly a full backward's gradient, parameters used inside ``loss_fn``
      included (W accumulates into every leaf of the graph, as a full backward does);
    - W runs the parameters' AccumulateGrad Nodes: post-accumulate-grad hooks fire once per microbatch,
      and DDP's gradient hooks all-reduce in the schedule's last W;
    - after I, the outputs that are not views are detached in place (the graph W needs stays alive
      without them); views are never detached;
    - ``scale_grads`` divides a parameter shared with other graphkit stages on this rank (tied weights on
      a V schedule's first and last stage) once per step, not once per stage
      (:mod:`graphkit.pipelining.gradient_scaling`);
    - ``stage.backward_calls`` counts the B, W and full backwards it ran;
    - the zero-bubble schedules admit a submodule that holds ``torch.compile(module,
      backend="graphkit_split")`` wrappers (``OptimizedModule``; PyTorch's stage refuses every wrapper there)
      and refuse one compiled with another backend, naming it (:mod:`graphkit.pipelining.compiled_modules`).

    With ``dw_builder`` (a custom weight-gradient runner) the stage does what PyTorch's does: each I
    action runs a full backward (exact input and weight gradients) and builds a runner with
    ``dw_builder()``, which the W action calls (at once, for a schedule without W actions); graphkit's
    split is then not used.

    Raises:
        PipelineContractError: the installed torch no longer routes I / W as graphkit expects (the
            message names its version).
        ValueError: the submodule is DDP with ``find_unused_parameters=True``.
        TypeError: arguments PyTorch's stage does not take.
    """

    _torch_stage = _TorchPipelineStage

    def __init__(
        self,
        submodule: torch.nn.Module,
        stage_index: int,
        num_stages: int,
        device: torch.device,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        inspect.signature(_TorchPipelineStage.__init__).bind(
            self, submodule, stage_index, num_stages, device, *args, **kwargs
        )  # PyTorch's TypeError for arguments it does not take, before any check of graphkit's
        self._prepare_split_backward(submodule)
        super().__init__(submodule, stage_index, num_stages, device, *args, **kwargs)

    def _compute_outputs(self, *args: Any, module: torch.nn.Module, **kwargs: Any) -> Any:
        """The forward of PyTorch's metadata inference (first step), under DDP's ``no_sync()`` like every forward.

        Outside ``no_sync()`` DDP's forward prepares its reducer for a backward, so the first W of the step
        (graphkit's W runs the gradient hooks) would all-reduce and record the parameters' order a second
        time, which DDP rejects at the next step's forward. (Only the manual frontend infers metadata with a
        forward; the tracing frontend reads it from the traced graph, and cannot hold a DDP module.)
        """
        if isinstance(module, DistributedDataParallel):
            with module.no_sync():
                return super()._compute_outputs(*args, module=module, **kwargs)
        return super()._compute_outputs(*args, module=module, **kwargs)


class _LocalNeighbourWarmup:
    """The tracing frontend's P2P warm-up without sends to this same rank (mixed in before PyTorch's class).

    Before the first step, a schedule over stages of the tracing frontend sends a dummy tensor to each
    neighbour stage and receives one from it (``_get_init_p2p_neighbors_ops`` in
    ``torch/distributed/pipelining/stage.py``; the manual frontend votes differently and has no such
    problem). A neighbour on the same rank - every stage in a one-process pipeline, the two middle stages
    of a V placement (``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) - gets a send to this rank itself,
    which gloo cannot do ("Pair is not connected"). The schedules never send between stages on one rank
    (they hand the tensors over locally), so those warm-up operations are dropped; the others are PyTorch's.
    torch 2.15 replaced that warm-up by one that connects only stages on other ranks (and removed
    ``_get_init_p2p_neighbors_ops``): there this override is never called and changes nothing.
    """

    group_rank: int

    def _get_init_p2p_neighbors_ops(self) -> list[dist.P2POp]:
        operations = super()._get_init_p2p_neighbors_ops()  # type: ignore[misc]
        return [operation for operation in operations if operation.group_peer != self.group_rank]


class TracedPipelineStage(_SplitBackwardStage, _LocalNeighbourWarmup, _TorchTracedStage):
    """The tracing frontend's pipeline stage (``torch.distributed.pipelining.build_stage``) with graphkit's I and W.

    :func:`build_stage` returns it; construct it with the same arguments as PyTorch's ``_PipelineStage``:
    ``(stage_module, stage_index, pipe_info, device, group=None)``. Its I and W actions differ from
    PyTorch's exactly as :class:`PipelineStage`'s do (exact gradients, AccumulateGrad Nodes run, outputs
    that are not views detached after I, a parameter shared by stages on one rank scaled once per step,
    ``backward_calls``). One more difference: the P2P warm-up before
    the first step skips neighbour stages on the same rank, so one-process pipelines and V placements run
    over gloo (PyTorch's stage fails there with "Pair is not connected" up to torch 2.14; torch 2.15 fixed
    its warm-up).

    Raises:
        PipelineContractError: the installed torch no longer routes I / W as graphkit expects.
        ValueError: ``stage_module`` is wrapped in DDP (the tracing frontend reads the stage module's fx
            graph, which DDP hides; PyTorch's stage fails there with an AttributeError).
    """

    _torch_stage = _TorchTracedStage

    def __init__(
        self,
        stage_module: torch.nn.Module,
        stage_index: int,
        pipe_info: Any,
        device: torch.device,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        if isinstance(stage_module, DistributedDataParallel):
            raise ValueError(
                "the tracing frontend's stage reads the stage module's fx graph, which "
                "DistributedDataParallel hides: pass pipe.get_stage_module(i) itself (fully_shard, FSDP2, "
                "keeps the module and works), or use graphkit.pipelining.PipelineStage with DDP"
            )
        self._prepare_split_backward(stage_module)
        super().__init__(stage_module, stage_index, pipe_info, device, group)


def build_stage(
    stage_module: torch.nn.Module,
    stage_index: int,
    pipe_info: Any,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> TracedPipelineStage:
    """``torch.distributed.pipelining.build_stage`` with graphkit's split backward for the I and W actions.

    Same arguments and use as PyTorch's function::

        pipe = pipeline(module, mb_args=(example_microbatch,), split_spec={"layers.4": SplitPoint.BEGINNING})
        stage = build_stage(pipe.get_stage_module(i), i, pipe.info(), device, group)

    (``pipe.build_stage(i, device, group)``, the method of ``Pipe``, builds PyTorch's own stage.)

    Args:
        stage_module: the stage's traced module, ``pipe.get_stage_module(stage_index)`` (an
            ``fx.GraphModule``; possibly wrapped by ``fully_shard`` in place).
        stage_index: this stage's index in the pipeline.
        pipe_info: ``pipe.info()``: the pipeline's graph and number of stages.
        device: the device the stage runs on (the module is moved there).
        group: the pipeline's process group (None: the default group).

    Returns:
        A :class:`TracedPipelineStage` for any schedule of ``torch.distributed.pipelining``.

    Raises:
        as :class:`TracedPipelineStage`.
    """
    return TracedPipelineStage(stage_module, stage_index, pipe_info, device, group)


def _detach_non_views(outputs: Any) -> None:
    """Detach the outputs in place to free their graph early, except views (``detach_()`` raises for them)."""
    for output in outputs:
        if isinstance(output, torch.Tensor) and output.grad_fn is not None and not output._is_view():
            output.detach_()
