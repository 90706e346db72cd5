"""The split backward's floor: what B + W costs with none of graphkit's bookkeeping around the engine.

    python bench/split_floor.py [--repeat N] [--warmup N] [--threads N] [--clock wall|cpu] [--only NAME ...]

For every model of ``bench/split.py``, microbatches alternate in one process between a full backward,
graphkit's B then W (:func:`graphkit.split.backward_input` / :func:`~graphkit.split.backward_weight`),
and a *floor split* of the same graph that keeps only the work no exact B/W split can skip:

- floor B: one engine call computing the stage inputs' gradients and capturing the gradient each
  intermediate receives through the engine's own captures (``inputs=GradientEdge(...)``, as
  ``torch.autograd.grad`` takes them): no walk, no plan lookup, no Python hooks, no scans;
- floor W: graphkit's weight formulas on those gradients (their saved tensors read before the timing),
  then one engine call accumulating the results, and the normalizations' weight gradients B computed
  (captured at their AccumulateGrad Nodes, as graphkit's B does), into ``.grad``: no checks, no release.

What the floor leaves out is what makes graphkit's split exact on every graph (the walk that proves the
cached plan fits this microbatch, the hooks that see a gradient after tensor hooks changed it, the scans
for custom Functions, checkpoints and hooked saved tensors, the version checks), so the floor is not a
usable split: it is a bound. ``floor B+W`` over the full backward is the ratio no pure-Python bookkeeping
can go below on this machine; ``graphkit B+W`` is the ratio ``bench/split.py`` reports; ``py share`` is
the part of graphkit's B + W the floor does not pay. Each floor run's ``.grad`` is compared bit for bit
with graphkit's on the same microbatch (``exact`` column), so the floor does the same work.

Models whose plan has what the floor does not model (intermediates without a formula, parameters fed
both directly and through weight-only Nodes, parameter-only outputs) are printed as skipped.
Not a test: run it by hand on a quiet machine (medians; one thread and ``--clock cpu`` are steadiest).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

sys.path.insert(0, str(Path(__file__).resolve().parent))
from split import MODELS, add_clock_option, built_models, clock_of, set_threads  # noqa: E402  (bench/split.py)

from graphkit.graph import _autograd  # noqa: E402
from graphkit.graph.tensors import flatten_tensors  # noqa: E402
from graphkit.graph.walk import walk_nodes  # noqa: E402
from graphkit.measure.benchmark import microbatch_forward  # noqa: E402
from graphkit.measure.timing import timed  # noqa: E402
from graphkit.split import backward_input, backward_weight  # noqa: E402
from graphkit.split.backward_plan import cached_plan  # noqa: E402
from graphkit.split.weight_rules import prepare  # noqa: E402


class FloorUnsupported(Exception):
    """The model's plan has something the floor split does not model (the message says what)."""


@dataclass
class FloorResult:
    """Medians per microbatch, in seconds; ``exact``: every floor run's ``.grad`` equalled graphkit's."""

    full_s: float
    graphkit_b_s: float
    graphkit_w_s: float
    floor_b_s: float
    floor_w_s: float
    intermediates: int
    exact: bool


@dataclass
class _FloorWork:
    """One microbatch's floor split, prepared outside the timing."""

    outputs: list[torch.Tensor]
    grads: list[torch.Tensor]
    stage_inputs: list[torch.Tensor]
    captures: list[GradientEdge]  # one per forward output of each intermediate, in plan order
    outputs_per_intermediate: list[int]
    rules: list[Any]  # graphkit's prepared weight formulas, one per intermediate (None: B's own gradient)
    root_edges: list[list[GradientEdge]]  # per intermediate: its weight-side edges' targets
    weight_tensors: list[torch.Tensor]


def _prepare_floor(outputs: list[torch.Tensor], grads: list[torch.Tensor], prepared: Any) -> _FloorWork:
    """Walk and plan the graph and read the formulas' saved tensors (all of it untimed)."""
    flat = (
        [prepared]
        if isinstance(prepared, torch.Tensor)
        else [tensor for _, tensor in flatten_tensors(prepared)]
    )
    stage_inputs = [tensor for tensor in flat if tensor.requires_grad]
    input_nodes = {_autograd.gradient_edge(tensor).node for tensor in stage_inputs}
    walk = walk_nodes((output.grad_fn for output in outputs), input_nodes)
    input_positions = tuple(sorted(walk.index.get(node, -1) for node in input_nodes))
    plan = cached_plan(walk, input_nodes, frozenset(), input_positions)
    plan = plan.reductions_in_b or plan  # as graphkit's B: normalizations' weight gradients in B
    if plan.mixed_leaves:
        raise FloorUnsupported("parameters fed both directly and through weight-only Nodes")
    if any(plan.weight_only[walk.index[output.grad_fn]] for output in outputs):
        raise FloorUnsupported("a parameter-only output")
    nodes = walk.nodes
    captures, counts, rules, roots = [], [], [], []
    for (index, edges), weight_input_nrs in zip(plan.intermediates, plan.weight_input_nrs, strict=True):
        node = nodes[index]
        rule = prepare(node, weight_input_nrs)
        if rule is None:
            raise FloorUnsupported(f"no weight formula for {node.name()}")
        count = len(node._input_metadata)
        captures += [GradientEdge(node, output_nr) for output_nr in range(count)]
        counts.append(count)
        rules.append(rule)
        roots.append([GradientEdge(nodes[target], output_nr) for _, target, output_nr in edges])
    # the gradients B computes itself, captured at the parameters' AccumulateGrad Nodes: one root each
    for target, output_nr in plan.computed_in_b:
        captures.append(GradientEdge(nodes[target], output_nr))
        counts.append(1)
        rules.append(None)
        roots.append([GradientEdge(nodes[target], output_nr)])
    weight_tensors = [nodes[leaf].variable for leaf in plan.weight_leaves]
    return _FloorWork(outputs, grads, stage_inputs, captures, counts, rules, roots, weight_tensors)


