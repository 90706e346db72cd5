"""The schedule planner: graphkit's generated schedules by name, every schedule's order simulated deadlock-free,
plans from a costs JSON (ranked, written, shown), the `graphkit plan` command, and - over real gloo ranks -
the generated schedules exact through verify-pipeline and the simulator's prediction of a recorded step."""

from __future__ import annotations

import json

import pytest

from graphkit.pipelining.planner import BUILT_IN_SCHEDULES, plan_schedules
from graphkit.pipelining.planning import (
    Action,
    StageCost,
    adaptive_schedule,
    fold_schedule,
    read_schedule_csv,
    simulate,
    zb_h1,
    zb_h2,
)
from graphkit.pipelining.planning.cost_model import costs_from_json, merge_stage_costs
from graphkit.pipelining.schedule_plan import what_if_table
from graphkit.pipelining.schedules import (
    GENERATED_SCHEDULES,
    SCHEDULE_NAMES,
    schedule_class,
    schedule_name,
    schedule_order,
    stage_count,
    stage_indices,
)

UNIT = StageCost(1.0, 1.0, 1.0, activation_bytes=10, weight_bytes=4)
MS = 1e-3


def costs_json(stages: int, f: float = 2 * MS, i: float = 2 * MS, w: float = 2 * MS) -> dict:
    """What `graphkit costs --json` writes, for ``stages`` equal stages."""
    return {
        "method": "made up",
        "stages": [
            {
                "stage_index": index,
                "forward": {"seconds": f, "flops": 0, "peak_bytes": 0},
                "backward_input": {"seconds": i, "flops": 0, "peak_bytes": 0},
                "backward_weight": {"seconds": w, "flops": 0, "peak_bytes": 0},
                "activation_bytes": 1000,
                "b_keeps_bytes": 400,
                "input_grad_bytes": 0 if index == 0 else 100,
            }
            for index in range(stages)
        ],
    }


@pytest.mark.parametrize("name", GENERATED_SCHEDULES)
def test_generated_schedules_are_named_placed_and_run_by_the_csv_runtime(name):
    from torch.distributed.pipelining import schedules as torch_schedules

    assert schedule_name(name.lower()) == name and name not in SCHEDULE_NAMES  # those hold 2+ stages per rank
    assert schedule_class(name) is torch_schedules._PipelineScheduleRuntime
    assert stage_count(name, 4) == 4 and stage_indices(name, 3, 4) == [3]


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("microbatches", [4, 8])
@pytest.mark.parametrize("name", [*BUILT_IN_SCHEDULES, *GENERATED_SCHEDULES])
def test_every_schedule_simulates_deadlock_free(name, ranks, microbatches):
    if name == "DualPipeV" and microbatches < 2 * ranks:
        with pytest.raises(ValueError, match="at least as many microbatches as stages"):
            schedule_order(name, ranks, microbatches)
        return
    order = schedule_order(name, ranks, microbatches)
    result = simulate(order, UNIT, microbatches=microbatches, name=name)  # raises on a deadlock or a gap
    assert len(result.actions) == sum(map(len, order.rows))


@pytest.mark.parametrize(("ranks", "microbatches"), [(2, 4), (4, 8), (8, 16)])
def test_generated_orders_are_the_zb_papers(ranks, microbatches):
    assert schedule_order("ZBH1", ranks, microbatches).labels() == {
        r: [str(a) for a in row] for r, row in zb_h1(ranks, microbatches).items()
    }
    assert schedule_order("ZBH2", ranks, microbatches).labels() == {
        r: [str(a) for a in row] for r, row in zb_h2(ranks, microbatches).items()
    }
    adaptive = adaptive_schedule(UNIT, ranks, microbatches)
    assert schedule_order("Adaptive", ranks, microbatches).labels() == {
        r: [str(a) for a in row] for r, row in adaptive.items()
    }


def test_a_four_stage_schedule_folds_onto_two_ranks_without_deadlock():
    folded = fold_schedule(zb_h1(4, 8), 2)
    assert sorted({a.stage for a in folded[0]}) == [0, 2] and sorted({a.stage for a in folded[1]}) == [1, 3]
    result = simulate(folded, UNIT)
    assert result.busy_seconds == [2 * 8 * 3] * 2


