"""Where the split backward's extra time goes: B + W against a full backward, split into named parts.

    python bench/split_breakdown.py [--quick] [--rounds N] [--warmup N] [--only NAME ...]
                                    [--allocator default|tuned|both] [--json]

Per stage, in one process per allocator (one intra-op thread), rounds run each variant on a fresh
forward, the order of the variants rotating from round to round: a full backward; graphkit's B then W
(:func:`graphkit.split.backward_input` / :func:`~graphkit.split.backward_weight`); and PyTorch's own split,
``torch.distributed.pipelining._backward.stage_backward_input`` then ``stage_backward_weight`` (I and W),
where it runs. Times are medians. The excess of graphkit's B + W over the full backward is split into:

- ``python``: time outside the ATen operators (graphkit's walk, hooks, pairing and formulas' Python, and
  the engine's scheduling): the excess of wall time less the excess of the operators' self CPU time
  under ``torch.profiler`` (profiled rounds apart from the timed ones);
- ``extra ops``: operator time of the operators whose counts differ from a full backward's (counted by
  a ``TorchDispatchMode``: kernels a full backward does not run, or runs in another layout);
- ``accumulate``: the change in operator time inside AccumulateGrad Nodes (copies into ``.grad``);
- ``same ops``: what the operators both run cost more in the split (memory traffic, cold caches);
- ``faults``: minor page faults per microbatch, B + W less the full backward (``getrusage``), and the
  allocator's share: the excess under glibc's default allocator less the excess under a tuned one
  (each child process sets its own with :func:`graphkit.measure.allocator.tune_allocator`, told which by
  ``GRAPHKIT_ALLOCATOR``).

Not a test: run it by hand on a quiet machine; ``--quick`` is a smoke run (tests/test_bench.py).
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
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from split import MODELS  # noqa: E402  (bench/split.py)

from graphkit.measure.allocator import (  # noqa: E402
    ALLOCATOR_VARIABLE,
    TUNED_ENVIRONMENT,
    current_allocator,
)
from graphkit.measure.benchmark import microbatch_forward  # noqa: E402
from graphkit.measure.timing import load_average  # noqa: E402
from graphkit.split import backward_input, backward_weight  # noqa: E402

GPT2_256 = "hf:gpt2?n_layer=4&n_embd=256&seq=64&vocab_size=512"
LLAMA_256 = "hf:llama?num_hidden_layers=4&hidden_size=256&intermediate_size=512&seq=64&vocab_size=512"
GPT2_512 = "hf:gpt2?n_layer=4&n_embd=512&seq=128&vocab_size=512"


def pipeline_stage(spec: str, index: int = 1, stages: int = 4, rows: int = 8) -> tuple[torch.nn.Module, Any]:
    """Stage ``index`` of ``spec`` cut into ``stages``, on the inputs stage ``index - 1`` gives it for a
    microbatch of ``rows`` rows (detached, requiring grad, as a received activation)."""
    from graphkit.models.pipeline_specs import load_pipeline_spec
    from graphkit.split.compile_backend import register_backends

    register_backends()
    model = load_pipeline_spec(spec, num_stages=stages, batch_size=rows, seed=0)
    inputs, _ = model.microbatch(1)
    with torch.no_grad():
        for module in model.stages[:index]:
            outputs = module(*inputs)
            inputs = outputs if isinstance(outputs, tuple) else (outputs,)
    inputs = tuple(
        value.detach().requires_grad_(value.is_floating_point()) if isinstance(value, torch.Tensor) else value
        for value in inputs
    )
    return model.stages[index], inputs


STAGES: dict[str, Callable[[], tuple[torch.nn.Module, Any]]] = {
    **{name: MODELS[name] for name in ("encoder-12x64", "encoder-48x16", "mlp-48-linear-gelu")},
    "gpt2-stage": MODELS["gpt2-stage"],
    "llama-stage": MODELS["llama-stage"],
    "gpt2-256 stage 1/4": lambda: pipeline_stage(GPT2_256),
    "llama-256 stage 1/4": lambda: pipeline_stage(LLAMA_256),
    "gpt2-512 stage 1/4": lambda: pipeline_stage(GPT2_512),
}
OPTIONAL_STAGES: dict[str, Callable[[], tuple[torch.nn.Module, Any]]] = {
    # compiling takes minutes on a small CPU machine: run it with --only
    "gpt2-256 stage 1/4 compile=split": lambda: pipeline_stage(GPT2_256 + "&compile=split"),
    "encoder-4x512": MODELS["encoder-4x512"],
}
QUICK_STAGES = ("mlp-48-linear-gelu",)


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class _OperatorCounts(TorchDispatchMode):
    """Counts the ATen operators called, by name (``aten::mm``, as the profiler names them)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[f"aten::{func.overloadpacket.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def _pytorch_split() -> Any:
    try:
        from torch.distributed.pipelining import _backward
    except ImportError:
        return None
    return _backward


def _variants(
    forward: Callable[[], Any], parameters: list[torch.Tensor], clock: Callable[[], float]
) -> dict[str, Callable[[], Callable[[], dict[str, float]]]]:
    """Each variant runs one microbatch's forward and returns its backward: a call that returns the
    times of its phases (``full``; ``b`` and ``w``; ``i`` and ``pw``), so that only the backward is timed,
    profiled or counted."""

    def full() -> Callable[[], dict[str, float]]:
        _, outputs, grads = forward()

        def run() -> dict[str, float]:
            start = clock()
            torch.autograd.backward(outputs, grads)
            return {"full": clock() - start}

        return run

    def graphkit() -> Callable[[], dict[str, float]]:
        batch = list(forward())

        def run() -> dict[str, float]:
            prepared, outputs, grads = batch
            batch.clear()
            start = clock()
            state = backward_input(outputs, grads, prepared)
            middle = clock()
            del outputs, grads  # a pipeline drops the stage outputs after B
            backward_weight(state)
            return {"b": middle - start, "w": clock() - middle}

        return run

    variants = {"full": full, "graphkit": graphkit}
    pipelining = _pytorch_split()
    if pipelining is not None:

        def pytorch() -> Callable[[], dict[str, float]]:
            batch = list(forward())

            def run() -> dict[str, float]:
                prepared, outputs, grads = batch
                batch.clear()
                inputs = [value for value in _tensors(prepared) if value.requires_grad]
                start = clock()
                _, groups = pipelining.stage_backward_input(outputs, grads, inputs, iter(parameters))
                middle = clock()
                del outputs, grads
                pipelining.stage_backward_weight(iter(parameters), groups)
                return {"i": middle - start, "pw": clock() - middle}

            return run

        variants["pytorch"] = pytorch
    return variants


def _tensors(value: Any) -> list[torch.Tensor]:
    from graphkit.graph.tensors import flatten_tensors

    return [tensor for _, tensor in flatten_tensors(value)]


def _profiled(step: Callable[[], Any]) -> tuple[float, float, dict[str, float]]:
    """``(operators' self seconds, their self seconds inside AccumulateGrad Nodes, per operator name)``
    of one call of ``step`` under ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        step()
    total = accumulate = 0.0
    per_name: dict[str, float] = {}
    for event in profiler.events():
        if not event.name.startswith("aten::"):
            continue
        seconds = event.self_cpu_time_total * 1e-6
        total += seconds
        parent = event.cpu_parent
        while parent is not None and "AccumulateGrad" not in parent.name:
            parent = parent.cpu_parent
        if parent is not None:
            accumulate += seconds
        else:
            per_name[event.name] = per_name.get(event.name, 0.0) + seconds
    return total, accumulate, per_name


def measure_stage(
    module: torch.nn.Module, inputs: Any, rounds: int, warmup: int, clock: Callable[[], float]
) -> dict[str, Any]:
    """Every figure of one stage's row, measured in this process (seconds; faults per microbatch)."""
    parameters, _, forward = microbatch_forward(module, inputs)
    variants = _variants(forward, parameters, clock)
    names = list(variants)
    times: dict[str, list[float]] = {}
    faults: dict[str, list[int]] = {name: [] for name in names}
    errors: dict[str, str] = {}
    for round_index in range(warmup + rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if name in errors:
                continue
            try:
                run = variants[name]()
                before = minor_faults()
                phases = run()
            except Exception as error:  # PyTorch's split fails on some graphs: report it
                errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
                continue
            if round_index >= warmup:
                faults[name].append(minor_faults() - before)
                for phase, seconds in phases.items():
                    times.setdefault(phase, []).append(seconds)
    result: dict[str, Any] = {phase: statistics.median(values) for phase, values in times.items()}
    result["faults"] = {name: statistics.median(values) for name, values in faults.items() if values}
    result["errors"] = errors

    # operators: which differ (a dispatch mode), and their self time under the profiler
    counts = {}
    for name in ("full", "graphkit"):
        run = variants[name]()
        with _OperatorCounts() as counter:
            run()
        counts[name] = counter.counts
    differing = {
        op
        for op in set(counts["full"]) | set(counts["graphkit"])
        if counts["full"][op] != counts["graphkit"][op]
    }
    profiled: dict[str, list[tuple[float, float, dict[str, float]]]] = {"full": [], "graphkit": []}
    for _ in range(max(1, rounds // 2)):
        for name in ("full", "graphkit"):
            profiled[name].append(_profiled(variants[name]()))
    total = {name: statistics.median(run[0] for run in runs) for name, runs in profiled.items()}
    accumulate = {name: statistics.median(run[1] for run in runs) for name, runs in profiled.items()}

    def differing_seconds(name: str) -> float:
        return statistics.median(sum(run[2].get(op, 0.0) for op in differing) for run in profiled[name])

    extra_ops = differing_seconds("graphkit") - differing_seconds("full")
    excess = result["b"] + result["w"] - result["full"]
    operators = total["graphkit"] - total["full"]
    result["parts"] = {
        "python": excess - operators,
        "extra ops": extra_ops,
        "accumulate": accumulate["graphkit"] - accumulate["full"],
        "same ops": operators - extra_ops - (accumulate["graphkit"] - accumulate["full"]),
    }
    result["differing"] = {op: counts["graphkit"][op] - counts["full"][op] for op in sorted(differing)}
    for parameter in parameters:
        parameter.grad = None
    return result


def worker(arguments: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    results = {}
    for name in arguments.only:
        build = STAGES.get(name) or OPTIONAL_STAGES[name]
        try:
            module, inputs = build()
        except ImportError as error:
            print(f"{name}: skipped ({error})", file=sys.stderr)
            continue
        clock = time.thread_time if arguments.clock == "cpu" else time.perf_counter
        results[name] = measure_stage(module, inputs, arguments.rounds, arguments.warmup, clock)
        results[name]["malloc"] = str(current_allocator())
        print(json.dumps({name: results[name]}), flush=True)
    return 0


def allocator_environment(allocator: str) -> dict[str, str]:
    """The child's environment: ``GRAPHKIT_ALLOCATOR`` names the allocator, which the child sets itself
    (:func:`graphkit.measure.allocator.tune_allocator`); glibc's startup variables are left out, so the
    ``default`` child really runs under glibc's defaults."""
    environment = {key: value for key, value in os.environ.items() if key not in TUNED_ENVIRONMENT}
    environment[ALLOCATOR_VARIABLE] = allocator
    return environment


def run_child(allocator: str, names: list[str], arguments: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        "--rounds",
        str(arguments.rounds),
        "--warmup",
        str(arguments.warmup),
        "--clock",
        arguments.clock,
        "--only",
        *names,
    ]
    completed = subprocess.run(
        command, env=allocator_environment(allocator), capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(f"the {allocator} child failed:\n{completed.stderr[-2000:]}")
    results: dict[str, Any] = {}
    for line in completed.stdout.splitlines():
        if line.startswith("{"):
            results.update(json.loads(line))
    return results


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:8.2f}"


HEADER = (
    f"{'stage':34s} {'alloc':7s} {'full':>8s} {'B':>8s} {'W':>8s} {'B+W/f':>6s} {'I':>8s} {'PyW':>8s} "
    f"{'I+W/f':>6s} | {'excess':>7s} {'python':>7s} {'ext ops':>7s} {'accum':>7s} {'same':>7s} "
    f"{'faults':>7s} {'alloc':>7s}"
)


def format_rows(name: str, by_allocator: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    excesses = {
        allocator: row["b"] + row["w"] - row["full"] for allocator, row in by_allocator.items() if "b" in row
    }
    for allocator, row in by_allocator.items():
        full = row["full"]
        split = row["b"] + row["w"]
        pytorch = row["i"] + row["pw"] if "i" in row and "pw" in row else None
        parts = row["parts"]
        faults = row["faults"]
        fault_excess = faults.get("graphkit", 0) - faults.get("full", 0)
        allocator_share = (
            excesses["default"] - excesses["tuned"]
            if allocator == "default" and {"default", "tuned"} <= set(excesses)
            else None
        )
        lines.append(
            f"{name:34s} {allocator:7s} {_ms(full)} {_ms(row['b'])} {_ms(row['w'])} {split / full:6.2f} "
            f"{_ms(row.get('i'))} {_ms(row.get('pw'))} "
            f"{(pytorch / full if pytorch else float('nan')):6.2f} | {_ms(split - full)[1:]} "
            f"{_ms(parts['python'])[1:]} {_ms(parts['extra ops'])[1:]} {_ms(parts['accumulate'])[1:]} "
            f"{_ms(parts['same ops'])[1:]} {fault_excess:7.0f} "
            f"{(_ms(allocator_share)[1:] if allocator_share is not None else '-'):>7s}"
        )
        if row.get("errors"):
            lines.append(f"{'':34s} errors: {row['errors']}")
    return lines


LEGEND = (
    "Times in ms per microbatch (medians, one thread; the clock the first line names). B, W: graphkit's; I, PyW: PyTorch's pipelining "
    "split; /f: over the full backward. excess = B + W - full, split into python (outside ATen "
    "operators), ext ops (operators whose counts differ from a full backward's), accum (inside "
    "AccumulateGrad), same (operators both run, slower in the split); faults: minor page faults of B + W "
    "less the full backward's; alloc: the excess under glibc's default allocator less under the tuned one."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--only", nargs="*", help=f"stages (default: all of {', '.join(STAGES)})")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="this thread's CPU time (default: leaves out time other processes hold the core; page "
        "faults are in it) or wall time",
    )
    parser.add_argument("--allocator", choices=["default", "tuned", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one small stage, two rounds")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.rounds, arguments.warmup = 2, 1
        arguments.only = arguments.only or list(QUICK_STAGES)
    names = arguments.only or list(STAGES)
    unknown = [name for name in names if name not in STAGES and name not in OPTIONAL_STAGES]
    if unknown:
        parser.error(f"unknown stages {unknown}; known: {', '.join([*STAGES, *OPTIONAL_STAGES])}")
    if arguments.rounds < 1:
        parser.error("--rounds must be at least 1")
    arguments.only = names
    if arguments.worker:
        return worker(arguments)
    allocators = ["default", "tuned"] if arguments.allocator == "both" else [arguments.allocator]
    results = {allocator: run_child(allocator, names, arguments) for allocator in allocators}
    if arguments.json:
        print(json.dumps(results, indent=1))
        return 0
    print(
        f"# {load_average()}; torch {torch.__version__}; clock {arguments.clock}; {arguments.rounds} rounds"
    )
    print(HEADER)
    for name in names:
        rows = {allocator: results[allocator][name] for allocator in allocators if name in results[allocator]}
        for line in format_rows(name, rows):
            print(line)
    print(LEGEND)
    return 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; each child sets the allocator it was given
    sys.exit(main())
