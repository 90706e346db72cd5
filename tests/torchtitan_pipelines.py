"""torchtitan's llama3 ``debugmodel`` through torchtitan's own pipeline code, on CPU gloo ranks.

Shared by ``tests/test_torchtitan.py`` (gradients against a full backward of the unsplit model) and
``bench/torchtitan_pipeline.py`` (step times). Each rank builds the model as torchtitan's ``Trainer`` does
(meta device, ``to_empty``, ``init_weights``), cuts it with ``pipeline_llm`` (stage split, V placement,
``_build_pipeline_schedule``), parallelizes each part with torchtitan's own functions (``apply_compile``,
``parallelize_llama``: FSDP2 on a 1-rank mesh), sets up ``ChunkedLossWrapper`` as the trainer does, and steps
the schedule with the arguments of ``Trainer.pp_forward_backward_step``.

What only a CPU run needs lives here, not in graphkit (:func:`run_on_cpu`):

- torchtitan picks ``device_type = "cuda"`` when no accelerator is found: set to ``"cpu"``;
- FlexAttention refuses a backward on the CPU (``_validate_device``) although its eager (math) backward
  runs there: the refusal is skipped for CPU tensors, and torchtitan's inductor-compiled flex and
  block-mask functions run eagerly (inductor cannot compile flex's backward for the CPU).

torch's pipelining infers the stages' metadata with a real forward and backward in the first step, which
calls the loss once more; ``ChunkedLossWrapper`` runs the lm_head's backward inside the loss, so that first
step adds a gradient to the lm_head (with PyTorch's stage as with graphkit's). Gradients are therefore
compared on a second step, after the gradients of the first were cleared, as a trainer's second step sees
them.
"""

from __future__ import annotations

import copy
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch

SEQ_LEN = 64
VOCAB = 2048
UNSPLIT_REGION = "runs its whole backward once"  # graphkit's warning for a compiled region it cannot split


@dataclass(frozen=True, slots=True)
class TitanCase:
    """One pipeline of torchtitan's debugmodel.

    ``attention``: ``"flex"`` (torchtitan's default) or ``"sdpa"``; ``compile``: None (eager), a backend
    name that torchtitan's ``apply_compile`` compiles every block with in place (``block.compile()``), or
    ``"wrapper:<backend>"`` (each block replaced by the ``OptimizedModule`` ``torch.compile`` returns);
    ``fsdp``: parallelize each part with torchtitan's ``parallelize_llama`` (FSDP2 on a 1-rank mesh);
    ``stage``: ``"graphkit"`` (``graphkit.integrations.torchtitan.install()``) or ``"torch"``.
    """

    attention: str = "flex"
    compile: str | None = None
    fsdp: bool = False
    schedule: str = "ZBVZeroBubble"
    microbatches: int = 4
    stage: str = "graphkit"

    @property
    def name(self) -> str:
        parts = [self.schedule, self.attention, self.compile or "eager"]
        if self.fsdp:
            parts.append("fsdp")
        if self.stage != "graphkit":
            parts.append(f"{self.stage} stage")
        return " ".join(parts)


def run_on_cpu() -> None:
    """The CPU bypasses of the module docstring (idempotent)."""
    import torch.nn.attention.flex_attention as flex_module
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    import torchtitan.models.common.attention as attention_module
    import torchtitan.tools.utils as utils_module

    utils_module.device_type = "cpu"
    parallel_dims_module.device_type = "cpu"
    attention_module.FlexAttention._compiled_flex_attn = flex_module.flex_attention
    attention_module._compiled_create_block_mask = flex_module.create_block_mask
    check = flex_module._validate_device
    if not getattr(check, "allows_cpu_backward", False):

        def validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
            if query.device.type != "cpu":
                check(query, key, value)

        validate_device.allows_cpu_backward = True  # type: ignore[attr-defined]
        flex_module._validate_device = validate_device


@dataclass(slots=True)
class TitanPipeline:
    """What :func:`build_pipeline` returns on one rank."""

    case: TitanCase
    schedule: Any
    parts: list[torch.nn.Module]
    has_first: bool
    has_last: bool
    reference: torch.nn.Module
    model_config: Any
    loss_config: Any


def _model_config(attention: str) -> tuple[Any, Any]:
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    spec = model_registry("debugmodel", attn_backend="flex")
    config = spec.model
    if attention == "sdpa":  # torchtitan 0.3.0 builds language models with SDPA only by hand
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    elif attention != "flex":
        raise ValueError(f"attention={attention!r}: flex or sdpa")
    return spec, config


