"""Generated schedules: complete and deadlock-free by the simulator, loadable by PyTorch's runtime from CSV,
1F1B identical to PyTorch's, and the adaptive schedule no slower than the handcrafted ones it competes with
under the same memory limit."""

from __future__ import annotations

import random

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from graphkit.pipelining.planning.actions import (
    ScheduleError,
    read_schedule_csv,
    schedule_actions,
    write_schedule_csv,
)
from graphkit.pipelining.planning.adaptive import adaptive_schedule
from graphkit.pipelining.planning.cost_model import CommModel, StageCost
from graphkit.pipelining.planning.generation import SCHEDULES, one_f_one_b, zb_h1
from graphkit.pipelining.planning.simulator import simulate
from tests.schedule_stages import fake_stage

A, K = 10, 4
UNIT = StageCost(1.0, 1.0, 1.0, activation_bytes=A, weight_bytes=K)
GRID = [(p, m) for p in (2, 4, 8) for m in (4, 8, 16)]
COMM = CommModel(latency=0.05, bandwidth=1000.0)


def unequal_costs(p: int, seed: int) -> list[StageCost]:
    rng = random.Random(seed)
    return [
        StageCost(
            rng.uniform(0.5, 2.0),
            rng.uniform(0.5, 2.0),
            rng.uniform(0.2, 2.0),
            activation_bytes=100,
            weight_bytes=30,
            output_bytes=40,
            input_grad_bytes=40,
        )
        for _ in range(p)
    ]


def assert_one_stage_per_rank(order, p, m, split):
    assert sorted(order) == list(range(p))
    for rank, actions in order.items():
        assert {a.stage for a in actions} == {rank}
        kinds = "FIW" if split else "FB"
        for kind in kinds:  # each kind in microbatch order, every microbatch once
            assert [a.microbatch for a in actions if a.kind == kind] == list(range(m))


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_every_handcrafted_schedule_is_complete_and_deadlock_free(name, p, m, seed):
    order = SCHEDULES[name](p, m)
    assert_one_stage_per_rank(order, p, m, split=name.startswith("ZB"))
    costs = UNIT if seed is None else unequal_costs(p, seed)
    result = simulate(order, costs, COMM)  # raises on a deadlock or a missing action
    assert len(result.actions) == p * m * (3 if name.startswith("ZB") else 2)


def test_1f1b_is_pytorchs_1f1b_order_on_every_rank_but_the_last():
    """PyTorch's IR for the last rank starts at microbatch 1 (see test_schedule_simulator); elsewhere equal."""
    p, m = 4, 8
    theirs = schedule_actions(torch_schedules.Schedule1F1B(fake_stage(0, p), m))
    ours = one_f_one_b(p, m)
    assert [theirs[rank] for rank in range(p - 1)] == [ours[rank] for rank in range(p - 1)]


@pytest.mark.parametrize(("p", "m"), [(2, 4), (2, 8), (4, 4), (4, 8)])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_csv_loads_into_pytorchs_runtime_and_round_trips(tmp_path, name, p, m):
    order = SCHEDULES[name](p, m)
    path = tmp_path / f"{name}.csv"
    write_schedule_csv(order, path)
    runtime = torch_schedules._PipelineScheduleRuntime([fake_stage(0, p)], m)
    runtime._load_csv(str(path), format="compute_only")
    assert schedule_actions(runtime.pipeline_order) == order
    assert runtime.stage_index_to_group_rank == {stage: stage for stage in range(p)}
    assert read_schedule_csv(path) == order
    # the lowered order with sends and receives predicts the same step
    assert (
        simulate(runtime.pipeline_order_with_comms, UNIT).step_seconds == simulate(order, UNIT).step_seconds
    )


@pytest.mark.parametrize(("p", "m"), GRID)
def test_adaptive_with_unit_costs_reaches_the_best_step(p, m):
    """A memory limit of 1F1B's peak on rank 0 (p activations) on every rank gives ZB-H1's ``3m + p - 1``
    when m >= p; no limit gives that step too, the lower bound: the last rank starts at p - 1 and has 3m
    of work."""
    for limit in (p * A, None):
        order = adaptive_schedule(UNIT, p, m, memory_limit=limit)
        assert_one_stage_per_rank(order, p, m, split=True)
        result = simulate(order, UNIT)
        if limit is not None:
            assert max(result.peak_memory_bytes) <= limit
        if m >= p:
            assert result.step_seconds == 3 * m + p - 1
        assert result.step_seconds <= simulate(one_f_one_b(p, m), UNIT).step_seconds


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_adaptive_with_unequal_costs_respects_memory_and_beats_1f1b(p, m, seed):
    costs = unequal_costs(p, seed)
    h1 = simulate(zb_h1(p, m), costs, COMM)
    limit = max(h1.peak_memory_bytes)
    order = adaptive_schedule(costs, p, m, memory_limit=limit, comm=COMM)
    assert_one_stage_per_rank(order, p, m, split=True)
    result = simulate(order, costs, COMM)
    assert max(result.peak_memory_bytes) <= limit
    assert result.step_seconds <= h1.step_seconds
    assert result.step_seconds < simulate(one_f_one_b(p, m), costs, COMM).step_seconds


def test_adaptive_fills_idle_time_with_w_under_a_tight_limit():
    """Per-rank limits of 1F1B's activations plus one pending W: every rank still completes."""
    p, m = 4, 8
    limits = [(p - i) * A + K for i in range(p)]
    result = simulate(adaptive_schedule(UNIT, p, m, memory_limit=limits), UNIT)
    assert all(peak <= limit for peak, limit in zip(result.peak_memory_bytes, limits, strict=True))
    assert result.step_seconds < simulate(one_f_one_b(p, m), UNIT).step_seconds


def test_adaptive_refuses_a_limit_below_one_microbatch():
    with pytest.raises(ScheduleError, match="no schedule fits the memory limit"):
        adaptive_schedule(UNIT, 2, 4, memory_limit=A - 1)
    with pytest.raises(ValueError, match="F and I must take time"):
        adaptive_schedule(StageCost(0.0, 1.0, 1.0), 2, 4)
