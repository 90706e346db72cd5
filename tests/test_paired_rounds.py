"""Steps measured in rounds: every candidate takes every position of a round equally often, the A/A noise
floor, the paired comparison compare-schedules prints, and how many rounds a sign test needs - each
against values computed by hand (binomial tails written out as fractions)."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from types import SimpleNamespace

import pytest

from graphkit.measure.paired_rounds import (
    balanced_order,
    compare_rounds,
    median_round_ratio,
    noise_floor,
    process_set_sizes,
    ratio_by_set,
    round_spread,
    rounds_for_standard_error,
    rounds_won,
)
from graphkit.measure.timing import rounds_to_decide, sign_test_p_value, t_test_p_value


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 7, 12])
def test_balanced_orders_put_each_candidate_in_every_position_and_after_every_other_alike(count):
    rows = count if count % 2 == 0 else 2 * count
    orders = [balanced_order(index, count) for index in range(3 * rows)]
    assert all(sorted(order) == list(range(count)) for order in orders)
    assert orders[rows : 2 * rows] == orders[:rows]  # the design repeats
    positions = Counter((candidate, place) for order in orders for place, candidate in enumerate(order))
    assert set(positions.values()) == {3 * rows // count} and len(positions) == count * count
    followers = Counter(
        (before, after) for order in orders for before, after in zip(order, order[1:], strict=False)
    )
    assert len(followers) == count * (count - 1)  # every ordered pair of different candidates
    assert len(set(followers.values())) <= 1  # ... equally often


def test_balanced_order_by_hand():
    # Williams (1949): row 0 of 4 is 0, 1, 3, 2, the others add the row; odd counts add the rows reversed
    assert [balanced_order(index, 4) for index in range(4)] == [
        [0, 1, 3, 2],
        [1, 2, 0, 3],
        [2, 3, 1, 0],
        [3, 0, 2, 1],
    ]
    assert [balanced_order(index, 3) for index in range(6)] == [
        [0, 1, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
        [0, 2, 1],
        [1, 0, 2],
    ]
    assert balanced_order(7, 0) == []
    with pytest.raises(ValueError, match="at least 0"):
        balanced_order(-1, 3)


def test_the_recorder_visits_the_schedules_of_each_round_in_the_balanced_order(monkeypatch):
    # _record_rank's loop, with the schedule steps replaced by a log of what ran in which round
    from graphkit.pipelining import recording

    visited: list[str] = []
    monkeypatch.setattr(recording, "memory_probe", lambda device: (None, ""))
    monkeypatch.setattr(
        recording,
        "_prepare_schedule",
        lambda pipeline, name, *args: (SimpleNamespace(), [SimpleNamespace(name=name, num_stages=1)], []),
    )

    def record_step(prepared, batch, rank, device, probe):
        visited.append(prepared[1][0].name)
        return SimpleNamespace(step_seconds=float(len(visited)), step_times=[])

    monkeypatch.setattr(recording, "_record_step", record_step)
    monkeypatch.setattr(recording.dist, "all_reduce", lambda tensor, op=None: None)
    monkeypatch.setattr(recording.dist, "barrier", lambda: None)
    monkeypatch.setattr(recording, "schedule_name", lambda name: str(name))
    pipeline = SimpleNamespace(
        microbatches=lambda count: None, inputs=(), schedule_target=lambda: recording.torch.zeros(1)
    )
    import torch

    recording._record_rank(pipeline, ["A", "B", "C"], 4, 0, 1, torch.device("cpu"), None, steps=6)
    # (the unrecorded warm-up steps are _prepare_schedule's); rounds 4 to 6 run rounds 1 to 3 backwards
    rounds = ["ABC", "BCA", "CAB", "CBA", "ACB", "BAC"]
    assert visited == [name for round_ in rounds for name in round_]


def test_the_noise_floor_is_the_median_round_spread_between_two_copies():
    original = [10.0, 10.0, 10.0, 20.0, 20.0]
    copy = [10.1, 9.9, 10.2, 20.0, 20.6]  # 1.01, 0.99, 1.02, 1.00, 1.03: median 1.01
    assert median_round_ratio(copy, original) == pytest.approx(1.01)
    assert noise_floor(copy, original) == pytest.approx(0.01)
    assert noise_floor([9.7] * 3, [10.0] * 3) == pytest.approx(0.03)  # faster copies count as well
    assert noise_floor([], []) is None
    assert rounds_won(copy, original) == (1, 5)  # ties lose


def test_compare_rounds_pairs_every_schedule_with_the_first_and_reads_the_noise_floor_off_a_repeat():
    summary = compare_rounds(
        [
            ("1F1B", [10.0] * 6),
            ("ZBVZeroBubble", [9.0] * 5 + [11.0]),
            ("Interleaved1F1B", [9.9] * 6),
            ("1F1B", [10.2] * 6),
        ]
    )
    assert summary["baseline"] == "1F1B" and summary["control"] == "1F1B"
    assert summary["noise_floor"] == pytest.approx(0.02)
    zbv, interleaved, copy = summary["rows"]
    assert zbv["median_round_ratio"] == pytest.approx(0.9) and (zbv["won"], zbv["rounds"]) == (5, 6)
    assert zbv["p"] == pytest.approx(7 / 64) and not zbv["within_noise"]
    # 0.99x is within the 2% the two copies of 1F1B measured apart
    assert interleaved["median_round_ratio"] == pytest.approx(0.99) and interleaved["within_noise"]
    assert copy["within_noise"]
    assert compare_rounds([("1F1B", [1.0]), ("GPipe", [1.0])])["noise_floor"] is None


def test_rounds_split_into_sets_of_processes_of_at_least_five_as_even_as_can_be():
    assert process_set_sizes(21, 3) == [7, 7, 7]
    assert process_set_sizes(41, 3) == [14, 14, 13]
    assert process_set_sizes(10, 3) == [5, 5]
    assert process_set_sizes(9, 3) == [9] and process_set_sizes(41, 1) == [41]
    assert all(sum(process_set_sizes(rounds, 3)) == rounds for rounds in range(1, 80))
    with pytest.raises(ValueError, match="at least 1"):
        process_set_sizes(21, 0)


def test_with_sets_of_processes_each_counts_alike_in_the_mean_of_their_median_rounds():
    # three sets of 5, 5 and 4 rounds; ZBV measured 0.90x 1F1B in the first set, 0.96x in the second,
    # 0.99x in the third: pooled, the median round is 0.96x; the sets' mean (0.90 + 0.96 + 0.99) / 3 = 0.95
    base = [10.0] * 14
    zbv = [9.0] * 5 + [9.6] * 5 + [9.9] * 4
    copy = [10.0] * 5 + [10.3] * 5 + [10.0] * 4  # the A/A control: 1.00x, 1.03x, 1.00x: 1% in the mean
    assert ratio_by_set(zbv, base, [5, 5, 4]) == pytest.approx([0.9, 0.96, 0.99])
    assert median_round_ratio(zbv, base) == pytest.approx(0.96)
    summary = compare_rounds([("1F1B", base), ("ZBV", zbv), ("1F1B", copy)], [5, 5, 4])
    zbv_row, copy_row = summary["rows"]
    assert zbv_row["median_round_ratio"] == pytest.approx(0.95)
    assert zbv_row["by_set"] == pytest.approx([0.9, 0.96, 0.99]) and (zbv_row["won"], zbv_row["rounds"]) == (
        14,
        14,
    )
    assert summary["noise_floor"] == pytest.approx(0.01) and summary["sets"] == [5, 5, 4]
    assert copy_row["within_noise"] and not zbv_row["within_noise"]
    # one set: as without sets
    one = compare_rounds([("1F1B", base), ("ZBV", zbv)], [14])
    assert one["rows"][0]["median_round_ratio"] == pytest.approx(0.96) and one["rows"][0]["by_set"] == []
    with pytest.raises(ValueError, match="do not add up"):
        compare_rounds([("1F1B", base), ("ZBV", zbv)], [5, 5])


def test_rounds_to_decide_at_a_win_fraction_against_the_binomial_tails():
    # 0.9 at 0.05: 7 of 8 score 9/256 = 0.035, 6 of 7 score 8/128 = 0.0625
    assert sign_test_p_value(7, 8) == pytest.approx(9 / 256) and sign_test_p_value(6, 7) == pytest.approx(
        1 / 16
    )
    assert rounds_to_decide(0.9, 0.05) == 8
    # 0.6 at 0.05: 48 of 80 is the first expected count below 0.05 (47 of 79 is not)
    assert rounds_to_decide(0.6, 0.05) == 80
    assert sign_test_p_value(48, 80) < 0.05 <= sign_test_p_value(47, 79)
    assert all(sign_test_p_value(math.floor(0.6 * n + 1e-9), n) >= 0.05 for n in range(1, 80))
    assert rounds_to_decide(0.5, 0.05) is None and rounds_to_decide(0.3, 0.05) is None
    assert rounds_to_decide(0.51, 0.05, most=200) is None  # more than `most` rounds
    with pytest.raises(ValueError, match="win_fraction"):
        rounds_to_decide(1.5, 0.05)


@pytest.mark.parametrize(
    ("freedom", "critical", "tail"),
    # Student's t one-sided critical values, as printed in every table (Fisher and Yates)
    [
        (1, 6.314, 0.05),
        (2, 2.920, 0.05),
        (3, 2.353, 0.05),
        (4, 2.132, 0.05),
        (5, 2.015, 0.05),
        (5, 3.365, 0.01),
        (10, 1.812, 0.05),
        (20, 2.528, 0.01),
    ],
)
def test_the_t_test_meets_the_tables_critical_values(freedom, critical, tail):
    # n values with mean -critical * se: two values +-1 around the mean give stdev sqrt(2) ... build
    # n = freedom + 1 values with stdev s and mean m = -critical * s / sqrt(n)
    count = freedom + 1
    spread = [(-1.0) ** index for index in range(count)]
    if count % 2:
        spread[-1] = 0.0
    import statistics as stats

    scale = stats.stdev(spread)
    values = [value - critical * scale / math.sqrt(count) for value in spread]
    assert t_test_p_value(values) == pytest.approx(tail, abs=2e-4)
    assert t_test_p_value([-value for value in values]) == pytest.approx(1 - tail, abs=2e-4)


def test_the_t_test_on_too_few_or_identical_values():
    assert t_test_p_value([-1.0]) == 1.0 and t_test_p_value([]) == 1.0
    assert t_test_p_value([-0.1, -0.1]) == 0.0 and t_test_p_value([0.1, 0.1]) == 1.0
    # the sets of a model of 8 transformer blocks: five of six ahead, one 0.6% behind
    ratios = [0.912, 0.958, 0.931, 0.940, 1.006, 0.953]
    assert t_test_p_value([math.log(ratio) for ratio in ratios]) == pytest.approx(0.0063, abs=1e-4)


def test_round_spread_is_the_scaled_median_absolute_deviation_of_each_sets_differences_about_its_own_median():
    # two candidates, two sets of 5 rounds: log differences -0.1, -0.05, 0, 0.05, 0.1 in the first set and
    # the same 0.3 higher in the second (what a set adds to all of its rounds is not round-to-round spread);
    # absolute deviations about each set's median, the median round itself left out: 0.1, 0.05, 0.05, 0.1
    # twice, their median 0.075
    base = [100.0] * 10
    deltas = [-0.1, -0.05, 0.0, 0.05, 0.1]
    other = [100.0 * math.exp(d) for d in deltas] + [100.0 * math.exp(d + 0.3) for d in deltas]
    assert round_spread([base, other], [5, 5]) == pytest.approx(1.4826 * 0.075)
    # a third candidate equal to the first: pairs (base, other) and (other, copy) stray by 0.0741, (base, copy)
    # not at all; the root of their mean square
    assert round_spread([base, other, list(base)], [5, 5]) == pytest.approx(1.4826 * 0.075 * math.sqrt(2 / 3))
    # one stall of half a step is one deviation, not its square: the spread stays as it was
    stalled = list(other)
    stalled[0] *= 1.5
    assert round_spread([base, stalled], [5, 5]) == pytest.approx(1.4826 * 0.075)
    assert round_spread([base], [10]) is None  # nothing to pair
    assert round_spread([base[:2], other[:2]], [1, 1]) is None  # no set of two rounds
    with pytest.raises(ValueError, match="do not add up"):
        round_spread([base, other], [5, 4])
    with pytest.raises(ValueError, match="do not add up"):
        round_spread([base, other[:9]], [5, 5])  # candidates of different lengths
    with pytest.raises(ValueError, match="at least 0"):
        round_spread([base, other], [-2, 12])
    # steps that are not finite numbers above 0 are left out, not carried into a logarithm
    assert round_spread([[math.inf] * 4 + [1.0, 1.1], [math.inf] * 4 + [1.0, 0.9]], [6]) is not None
    assert round_spread([[1e300, 1e-300, 1.0, 1.0], [1e-300, 1e300, 1.0, 1.0]], [4]) > 0


def test_round_spread_of_normal_draws_is_their_standard_deviation():
    # oracle: independent normal log steps of spread 0.05 each; a difference of two strays by 0.05 sqrt(2)
    draw = random.Random(7)
    first = [100.0 * math.exp(draw.gauss(0.0, 0.05)) for _ in range(3000)]
    second = [100.0 * math.exp(draw.gauss(0.0, 0.05)) for _ in range(3000)]
    assert round_spread([first, second], [1000, 1000, 1000]) == pytest.approx(0.05 * math.sqrt(2), rel=0.05)


def test_rounds_for_standard_error_is_the_large_sample_variance_of_the_median():
    assert rounds_for_standard_error(0.08, 0.01) == 101  # pi / 2 x 64 = 100.5
    assert rounds_for_standard_error(0.08, 0.02) == 26  # 25.1
    assert rounds_for_standard_error(0.0, 0.01) == 1
    # oracle: the spread of the median of that many normal draws, over 2,000 samples
    draw = random.Random(11)
    rounds = rounds_for_standard_error(0.08, 0.01)
    medians = [statistics.median(draw.gauss(0.0, 0.08) for _ in range(rounds)) for _ in range(2000)]
    assert statistics.stdev(medians) == pytest.approx(0.01, rel=0.08)
    with pytest.raises(ValueError, match="standard_error above 0"):
        rounds_for_standard_error(0.08, 0.0)
    with pytest.raises(ValueError, match="spread must be at least 0"):
        rounds_for_standard_error(-0.01, 0.01)
    for spread, error in ((math.nan, 0.01), (math.inf, 0.01), (0.08, math.nan)):
        with pytest.raises(ValueError, match="spread must be at least 0"):
            rounds_for_standard_error(spread, error)
    with pytest.raises(ValueError, match="more rounds than can be counted"):
        rounds_for_standard_error(0.1, 1e-200)


def test_round_spread_of_sets_of_seven_reads_the_spread_they_were_drawn_with():
    # oracle: 3,000 first recordings of three sets of 7 normal rounds of spread 0.08 against a steady
    # candidate; leaving each set's median round out, their mean estimate lies within 10% of 0.08 (kept, it
    # read 0.84 of it)
    draw = random.Random(3)
    steady = [100.0] * 21
    estimates = [
        round_spread([steady, [100.0 * math.exp(draw.gauss(0.0, 0.08)) for _ in range(21)]], [7, 7, 7])
        for _ in range(3000)
    ]
    assert statistics.fmean(estimates) == pytest.approx(0.08, rel=0.1)


def test_compare_rounds_gives_the_standard_error_its_rounds_stray_by():
    # ZBV's rounds stray about 1F1B's by log differences of -0.1, -0.05, 0, 0.05 and 0.1 in each of two sets
    # of 5 (about each set's own median, the median round left out): a spread of 1.4826 x 0.075 a round; the
    # A/A copy does not stray,
    # nor does 1F1B from it, so the three pairs give sqrt(2 / 3) of it; over 10 rounds the standard error
    # of a difference is sqrt(pi / 2) x spread / sqrt(10)
    strays = [-0.1, -0.05, 0.0, 0.05, 0.1]
    base = [10.0] * 10
    zbv = [9.0 * math.exp(stray) for stray in strays] + [9.5 * math.exp(stray) for stray in strays]
    summary = compare_rounds([("1F1B", base), ("ZBV", zbv), ("1F1B", list(base))], [5, 5])
    spread = 1.4826 * 0.075 * math.sqrt(2 / 3)
    assert summary["round_spread"] == pytest.approx(spread)
    assert summary["standard_error"] == pytest.approx(math.sqrt(math.pi / 2) * spread / math.sqrt(10))
    # the inverse of rounds_for_standard_error: the rounds it asks for give that standard error, or less
    needed = rounds_for_standard_error(spread, summary["standard_error"])
    assert needed in (10, 11)
    # one candidate, or candidates of different lengths: no spread is taken
    assert compare_rounds([("1F1B", base)])["standard_error"] is None
    assert compare_rounds([("1F1B", base), ("ZBV", zbv[:9])])["round_spread"] is None
