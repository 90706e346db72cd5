"""What the allocator does to one stage's backward: glibc's defaults against graphkit's tuned malloc.

Each round starts fresh processes, one with ``GRAPHKIT_ALLOCATOR=default``, one tuned and one per
``--preload LIBRARY`` (jemalloc, TCMalloc: ``LD_PRELOAD``), in an order that rotates from round to round,
each timing the same stage (``zoo-pipeline:mlp_wide``'s stage 1 by default,
8 rows per microbatch, one thread): the full backward, graphkit's B and W
(:func:`graphkit.measure.benchmark.benchmark_split`, medians of ``--repeat`` microbatches, each on a fresh
forward, timed with the thread's CPU time), and the minor page faults per microbatch. It prints both sides
per round, then the median over rounds of each and of the per-round ratio to glibc's defaults, with the
load::

    .venv/bin/python bench/allocator.py --rounds 7 --preload /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from graphkit.measure.allocator import ALLOCATOR_VARIABLE, current_allocator, tune_allocator
from graphkit.measure.benchmark import benchmark_split
from graphkit.measure.timing import load_average
from graphkit.models.pipeline_specs import load_pipeline_spec

SIDES = ("default", "tuned")
FIGURES = ("full_ms", "b_ms", "w_ms", "split_over_full", "faults")


def measure(spec: str, stage: int, num_stages: int, rows: int, repeat: int, warmup: int) -> dict:
    """One process's figures for ``spec``'s ``stage`` under the allocator it runs under."""
    torch.set_num_threads(1)
    pipeline = load_pipeline_spec(spec, num_stages=num_stages, batch_size=rows, seed=0)
    module = pipeline.stages[stage]
    width = pipeline.inputs[0].shape[-1]
    features = torch.randn(rows, width, requires_grad=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    result = benchmark_split(
        module, (features,), repeat=repeat, warmup=warmup, compare_pytorch=False, clock=time.thread_time
    )
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return {
        "allocator": str(current_allocator()),
        "full_ms": 1e3 * result.full_s,
        "b_ms": 1e3 * result.b_s,
        "w_ms": 1e3 * result.w_s,
        "split_over_full": (result.b_s + result.w_s) / result.full_s,
        "faults": faults / (warmup + repeat),  # per microbatch: two forwards, a full backward, B and W
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", default="zoo-pipeline:mlp_wide", help="a pipeline spec (default mlp_wide)")
    parser.add_argument("--stage", type=int, default=1, help="the stage measured (default 1)")
    parser.add_argument("--num-stages", type=int, default=4, help="stages the spec is cut into (default 4)")
    parser.add_argument("--rows", type=int, default=8, help="rows per microbatch (default 8)")
    parser.add_argument(
        "--rounds", type=int, default=7, help="rounds of one process per allocator (default 7)"
    )
    parser.add_argument("--repeat", type=int, default=30, help="timed microbatches per process (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed microbatches first (default 5)")
    parser.add_argument(
        "--preload",
        action="append",
        default=[],
        metavar="LIBRARY",
        help="also measure under this allocator, preloaded (e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.child:
        tune_allocator()  # as its GRAPHKIT_ALLOCATOR says
        figures = measure(
            arguments.spec,
            arguments.stage,
            arguments.num_stages,
            arguments.rows,
            arguments.repeat,
            arguments.warmup,
        )
        print(json.dumps(figures))
        return 0
    sides = {"default": {ALLOCATOR_VARIABLE: "default"}, "tuned": {ALLOCATOR_VARIABLE: "tuned"}}
    for library in arguments.preload:
        name = (
            Path(library).name.split(".so")[0].removeprefix("lib").split("_")[0]
        )  # tcmalloc_minimal: tcmalloc
        sides[name] = {ALLOCATOR_VARIABLE: "default", "LD_PRELOAD": library}
    print(
        f"{arguments.spec} stage {arguments.stage} of {arguments.num_stages}, {arguments.rows} rows, one thread"
    )
    print(f"at start: {load_average()}")
    rows: dict[str, list[dict]] = {side: [] for side in sides}
    forwarded = [argument for argument in (argv if argv is not None else sys.argv[1:])]
    child = [sys.executable, __file__, "--child", *forwarded]
    names = list(sides)
    for round_number in range(arguments.rounds):
        shift = round_number % len(names)  # the order rotates from round to round
        for side in names[shift:] + names[:shift]:
            environment = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
            environment.update(sides[side])
            completed = subprocess.run(child, env=environment, capture_output=True, text=True, timeout=600)
            if completed.returncode != 0:
                print(completed.stderr, file=sys.stderr)
                return 1
            rows[side].append(json.loads(completed.stdout.splitlines()[-1]))
        print(
            f"round {round_number + 1}: "
            + "; ".join(
                f"{side} full {rows[side][-1]['full_ms']:.2f} ms, W {rows[side][-1]['w_ms']:.2f} ms"
                for side in names
            )
        )
    for side in names:
        print(f"{side}: {rows[side][0]['allocator']}")
    header = "".join(f"{side:>10s}" for side in names)
    ratios_header = "".join(f"{side + ' / default':>22s}" for side in names[1:])
    print(f"{'median over rounds':18s}{header}{ratios_header}  (ratios: median of the rounds' ratios)")
    for figure in FIGURES:
        values = {side: [row[figure] for row in rows[side]] for side in names}
        medians = "".join(f"{statistics.median(values[side]):10.2f}" for side in names)
        ratios = "".join(
            f"{statistics.median([t / d if d else float('nan') for t, d in zip(values[side], values['default'], strict=True)]):22.2f}"
            for side in names[1:]
        )
        print(f"{figure:18s}{medians}{ratios}")
    print(f"at end: {load_average()}")
    return 0


if __name__ == "__main__":
    # no tune_allocator_for_benchmark() here: each measuring process tunes as its GRAPHKIT_ALLOCATOR says
    raise SystemExit(main())
