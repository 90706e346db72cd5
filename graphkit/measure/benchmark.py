"""Measure a stage's split backward against its full backward: time, FLOPs, engine calls, memory kept.

:func:`benchmark_split` runs repeated microbatches of one stage and reports (all times in seconds,
medians after warm-up):

- ``full_s``: an ordinary ``torch.autograd.backward``; ``b_s`` / ``w_s``: graphkit's B and W phases;
  ``split_s``: their sum;
- ``flops``: FLOPs of ``full``, ``b`` and ``w`` (:class:`graphkit.measure.flops.PhaseFlops`);
- ``w_engine_calls``: autograd-engine calls the W phase makes;
- ``retained_bytes``: bytes kept alive between B and W once the caller dropped the stage outputs -
  saved tensors reachable from what the state holds, plus the captured gradients (for a non-reentrant
  activation checkpoint: its inputs and whatever it holds recomputed);
- ``w_needs_bytes``: what W cannot do without - the inputs of the weight-consuming ops (their saved
  tensors), the weight-only subgraph's saved tensors and the captured gradients (parameters count in
  neither figure: they stay alive in the module anyway);
- ``graph_saved_bytes``: the saved tensors of the whole stage graph (what keeping the outputs costs).

``b_engine_s``: the engine's own input-gradient call on the same graph
(``torch.autograd.grad(outputs, stage_inputs)``, no graphkit): what B cannot go below; 0 for a stage
without inputs that require grad.

``pytorch_*`` keys hold the same measurements for PyTorch's own
``torch.distributed.pipelining._backward`` split, when it runs on the model.

:func:`account_split_time` says where the split's extra time goes: the kernels themselves (the
operators' own time under ``torch.profiler``, which grows when W re-reads gradients and activations a
full backward used while they were still in cache, and when an op with a fused backward, such as layer
norm, runs once for the input side and once for the weights) against everything else (Python in B and
W, hooks, the engine's scheduling).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from graphkit.graph import _autograd
from graphkit.graph.autograd_graph import capture
from graphkit.graph.tensors import GraphkitInputError, distinct_bytes, flatten_tensors
from graphkit.measure.flops import PhaseFlops
from graphkit.measure.stage_inputs import call_stage, fresh_inputs, placed_stage
from graphkit.measure.timing import timed
from graphkit.models.specs import load_spec
from graphkit.split.backward import SplitState, backward_input, backward_weight
from graphkit.split.checkpointing import checkpoint_tensors
from graphkit.split.laps import timing_laps

__all__ = [
    "SplitBenchmark",
    "SplitBreakdown",
    "SplitTimeAccount",
    "account_split_time",
    "bench_spec",
    "benchmark_split",
    "breakdown_split",
    "count_engine_calls",
    "memory_kept",
    "saved_tensors_below",
]


@dataclass(slots=True)
class SplitBenchmark:
    """Result of :func:`benchmark_split` (see module docstring for each field)."""

    full_s: float
    b_s: float
    w_s: float
    split_s: float
    flops: dict[str, int]
    w_engine_calls: int
    retained_bytes: int
    w_needs_bytes: int
    graph_saved_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """(B + W) time over full-backward time."""
        return self.split_s / self.full_s if self.full_s else float("nan")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(data.pop("extra"))
        data["ratio"] = self.ratio
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SplitBenchmark:
        """The result back from :meth:`to_dict` (its JSON included): entries that are no field go to ``extra``."""
        names = set(cls.__dataclass_fields__) - {"extra"}
        fields = {key: value for key, value in data.items() if key in names}
        extra = {key: value for key, value in data.items() if key not in names and key != "ratio"}
        return cls(**fields, extra=extra)


@contextlib.contextmanager
def count_engine_calls() -> Iterator[list[int]]:
    """Count autograd-engine runs (``torch.autograd.backward`` and ``torch.autograd.grad``) in the block.

    Wraps the private ``torch.autograd.graph._engine_run_backward`` that both entry points call.
    """
    import torch.autograd as autograd_module
    import torch.autograd.graph as graph_module

    counter = [0]
    original = graph_module._engine_run_backward

    def counting(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return original(*args, **kwargs)

    graph_module._engine_run_backward = counting
    autograd_module._engine_run_backward = counting
    try:
        yield counter
    finally:
        graph_module._engine_run_backward = original
        autograd_module._engine_run_backward = original


def saved_tensors_below(nodes: list[Any]) -> list[torch.Tensor]:
    """Saved tensors of every Node reachable from ``nodes`` through next_functions (iterative)."""
    seen: set[Any] = set()
    stack = list(nodes)
    found: list[torch.Tensor] = []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if not _autograd.is_accumulate_grad(node):
            saved = _autograd.saved_tensors(node)
            if saved is not None:
                found.extend(saved[1])
            elif _autograd.uses_saved_tensor_hooks(node):
                found.extend(checkpoint_tensors(node))
        stack.extend(producer for producer, _ in node.next_functions)
    return found


def memory_kept(state: SplitState) -> tuple[int, int]:
    """``(retained_bytes, w_needs_bytes)`` of a state between B and W (see module docstring).

    Parameters are counted in neither: they live in the module whatever the state holds, and a Node
    that saved ``W.t()`` shares its storage.
    """
    captured = state.captured_tensors()
    held = state.held_tensors()
    parameters = {tensor.untyped_storage().data_ptr() for tensor in state.weight_tensors()}

    def not_parameters(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [tensor for tensor in tensors if tensor.untyped_storage().data_ptr() not in parameters]

    # a held tensor with a grad_fn would keep that graph alive too (defensive: the formulas hold
    # detached tensors, so this is normally empty)
    held_graphs = [tensor.grad_fn for tensor in held if tensor.grad_fn is not None]
    below = saved_tensors_below(state.held_nodes() + held_graphs)
    retained = distinct_bytes(not_parameters([*captured, *held, *below]))
    own = []
    for node in state.called_nodes():
        saved = _autograd.saved_tensors(node)
        own.extend(saved[1] if saved else [])
    weight_side = saved_tensors_below(state.weight_side_nodes())
    needs = distinct_bytes(not_parameters([*captured, *held, *own, *weight_side]))
    return retained, needs


def _split_pairs(
    forwarded: tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]],
) -> tuple[Any, tuple[list[torch.Tensor], list[torch.Tensor]]]:
    prepared, pairs = forwarded
    return prepared, ([tensor for tensor, _ in pairs], [grad for _, grad in pairs])


def _cotangents(outputs: Any, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    flat = flatten_tensors(outputs)
    return [
        (tensor, torch.randn(tensor.shape, generator=generator).to(tensor.dtype).to(tensor.device))
        for _, tensor in flat
        if tensor.requires_grad and tensor.is_floating_point()
    ]


def benchmark_split(
    module: torch.nn.Module,
    inputs: Any,
    *,
    repeat: int = 10,
    warmup: int = 3,
    device: str | torch.device | None = None,
    compare_pytorch: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> SplitBenchmark:
    """Time and measure full backward, B, W and B+W over repeated microbatches of one stage.

    Args:
        module: the stage (used in place: its ``.grad`` is reset between runs).
        inputs: positional tuple or keyword dict, as a graphkit SPEC returns.
        repeat: measured microbatches; warmup: unmeasured ones first.
        device: move module and inputs there first (``"cuda"`` synchronizes around each timing).
        compare_pytorch: also run ``torch.distributed.pipelining._backward``'s split.
        clock: :func:`time.perf_counter`, or :func:`time.thread_time` on a loaded machine (CPU, one
            thread: see :func:`graphkit.measure.timing.timed`).

    Returns:
        A :class:`SplitBenchmark` (times in seconds, memory in bytes).
    """
    device, parameters = placed_stage(module, device)

    def reset() -> None:
        for parameter in parameters:
            parameter.grad = None

    def forward() -> tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]]:
        prepared = fresh_inputs(inputs, device=device)
        outputs = call_stage(module, prepared)
        return prepared, _cotangents(outputs, 0)

    def stage_inputs(prepared: Any) -> list[torch.Tensor]:
        return [tensor for _, tensor in flatten_tensors(prepared) if tensor.requires_grad]

    full, b, w, b_engine, b_python = [], [], [], [], []
    for _ in range(warmup + repeat):
        reset()
        _, (outputs, grads) = _split_pairs(forward())
        full.append(timed(lambda o=outputs, g=grads: torch.autograd.backward(o, g), device, clock)[0])
        prepared, (outputs, grads) = _split_pairs(forward())
        wanted = stage_inputs(prepared)
        if wanted:  # the engine's own input-gradient call, no graphkit: the floor for B
            b_engine.append(
                timed(
                    lambda o=outputs, g=grads, i=wanted: torch.autograd.grad(o, i, g, allow_unused=True),
                    device,
                    clock,
                )[0]
            )
        reset()
        prepared, (outputs, grads) = _split_pairs(forward())
        with timing_laps(clock) as laps:  # B's engine call, to tell B's Python from it
            b_seconds, state = timed(
                lambda o=outputs, g=grads, p=prepared: backward_input(o, g, p), device, clock
            )
        del outputs, grads  # a pipeline drops the stage outputs after B
        w_seconds, _ = timed(lambda s=state: backward_weight(s), device, clock)
        b.append(b_seconds)
        w.append(w_seconds)
        engine = laps.totals.get("b.engine", 0.0)
        # B's own pieces but its engine call (on CUDA host time: the kernels' tail is in neither)
        b_python.append((sum(laps.totals.values()) - engine, engine))

    # one more microbatch for FLOPs, engine calls and memory
    reset()
    prepared, pairs = forward()
    graph_saved = (
        capture([t for t, _ in pairs], inputs=stage_inputs(prepared)).graph["saved_bytes_total"] or 0
    )
    flops = PhaseFlops()
    with flops.counting("full"):
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    reset()
    prepared, pairs = forward()
    with flops.counting("b"):
        state = backward_input([t for t, _ in pairs], [g for _, g in pairs], prepared)
    del pairs  # the caller drops the stage outputs after B
    retained, needs = memory_kept(state)
    with flops.counting("w"), count_engine_calls() as calls:
        backward_weight(state)

    medians = [statistics.median(values[warmup:]) for values in (full, b, w)]
    result = SplitBenchmark(
        full_s=medians[0],
        b_s=medians[1],
        w_s=medians[2],
        split_s=medians[1] + medians[2],
        flops=flops.backward(),
        w_engine_calls=calls[0],
        retained_bytes=retained,
        w_needs_bytes=needs,
        graph_saved_bytes=int(graph_saved),
        extra={
            "device": str(device),
            "intermediates": state.num_intermediates,
            "path": state.path,  # "no-walk" where B ran without a walk (graphkit.split.weight_queue)
            "b_engine_s": statistics.median(b_engine[warmup:]) if len(b_engine) > warmup else 0.0,
            # B's time outside its engine call, and that engine call (medians, measured inside B)
            "b_python_s": statistics.median(python for python, _ in b_python[warmup:]),
            "b_own_engine_s": statistics.median(engine for _, engine in b_python[warmup:]),
        },
    )
    if compare_pytorch:
        result.extra.update(
            _benchmark_pytorch(forward, stage_inputs, parameters, reset, device, warmup, repeat, clock)
        )
    reset()
    return result


def _benchmark_pytorch(
    forward: Callable[[], Any],
    stage_inputs: Callable[[Any], list[torch.Tensor]],
    parameters: list[torch.Tensor],
    reset: Callable[[], None],
    device: torch.device,
    warmup: int,
    repeat: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """The same microbatches through ``torch.distributed.pipelining._backward`` (B then W)."""
    try:
        from torch.distributed.pipelining import _backward as pipelining
    except ImportError as error:  # a torch build without distributed
        return {"pytorch_error": f"unavailable: {error}"}
    try:
        b_times, w_times = [], []
        flops = PhaseFlops()
        for _ in range(warmup + repeat + 1):
            reset()
            prepared, pairs = forward()
            inputs = stage_inputs(prepared)
            b_seconds, (_, groups) = timed(
                lambda inputs=inputs, pairs=pairs: pipelining.stage_backward_input(
                    [t for t, _ in pairs], [g for _, g in pairs], inputs, iter(parameters)
                ),
                device,
                clock,
            )
            with flops.counting("w"), count_engine_calls() as calls:
                w_seconds, _ = timed(
                    lambda groups=groups: pipelining.stage_backward_weight(iter(parameters), groups), device
                )
            b_times.append(b_seconds)
            w_times.append(w_seconds)
        b_median = statistics.median(b_times[warmup:-1])
        w_median = statistics.median(w_times[warmup:-1])
        return {
            "pytorch_b_s": b_median,
            "pytorch_w_s": w_median,
            "pytorch_split_s": b_median + w_median,
            "pytorch_w_flops": flops.w,
            "pytorch_w_engine_calls": calls[0],
        }
    except Exception as error:  # PyTorch's split fails on some graphs: report it, do not hide it
        cause: BaseException = error
        while cause.__cause__ is not None:  # pipelining wraps the engine's error: report the engine's
            cause = cause.__cause__
        first_line = next((line.strip() for line in str(cause).splitlines() if line.strip()), "")
        return {"pytorch_error": f"{type(cause).__name__}: {first_line[:120]}"}


def format_row(name: str, result: SplitBenchmark) -> str:
    """One line of the benchmark table."""
    extra = result.extra
    pytorch = (
        f"{extra['pytorch_split_s'] / result.full_s:6.2f}x ({extra['pytorch_w_engine_calls']} W calls)"
        if "pytorch_split_s" in extra
        else f"  failed: {extra.get('pytorch_error', '-')[:40]}"
    )
    flops = result.flops
    # FlopCounterMode counts no FLOPs for some ops (LSTM on CPU): nothing to compare then
    flops_column = f"{(flops['b'] + flops['w']) / flops['full']:6.3f}" if flops["full"] else f"{'n/a':>6s}"
    kept = result.retained_bytes / result.w_needs_bytes if result.w_needs_bytes else float("nan")
    floor = extra.get("b_engine_s", 0.0) / result.full_s if result.full_s else float("nan")
    engine = extra.get("b_own_engine_s", 0.0)
    python = extra.get("b_python_s", 0.0) / engine if engine else float("nan")
    return (
        f"{name:24s} {result.full_s * 1e3:8.2f} {result.b_s * 1e3:8.2f} {result.w_s * 1e3:8.2f} "
        f"{result.ratio:6.2f}x {floor:5.2f} {python:5.2f} {flops_column} {result.w_engine_calls:3d} "
        f"{result.retained_bytes / 2**20:8.2f} {kept:5.2f} {result.graph_saved_bytes / 2**20:8.2f}  {pytorch}"
    )


HEADER = (
    f"{'model':24s} {'full ms':>8s} {'B ms':>8s} {'W ms':>8s} {'B+W':>7s} {'Beng':>5s} {'Bpy':>5s} {'FLOPs':>6s} {'Wc':>3s} "
    f"{'kept MiB':>8s} {'/need':>5s} {'graph MiB':>8s}  pytorch (B+W)/full"
)

LEGEND = (
    "times: medians per microbatch; B+W: (B + W) time / full backward time; Beng: torch.autograd.grad to "
    "the stage inputs alone (what B cannot go below) / full; Bpy: B's time outside its own engine call / that engine call's time (on CUDA: host time); FLOPs: (B + W) FLOPs / full; Wc: autograd-engine calls in W; kept MiB: bytes kept alive "
    "from B to W, /need: that over what W cannot do without; graph MiB: saved tensors of the whole stage "
    "graph; pytorch: torch.distributed.pipelining's own split (I + W) / full, with its W's engine calls"
)
"""What the columns of :data:`HEADER` mean, printed under the table."""


@dataclass(slots=True)
class SplitTimeAccount:
    """Where the split's extra time goes on one CPU stage: :func:`account_split_time`'s result.

    Times are seconds per microbatch (medians). ``full_s`` / ``split_s``: wall time of a full backward
    and of B + W, without the profiler. ``full_kernel_s`` / ``split_kernel_s``: the summed self time of
    every ``aten::`` operator under ``torch.profiler`` (the kernels, plus the small view ops Python
    calls). ``operators``: per operator name, ``(full seconds, split seconds, full calls, split calls)``.
    ``intermediates``: intermediates whose gradient B captured.
    """

    full_s: float
    split_s: float
    full_kernel_s: float
    split_kernel_s: float
    intermediates: int
    operators: dict[str, tuple[float, float, int, int]]

    @property
    def added_kernel_s(self) -> float:
        """Operator time the split adds over a full backward."""
        return self.split_kernel_s - self.full_kernel_s

    @property
    def other_s(self) -> float:
        """The rest of (B + W) - full: Python in B and W, hooks, the engine's scheduling."""
        return self.split_s - self.full_s - self.added_kernel_s

    def room_per_intermediate_s(self, target_ratio: float) -> float:
        """Seconds of non-kernel work each intermediate may cost for B + W to stay within
        ``target_ratio`` x full, given the kernel time the split adds (negative: out of reach)."""
        room = (target_ratio - 1.0) * self.full_s - self.added_kernel_s
        return room / self.intermediates if self.intermediates else float("nan")

    def largest_added(self, count: int = 3) -> list[tuple[str, float]]:
        """The ``count`` operators whose time grew most in the split, with the growth in seconds."""
        growth = [(name, split - full) for name, (full, split, _, _) in self.operators.items()]
        return sorted(growth, key=lambda item: -item[1])[:count]


