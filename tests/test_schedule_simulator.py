"""The schedule simulator against closed forms: unit costs (F = I = W = 1, full B = 2, free messages), hand
traces of small schedules, and PyTorch's own schedules read from their ``pipeline_order``.

Closed forms (p ranks, m microbatches, rank i = stage i, A activation bytes, K bytes I keeps for W):

- 1F1B and GPipe: step ``3(m + p - 1)``; every rank idles ``3(p - 1)``, a bubble of ``(p-1)/(m+p-1)``;
  peak memory ``min(p - i, m) * A`` (1F1B), ``m * A`` (GPipe);
- ZB-H1 (m >= p): step ``3m + p - 1`` = ``m(F+B+W) + (p-1)(F+B-W)``, the ZB paper's bubble
  ``(p-1)(T_F + T_B - T_W)`` (§3.1, Table 1), a third of 1F1B's; peak ``(p - i) A + i K`` (rank 0: 1F1B's);
- ZB-H2 (m >= 2p - 1): in a synchronous step (the optimizer step waits for every rank, as PyTorch's runtime
  runs it) its step is ZB-H1's, ``3m + p - 1``, at up to twice the memory: peak ``(2p-1-2i) A + 2i K``. Each
  rank is busy without a gap from its first action to its last, ``3m`` (the paper's bubble
  ``(p-1)(T_F + T_B - 2T_W) = 0`` counts each rank from its own start: zero only when the next step's
  forwards start before this step's optimizer step, a synchronization PyTorch's runtime does not bypass);
  with ``p <= m < 2p - 2`` it is slower than ZB-H1.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from graphkit.pipelining.planning.actions import Action, ScheduleError, read_schedule_csv, schedule_actions
from graphkit.pipelining.planning.cost_model import CommModel, StageCost
from graphkit.pipelining.planning.generation import gpipe, one_f_one_b, zb_h1, zb_h2
from graphkit.pipelining.planning.simulator import DeadlockError, IncompleteScheduleError, simulate
from tests.schedule_stages import fake_stage

A, K = 10, 4  # activation bytes, bytes I keeps for W
UNIT = StageCost(1.0, 1.0, 1.0, activation_bytes=A, weight_bytes=K)
GRID = [(p, m) for p in (2, 4, 8) for m in (4, 8, 16)]
SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize(("p", "m"), GRID)
def test_1f1b_matches_its_closed_form(p, m):
    result = simulate(one_f_one_b(p, m), UNIT)
    assert result.step_seconds == 3 * (m + p - 1)
    assert result.idle_seconds == [3 * (p - 1)] * p
    assert result.rank_bubble_fractions == pytest.approx([(p - 1) / (m + p - 1)] * p)
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert result.peak_memory_bytes == [min(p - i, m) * A for i in range(p)]
    assert result.messages == 2 * (p - 1) * m


@pytest.mark.parametrize(("p", "m"), GRID)
def test_gpipe_has_1f1bs_step_and_holds_every_microbatch(p, m):
    result = simulate(gpipe(p, m), UNIT)
    assert result.step_seconds == 3 * (m + p - 1)
    assert result.peak_memory_bytes == [m * A] * p


@pytest.mark.parametrize(("p", "m"), [(p, m) for p, m in GRID if m >= p])
def test_zb_h1_has_a_third_of_1f1bs_bubble_at_1f1bs_peak(p, m):
    result = simulate(zb_h1(p, m), UNIT)
    f, b, w = 1, 1, 1
    assert result.step_seconds == 3 * m + p - 1 == m * (f + b + w) + (p - 1) * (f + b - w)
    assert result.idle_seconds == [p - 1] * p  # (p-1)(T_F + T_B - T_W), 1F1B's is 3(p-1)
    assert result.peak_memory_bytes == [(p - i) * A + i * K for i in range(p)]
    assert result.peak_memory_bytes[0] == max(simulate(one_f_one_b(p, m), UNIT).peak_memory_bytes)


@pytest.mark.parametrize(("p", "m"), [(p, m) for p, m in GRID if m >= 2 * p - 1])
def test_zb_h2_steps_as_long_as_zb_h1_in_a_synchronous_step_and_holds_up_to_twice_the_memory(p, m):
    result = simulate(zb_h2(p, m), UNIT)
    h1 = simulate(zb_h1(p, m), UNIT)
    assert result.step_seconds == h1.step_seconds == 3 * m + p - 1  # not 3m: the step waits for every rank
    assert result.peak_memory_bytes == [(2 * p - 1 - 2 * i) * A + 2 * i * K for i in range(p)]
    assert max(h1.peak_memory_bytes) < max(result.peak_memory_bytes) < 2 * max(h1.peak_memory_bytes)
    # what the paper's zero bubble counts: each rank from its own first action, busy without a gap, 3m
    assert result.rank_span_seconds == [3 * m] * p
    assert result.busy_seconds == [3 * m] * p
    assert [actions[0].start for actions in map(result.rank_actions, range(p))] == list(range(p))


@pytest.mark.parametrize(("p", "m"), [(p, m) for p in (3, 4, 8) for m in range(p, 2 * p - 1)])
def test_zb_h2_with_fewer_than_2p_minus_1_microbatches_is_no_faster_than_zb_h1(p, m):
    h1, h2 = simulate(zb_h1(p, m), UNIT).step_seconds, simulate(zb_h2(p, m), UNIT).step_seconds
    assert h1 == 3 * m + p - 1
    assert h2 > h1 if m < 2 * p - 2 else h2 == h1


def test_messages_cost_latency_plus_bytes_over_bandwidth_between_ranks_only():
    costs = [
        StageCost(2.0, 3.0, 1.0, output_bytes=100, input_grad_bytes=300),
        StageCost(4.0, 5.0, 2.0, output_bytes=7, input_grad_bytes=50),
    ]
    comm = CommModel(latency=0.5, bandwidth=100.0)  # 100 bytes: 1.5 s; 50 bytes: 1.0 s
    two_ranks = {0: ["0F0", "0I0", "0W0"], 1: ["1F0", "1I0", "1W0"]}
    result = simulate(two_ranks, costs, comm)
    times = {a.label: (a.start, a.end) for a in result.actions}
    assert times["1F0"] == (3.5, 7.5)  # 0F0 ends at 2, its 100 bytes arrive 1.5 s later
    assert times["1I0"] == (7.5, 12.5)
    assert times["0I0"] == (13.5, 16.5)  # 1I0's 50 bytes of input gradient take 1.0 s
    assert result.step_seconds == 17.5
    assert (result.messages, result.message_bytes) == (2, 150)
    one_rank = simulate({0: ["0F0", "1F0", "1I0", "0I0", "0W0", "1W0"]}, costs, comm)
    assert one_rank.step_seconds == 2 + 4 + 5 + 3 + 1 + 2
    assert (one_rank.messages, one_rank.message_bytes) == (0, 0)


def test_memory_follows_f_i_w_and_full_b():
    cost = StageCost(1, 1, 1, activation_bytes=A, weight_bytes=K)
    result = simulate({0: ["0F0", "0F1", "0I0", "0B1", "0W0"]}, cost)
    assert [a.memory_bytes for a in result.actions] == [A, 2 * A, A + K, K, 0]
    assert result.peak_memory_bytes == [2 * A]


def test_recompute_in_w_lengthens_w_only():
    cost = StageCost(1.0, 2.0, 3.0, recompute=0.5)
    assert simulate({0: ["0F0", "0I0", "0W0"]}, cost).step_seconds == 1 + 2 + 3.5
    assert simulate({0: ["0F0", "0B0"]}, cost).step_seconds == 1 + 5
    assert simulate({0: ["0F0", "0B0"]}, StageCost(1, 2, 3, full_backward=4)).step_seconds == 5


def test_a_rank_running_i_before_its_f_deadlocks_and_says_so():
    order = {0: ["0I0", "0F0", "0W0"], 1: ["1F0", "1I0", "1W0"]}
    with pytest.raises(DeadlockError) as caught:
        simulate(order, UNIT)
    error = caught.value
    assert [(w.rank, str(w.action), str(w.needs)) for w in error.waiting] == [
        (0, "0I0", "0F0"),
        (1, "1F0", "0F0"),
    ]
    assert "rank 0 waits at 0I0 (position 0) for 0F0 (on rank 0 itself, later in its own order)" in str(error)
    assert "rank 1 waits at 1F0 (position 0) for 0F0 (on rank 0)" in str(error)


def test_two_ranks_waiting_for_each_other_deadlock():
    order = {0: ["0F0", "0I0", "0F1", "0I1", "0W0", "0W1"], 1: ["1F1", "1F0", "1I0", "1I1", "1W0", "1W1"]}
    with pytest.raises(DeadlockError) as caught:
        simulate(order, UNIT)
    assert "rank 0 waits at 0I0 (position 1) for 1I0 (on rank 1)" in str(caught.value)
    assert "rank 1 waits at 1F1 (position 0) for 0F1 (on rank 0)" in str(caught.value)


def test_missing_and_repeated_actions_are_reported():
    with pytest.raises(IncompleteScheduleError, match="0W1 is missing"):
        simulate({0: ["0F0", "0F1", "0I0", "0W0", "0I1"]}, UNIT)
    with pytest.raises(IncompleteScheduleError, match=r"0I1 \(or 0B1\) is missing"):
        simulate({0: ["0F0", "0F1", "0B0"]}, UNIT)
    with pytest.raises(IncompleteScheduleError, match="0F0 runs 2 times"):
        simulate({0: ["0F0", "0F0", "0B0"]}, UNIT)
    with pytest.raises(ScheduleError, match="stage 0 runs on rank 0 and on rank 1"):
        simulate({0: ["0F0"], 1: ["0B0"]}, UNIT)


def test_pytorch_1f1b_pipeline_order_is_reported_incomplete():
    """PyTorch's ``Schedule1F1B._get_pipeline_order`` starts the last rank at microbatch 1 (an IR-only slip:
    its ``step`` does not read it); the simulator names what is wrong instead of predicting nonsense."""
    schedule = torch_schedules.Schedule1F1B(fake_stage(1, 2, 1, 2), 4)
    with pytest.raises(IncompleteScheduleError) as caught:
        simulate(schedule, UNIT, microbatches=4)
    assert "1F4 names a microbatch outside 0 .. 3" in caught.value.problems
    assert any(line.startswith("1F0 is missing") for line in caught.value.problems)


def test_pytorch_gpipe_pipeline_order_simulates_to_the_closed_form():
    p, m = 4, 8
    schedule = torch_schedules.ScheduleGPipe(fake_stage(0, p, 0, p), m)
    assert schedule_actions(schedule) == gpipe(p, m)  # None gaps and REDUCE_GRAD dropped
    assert simulate(schedule, UNIT).step_seconds == 3 * (m + p - 1)


def zbv(p: int, m: int) -> torch_schedules.ScheduleZBVZeroBubble:
    stages = [fake_stage(0, 2 * p, 0, p), fake_stage(2 * p - 1, 2 * p, 0, p)]
    return torch_schedules.ScheduleZBVZeroBubble(stages, m)


def test_pytorch_zbv_on_two_ranks_matches_a_hand_trace():
    """p = 2, m = 4, every stage F = I = W = 1: traced by hand, each rank idles exactly 1 s of 25."""
    schedule = zbv(2, 4)
    result = simulate(schedule, UNIT)
    assert result.name == "ScheduleZBVZeroBubble"
    assert result.placement == {0: 0, 1: 1, 2: 1, 3: 0}
    assert result.step_seconds == 25
    assert result.busy_seconds == [24, 24]
    assert result.idle_seconds == [1, 1]
    times = {a.label: (a.start, a.end) for a in result.actions}
    assert times["3F0"] == (3, 4)  # waits for 2F0 on rank 1, which waited for 1F0
    assert times["2I0"] == (5, 6)
    assert times["0I0"] == (10, 11)
    assert times["1I3"] == (21, 22)
    assert times["1W3"] == (24, 25)
    assert result.messages == 4 * 4  # 0->1 and 2->3 forward, 3->2 and 1->0 backward, per microbatch


def test_pipeline_order_with_comms_gives_the_same_prediction():
    schedule = zbv(2, 4)
    with_comms = simulate(schedule.pipeline_order_with_comms, UNIT)
    assert with_comms.actions == simulate(schedule.pipeline_order, UNIT).actions


def test_pytorch_interleaved_zero_bubble_runs_without_deadlock():
    p, m = 2, 4
    stages = [fake_stage(rank_stage, 2 * p, 0, p) for rank_stage in (0, 2)]
    result = simulate(torch_schedules.ScheduleInterleavedZeroBubble(stages, m), UNIT)
    assert result.placement == {0: 0, 1: 1, 2: 0, 3: 1}
    assert result.busy_seconds == [2 * m * 3] * p
    assert result.step_seconds >= 2 * m * 3 + 1  # stage 0's first F always waits for nothing, rank 1 for it


def test_csv_cells_are_read_as_pytorch_writes_them(tmp_path):
    path = tmp_path / "schedule.csv"
    path.write_text("0F0,0SEND_F0,,0RECV_B0,0I0,0W0,0REDUCE_GRAD\n1RECV_F0,1F0,1I0,1SEND_B0,1W0\n")
    assert read_schedule_csv(path) == {
        0: [Action(0, "F", 0), Action(0, "I", 0), Action(0, "W", 0)],
        1: [Action(1, "F", 0), Action(1, "I", 0), Action(1, "W", 0)],
    }
    assert str(Action(2, "W", 13)) == "2W13"
    with pytest.raises(ScheduleError, match="'0X1' is not a pipeline action"):
        schedule_actions({0: ["0X1"]})


def test_the_prediction_draws_as_a_recorded_timeline():
    from graphkit.drawing.timeline import timeline_svg

    result = simulate(zb_h1(4, 8), UNIT, name="ZB-H1")
    timeline = result.to_schedule_timeline()
    assert timeline.schedule == "ZB-H1"
    assert timeline.step_seconds == result.step_seconds
    assert timeline.bubble_fraction == pytest.approx(result.bubble_fraction)
    assert [rank.peak_memory_bytes for rank in timeline.ranks] == result.peak_memory_bytes
    assert timeline.ranks[2].compute_order() == [str(a) for a in zb_h1(4, 8)[2]]
    root = ElementTree.fromstring(timeline_svg(timeline))
    drawn = [rect for rect in root.iter(f"{SVG}rect") if "action" in rect.get("class", "").split()]
    assert len(drawn) == len(result.actions) == 4 * 8 * 3


def test_64_ranks_256_microbatches_simulate_to_the_closed_form():
    """The size ``bench/simulate.py`` times; here only the values."""
    p, m = 64, 256
    result = simulate(zb_h1(p, m), UNIT)
    assert len(result.actions) == 3 * p * m
    assert result.step_seconds == 3 * m + p - 1


def test_a_rendezvous_message_is_paid_when_its_receiver_reaches_it():
    # 1F1B, 2 ranks, 2 microbatches, F = B = 1 s, messages 0.5 s. Without rendezvous 1F1 starts when rank 1
    # is free (3.5: 0F1's output arrived at 2.5); with it the transfer starts only then (4.0), and 0B1
    # waits for 1B1's gradient to be sent after rank 0 is ready (6.0 + 0.5)
    order = {0: ["0F0", "0F1", "0B0", "0B1"], 1: ["1F0", "1B0", "1F1", "1B1"]}
    costs = StageCost(1.0, 0.5, 0.5, full_backward=1.0)
    starts = {}
    for rendezvous in (False, True):
        simulation = simulate(order, costs, CommModel(0.5, rendezvous=rendezvous), microbatches=2)
        starts[rendezvous] = {action.label: action.start for action in simulation.actions}
        assert simulation.step_seconds == (7.0 if not rendezvous else 7.5)
    assert starts[False] == {
        "0F0": 0,
        "0F1": 1,
        "0B0": 4,
        "0B1": 6,
        "1F0": 1.5,
        "1B0": 2.5,
        "1F1": 3.5,
        "1B1": 4.5,
    }
    assert starts[True] == {
        "0F0": 0,
        "0F1": 1,
        "0B0": 4,
        "0B1": 6.5,
        "1F0": 1.5,
        "1B0": 2.5,
        "1F1": 4,
        "1B1": 5,
    }
