"""What `graphkit plan` tells its user: the recommendation follows what was measured (keep 1F1B when it
measured fastest), whether zero bubble pays and why, what --run recorded and why, a memory limit nothing
fits, a busy machine, and files written only when asked for - each against hand-made recorded steps."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphkit.pipelining import planner
from graphkit.pipelining.planner import plan_schedules
from graphkit.pipelining.planning import CommModel, StageCost, read_schedule_csv, simulate
from graphkit.pipelining.record_selection import choose_recorded
from graphkit.pipelining.schedule_plan import _apart
from graphkit.pipelining.schedules import schedule_name, schedule_order

MS = 1e-3


def costs_json(f: float, i: float, w: float, full: float) -> dict:
    """What `graphkit costs --json` writes, for two equal stages."""
    return {
        "stages": [
            {
                "forward": {"seconds": f},
                "backward_input": {"seconds": i},
                "backward_weight": {"seconds": w},
                "full_backward_seconds": full,
                "activation_bytes": 1 << 20,
                "b_keeps_bytes": 1 << 18,
                "input_grad_bytes": 0 if index == 0 else 1000,
            }
            for index in range(2)
        ]
    }


def recorder(steps_by_name: dict[str, list[float]]):
    """A stand-in for record_schedules: each schedule's step times, round by round, as given (the median
    is the recorded step), handed out in order to the sets of processes a plan records in; 1F1B's order
    simulated for the shapes."""
    handed = [0]  # the rounds handed out so far

    def record(pipeline, schedules, microbatches, ranks, steps, **_):
        timelines = []
        start = handed[0]
        handed[0] += steps
        for schedule in schedules:
            name = schedule_name(schedule)
            order = schedule_order(schedule, ranks, microbatches)
            timeline = simulate(
                order, StageCost(1 * MS, 1 * MS, 1 * MS), CommModel(), name=name
            ).to_schedule_timeline()
            times = steps_by_name[name][start : start + steps]
            for rank in timeline.ranks:
                rank.step_times = list(times)
                rank.step_seconds = sorted(times)[(len(times) - 1) // 2]
            timelines.append(timeline)
        return timelines

    return record


def run_plan(monkeypatch, tmp_path, steps_by_name, top=1, **options):
    monkeypatch.setattr(planner, "record_schedules", recorder(steps_by_name))
    monkeypatch.setattr(planner, "busy_machine_warning", lambda: "")
    return plan_schedules(
        "zoo-pipeline:mlp",
        ranks=2,
        microbatches=4,
        costs=costs_json(2 * MS, 1 * MS, 1 * MS, 1.6 * MS),
        schedules=["1F1B", "GPipe", "ZBH1", "ZBH2"],
        run=True,
        steps=max(len(times) for times in steps_by_name.values()),
        top=top,
        overhead=0.0,
        comm=CommModel(),
        output=tmp_path,
        **{"runoff": False, **options},  # one recording: the verdicts of its rounds (run-offs: elsewhere)
    )


def test_when_1f1b_measured_fastest_the_plan_says_keep_1f1b_and_best_csv_holds_it(monkeypatch, tmp_path):
    steps = {
        "1F1B": [10.0, 10.0, 10.0, 10.0, 10.0],
        "GPipe": [12.0] * 5,
        "ZBH1": [11.0] * 5,
        "ZBH2": [11.5] * 5,
    }
    plan = run_plan(monkeypatch, tmp_path, steps)
    assert plan.recommended is plan.baseline
    assert "recommended: keep 1F1B" in plan.table()
    assert read_schedule_csv(tmp_path / "best.csv") == plan.baseline.order.actions()
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["recommended"] == "1F1B" and written["best_measured"] == "1F1B"
    # what the prediction put first stays apart from what to run
    assert written["best_predicted"] == written["best"] == plan.best.run_name


def test_a_schedule_is_recommended_only_when_it_beat_1f1b_in_more_rounds_than_chance(monkeypatch, tmp_path):
    steps = {"1F1B": [10, 10, 10, 10, 10], "GPipe": [12] * 5, "ZBH1": [9, 9, 11, 11, 9.5], "ZBH2": [13] * 5}
    # ZBH1's median is lower, but it won 2 of 5 rounds: one lucky streak is no recommendation
    steps["ZBH1"] = [9.0, 11.0, 11.0, 9.0, 11.0]
    plan = run_plan(monkeypatch, tmp_path, steps)
    assert plan.rounds_won(plan.by_name("ZBH1")) == (2, 5) and plan.recommended is plan.baseline
    # 4 of 5 is still what chance gives one time in five (p = 6/32)
    steps["ZBH1"] = [9.0, 9.0, 11.0, 9.0, 9.0]
    plan = run_plan(monkeypatch, tmp_path, steps)
    assert plan.rounds_won(plan.by_name("ZBH1")) == (4, 5) and plan.recommended is plan.baseline
    assert "closest (most rounds won): ZBH1, faster in 4 of 5 rounds (p = 0.19)" in plan.table()
    # 9 of 9: p = 1/512, below 0.05 split among the schedules recorded against 1F1B
    steps = {"1F1B": [10.0] * 9, "GPipe": [12.0] * 9, "ZBH1": [9.0] * 9, "ZBH2": [13.0] * 9}
    plan = run_plan(monkeypatch, tmp_path, steps)
    assert plan.recommended.name == "ZBH1"
    assert (
        "recommended: ZBH1 (faster than 1F1B in its median step, in the median round and in 9 of 9 rounds: "
        "p = 0.002 that chance did it, below"
    ) in plan.table()
    assert read_schedule_csv(tmp_path / "best.csv") == plan.by_name("ZBH1").order.actions()


def test_run_records_1f1b_twice_the_best_zero_bubble_and_the_top_within_the_band_and_says_why(
    monkeypatch, tmp_path
):
    steps = {name: [10.0] * 5 for name in ("1F1B", "GPipe", "ZBH1", "ZBH2")}
    plan = run_plan(monkeypatch, tmp_path, steps)
    recorded = {item.name: item.recorded_because for item in plan.schedules if item.recorded_because}
    zero_bubble = plan.best_zero_bubble
    assert (
        zero_bubble is not None
        and zero_bubble.name in recorded
        and "the best zero-bubble" in recorded[zero_bubble.name]
    )
    assert recorded["1F1B"] == "the baseline, recorded twice: the second copy is the A/A control"
    assert plan.control_steps == [10.0] * 5 and plan.noise_floor == 0.0
    # each says its ratio to 1F1B in the prediction it was chosen by (before calibration) and why
    assert all(
        re.fullmatch(
            r"predicted \d+\.\d\dx(, within 22% of the best predicted)?(, the best zero-bubble predicted)?",
            why,
        )
        for name, why in recorded.items()
        if name != "1F1B"
    ), recorded
    assert len(recorded) in (2, 3)  # --top 1, plus the best zero-bubble when the top one is not it
    # what --top left out is named, with the reason
    left_out = dict(plan.left_out)
    assert set(left_out) == {"GPipe", "ZBH1", "ZBH2"} - set(recorded)
    assert all("beyond --top 1" in why or "above the best predicted" in why for why in left_out.values())
    table = plan.table()
    assert "recorded (chosen by the prediction" in table and "(the baseline, recorded twice" in table
    assert "left out: " in table
    # the verdict on zero bubble reads the recorded zero-bubble schedule, not a prediction; ZBH1 and ZBH2
    # have 1F1B's placement, so 1F1B is what their splitting is measured against
    assert (
        f"({zero_bubble.name} measured 1.00x 1F1B in the median round, faster in 0 of 5 rounds (p = 1); it has "
        "1F1B's placement (one stage per rank), so that is what splitting gains)"
    ) in plan.zero_bubble_verdict()


def test_the_zero_bubble_line_gives_i_plus_w_against_b_per_stage_and_1f1bs_bubble():
    plan = plan_schedules(
        ranks=2, microbatches=8, costs=costs_json(6 * MS, 5.6 * MS, 12.7 * MS, 12.7 * MS), overhead=0.0,
        schedules=["1F1B", "ZBH1", "ZBH2"],
    )  # fmt: skip
    line = plan.zero_bubble_verdict()
    # I + W = 18.3 ms against B = 12.7 ms: 1.44 x on both stages; ZB-H1 is predicted slower than 1F1B
    assert "stage 1 I + W 18.3 ms = 1.44 x B 12.7 ms" in line and "stage 0 I + W" not in line
    assert "stage 0 none (the first stage sends no input gradient: its W runs as one full backward)" in line
    assert line.startswith("zero bubble does not pay here (ZBH")
    bubble = plan.baseline.simulation.bubble_fraction
    assert f"1F1B leaves a {bubble:.0%} bubble (predicted)" in line
    paper = plan_schedules(
        ranks=2, microbatches=8, costs=costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS), overhead=0.0
    )
    assert paper.zero_bubble_verdict().startswith("zero bubble pays here")
    assert "zero bubble" in paper.table()


def test_a_memory_limit_nothing_fits_is_refused_naming_the_smallest_that_fits_and_writes_nothing(tmp_path):
    costs = costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS)
    with pytest.raises(
        ValueError, match=r"the smallest limit a schedule fits is about [\d,]+ bytes"
    ) as refused:
        plan_schedules(ranks=2, microbatches=8, costs=costs, memory_limit=1000, output=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    smallest = int(re.search(r"give --memory-limit (\d+) or more", str(refused.value)).group(1))
    # below every planned peak (Adaptive built under the limit holds fewer microbatches in flight)...
    fitting = plan_schedules(ranks=2, microbatches=8, costs=costs, overhead=0.0)
    assert smallest < min(
        max(item.simulation.peak_memory_bytes) for item in fitting.schedules if item.simulation
    )
    # ...and it fits, while 2% less does not (found to 1%)
    assert plan_schedules(ranks=2, microbatches=8, costs=costs, memory_limit=smallest).best.fits_memory
    with pytest.raises(ValueError, match="no schedule fits"):
        plan_schedules(ranks=2, microbatches=8, costs=costs, memory_limit=0.98 * smallest)


def test_plan_without_an_output_folder_leaves_no_folder_behind(monkeypatch):
    made = []
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *args, **kwargs: made.append(args) or "/nonexistent")
    plan = plan_schedules(ranks=2, microbatches=4, costs=costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS))
    assert made == [] and all(item.csv is None for item in plan.schedules)


def test_a_busy_machine_is_warned_about_with_the_error_to_expect(monkeypatch):
    from graphkit.measure import competing_load, timing

    monkeypatch.setattr(timing.os, "getloadavg", lambda: (6.0, 5.0, 4.0))
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 2)
    # other processes keep 1.5 of the 2 cores busy while the warning watches: 0.75 s of CPU in 0.5 s
    busy = iter([100.0, 100.75])
    monkeypatch.setattr(competing_load, "_machine_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(competing_load, "_own_seconds", lambda: 3.0)
    monkeypatch.setattr(competing_load, "time", SimpleNamespace(monotonic=iter([10.0, 10.5]).__next__))
    monkeypatch.setattr(timing, "time", SimpleNamespace(sleep=lambda seconds: None))
    warning = timing.busy_machine_warning()
    assert "load average is 6.0 on 2 cores, other processes use 1.50 cores now" in warning
    assert "off by up to about 67%" in warning
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert timing.busy_machine_warning() == ""


def test_a_load_average_left_by_processes_that_ended_is_not_warned_about(monkeypatch):
    from graphkit.measure import competing_load, timing

    # the 1-minute load average still counts the ranks of a run that just ended; nothing runs now
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (2.04, 1.72, 1.50))
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 2)
    watched = []
    monkeypatch.setattr(timing, "time", SimpleNamespace(sleep=watched.append))
    monkeypatch.setattr(competing_load, "time", SimpleNamespace(monotonic=iter([10.0, 10.5]).__next__))
    busy = iter([100.0, 100.02])  # 0.02 s of the machine's CPU, all of it this process's
    monkeypatch.setattr(competing_load, "_machine_busy_seconds", lambda: next(busy))
    own = iter([3.0, 3.02])
    monkeypatch.setattr(competing_load, "_own_seconds", lambda: next(own))
    assert timing.busy_machine_warning() == ""
    assert watched == [timing.LOAD_SAMPLE_SECONDS]


def test_the_table_prints_mib_and_readable_bandwidth():
    plan = plan_schedules(
        ranks=2, microbatches=4, costs=costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS), overhead=0.0,
        comm=CommModel(100e-6, 100e9), schedules=["1F1B"],
    )  # fmt: skip
    table = plan.table()
    assert "peak MiB/rank" in table and "bytes / 100 GB/s" in table and "e+" not in table
    peak = max(plan.baseline.simulation.peak_memory_bytes) / 2**20
    assert f"{peak:.1f}" in table


def test_plan_command_refuses_a_memory_limit_nothing_fits_with_exit_2(tmp_path, capsys):
    from graphkit.cli import main

    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS)))
    output = tmp_path / "plan"
    assert main(["plan", "--costs", str(path), "--memory-limit", "1000", "-o", str(output)]) == 2
    captured = capsys.readouterr()
    assert "no schedule fits the memory limit" in captured.err and "wrote" not in captured.out
    assert not output.exists()


def test_plan_command_names_only_the_files_it_wrote(tmp_path, capsys):
    from graphkit.cli import main

    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS)))
    output = tmp_path / "plan"
    assert main(["plan", "--costs", str(path), "--schedules", "1F1B,ZBH1", "-o", str(output)]) == 0
    out = capsys.readouterr().out
    written = sorted(item.name for item in Path(output).iterdir())
    assert written == ["best.csv", "plan.json", "zbh1.csv"]
    for name in written:
        assert name in out
    assert "adaptive.csv" not in out


def test_plan_command_run_without_a_spec_says_what_to_give(tmp_path, capsys):
    from graphkit.cli import main

    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS)))
    assert main(["plan", "--costs", str(path), "--run"]) == 2
    assert "--run records the schedules on real ranks: give the PIPELINE_SPEC" in capsys.readouterr().err


def test_a_not_planned_row_keeps_the_table_columns():
    plan = plan_schedules(
        ranks=2, microbatches=4, costs=costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS), overhead=0.0,
        schedules=["1F1B", "Interleaved1F1B", "ZBH1"],
    )  # fmt: skip
    lines = plan.table().splitlines()
    header = lines[1]
    row = next(line for line in lines if "Interleaved1F1B" in line)
    planned = next(line for line in lines if " 1F1B " in line)
    # the schedule and st/rank columns end where the header's do; the reason runs on after them
    for column in ("schedule", "st/rank"):
        end = header.index(column) + len(column)
        assert row[end - 1] != " " and planned[end - 1] != " " and row[end] == " "
    assert row.split()[2] == "2" and "not planned: needs costs of 4 stages" in row
    assert header.index("predicted ms") - header.index("st/rank") == len("st/rank  ")


def test_a_busy_machine_is_warned_about_once_then_reminded(monkeypatch):
    monkeypatch.setattr(planner, "busy_machine_warning", lambda: "the load average is 6.0 on 2 cores: ...")
    monkeypatch.setattr(planner, "load_average", lambda: "load average 6.00, 5.00, 4.00 on 2 CPUs")
    with pytest.warns(RuntimeWarning, match="the load average is 6.0 on 2 cores"):
        plan = plan_schedules(
            "zoo-pipeline:mlp", ranks=2, microbatches=4, schedules=["1F1B"], overhead=0.0, batch_size=8
        )
    table = plan.table()
    assert "the load average is 6.0 on 2 cores" not in table  # said once, before measuring
    assert "load while measuring: load average 6.00" in table and "busier than the cores" in table


def test_a_pick_holding_much_more_memory_than_1f1b_says_so(monkeypatch, tmp_path):
    # GPipe measured fastest in every round: recommended, with its memory against 1F1B's
    plan = run_plan(
        monkeypatch, tmp_path,
        {"1F1B": [10.0] * 9, "GPipe": [8.0] * 9, "ZBH1": [11.0] * 9, "ZBH2": [11.0] * 9},
        top=3,
    )  # fmt: skip
    gpipe, base = plan.by_name("GPipe"), plan.baseline
    ratios = [
        g / b
        for g, b in zip(gpipe.simulation.peak_memory_bytes, base.simulation.peak_memory_bytes, strict=True)
    ]
    rank = ratios.index(max(ratios))  # the rank where it holds most more: compared rank by rank
    assert max(ratios) > 1.5
    (line,) = [line for line in plan.table().splitlines() if line.startswith("recommended:")]
    assert line.startswith("recommended: GPipe (faster than 1F1B")
    assert (
        f"on rank {rank} it holds {max(ratios):.1f}x 1F1B's peak memory" in line and "--memory-limit" in line
    )
    # a pick that holds about what 1F1B holds gets no note
    plan = run_plan(
        monkeypatch, tmp_path,
        {"1F1B": [10.0] * 9, "GPipe": [12.0] * 9, "ZBH1": [8.0] * 9, "ZBH2": [11.0] * 9},
        top=3,
    )  # fmt: skip
    (line,) = [line for line in plan.table().splitlines() if line.startswith("recommended:")]
    assert line.startswith("recommended: ZBH1") and "peak memory" not in line


def test_the_zero_bubble_line_says_what_a_free_split_would_gain():
    # a split 1.44x dearer than B does not pay; were it free (I + W = B) it would fill 1F1B's bubble
    plan = plan_schedules(
        ranks=2, microbatches=8, costs=costs_json(6 * MS, 5.6 * MS, 12.7 * MS, 12.7 * MS), overhead=0.0,
        schedules=["1F1B", "ZBH1"],
    )  # fmt: skip
    freed = [plan.costs[0]] + [
        replace(c, backward_input=c.seconds("B") * 5.6 / 18.3, backward_weight=c.seconds("B") * 12.7 / 18.3)
        for c in plan.costs[1:]
    ]
    assert all(abs(f.backward_input + f.backward_weight - f.seconds("B")) < 1e-12 for f in freed[1:])
    from graphkit.pipelining.planning import generated_order

    order = generated_order("CostAware", 2, 8, freed, None, plan.comm, plan.overhead)
    expected = simulate(order, freed, plan.comm, microbatches=8, overhead=0.0).step_seconds
    base = simulate(schedule_order("1F1B", 2, 8), freed, plan.comm, microbatches=8, overhead=0.0).step_seconds
    assert plan.free_split_vs_1f1b == pytest.approx(expected / base)
    assert plan.free_split_vs_1f1b < 0.99
    line = plan.zero_bubble_verdict()
    assert line.startswith("zero bubble does not pay here")
    assert (
        f"were splitting free (I + W = B), CostAware would predict {plan.free_split_vs_1f1b:.3f}x 1F1B: a cheaper split would pay"
        in line
    )


def test_without_run_a_schedule_predicted_within_1_percent_of_1f1b_is_not_recommended(tmp_path, capsys):
    from graphkit.cli import main

    # I 12 + W 7 against B 12.7 ms: CostAware splits a little and is predicted 0.996x 1F1B
    costs = costs_json(6 * MS, 12 * MS, 7 * MS, 12.7 * MS)
    plan = plan_schedules(ranks=2, microbatches=8, costs=costs, overhead=0.0, schedules=["1F1B", "CostAware"])
    ratio = plan.best.predicted_seconds / plan.baseline.predicted_seconds
    assert plan.best.name == "CostAware" and 0.99 <= ratio < 1
    assert plan.recommended is plan.baseline
    assert "recommended: keep 1F1B - CostAware is predicted within 1% of it" in plan.table()
    assert plan.zero_bubble_verdict().startswith("zero bubble does not pay here")
    # a clear prediction is recommended as the best predicted
    clear = plan_schedules(
        ranks=2, microbatches=8, costs=costs_json(6 * MS, 6 * MS, 7 * MS, 12.7 * MS), overhead=0.0,
        schedules=["1F1B", "CostAware"],
    )  # fmt: skip
    assert clear.recommended.name == "CostAware"
    assert "recommended: CostAware (the best predicted; --run records it against 1F1B)" in clear.table()
    # the command writes the recommendation as best.csv, and says it kept 1F1B
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    output = tmp_path / "plan"
    assert (
        main(
            [
                "plan",
                "--costs",
                str(path),
                "--schedules",
                "1F1B,CostAware",
                "--overhead",
                "0",
                "-o",
                str(output),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"wrote {output}/best.csv (1F1B, kept: nothing predicted at least 1% faster" in out
    assert read_schedule_csv(output / "best.csv") == plan.baseline.order.actions()


def test_too_few_rounds_recommend_nothing_and_say_so(monkeypatch, tmp_path):
    steps = {"1F1B": [10.0] * 3, "GPipe": [12.0] * 3, "ZBH1": [9.0] * 3, "ZBH2": [13.0] * 3}
    plan = run_plan(monkeypatch, tmp_path, steps, top=3)  # 3 rounds, all won by ZBH1: p = 1/8
    (line,) = [line for line in plan.table().splitlines() if line.startswith("recommended:")]
    assert plan.recommended is plan.baseline
    # three schedules against 1F1B, each at 0.05 / 3: all of 6 rounds (p = 1/64) is the fewest that can tell
    assert (
        "enough rounds: 3 cannot tell a schedule from chance at p < 0.017, record 6 or more (--steps)" in line
    )
    assert 0.5**6 < 0.05 / 3 < 0.5**5


def test_the_sign_test_against_known_binomial_tails():
    from graphkit.measure.timing import fewest_wins_beyond_chance, sign_test_p_value

    # exact tails: P(X >= k) for X ~ Binomial(n, 1/2)
    assert sign_test_p_value(5, 5) == 1 / 32 and sign_test_p_value(0, 7) == 1.0
    assert sign_test_p_value(4, 5) == 6 / 32 and sign_test_p_value(0, 0) == 1.0
    assert sign_test_p_value(17, 31) == pytest.approx(0.3601, abs=1e-4)
    assert sign_test_p_value(21, 31) == pytest.approx(0.0354, abs=1e-4)
    assert [fewest_wins_beyond_chance(n, 0.05) for n in (4, 5, 9, 15, 31)] == [None, 5, 8, 12, 21]
    with pytest.raises(ValueError, match="between 0 and rounds"):
        sign_test_p_value(6, 5)


def test_a_generated_schedule_that_came_out_as_1f1bs_order_is_named_so_and_not_recorded_again(
    monkeypatch, tmp_path
):
    # I 16 + W 7 against B 12.7 ms: no split pays, CostAware's order is 1F1B's
    costs = costs_json(6 * MS, 16 * MS, 7 * MS, 12.7 * MS)
    plan = plan_schedules(
        ranks=2, microbatches=8, costs=costs, overhead=0.0, schedules=["1F1B", "CostAware", "ZBH1"]
    )
    cost_aware = plan.by_name("CostAware")
    assert cost_aware.order.labels() == plan.baseline.order.labels()
    assert cost_aware.same_order_as == "1F1B" and not cost_aware.splits_backward
    assert plan.schedules.index(plan.baseline) < plan.schedules.index(cost_aware)  # 1F1B first on a tie
    assert "CostAware (1F1B's order)" in plan.table()
    choice = choose_recorded(plan.schedules, plan.baseline, steps=5, prediction_error=10.0, budget_s=None)
    assert cost_aware not in choice.chosen and "CostAware" not in dict(choice.left_out)
    assert plan.by_name("ZBH1").splits_backward


def test_a_split_on_the_first_stage_only_is_no_zero_bubble_schedule():
    from graphkit.pipelining.planning import Action, ScheduleOrder
    from graphkit.pipelining.schedule_plan import PlannedSchedule

    def planned(rows):
        return PlannedSchedule("CostAware", 1, None, order=ScheduleOrder("CostAware", rows))

    first_only = [
        [Action(0, "F", 0), Action(0, "I", 0), Action(0, "W", 0)],
        [Action(1, "F", 0), Action(1, "B", 0)],
    ]
    assert not planned(first_only).splits_backward  # stage 0's I is nothing: a full backward moved later
    later = [first_only[0], [Action(1, "F", 0), Action(1, "I", 0), Action(1, "W", 0)]]
    assert planned(later).splits_backward


def test_measured_ratios_are_per_round_and_keep_1f1b_names_the_closest_contender(monkeypatch, tmp_path):
    # GPipe's median step is lower than 1F1B's, but round by round it is slower in 4 of 5
    steps = {
        "1F1B": [10.0, 10.0, 20.0, 20.0, 20.0],
        "GPipe": [11.0, 11.0, 21.0, 21.0, 12.0],
        "ZBH1": [25.0] * 5,
        "ZBH2": [25.0] * 5,
    }
    plan = run_plan(monkeypatch, tmp_path, steps, top=3)
    gpipe = plan.by_name("GPipe")
    assert gpipe.measured_seconds < plan.baseline.measured_seconds  # medians: 12 against 20
    assert plan.round_ratio(gpipe) == pytest.approx(1.05)  # rounds: 1.1, 1.1, 1.05, 1.05, 0.6
    assert plan.recommended is plan.baseline and plan.measured_best is plan.baseline
    table = plan.table()
    (row,) = [line for line in table.splitlines() if line.split()[1:2] == ["GPipe"]]
    assert " 1.05x " in row and " 1/5 " in row
    assert (
        "closest (most rounds won): GPipe, faster in 1 of 5 rounds (p = 0.97), 1.05x in the median round"
        in table
    )


def test_the_free_split_bound_is_never_above_cost_awares_own_ratio():
    plan = plan_schedules(
        ranks=2, microbatches=8, costs=costs_json(6 * MS, 5.6 * MS, 12.7 * MS, 12.7 * MS), overhead=1e-3
    )
    from graphkit.pipelining.schedule_plan import simulate_schedule

    own = simulate_schedule("CostAware", 2, 8, plan.costs, plan.costs, plan.comm, plan.overhead, None)
    base = simulate_schedule("1F1B", 2, 8, plan.costs, plan.costs, plan.comm, plan.overhead, None)
    assert plan.free_split_vs_1f1b <= own.predicted_seconds / base.predicted_seconds + 1e-12


def test_the_chance_level_is_split_among_the_schedules_recorded(monkeypatch, tmp_path):
    # three contenders: each is tested at 0.05 / 3; 5 of 5 (p = 1/32) is not enough, 7 of 7 (1/128) is
    five = {"1F1B": [10.0] * 5, "GPipe": [9.0] * 5, "ZBH1": [11.0] * 5, "ZBH2": [11.0] * 5}
    plan = run_plan(monkeypatch, tmp_path, five, top=3)
    assert plan.significance == pytest.approx(0.05 / 3) and plan.recommended is plan.baseline
    seven = {name: [times[0]] * 7 for name, times in five.items()}
    plan = run_plan(monkeypatch, tmp_path, seven, top=3)
    assert plan.recommended.name == "GPipe"


def test_a_schedule_slower_in_its_median_step_is_not_recommended_though_it_won_the_rounds(
    monkeypatch, tmp_path
):
    # GPipe is faster in 8 of 9 rounds, but 1F1B's rounds are mostly fast and GPipe's median step is slower
    steps = {
        "1F1B": [10.0, 10.0, 10.0, 10.0, 10.0, 30.0, 30.0, 30.0, 30.0],
        "GPipe": [9.9, 9.9, 9.9, 9.9, 20.0, 20.0, 20.0, 20.0, 29.0],
        "ZBH1": [50.0] * 9,
        "ZBH2": [50.0] * 9,
    }
    plan = run_plan(monkeypatch, tmp_path, steps, top=1)
    gpipe = plan.by_name("GPipe")
    assert plan.rounds_won(gpipe) == (8, 9) and plan.round_ratio(gpipe) < 1
    assert gpipe.measured_seconds > plan.baseline.measured_seconds  # medians: 20 against 10
    assert plan.recommended is plan.baseline


def test_under_a_memory_limit_1f1b_exceeds_the_line_blames_the_limit_not_splitting():
    costs = costs_json(1 * MS, 1 * MS, 1 * MS, 2 * MS)
    free = plan_schedules(ranks=2, microbatches=8, costs=costs, overhead=0.0)
    limit = 0.9 * max(free.baseline.simulation.peak_memory_bytes)  # Adaptive is built to fit under it
    plan = plan_schedules(ranks=2, microbatches=8, costs=costs, overhead=0.0, memory_limit=limit)
    assert not plan.baseline.fits_memory
    line = plan.zero_bubble_verdict()
    assert "1F1B itself is over the memory limit" in line and "what the limit costs" in line
    assert "were splitting free" not in line and "costs more than the bubble" not in line


def test_a_generated_schedule_that_came_out_as_another_generated_ones_order_is_that_one():
    # F 4, I 8, W 4 against B 8 ms, 4 microbatches: Adaptive's search lands on ZBH2's order, and CostAware on
    # 1F1B's (the oracle: the orders' own labels, compared action by action)
    costs = costs_json(4 * MS, 8 * MS, 4 * MS, 8 * MS)
    names = ["1F1B", "ZBH1", "ZBH2", "Adaptive", "CostAware"]
    plan = plan_schedules(ranks=2, microbatches=4, costs=costs, overhead=0.0, schedules=names)
    adaptive, zbh2 = plan.by_name("Adaptive"), plan.by_name("ZBH2")
    assert adaptive.order.labels() == zbh2.order.labels()
    assert adaptive.order.labels() != plan.by_name("ZBH1").order.labels()
    assert adaptive.same_order_as == "ZBH2" and zbh2.same_order_as is None
    assert plan.by_name("CostAware").same_order_as == "1F1B"
    assert plan.schedules.index(zbh2) < plan.schedules.index(adaptive)  # the one named first ranks first
    assert "Adaptive (ZBH2's order)" in plan.table()
    choice = choose_recorded(plan.schedules, plan.baseline, steps=5, prediction_error=10.0, budget_s=None)
    chosen = {item.name for item in choice.chosen}
    assert "ZBH2" in chosen and "Adaptive" not in chosen and "Adaptive" not in dict(choice.left_out)
    # listed the other way round, Adaptive is kept and ZBH2 is Adaptive's order
    plan = plan_schedules(
        ranks=2, microbatches=4, costs=costs, overhead=0.0, schedules=names[:2] + names[3:1:-1]
    )
    assert plan.by_name("ZBH2").same_order_as == "Adaptive"


def test_a_p_value_and_its_level_print_apart():
    assert _apart(0.002, 0.0125) == ("0.002", "0.013")  # two significant figures where they differ
    assert _apart(0.0245, 0.025) == ("0.0245", "0.025")  # 0.025 twice would read as not below
    assert _apart(0.0249999, 0.025) == ("0.0249999", "0.025")