def _floor_b(
    work: _FloorWork,
) -> tuple[tuple[torch.Tensor | None, ...], list[tuple[torch.Tensor | None, ...]]]:
    """One engine call: the stage inputs' gradients, and the gradients each intermediate received."""
    received = _autograd.run_engine_grad(work.outputs, work.grads, [*work.stage_inputs, *work.captures])
    position = len(work.stage_inputs)
    captured = []
    for count in work.outputs_per_intermediate:
        captured.append(tuple(received[position : position + count]))
        position += count
    return tuple(received[: len(work.stage_inputs)]), captured


def _floor_w(work: _FloorWork, captured: list[tuple[torch.Tensor | None, ...]]) -> None:
    """graphkit's formulas on the captured gradients, then one engine call into ``.grad``."""
    roots, root_grads = [], []
    with torch.no_grad():
        for rule, edges, grads in zip(work.rules, work.root_edges, captured, strict=True):
            if all(grad is None for grad in grads):
                continue
            for edge, grad in zip(edges, grads if rule is None else rule(grads), strict=True):
                if grad is not None:
                    roots.append(edge)
                    root_grads.append(grad)
    if roots:
        _autograd.run_engine_backward(roots, root_grads, work.weight_tensors)


def floor_split(
    module: torch.nn.Module, inputs: Any, *, repeat: int, warmup: int, clock: Callable[[], float]
) -> FloorResult:
    """Full backward, graphkit's B + W and the floor split, alternating per microbatch (see the module).

    Raises:
        FloorUnsupported: the model's plan has what the floor does not model.
    """
    parameters, device, forward = microbatch_forward(module, inputs)

    def grads_now() -> list[torch.Tensor | None]:
        return [None if p.grad is None else p.grad.clone() for p in parameters]

    times: dict[str, list[float]] = {key: [] for key in ("full", "b", "w", "floor_b", "floor_w")}
    exact = True
    intermediates = 0
    for _ in range(warmup + repeat):
        _, outputs, grads = forward()
        times["full"].append(
            timed(lambda o=outputs, g=grads: torch.autograd.backward(o, g), device, clock)[0]
        )
        prepared, outputs, grads = forward()
        seconds, state = timed(lambda o=outputs, g=grads, p=prepared: backward_input(o, g, p), device, clock)
        times["b"].append(seconds)
        intermediates = state.num_intermediates
        del outputs, grads
        times["w"].append(timed(lambda s=state: backward_weight(s), device, clock)[0])
        reference = grads_now()
        prepared, outputs, grads = forward()
        work = _prepare_floor(outputs, grads, prepared)
        del outputs, grads
        seconds, (_, captured) = timed(lambda f=work: _floor_b(f), device, clock)
        times["floor_b"].append(seconds)
        times["floor_w"].append(timed(lambda f=work, c=captured: _floor_w(f, c), device, clock)[0])
        exact = exact and all(
            (ours is None) == (theirs is None) and (ours is None or torch.equal(ours, theirs))
            for ours, theirs in zip(grads_now(), reference, strict=True)
        )
        del work, captured
    for parameter in parameters:
        parameter.grad = None
    medians = {key: statistics.median(values[warmup:]) for key, values in times.items()}
    return FloorResult(
        medians["full"],
        medians["b"],
        medians["w"],
        medians["floor_b"],
        medians["floor_w"],
        intermediates,
        exact,
    )


HEADER = (
    f"{'model':24s} {'int':>4s} {'full us':>8s} {'gk B us':>8s} {'gk W us':>8s} {'fl B us':>8s} "
    f"{'fl W us':>8s} {'graphkit B+W':>12s} {'floor B+W':>9s} {'py share':>8s} {'exact':>5s}"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, help="intra-op CPU threads (default: PyTorch's choice)")
    parser.add_argument("--only", nargs="*", help="model names to run (default: all)")
    add_clock_option(parser)
    arguments = parser.parse_args(argv)
    if arguments.repeat < 1 or arguments.warmup < 0:
        parser.error("--repeat must be at least 1 and --warmup at least 0")
    set_threads(parser, arguments.threads)
    clock = clock_of(parser, arguments)
    print(HEADER)
    failed = False
    for name, module, inputs in built_models(MODELS, arguments.only):
        try:
            result = floor_split(
                module, inputs, repeat=arguments.repeat, warmup=arguments.warmup, clock=clock
            )
        except FloorUnsupported as reason:
            print(f"{name:24s} skipped: {reason}", flush=True)
            continue
        graphkit = result.graphkit_b_s + result.graphkit_w_s
        floor = result.floor_b_s + result.floor_w_s
        failed = failed or not result.exact
        print(
            f"{name:24s} {result.intermediates:4d} {result.full_s * 1e6:8.0f} {result.graphkit_b_s * 1e6:8.0f} "
            f"{result.graphkit_w_s * 1e6:8.0f} {result.floor_b_s * 1e6:8.0f} {result.floor_w_s * 1e6:8.0f} "
            f"{graphkit / result.full_s:11.2f}x {floor / result.full_s:8.2f}x "
            f"{(graphkit - floor) / graphkit:8.0%} {'yes' if result.exact else 'NO':>5s}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
