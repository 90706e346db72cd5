"""What `graphkit plan --run` records and what it concludes: every schedule the prediction cannot tell from
the best (within a budget, each left out named with its reason), each splitting schedule's own placement
beside it, 1F1B twice as an A/A control, splitting credited only with what it gains over its placement,
no difference called within the noise floor, and the rounds a sign test would need - each against
hand-made predictions and recorded rounds."""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from graphkit.cli import build_parser
from graphkit.measure.competing_load import OtherProcesses
from graphkit.measure.timing import (
    fewest_wins_beyond_chance,
    rounds_to_decide,
    sign_test_p_value,
    t_test_p_value,
)
from graphkit.pipelining import planner
from graphkit.pipelining.planner import plan_schedules
from graphkit.pipelining.planning import CommModel, StageCost, simulate
from graphkit.pipelining.record_selection import DEFAULT_PREDICTION_ERROR, best_non_splitting, choose_recorded
from graphkit.pipelining.remembered_error import (
    LEAST_REMEMBERED_ERROR,
    REMEMBERED_RUNS,
    error_from_measured,
    errors_file,
    recording_band,
    remember_error,
    remembered_error,
    setup_key,
)
from graphkit.pipelining.schedule_plan import COMPARE_TIMEOUT_S, PlannedSchedule, process_set_sizes
from graphkit.pipelining.schedules import schedule_name, schedule_order, stage_count

MS = 1e-3


def planned(name: str, milliseconds: float) -> PlannedSchedule:
    """A schedule as the planner would hold it, with its real order and a made-up predicted step."""
    order = schedule_order(name, 2, 4)
    per_rank = stage_count(name, 2) // 2
    return PlannedSchedule(name, per_rank, SimpleNamespace(step_seconds=milliseconds * MS), order=order)


def predictions(**milliseconds: float) -> list[PlannedSchedule]:
    items = [planned(name.replace("_", ""), value) for name, value in milliseconds.items()]
    return sorted(items, key=lambda item: item.predicted_seconds)


def test_every_schedule_within_the_error_is_recorded_with_its_placement_and_the_rest_is_named():
    schedules = predictions(
        _1F1B=100,
        GPipe=104,
        Interleaved1F1B=102,
        LoopedBFS=103,
        ZBVZeroBubble=96,
        DualPipeV=98,
        ZBH1=115,
        ZBH2=97,
    )
    by_name = {item.name: item for item in schedules}
    assert all(by_name[name].splits_backward for name in ("ZBVZeroBubble", "DualPipeV", "ZBH1", "ZBH2"))
    assert best_non_splitting(schedules, 2) is by_name["Interleaved1F1B"]
    assert best_non_splitting(schedules, 1) is by_name["1F1B"]
    # predictions each off by up to 2% can swap order within 1.02 / 0.98 = 4.1% of the best (96 ms): up to
    # 99.9 ms - ZBV, ZBH2, DualPipeV (and 1F1B, always)
    choice = choose_recorded(schedules, by_name["1F1B"], steps=9, prediction_error=0.02, budget_s=None)
    names = [item.name for item in choice.chosen]
    # Interleaved1F1B (102 ms, outside the band) is recorded as ZBV's and DualPipeV's placement
    assert names == ["ZBVZeroBubble", "ZBH2", "DualPipeV", "Interleaved1F1B", "1F1B"]
    why = {item.name: item.recorded_because for item in choice.chosen}
    assert (
        why["ZBVZeroBubble"]
        == "predicted 0.96x, within 4% of the best predicted, the best zero-bubble predicted"
    )
    assert why["ZBH2"] == "predicted 0.97x, within 4% of the best predicted"
    assert why["Interleaved1F1B"] == (
        "predicted 1.02x, the best non-splitting schedule of two stages per rank (ZBVZeroBubble's placement)"
    )
    assert why["1F1B"] == "the baseline, recorded twice: the second copy is the A/A control"
    assert dict(choice.left_out) == {
        "LoopedBFS": "predicted 1.03x, more than 4% above the best predicted (0.96x)",
        "GPipe": "predicted 1.04x, more than 4% above the best predicted (0.96x)",
        "ZBH1": "predicted 1.15x, more than 4% above the best predicted (0.96x)",
    }
    # each recording costs (9 + 1) x its predicted step: 1F1B twice, ZBV, Interleaved1F1B = 3.98 s always;
    # ZBH2 (0.97 s) fits a 5 s budget, DualPipeV (0.98 s more) does not
    choice = choose_recorded(schedules, by_name["1F1B"], steps=9, prediction_error=0.02, budget_s=5.0)
    assert [item.name for item in choice.chosen] == ["ZBVZeroBubble", "ZBH2", "Interleaved1F1B", "1F1B"]
    assert choice.estimated_s == pytest.approx(10 * (0.096 + 0.102 + 2 * 0.100 + 0.097))
    assert dict(choice.left_out)["DualPipeV"] == (
        "predicted 0.98x, within the band, but recording it (about 1 s) would pass the --record-budget of 5 s"
    )
    # --top caps the band, not what is always recorded
    choice = choose_recorded(schedules, by_name["1F1B"], steps=9, prediction_error=0.02, budget_s=None, top=1)
    assert [item.name for item in choice.chosen] == ["ZBVZeroBubble", "ZBH2", "Interleaved1F1B", "1F1B"]
    assert dict(choice.left_out)["DualPipeV"] == "predicted 0.98x, within the band but beyond --top 1"
    with pytest.raises(ValueError, match="at least 0"):
        choose_recorded(schedules, by_name["1F1B"], steps=9, prediction_error=-0.1)
    # at 5% each the band is 11%: Interleaved1F1B, LoopedBFS and GPipe fall within it, ZBH1 (1.2x) not
    choice = choose_recorded(schedules, by_name["1F1B"], steps=9, prediction_error=0.05, budget_s=None)
    assert sorted(item.name for item in choice.chosen) == sorted(
        ["ZBVZeroBubble", "ZBH2", "DualPipeV", "Interleaved1F1B", "LoopedBFS", "GPipe", "1F1B"]
    )
    assert dict(choice.left_out) == {
        "ZBH1": "predicted 1.15x, more than 11% above the best predicted (0.96x)"
    }


def test_the_band_is_where_two_predictions_off_by_the_error_can_swap_order():
    assert recording_band(0.0) == 0.0
    assert recording_band(0.10) == pytest.approx(0.2222, abs=1e-4)  # 1.1 / 0.9
    # a schedule predicted 1.22x the best, 10% too slow (measured 1.10x of the predicted best's step),
    # beats the best predicted one measured 10% too fast (1.1x of its own): they swap at the band's edge
    best, other = 1.0, 1.0 + recording_band(0.10)
    assert other * (1 - 0.10) == pytest.approx(best * (1 + 0.10))
    assert recording_band(1.0) == math.inf
    with pytest.raises(ValueError, match="at least 0"):
        recording_band(-0.01)


def four_stage_costs() -> dict:
    """`graphkit costs --json` for four equal stages (2 ranks: the two-stage-per-rank schedules plan too)."""
    return {
        "stages": [
            {
                "forward": {"seconds": 1 * MS},
                "backward_input": {"seconds": 0.5 * MS},
                "backward_weight": {"seconds": 0.5 * MS},
                "full_backward_seconds": 0.8 * MS,
                "activation_bytes": 1 << 18,
                "b_keeps_bytes": 1 << 16,
                "input_grad_bytes": 0 if index == 0 else 1000,
            }
            for index in range(4)
        ]
    }


def run_recorded(monkeypatch, rounds: dict[str, list[float]], schedules: list[str], **options):
    """plan --run with made-up recorded rounds (milliseconds); the second 1F1B is the A/A control, whose
    rounds are ``rounds["control"]`` (default: 1F1B's)."""

    calls = options.pop("calls", [])  # the schedules of each recording, in order

    offsets = {"first": 0, "runoff": 0, "runoff_sets": 0}  # the rounds handed out so far
    first_rounds = len(rounds["1F1B"])

    def record(pipeline, names, microbatches, ranks, steps, **_):
        calls.append([schedule_name(schedule) for schedule in names])
        # the first recording's sets of processes read ``rounds`` in order; a run-off's (the recordings
        # after those, one per set) read rounds["runoff"] where given: a list holds one dict per set, one
        # dict is handed out set by set, in order
        source, start = rounds, offsets["first"]
        if offsets["first"] < first_rounds:
            offsets["first"] += steps
        else:
            runoff = rounds.get("runoff", rounds)
            if isinstance(runoff, list):
                source, start = runoff[offsets["runoff_sets"]], 0
                offsets["runoff_sets"] += 1
            else:
                source, start = runoff, offsets["runoff"]
                offsets["runoff"] += steps
        timelines, seen = [], set()
        for schedule in names:
            name = schedule_name(schedule)
            key = "control" if name in seen and "control" in source else name
            seen.add(name)
            order = schedule_order(schedule, ranks, microbatches)
            timeline = simulate(order, StageCost(1 * MS, 1 * MS, 1 * MS), CommModel(), name=name)
            timeline = timeline.to_schedule_timeline()
            times = [value * MS for value in source[key][start : start + steps]]
            for rank in timeline.ranks:
                rank.step_times = list(times)
                rank.step_seconds = sorted(times)[(len(times) - 1) // 2]
            timelines.append(timeline)
        return timelines

    other_cores = options.pop("other_cores", 0.0)  # what other processes used while recording

    @contextmanager
    def watching():
        yield OtherProcesses(other_cores, 1.0)

    monkeypatch.setattr(planner, "record_schedules", record)
    monkeypatch.setattr(planner, "busy_machine_warning", lambda: "")
    monkeypatch.setattr(planner, "watching_other_processes", watching)
    return plan_schedules(
        "zoo-pipeline:mlp",
        ranks=2,
        microbatches=4,
        costs=four_stage_costs(),
        schedules=schedules,
        run=True,
        steps=len(rounds["1F1B"]),
        overhead=0.0,
        comm=CommModel(),
        # default: record every one, the first recording in one set of processes, no run-off
        **{"prediction_error": 10.0, "runoff": False, "recording_sets": 1, **options},
    )


def test_a_gain_that_is_the_placements_is_not_credited_to_splitting(monkeypatch):
    # the V schedule ties Interleaved1F1B, which splits nothing: both 0.94x 1F1B
    rounds = {
        "1F1B": [100.0] * 15,
        "Interleaved1F1B": [94.0] * 15,
        "DualPipeV": [94.5] * 8 + [93.5] * 7,  # against Interleaved1F1B: 7 wins of 15, median 94.5 / 94
    }
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "Interleaved1F1B", "DualPipeV"])
    dual = plan.by_name("DualPipeV")
    assert plan.placement_baseline(dual) is plan.by_name("Interleaved1F1B")
    assert plan.rounds_won(dual, plan.by_name("Interleaved1F1B")) == (7, 15)
    line = plan.zero_bubble_verdict()
    assert line.startswith(
        "zero bubble does not pay here (DualPipeV measured 0.94x 1F1B in the median round;"
    )
    assert (
        "its placement (two stages per rank) gains 6.0% over 1F1B (Interleaved1F1B, which splits nothing: "
        "0.94x 1F1B in the median round, faster in 15 of 15"
    ) in line
    assert (
        "splitting gains -0.5% (slower) over its placement (DualPipeV against Interleaved1F1B in the same rounds: "
        f"1.01x in the median round, faster in 7 of 15, p = {sign_test_p_value(7, 15):.2g})"
    ) in line
    assert "what it gains over 1F1B is its placement's, not splitting's" in line
    assert plan.recommended.name == "Interleaved1F1B"


