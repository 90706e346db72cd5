"""Compiled blocks split by graphkit.splitting_backend(): compiled I + compiled W against full backwards.

    python bench/split_compiled.py [--inner inductor|aot_eager] [--device cpu|cuda] [--repeat N] [--warmup N]
                                   [--threads N] [--clock wall|cpu] [--only NAME ...] [--no-floor]

For every model of ``bench/split.py`` named below, three copies of the stage with the same weights: eager,
its blocks compiled as usual (``torch.compile`` with the inner compiler), and its blocks compiled with
``graphkit.splitting_backend(inner)``. Blocks are compiled as torchtitan compiles them, one by one (the
children of the stage's ``nn.ModuleList``, else the whole stage: :mod:`graphkit.models.compiling`).
Microbatches alternate in one process between

- ``eager full``: an eager full backward (what 1F1B's B costs without compiling);
- ``eager B+W``: graphkit's split of the eager stage (what ``bench/split.py`` reports);
- ``comp full``: the usual compiled blocks' full backward;
- ``comp I+W``: graphkit's B then W over the split compiled blocks (their compiled I, then compiled W), on
  the path B takes by itself (``path``: ``no-walk`` where every parameter lies inside the split regions,
  :mod:`graphkit.split.weight_queue`; else ``walk``);
- ``walk I+W``: the same, with B made to walk the graph (``walking_always()``): the path before the no-walk
  one, measured in the same rounds;

and the ratios are against the full backwards of the same run: ``I+W / comp full`` (target at most 1.10),
``walk / comp full`` and ``I+W / eager full`` (target at most 0.90). ``max rel`` is the largest relative difference between the
split compiled blocks' parameter gradients and the usual compiled ones' (0 means bit for bit). The floor
of the eager split (``bench/split_floor.py``, medians of its own alternation) is printed beside them, unless
``--no-floor``. Not a test: run it by hand on a quiet machine, one thread (``--threads 1 --clock cpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from split import MODELS, add_clock_option, built_models, clock_of, set_threads  # noqa: E402  (bench/split.py)
from split_floor import FloorUnsupported, floor_split  # noqa: E402  (bench/split_floor.py)

from graphkit.measure.benchmark import microbatch_forward  # noqa: E402
from graphkit.measure.timing import timed  # noqa: E402
from graphkit.models.compiling import compile_blocks  # noqa: E402
from graphkit.split import backward_input, backward_weight  # noqa: E402
from graphkit.split.compile_backend import register_backends  # noqa: E402
from graphkit.split.weight_queue import walking_always  # noqa: E402

STAGES = ("encoder-12x64", "mlp-48-linear-gelu", "gpt2-stage", "llama-stage", "encoder-4x512")

HEADER = (
    f"{'model':20s} {'eager full':>10s} {'eager B+W':>9s} {'comp full':>9s} {'comp I+W':>9s} {'walk I+W':>9s} "
    f"{'eager B+W/full':>14s} {'floor':>6s} {'I+W/comp full':>13s} {'walk/comp full':>14s} "
    f"{'I+W/eager full':>14s} {'max rel':>8s} {'path':>8s}"
)


def _max_relative_difference(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        scale = b.abs().max().item() or 1.0
        worst = max(worst, (a - b).abs().max().item() / scale)
    return worst


def measure(
    module: torch.nn.Module, inputs, *, inner: str, repeat: int, warmup: int, clock
) -> dict[str, float]:
    """Medians (seconds) of the four backwards, alternating per microbatch, and the gradients' difference."""
    plain = copy.deepcopy(module)
    split = copy.deepcopy(module)
    compile_blocks([plain], inner)
    compile_blocks([split], "split" if inner == "inductor" else "split-eager")
    runs = {
        "eager": microbatch_forward(module, inputs),
        "plain": microbatch_forward(plain, inputs),
        "split": microbatch_forward(split, inputs),
    }
    times: dict[str, list[float]] = {
        key: [] for key in ("eager_full", "eager_split", "comp_full", "comp_split", "comp_walk")
    }
    worst = 0.0
    paths = set()
    for _ in range(warmup + repeat):
        for key, run in (("eager_full", "eager"), ("comp_full", "plain")):
            _, device, forward = runs[run]
            _, outputs, grads = forward()
            times[key].append(
                timed(lambda o=outputs, g=grads: torch.autograd.backward(o, g), device, clock)[0]
            )
        for key, run in (("eager_split", "eager"), ("comp_split", "split"), ("comp_walk", "split")):
            _, device, forward = runs[run]
            prepared, outputs, grads = forward()
            with walking_always() if key == "comp_walk" else contextlib.nullcontext():
                seconds, state = timed(
                    lambda o=outputs, g=grads, p=prepared: backward_input(o, g, p), device, clock
                )
            if key == "comp_split":
                paths.add(state.path)
            del outputs, grads
            times[key].append(seconds + timed(lambda s=state: backward_weight(s), device, clock)[0])
        worst = max(
            worst,
            _max_relative_difference([p.grad for p in runs["split"][0]], [p.grad for p in runs["plain"][0]]),
        )
    medians = {key: statistics.median(values[warmup:]) for key, values in times.items()}
    medians["max_rel"] = worst
    medians["path"] = "/".join(sorted(paths))
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--inner", choices=("inductor", "aot_eager"), default="inductor")
    parser.add_argument("--device", default="cpu", help="where the stages run (cpu, cuda)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, help="intra-op CPU threads (default: PyTorch's choice)")
    parser.add_argument("--only", nargs="*", help=f"model names to run (default: {', '.join(STAGES)})")
    parser.add_argument("--no-floor", action="store_true", help="leave out the eager split's floor")
    add_clock_option(parser)
    arguments = parser.parse_args(argv)
    if arguments.repeat < 1 or arguments.warmup < 0:
        parser.error("--repeat must be at least 1 and --warmup at least 0")
    set_threads(parser, arguments.threads)
    clock = clock_of(parser, arguments)
    register_backends()
    warnings.filterwarnings("ignore", message=".*is not a leaf")
    print(HEADER)
    models = {name: MODELS[name] for name in STAGES}
    for name, module, inputs in built_models(models, arguments.only or list(STAGES)):
        module.to(arguments.device)  # the inputs follow the parameters (microbatch_forward)
        result = measure(
            module,
            inputs,
            inner=arguments.inner,
            repeat=arguments.repeat,
            warmup=arguments.warmup,
            clock=clock,
        )
        floor = "-"
        if not arguments.no_floor and arguments.device == "cpu":
            try:
                floored = floor_split(
                    module, inputs, repeat=arguments.repeat, warmup=arguments.warmup, clock=clock
                )
                floor = f"{(floored.floor_b_s + floored.floor_w_s) / floored.full_s:5.2f}x"
            except FloorUnsupported:
                floor = "n/a"
        print(
            f"{name:20s} {result['eager_full'] * 1e6:10.0f} {result['eager_split'] * 1e6:9.0f} "
            f"{result['comp_full'] * 1e6:9.0f} {result['comp_split'] * 1e6:9.0f} "
            f"{result['comp_walk'] * 1e6:9.0f} "
            f"{result['eager_split'] / result['eager_full']:13.2f}x {floor:>6s} "
            f"{result['comp_split'] / result['comp_full']:12.2f}x {result['comp_walk'] / result['comp_full']:13.2f}x "
            f"{result['comp_split'] / result['eager_full']:13.2f}x "
            f"{result['max_rel']:8.1e} {result['path']:>8s}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
