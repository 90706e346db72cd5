"""``graphkit verify`` and ``graphkit bench``: the split backward (B then W) of a spec against a full one,
for equal gradients and for time."""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from graphkit.cli.options import (
    add_dtype_option,
    add_json_option,
    add_model_device_option,
    add_model_spec,
    add_threads_option,
    dtype_of,
)

__all__ = ["add_bench_command", "add_verify_command"]


# --- verify ------------------------------------------------------------------------------------------------
def add_verify_command(commands: Any) -> None:
    verify = commands.add_parser(
        "verify", help="check split (B then W) against a full backward; exit 1 if not equal"
    )
    add_model_spec(verify)
    add_dtype_option(verify)
    add_model_device_option(verify)
    verify.add_argument("--seed", type=int, default=0, help="seed of the random cotangents (default 0)")
    verify.add_argument(
        "--autocast", choices=["bfloat16", "float16"], help="run the forward under torch.autocast"
    )
    verify.add_argument(
        "--recompute",
        choices=["in-w", "keep-from-b"],
        default="in-w",
        help="when W gets the saved tensors of activation checkpoints: recompute them (default) or keep B's",
    )
    add_json_option(verify)
    verify.set_defaults(run=run_verify)


def run_verify(arguments: argparse.Namespace) -> int:
    from graphkit.measure.verification import verify_split
    from graphkit.models.specs import load_spec

    if arguments.device is not None and torch.device(arguments.device).type == "meta":
        raise ValueError(
            "verify compares gradient values, and tensors on the meta device have shapes but no values: "
            "run it on cpu or cuda. 'graphkit inspect SPEC --device meta' shows the graph, groups and FLOPs"
        )

    module, inputs = load_spec(arguments.spec)
    report = verify_split(
        module,
        inputs,
        dtype=dtype_of(arguments.dtype),
        device=arguments.device,
        seed=arguments.seed,
        autocast_dtype=dtype_of(arguments.autocast),
        recompute=arguments.recompute,
    )
    if arguments.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report.table())
    return 0 if report.ok else 1


# --- bench -------------------------------------------------------------------------------------------------
def add_bench_command(commands: Any) -> None:
    bench = commands.add_parser("bench", help="time full backward against B and W")
    add_model_spec(bench)
    bench.add_argument("--repeat", type=int, default=10, help="timed microbatches (medians; default 10)")
    add_threads_option(
        bench, default=None, help="intra-op CPU threads (default: PyTorch's; 1 gives steadier ratios)"
    )
    add_json_option(bench, help="print JSON (every field of the benchmark)")
    bench.set_defaults(run=run_bench)


def run_bench(arguments: argparse.Namespace) -> int:
    from graphkit.measure.benchmark import bench_spec

    return bench_spec(
        arguments.spec, repeat=arguments.repeat, as_json=arguments.json, threads=arguments.threads
    )
