"""Per-microbatch costs of a pipeline stage's F, B and W: time, FLOPs and memory, as schedulers take them.

Zero-bubble schedulers plan with the time and memory of each stage's three passes: **F** (forward),
**B** (the input-gradient backward, :func:`graphkit.split.backward.backward_input`) and **W** (the
weight-gradient backward, :func:`graphkit.split.backward.backward_weight`). The automatic scheduler of
Qi et al. ("Zero Bubble Pipeline Parallelism", ICLR 2024, ``GraphConfig(cost_f, cost_b, cost_w,
cost_comm, mem_f, mem_b, mem_w, max_mem)``) and ColossalAI's V-schedule builder take exactly these;
:func:`stage_costs` measures them for one stage, :func:`pipeline_costs` for each stage of a pipeline,
:func:`spec_costs` for a model spec or a pipeline spec (:mod:`graphkit.models.pipeline_specs`).

Method (all in one run, on the device the stage lives on):

- **time**: ``warmup`` unmeasured microbatches, then the median over ``repeat`` microbatches of the
  wall time of F, of B and of W (``time.perf_counter``; CUDA is synchronized around each pass), and of a
  full backward on one more microbatch each time (``full_backward_seconds``: what 1F1B's B costs);
- **FLOPs**: one more microbatch under ``torch.utils.flop_counter.FlopCounterMode``, a pass at a time
  (:class:`graphkit.measure.flops.PhaseFlops`);
- **bytes** (exact, from the tensors themselves, each storage counted once, parameters never):
  ``activation_bytes`` - the saved tensors a forward leaves for the backward (everything the autograd
  graph of the outputs saved); ``b_keeps_bytes`` - what the B phase keeps for W (captured gradients and
  the saved tensors W's formulas read, :func:`graphkit.measure.benchmark.memory_kept`);
  ``b_frees_bytes`` - the activations B frees once the stage outputs are dropped; ``w_needs_bytes`` -
  what W reads; ``w_frees_bytes`` - what W releases (all B kept); ``input_grad_bytes`` - the gradients
  B hands to the previous stage; ``parameter_grad_bytes`` - the ``.grad`` W fills (allocated once, not
  per microbatch);
- **peak** (``peak_bytes`` of each pass): the most bytes of tensors the pass allocates that are alive at
  once (above what was alive when it started), measured on one more microbatch under a
  ``TorchDispatchMode`` that follows every op's output storages (:class:`_PeakTracker`).

The scheduler's memory fields are net changes per microbatch and add up to zero over F, B and W:
``mem_f = activation_bytes``, ``mem_b = b_keeps_bytes - activation_bytes``, ``mem_w = -b_keeps_bytes``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from graphkit.analysis.uncounted_flops import flop_coverage
from graphkit.graph.autograd_graph import capture
from graphkit.graph.tensors import GraphkitInputError, distinct_bytes, flatten_tensors
from graphkit.measure.benchmark import memory_kept, saved_tensors_below
from graphkit.measure.flops import PhaseFlops
from graphkit.measure.stage_inputs import call_stage, fresh_inputs, placed_stage
from graphkit.measure.timing import timed
from graphkit.models.pipeline_specs import PIPELINE_ARCHITECTURES, PipelineModel, load_stage_or_pipeline
from graphkit.models.specs import SpecError
from graphkit.split.backward import SplitState, backward_input, backward_weight
from graphkit.split.compile_backend import register_backends

__all__ = ["PassCost", "PipelineCosts", "StageCosts", "pipeline_costs", "spec_costs", "stage_costs"]

METHOD = (
    "time: median wall time over {repeat} microbatches after {warmup} warm-up ones (time.perf_counter, "
    "synchronized on CUDA), one run; FLOPs: torch.utils.flop_counter.FlopCounterMode on one more "
    "microbatch; bytes: exact, from the saved tensors, captured gradients and kept tensors (each storage "
    "once, parameters excluded); peak: most bytes a pass allocated alive at once, after any op "
    "(a TorchDispatchMode following output storages, one more microbatch)"
)


@dataclass(slots=True)
class PassCost:
    """One pass (F, B or W) of one microbatch: median seconds, FLOPs, peak bytes."""

    seconds: float
    flops: int
    peak_bytes: int


@dataclass(slots=True)
class StageCosts:
    """The per-microbatch costs of one stage (see the module docstring for each field and the method).

    Times in seconds, FLOPs as counted by ``FlopCounterMode``, memory in bytes.
    """

    stage_index: int
    forward: PassCost
    backward_input: PassCost
    backward_weight: PassCost
    activation_bytes: int
    b_keeps_bytes: int
    b_frees_bytes: int
    w_needs_bytes: int
    w_frees_bytes: int
    input_grad_bytes: int
    parameter_grad_bytes: int
    device: str
    repeat: int
    warmup: int
    flops_partial: bool = False
    flops_note: str = ""
    full_backward_seconds: float | None = None

    def scheduler_fields(self) -> dict[str, float | int]:
        """F/B/W times (seconds) and net memory changes (bytes) as zero-bubble schedulers take them."""
        return {
            "cost_f": self.forward.seconds,
            "cost_b": self.backward_input.seconds,
            "cost_w": self.backward_weight.seconds,
            "mem_f": self.activation_bytes,
            "mem_b": self.b_keeps_bytes - self.activation_bytes,
            "mem_w": -self.b_keeps_bytes,
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON data, plus ``scheduler`` (:meth:`scheduler_fields`)."""
        return {**asdict(self), "scheduler": self.scheduler_fields()}