def _parallelize(case: TitanCase, compile_config: Any, parallel_dims: Any) -> Any:
    from torchtitan.distributed.compile import apply_compile
    from torchtitan.models.llama3 import parallelize_llama

    if case.fsdp:
        return parallelize_llama
    if case.compile is None:
        return lambda model, **_: model
    if case.compile.startswith("wrapper:"):
        backend = case.compile.removeprefix("wrapper:")

        def wrap_blocks(model: torch.nn.Module, **_: Any) -> torch.nn.Module:
            for name, block in list(model.layers.named_children()):
                model.layers[name] = torch.compile(block, backend=backend, fullgraph=True)
            return model

        return wrap_blocks

    def compile_blocks(model: torch.nn.Module, **_: Any) -> torch.nn.Module:
        apply_compile(model, compile_config=compile_config, parallel_dims=parallel_dims)
        return model

    return compile_blocks


def build_pipeline(case: TitanCase, seed: int = 0) -> TitanPipeline:
    """Build this rank's part of ``case`` with torchtitan's code (module docstring); a 2-rank group exists."""
    import torch.distributed as dist

    run_on_cpu()
    from graphkit.integrations import torchtitan as graphkit_torchtitan

    if case.stage == "graphkit":
        graphkit_torchtitan.install()
    else:
        graphkit_torchtitan.uninstall()
    import torchtitan.distributed.pipeline_parallel as pipeline_module
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.common.config_utils import decoder_vocab_size

    torch._dynamo.reset()
    spec, config = _model_config(case.attention)
    world = dist.get_world_size()
    training = TrainingConfig(  # FSDP2's mixed precision in float32: the oracle is a float32 full backward
        local_batch_size=case.microbatches,
        seq_len=SEQ_LEN,
        steps=1,
        mixed_precision_param="float32",
        mixed_precision_reduce="float32",
    )
    parallelism = ParallelismConfig(
        pipeline_parallel_degree=world,
        pipeline_parallel_schedule=case.schedule,
        pipeline_parallel_microbatch_size=1,
        spmd_backend="partial_dtensor",
    )
    backend = case.compile if case.compile and not case.compile.startswith("wrapper:") else None
    compile_config = CompileConfig(
        enable=backend is not None, backend=backend or "inductor", components=["model"]
    )
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    reference = copy.deepcopy(model)
    parallel_dims = ParallelDims(
        dp_replicate=1,
        dp_shard=1,
        cp=1,
        tp=1,
        pp=world,
        ep=1,
        world_size=world,
        spmd_backend="partial_dtensor",
    )
    parallel_dims.build_mesh()
    loss_config = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))
    )
    loss_fn = loss_config.build(compile_config=CompileConfig())
    with tempfile.TemporaryDirectory() as dump_folder:
        schedule, parts, has_first, has_last = pipeline_module.pipeline_llm(
            model,
            parallel_dims=parallel_dims,
            training=training,
            parallelism=parallelism,
            compile_config=compile_config,
            ac_config=None,
            dump_folder=dump_folder,
            device=torch.device("cpu"),
            model_config=config,
            parallelize_fn=_parallelize(case, compile_config, parallel_dims),
            loss_fn=loss_fn,
        )
    if has_last:  # as Trainer.__init__ does
        loss_fn.set_lm_head(parts[-1].lm_head)
        parts[-1]._skip_lm_head = True
    for part in parts:
        part.train()
    return TitanPipeline(case, schedule, parts, has_first, has_last, reference, config, loss_config)


def batch(pipeline: TitanPipeline, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``(inputs, labels, extra keyword arguments)`` of one step, as ``Trainer.post_dataloading_process`` makes
    them (positions, and FlexAttention's document-causal block mask built by the model)."""
    case = pipeline.case
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (case.microbatches, SEQ_LEN + 1), generator=generator)
    positions = torch.arange(SEQ_LEN).unsqueeze(0)
    extra: dict[str, Any] = {"positions": positions}
    if case.attention == "flex":
        extra["attention_masks"] = pipeline.reference.get_attention_masks(positions=positions)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), extra


def step(pipeline: TitanPipeline, inputs: torch.Tensor, labels: torch.Tensor, extra: dict[str, Any]) -> None:
    """One ``schedule.step`` with the arguments of ``Trainer.pp_forward_backward_step``."""
    microbatches = pipeline.case.microbatches
    global_valid_tokens = torch.tensor(float(labels.numel()))
    pipeline.schedule.step(
        arg_mbs=[(inputs[index : index + 1],) for index in range(microbatches)]
        if pipeline.has_first
        else None,
        kwarg_mbs=[dict(extra) for _ in range(microbatches)],
        target_mbs=[labels[index : index + 1] for index in range(microbatches)]
        if pipeline.has_last
        else None,
        losses=[] if pipeline.has_last else None,
        loss_kwargs={"global_valid_tokens": global_valid_tokens},
        return_outputs=False,
    )


def _clear_gradients(parts: list[torch.nn.Module]) -> None:
    for part in parts:
        for parameter in part.parameters():
            parameter.grad = None