def account_split_time(
    module: torch.nn.Module, inputs: Any, *, repeat: int = 10, warmup: int = 3
) -> SplitTimeAccount:
    """Split (B + W) - full backward into added kernel time and everything else, on CPU.

    Runs microbatches of the stage alternately through a full backward and through B then W: first
    timed by the wall clock, then under ``torch.profiler`` (CPU activity), reading each ``aten::``
    operator's self time. The profiler slows Python down, so the wall times come from the unprofiled
    runs and only operator times from the profiled ones. Each operator's self time also carries some
    of the profiler's own cost, which weighs on tiny operators (views, small copies): before acting on
    a small difference, confirm it by wall time, alternating the two variants in one process.

    Args:
        module: the stage, on CPU (its ``.grad`` is reset between runs).
        inputs: positional tuple or keyword dict, as a graphkit SPEC returns.
        repeat: measured microbatches per kind; warmup: unmeasured ones first.

    Returns:
        A :class:`SplitTimeAccount` (seconds).

    Raises:
        GraphkitInputError: a parameter is not on the CPU (on CUDA the profiler's CPU time of an
            operator is its launch, not its kernel), or ``repeat`` is below 1.
    """
    from torch.profiler import ProfilerActivity, profile

    if repeat < 1:
        raise GraphkitInputError(f"repeat must be at least 1, got {repeat}")
    parameters = [p for p in module.parameters() if p.requires_grad]
    if any(p.device.type != "cpu" for p in parameters):
        raise GraphkitInputError(
            "account_split_time measures CPU operators; move the stage to the CPU first (on CUDA, use "
            "benchmark_split for times and a CUDA profiler for kernels)"
        )
    cpu = torch.device("cpu")

    def microbatch(split: bool) -> Callable[[], Any]:
        for parameter in parameters:
            parameter.grad = None
        prepared = fresh_inputs(inputs, device=cpu)
        pairs = _cotangents(call_stage(module, prepared), 0)
        outputs, grads = [t for t, _ in pairs], [g for _, g in pairs]
        if split:
            return lambda: backward_weight(backward_input(outputs, grads, prepared))
        return lambda: torch.autograd.backward(outputs, grads)

    wall: dict[bool, list[float]] = {False: [], True: []}
    for round_index in range(warmup + repeat):
        for split in (False, True):
            step = microbatch(split)
            seconds, _ = timed(step, cpu)
            if round_index >= warmup:
                wall[split].append(seconds)

    per_operator: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
    calls: dict[bool, dict[str, int]] = {False: {}, True: {}}
    totals: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeat):
        for split in (False, True):
            step = microbatch(split)
            with profile(activities=[ProfilerActivity.CPU]) as profiler:
                step()
            total = 0.0
            for event in profiler.key_averages():
                if not event.key.startswith("aten::"):
                    continue
                seconds = event.self_cpu_time_total * 1e-6
                total += seconds
                per_operator[split].setdefault(event.key, []).append(seconds)
                calls[split][event.key] = event.count
            totals[split].append(total)

    def median_of(split: bool, name: str) -> float:
        values = per_operator[split].get(name, [])
        return statistics.median(values + [0.0] * (repeat - len(values))) if values else 0.0

    names = set(per_operator[False]) | set(per_operator[True])
    # one more split microbatch, for the number of intermediates
    prepared = fresh_inputs(inputs, device=cpu)
    pairs = _cotangents(call_stage(module, prepared), 0)
    state = backward_input([t for t, _ in pairs], [g for _, g in pairs], prepared)
    backward_weight(state)
    for parameter in parameters:
        parameter.grad = None
    return SplitTimeAccount(
        full_s=statistics.median(wall[False]),
        split_s=statistics.median(wall[True]),
        full_kernel_s=statistics.median(totals[False]),
        split_kernel_s=statistics.median(totals[True]),
        intermediates=state.num_intermediates,
        operators={
            name: (
                median_of(False, name),
                median_of(True, name),
                calls[False].get(name, 0),
                calls[True].get(name, 0),
            )
            for name in sorted(names)
        },
    )


