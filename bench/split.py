"""Benchmark graphkit's split backward (B + W) against a full backward and PyTorch's own split.

    python bench/split.py [--repeat N] [--json] [--device cpu|cuda] [--threads N] [--clock wall|cpu]
                          [--only NAME ...] [--runs N]

For every model: median wall time of the full backward, B, W and B+W over repeated microbatches after
warm-up, FLOPs per phase, autograd-engine calls in W, the bytes kept alive between B and W (and that
figure over what W needs), and the saved bytes of the whole stage graph; then the same split through
``torch.distributed.pipelining._backward`` in the same run. Ratios are against the full backward
measured in the same run.

``--runs N`` measures everything in N fresh processes, one after another, and prints per model the row
of the run whose B+W ratio is the median, with the lowest and highest ratio of the N runs: on a 2-core
machine the same code differs by up to 5% between processes (where a process's memory lands decides how
cold the Nodes it walks are), more than within one run.

On a small shared CPU machine the multi-threaded figures move between runs (a full backward's
parallel kernels wait for a busy second core, a Python-heavy split waits less), so ``--threads 1``
gives the steadier ratio; both are worth reading.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from graphkit.measure.benchmark import HEADER, LEGEND, SplitBenchmark, benchmark_split, format_row
from graphkit.models import zoo


def encoder(layers: int, width: int, batch: int = 4, sequence: int = 32):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        width, 4 if width >= 16 else 2, 4 * width, dropout=0.0, batch_first=True
    )
    module = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return module, (torch.randn(batch, sequence, width, requires_grad=True),)


def linear_gelu_mlp(layers: int = 48, width: int = 64, batch: int = 128):
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*blocks), (torch.randn(batch, width, requires_grad=True),)


def hf(spec: str):
    from graphkit.models.huggingface import load_hf_spec

    return load_hf_spec(spec)


MODELS = {
    "encoder-12x64": lambda: encoder(12, 64),
    "encoder-48x16": lambda: encoder(48, 16),
    "encoder-4x512": lambda: encoder(4, 512, batch=4, sequence=128),
    "mlp-48-linear-gelu": linear_gelu_mlp,
    "gpt2-stage": lambda: hf("hf:gpt2?stage=middle&n_layer=4&n_embd=64&seq=32&batch=4"),
    "llama-stage": lambda: hf(
        "hf:llama?stage=middle&num_hidden_layers=4&hidden_size=64&intermediate_size=128&seq=32&batch=4"
    ),
    **{f"zoo:{name}": (lambda name=name: zoo.build(name)) for name in zoo.MODELS},
}

# GPT-2 small's width, 4 of its blocks, microbatches of 1 x 1024 and 8 x 1024 tokens (on a GPU: the
# first is launch-bound, where graphkit's Python shows, the second compute-bound); too slow for a 2-core CPU.
GPU_MODELS = {
    "gpt2-small-stage": lambda: hf("hf:gpt2?stage=middle&n_layer=4&n_embd=768&n_head=12&seq=512&batch=8"),
    "gpt2-small-1x1024": lambda: hf("hf:gpt2?stage=middle&n_layer=4&n_embd=768&n_head=12&seq=1024&batch=1"),
    "gpt2-small-8x1024": lambda: hf("hf:gpt2?stage=middle&n_layer=4&n_embd=768&n_head=12&seq=1024&batch=8"),
}


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
"""``--clock``: wall time, or the calling thread's CPU time (steadier on a loaded machine; CPU and
``--threads 1`` only, where the autograd engine runs on the calling thread)."""


def add_clock_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time (default), or this thread's CPU time: leaves out time other processes hold the "
        "core (a loaded machine); only with --threads 1 on the CPU",
    )


def clock_of(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> Any:
    """The timer ``--clock`` names; the CPU clock refused where it would miss work (other threads, CUDA)."""
    if arguments.clock == "cpu" and (arguments.threads != 1 or getattr(arguments, "device", "cpu") != "cpu"):
        parser.error("--clock cpu needs --threads 1 on the CPU (the work must run on the calling thread)")
    return CLOCKS[arguments.clock]


def set_threads(parser: argparse.ArgumentParser, threads: int | None) -> None:
    """Apply ``--threads`` (None: PyTorch's default); a value below 1 is a usage error."""
    if threads is not None:
        if threads < 1:
            parser.error(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)


def built_models(models: dict, only: list[str] | None) -> Iterator[tuple[str, nn.Module, Any]]:
    """``(name, module, inputs)`` for the models named in ``only`` (all when empty), in order; a model
    whose optional dependency is missing is skipped with a line on stderr."""
    for name, build in models.items():
        if only and name not in only:
            continue
        try:
            module, inputs = build()
        except ImportError as error:
            print(f"{name:24s} skipped: {error}", file=sys.stderr)
            continue
        yield name, module, inputs


def main(argv: list[str] | None = None) -> int:
    # no abbreviations: --runs is taken out of the children's arguments by its full name
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", nargs="*", help="model names to run (default: all)")
    parser.add_argument("--threads", type=int, help="intra-op CPU threads (default: PyTorch's choice)")
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="measure in this many fresh processes and print each model's median run, with the range",
    )
    add_clock_option(parser)
    arguments = parser.parse_args(argv)
    set_threads(parser, arguments.threads)
    clock = clock_of(parser, arguments)
    if arguments.runs < 1:
        parser.error(f"--runs must be at least 1, got {arguments.runs}")
    if arguments.runs > 1:
        return _median_of_runs(sys.argv[1:] if argv is None else argv, arguments)
    results = {}
    if not arguments.json:
        print(HEADER)
    models = dict(MODELS)
    if arguments.device.startswith("cuda"):
        models.update(GPU_MODELS)
    for name, module, inputs in built_models(models, arguments.only):
        result = benchmark_split(
            module,
            inputs,
            repeat=arguments.repeat,
            warmup=arguments.warmup,
            device=arguments.device,
            clock=clock,
        )
        results[name] = result.to_dict()
        if not arguments.json:
            print(format_row(name, result), flush=True)
    if arguments.json:
        print(json.dumps(results, indent=1))
    else:
        print(textwrap.fill(LEGEND, width=110))
    return 0