def test_splitting_pays_only_when_it_beats_its_own_placement_beyond_chance(monkeypatch):
    rounds = {"1F1B": [100.0] * 15, "Interleaved1F1B": [95.0] * 15, "ZBVZeroBubble": [90.0] * 15}
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
    line = plan.zero_bubble_verdict()
    p = sign_test_p_value(15, 15)  # 1 / 32768, below 0.05 / 2 (two schedules tested against 1F1B)
    assert line.startswith("zero bubble pays here (ZBVZeroBubble measured 0.90x 1F1B in the median round;")
    assert (
        f"splitting gains 5.3% over its placement (ZBVZeroBubble against Interleaved1F1B in the same rounds: 0.95x in the median round, faster in 15 of 15, p = {p:.2g})"
        in line
    )
    assert "the bubble it fills is worth more than the extra work of splitting" in line
    # 10 of 15 against its placement is chance at 0.05 (p = 0.15): no credit, though 0.90x 1F1B and 5% over
    # the placement in the median round: not shown
    rounds["ZBVZeroBubble"] = [90.0] * 10 + [96.0] * 5
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
    line = plan.zero_bubble_verdict()
    assert line.startswith("zero bubble is not shown to pay here")
    assert f"over its placement could be chance (p = {sign_test_p_value(10, 15):.2g}, not below 0.05)" in line
    # no gain over the placement in the median round: the placement's, not splitting's
    rounds["ZBVZeroBubble"] = [95.5] * 8 + [96.0] * 7
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
    line = plan.zero_bubble_verdict()
    assert line.startswith("zero bubble does not pay here")
    assert "what it gains over 1F1B is its placement's, not splitting's" in line


def test_no_difference_within_the_a_a_noise_floor_is_called(monkeypatch):
    # GPipe faster than 1F1B in all 15 rounds by 2%: but the two copies of 1F1B measured 3% apart
    rounds = {"1F1B": [100.0] * 15, "control": [103.0] * 15, "GPipe": [98.0] * 15}
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"])
    assert plan.noise_floor == pytest.approx(0.03) and plan.won_beyond_chance(plan.by_name("GPipe"))
    assert plan.recommended is plan.baseline
    assert (
        "noise floor: 1F1B recorded twice in the same rounds (A/A) measured 1.030x itself in the median round "
        "(the copy faster in 0 of 15): no difference within 3.0% is called"
    ) in plan.table()
    assert plan.to_dict()["noise_floor"] == pytest.approx(0.03)
    # copies 1% apart: the 2% is called
    rounds["control"] = [99.0] * 15
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"])
    assert plan.noise_floor == pytest.approx(0.01) and plan.recommended.name == "GPipe"
    # without a control nothing is recorded twice and no floor is applied
    plan = run_recorded(
        monkeypatch, {"1F1B": [100.0] * 15, "GPipe": [98.0] * 15}, ["1F1B", "GPipe"], control=False
    )
    assert plan.noise_floor is None and plan.control_steps == [] and plan.recommended.name == "GPipe"


def test_keep_1f1b_says_how_many_rounds_the_closest_would_need(monkeypatch):
    # GPipe faster in 9 of 15 rounds (p = 0.30): at 0.6 a sign test at 0.05 needs 80 rounds (48 wins)
    rounds = {"1F1B": [100.0] * 15, "GPipe": [98.0] * 9 + [102.0] * 6}
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"])
    assert plan.recommended is plan.baseline and plan.rounds_to_decide(plan.by_name("GPipe")) == 80
    assert (
        "at its win fraction (9 of 15, 60%) a sign test at p < 0.05 would need about 80 rounds to decide "
        "(--steps 80)"
    ) in plan.table()
    # losing most rounds: no estimate
    rounds["GPipe"] = [98.0] * 6 + [102.0] * 9
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"])
    assert "rounds to decide" not in plan.table()


def test_the_run_says_how_far_the_prediction_that_chose_was_off(monkeypatch):
    rounds = {"1F1B": [100.0] * 9, "GPipe": [90.0] * 9}
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"], prediction_error=0.05)
    predicted = plan.by_name("GPipe").predicted_seconds / plan.baseline.predicted_seconds
    error = abs(predicted / 0.9 - 1)
    assert plan.selection_error == pytest.approx({"median": error, "worst": error, "schedule": "GPipe"})
    assert error > 0.05  # GPipe was predicted about 1F1B's step: 0.90x measured is further than 5%
    band = int(error * 100 + 1) / 100
    assert (
        f"the next plan of this set-up allows each prediction {band:.0%} (remembered; or give "
        f"--prediction-error {band:.2f})"
    ) in plan.table()


def test_the_next_plan_records_within_the_error_the_last_run_measured(monkeypatch):
    rounds = {"1F1B": [100.0] * 9, "GPipe": [90.0] * 9}
    first = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"], prediction_error=None)
    assert first.prediction_error == DEFAULT_PREDICTION_ERROR
    assert first.prediction_error_source.startswith("the default: no earlier run of this plan measured")
    worst = first.selection_error["worst"]
    remembered = json.loads(errors_file().read_text())
    assert list(remembered.values()) == [{"runs": [{"worst": pytest.approx(worst), "schedule": "GPipe"}]}]
    again = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"], prediction_error=None)
    assert again.prediction_error == pytest.approx(error_from_measured(worst)) == int(worst * 100 + 1) / 100
    assert again.prediction_error_source.startswith(
        f"the worst error the last run of this plan measured ({worst:.1%}, GPipe; remembered in {errors_file()})"
    )
    # the next run's band is the largest of the runs remembered
    third = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"], prediction_error=None)
    assert third.prediction_error_source.startswith(
        f"the worst error the last 2 runs of this plan measured ({worst:.1%}"
    )
    assert (
        f"recorded every schedule predicted within {recording_band(again.prediction_error):.0%} of the best "
        f"predicted, where two predictions each off by up to {again.prediction_error:.0%} can swap order (the worst"
        in again.table()
    )
    assert again.to_dict()["prediction_error_source"] == again.prediction_error_source
    # a given band wins over the remembered one; another set-up (microbatches) remembers its own
    given = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"], prediction_error=0.3)
    assert (given.prediction_error, given.prediction_error_source) == (0.3, "--prediction-error")
    assert remembered_error(setup_key("zoo-pipeline:mlp", 2, 8, 64, 1, False)) is None


def test_a_remembered_band_is_whole_percents_and_never_below_five():
    assert error_from_measured(0.0) == LEAST_REMEMBERED_ERROR == 0.05
    assert error_from_measured(0.061) == 0.07 and error_from_measured(0.07) == 0.07
    assert error_from_measured(0.4) == 0.4


def test_an_unreadable_or_unwritable_file_remembers_nothing(tmp_path):
    path = tmp_path / "prediction_errors.json"
    path.write_text("{not json")
    assert remembered_error("key", path) is None
    assert remember_error("key", 0.08, "ZBH1", path) == path  # written again whole
    band, source = remembered_error("key", path)
    assert band == 0.08 and "8.0%, ZBH1" in source
    path.write_text(json.dumps({"key": {"runs": [{"worst": "much"}]}}))
    assert remembered_error("key", path) is None
    for worst in (0.04, 0.09, 0.03, 0.02, 0.02, 0.01):  # six runs: the first is forgotten
        remember_error("other", worst, "ZBH1", path)
    assert remembered_error("other", path)[0] == 0.09
    remember_error("other", 0.01, "ZBH1", path)  # the 9% run is the seventh back now: forgotten
    assert remembered_error("other", path)[0] == LEAST_REMEMBERED_ERROR
    assert len(json.loads(path.read_text())["other"]["runs"]) == REMEMBERED_RUNS == 5
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert remember_error("key", 0.08, "ZBH1", blocked / "sub" / "errors.json") is None


