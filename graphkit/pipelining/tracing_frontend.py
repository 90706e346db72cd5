"""A pipeline spec's stages through PyTorch's tracing frontend: one model, traced and cut by ``pipeline()``.

The manual frontend takes the stage modules as they are; the tracing frontend
(``torch.distributed.pipelining.pipeline``, ``torch/distributed/pipelining/_IR.py``) takes one whole model
and an example microbatch, traces it with ``torch.export`` and cuts the graph into stage modules at split
points. :func:`trace_pipeline` composes the stage modules of a
:class:`~graphkit.models.pipeline_specs.PipelineModel` into one :class:`StageChain` (stage ``i``'s outputs
are stage ``i + 1``'s arguments), splits it at the beginning of every stage module but the first
(``split_spec={"stages.i": SplitPoint.BEGINNING}``), and returns a :class:`TracedPipeline`: the ``Pipe``,
its stage modules (``pipe.get_stage_module(i)``, for ``build_stage``), ``loss_fn`` and the batch.

What tracing changes, whichever stage runs the schedule (properties of ``torch.export``, not of a split):

- a parameter used by several stages is copied into each (``pipe.replicated_params``): each copy gets
  the gradient of its own stage's uses, and the untraced model's gradient is their sum
  (:meth:`TracedPipeline.copies` names them);
- ``loss_fn`` is not traced: it runs as it is, after the last stage;
- a custom ``autograd.Function`` is traced through: its forward becomes ATen operations, which autograd
  differentiates (the Function's own backward is not used);
- activation checkpointing is traced away: the block becomes ordinary operations whose activations are saved;
- the example microbatch's shapes are traced in: every microbatch must have them.

So the oracle of a split of the traced stages is a full backward through those same traced stage modules
(:meth:`TracedPipeline.full_backward`): the same operations in the same order, so a split is compared
with it bit for bit. The untraced model is a second, looser oracle, for what tracing itself changed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.distributed.pipelining import SplitPoint, pipeline

from graphkit.models.stage_chain import StageChain, chained_full_backward

if TYPE_CHECKING:
    from graphkit.models.pipeline_specs import PipelineModel

__all__ = ["PipelineTracingError", "StageChain", "TracedPipeline", "trace_pipeline"]


class PipelineTracingError(ValueError):
    """``pipeline()`` could not trace the stages composed into one model; the message says why."""


@dataclass(slots=True)
class TracedPipeline:
    """A model traced and cut into stages by ``pipeline()``, with its loss and one whole batch.

    Attributes:
        pipe: the ``torch.distributed.pipelining.Pipe``; ``pipe.info()`` goes to ``build_stage``.
        model: the model that was traced (a :class:`StageChain`, or the ``whole`` given to
            :func:`trace_pipeline`); its parameters name the untraced ones.
        stages: the traced stage modules, ``pipe.get_stage_module(i)`` (``fx.GraphModule``), stage 0 first.
        loss_fn: ``loss_fn(output, target)``, not traced (an ``nn.Module`` may hold parameters).
        inputs: stage 0's positional arguments for the whole batch (dimension 0 is the batch).
        target: the whole batch's target, or None.
        microbatch_size: rows per microbatch, the size traced in.
    """

    pipe: Any
    model: nn.Module
    stages: list[nn.Module]
    loss_fn: Callable[..., Tensor]
    inputs: tuple[Any, ...]
    target: Any
    microbatch_size: int

    def named_parameters(
        self, indices: Iterable[int] | None = None, *, loss_fn: bool = True
    ) -> dict[str, nn.Parameter]:
        """The traced stage modules' parameters by :meth:`parameter_name`, then ``loss_fn.{name}``.

        Args:
            indices: the stages to list (None: all).
            loss_fn: also list ``loss_fn``'s parameters (when it is an ``nn.Module``).
        """
        chosen = range(len(self.stages)) if indices is None else indices
        named = {
            self.parameter_name(index, name): parameter
            for index in chosen
            for name, parameter in self.stages[index].named_parameters()
        }
        if loss_fn and isinstance(self.loss_fn, nn.Module):
            named.update(
                {f"loss_fn.{name}": parameter for name, parameter in self.loss_fn.named_parameters()}
            )
        return named

    def parameter_name(self, index: int, name: str) -> str:
        """``stage{index}.{name}``, ``name`` (a path in :attr:`model`) without stage ``index``'s own prefix.

        ``stages.1.linear.weight`` of stage 1 is ``stage1.linear.weight``, as the manual frontend names
        it; a copy of another stage's parameter keeps its whole path (``stage0.stages.1.scale``).
        """
        prefix = f"stages.{index}."
        return f"stage{index}.{name[len(prefix) :] if name.startswith(prefix) else name}"

    def untraced_name(self, name: str) -> str:
        """The name :meth:`copies` gives a parameter of :attr:`model`: ``stage{i}.{name in stage i}`` for one
        of stage module ``i``, else its path in the model (a parameter of the whole model)."""
        head, _, rest = name.partition(".")
        index, _, inner = rest.partition(".")
        if head == "stages" and index.isdigit() and inner:
            return f"stage{index}.{inner}"
        return name

    def copies(self) -> dict[str, list[tuple[int, str]]]:
        """Each parameter of the untraced model: the traced parameters that hold it, by stage.

        Returns:
            ``{untraced name: [(stage index, traced name), ...]}`` in stage order, for every parameter of
            :attr:`model` (by :meth:`untraced_name` of its first path) that a traced stage module holds. A
            parameter ``pipeline()`` replicated has several; its untraced gradient is their sum. A stage
            module may hold a copy its graph does not use (it then gets no gradient).

        Raises:
            PipelineTracingError: a traced stage module holds a parameter that names none of the model's.
        """
        first_path = {id(parameter): name for name, parameter in self.model.named_parameters()}
        held: dict[str, list[tuple[int, str]]] = {}
        for index, stage in enumerate(self.stages):
            for name, _ in stage.named_parameters():
                try:
                    original = self.model.get_parameter(name)
                except AttributeError as error:
                    raise PipelineTracingError(
                        f"traced stage {index} holds a parameter {name!r} that the traced model does not have"
                    ) from error
                untraced = self.untraced_name(first_path[id(original)])
                held.setdefault(untraced, []).append((index, self.parameter_name(index, name)))
        return held

    def microbatch(self, index: int) -> tuple[tuple[Any, ...], Any]:
        """Microbatch ``index``: stage 0's arguments and the target, rows ``index * microbatch_size`` on."""
        window = slice(index * self.microbatch_size, (index + 1) * self.microbatch_size)
        inputs = tuple(value[window] if _batched(value) else value for value in self.inputs)
        target = self.target[window] if _batched(self.target) else self.target
        return inputs, target

    def full_backward(self, microbatches: int) -> None:
        """The oracle of a split: one full backward per microbatch through the traced stage modules, chained.

        Runs microbatches ``0 .. microbatches - 1`` in order, each forward through every stage module then
        ``loss_fn`` and ``backward()``; then divides the stage modules' gradients (not ``loss_fn``'s) by
        ``microbatches``, as the schedules' ``scale_grads`` does. Gradients accumulate into ``.grad``.
        """
        chained_full_backward(
            self.stages,
            self.loss_fn,
            (self.microbatch(index) for index in range(microbatches)),
            (microbatches,),
        )


