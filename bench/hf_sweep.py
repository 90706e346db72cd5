"""Run ``graphkit verify`` on every Hugging Face ``transformers`` family that builds from a small config.

    .venv/bin/python bench/hf_sweep.py [--only TYPE,TYPE ...] [--tasks TASK,...] [--attention eager|sdpa]
                                       [--checkpoint] [--timeout S] [--limit N] [--json FILE]

Each family (a ``model_type`` of the installed ``transformers``) is built once, with the head of the first task
below that it has, from its config class with small sizes (2 layers, width 32, 4 heads, 4 experts: whatever
of these fields the config has), random weights, in float64 and in training mode (dropout and SpecAugment
draw random numbers, as in training):

==================  ===================================================  ==================================
task                inputs                                                input that requires grad
==================  ===================================================  ==================================
ctc                 ``input_values`` (2, 16000), ``labels``               ``input_values``
zero-shot-image     ``input_ids``, ``pixel_values``, ``return_loss``      ``pixel_values``
image-classify      ``pixel_values`` (2, channels, size, size), labels   ``pixel_values``
speech-seq2seq      ``input_features``, ``labels``                       ``input_features``
seq2seq-lm          ``inputs_embeds`` or ``input_ids``, ``labels``       ``inputs_embeds``
masked-lm           ``inputs_embeds`` or ``input_ids``, ``labels``       ``inputs_embeds``
causal-lm           ``inputs_embeds`` or ``input_ids``, ``labels``       ``inputs_embeds``
==================  ===================================================  ==================================

The whole model runs up to its loss (the stage's one output). When the model refuses the input that requires
grad (no ``inputs_embeds``; Wav2Vec2 sets ``requires_grad`` on a view of ``input_values``, which PyTorch
allows on a leaf only), it runs from inputs without grad (a first pipeline stage). A plain forward and
backward runs first: a family whose model raises there (a config the small sizes break, inputs this script
does not know how to make) is ``skipped`` with the model's error, since graphkit never ran. Then
:func:`graphkit.verify_split` compares B + W with a full backward. The outcome per family:

- ``exact``: every gradient matches within float64's tolerance (``max rel`` gives the largest relative
  difference; 0 is bit for bit);
- ``NOT EXACT``: a gradient differs (the names are listed): a wrong split;
- ``refused``: graphkit refused it with a one-line error (the reason is printed);
- ``ERROR``: graphkit raised something else - a bug in graphkit, printed with its traceback;
- ``skipped``: the family does not build from the small config, or its model raised before graphkit ran;
- ``timeout``: building, the plain run and verify together took longer than ``--timeout``.

Each family runs in a process forked for it (``--in-process`` runs them all in this one: a few hundred
models leave enough memory behind to exhaust a 24 GB machine). ``--only`` picks families by ``model_type`` (``gpt2,llama,wav2vec2``); ``--tasks`` the tasks; ``--limit``
stops after N families; ``--timeout`` (default 120 s) gives up on a family after that long. The exit status
is 1 when a family is ``NOT EXACT`` or ``ERROR``, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import multiprocessing
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

BATCH = 2
SEQUENCE = 8
AUDIO_SAMPLES = 16000

SMALL = {
    # depth
    "num_hidden_layers": 2,
    "num_layers": 2,
    "n_layer": 2,
    "n_layers": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "num_decoder_layers": 2,
    "num_encoder_layers": 2,
    # width
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "dim": 32,
    "embed_dim": 32,
    "intermediate_size": 64,
    "d_ff": 64,
    "ffn_dim": 64,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "n_inner": 64,
    "hidden_dim": 64,
    # attention
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rotary_dim": 4,
    "d_kv": 8,
    # mixtures of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    # DeepSeek's latent attention
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
    # convolutional audio front ends (Wav2Vec2 and its kin)
    "conv_dim": [16] * 7,
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
    "tdnn_dim": [16] * 5,
    "xvector_output_dim": 16,
    "classifier_proj_size": 16,
    # images
    "image_size": 32,
    "patch_size": 4,
    # speech sequence to sequence (Whisper)
    "max_source_positions": 16,
    "num_mel_bins": 16,
}
"""Small sizes, given to a config only for the fields it has."""

PER_TYPE: dict[str, dict[str, Any]] = {
    "mamba2": {"num_heads": 8, "head_dim": 8, "n_groups": 1, "expand": 2, "state_size": 8, "chunk_size": 8},
    "swin": {"embed_dim": 24, "depths": [1, 1], "num_heads": [3, 6], "window_size": 4, "image_size": 32},
    "convnext": {"hidden_sizes": [16, 32], "depths": [1, 1], "num_stages": 2},
}
"""Sizes for the families whose fields depend on each other in ways :data:`SMALL` does not keep."""


@dataclass(frozen=True, slots=True)
class Task:
    """A head ``transformers`` registers per family (``mapping``), and how to make its inputs."""

    name: str
    mapping: str
    make_inputs: Callable[[Any, nn.Module, bool], dict[str, Any]]


@dataclass(slots=True)
class Outcome:
    """What happened to one family: ``status`` exact | NOT EXACT | refused | ERROR | skipped | timeout."""

    model_type: str
    task: str
    model_class: str
    status: str
    input_with_grad: str = "-"
    max_rel_err: float | None = None
    gradients: int = 0
    seconds: float = 0.0
    detail: str = ""


def _token_ids(
    config: Any, generator: torch.Generator, shape: tuple[int, ...] = (BATCH, SEQUENCE)
) -> torch.Tensor:
    vocabulary = getattr(config, "vocab_size", None) or 100
    return torch.randint(3, min(vocabulary, 100), shape, generator=generator)


def _embedded(model: nn.Module, ids: torch.Tensor, with_grad: bool) -> dict[str, Any]:
    """``inputs_embeds`` requiring grad (from the model's own embedding) when ``with_grad``, else ``input_ids``."""
    if not with_grad:
        return {"input_ids": ids}
    with torch.no_grad():
        embedded = model.get_input_embeddings()(ids)
    return {"inputs_embeds": embedded.detach().clone().requires_grad_()}


def _language_inputs(config: Any, model: nn.Module, with_grad: bool) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    ids = _token_ids(config, generator)
    inputs = {**_embedded(model, ids, with_grad), "labels": _token_ids(config, generator)}
    if "use_cache" in inspect.signature(model.forward).parameters:
        inputs["use_cache"] = False  # a training step keeps no cache (hybrid models' caches refuse a loss)
    return inputs


def _ctc_inputs(config: Any, model: nn.Module, with_grad: bool) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    values = torch.randn(BATCH, AUDIO_SAMPLES, generator=generator, dtype=torch.float64)
    labels = _token_ids(config, generator, (BATCH, 4))
    return {"input_values": values.requires_grad_(with_grad), "labels": labels}


def _image_size(config: Any) -> int:
    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", 32)
    return size[0] if isinstance(size, (list, tuple)) else int(size)


def _pixels(config: Any, generator: torch.Generator, with_grad: bool) -> torch.Tensor:
    vision = getattr(config, "vision_config", None) or config
    channels = getattr(vision, "num_channels", 3)
    size = _image_size(config)
    pixels = torch.randn(BATCH, channels, size, size, generator=generator, dtype=torch.float64)
    return pixels.requires_grad_(with_grad)


def _image_inputs(config: Any, model: nn.Module, with_grad: bool) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, config.num_labels, (BATCH,), generator=generator)
    return {"pixel_values": _pixels(config, generator, with_grad), "labels": labels}