def run_auto(monkeypatch, rounds: dict[str, list[float]], **options):
    """plan --run --steps auto over made-up rounds (milliseconds), handed out in the order they are asked
    for; returns the plan and the rounds each recording was asked for."""
    asked: list[int] = []
    handed = {name: 0 for name in rounds}

    def record(pipeline, names, microbatches, ranks, steps, **_):
        asked.append(steps)
        timelines = []
        for schedule in names:
            name = schedule_name(schedule)
            order = schedule_order(schedule, ranks, microbatches)
            timeline = simulate(order, StageCost(1 * MS, 1 * MS, 1 * MS), CommModel(), name=name)
            timeline = timeline.to_schedule_timeline()
            start = handed[name]  # both copies of 1F1B get the same rounds
            times = [value * MS for value in rounds[name][start : start + steps]]
            for rank in timeline.ranks:
                rank.step_times = list(times)
                rank.step_seconds = sorted(times)[(len(times) - 1) // 2]
            timelines.append(timeline)
        for name in {schedule_name(schedule) for schedule in names}:
            handed[name] += steps
        return timelines

    monkeypatch.setattr(planner, "record_schedules", record)
    monkeypatch.setattr(planner, "busy_machine_warning", lambda: "")
    plan = plan_schedules(
        "zoo-pipeline:mlp",
        ranks=2,
        microbatches=4,
        costs=four_stage_costs(),
        schedules=["1F1B", "GPipe"],
        run=True,
        steps="auto",
        overhead=0.0,
        comm=CommModel(),
        prediction_error=10.0,
        **{"recording_sets": 1, **options},
    )
    return plan, asked


def test_steps_auto_records_until_the_sign_test_decides(monkeypatch):
    # 12 of the first 15 rounds won (p = 0.018 < 0.05): decided at once
    plan, asked = run_auto(
        monkeypatch, {"1F1B": [100.0] * 400, "GPipe": [98.0] * 12 + [102.0] * 3 + [98.0] * 400}
    )
    assert asked == [15] and plan.recommended.name == "GPipe"
    assert plan.recording["auto"] == "15 rounds: decided, GPipe beat 1F1B beyond chance"
    assert "--steps auto recorded 15 rounds: decided, GPipe beat 1F1B beyond chance" in plan.table()
    # 10 of 15 (p = 0.15): at 2/3 a sign test at 0.05 needs rounds_to_decide(2/3) rounds; the next recording
    # brings them, all won, and decides
    needed = rounds_to_decide(10 / 15, 0.05)
    assert needed == 30  # 20 wins of 30 score 0.049; 19 of 29 score 0.068, 18 of 27 0.061
    assert sign_test_p_value(20, 30) < 0.05 <= sign_test_p_value(18, 27)
    plan, asked = run_auto(
        monkeypatch, {"1F1B": [100.0] * 400, "GPipe": [98.0] * 10 + [102.0] * 5 + [98.0] * 400}
    )
    assert asked == [15, needed - 15] and plan.recommended.name == "GPipe"
    assert len(plan.baseline.measured_steps) == needed and len(plan.control_steps) == needed
    # 6 of 15: nothing to wait for
    plan, asked = run_auto(
        monkeypatch, {"1F1B": [100.0] * 400, "GPipe": [98.0] * 6 + [102.0] * 9 + [98.0] * 400}
    )
    assert asked == [15] and plan.recommended is plan.baseline
    assert plan.recording["auto"] == "15 rounds: decided, no schedule was faster than 1F1B in most rounds"
    with pytest.raises(ValueError, match="'auto'"):
        plan_schedules(
            "zoo-pipeline:mlp", ranks=2, microbatches=4, costs=four_stage_costs(), run=True, steps=0
        )


def test_the_command_takes_the_new_options_and_says_1f1b_was_kept_when_it_measured_fastest(
    monkeypatch, tmp_path, capsys
):
    import json

    from graphkit.cli import main

    rounds = {"1F1B": [100.0] * 9, "GPipe": [104.0] * 9}
    run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"])  # installs the made-up recorder
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(four_stage_costs()))
    output = tmp_path / "plan"
    argv = ["plan", "zoo-pipeline:mlp", "--costs", str(costs), "--ranks", "2", "--microbatches", "4"]
    argv += ["--schedules", "1F1B,GPipe", "--run", "--steps", "9", "--prediction-error", "0.5"]
    argv += ["--record-budget", "100", "--weight-slowdown", "1.2", "-o", str(output)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # 1F1B measured fastest and is the best predicted after calibration: it was kept, not "measured faster"
    assert f"wrote {output}/best.csv (1F1B, kept: nothing measured faster" in out
    assert (
        "recorded every schedule predicted within 200% of the best predicted, where two predictions each off "
        "by up to 50% can swap order (--prediction-error), within a " in out
    )
    assert "noise floor: 1F1B recorded twice" in out
    saved = json.loads((output / "plan.json").read_text())
    assert saved["prediction_error"] == 0.5 and saved["record_budget_s"] == 100.0
    assert saved["weight_slowdown"] == 1.2 and saved["noise_floor"] == 0.0
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "zoo-pipeline:mlp", "--costs", str(costs), "--run", "--steps", "0"])
    assert exit_info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_splitting_faster_than_its_placement_but_not_beyond_chance_is_not_shown_to_pay(monkeypatch):
    from graphkit.measure.timing import rounds_to_decide

    # ZBV beats Interleaved1F1B (which is no faster than 1F1B) in 11 of 15 rounds, by 4% in the median
    # round (beyond the noise floor, p = 0.059): undecided
    rounds = {
        "1F1B": [100.0] * 15,
        "Interleaved1F1B": [99.0] * 7 + [101.0] * 8,
        "ZBVZeroBubble": [95.0] * 11 + [103.0] * 4,
    }
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
    line = plan.zero_bubble_verdict()
    assert line.startswith("zero bubble is not shown to pay here (ZBVZeroBubble"), line
    p = sign_test_p_value(11, 15)
    # one splitting schedule recorded: the line tests it at 0.05 (the pick at 0.025: two schedules vs 1F1B)
    assert plan.splitting_significance == 0.05 and plan.significance == 0.025
    needed = rounds_to_decide(11 / 15, plan.splitting_significance)
    assert needed is not None and needed > 15
    assert (
        f"could be chance (p = {p:.2g}, not below 0.05); at its win fraction (11 of 15) "
        f"a sign test would need about {needed} rounds to decide (--steps {needed})"
    ) in line


def test_a_recording_that_shared_its_cores_says_so_beside_the_pick(monkeypatch):
    rounds = {"1F1B": [100.0] * 11, "GPipe": [72.0] * 11}
    quiet = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"])
    assert quiet.recommended.name == "GPipe" and quiet.shared_cores_warning == ""
    assert "other processes used 0.00 cores while recording" in quiet.load
    assert "took CPU from the ranks" not in quiet.table()
    shared = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe"], other_cores=0.9)
    assert shared.other_processes_cores == 0.9
    table = shared.table()
    recommended = next(line for line in table.splitlines() if line.startswith("recommended: GPipe"))
    assert recommended.endswith(
        " - measured while other processes took CPU from the ranks: see the warning below"
    )
    assert "\nwarning: other processes used 0.90 cores while recording (of " in table
    assert shared.to_dict()["shared_cores_warning"] == shared.shared_cores_warning


def test_schedules_too_close_to_the_pick_are_recorded_again_and_the_run_off_decides(monkeypatch):
    rounds = {
        "1F1B": [100.0] * 15,
        "ZBVZeroBubble": [88.0] * 15,
        "DualPipeV": [89.0] * 15,  # within 4% of ZBV's 0.88x: a run-off
        "Interleaved1F1B": [97.0] * 15,  # 0.97x: not close enough
        "runoff": {
            "1F1B": [100.0] * 15,
            "ZBVZeroBubble": [95.0] * 15,
            "DualPipeV": [90.0] * 15,
            "Interleaved1F1B": [97.0] * 15,
        },
    }
    calls: list[list[str]] = []
    schedules = ["1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV"]
    plan = run_recorded(monkeypatch, rounds, schedules, runoff=True, calls=calls)
    # the finalists, their placement's non-splitting schedule (for the zero-bubble line), 1F1B and its copy
    # in three sets of new processes, five rounds each
    assert calls[1:] == [["ZBVZeroBubble", "DualPipeV", "Interleaved1F1B", "1F1B", "1F1B"]] * 3
    assert plan.runoff == {
        "finalists": ["ZBVZeroBubble", "DualPipeV"],
        "rounds": 15,
        "sized": "",  # as many as the first recording: the run-off orders, it need not decide against 1F1B
        "sets": [5, 5, 5],
        "first_pick": "ZBVZeroBubble",
        "margin": pytest.approx(0.04),
        "placements": ["Interleaved1F1B"],
    }
    assert len(plan.by_name("DualPipeV").measured_steps) == 30 == len(plan.baseline.measured_steps)
    assert len(plan.control_steps) == 30 == len(plan.by_name("Interleaved1F1B").measured_steps)
    assert plan.rounds_won(plan.by_name("DualPipeV"), plan.by_name("Interleaved1F1B")) == (30, 30)
    assert plan.runoff_ratio(plan.by_name("ZBVZeroBubble")) == pytest.approx(0.95)
    # over all 30 rounds ZBV still has the lower median (0.88 and 0.95: the lower middle), but the run-off
    # alone orders the finalists
    assert plan.recommended.name == "DualPipeV"
    assert (
        "\nrun-off: ZBVZeroBubble and DualPipeV measured within 4.0% of ZBVZeroBubble, the first run's pick, "
        "against 1F1B in the median round (the noise floor, at least 4%): too close for one run to order; "
        "recorded again with 1F1B and Interleaved1F1B (their placement, for the zero-bubble line) in three "
        "sets of new processes (5, 5 and 5 rounds: 15 more rounds, 1F1B's and theirs now count 30), in those "
        "alone against 1F1B, the mean of each set's median round (the rounds won; each set's): DualPipeV "
        "0.900x (15 of 15; 0.900x, 0.900x, 0.900x), ZBVZeroBubble 0.950x (15 of 15; 0.950x, 0.950x, 0.950x); "
        "recommended: the best of them there that beat 1F1B beyond the noise floor and beyond chance, over all "
        "30 rounds or in the run-off's alone (p < 0.025): DualPipeV is recommended (the first run picked "
        "ZBVZeroBubble)"
    ) in plan.table()
    assert plan.to_dict()["runoff"]["first_pick"] == "ZBVZeroBubble"


def test_a_run_off_of_both_placements_records_each_ones_non_splitting_schedule_and_names_them(monkeypatch):
    first = {
        "1F1B": [100.0] * 15,
        "GPipe": [98.0] * 15,  # one stage per rank: faster than 1F1B, so ZBH1's placement
        "Interleaved1F1B": [97.0] * 15,
        "ZBVZeroBubble": [88.0] * 15,
        "ZBH1": [90.0] * 15,  # within 4% of ZBV's 0.88x
    }
    calls: list[list[str]] = []
    plan = run_recorded(monkeypatch, {**first, "runoff": first}, list(first), runoff=True, calls=calls)
    assert calls[1] == ["ZBVZeroBubble", "ZBH1", "Interleaved1F1B", "GPipe", "1F1B", "1F1B"]
    assert plan.runoff["placements"] == ["Interleaved1F1B", "GPipe"]
    assert (
        "; recorded again with 1F1B, Interleaved1F1B and GPipe (their placements, for the zero-bubble line) in "
        "three sets of new processes" in plan.table()
    )