def _without_runs(argv: list[str]) -> list[str]:
    """``argv`` less its ``--runs`` option (``--runs N`` or ``--runs=N``)."""
    kept: list[str] = []
    skip = False
    for argument in argv:
        if skip:
            skip = False
        elif argument == "--runs":
            skip = True
        elif not argument.startswith("--runs="):
            kept.append(argument)
    return kept


def _median_of_runs(argv: list[str], arguments: argparse.Namespace) -> int:
    """Run this script ``arguments.runs`` times in fresh processes (``--json``) and print, per model, the
    run whose B+W ratio is the median (the lower middle one for an even count), with the ratios' range."""
    command = [sys.executable, __file__, *_without_runs(argv)]
    if "--json" not in command:
        command.append("--json")
    runs: dict[str, list[dict[str, Any]]] = {}
    for run in range(arguments.runs):
        # the children's standard error comes through (skipped models, errors)
        child = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        if child.returncode != 0:
            print(
                f"run {run + 1} of {arguments.runs} failed (exit status {child.returncode})", file=sys.stderr
            )
            return child.returncode
        output = child.stdout
        for name, result in json.loads(output[output.index("{") :]).items():
            runs.setdefault(name, []).append(result)
    medians = {}
    if not arguments.json:
        print(f"{HEADER}  runs: B+W lowest-highest")
    for name, results in runs.items():
        ratios = sorted(result["ratio"] for result in results)
        middle = statistics.median_low(ratios)
        chosen = next(result for result in results if result["ratio"] == middle)
        medians[name] = {**chosen, "runs": len(results), "ratio_low": ratios[0], "ratio_high": ratios[-1]}
        if not arguments.json:
            print(
                f"{format_row(name, SplitBenchmark.from_dict(chosen))}  {ratios[0]:.2f}-{ratios[-1]:.2f}x",
                flush=True,
            )
    if arguments.json:
        print(json.dumps(medians, indent=1))
    else:
        print(
            textwrap.fill(LEGEND + f"; runs: the row is the median of {arguments.runs} processes", width=110)
        )
    return 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