def test_recorded_durations_override_costs_and_overhead_delays_the_next_action():
    order = {0: ["0F0", "0B0"], 1: ["1F0", "1B0"]}
    plain = simulate(order, UNIT)
    assert plain.step_seconds == 6
    timed = simulate(order, UNIT, durations={"1F0": 3.0, Action(0, "B", 0): 0.5})
    assert timed.step_seconds == 1 + 3 + 2 + 0.5  # B = I + W = 2
    slowed = simulate(order, UNIT, overhead=0.25)  # after each action on its rank: 0F0 | 1F0 1B0 | 0B0
    assert slowed.step_seconds == 1 + 1 + 0.25 + 2 + 2
    assert slowed.busy_seconds == plain.busy_seconds  # overhead counts as idle, as a recording counts it


def test_costs_json_reads_what_graphkit_costs_writes_and_merges_pairs():
    costs = costs_from_json(costs_json(4))
    assert costs[0].forward == 2 * MS and costs[0].weight_bytes == 400 and costs[0].output_bytes == 100
    assert costs[0].input_grad_bytes == 0 and costs[3].output_bytes == 0
    (first, second) = merge_stage_costs(costs, 2)
    assert first.forward == pytest.approx(4 * MS) and first.activation_bytes == 2000
    assert first.output_bytes == 100 and second.input_grad_bytes == 100


def test_plan_ranks_every_schedule_and_writes_the_best_as_a_runnable_csv(tmp_path):
    plan = plan_schedules(ranks=2, microbatches=8, costs=costs_json(4), overhead=0.0, output=tmp_path)
    names = [item.name for item in plan.schedules]
    assert set(names) == {*BUILT_IN_SCHEDULES, *GENERATED_SCHEDULES}
    steps = [item.predicted_seconds for item in plan.schedules]
    assert steps == sorted(steps)
    assert plan.best.predicted_seconds == min(steps)
    assert plan.by_name("ZBH1").predicted_seconds < plan.baseline.predicted_seconds
    best = read_schedule_csv(tmp_path / "best.csv")
    assert best == plan.best.order.actions()
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["schedules"][0]["schedule"] == plan.best.name
    assert saved["schedules"][0]["peak_memory_bytes"] == list(plan.best.simulation.peak_memory_bytes)
    row = {r["schedule"]: r for r in plan.rows()}["1F1B"]
    assert row["predicted_vs_1f1b"] == 1.0 and row["messages_per_step"] == 2 * 8
    assert "<table>" in plan._repr_html_() and "ZBH1" in plan.table()


def test_a_memory_limit_builds_the_adaptive_schedule_under_it_and_ranks_others_last():
    limit = 2 * 2000  # 1F1B's rank 0 holds two microbatches of two merged stages
    plan = plan_schedules(ranks=2, microbatches=8, costs=costs_json(4), memory_limit=limit)
    adaptive = plan.by_name("Adaptive")
    assert adaptive.fits_memory and max(adaptive.simulation.peak_memory_bytes) <= limit
    over = [item.name for item in plan.schedules if not item.fits_memory]
    assert "GPipe" in over and "ZBH2" in over
    assert all(item.fits_memory for item in plan.schedules[: len(plan.schedules) - len(over)])


def test_what_if_predicts_more_ranks_from_the_same_stage_costs():
    plan = plan_schedules(ranks=2, microbatches=8, costs=costs_json(4))
    rows = plan.what_if(ranks=(8, 16), schedules=("1F1B", "ZBH1"))
    assert [(row["ranks"], row["microbatches"], row["schedule"]) for row in rows] == [
        (8, 8, "1F1B"), (8, 8, "ZBH1"), (8, 32, "1F1B"), (8, 32, "ZBH1"),
        (16, 8, "1F1B"), (16, 8, "ZBH1"), (16, 64, "1F1B"), (16, 64, "ZBH1"),
    ]  # fmt: skip
    assert all(row["predicted_vs_1f1b"] < 1 for row in rows if row["schedule"] == "ZBH1")
    assert "ZBH1" in what_if_table(rows)