def bench_spec(
    spec: str,
    *,
    repeat: int = 10,
    as_json: bool = False,
    device: str | None = None,
    threads: int | None = None,
) -> int:
    """``graphkit bench SPEC``: print the benchmark of one model spec; returns the exit status.

    ``threads`` sets ``torch.set_num_threads`` first (None: PyTorch's default).
    """
    if threads is not None:
        if threads < 1:
            raise GraphkitInputError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    module, inputs = load_spec(spec)
    result = benchmark_split(module, inputs, repeat=repeat, device=device)
    if as_json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(HEADER)
        print(format_row(spec, result))
        print(textwrap.fill(LEGEND, width=110))
    return 0


@dataclass(slots=True)
class SplitBreakdown:
    """Where B's and W's time goes per microbatch: :func:`breakdown_split`'s result (seconds, medians).

    ``full_s``, ``b_s``, ``w_s``: wall time of a full backward, B and W (alternating microbatches).
    ``pieces``: per piece of B (``"b.walk"``, ``"b.engine"``, ...) and W (``"w.formulas"``, ``"w.engine"``,
    ...) the median time (:mod:`graphkit.split.laps`); ``"b.other"`` / ``"w.other"``: the call's time the
    pieces do not cover (argument passing, the context managers around the phase).
    """

    full_s: float
    b_s: float
    w_s: float
    pieces: dict[str, float]
    intermediates: int

    def python_s(self, phase: str) -> float:
        """Time of ``phase`` (``"b"`` or ``"w"``) outside its engine call and, for W, its formulas."""
        own = {f"{phase}.engine", f"{phase}.formulas"} if phase == "w" else {f"{phase}.engine"}
        total = self.b_s if phase == "b" else self.w_s
        return total - sum(self.pieces.get(name, 0.0) for name in own)