def test_no_run_off_where_the_pick_stands_apart_or_1f1b_is_kept(monkeypatch):
    calls: list[list[str]] = []
    rounds = {"1F1B": [100.0] * 15, "ZBVZeroBubble": [88.0] * 15, "DualPipeV": [93.0] * 15}
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "ZBVZeroBubble", "DualPipeV"], runoff=True, calls=calls)
    assert len(calls) == 1 and plan.runoff is None and plan.recommended.name == "ZBVZeroBubble"
    assert "run-off" not in plan.table()
    calls.clear()  # 1F1B kept, and nothing beat it in most rounds: nothing to confirm
    rounds = {"1F1B": [100.0] * 15, "GPipe": [99.0] * 7 + [101.0] * 8, "ZBH1": [99.5] * 6 + [101.0] * 9}
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe", "ZBH1"], runoff=True, calls=calls)
    assert len(calls) == 1 and plan.recommended is plan.baseline and plan.runoff_finalists() == []


CALLED_BY_NONE = {
    "1F1B": [100.0] * 15,
    "GPipe": [95.0] * 11 + [101.0] * 4,
    "ZBH1": [96.0] * 11 + [101.0] * 4,
    "ZBH2": [97.0] * 10 + [101.0] * 5,
    "CostAware": [102.0] * 15,
}
"""A first recording (milliseconds a round) that calls no schedule: four against 1F1B, each tested at 0.0125
(13 of 15); GPipe and ZBH1 won 11 of 15, ZBH2 10, CostAware none."""


def test_contenders_the_first_run_could_not_call_are_confirmed_on_rounds_of_their_own(monkeypatch):
    # five schedules against 1F1B: 0.05 / 5 = 0.01 needs 13 of 15; GPipe (11 of 15), ZBH1 (11), ZBH2 (10)
    # won most rounds, ZBH2 by less than the others; Adaptive and CostAware lost most
    first = dict(CALLED_BY_NONE)
    # GPipe's and ZBH1's 11 of 15 need 26 rounds at 0.05 / 3: the run-off records 26
    assert rounds_to_decide(11 / 15, 0.05 / 3) == 26
    runoff = {
        "1F1B": [100.0] * 26,
        "GPipe": [99.0] * 14 + [101.0] * 12,
        "ZBH1": [95.0] * 25 + [101.0],
        "ZBH2": [98.0] * 26,
    }
    calls: list[list[str]] = []
    names = ["1F1B", "GPipe", "ZBH1", "ZBH2", "CostAware"]  # (Adaptive comes out as ZBH1's order here)
    before = run_recorded(monkeypatch, {**first}, names)
    assert before.recommended is before.baseline and before.significance == 0.0125
    assert "in the table, measured ms" not in before.table()  # no run-off: every row counts 15 rounds
    assert [item.name for item in before.runoff_finalists()] == [
        "GPipe",
        "ZBH1",
        "ZBH2",
    ]  # at most 3, best first
    plan = run_recorded(monkeypatch, {**first, "runoff": runoff}, names, runoff=True, calls=calls)
    assert calls[1] == ["GPipe", "ZBH1", "ZBH2", "1F1B", "1F1B"]  # ZBH1's placement is 1F1B's own
    assert plan.runoff_significance == pytest.approx(0.05 / 3)
    # ZBH1: 25 of 26 in the run-off (p < 0.017); ZBH2 26 of 26 but slower there; GPipe 14 of 26
    assert plan.won_runoff_beyond_chance(plan.by_name("ZBH2")) and not plan.won_runoff_beyond_chance(
        plan.by_name("GPipe")
    )
    assert plan.recommended.name == "ZBH1"
    line = next(line for line in plan.table().splitlines() if line.startswith("run-off"))
    assert line.startswith(
        "run-off: GPipe, ZBH1 and ZBH2 beat 1F1B in most rounds and beyond the noise floor, but not beyond "
        "chance at the level every recorded schedule shares: tested again on rounds of their own at 0.05 split "
        "among them (0.017); recorded again with 1F1B in three sets of new processes (9, 9 and 8 rounds: 26 "
        "more rounds, as many as a sign test at 0.017 needs at GPipe's win fraction in the first recording (11 "
        "of 15), 1F1B's and theirs now count 41)"
    )
    assert (
        "in those alone against 1F1B, the mean of each set's median round (the rounds won; each set's): ZBH1 "
        "0.950x (25 of 26; 0.950x, 0.950x, 0.950x), ZBH2 0.980x (26 of 26; 0.980x, 0.980x, 0.980x), GPipe "
        "0.997x (14 of 26; 0.990x, 0.990x, 1.010x)" in line
    )
    assert line.endswith("ZBH1 is recommended (the first run picked 1F1B)")
    # the table's measured columns count 41 rounds for the finalists and 1F1B, 15 for CostAware
    assert len(plan.by_name("CostAware").measured_steps) == 15
    assert (
        "\nin the table, measured ms, median round and won are over each schedule's own rounds: 41 for 1F1B, "
        "GPipe, ZBH1 and ZBH2 (recorded again in the run-off), 15 for the others (the first recording's alone); "
        "the run-off line compares its finalists on its rounds alone\n"
    ) in plan.table()
    # where the run-off confirms none, 1F1B is kept: the next test


def test_keep_1f1b_after_a_run_off_names_the_closest_by_its_share_of_the_rounds_that_decide_it(monkeypatch):
    # the first recording of the test above (15 rounds, four schedules against 1F1B: each tested at 0.0125);
    # its run-off records GPipe, ZBH1 and ZBH2 again, 26 rounds in sets of 9, 9 and 8
    first = dict(CALLED_BY_NONE)
    names = list(first)
    runoff = {
        "1F1B": [100.0] * 26,
        "GPipe": [101.0] * 26,
        "ZBH1": [99.0] * 9 + [101.0] * 17,
        "ZBH2": [102.0] * 26,
    }
    plan = run_recorded(monkeypatch, {**first, "runoff": runoff}, names, runoff=True)
    assert plan.recommended is plan.baseline and plan.significance == 0.0125
    assert next(line for line in plan.table().splitlines() if line.startswith("run-off")).endswith(
        "none of them did: keep 1F1B"
    )
    # over all 41 rounds ZBH1 won 11 + 9, but the first recording chose it: in the run-off alone it won 9 of
    # 26, still the largest share (CostAware 0 of 15); its sets measured 0.99x, 1.01x and 1.01x
    assert plan.rounds_won(plan.by_name("ZBH1")) == (20, 41)
    assert plan.closest_contender().name == "ZBH1"
    table = plan.table()
    assert (
        "; closest (the largest share of rounds won, the run-off's alone for its finalists): ZBH1, faster in 9 "
        "of the run-off's 26 rounds (p = 0.96), 1.00x in the run-off (the mean of its sets' median rounds)"
    ) in table
    assert "rounds to decide" not in table  # it lost most of them: no power estimate
    # what keeping 1F1B means for each: the finalists had to win enough of the run-off's 26 rounds at its
    # level, CostAware enough of its 15 at the level every recorded schedule shares
    wins = fewest_wins_beyond_chance(26, 0.05 / 3), fewest_wins_beyond_chance(15, 0.0125)
    assert (
        "recommended: keep 1F1B - no schedule measured faster than 1F1B in the median round, with a median step "
        "below 1F1B's, and in more rounds than chance would give (sign test, 0.05 split among the schedules "
        "recorded, and in the run-off among its finalists; wins needed: the run-off's finalists: at least "
        f"{wins[0]} of its 26 rounds at p < 0.017; the others: at least {wins[1]} of 15 rounds at p < 0.013); "
        "closest"
    ) in table

    # a finalist the first recording's rounds and the run-off's together would call (GPipe: 11 of 15, then
    # 18 of 26, 29 of 41 in all: p = 0.006, 0.99x over them) but the run-off's alone do not (18 of 26:
    # p = 0.038; its sets 0.99x, 0.99x and 1.03x): the first recording chose it for the rounds it won there,
    # so 1F1B is kept
    mixed = {
        "1F1B": [100.0] * 26,
        "GPipe": [99.0] * 18 + [103.0] * 8,
        "ZBH1": [101.0] * 26,
        "ZBH2": [102.0] * 26,
    }
    plan = run_recorded(monkeypatch, {**first, "runoff": mixed}, names, runoff=True)
    gpipe = plan.by_name("GPipe")
    assert plan.rounds_won(gpipe) == (29, 41) and sign_test_p_value(29, 41) < plan.significance
    assert plan.round_ratio(gpipe) == pytest.approx(0.99) and plan.runoff_decides_alone
    assert sign_test_p_value(18, 26) > plan.runoff_significance
    assert plan.recommended is plan.baseline
    assert next(line for line in plan.table().splitlines() if line.startswith("run-off")).endswith(
        "recommended: the best of them there that beat 1F1B beyond the noise floor and beyond chance in the "
        "run-off's rounds alone (p < 0.017; the first recording's rounds chose them, so they do not count "
        "again): none of them did: keep 1F1B"
    )

    # a finalist that won most of the run-off's rounds, not enough of them: its win fraction there, and the
    # rounds --steps would need at the first recording's level (--steps sets that recording; 0.0125)
    plan = run_recorded(
        monkeypatch, {**first, "runoff": {**runoff, "ZBH2": [99.0] * 16 + [101.0] * 10}}, names, runoff=True
    )
    assert plan.recommended is plan.baseline and plan.closest_contender().name == "ZBH2"
    needed = rounds_to_decide(16 / 26, 0.0125)
    assert needed is not None and needed > rounds_to_decide(16 / 26, 0.05 / 3) > 26
    assert (
        "; closest (the largest share of rounds won, the run-off's alone for its finalists): ZBH2, faster in "
        "16 of the run-off's 26 rounds (p = 0.16)"
    ) in plan.table()
    assert (
        f"at its win fraction (16 of 26, 62%, in the run-off) a sign test at p < 0.013 would need about "
        f"{needed} rounds to decide (--steps {needed})"
    ) in plan.table()

    # a schedule the run-off left out (at most three go: CostAware, 12 of 15 at 0.999x, came fourth) is still
    # the closest where every finalist lost the run-off
    losing = {"1F1B": [100.0] * 26, "GPipe": [101.0] * 26, "ZBH1": [101.0] * 26, "ZBH2": [102.0] * 26}
    plan = run_recorded(
        monkeypatch,
        {**first, "CostAware": [99.9] * 12 + [130.0] * 3, "runoff": losing},
        names,
        runoff=True,
    )
    assert plan.runoff["finalists"] == ["GPipe", "ZBH1", "ZBH2"]
    assert plan.recommended is plan.baseline and plan.closest_contender().name == "CostAware"
    assert (
        "; closest (the largest share of rounds won): CostAware, faster in 12 of 15 rounds (p = 0.018), 1.00x "
        f"in the median round; at its win fraction (12 of 15, 80%) a sign test at p < 0.013 would need about "
        f"{rounds_to_decide(12 / 15, 0.0125)} rounds"
    ) in plan.table()

    # wins beyond chance in the run-off, but not beyond the noise floor: no count of rounds to ask for
    # (20 of 26, p = 0.005, 0.999x over all 41 rounds; the A/A control's copies 1% apart)
    beyond = {**losing, "control": [101.0] * 26, "ZBH2": [99.9] * 20 + [101.0] * 6}
    plan = run_recorded(monkeypatch, {**first, "control": [101.0] * 15, "runoff": beyond}, names, runoff=True)
    assert plan.recommended is plan.baseline and plan.closest_contender().name == "ZBH2"
    assert sign_test_p_value(20, 26) < plan.runoff_significance
    table = plan.table()
    # the reason 1F1B is kept names the noise floor, which ZBH2's 30 wins of 41 (0.999x) did not pass
    assert plan.rounds_won(plan.by_name("ZBH2")) == (30, 41)
    assert (
        "recommended: keep 1F1B - no schedule measured faster than 1F1B by more than the noise floor (1.0%) in "
        "the median round, with a median step below 1F1B's, and in more rounds than chance would give"
    ) in table
    assert (
        "; its wins are already beyond chance (p < 0.017): what kept 1F1B is that it measured 1.003x 1F1B there, "
        "not below it by more than the noise floor (1.0%)"
    ) in table
    assert "rounds to decide" not in table


