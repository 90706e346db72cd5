"""Time one ``torch.distributed.pipelining`` schedule step with PyTorch's stages and with graphkit's.

    python bench/pipeline.py                       # 8 transformer layers d=256, 8 microbatches, 2 gloo ranks
    python bench/pipeline.py --schedule InterleavedZeroBubble --repeat 20
    python bench/pipeline.py --ranks 1 --device cuda   # all stages on one GPU (one process)
    python bench/pipeline.py --spec zoo-pipeline:mlp_wide --batch 64   # any pipeline spec instead
    python bench/pipeline.py --pin-cores            # each rank on one CPU core (Linux): steadier steps

The model is ``--layers`` ``nn.TransformerEncoderLayer`` (``--width``, 4 heads, feed-forward 4 x width,
no dropout) cut into ``2 x ranks`` stages, float32, a batch of ``--microbatches`` x ``--batch`` sequences
of ``--seq`` tokens; or ``--spec``, any pipeline spec (:mod:`graphkit.models.pipeline_specs`, the format
every pipeline command takes), built with ``2 x ranks`` stages and ``--microbatches x --batch`` rows.
In the same processes, the same weights run one schedule with
``torch.distributed.pipelining.PipelineStage`` and one with ``graphkit.pipelining.PipelineStage``, steps
alternating between them after warm-up, the one that goes first swapping every step; each step is timed
between barriers on every rank, and the
slowest rank counts. Printed: the median and the fastest step time of each, and graphkit's ratios over
PyTorch's. Not a test: run it by hand (the numbers depend on the machine's load).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphkit.measure.paired_rounds import balanced_order  # noqa: E402
from graphkit.models.pipeline_specs import load_pipeline_spec  # noqa: E402
from graphkit.pipelining.launcher import local_process_group, run_on_processes  # noqa: E402
from graphkit.pipelining.schedules import build_schedule, stage_indices  # noqa: E402


def _layers(arguments: argparse.Namespace, device: torch.device) -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.TransformerEncoderLayer(
            arguments.width, 4, dim_feedforward=4 * arguments.width, dropout=0.0, batch_first=True
        ).to(device)
        for _ in range(arguments.layers)
    ]


def _stage_modules(arguments: argparse.Namespace, device: torch.device, num_stages: int) -> list[nn.Module]:
    layers = _layers(arguments, device)
    per_stage = len(layers) // num_stages
    return [
        nn.Sequential(*layers[index * per_stage : (index + 1) * per_stage]) for index in range(num_stages)
    ]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(arguments: argparse.Namespace) -> dict[str, list[float]]:
    """On every rank: build both pipelines, warm up, then time alternating steps (seconds each)."""
    from torch.distributed.pipelining import PipelineStage as TorchStage

    from graphkit.pipelining import PipelineStage as GraphkitStage

    torch.set_num_threads(arguments.threads)
    device = torch.device(arguments.device)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    num_stages = 2 * ranks
    mine = stage_indices(arguments.schedule, rank, ranks)
    torch.manual_seed(1)
    batch = arguments.microbatches * arguments.batch
    inputs = torch.randn(batch, arguments.seq, arguments.width, device=device)
    target = torch.randn(batch, arguments.seq, arguments.width, device=device)

    def loss_fn(output: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, goal)

    def stage_modules() -> list[nn.Module]:
        if arguments.spec is None:
            return _stage_modules(arguments, device, num_stages)
        model = load_pipeline_spec(arguments.spec, num_stages=num_stages, batch_size=batch, seed=0)
        return [module.to(device) for module in model.stages]

    if arguments.spec is not None:  # the spec's own batch and loss
        model = load_pipeline_spec(arguments.spec, num_stages=num_stages, batch_size=batch, seed=0)
        (inputs, *_), target, loss_fn = model.inputs, model.schedule_target().to(device), model.loss_fn
        inputs = inputs.to(device)

    schedules = {}
    for name, stage_class in (("torch", TorchStage), ("graphkit", GraphkitStage)):
        modules = stage_modules()
        stages = [stage_class(modules[index], index, num_stages, device) for index in mine]
        schedules[name] = (
            build_schedule(arguments.schedule, stages, arguments.microbatches, loss_fn, ranks=ranks),
            modules,
        )
    times: dict[str, list[float]] = {"torch": [], "graphkit": []}
    names = list(schedules)
    for repeat in range(arguments.warmup + arguments.repeat):
        for position in balanced_order(
            repeat, len(names)
        ):  # each stage class takes each place, and follows each other, alike
            name = names[position]
            schedule, modules = schedules[name]
            for index in mine:
                modules[index].zero_grad(set_to_none=True)
            _synchronize(device)
            dist.barrier()
            start = time.perf_counter()
            schedule.step(inputs, target=target)
            _synchronize(device)
            dist.barrier()
            if repeat >= arguments.warmup:
                times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="ZBVZeroBubble")
    parser.add_argument(
        "--spec", metavar="PIPELINE_SPEC", help="a pipeline spec instead of the transformer layers"
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4, help="sequences per microbatch")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="intra-op CPU threads per rank")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda with --ranks 1")
    parser.add_argument(
        "--pin-cores", action="store_true", help="run each rank on one CPU core (Linux): steadier steps"
    )
    arguments = parser.parse_args()
    if arguments.spec is None and arguments.layers % (2 * arguments.ranks):
        parser.error(f"--layers must be a multiple of 2 x ranks = {2 * arguments.ranks}")
    if arguments.ranks == 1:
        with local_process_group():
            per_rank = [time_steps(arguments)]
    else:
        if arguments.device != "cpu":
            parser.error("several ranks run on CPU (gloo) here; use --ranks 1 on a GPU")
        per_rank = run_on_processes(
            time_steps,
            (arguments,),
            world_size=arguments.ranks,
            deadline=1800,
            pin_cores=arguments.pin_cores,
        )
    # a step lasts as long as its slowest rank
    steps = {
        name: [max(rank[name][index] for rank in per_rank) for index in range(arguments.repeat)]
        for name in per_rank[0]
    }
    medians = {name: statistics.median(values) for name, values in steps.items()}
    fastest = {name: min(values) for name, values in steps.items()}
    model = (
        f"{arguments.spec}, {arguments.microbatches} microbatches of {arguments.batch}"
        if arguments.spec
        else f"{arguments.layers} transformer layers d={arguments.width}, "
        f"{arguments.microbatches} microbatches of {arguments.batch}x{arguments.seq}"
    )
    print(
        f"{arguments.schedule}: {model}, {arguments.ranks} rank(s), "
        f"{arguments.device}, {arguments.repeat} steps after {arguments.warmup} warm-up"
    )
    for name in ("torch", "graphkit"):
        print(
            f"  {name:9s} stage: median step {medians[name] * 1e3:8.2f} ms, fastest {fastest[name] * 1e3:8.2f} ms"
        )
    print(
        f"  ratio graphkit / torch: {medians['graphkit'] / medians['torch']:.3f} (median), "
        f"{fastest['graphkit'] / fastest['torch']:.3f} (fastest)"
    )


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    main()
