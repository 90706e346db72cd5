"""Time outside the compiled graphs: graphkit's B + W against the engine's around a compiled full backward.

    python bench/split_compiled_outside.py [--inner inductor|aot_eager] [--repeat N] [--warmup N]
                                           [--only NAME ...]

For every stage of ``bench/split_compiled.py``, its blocks compiled with ``graphkit.splitting_backend(inner)``
(one copy), microbatches alternate in one process, one thread, between

- ``full``: a plain full backward through the split regions (each region runs its whole compiled backward);
- ``no-walk``: graphkit's B then W on the path B takes by itself (``path``);
- ``walk``: the same with B made to walk the graph (``walking_always()``).

Every call of a compiled backward graph (whole, I or W) is timed (``graphs``); ``outside`` is the rest of
the backward: the engine, glue Nodes and graphkit's own work. The ratio ``outside / full outside`` is the
figure of the target (at most 1.2). Thread CPU time; not a test: run it by hand on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from split import MODELS, built_models  # noqa: E402  (bench/split.py)
from split_compiled import STAGES  # noqa: E402

from graphkit.measure.benchmark import microbatch_forward  # noqa: E402
from graphkit.models.compiling import compile_blocks  # noqa: E402
from graphkit.split import _aot_autograd, backward_input, backward_weight  # noqa: E402
from graphkit.split.compile_backend import register_backends  # noqa: E402
from graphkit.split.weight_queue import walking_always  # noqa: E402

clock = time.thread_time


class GraphClock:
    """Wraps ``_aot_autograd.call_boxed``: sums the time inside compiled backward graphs."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.backward_graphs: set[int] = set()
        self._original = _aot_autograd.call_boxed

    def __enter__(self) -> GraphClock:
        original = self._original

        def timed_call(compiled, arguments):
            if id(compiled) not in self.backward_graphs:
                return original(compiled, arguments)
            start = clock()
            try:
                return original(compiled, arguments)
            finally:
                self.seconds += clock() - start

        _aot_autograd.call_boxed = timed_call
        return self

    def __exit__(self, *_exc: object) -> None:
        _aot_autograd.call_boxed = self._original


def _backward_graphs(outputs: list[torch.Tensor]) -> set[int]:
    """The compiled backward graphs (whole, I, W) of the split regions below ``outputs``."""
    stack = [output.grad_fn for output in outputs]
    seen: set[int] = set()
    graphs: set[int] = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        region = getattr(node, "region", None)
        if region is not None and hasattr(region, "weight_backward"):
            graphs |= {id(region.backward), id(region.input_backward), id(region.weight_backward)}
        stack.extend(producer for producer, _ in node.next_functions)
    return graphs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--inner", choices=("inductor", "aot_eager"), default="inductor")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", nargs="*")
    arguments = parser.parse_args(argv)
    torch.set_num_threads(1)
    register_backends()
    warnings.filterwarnings("ignore", message=".*is not a leaf")
    print(
        f"{'model':20s} {'path':>8s} {'full':>8s} {'graphs':>8s} {'outside':>8s} {'no-walk':>8s} {'graphs':>8s} "
        f"{'outside':>8s} {'walk':>8s} {'outside':>8s} {'nw out/full out':>15s} {'walk out/full out':>17s} "
        f"{'nw/full':>8s}"
    )
    for name, module, inputs in built_models({n: MODELS[n] for n in STAGES}, arguments.only or list(STAGES)):
        compile_blocks([module], "split" if arguments.inner == "inductor" else "split-eager")
        _, _, forward = microbatch_forward(module, inputs)
        graphs = _backward_graphs(forward()[1])  # the first forward compiles
        times: dict[str, list[tuple[float, float]]] = {"full": [], "no-walk": [], "walk": []}
        paths = set()
        with GraphClock() as graph_clock:
            graph_clock.backward_graphs = graphs
            for _ in range(arguments.warmup + arguments.repeat):
                for kind in times:
                    prepared, outputs, grads = forward()
                    graph_clock.seconds = 0.0
                    start = clock()
                    if kind == "full":
                        torch.autograd.backward(outputs, grads)
                    else:
                        with walking_always() if kind == "walk" else _nothing():
                            state = backward_input(outputs, grads, prepared)
                        if kind == "no-walk":
                            paths.add(state.path)
                        del outputs
                        backward_weight(state)
                    times[kind].append((clock() - start, graph_clock.seconds))
        medians = {
            kind: (
                statistics.median(total for total, _ in values[arguments.warmup :]),
                statistics.median(inside for _, inside in values[arguments.warmup :]),
                statistics.median(total - inside for total, inside in values[arguments.warmup :]),
            )
            for kind, values in times.items()
        }
        full, no_walk, walk = medians["full"], medians["no-walk"], medians["walk"]
        print(
            f"{name:20s} {'/'.join(sorted(paths)):>8s} {full[0] * 1e6:8.0f} {full[1] * 1e6:8.0f} {full[2] * 1e6:8.0f} "
            f"{no_walk[0] * 1e6:8.0f} {no_walk[1] * 1e6:8.0f} {no_walk[2] * 1e6:8.0f} {walk[0] * 1e6:8.0f} "
            f"{walk[2] * 1e6:8.0f} {no_walk[2] / full[2]:14.2f}x {walk[2] / full[2]:16.2f}x {no_walk[0] / full[0]:7.2f}x",
            flush=True,
        )
    return 0


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> None:
        return None


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