def test_a_run_off_held_because_1f1b_would_be_kept_confirms_its_finalists_on_its_own_rounds(monkeypatch):
    # DualPipeV won 10 of 15 rounds (p = 0.15 at 0.025): a run-off of 30 rounds records it again with
    # Interleaved1F1B, its placement. There DualPipeV loses every round and Interleaved1F1B wins every one
    # (0.90x): Interleaved1F1B, not chosen by the first recording (it lost all 15 there), counts all its 45
    # rounds (30 won, p = 0.018 at 0.025) and is recommended
    first = {"1F1B": [100.0] * 15, "Interleaved1F1B": [101.0] * 15, "DualPipeV": [95.0] * 10 + [101.0] * 5}
    runoff = {"1F1B": [100.0] * 30, "Interleaved1F1B": [90.0] * 30, "DualPipeV": [101.0] * 30}
    plan = run_recorded(monkeypatch, {**first, "runoff": runoff}, list(first), runoff=True)
    assert plan.runoff["finalists"] == ["DualPipeV"] and plan.runoff["placements"] == ["Interleaved1F1B"]
    assert plan.runoff_decides_alone and plan.recommended.name == "Interleaved1F1B"
    assert (
        "recommended: Interleaved1F1B (faster than 1F1B in its median step, in the median round and in 30 of 45 "
        "rounds: p = 0.018 that chance did it, below 0.025"
    ) in plan.table()

    # a run-off of that kind past the --record-budget: 1F1B is kept, and the line does not call it a pick
    plan = run_recorded(monkeypatch, dict(first), list(first), runoff=True, record_budget_s=2.0)
    assert "skipped" in plan.runoff and plan.recommended is plan.baseline
    assert next(line for line in plan.table().splitlines() if line.startswith("run-off")).endswith(
        "would pass the --record-budget: 1F1B is kept, though any of them may beat it"
    )

    # ZBH1 (1F1B's placement) won 11 of 15, then 18 of the run-off's 26 (6 of each set's 9, 9 and 8 at 0.99x):
    # 29 of 41 over all of them, but 18 of 26 is not beyond chance at 0.017. Every line reads the run-off's
    # rounds for it: best measured, the keep-1F1B verdict, and the zero-bubble line, which calls splitting
    # "not shown to pay" rather than "pays" on the first recording's flattering rounds
    first = {
        "1F1B": [100.0] * 15,
        "GPipe": [101.0] * 15,
        "ZBH1": [95.0] * 11 + [101.0] * 4,
        "ZBH2": [97.0] * 10 + [101.0] * 5,
        "CostAware": [96.0] * 11 + [101.0] * 4,
    }

    def one_set(rounds: int) -> dict[str, list[float]]:
        return {
            "1F1B": [100.0] * rounds,
            "ZBH1": [99.0] * 6 + [103.0] * (rounds - 6),
            "ZBH2": [102.0] * rounds,
            "CostAware": [102.0] * rounds,
            "GPipe": [101.0] * rounds,
        }

    plan = run_recorded(
        monkeypatch, {**first, "runoff": [one_set(9), one_set(9), one_set(8)]}, list(first), runoff=True
    )
    zbh1 = plan.by_name("ZBH1")
    assert plan.runoff["rounds"] == 26 and plan.rounds_won(zbh1) == (29, 41)
    assert plan.runoff_rounds_won(zbh1) == (18, 26) and plan.recommended is plan.baseline
    table = plan.table()
    assert (
        "best measured: ZBH1 (median step 99.00 ms, 0.99x of 1F1B in the median round, 0.990x in the run-off (the "
        "mean of its sets' median rounds), faster in 18 of 26 "
    ) in table
    assert "rounds of the run-off, p = 0.038)" in table
    verdict = plan.zero_bubble_verdict()
    assert verdict.startswith(
        "zero bubble is not shown to pay here (ZBH1 measured 0.99x 1F1B in the median round, faster in 18 of 26 "
        "rounds (p = 0.038)"
    ), verdict


def test_a_run_off_past_the_budget_is_named_not_recorded(monkeypatch):
    calls: list[list[str]] = []
    rounds = {"1F1B": [100.0] * 15, "ZBVZeroBubble": [88.0] * 15, "DualPipeV": [89.0] * 15}
    plan = run_recorded(
        monkeypatch,
        rounds,
        ["1F1B", "ZBVZeroBubble", "DualPipeV"],
        runoff=True,
        calls=calls,
        record_budget_s=2.0,  # the first recording fits (about 1.1 s predicted); 18 x 0.377 s more does not
    )
    assert len(calls) == 1 and plan.runoff["skipped"].startswith("recording them again (about 7 s)")
    assert plan.recommended.name == "ZBVZeroBubble"
    assert (
        "too close for one run to order; not recorded again, recording them again (about 7 s) would pass the "
        "--record-budget: the pick may be any of them"
    ) in plan.table()


def test_a_splitting_schedule_of_1f1bs_placement_is_measured_against_gpipe_in_plain_words(monkeypatch):
    # a newcomer's plan: GPipe beat 1F1B, CostAware (splitting, one stage per rank) lost to both
    rounds = {"1F1B": [100.0] * 11, "GPipe": [72.0] * 11, "CostAware": [107.0] * 11}
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe", "CostAware"])
    line = plan.zero_bubble_verdict()
    assert line.startswith(
        "zero bubble does not pay here (CostAware measured 1.07x 1F1B in the median round;"
    )
    assert (
        "it has 1F1B's placement (one stage per rank), where GPipe, which splits nothing, measured 0.72x 1F1B "
        "in the median round (faster in 11 of 11"
    ) in line
    assert "splitting gains -48.6% (slower) over GPipe (CostAware against GPipe in the same rounds" in line
    assert "it does not beat 1F1B, and GPipe does without splitting: run GPipe" in line
    assert "its placement's, not splitting's" not in line


def test_the_plan_gives_the_batch_and_the_command_that_checks_its_pick(monkeypatch):
    rounds = {"1F1B": [100.0] * 15, "GPipe": [90.0] * 15, "ZBH1": [95.0] * 15, "CostAware": [97.0] * 15}
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe", "ZBH1", "CostAware"])
    table = plan.table()
    assert table.startswith(
        "zoo-pipeline:mlp: 2 ranks, 4 microbatches of 8 rows (batch 32, --batch-size); model"
    )
    command = plan.remeasure_command()
    # generated schedules without a written order run by name (plan -o DIR writes their CSVs)
    assert command == (
        "graphkit compare-schedules zoo-pipeline:mlp --ranks 2 --microbatches 4 --batch-size 32 --steps 15 "
        "--process-sets 3 --control --schedules 1F1B,GPipe,ZBH1,CostAware --timeout 600 (plan with -o DIR first: by "
        "name, CostAware is built anew from default costs, not the order recorded here)"
    )
    assert (
        f"\nto check the pick in a separate run (new processes; the pick holds where it measures within its precision line of the best, twice the comparison's standard error): {command}"
        in table
    )
    assert plan.to_dict()["remeasure_command"] == command and plan.to_dict()["batch_size"] == 32
    # the plan's recordings ran under the plan's --timeout (600 s by default), each set of them with more
    # schedules than the check's: the check gets the same limit, named where it is not compare-schedules' own
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "GPipe", "ZBH1", "CostAware"], timeout_s=120.0)
    assert " --timeout" not in plan.remeasure_command()
    parsed = build_parser().parse_args(["compare-schedules", "zoo-pipeline:mlp"])
    assert parsed.timeout == COMPARE_TIMEOUT_S == 120.0


