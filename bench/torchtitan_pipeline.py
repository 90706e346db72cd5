"""torchtitan's llama3 debugmodel through torchtitan's own pipeline code: step times per schedule, eager and
with blocks compiled by graphkit's splitting backend, on 2 CPU ranks pinned to one core each.

    .venv-newest/bin/python bench/torchtitan_pipeline.py
    .venv-newest/bin/python bench/torchtitan_pipeline.py --microbatches 4 8 --rounds 15 --attention flex
    .venv-newest/bin/python bench/torchtitan_pipeline.py --schedules ZBVZeroBubble 1F1B --compile graphkit_split

Needs torchtitan 0.3.0 (``bash scripts/setup.sh --torchtitan``, in the newest-torch environment). For each
number of microbatches, one start of 2 gloo ranks builds every case with torchtitan's ``pipeline_llm``
(``graphkit.integrations.torchtitan.install()``: graphkit's stage; blocks compiled in place by torchtitan's
``apply_compile`` with ``--compile``) and steps them interleaved: each round runs one step of every case in
turn, in orders balanced for position and predecessor, after untimed warm-up steps (compilation, metadata inference). The CPU set-up is
``tests/torchtitan_pipelines.py``'s (FlexAttention's eager backward, ``device_type`` "cpu").

Printed per case: the median step (milliseconds, the slower rank's), and ``/ 1F1B``, the median over rounds
of the step divided by 1F1B's eager step in the same round (1F1B eager is the baseline of every row), with
the rounds in which the case was faster than that baseline; 1F1B eager runs twice, the second copy (A/A)
giving the run's noise floor. Not a test: run it by hand on a quiet machine;
the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # torchtitan_pipelines: torchtitan's debugmodel on CPU ranks

from torchtitan_pipelines import TitanCase, step_times_rank  # noqa: E402

from graphkit.pipelining.launcher import run_on_processes  # noqa: E402

SCHEDULES = ("1F1B", "Interleaved1F1B", "ZBVZeroBubble")
BASELINE = ("1F1B", None)


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def measure(
    microbatches: int, schedules: list[str], compile_backend: str, attention: str, rounds: int, warmup: int
) -> list[tuple[TitanCase, list[float]]]:
    """Step times of every (schedule, eager / compiled) case, the slower rank's per step, in seconds."""
    cases = [
        TitanCase(attention=attention, compile=compiled, schedule=schedule, microbatches=microbatches)
        for schedule in schedules
        for compiled in (None, compile_backend)
    ]
    if (cases[0].schedule, cases[0].compile) != BASELINE:
        cases.insert(0, TitanCase(attention=attention, schedule="1F1B", microbatches=microbatches))
    # the baseline again, last: the A/A control, whose spread from the first copy is the run's noise floor
    cases.append(TitanCase(attention=attention, schedule="1F1B", microbatches=microbatches))
    per_rank = run_on_processes(
        step_times_rank,
        (cases, rounds, warmup),
        world_size=2,
        deadline=1800,
        group_timeout=600,
        pin_cores=True,
    )
    return [
        (case, [max(times) for times in zip(*(rank[index] for rank in per_rank), strict=True)])
        for index, case in enumerate(cases)
    ]


def table(measured: list[tuple[TitanCase, list[float]]]) -> list[str]:
    baseline = measured[0][1]
    lines = [f"{'schedule':<17}{'blocks':<22}{'median step':>12}{'/ 1F1B':>9}{'won':>8}"]
    for index, (case, times) in enumerate(measured):
        ratios = [time / base for time, base in zip(times, baseline, strict=True)]
        won = sum(ratio < 1 for ratio in ratios)
        blocks = (case.compile or "eager") + (" (A/A)" if index == len(measured) - 1 else "")
        lines.append(
            f"{case.schedule:<17}{blocks:<22}{statistics.median(times) * 1e3:>10.1f}ms"
            f"{statistics.median(ratios):>9.3f}{won:>5}/{len(ratios)}"
        )
    floor = abs(statistics.median(r / b for r, b in zip(measured[-1][1], baseline, strict=True)) - 1)
    lines.append(f"noise floor: 1F1B against itself (A/A) {floor:.1%} apart in the median round")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    parser.add_argument(
        "--compile", default="graphkit_split_eager", help="graphkit_split or graphkit_split_eager"
    )
    parser.add_argument("--attention", default="flex", choices=["flex", "sdpa"])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    arguments = parser.parse_args()
    import torch
    import torchtitan

    print(
        f"torchtitan {torchtitan.__version__}, torch {torch.__version__}: llama3 debugmodel, sequence 64, "
        f"{arguments.attention} attention, 2 ranks pinned to one core each, {arguments.rounds} rounds"
    )
    for microbatches in arguments.microbatches:
        load_before = _load()
        measured = measure(
            microbatches,
            arguments.schedules,
            arguments.compile,
            arguments.attention,
            arguments.rounds,
            arguments.warmup,
        )
        print(f"\n{microbatches} microbatches (load average {load_before} before, {_load()} after)")
        for line in table(measured):
            print(line)


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    main()