@dataclass(slots=True)
class PipelineCosts:
    """Costs of every stage of a pipeline (one stage for a model spec), with the method used."""

    stages: list[StageCosts]
    method: str = field(default="")

    def scheduler_config(self) -> dict[str, list[float | int]]:
        """One list per field, one entry per stage: the ZB paper's ``GraphConfig`` arguments.

        ``cost_f``, ``cost_b``, ``cost_w`` (seconds) and ``mem_f``, ``mem_b``, ``mem_w`` (bytes); the
        scheduler's ``cost_comm`` and ``max_mem`` depend on the cluster and the memory budget, not on the
        stage, and are left to the caller.
        """
        fields = [stage.scheduler_fields() for stage in self.stages]
        config: dict[str, list[float | int]] = {key: [item[key] for item in fields] for key in fields[0]}
        return config

    def to_dict(self) -> dict[str, Any]:
        """``{"method", "stages": [...], "scheduler": scheduler_config()}``."""
        return {
            "method": self.method,
            "flops_partial": any(stage.flops_partial for stage in self.stages),
            "stages": [stage.to_dict() for stage in self.stages],
            "scheduler": self.scheduler_config(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def table(self) -> str:
        """A plain-text table: one row per stage and pass (time, FLOPs, memory), then the method."""
        rows = [("stage", "pass", "time (ms)", "FLOPs", "peak", "memory")]
        for stage in self.stages:
            passes = (
                ("F", stage.forward, f"leaves {_bytes(stage.activation_bytes)} for the backward"),
                (
                    "I",  # the input-gradient backward: PyTorch's schedules' I, the ZB paper's B
                    stage.backward_input,
                    f"frees {_bytes(stage.b_frees_bytes)}, keeps {_bytes(stage.b_keeps_bytes)}, "
                    f"sends {_bytes(stage.input_grad_bytes)} of input gradients",
                ),
                (
                    "W",
                    stage.backward_weight,
                    f"needs {_bytes(stage.w_needs_bytes)}, frees {_bytes(stage.w_frees_bytes)}",
                ),
            )
            for name, cost, memory in passes:
                rows.append(
                    (
                        str(stage.stage_index),
                        name,
                        f"{cost.seconds * 1e3:.3f}",
                        f"{cost.flops:,}",
                        _bytes(cost.peak_bytes),
                        memory,
                    )
                )
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        lines = []
        for position, row in enumerate(rows):
            lines.append(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            )
            if position == 0:
                lines.append("  ".join("-" * width for width in widths))
        for stage in self.stages:
            if stage.flops_partial:
                lines.append(f"stage {stage.stage_index} FLOPs {stage.flops_note}")
        lines.append(f"method: {self.method}")
        return "\n".join(lines)


def _bytes(count: int) -> str:
    return f"{count:,} B"


# --- measuring ---------------------------------------------------------------------------------------------
def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [tensor for _, tensor in flatten_tensors(value) if isinstance(tensor, torch.Tensor)]


class _Microbatch:
    """One microbatch of one stage: fresh inputs, forward (plus the loss on the last stage), B and W."""

    def __init__(
        self,
        module: torch.nn.Module,
        inputs: Any,
        device: torch.device,
        loss: Callable[[Any], torch.Tensor] | None,
        seed: int,
    ) -> None:
        self.module = module
        self.inputs = fresh_inputs(inputs, device=device)
        self.device = device
        self.loss = loss
        self.seed = seed
        self.outputs: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] | None = None
        self.state: SplitState | None = None

    def forward(self) -> None:
        result = call_stage(self.module, self.inputs)
        if self.loss is not None:
            self.outputs = [self.loss(result)]
            self.grads = None
            return
        self.outputs = [tensor for tensor in _tensors(result) if tensor.requires_grad]
        if not self.outputs:
            raise GraphkitInputError(
                "the stage's outputs do not require grad: there is no backward to measure; run a stage "
                "with parameters or inputs that require grad"
            )

    def make_cotangents(self) -> None:
        """Seeded random cotangents for the outputs (none after a loss): not part of any pass."""
        if self.loss is not None:
            return
        generator = torch.Generator().manual_seed(self.seed)
        self.grads = [
            torch.randn(tensor.shape, generator=generator).to(dtype=tensor.dtype, device=tensor.device)
            for tensor in self.outputs
        ]

    def backward_input(self) -> None:
        self.state = backward_input(self.outputs, self.grads, self.inputs)
        self.outputs, self.grads = [], None  # a pipeline drops the stage outputs after B

    def backward_weight(self) -> None:
        assert self.state is not None
        backward_weight(self.state)

    def backward_full(self) -> None:
        """One ordinary autograd backward (B and W at once), into the inputs' and parameters' ``.grad``."""
        torch.autograd.backward(self.outputs, self.grads)
        self.outputs, self.grads = [], None


class _PeakTracker(TorchDispatchMode):
    """Bytes of the storages the ops under it allocate, alive at once: the most after any op.

    Each op's newly allocated output storages (not a view of, or in place on, an argument) are registered with a weak reference (``StorageWeakRef``, as
    ``torch.multiprocessing`` keeps them); after every op the storages still alive are summed. A
    storage freed between two ops is seen as freed at the next op, so the maximum is exact at the
    moments memory grows (right after an op allocated its outputs); kernel workspaces are not seen.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[Any, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        # a view or in-place result shares an argument's storage: nothing new was allocated
        arguments = {_storage_key(tensor) for tensor in _tensors((args, kwargs or {}))}
        for tensor in _tensors(result):
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = storage.data_ptr()
            if key and key not in self.live and key not in arguments:
                self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        expired = [key for key, (reference, _) in self.live.items() if reference.expired()]
        for key in expired:
            del self.live[key]
        self.peak = max(self.peak, sum(size for _, size in self.live.values()))
        return result


def _storage_key(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _peak_bytes(function: Callable[[], Any]) -> int:
    """Most bytes of tensors ``function`` allocates alive at once (see :class:`_PeakTracker`)."""
    tracker = _PeakTracker()
    with tracker:
        function()
    return tracker.peak


def stage_costs(
    module: torch.nn.Module,
    inputs: Any,
    *,
    loss: Callable[[Any], torch.Tensor] | None = None,
    repeat: int = 10,
    warmup: int = 3,
    device: str | torch.device | None = None,
    stage_index: int = 0,
    seed: int = 0,
) -> StageCosts:
    """Measure the F, B and W of one stage, per microbatch (method in the module docstring).

    Args:
        module: the stage; used in place (moved to ``device``; its ``.grad`` are restored afterwards).
        inputs: one microbatch: a tensor, a tuple of positional or a dict of keyword arguments; tensors
            with ``requires_grad=True`` are the stage inputs B computes gradients for.
        loss: for a last stage, ``loss(outputs) -> scalar``, counted in F; the backward starts from it.
            Without it the outputs get seeded random cotangents (``seed``).
        repeat: timed microbatches (at least 1); warmup: untimed ones before them.
        device: ``"cpu"``, ``"cuda"``, ...; default: where the module's parameters are.
        stage_index: recorded in the result.

    Returns:
        A :class:`StageCosts` (seconds, FLOPs, bytes).

    Raises:
        GraphkitInputError: ``repeat < 1``, or the outputs need no grad.
        graphkit.split.backward.SplitError: as :func:`backward_input` / :func:`backward_weight`.
    """
    if repeat < 1 or warmup < 0:
        raise GraphkitInputError(
            f"repeat must be at least 1 and warmup at least 0, got {repeat} and {warmup}"
        )
    device, parameters = placed_stage(module, device)
    saved_grads = [parameter.grad for parameter in parameters]
    parameter_storages = {parameter.untyped_storage().data_ptr() for parameter in parameters}

    def not_parameters(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [tensor for tensor in tensors if tensor.untyped_storage().data_ptr() not in parameter_storages]

    def new_microbatch() -> _Microbatch:
        return _Microbatch(module, inputs, device, loss, seed)

    try:
        times: dict[str, list[float]] = {"F": [], "B": [], "W": [], "full": []}
        for _ in range(warmup + repeat):
            microbatch = new_microbatch()
            times["F"].append(timed(microbatch.forward, device)[0])
            microbatch.make_cotangents()
            times["B"].append(timed(microbatch.backward_input, device)[0])
            times["W"].append(timed(microbatch.backward_weight, device)[0])
            microbatch = new_microbatch()  # and a full backward, as 1F1B's B runs it
            microbatch.forward()
            microbatch.make_cotangents()
            times["full"].append(timed(microbatch.backward_full, device)[0])
        medians = {name: statistics.median(values[warmup:]) for name, values in times.items()}

        # FLOPs and exact bytes: one untimed microbatch
        microbatch = new_microbatch()
        flops = PhaseFlops()
        with flops.counting("forward"):
            microbatch.forward()
        # what FlopCounterMode leaves out, as graphkit inspect says it (these totals add no estimates)
        coverage = flop_coverage(capture(microbatch.outputs, details=False))
        flops_partial = bool(coverage.not_counted)
        flops_note = (
            f"partial: {len(coverage.not_counted)} node(s) not counted "
            f"({', '.join(sorted({item.op for item in coverage.not_counted}))})"
            if flops_partial
            else ""
        )
        microbatch.make_cotangents()
        activations = saved_tensors_below([tensor.grad_fn for tensor in microbatch.outputs])
        activation_bytes = distinct_bytes(not_parameters(activations))
        with flops.counting("b"):
            microbatch.backward_input()
        state = microbatch.state
        assert state is not None
        b_keeps, w_needs = memory_kept(state)
        kept_saved = distinct_bytes(
            not_parameters([*state.held_tensors(), *saved_tensors_below(state.held_nodes())])
        )
        input_grad_bytes = distinct_bytes(grad for grad in state.input_grads if grad is not None)
        with flops.counting("w"):
            microbatch.backward_weight()
        parameter_grad_bytes = distinct_bytes(p.grad for p in parameters if p.grad is not None)

        # peaks: one more untimed microbatch, a pass at a time
        microbatch = new_microbatch()
        peaks = [_peak_bytes(microbatch.forward)]
        microbatch.make_cotangents()
        peaks += [
            _peak_bytes(microbatch.backward_input),
            _peak_bytes(microbatch.backward_weight),
        ]
    finally:
        for parameter, grad in zip(parameters, saved_grads, strict=True):
            parameter.grad = grad
    return StageCosts(
        stage_index=stage_index,
        forward=PassCost(medians["F"], flops.forward, peaks[0]),
        backward_input=PassCost(medians["B"], flops.b, peaks[1]),
        backward_weight=PassCost(medians["W"], flops.w, peaks[2]),
        activation_bytes=activation_bytes,
        b_keeps_bytes=b_keeps,
        b_frees_bytes=max(activation_bytes - kept_saved, 0),
        w_needs_bytes=w_needs,
        w_frees_bytes=b_keeps,
        input_grad_bytes=input_grad_bytes,
        parameter_grad_bytes=parameter_grad_bytes,
        device=str(device),
        repeat=repeat,
        warmup=warmup,
        flops_partial=flops_partial,
        flops_note=flops_note,
        full_backward_seconds=medians["full"],
    )


def _as_args(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def pipeline_costs(
    stages: Sequence[torch.nn.Module],
    microbatch_inputs: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    target: torch.Tensor | None = None,
    *,
    repeat: int = 10,
    warmup: int = 3,
    device: str | torch.device | None = None,
) -> PipelineCosts:
    """:func:`stage_costs` of every stage of a pipeline, each on the inputs its predecessor produces.

    Args:
        stages: the stage modules in pipeline order; stage ``i + 1`` takes stage ``i``'s outputs as
            positional arguments (a tuple is spread), as ``torch.distributed.pipelining`` passes them.
        microbatch_inputs: one microbatch of the first stage's inputs (a tensor, or a tuple or dict).
        loss_fn: ``loss_fn(output, target) -> scalar`` of the last stage (counted in its F); None: the
            last stage's outputs get random cotangents like every other stage's.
        target: the loss's target for one microbatch (None is passed on as it is).
        repeat, warmup, device: as :func:`stage_costs`.

    Stage ``i + 1``'s inputs are stage ``i``'s outputs, detached, requiring grad (floating ones) as a
    received activation does.

    Raises:
        GraphkitInputError: no stages; as :func:`stage_costs`.
    """
    if not stages:
        raise GraphkitInputError("pipeline_costs needs at least one stage module")
    results = []
    inputs = microbatch_inputs
    for index, module in enumerate(stages):
        last = index == len(stages) - 1
        loss = None
        if last and loss_fn is not None:

            def loss(output: Any, loss_fn: Callable[[Any, Any], torch.Tensor] = loss_fn) -> torch.Tensor:
                return loss_fn(output, target)

        results.append(
            stage_costs(
                module, inputs, loss=loss, repeat=repeat, warmup=warmup, device=device, stage_index=index
            )
        )
        if not last:
            with torch.no_grad():
                prepared = fresh_inputs(inputs, device=torch.device(results[-1].device))
                outputs = call_stage(module, prepared)
            inputs = tuple(
                tensor.detach().requires_grad_(tensor.is_floating_point())
                if isinstance(tensor, torch.Tensor)
                else tensor
                for tensor in _as_args(outputs)
            )
    return PipelineCosts(results, METHOD.format(repeat=repeat, warmup=warmup))


def spec_costs(
    spec: str,
    *,
    pipeline: bool | None = None,
    num_stages: int | None = None,
    batch_size: int | None = None,
    microbatches: int = 1,
    repeat: int = 10,
    warmup: int = 3,
    device: str | torch.device | None = None,
) -> PipelineCosts:
    """The costs ``graphkit costs SPEC`` prints: of one stage (a model spec) or of every stage of a pipeline.

    Args:
        spec: a model spec (:func:`graphkit.models.specs.load_spec`: its module is one stage, measured on
            its inputs) or a pipeline spec (:mod:`graphkit.models.pipeline_specs`), as
            :func:`graphkit.models.pipeline_specs.load_stage_or_pipeline` tells them apart.
        pipeline: True: ``spec`` is a pipeline spec (``hf:gpt2`` and ``hf:llama`` cut into stages are ones
            only so); False: a model spec; None: decide.
        num_stages, batch_size: for a pipeline spec, as
            :func:`~graphkit.models.pipeline_specs.load_pipeline_spec` (None: the function's defaults).
        microbatches: the whole batch is split into this many along dimension 0 (as a schedule splits it)
            and the first microbatch is measured; 1: the whole batch is one microbatch.
        repeat, warmup, device: as :func:`stage_costs`.

    Raises:
        graphkit.models.specs.SpecError: the spec does not load, its batch does not split, or it is a model
            spec and ``num_stages``, ``batch_size`` or ``microbatches`` is given (they shape a pipeline).
        GraphkitInputError: as :func:`stage_costs`.
    """
    register_backends()  # compile=split in a pipeline spec names graphkit's splitting backend
    loaded = load_stage_or_pipeline(spec, pipeline=pipeline, num_stages=num_stages, batch_size=batch_size)
    if isinstance(loaded, PipelineModel):
        inputs, target = loaded.microbatch(microbatches)
        return pipeline_costs(
            loaded.stages, inputs, loaded.loss_fn, target, repeat=repeat, warmup=warmup, device=device
        )
    ignored = [
        f"{name}={value} ({flag})"
        for name, flag, value, unset in (
            ("num_stages", "--num-stages", num_stages, None),
            ("batch_size", "--batch-size", batch_size, None),
            ("microbatches", "--microbatches", microbatches, 1),
        )
        if value != unset
    ]
    if ignored:  # a model spec is one stage on its own inputs: these would be silently dropped
        hint = (
            "; to cut it into stages, pass pipeline=True (graphkit costs --pipeline)"
            if isinstance(spec, str)
            and spec.strip().partition("?")[0] in {f"hf:{arch}" for arch in PIPELINE_ARCHITECTURES}
            else ""
        )
        raise SpecError(
            f"{spec!r} is a model spec, measured as one stage on its own inputs: {', '.join(ignored)} "
            f"{'applies' if len(ignored) == 1 else 'apply'} to pipeline specs only{hint}"
        )
    module, inputs = loaded
    return PipelineCosts(
        [stage_costs(module, inputs, repeat=repeat, warmup=warmup, device=device)],
        METHOD.format(repeat=repeat, warmup=warmup),
    )