def test_splitting_that_gains_over_a_winning_placement_but_not_beyond_chance_is_undecided(monkeypatch):
    # measured (GPT-2, 8 microbatches): Interleaved1F1B beat 1F1B beyond chance (0.94x), DualPipeV beat
    # Interleaved1F1B by 5.7% in 16 of 21 rounds, p = 0.013 at a level of 0.0071 (seven splitting
    # schedules): undecided, not "its placement's, not splitting's"; here 14 of 21 (p = 0.095) at 0.05
    rounds = {
        "1F1B": [100.0] * 21,
        "Interleaved1F1B": [94.0] * 21,
        "DualPipeV": [89.0] * 14 + [96.0] * 7,
    }
    plan = run_recorded(monkeypatch, rounds, ["1F1B", "Interleaved1F1B", "DualPipeV"])
    line = plan.zero_bubble_verdict()
    assert line.startswith("zero bubble is not shown to pay here (DualPipeV measured 0.89x 1F1B"), line
    assert "its placement's, not splitting's" not in line
    assert f"splitting's 5.3% over its placement could be chance (p = {sign_test_p_value(14, 21):.2g}" in line


def test_an_undecided_zero_bubble_question_gets_a_run_off_of_its_own(monkeypatch):
    first = {"1F1B": [100.0] * 21, "Interleaved1F1B": [94.0] * 21, "DualPipeV": [89.0] * 14 + [96.0] * 7}
    runoff = {"1F1B": [100.0] * 21, "Interleaved1F1B": [94.0] * 21, "DualPipeV": [90.0] * 21}
    calls: list[list[str]] = []
    names = ["1F1B", "Interleaved1F1B", "DualPipeV"]
    assert run_recorded(monkeypatch, {**first}, names).splitting_undecided(
        run_recorded(monkeypatch, {**first}, names).by_name("DualPipeV")
    )
    plan = run_recorded(monkeypatch, {**first, "runoff": runoff}, names, runoff=True, calls=calls)
    assert calls[1] == ["DualPipeV", "Interleaved1F1B", "1F1B", "1F1B"]
    assert plan.recommended.name == "DualPipeV" and plan.rounds_won(
        plan.by_name("DualPipeV"), plan.by_name("Interleaved1F1B")
    ) == (35, 42)
    line = next(line for line in plan.table().splitlines() if line.startswith("run-off"))
    assert line.startswith(
        "run-off: DualPipeV, the first run's pick, beat its placement's non-splitting schedule beyond the noise "
        "floor but not beyond chance: recorded again to decide whether zero bubble pays; recorded again with "
        "1F1B and Interleaved1F1B (their placement, for the zero-bubble line) in three sets of new processes "
        "(7, 7 and 7 rounds: 21 more rounds"
    )
    assert plan.zero_bubble_verdict().startswith("zero bubble pays here (DualPipeV")


def test_a_pick_confirmed_by_the_run_off_alone_says_so(monkeypatch):
    first = {"1F1B": [100.0] * 21, "ZBH1": [95.0] * 11 + [101.0] * 10, "GPipe": [95.5] * 11 + [101.0] * 10}
    runoff = {"1F1B": [100.0] * 21, "ZBH1": [95.0] * 16 + [101.0] * 5, "GPipe": [101.0] * 21}
    plan = run_recorded(monkeypatch, {**first, "runoff": runoff}, ["1F1B", "ZBH1", "GPipe"], runoff=True)
    zbh1 = plan.by_name("ZBH1")
    assert plan.rounds_won(zbh1) == (27, 42) and not plan.won_beyond_chance(zbh1)  # p = 0.044, level 0.025
    assert plan.won_runoff_beyond_chance(zbh1) and plan.recommended is zbh1  # 16 of 21: p = 0.013 < 0.025
    line = next(line for line in plan.table().splitlines() if line.startswith("recommended: ZBH1"))
    assert (
        f"in 16 of 21 rounds of the run-off: p = {sign_test_p_value(16, 21):.2g} that chance did it, below 0.025;"
    ) in line


def test_a_placement_recorded_again_in_the_run_off_stays_the_one_splitting_is_measured_against(monkeypatch):
    # LoopedBFS beat Interleaved1F1B in the first recording and is recorded again beside DualPipeV; in the
    # run-off it measures slower, but Interleaved1F1B (21 rounds only) must not take its place
    first = {
        "1F1B": [100.0] * 21,
        "Interleaved1F1B": [95.0] * 14 + [101.0] * 7,
        "LoopedBFS": [94.0] * 21,
        "DualPipeV": [89.0] * 14 + [95.0] * 7,
    }
    runoff = {"1F1B": [100.0] * 21, "LoopedBFS": [98.0] * 21, "DualPipeV": [90.0] * 21}
    calls: list[list[str]] = []
    names = ["1F1B", "Interleaved1F1B", "LoopedBFS", "DualPipeV"]
    plan = run_recorded(monkeypatch, {**first, "runoff": runoff}, names, runoff=True, calls=calls)
    assert calls[1] == ["DualPipeV", "LoopedBFS", "1F1B", "1F1B"]
    looped, interleaved = plan.by_name("LoopedBFS"), plan.by_name("Interleaved1F1B")
    assert plan.round_ratio(looped) == pytest.approx(0.96) and plan.round_ratio(interleaved) == pytest.approx(
        0.95
    )
    assert plan.placement_baseline(plan.by_name("DualPipeV")) is looped
    verdict = plan.zero_bubble_verdict()
    # the placement's own rounds (42), not the ones of another schedule
    assert (
        "(LoopedBFS, which splits nothing: 0.96x 1F1B in the median round, faster in 42 of 42, p = "
        in verdict
    )
    assert (
        "DualPipeV against LoopedBFS in the same rounds: 0.93x in the median round, faster in 35 of 42"
        in verdict
    )
    assert verdict.startswith("zero bubble pays here (DualPipeV")
    # both sets of processes measured splitting faster than its placement, and the line says each
    assert (
        "; 0.947x in the first recording's processes, 0.918x, 0.918x and 0.918x in the run-off's three; over "
        "the four sets 0.925x, t-test p = 0.001)" in verdict
    )
    # a placement recorded in the first run only says its own 21 rounds
    plan = run_recorded(monkeypatch, {**first}, ["1F1B", "Interleaved1F1B", "DualPipeV"], runoff=False)
    assert "(Interleaved1F1B, which splits nothing: 0.95x 1F1B in the median round, faster in 14 of 21" in (
        plan.zero_bubble_verdict()
    )


def test_splitting_that_changes_sign_between_sets_of_processes_is_not_shown_to_pay_either_way(monkeypatch):
    # as measured on GPT-2 at 8 microbatches: DualPipeV 1.01x Interleaved1F1B in the first recording's
    # processes, 0.98x in the run-off's; pooled it tied (within the A/A's 0.6%), and the line used to say
    # that splitting "does not pay", while a separate run measured DualPipeV 5.5% ahead. The run-off keeps
    # the first recording's 21 rounds here (rounds split between two figures stray, and would size it)
    monkeypatch.setattr(planner, "RUNOFF_STANDARD_ERROR", 1.0)
    first = {
        "1F1B": [100.0] * 21,
        "control": [100.6] * 21,
        "Interleaved1F1B": [95.0] * 21,
        "DualPipeV": [96.0] * 21,
    }
    runoff = {
        "1F1B": [100.0] * 21,
        "control": [100.6] * 21,
        "Interleaved1F1B": [95.0] * 21,
        "DualPipeV": [93.0] * 21,
    }
    calls: list[list[str]] = []
    plan = run_recorded(
        monkeypatch,
        {**first, "runoff": runoff},
        ["1F1B", "Interleaved1F1B", "DualPipeV"],
        runoff=True,
        calls=calls,
    )
    assert calls[1] == ["Interleaved1F1B", "DualPipeV", "1F1B", "1F1B"]
    dual, interleaved = plan.by_name("DualPipeV"), plan.by_name("Interleaved1F1B")
    assert plan.recommended is dual and plan.placement_baseline(dual) is interleaved
    assert plan.ratio_by_process_set(dual, interleaved) == pytest.approx([96 / 95] + [93 / 95] * 3)
    assert plan.noise_floor == pytest.approx(0.006)
    # pooled: within the noise floor of its placement, which beats 1F1B without splitting
    assert abs(plan.round_ratio(dual, interleaved) - 1) < plan.noise_floor
    verdict = plan.zero_bubble_verdict()
    assert verdict.startswith("zero bubble is not shown to pay here (DualPipeV"), verdict
    assert (
        "; 1.011x in the first recording's processes, 0.979x, 0.979x and 0.979x in the run-off's three; over "
        "the four sets 0.987x, t-test p = 0.096)" in (verdict)
    )
    assert (
        "the four sets of processes disagree on what splitting gains over its placement (1.011x in the first "
        "recording's processes, 0.979x, 0.979x and 0.979x in the run-off's three)" in verdict
    )
    assert "placement's, not splitting's" not in verdict
    # the other way round: pooled, splitting pays beyond chance, but the first set measured it slower
    first["DualPipeV"] = [90.0] * 10 + [96.0] * 11
    runoff["DualPipeV"] = [80.0] * 21
    plan = run_recorded(
        monkeypatch, {**first, "runoff": runoff}, ["1F1B", "Interleaved1F1B", "DualPipeV"], runoff=True
    )
    dual, interleaved = plan.by_name("DualPipeV"), plan.by_name("Interleaved1F1B")
    assert plan.ratio_by_process_set(dual, interleaved) == pytest.approx([96 / 95] + [80 / 95] * 3)
    assert plan.rounds_won(dual, interleaved) == (31, 42)
    assert sign_test_p_value(31, 42) < plan.splitting_significance
    assert plan.beyond_noise(plan.round_ratio(dual, interleaved))  # pooled, it pays
    # the sets are the independent draws: three of four 16% ahead outweigh one 1% behind (a t-test over the
    # sets' logarithms, p = 0.035, below the line's 0.05)
    verdict = plan.zero_bubble_verdict()
    assert verdict.startswith("zero bubble pays here (DualPipeV"), verdict
    assert "; over the four sets 0.881x, t-test p = 0.035)" in verdict
    # where the run-off's sets spread too (0.842x, 0.989x, 0.842x), the four sets' mean is not below 1
    # beyond chance (p = 0.09), though the pooled rounds still pay (31 of 42): not shown to pay
    runoff_sets = [{**runoff, "DualPipeV": [ms] * 7} for ms in (80.0, 94.0, 80.0)]
    plan = run_recorded(
        monkeypatch, {**first, "runoff": runoff_sets}, ["1F1B", "Interleaved1F1B", "DualPipeV"], runoff=True
    )
    dual, interleaved = plan.by_name("DualPipeV"), plan.by_name("Interleaved1F1B")
    assert plan.ratio_by_process_set(dual, interleaved) == pytest.approx([96 / 95, 80 / 95, 94 / 95, 80 / 95])
    assert plan.rounds_won(dual, interleaved) == (31, 42)
    verdict = plan.zero_bubble_verdict()
    assert verdict.startswith("zero bubble is not shown to pay here (DualPipeV"), verdict
    assert "t-test p = 0.09" in verdict and "the four sets of processes disagree" in verdict
    # with one set of processes there is nothing to disagree: one figure, no per-set clause
    plan = run_recorded(monkeypatch, {**first}, ["1F1B", "Interleaved1F1B", "DualPipeV"], runoff=False)
    dual, interleaved = plan.by_name("DualPipeV"), plan.by_name("Interleaved1F1B")
    assert plan.ratio_by_process_set(dual, interleaved) == pytest.approx([96 / 95])
    assert "run-off's" not in plan.zero_bubble_verdict()


