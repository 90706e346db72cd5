"""A zero-bubble pipeline trained with ``torch.distributed.pipelining`` and graphkit's exact split backward.

    .venv/bin/torchrun --nproc-per-node 2 examples/zero_bubble_torchrun.py
    .venv/bin/torchrun --nproc-per-node 2 examples/zero_bubble_torchrun.py --steps 20 --microbatches 8
    .venv/bin/torchrun --nproc-per-node 2 examples/zero_bubble_torchrun.py --stock   # PyTorch's own stage, to compare

Each of the two ranks holds two of four stages in a V (``ScheduleZBVZeroBubble``: rank 0 holds stages 0
and 3, rank 1 stages 1 and 2). Every stage is a small residual MLP whose output is scaled by a learned
``log_scale.exp()`` and whose two layers share one gain parameter. The only graphkit line is the import of
``PipelineStage``. With ``--stock`` the losses come out the same on this graph, but PyTorch's split stages
never fire their parameters' post-accumulate-grad hooks, so DDP, optimizer-in-backward and comm hooks
would silently miss them; the graphs on which PyTorch's own split crashes or gives wrong gradients are
listed in docs/pipelining.md (``graphkit verify-pipeline ... --stage torch`` shows each).

On CPU the ranks talk over gloo; with CUDA, each rank takes one GPU and nccl. The last stage's rank prints
the mean loss of each step, and every rank reports how often its parameters' post-accumulate-grad hooks
fired (once per parameter and microbatch is what DDP needs) and, with graphkit's stage, how many backwards
its stages ran, in the schedules' letters: I (input-gradient backward, the ZB paper's B), W (weight-gradient
backward) and B (full backward).
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import ScheduleZBVZeroBubble

from graphkit.pipelining import PipelineStage

WIDTH = 32


class Block(nn.Module):
    """``x + log_scale.exp() * second(tanh(first(x) * gain) * gain)``: one gain shared by both layers."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(WIDTH, WIDTH)
        self.second = nn.Linear(WIDTH, WIDTH)
        self.gain = nn.Parameter(torch.ones(WIDTH))
        self.log_scale = nn.Parameter(torch.tensor(-1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.first(x) * self.gain) * self.gain
        return x + self.log_scale.exp() * self.second(hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument(
        "--stock", action="store_true", help="use torch.distributed.pipelining's PipelineStage"
    )
    arguments = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=60))

    num_stages = 2 * world
    torch.manual_seed(0)  # every rank builds the same model, then keeps its own stages
    blocks = [Block() for _ in range(num_stages)]
    inputs = torch.randn(8 * arguments.microbatches, WIDTH)
    target = torch.sin(inputs * 3)
    mine = sorted({rank, num_stages - 1 - rank})  # the V of ScheduleZBVZeroBubble
    stage_class = torch.distributed.pipelining.PipelineStage if arguments.stock else PipelineStage
    stages = [stage_class(blocks[index].to(device), index, num_stages, device) for index in mine]
    parameters = [parameter for index in mine for parameter in blocks[index].parameters()]
    hook_calls = [0]  # post-accumulate-grad hooks fired: what DDP's gradient all-reduce waits for

    def count_hook(_: torch.Tensor) -> None:
        hook_calls[0] += 1

    hooks = [parameter.register_post_accumulate_grad_hook(count_hook) for parameter in parameters]
    optimizer = torch.optim.SGD(parameters, lr=0.05)
    schedule = ScheduleZBVZeroBubble(
        stages, arguments.microbatches, loss_fn=lambda output, goal: nn.functional.mse_loss(output, goal)
    )
    for step in range(arguments.steps):
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        schedule.step(inputs.to(device), target=target.to(device), losses=losses)
        optimizer.step()
        if losses:  # the rank that holds the last stage
            print(f"step {step}: loss {torch.stack(losses).mean().item():.6f}", flush=True)
    for hook in hooks:
        hook.remove()
    expected = len(parameters) * arguments.microbatches * arguments.steps
    print(
        f"rank {rank}: post-accumulate-grad hooks fired {hook_calls[0]} of {expected} times "
        f"({len(parameters)} parameters x {arguments.microbatches} microbatches x {arguments.steps} steps)",
        flush=True,
    )
    if not arguments.stock:
        calls = [stage.backward_calls for stage in stages]
        print(
            f"rank {rank}: stages {mine} ran {sum(c.input for c in calls)} I, {sum(c.weight for c in calls)} W "
            f"(graphkit's split: I = input-gradient backward, the ZB paper's B; W = weight-gradient backward) "
            f"and {sum(c.full for c in calls)} B (full backward)",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