def _zero_shot_image_inputs(config: Any, model: nn.Module, with_grad: bool) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    text = getattr(config, "text_config", config)
    return {
        "input_ids": _token_ids(text, generator),
        "pixel_values": _pixels(config, generator, with_grad),
        "return_loss": True,
    }


def _speech_inputs(config: Any, model: nn.Module, with_grad: bool) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    frames = 2 * config.max_source_positions
    features = torch.randn(BATCH, config.num_mel_bins, frames, generator=generator, dtype=torch.float64)
    return {"input_features": features.requires_grad_(with_grad), "labels": _token_ids(config, generator)}


TASKS = (
    Task("ctc", "MODEL_FOR_CTC_MAPPING_NAMES", _ctc_inputs),
    Task(
        "zero-shot-image", "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES", _zero_shot_image_inputs
    ),
    Task("image-classify", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", _image_inputs),
    Task("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", _speech_inputs),
    Task("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", _language_inputs),
    Task("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", _language_inputs),
    Task("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", _language_inputs),
)
"""In order of preference: a family is swept once, with the first task it has."""


class LossOf(nn.Module):
    """The whole ``transformers`` model up to its loss: ``forward(**inputs)`` returns ``model(**inputs).loss``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: Any) -> torch.Tensor:
        return self.model(**inputs).loss


def families(tasks: tuple[Task, ...] = TASKS) -> list[tuple[str, Task, str]]:
    """``(model_type, task, model class name)`` for each family of the installed ``transformers``, once."""
    from transformers.models.auto import modeling_auto

    seen: dict[str, tuple[str, Task, str]] = {}
    for task in tasks:
        for model_type, class_name in getattr(modeling_auto, task.mapping).items():
            if isinstance(class_name, (tuple, list)):
                class_name = class_name[0]
            seen.setdefault(model_type, (model_type, task, class_name))
    return sorted(seen.values(), key=lambda entry: entry[0])


def small_config(model_type: str, attention: str = "eager") -> Any:
    """The family's config with the fields of :data:`SMALL` (and :data:`PER_TYPE`) it has, sub-configs too;
    attention as ``attention`` says, mixtures of experts looping over their experts (``eager``: the grouped
    matrix products of the default refuse float64)."""
    from transformers import AutoConfig, PretrainedConfig

    default = AutoConfig.for_model(model_type)

    def sizes(config: Any, own: dict[str, Any]) -> dict[str, Any]:
        chosen = {key: value for key, value in SMALL.items() if _has_field(config, key)}
        if isinstance(getattr(config, "conv_dim", None), (list, tuple)):
            chosen["conv_dim"] = [16] * len(config.conv_dim)
        if "head_dim" in chosen and getattr(config, "head_dim", None) is None:
            del chosen["head_dim"]  # derived from width and heads
        if chosen.get("num_key_value_heads") and getattr(config, "num_key_value_heads", None) == getattr(
            config, "num_attention_heads", None
        ):
            chosen["num_key_value_heads"] = chosen.get(
                "num_attention_heads", 4
            )  # multi-head stays multi-head
        aliases = getattr(config, "attribute_map", {})
        for key in [key for key in chosen if aliases.get(key) in own]:
            del chosen[key]  # Swin's num_attention_heads is its num_heads: the family's own sizes win
        chosen.update(own)
        for key, value in vars(config).items():  # CLIP's text_config, vision_config
            if isinstance(value, PretrainedConfig):
                chosen[key] = sizes(value, {}) | {"model_type": value.model_type}
        return chosen

    overrides = sizes(default, PER_TYPE.get(model_type, {}))
    nested = {key: value for key, value in overrides.items() if isinstance(value, dict)}
    for key, value in nested.items():
        sub_type = value.pop("model_type")
        overrides[key] = AutoConfig.for_model(sub_type, **value).to_dict()
    implementations = {"attn_implementation": attention, "experts_implementation": "eager"}
    return AutoConfig.for_model(model_type, **overrides, **implementations)


def _has_field(config: Any, key: str) -> bool:
    return key in vars(config) or key in getattr(config, "attribute_map", {})


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in this thread when the block runs past ``seconds`` (SIGALRM; main thread only)."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"gave up after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def _refused(error: BaseException) -> bool:
    """graphkit's one-line refusals, as ``graphkit verify`` tells them (``graphkit.cli``)."""
    from graphkit.cli import _refused as refused_by_the_command

    return isinstance(error, Exception) and refused_by_the_command(error)


def build(model_type: str, task: Task, class_name: str, attention: str, checkpoint: bool) -> nn.Module:
    """The family's model for ``task``, small, float64, in training mode."""
    import transformers

    config = small_config(model_type, attention)
    if (
        task.name in ("seq2seq-lm", "speech-seq2seq")
        and getattr(config, "decoder_start_token_id", None) is None
    ):
        config.decoder_start_token_id = (
            getattr(config, "pad_token_id", None) or 0
        )  # labels shift right from it
    if getattr(config, "pad_token_id", 0) is None and task.name in ("seq2seq-lm", "speech-seq2seq"):
        config.pad_token_id = 0
    model = getattr(transformers, class_name)(config)
    if checkpoint and getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.double().train()


def _plain_run(stage: nn.Module, inputs: dict[str, Any]) -> None:
    """A forward and a full backward, outside graphkit; the gradients are cleared after."""
    stage(**inputs).backward()
    stage.zero_grad(set_to_none=True)


def sweep_one(
    model_type: str,
    task: Task,
    class_name: str,
    attention: str = "eager",
    checkpoint: bool = False,
    timeout: float = 120.0,
) -> Outcome:
    """Build one family and verify it (see the module docstring for the outcomes)."""
    from graphkit.measure.verification import verify_split
    from graphkit.models.specs import model_frame

    outcome = Outcome(model_type, task.name, class_name, "skipped")
    start = time.perf_counter()
    try:
        with time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            try:
                stage = LossOf(build(model_type, task, class_name, attention, checkpoint))
            except Exception as error:  # noqa: BLE001 - the family does not build from the small config
                outcome.detail = f"does not build small: {_first_line(error)}"
                return outcome
            inputs = None
            reasons = []
            for with_grad in (True, False):
                try:
                    candidate = task.make_inputs(stage.model.config, stage.model, with_grad)
                    _plain_run(stage, candidate)
                except Exception as error:  # noqa: BLE001 - the model's own error, graphkit never ran
                    reasons.append(_first_line(error))
                    continue
                inputs = candidate
                outcome.input_with_grad = next(
                    (
                        name
                        for name, value in candidate.items()
                        if torch.is_tensor(value) and value.requires_grad
                    ),
                    "none",
                )
                break
            if inputs is None:
                outcome.detail = f"the model raised in a plain forward and backward: {reasons[-1]}"
                return outcome
            try:
                report = verify_split(stage, inputs)
            except TimeoutError:
                raise
            except Exception as error:  # noqa: BLE001 - sorted below
                if _refused(error) or model_frame(error) is not None:
                    outcome.status = "refused"
                    outcome.detail = _first_line(error)
                else:
                    outcome.status = "ERROR"
                    outcome.detail = "".join(traceback.format_exception(error))
                return outcome
    except TimeoutError as error:
        outcome.status = "timeout"
        outcome.detail = str(error)
        return outcome
    finally:
        outcome.seconds = time.perf_counter() - start
    checks = [*report.inputs, *report.params]
    outcome.gradients = len(checks)
    outcome.max_rel_err = max((check.max_rel_err or 0.0 for check in checks), default=0.0)
    if report.ok:
        outcome.status = "exact"
    else:
        outcome.status = "NOT EXACT"
        outcome.detail = "differ: " + ", ".join(check.name for check in report.failures[:6])
    return outcome


def sweep_in_child(
    model_type: str, task: Task, class_name: str, attention: str, checkpoint: bool, timeout: float
) -> Outcome:
    """:func:`sweep_one` in a process forked from this one, which ends with the family: what a model leaves
    behind (caches, fragmented memory) goes with it, and a family that exhausts memory is killed alone."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def run() -> None:
        sender.send(sweep_one(model_type, task, class_name, attention, checkpoint, timeout))

    process = context.Process(target=run, daemon=True)
    process.start()
    sender.close()
    try:
        if receiver.poll(timeout + 60):
            return receiver.recv()
        return Outcome(
            model_type, task.name, class_name, "timeout", detail=f"no answer after {timeout + 60:g} s"
        )
    except EOFError:
        return Outcome(
            model_type,
            task.name,
            class_name,
            "skipped",
            detail=f"its process ended without an answer (exit code {process.exitcode}; out of memory?)",
        )
    finally:
        receiver.close()
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()


def table(outcomes: list[Outcome]) -> str:
    """The outcomes as a plain-text table, then the counts per status."""
    rows = [("family", "task", "status", "grad input", "grads", "max rel", "s", "detail")]
    for item in outcomes:
        rows.append(
            (
                item.model_type,
                item.task,
                item.status,
                item.input_with_grad,
                str(item.gradients or "-"),
                "-" if item.max_rel_err is None else f"{item.max_rel_err:.1e}",
                f"{item.seconds:.1f}",
                item.detail.splitlines()[0][:150] if item.detail else "",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    counts: dict[str, int] = {}
    for item in outcomes:
        counts[item.status] = counts.get(item.status, 0) + 1
    lines.append(", ".join(f"{status}: {count}" for status, count in sorted(counts.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated model types (default: every family)")
    parser.add_argument("--tasks", default="", help="comma-separated tasks (default: all)")
    parser.add_argument("--attention", default="eager", help="attn_implementation (eager, sdpa)")
    parser.add_argument("--checkpoint", action="store_true", help="non-reentrant activation checkpointing")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per family (default 120)")
    parser.add_argument("--limit", type=int, default=None, help="stop after N families")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the outcomes as JSON")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every family in this process (default: one forked each)",
    )
    arguments = parser.parse_args(argv)
    torch.set_num_threads(arguments.threads)
    tasks = tuple(task for task in TASKS if not arguments.tasks or task.name in arguments.tasks.split(","))
    chosen = families(tasks)
    if arguments.only:
        wanted = set(arguments.only.split(","))
        chosen = [entry for entry in chosen if entry[0] in wanted]
    chosen = chosen[: arguments.limit]
    outcomes = []
    for model_type, task, class_name in chosen:
        run = sweep_one if arguments.in_process else sweep_in_child
        outcome = run(
            model_type, task, class_name, arguments.attention, arguments.checkpoint, arguments.timeout
        )
        outcomes.append(outcome)
        print(
            f"{model_type:28} {task.name:16} {outcome.status:9} {outcome.seconds:6.1f}s "
            f"{(outcome.detail.splitlines() or [''])[0][:120]}",
            flush=True,
        )
        if outcome.status == "ERROR":
            print(outcome.detail, file=sys.stderr, flush=True)
    print()
    print(table(outcomes))
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump([dataclasses.asdict(item) for item in outcomes], file, indent=1)
    return 1 if any(item.status in ("NOT EXACT", "ERROR") for item in outcomes) else 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    sys.exit(main())