def _full_gradients(
    pipeline: TitanPipeline, inputs: torch.Tensor, labels: torch.Tensor, extra: dict[str, Any]
):
    """The oracle: one full backward per microbatch of the unsplit, uncompiled model, the same loss."""
    reference = pipeline.reference
    loss_fn = pipeline.loss_config.build()
    loss_fn.set_lm_head(reference.lm_head)
    reference._skip_lm_head = True
    global_valid_tokens = torch.tensor(float(labels.numel()))
    for index in range(pipeline.case.microbatches):
        hidden = reference(inputs[index : index + 1], **extra)
        loss, _ = loss_fn(hidden, labels[index : index + 1], global_valid_tokens=global_valid_tokens)
        loss.backward()
    return {name: parameter.grad for name, parameter in reference.named_parameters()}


def _local(grad: torch.Tensor | None) -> torch.Tensor | None:
    return grad.full_tensor() if grad is not None and hasattr(grad, "full_tensor") else grad


def gradient_check_rank(cases: list[TitanCase]) -> list[dict[str, Any]]:
    """For each case on this rank: the largest relative gradient error against a full backward, the
    parameters without a gradient, graphkit's B/W/full counts and the unsplit-region warnings."""
    import torch.distributed as dist

    results = []
    for case in cases:
        dist.barrier()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pipeline = build_pipeline(case)
            inputs, labels, extra = batch(pipeline)
            step(pipeline, inputs, labels, extra)  # the first step also infers metadata (module docstring)
            _clear_gradients(pipeline.parts)
            step(pipeline, inputs, labels, extra)
        expected = _full_gradients(pipeline, inputs, labels, extra)
        worst, worst_name, missing = 0.0, "", []
        for part in pipeline.parts:
            for name, parameter in part.named_parameters():
                name = name.replace("_orig_mod.", "").replace("._checkpoint_wrapped_module", "")
                grad, want = _local(parameter.grad), expected[name]
                if grad is None:
                    missing.append(name)
                    continue
                error = float((grad - want).abs().max() / want.abs().max().clamp_min(1e-30))
                if error > worst or error != error:
                    worst, worst_name = error, name
        calls = [getattr(stage, "backward_calls", None) for stage in pipeline.schedule._stages]
        results.append(
            {
                "case": case.name,
                "max_relative_error": worst,
                "worst_parameter": worst_name,
                "missing": missing,
                "input": sum(call.input for call in calls if call is not None),
                "weight": sum(call.weight for call in calls if call is not None),
                "unsplit_regions": sorted(
                    {str(w.message) for w in caught if UNSPLIT_REGION in str(w.message)}
                ),
            }
        )
    return results


def step_times_rank(cases: list[TitanCase], rounds: int, warmup: int = 2) -> list[list[float]]:
    """Step times (seconds) of each case on this rank, interleaved: ``rounds`` rounds, each one step of
    every case in turn, in the orders of a design balanced for position and predecessor (``balanced_order``), after ``warmup``
    untimed steps of each (compilation, metadata inference)."""
    import torch.distributed as dist

    from graphkit.measure.paired_rounds import balanced_order

    pipelines = [build_pipeline(case) for case in cases]
    batches = [batch(pipeline) for pipeline in pipelines]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for pipeline, arguments in zip(pipelines, batches, strict=True):
            for _ in range(warmup):
                step(pipeline, *arguments)
                _clear_gradients(pipeline.parts)
        times: list[list[float]] = [[] for _ in cases]
        for round_index in range(rounds):
            for index in balanced_order(round_index, len(cases)):  # each case in every position alike
                pipeline, arguments = pipelines[index], batches[index]
                dist.barrier()
                start = time.perf_counter()
                step(pipeline, *arguments)
                dist.barrier()
                times[index].append(time.perf_counter() - start)
                _clear_gradients(pipeline.parts)
    return times


def debugmodel_pipeline(num_stages: int = 4, batch_size: int = 8) -> Any:
    """torchtitan's llama3 debugmodel as a graphkit pipeline spec (``tests/torchtitan_pipelines.py:debugmodel_pipeline``).

    The stage modules are torchtitan's own cut (``_generate_llm_fqn_per_model_part`` and ``_split_module``,
    as ``pipeline_llm`` makes them), with SDPA attention (no mask to pass between stages) and the last stage
    ending with the lm_head; the loss is the cross entropy of its logits (``ChunkedLossWrapper`` runs a
    backward inside the loss, which graphkit's cost measurement cannot split). For ``graphkit plan``,
    ``costs``, ``verify-pipeline``, ``timeline`` and ``compare-schedules`` on the same stages as the bench.
    """
    import torch.nn.functional as functional
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _split_module

    from graphkit.models.pipeline_specs import PipelineModel

    run_on_cpu()
    _, config = _model_config("sdpa")
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    names = _generate_llm_fqn_per_model_part(num_stages, len(model.layers), 1, 1)
    stages = [_split_module(model, part) for part in names]
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1))

    def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    return PipelineModel(stages, cross_entropy, (tokens[:, :-1].contiguous(),), tokens[:, 1:].contiguous())