def test_plan_command_reads_a_costs_json_and_prints_the_ranked_table(tmp_path, capsys):
    from graphkit.cli import main

    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs_json(4)))
    assert (
        main(
            [
                "plan",
                "--costs",
                str(path),
                "--ranks",
                "2",
                "--microbatches",
                "8",
                "-o",
                str(tmp_path),
                "--what-if",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "predicted ms" in out and "1F1B" in out and "best predicted:" in out and "what if" in out
    assert (tmp_path / "best.csv").exists()
    assert main(["plan", "--costs", str(path), "--ranks", "2", "--microbatches", "8", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {row["schedule"] for row in payload["schedules"]} >= {"1F1B", *GENERATED_SCHEDULES}
    assert main(["plan", "--ranks", "2"]) == 2  # neither a spec nor costs


# --- over real gloo ranks -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_generated_schedules_are_exact_over_two_gloo_ranks_for_two_and_four_stages(tmp_path):
    from graphkit.pipelining.planning import write_schedule_csv
    from graphkit.pipelining.verification import PipelineCase, verify_cases

    spec = "zoo-pipeline:mlp"
    cases = [PipelineCase(spec, name, m) for name in GENERATED_SCHEDULES for m in (4, 8)]
    for name, generate in (("zbh1", zb_h1), ("zbh2", zb_h2)):
        for m in (4, 8):
            path = tmp_path / f"{name}_4stages_{m}.csv"
            write_schedule_csv(fold_schedule(generate(4, m), 2), path)
            cases.append(PipelineCase(spec, f"csv:{path}", m))
    path = tmp_path / "adaptive_4stages_8.csv"
    write_schedule_csv(fold_schedule(adaptive_schedule(UNIT, 4, 8, memory_limit=30), 2), path)
    cases.append(PipelineCase(spec, f"csv:{path}", 8))
    results = verify_cases(cases, ranks=2, deadline=600)
    failures = [(r.case.schedule, r.case.microbatches, r.error) for r in results if not r.ok or not r.exact]
    assert not failures
    for result in results:
        assert all(check.hooks == check.expected_hooks for check in result.parameters)
        assert result.backward_calls["weight"] > 0


@pytest.mark.slow
def test_the_simulator_fed_recorded_durations_predicts_the_recorded_step_within_10_percent():
    from graphkit.pipelining.planning.calibration import DEFAULT_COMM, predict_recorded
    from graphkit.pipelining.recording import record_schedules

    def errors() -> dict[str, float]:
        timelines = record_schedules(
            "zoo-pipeline:mlp_wide",
            ["1F1B", "ZBH1"],
            microbatches=4,
            ranks=2,
            steps=3,
            batch_size=64,
            timeout_s=600,
        )
        return {  # the runtime's gaps read from the recording too
            timeline.schedule: predict_recorded(timeline, comm=DEFAULT_COMM).step_seconds
            / timeline.step_seconds
            - 1
            for timeline in timelines
        }

    found = errors()
    if any(abs(error) > 0.10 for error in found.values()):  # a shared machine descheduled a rank mid-step
        found = errors()
    assert all(abs(error) <= 0.10 for error in found.values()), found


def test_recorded_gaps_with_nothing_to_wait_for_are_the_runtimes_overhead():
    from graphkit.pipelining.planning import Action, RankTimeline, ScheduleTimeline, TimedAction
    from graphkit.pipelining.planning.calibration import predict_recorded, runtime_overhead

    def rank(index, actions, step):
        recorded = [TimedAction(Action(stage, kind, 0), start, end) for kind, stage, start, end in actions]
        return RankTimeline(index, [index], recorded, step, None)

    timeline = ScheduleTimeline(
        "1F1B",
        1,
        2,
        [
            rank(0, [("F", 0, 0.5, 1.5), ("B", 0, 4.0, 6.0)], 6.25),  # 0B0 waited for 1B0: not overhead
            rank(1, [("F", 1, 2.0, 3.0), ("B", 1, 3.25, 4.25)], 4.5),  # 1B0 had its F: 0.25 s of runtime
        ],
    )
    assert runtime_overhead([timeline]) == {"between": 0.25, "gaps": 1, "inside": None, "actions": 0}
    # 0F0 from 0.5 (the time before it, on the first rank), 1F0 1 + 0.25, 1B0 1, 0B0 2, rank 0's tail 0.25
    predicted = predict_recorded(timeline)
    assert [(a.label, a.start, a.end) for a in predicted.actions] == [
        ("0F0", 0.0, 1.5), ("0B0", 3.75, 5.75), ("1F0", 1.5, 2.75), ("1B0", 2.75, 3.75),
    ]  # fmt: skip
    assert predicted.step_seconds == 6.0


def test_plan_command_draws_predicted_next_to_recorded_timelines(tmp_path, capsys, monkeypatch):
    from graphkit.cli import main
    from graphkit.pipelining import planner

    original = planner.plan_schedules

    def recorded_plan(*args, **kwargs):  # a --run plan without processes: the predictions stand in
        plan = original(*args, **{**kwargs, "run": False})
        plan.timelines = [item.simulation.to_schedule_timeline() for item in plan.schedules[:2]]
        return plan

    monkeypatch.setattr(planner, "plan_schedules", recorded_plan)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs_json(4)))
    argv = [
        "plan",
        "zoo-pipeline:mlp",
        "--costs",
        str(path),
        "--ranks",
        "2",
        "--run",
        "-o",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 0
    assert "timelines.html" in capsys.readouterr().out
    assert (tmp_path / "out" / "timelines.html").is_file() and (tmp_path / "out" / "timelines.svg").is_file()


def _machine_step(name, costs, overhead, latency, ranks=2, microbatches=6, send=0.0):
    """A step as a machine with this runtime would record it: simulated, as a recorded timeline."""
    from graphkit.pipelining.planning import CommModel

    order = (
        schedule_order(name, ranks, microbatches)
        if name != "ZBH1"
        else {rank: [str(action) for action in row] for rank, row in zb_h1(ranks, microbatches).items()}
    )
    comm = CommModel(latency, 1e12, rendezvous=True, send_seconds=send)
    simulation = simulate(order, costs, comm, microbatches=microbatches, name=name, overhead=overhead)
    return simulation.to_schedule_timeline()


def test_measure_runtime_reads_back_the_overhead_send_cost_and_latency_a_step_was_made_with():
    from graphkit.pipelining.planning.calibration import calibrate_runtime, measure_runtime

    costs = [StageCost(1.0, 0.75, 0.5, full_backward=1.25), StageCost(1.5, 1.0, 0.5, full_backward=1.5)]
    for overhead, latency, send in ((0.25, 0.5, 0.0), (0.1, 0.0, 0.2), (0.0, 0.3, 0.05)):
        timeline = _machine_step("1F1B", costs, overhead, latency, send=send)
        measured_overhead, comm = measure_runtime(timeline)
        assert measured_overhead == pytest.approx(overhead) and comm.latency == pytest.approx(latency)
        assert comm.send_seconds == pytest.approx(send) and comm.rendezvous
        # the passes ran 1.5 x what these costs say: the slowdown the calibration finds
        faster = [StageCost(c.forward / 1.5, c.backward_input / 1.5, c.backward_weight / 1.5,
                            full_backward=c.full_backward / 1.5) for c in costs]  # fmt: skip
        assert calibrate_runtime(timeline, faster).slowdown == pytest.approx(1.5)


def test_a_run_plan_predicts_every_schedule_from_costs_and_the_recorded_1f1b_alone(monkeypatch):
    # a machine whose runtime adds 0.3 ms per action and 0.4 ms per message, and whose passes run 1.25 x
    # the measured costs: plan_schedules(run=True) calibrates each schedule on the others recorded with it
    # and must then predict every recorded step exactly (they come from the same machine)
    from graphkit.pipelining import planner
    from graphkit.pipelining.planning.cost_model import first_stage_as_run, slowed

    measured = costs_from_json(costs_json(2, f=2 * MS, i=1.5 * MS, w=1 * MS))
    on_machine = slowed(first_stage_as_run(measured), 1.25)
    recorded_names = []

    pinned = []

    def record(pipeline, schedules, pin_cores=False, **_):
        names = [schedule_name(schedule) for schedule in schedules]  # generated ones come as their orders
        recorded_names.extend(names)
        pinned.append(pin_cores)
        return [
            _machine_step(name, on_machine, 0.3 * MS, 0.4 * MS, microbatches=6, send=0.1 * MS)
            for name in names
        ]

    monkeypatch.setattr(planner, "record_schedules", record)
    plan = plan_schedules(
        "zoo-pipeline:mlp",
        ranks=2,
        microbatches=6,
        costs=measured,
        run=True,
        top=3,
        schedules=["1F1B", "GPipe", "ZBH1"],
    )
    # 1F1B twice (the A/A control), and the 15 rounds in three sets of new processes
    assert sorted(recorded_names) == sorted(["1F1B", "1F1B", "GPipe", "ZBH1"] * 3)
    assert plan.first_recording_sets == [5, 5, 5]
    assert plan.to_dict()["first_recording_sets"] == [5, 5, 5]
    assert pinned == [False] * 3 and plan.to_dict()["recording"] == {
        "steps": 15,
        "threads": 1,
        "pin_cores": False,
        "timeout_s": 600.0,
    }
    recorded_names.clear()
    # --top caps the schedules recorded from the band, wherever 1F1B ranks; the best zero-bubble one and
    # its placement's best non-splitting one are recorded besides
    pinned_plan = plan_schedules(
        "zoo-pipeline:mlp", ranks=2, microbatches=6, costs=measured, run=True, top=1, pin_cores=True
    )
    assert recorded_names.count("1F1B") == 2 * 3 and len(recorded_names) <= 5 * 3
    assert all("beyond --top 1" in why or "above the best" in why for _, why in pinned_plan.left_out)
    assert pinned[-1] is True and pinned_plan.recording["pin_cores"] is True
    assert "each rank pinned to one core" in pinned_plan.load
    recorded_names.clear()
    assert plan.overhead == pytest.approx(0.3 * MS) and plan.comm.latency == pytest.approx(0.4 * MS)
    assert plan.comm.send_seconds == pytest.approx(0.1 * MS)
    comm = plan.to_dict()["comm"]  # plan.json records the whole calibrated link
    assert comm["rendezvous"] is True and comm["send_seconds"] == pytest.approx(0.1 * MS)
    assert "calibrated on the recorded schedules (each predicted from the others)" in plan.overhead_source
    assert (
        plan.table()
        .splitlines()[0]
        .startswith(
            "zoo-pipeline:mlp: 2 ranks, 6 microbatches of 8 rows (batch 48, --batch-size); model calibrated"
        )
    )
    for item in plan.schedules:
        assert item.predicted_seconds == pytest.approx(item.measured_seconds), item.name


def test_a_csv_schedule_run_with_other_microbatches_than_it_names_is_refused_before_any_rank_starts(tmp_path):
    from graphkit.pipelining.recording import TimelineError, record_schedules
    from graphkit.pipelining.schedules import check_microbatches
    from graphkit.pipelining.verification import verify_pipeline

    path = tmp_path / "zbh1.csv"
    write_schedule_csv_rows = {rank: [str(a) for a in row] for rank, row in zb_h1(2, 8).items()}
    path.write_text("\n".join(",".join(row) for row in write_schedule_csv_rows.values()) + "\n")
    check_microbatches(f"csv:{path}", 8)
    with pytest.raises(ValueError, match="holds the actions of 8 microbatches.*--microbatches 8"):
        check_microbatches(f"csv:{path}", 4)
    with pytest.raises(ValueError, match="--microbatches 8"):
        verify_pipeline("zoo-pipeline:mlp", schedule=f"csv:{path}", microbatches=4, ranks=2)
    with pytest.raises(TimelineError, match="--microbatches 8"):
        record_schedules("zoo-pipeline:mlp", [f"csv:{path}"], microbatches=4, ranks=2)


def test_w_gets_its_own_calibration_factor_and_a_run_plan_then_predicts_every_zero_bubble_step(monkeypatch):
    # a machine whose passes run 1.25 x the measured costs but whose W runs 1.4 x (W late in a step):
    # the calibration must find both factors, and predict each split schedule from the others exactly
    from graphkit.pipelining import planner
    from graphkit.pipelining.planning.calibration import calibrate_runtime
    from graphkit.pipelining.planning.cost_model import first_stage_as_run, slowed

    measured = costs_from_json(costs_json(2, f=2 * MS, i=1.5 * MS, w=1 * MS))
    as_run = first_stage_as_run(measured)
    on_machine = slowed(as_run, 1.25, 1.4)
    assert on_machine[1].backward_weight == pytest.approx(1.4 * MS)
    assert on_machine[1].backward_input == pytest.approx(1.25 * 1.5 * MS)
    step = _machine_step("ZBH1", on_machine, 0.3 * MS, 0.4 * MS, microbatches=6, send=0.1 * MS)
    fitted = calibrate_runtime(step, as_run)
    assert fitted.slowdown == pytest.approx(1.25) and fitted.weight_slowdown == pytest.approx(1.4)
    plain = _machine_step("1F1B", on_machine, 0.3 * MS, 0.4 * MS, microbatches=6, send=0.1 * MS)
    assert calibrate_runtime(plain, as_run).weight_slowdown is None  # 1F1B runs no W

    def record(pipeline, schedules, **_):
        names = [schedule_name(schedule) for schedule in schedules]
        return [
            _machine_step(name, on_machine, 0.3 * MS, 0.4 * MS, microbatches=6, send=0.1 * MS)
            for name in names
        ]

    monkeypatch.setattr(planner, "record_schedules", record)
    plan = plan_schedules(
        "zoo-pipeline:mlp",
        ranks=2,
        microbatches=6,
        costs=measured,
        run=True,
        prediction_error=10.0,
        schedules=["1F1B", "ZBH1", "ZBH2"],
    )
    for item in plan.schedules:
        assert item.predicted_seconds == pytest.approx(item.measured_seconds), item.name
    assert plan.fitted_slowdown == pytest.approx({"weight": 1.4, "other": 1.25})
    # the plan says what to build CostAware with next time: W 1.4 / 1.25 = 1.12 x the other passes
    assert "plan with --weight-slowdown 1.12 to build it with the W it will meet" in plan.table()
    # given that factor, every W is costed so before anything is simulated
    again = plan_schedules(
        ranks=2, microbatches=6, costs=measured, schedules=["1F1B", "ZBH1"], weight_slowdown=1.12
    )
    assert again.costs[1].backward_weight == pytest.approx(1.12 * MS)
    assert again.costs[1].backward_input == pytest.approx(1.5 * MS)
    with pytest.raises(ValueError, match="weight_slowdown must be above 0"):
        plan_schedules(ranks=2, microbatches=6, costs=measured, weight_slowdown=0.0)


def test_cost_aware_built_again_with_ws_fitted_factor_says_whether_its_order_changes(monkeypatch):
    # W runs 3x its standalone cost in the pipeline: the CostAware recorded (built from the standalone
    # costs) splits and is predicted, and measures, slower than 1F1B; built with W at 3x it splits nothing
    from graphkit.pipelining import planner
    from graphkit.pipelining.planning import CommModel, ScheduleOrder
    from graphkit.pipelining.planning.cost_model import first_stage_as_run, slowed
    from graphkit.pipelining.schedule_plan import simulate_schedule

    measured = costs_from_json(costs_json(2, f=2 * MS, i=1 * MS, w=2 * MS))
    on_machine = slowed(first_stage_as_run(measured), 1.0, 3.0)
    comm = CommModel(0.4 * MS, 1e12, rendezvous=True, send_seconds=0.1 * MS)

    def record(pipeline, schedules, microbatches, ranks, **_):
        timelines = []
        for schedule in schedules:
            order = (
                schedule
                if isinstance(schedule, ScheduleOrder)
                else schedule_order(schedule, ranks, microbatches)
            )
            timeline = simulate(
                order,
                on_machine,
                comm,
                microbatches=microbatches,
                name=schedule_name(schedule),
                overhead=0.3 * MS,
            ).to_schedule_timeline()
            for rank in timeline.ranks:
                rank.step_times = [timeline.step_seconds] * 5
            timelines.append(timeline)
        return timelines

    monkeypatch.setattr(planner, "record_schedules", record)
    plan = plan_schedules(
        "zoo-pipeline:mlp",
        ranks=2,
        microbatches=4,
        costs=measured,
        run=True,
        prediction_error=10.0,
        schedules=["1F1B", "ZBH1", "CostAware"],
    )
    assert plan.fitted_slowdown == pytest.approx({"weight": 3.0, "other": 1.0})
    cost_aware = plan.by_name("CostAware")
    assert cost_aware.splits_backward and cost_aware.measured_seconds > plan.baseline.measured_seconds
    rebuilt = plan.rebuilt_cost_aware
    # the oracle: CostAware built from the costs with W at 3x comes out as 1F1B's order
    oracle = simulate_schedule(
        "CostAware",
        2,
        4,
        slowed(plan.costs, 1.0, 3.0),
        slowed(plan.costs, 1.0, 3.0),
        plan.comm,
        plan.overhead,
        None,
    )
    assert oracle.order.labels() == plan.baseline.order.labels()
    assert rebuilt["same_order"] is False and rebuilt["predicted_vs_1f1b"] == pytest.approx(1.0)
    recorded_ratio = cost_aware.measured_seconds / plan.baseline.measured_seconds
    assert rebuilt["recorded_predicted_vs_1f1b"] == pytest.approx(recorded_ratio)  # calibrated: exact
    assert (
        "plan with --weight-slowdown 3.00 to build it with the W it will meet (built so now it comes out another "
        f"order, predicted 1.00x 1F1B against {recorded_ratio:.2f}x for the order recorded)"
    ) in plan.table()