def microbatch_forward(
    module: torch.nn.Module, inputs: Any
) -> tuple[
    list[torch.Tensor], torch.device, Callable[[], tuple[Any, list[torch.Tensor], list[torch.Tensor]]]
]:
    """What a benchmark needs to run one microbatch after another through a stage.

    Returns the stage's parameters that require grad, their device (the CPU for a stage without
    any), and ``forward()``: it resets those parameters' ``.grad`` to None, runs the stage on fresh
    copies of ``inputs`` (positional tuple or keyword dict, moved to that device) and returns the
    prepared inputs, the outputs that require grad and a fixed random cotangent for each (seed 0).
    """
    parameters = [p for p in module.parameters() if p.requires_grad]
    device = parameters[0].device if parameters else torch.device("cpu")

    def forward() -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
        for parameter in parameters:
            parameter.grad = None
        prepared = fresh_inputs(inputs, device=device)
        pairs = _cotangents(call_stage(module, prepared), 0)
        return prepared, [t for t, _ in pairs], [g for _, g in pairs]

    return parameters, device, forward


def breakdown_split(
    module: torch.nn.Module,
    inputs: Any,
    *,
    repeat: int = 20,
    warmup: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> SplitBreakdown:
    """Time every piece of B and W (:func:`graphkit.split.laps.timing_laps`) against a full backward.

    Microbatches alternate between a full backward and B then W, in one process; each piece's figure is
    its median over ``repeat`` microbatches after ``warmup``. Runs where the stage's parameters are.
    """
    if repeat < 1:
        raise GraphkitInputError(f"repeat must be at least 1, got {repeat}")
    parameters, device, forward = microbatch_forward(module, inputs)
    full, b, w, pieces = [], [], [], []
    intermediates = 0
    for _ in range(warmup + repeat):
        _, outputs, grads = forward()
        full.append(timed(lambda o=outputs, g=grads: torch.autograd.backward(o, g), device, clock)[0])
        prepared, outputs, grads = forward()
        with timing_laps(clock) as laps:
            b_seconds, state = timed(
                lambda o=outputs, g=grads, p=prepared: backward_input(o, g, p), device, clock
            )
            del outputs, grads
            intermediates = state.num_intermediates
            w_seconds, _ = timed(lambda s=state: backward_weight(s), device, clock)
        totals = dict(laps.totals)
        totals["b.other"] = b_seconds - sum(v for k, v in totals.items() if k.startswith("b."))
        totals["w.other"] = w_seconds - sum(v for k, v in totals.items() if k.startswith("w."))
        b.append(b_seconds)
        w.append(w_seconds)
        pieces.append(totals)
    for parameter in parameters:
        parameter.grad = None
    names = sorted({name for totals in pieces for name in totals})
    return SplitBreakdown(
        full_s=statistics.median(full[warmup:]),
        b_s=statistics.median(b[warmup:]),
        w_s=statistics.median(w[warmup:]),
        pieces={
            name: statistics.median(totals.get(name, 0.0) for totals in pieces[warmup:]) for name in names
        },
        intermediates=intermediates,
    )
