"""The cost-aware schedule: per rank and microbatch a full backward B or I then W, never predicted slower
than 1F1B, ZB-H1 or ZB-H2 under the same costs and memory limit (a property over random costs), the
simulator's table for this CPU's costs and the ZB paper's, its CSV run by name, and - over real gloo ranks -
exact through verify-pipeline for 2 and 4 stages."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graphkit.pipelining.planning import (
    ScheduleError,
    StageCost,
    adaptive_schedule,
    cost_aware_schedule,
    fold_schedule,
    generated_order,
    gpipe,
    one_f_one_b,
    simulate,
    split_last,
    write_schedule_csv,
    zb_h1,
    zb_h2,
)
from graphkit.pipelining.schedules import schedule_order

HANDCRAFTED = (one_f_one_b, zb_h1, zb_h2)
CPU = StageCost(6.0, 5.6, 12.7, full_backward=12.7)  # ms, mlp_wide's last stage on this CPU (I + W = 1.44 B)
ZB_PAPER = StageCost(1.0, 1.0, 1.0, full_backward=2.0)  # F = I = W, B = 2F


def step(order, costs) -> float:
    return simulate(order, costs).step_seconds


@st.composite
def stage_costs(draw: st.DrawFn) -> StageCost:
    seconds = st.floats(0.1, 10.0, allow_nan=False, allow_infinity=False)
    backward_input, backward_weight = draw(seconds), draw(seconds)
    # a full backward from "as cheap as the larger half" to "dearer than the split"
    full = draw(st.floats(max(backward_input, backward_weight), 1.5 * (backward_input + backward_weight)))
    return StageCost(
        draw(seconds),
        backward_input,
        backward_weight,
        full_backward=full,
        activation_bytes=draw(st.integers(1, 100)),
        weight_bytes=draw(st.integers(0, 100)),
    )


@given(
    data=st.data(),
    ranks=st.integers(1, 4),
    microbatches=st.integers(1, 8),
    same_costs=st.booleans(),
    limit_factor=st.one_of(st.none(), st.floats(0.3, 3.0)),
)
def test_never_predicted_slower_than_1f1b_zbh1_zbh2_or_adaptive_within_the_memory_limit(
    data, ranks, microbatches, same_costs, limit_factor
):
    one = data.draw(stage_costs())
    costs = [one] * ranks if same_costs else [data.draw(stage_costs()) for _ in range(ranks)]
    limit = None
    if limit_factor is not None:  # from a third of 1F1B's peak (only the adaptive order may fit) to 3x
        limit = limit_factor * max(simulate(one_f_one_b(ranks, microbatches), costs).peak_memory_bytes)
    rivals = [generate(ranks, microbatches) for generate in HANDCRAFTED]
    with contextlib.suppress(ScheduleError):  # nothing fits the limit
        rivals.append(adaptive_schedule(costs, ranks, microbatches, memory_limit=limit))
    fitting = [
        result.step_seconds
        for result in (simulate(order, costs) for order in rivals)
        if limit is None or max(result.peak_memory_bytes) <= limit
    ]
    if not fitting:
        with pytest.raises(ScheduleError, match="no schedule tried fits the memory limit"):
            cost_aware_schedule(costs, ranks, microbatches, memory_limit=limit)
        return
    order = cost_aware_schedule(costs, ranks, microbatches, memory_limit=limit)
    result = simulate(order, costs, microbatches=microbatches)  # raises on a missing action or a deadlock
    assert {a.kind for row in order.values() for a in row} <= {"F", "B", "I", "W"}
    for (
        row
    ) in order.values():  # weight gradients accumulate in microbatch order: bit for bit a full backward's
        weights = [a.microbatch for a in row if a.kind in "BW"]
        assert weights == sorted(weights)
    if limit is not None:
        assert max(result.peak_memory_bytes) <= limit
    assert result.step_seconds <= min(fitting)


def test_each_microbatch_is_one_full_backward_or_one_i_and_one_w():
    order = cost_aware_schedule(CPU, 4, 8)
    for rank, row in order.items():
        for mb in range(8):
            kinds = sorted(a.kind for a in row if a.microbatch == mb and a.kind != "F")
            assert kinds in (["B"], ["I", "W"]), (rank, mb, kinds)


def test_split_last_k_is_1f1b_with_its_last_backwards_split_and_their_ws_at_the_end():
    assert split_last(3, 4, [0, 0, 0]) == one_f_one_b(3, 4)
    order = split_last(2, 4, [0, 2])
    assert [str(a) for a in order[1]] == [
        "1F0",
        "1B0",
        "1F1",
        "1B1",
        "1F2",
        "1I2",
        "1F3",
        "1I3",
        "1W2",
        "1W3",
    ]
    with pytest.raises(ValueError, match="0 .. 4 for each of 2 ranks"):
        split_last(2, 4, [0, 5])


# The table, reproduced: 1F1B's step over ZB-H1's, ZB-H2's and the cost-aware one's.
@pytest.mark.parametrize(
    ("ranks", "microbatches", "zb_ratio", "at_most"),
    [(2, 8, 1.191, 0.965), (4, 8, 1.033, 0.945), (8, 16, 1.002, 0.950)],
)
def test_on_this_cpus_costs_splitting_every_backward_loses_and_splitting_a_few_wins(
    ranks, microbatches, zb_ratio, at_most
):
    base = step(one_f_one_b(ranks, microbatches), CPU)
    assert step(zb_h1(ranks, microbatches), CPU) / base == pytest.approx(zb_ratio, abs=5e-4)
    assert step(zb_h2(ranks, microbatches), CPU) / base == pytest.approx(zb_ratio, abs=5e-4)
    order = cost_aware_schedule(CPU, ranks, microbatches)
    assert step(order, CPU) / base <= at_most  # >= 3.5% below 1F1B
    full = sum(a.kind == "B" for row in order.values() for a in row)
    assert ranks * microbatches // 2 < full < ranks * microbatches  # most backwards full, some split


@pytest.mark.parametrize(("ranks", "microbatches"), [(2, 8), (4, 8), (8, 16)])
def test_with_the_zb_papers_costs_it_is_within_one_percent_of_the_best_handcrafted_schedule(
    ranks, microbatches
):
    best = min(step(generate(ranks, microbatches), ZB_PAPER) for generate in (gpipe, *HANDCRAFTED))
    assert step(cost_aware_schedule(ZB_PAPER, ranks, microbatches), ZB_PAPER) <= 1.01 * best
    assert step(zb_h2(4, 8), ZB_PAPER) / step(one_f_one_b(4, 8), ZB_PAPER) == pytest.approx(27 / 33)


def test_a_memory_limit_below_one_microbatch_is_refused_with_the_smallest_peak_tried():
    costs = StageCost(1.0, 1.0, 1.0, activation_bytes=10, weight_bytes=4)
    with pytest.raises(ScheduleError, match="smallest peak of 1F1B, ZB-H1 and ZB-H2 is 20 bytes"):
        cost_aware_schedule(costs, 2, 4, memory_limit=5)


def test_costaware_by_name_mixes_full_and_split_backwards():
    order = generated_order("costaware", 2, 8)
    assert {action.kind for row in order.rows for action in row} == {"F", "B", "I", "W"}
    assert order.name == "CostAware" and schedule_order("CostAware", 2, 8) == order


# --- over real gloo ranks -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (2, 8), (4, 8)])
def test_verify_pipeline_finds_it_exact_over_two_gloo_ranks(tmp_path, capsys, stages, microbatches):
    from graphkit.cli import main

    if stages == 2:
        schedule = "CostAware"
    else:  # built for 4 stages from this CPU's costs, folded onto 2 ranks (two stages each, looped)
        order = fold_schedule(cost_aware_schedule(CPU, 4, microbatches), 2, CPU)
        assert {a.kind for row in order.values() for a in row} == {"F", "B", "I", "W"}
        path = tmp_path / "cost_aware_4stages.csv"
        write_schedule_csv(order, path)
        schedule = f"csv:{path}"
    argv = ["verify-pipeline", "zoo-pipeline:mlp", "--schedule", schedule, "--ranks", "2"]
    assert main([*argv, "--microbatches", str(microbatches), "--json"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert '"exact": true' in out and '"ok": true' in out