def trace_pipeline(
    model: PipelineModel,
    microbatch_size: int,
    *,
    whole: nn.Module | None = None,
    description: str | None = None,
) -> TracedPipeline:
    """Compose a pipeline's stage modules into one model and cut it into stages with ``pipeline()``.

    Args:
        model: a :class:`~graphkit.models.pipeline_specs.PipelineModel` (``stages``, ``loss_fn``,
            ``inputs``, ``target``; the batch along dimension 0 of every tensor).
        microbatch_size: rows per microbatch: ``pipeline()`` traces the first ``microbatch_size`` rows
            (``mb_args``), and every microbatch must have that shape.
        whole: the model to trace instead of ``StageChain(model.stages)``; it must hold the stage modules
            as ``whole.stages[i]`` (a :class:`StageChain` subclass with parameters of its own, say).
        description: what the error message calls the model (a spec, say).

    Returns:
        A :class:`TracedPipeline` with one traced stage module per stage module of ``model``.

    Raises:
        PipelineTracingError: ``pipeline()`` (``torch.export``) could not trace the composed model, or did
            not cut it into one stage per stage module; the message holds its reason.
    """
    traced = StageChain(model.stages) if whole is None else whole
    num_stages = len(model.stages)
    split_spec = {f"stages.{index}": SplitPoint.BEGINNING for index in range(1, num_stages)}
    example = tuple(value[:microbatch_size] if _batched(value) else value for value in model.inputs)
    what = description or f"the {num_stages} stage modules"
    try:
        with warnings.catch_warnings():
            # raised inside torch.export on every trace (torch 2.13), about PyTorch's own code
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            pipe = pipeline(traced, mb_args=example, split_spec=split_spec)
    except Exception as error:
        raise PipelineTracingError(
            f"pipeline() cannot trace {what} composed into one model: {type(error).__name__}: "
            f"{_first_line(error)} (torch.export traces the whole model: a submodule registered in two "
            "stages, data-dependent control flow or untraceable Python fail; check the pipeline with the "
            "manual frontend instead)"
        ) from error
    if pipe.num_stages != num_stages:
        raise PipelineTracingError(
            f"pipeline() cut {what} into {pipe.num_stages} stages instead of {num_stages}: a stage module "
            "that runs no operation leaves no split point"
        )
    stages = [pipe.get_stage_module(index) for index in range(num_stages)]
    return TracedPipeline(
        pipe, traced, stages, model.loss_fn, tuple(model.inputs), model.target, microbatch_size
    )


def _batched(value: Any) -> bool:
    """Whether ``value`` is split into microbatches: a tensor with a batch dimension (dimension 0)."""
    return isinstance(value, Tensor) and value.dim() > 0


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