def test_a_run_off_splits_its_rounds_into_sets_of_processes_of_at_least_five():
    assert process_set_sizes(21) == [7, 7, 7]
    assert process_set_sizes(31) == [11, 10, 10]
    assert process_set_sizes(10) == [5, 5]
    assert process_set_sizes(9) == [9]
    assert process_set_sizes(3) == [3]
    assert all(sum(process_set_sizes(rounds)) == rounds for rounds in range(1, 80))


def _level_runoff(monkeypatch, zbv: list[float], dual: list[float]):
    """A plan whose first recording put ZBVZeroBubble and DualPipeV within the run-off margin, and whose
    run-off measured them (against 1F1B's 100 ms) at ``zbv`` and ``dual`` ms in its three sets of
    processes, seven rounds each."""
    first = {
        "1F1B": [100.0] * 21,
        "Interleaved1F1B": [97.0] * 21,
        "ZBVZeroBubble": [90.0] * 21,
        "DualPipeV": [90.5] * 21,
    }
    runoff = [
        {
            "1F1B": [100.0] * 7,
            "Interleaved1F1B": [97.0] * 7,
            "ZBVZeroBubble": [one] * 7,
            "DualPipeV": [two] * 7,
        }
        for one, two in zip(zbv, dual, strict=True)
    ]
    calls: list[list[str]] = []
    plan = run_recorded(monkeypatch, {**first, "runoff": runoff}, list(first), runoff=True, calls=calls)
    assert len(calls) == 4 and plan.runoff["sets"] == [7, 7, 7]
    return plan


def test_finalists_the_sets_of_processes_cannot_order_are_level_and_the_one_holding_less_memory_is_picked(
    monkeypatch,
):
    # DualPipeV is faster in the mean over the run-off's sets (0.904x against 0.905x), but ZBVZeroBubble was
    # faster in the first set: level, and ZBV holds less memory (predicted 1.0 MiB per rank against 1.25)
    plan = _level_runoff(monkeypatch, zbv=[90.0, 91.0, 90.5], dual=[91.0, 90.0, 90.2])
    zbv, dual = plan.by_name("ZBVZeroBubble"), plan.by_name("DualPipeV")
    assert plan.runoff_ratios(zbv) == pytest.approx([0.90, 0.91, 0.905])
    assert plan.runoff_ratio(dual) == pytest.approx(0.904) and plan.runoff_ratio(zbv) == pytest.approx(0.905)
    assert max(zbv.simulation.peak_memory_bytes) < max(dual.simulation.peak_memory_bytes)
    assert plan.level_with(zbv, dual) and plan.runoff_level() == [dual, zbv]
    assert plan.recommended is zbv
    line = next(line for line in plan.table().splitlines() if line.startswith("run-off"))
    assert line.endswith(
        "ZBVZeroBubble is recommended (as in the first run); ZBVZeroBubble and DualPipeV are level: the "
        "run-off's sets of processes cannot tell them apart (t-test over the sets, p >= 0.05) and their means "
        "lie within 1%, so which is faster can change from one set of processes, or one run, to the next; "
        "ZBVZeroBubble holds the least memory (predicted peak on the busiest rank 1.0 MiB, against DualPipeV "
        "1.2 MiB)"
    )
    assert "DualPipeV 0.904x (21 of 21; 0.910x, 0.900x, 0.902x)" in line


def test_finalists_are_not_level_where_every_set_orders_them_alike_or_the_means_are_apart(monkeypatch):
    # every set: DualPipeV ahead, if only just; the faster one is recommended, whatever its memory
    plan = _level_runoff(monkeypatch, zbv=[90.5, 90.4, 90.6], dual=[90.4, 90.3, 90.5])
    assert not plan.level_with(plan.by_name("ZBVZeroBubble"), plan.by_name("DualPipeV"))
    assert plan.recommended.name == "DualPipeV" and " are level" not in plan.table()
    # the sets disagree, but DualPipeV is 2.3 points ahead in the mean: not level
    plan = _level_runoff(monkeypatch, zbv=[90.0, 93.0, 94.0], dual=[91.0, 90.0, 89.0])
    zbv, dual = plan.by_name("ZBVZeroBubble"), plan.by_name("DualPipeV")
    assert plan.runoff_ratio(zbv) - plan.runoff_ratio(dual) == pytest.approx(0.07 / 3)
    assert not plan.level_with(zbv, dual) and plan.recommended is dual
    # as a GPT-2 run-off of 21 rounds measured: DualPipeV 2.6 points behind ZBVZeroBubble in one set, 4.3 and
    # 2.8 ahead in the others, 1.5 ahead in the mean; the sets cannot tell them apart (t-test p = 0.55), but
    # the means lie 1.5 points apart, beyond the 1% margin: not level, the faster one is recommended (a
    # run-off now records the rounds that ordering them needs, RUNOFF_STANDARD_ERROR)
    plan = _level_runoff(monkeypatch, zbv=[87.2, 90.0, 91.6], dual=[89.8, 85.7, 88.8])
    zbv, dual = plan.by_name("ZBVZeroBubble"), plan.by_name("DualPipeV")
    assert plan.runoff_ratio(zbv) - plan.runoff_ratio(dual) == pytest.approx(0.015)
    assert not plan.level_with(zbv, dual) and plan.recommended is dual
    # the same disagreement between the sets, the means 0.8 points apart: level, and ZBVZeroBubble, holding
    # less memory, is recommended
    plan = _level_runoff(monkeypatch, zbv=[87.2, 90.0, 91.6], dual=[89.8, 87.8, 88.8])
    zbv, dual = plan.by_name("ZBVZeroBubble"), plan.by_name("DualPipeV")
    assert plan.runoff_ratio(zbv) - plan.runoff_ratio(dual) == pytest.approx(0.008)
    assert plan.level_with(zbv, dual) and plan.recommended is zbv


def test_the_first_recording_runs_in_sets_of_processes_and_a_schedule_close_to_the_pick_reaches_the_run_off(
    monkeypatch,
):
    # as a model of 8 transformer blocks measured: the A/A control 3% apart, ZBH1 0.95x 1F1B, CostAware
    # 0.98x (within the noise floor of 1F1B, and within it of ZBH1 too); a separate run measured CostAware
    # best. It now goes to the run-off, which orders them on rounds of their own
    first = {"1F1B": [100.0] * 21, "control": [103.0] * 21, "ZBH1": [95.0] * 21, "CostAware": [98.0] * 21}
    runoff = {"1F1B": [100.0] * 21, "control": [103.0] * 21, "ZBH1": [96.0] * 21, "CostAware": [94.0] * 21}
    calls: list[list[str]] = []
    plan = run_recorded(
        monkeypatch,
        {**first, "runoff": runoff},
        ["1F1B", "ZBH1", "CostAware"],
        runoff=True,
        recording_sets=3,
        calls=calls,
    )
    # three sets of 7 rounds for the first recording, then three for the run-off: six sets of new processes
    assert plan.first_recording_sets == [7, 7, 7] and plan.runoff["sets"] == [7, 7, 7]
    assert len(calls) == 6 and calls[0] == calls[1] == calls[2]
    assert plan.process_sets() == [(start, start + 7) for start in range(0, 42, 7)]
    assert plan.first_recording_set_count == 3
    assert plan.noise_floor == pytest.approx(0.03)
    cost_aware, zbh1 = plan.by_name("CostAware"), plan.by_name("ZBH1")
    assert not plan.beyond_noise(0.98)  # CostAware did not beat 1F1B beyond the noise floor itself...
    assert plan.runoff["finalists"] == ["ZBH1", "CostAware"]  # ...but it was within it of the pick
    assert plan.runoff_ratios(cost_aware) == pytest.approx([0.94] * 3)
    assert plan.recommended is cost_aware and plan.runoff["first_pick"] == "ZBH1"
    assert plan.ratio_by_process_set(zbh1, plan.baseline) == pytest.approx([0.95] * 3 + [0.96] * 3)
    table = plan.table()
    assert (
        "\nfirst recording: 21 rounds in three sets of new processes (7, 7 and 7 rounds), so that what one set's "
        "copies of the stages happen to get (memory, a quieter core) does not decide which schedules reach the "
        "run-off"
    ) in table
    assert "--steps 21 --process-sets 3 --control" in table
    # one set where the rounds are too few for more (at least 5 a set): no line
    plan = run_recorded(
        monkeypatch, {name: steps[:9] for name, steps in first.items()}, ["1F1B", "ZBH1"], recording_sets=3
    )
    assert plan.first_recording_sets == [9] and "first recording:" not in plan.table()
    with pytest.raises(ValueError, match="recording_sets must be at least 1"):
        run_recorded(monkeypatch, first, ["1F1B", "ZBH1"], recording_sets=0)


def test_a_run_off_that_is_to_decide_against_1f1b_records_as_many_rounds_as_would_decide_it(monkeypatch):
    # GPipe won 14 of 21 rounds (p = 0.095): 1F1B would be kept, and a run-off of 21 rounds more would
    # decide a side that wins two thirds of them only by luck. A sign test at 0.05 (GPipe the one
    # finalist) needs 30 rounds at 14 of 21, so the run-off records 30, in three sets of 10
    first = {"1F1B": [100.0] * 21, "GPipe": [98.0] * 14 + [102.0] * 7}
    assert sign_test_p_value(14, 21) > 0.05 and rounds_to_decide(14 / 21, 0.05) == 30
    runoff = {"1F1B": [100.0] * 30, "GPipe": [98.0] * 20 + [102.0] * 10}  # 20 of 30: p = 0.049
    asked: list[list[str]] = []
    plan = run_recorded(monkeypatch, {**first, "runoff": runoff}, ["1F1B", "GPipe"], runoff=True, calls=asked)
    assert plan.runoff["finalists"] == ["GPipe"] and plan.runoff["first_pick"] == "1F1B"
    assert plan.runoff["rounds"] == 30 and plan.runoff["sets"] == [10, 10, 10]
    assert len(plan.baseline.measured_steps) == 51 and plan.runoff_rounds_won(plan.by_name("GPipe")) == (
        20,
        30,
    )
    assert plan.recommended.name == "GPipe"  # 20 of 30 in the run-off's rounds alone
    table = plan.table()
    assert (
        "(10, 10 and 10 rounds: 30 more rounds, as many as a sign test at 0.05 needs at GPipe's win fraction in "
        "the first recording (14 of 21), 1F1B's and theirs now count 51)"
    ) in table
    # a --record-budget that leaves fewer: as many as it leaves (1F1B twice and GPipe: 0.3 s a round, 3 sets
    # to start), never fewer than the first recording's
    plan = run_recorded(
        monkeypatch,
        {**first, "runoff": runoff},
        ["1F1B", "GPipe"],
        runoff=True,
        record_budget_s=8.0,
    )
    assert plan.runoff["rounds"] == 23
    assert "as many as the --record-budget leaves (a sign test at 0.05 would need about 30" in plan.table()
    # where the pick stands (a schedule would be recommended), a run-off keeps the first recording's count
    decided = {"1F1B": [100.0] * 21, "GPipe": [98.0] * 21, "ZBH1": [97.5] * 21}
    plan = run_recorded(monkeypatch, decided, ["1F1B", "GPipe", "ZBH1"], runoff=True)
    assert plan.runoff["rounds"] == 21 and not plan.runoff["sized"]


def test_a_run_off_records_as_many_rounds_as_ordering_its_finalists_needs(monkeypatch):
    # ZBH1 and ZBH2 both 0.95x 1F1B in the median round, too close to order; ZBH2's rounds stray about
    # ZBH1's by log differences of -0.1, -0.05, 0, 0, 0, 0.05 and 0.1 in each set of 7: their median
    # absolute deviation (each set's median round left out) 0.05, a spread of 1.4826 x 0.05 = 0.0741 a round, and a standard error of 1%
    # between the two needs ceil(pi / 2 x 7.41^2) = 87 rounds, three sets of 29
    strays = [-0.1, -0.05, 0.0, 0.0, 0.0, 0.05, 0.1]
    first = {
        "1F1B": [100.0] * 21,
        "ZBH1": [95.0] * 21,
        "ZBH2": [95.0 * math.exp(stray) for stray in strays] * 3,
    }
    assert planner.RUNOFF_STANDARD_ERROR == 0.01
    runoff = {"1F1B": [100.0] * 87, "ZBH1": [96.0] * 87, "ZBH2": [94.0] * 87}
    calls: list[list[str]] = []
    plan = run_recorded(
        monkeypatch, {**first, "runoff": runoff}, list(first), runoff=True, recording_sets=3, calls=calls
    )
    assert plan.runoff["finalists"] == ["ZBH1", "ZBH2"] and plan.runoff["first_pick"] == "ZBH1"
    assert plan.runoff["rounds"] == 87 and plan.runoff["sets"] == [29, 29, 29]
    assert len(calls) == 6 and len(plan.baseline.measured_steps) == 21 + 87
    assert plan.recommended.name == "ZBH2"  # 0.94x in the run-off against ZBH1's 0.96x
    line = next(line for line in plan.table().splitlines() if line.startswith("run-off"))
    assert (
        "(29, 29 and 29 rounds: 87 more rounds, as many as a standard error of 1% between two finalists needs at "
        "the 7.4% by which a round's difference between them strayed in the first recording"
    ) in line
    # the check command the plan prints re-measures as many rounds as the run-off recorded
    assert "--steps 87 --process-sets 3 --control" in plan.table()
    # a --record-budget that leaves fewer (1F1B twice, ZBH1 and ZBH2: 0.39 s a round; 25 s leave 64 rounds,
    # less a round's worth to start each of the 3 sets): as many as it leaves, and it says what ordering
    # them would need
    plan = run_recorded(
        monkeypatch,
        {**first, "runoff": runoff},
        list(first),
        runoff=True,
        recording_sets=3,
        record_budget_s=25.0,
    )
    assert plan.runoff["rounds"] == 61
    assert (
        "as many as the --record-budget leaves (a standard error of 1% between two finalists would need about "
        "87 at the 7.4%"
    ) in plan.table()
    # rounds that do not stray (every round alike): the first recording's count is enough
    steady = {"1F1B": [100.0] * 21, "ZBH1": [95.0] * 21, "ZBH2": [95.5] * 21}
    plan = run_recorded(monkeypatch, {**steady, "runoff": runoff}, list(first), runoff=True, recording_sets=3)
    assert plan.runoff["rounds"] == 21 and not plan.runoff["sized"]


def test_after_a_run_off_longer_than_the_first_recording_its_sets_decide_whether_splitting_pays(monkeypatch):
    # as a model of 8 transformer blocks measured: DualPipeV against Interleaved1F1B, its placement, 0.99x,
    # 1.04x and 1.03x in the first recording's three sets of 7 rounds (their rounds straying by 7.4% a round,
    # so the run-off records 87), then 0.968x in each of the run-off's three sets of 29
    strays = [-0.1, -0.05, 0.0, 0.0, 0.0, 0.05, 0.1]
    first = {
        "1F1B": [100.0] * 21,
        "Interleaved1F1B": [
            93.0 / ratio * math.exp(stray) for ratio in (0.99, 1.04, 1.03) for stray in strays
        ],
        "DualPipeV": [93.0] * 21,
    }
    runoff = {"1F1B": [100.0] * 87, "Interleaved1F1B": [93.0] * 87, "DualPipeV": [90.0] * 87}

    def planned_v_placement(first_rounds):
        plan = run_recorded(
            monkeypatch,
            {**first_rounds, "runoff": runoff},
            ["1F1B", "Interleaved1F1B", "DualPipeV"],
            runoff=True,
            recording_sets=3,
        )
        return plan, plan.by_name("DualPipeV"), plan.by_name("Interleaved1F1B")

    plan, dual, interleaved = planned_v_placement(first)
    assert plan.runoff["finalists"] == ["Interleaved1F1B", "DualPipeV"] and plan.runoff["rounds"] == 87
    by_set = plan.ratio_by_process_set(dual, interleaved)
    assert by_set == pytest.approx([0.99, 1.04, 1.03] + [90 / 93] * 3)
    # all six sets, each one draw, would disagree (t-test p = 0.33); the run-off's three, each of 29 rounds
    # against the first's 7, decide
    assert t_test_p_value([math.log(ratio) for ratio in by_set]) > 0.3
    assert plan.deciding_sets(by_set) == (pytest.approx([90 / 93] * 3), "the run-off's three sets")
    verdict = plan.zero_bubble_verdict()
    assert verdict.startswith("zero bubble pays here (DualPipeV"), verdict
    assert "; over the run-off's three sets 0.968x, t-test p = 0)" in verdict
    # a run-off of as many rounds as the first recording (rounds that do not stray): all six sets decide
    steady = {"1F1B": [100.0] * 21, "Interleaved1F1B": [93.0 / 0.99] * 21, "DualPipeV": [93.0] * 21}
    plan, dual, interleaved = planned_v_placement(steady)
    assert plan.runoff["rounds"] == 21
    by_set = plan.ratio_by_process_set(dual, interleaved)
    assert plan.deciding_sets(by_set) == (by_set, "the six sets") and len(by_set) == 6


def test_splitting_that_pays_on_a_placement_slower_than_1f1b_says_the_schedule_is_not_recommended(
    monkeypatch,
):
    # DualPipeV beats Interleaved1F1B, its placement, in every round (0.95x), but that placement is 1.06x
    # 1F1B, and DualPipeV 1.01x: splitting pays on this placement, 1F1B is kept, and the line says both
    rounds = {"1F1B": [100.0] * 21, "Interleaved1F1B": [106.0] * 21, "DualPipeV": [101.0] * 21}
    plan = run_recorded(monkeypatch, rounds, list(rounds))
    assert plan.recommended is plan.baseline
    verdict = plan.zero_bubble_verdict()
    assert verdict.startswith("zero bubble pays here (DualPipeV measured 1.01x 1F1B"), verdict
    assert (
        "the bubble it fills is worth more than the extra work of splitting; yet DualPipeV itself did not beat "
        "1F1B as a pick must (it measured 1.01x 1F1B), so it is not recommended"
    ) in verdict


def test_splitting_that_pays_beside_a_faster_schedule_of_another_placement_names_the_pick(monkeypatch):
    # ZBH1 beats 1F1B, its placement, in every round (0.97x); LoopedBFS, on two stages per rank, measured
    # 0.90x: splitting pays on one stage per rank, and the line says which schedule is the pick
    rounds = {"1F1B": [100.0] * 21, "ZBH1": [97.0] * 21, "LoopedBFS": [90.0] * 21}
    plan = run_recorded(monkeypatch, rounds, list(rounds))
    assert plan.recommended.name == "LoopedBFS"
    verdict = plan.zero_bubble_verdict()
    assert verdict.startswith("zero bubble pays here (ZBH1 measured 0.97x 1F1B"), verdict
    assert (
        "; LoopedBFS, which splits nothing, on two stages per rank, measured faster still and is recommended"
    ) in verdict
