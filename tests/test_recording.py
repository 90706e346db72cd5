"""Recorded schedule steps: what ran matches the schedule's own action list, and the recorder leaves no trace.

The in-process tests run every stage on rank 0 of a world-size-1 gloo group. The 2-rank tests (marked
slow) spawn two processes on 127.0.0.1 with a short process-group timeout and a deadline, and end only
the processes they started.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

from graphkit.cli import main
from graphkit.models.pipeline_specs import mlp_pipeline
from graphkit.models.specs import SpecError
from graphkit.pipelining import recording as schedule_recording
from graphkit.pipelining.launcher import local_process_group
from graphkit.pipelining.planning import COMPUTE_KINDS, ScheduleTimeline, TimelineError
from graphkit.pipelining.recording import ScheduleRecorder, record_schedules, schedule_on_rank
from graphkit.pipelining.schedules import common_stage_count, stage_count, stage_indices

MULTI_STAGE = ["Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]


# --- contracts: the PyTorch details the recorder relies on ------------------------------------------------
def test_pytorch_pipelining_details_the_recorder_relies_on():
    from torch.distributed.pipelining import PipelineStage, schedules
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    # the schedules issue and wait for every p2p op through these two module-level helpers
    assert callable(schedules._batch_p2p) and callable(schedules._wait_batch_p2p)
    assert "_batch_p2p(" in inspect.getsource(schedules._sorted_batch_p2p)
    assert "_wait_batch_p2p(self.fwd_recv_ops.pop(" in inspect.getsource(schedules._PipelineScheduleRuntime)
    # the per-chunk methods and the names of their arguments
    parameters = {
        name: list(inspect.signature(getattr(PipelineStage, name)).parameters)
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
    }
    assert parameters["forward_one_chunk"][1] == "fwd_chunk_id"
    assert parameters["backward_one_chunk"][1:3] == ["bwd_chunk_id", "loss"]
    assert "full_backward" in parameters["backward_one_chunk"]
    assert parameters["backward_weight_one_chunk"][1] == "bwd_chunk_id"
    for name in ("get_fwd_send_ops", "get_bwd_send_ops", "get_fwd_recv_ops", "get_bwd_recv_ops"):
        assert callable(getattr(PipelineStage, name))
    assert generate_stage_to_rank_mapping(2, 4, style="v") == {0: 0, 1: 1, 2: 1, 3: 0}
    assert schedules.get_schedule_class("zbvzerobubble") is schedules.ScheduleZBVZeroBubble
    # a single-stage schedule's stage count and microbatches (the expected order of 1F1B and GPipe)
    init = inspect.getsource(schedules.PipelineScheduleSingle.__init__)
    assert "self._num_stages = stage.num_stages" in init
    assert "self._n_microbatches" in inspect.getsource(schedules._PipelineSchedule.__init__)


def placement(schedule: str, ranks: int) -> tuple[int, list[list[int]]]:
    return stage_count(schedule, ranks), [stage_indices(schedule, rank, ranks) for rank in range(ranks)]


def test_every_schedule_runs_the_same_modules_placed_as_pytorch_places_them():
    assert placement("1F1B", 2) == (2, [[0], [1]])
    assert placement("ZBVZeroBubble", 2) == (4, [[0, 3], [1, 2]])
    assert placement("ZBVZeroBubble", 1) == (2, [[0, 1]])
    assert placement("Interleaved1F1B", 2) == (4, [[0, 2], [1, 3]])
    modules = [nn.Linear(2, 2) for _ in range(4)]
    chained = schedule_recording.chained_stage_modules(modules, 2, 2, "1F1B")
    assert [list(part.stages) for part in chained] == [modules[:2], modules[2:]]
    with pytest.raises(TimelineError, match="do not divide"):
        schedule_recording.chained_stage_modules(modules[:3], 2, 1, "ZBVZeroBubble")


def test_unknown_schedule_is_a_clear_error():
    with pytest.raises(TimelineError, match="unknown schedule 'Nope'"):
        record_schedules("zoo-pipeline:mlp", ["Nope"])
    with pytest.raises(TimelineError, match="must be at least 1"):
        record_schedules("zoo-pipeline:mlp", ["ZBVZeroBubble"], microbatches=0)


# --- one process, every stage on rank 0 -------------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded_in_process() -> list[ScheduleTimeline]:
    return record_schedules("zoo-pipeline:mlp", MULTI_STAGE, microbatches=4, ranks=1)


def test_recorded_compute_order_is_the_schedules_own_action_list(recorded_in_process):
    for timeline in recorded_in_process:
        (rank,) = timeline.ranks
        assert rank.expected_order, timeline.schedule
        assert rank.compute_order() == rank.expected_order, timeline.schedule


def test_every_microbatch_runs_forward_and_backward_once_per_stage(recorded_in_process):
    for timeline in recorded_in_process:
        (rank,) = timeline.ranks
        counts = Counter((action.stage, action.microbatch, action.kind) for action in rank.compute_actions())
        for stage in rank.stages:
            for microbatch in range(4):
                assert counts[(stage, microbatch, "F")] == 1
                split = counts[(stage, microbatch, "I")] == counts[(stage, microbatch, "W")] == 1
                assert split or counts[(stage, microbatch, "B")] == 1, (timeline.schedule, stage, microbatch)


def test_times_are_ordered_and_the_bubble_is_a_fraction(recorded_in_process):
    for timeline in recorded_in_process:
        (rank,) = timeline.ranks
        starts = [action.start for action in rank.actions]
        assert starts == sorted(starts)
        assert all(0 <= action.start <= action.end <= rank.step_seconds for action in rank.actions)
        compute = rank.compute_actions()
        assert all(earlier.end <= later.start for earlier, later in zip(compute, compute[1:], strict=False))
        assert 0 <= timeline.bubble_fraction < 1
        assert timeline.step_seconds == rank.step_seconds
        # one rank: nothing to send or receive (adjacent stages hand over locally)
        assert not [action for action in rank.actions if action.kind not in COMPUTE_KINDS]


def test_timeline_round_trips_through_json(recorded_in_process):
    timeline = recorded_in_process[0]
    again = ScheduleTimeline.from_dict(json.loads(timeline.to_json()))
    assert again == timeline
    assert again.summary()["bubble_fraction"] == pytest.approx(timeline.bubble_fraction)


class _FailingOn(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("stage failed on purpose")
        return self.inner(features)


def test_recorder_restores_stages_and_schedules_also_when_the_step_raises():
    from torch.distributed.pipelining import schedules

    originals = (schedules._batch_p2p, schedules._wait_batch_p2p)
    model = mlp_pipeline(num_stages=2, batch_size=4 * 8)
    stages_modules, loss_fn = model.stages, model.loss_fn
    stages_modules[1] = _FailingOn(stages_modules[1])
    args, target = model.inputs, model.schedule_target()
    with local_process_group():
        built, stages = schedule_on_rank(
            stages_modules, "ZBVZeroBubble", 4, 0, 1, torch.device("cpu"), loss_fn
        )
        with pytest.raises(RuntimeError, match="failed to run forward"):  # PipelineStage wraps the error
            with ScheduleRecorder(stages) as recorder:
                assert "forward_one_chunk" in vars(stages[0])
                built.step(*args, target=target)
        assert [action.kind for action in recorder.actions][:1] == ["F"]
    for stage in stages:
        for name in (
            "forward_one_chunk",
            "backward_one_chunk",
            "backward_weight_one_chunk",
            "get_fwd_send_ops",
        ):
            assert name not in vars(stage)
    assert (schedules._batch_p2p, schedules._wait_batch_p2p) == originals
    assert not schedule_recording._active


def test_recorder_refuses_objects_that_are_not_stages():
    with pytest.raises(TimelineError, match="has no forward_one_chunk"):
        ScheduleRecorder([nn.Linear(2, 2)])


def test_timeline_cli_writes_svg_and_html_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    svg, page = tmp_path / "zbv.svg", tmp_path / "zbv.html"
    command = ["timeline", "zoo-pipeline:mlp", "--schedule", "ZBVZeroBubble", "--microbatches", "2"]
    assert main([*command, "-o", str(svg), "-o", str(page)]) == 0
    out = capsys.readouterr().out
    assert "bubble" in out and "ZBVZeroBubble" in out and "ScheduleZBVZeroBubble" not in out
    assert svg.read_text().startswith("<svg") and "<table>" in page.read_text()
    assert main(["timeline", "zoo-pipeline:mlp", "--schedule", "Nope", "-o", str(svg)]) == 2
    assert "unknown schedule" in capsys.readouterr().err


# --- two real ranks ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_rank_gloo_run_records_what_the_schedules_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # one spawn of two ranks records 1F1B and ZBV on the same stages, through the command line
    command = ["compare-schedules", "zoo-pipeline:mlp", "--ranks", "2", "--schedules", "1F1B,ZBVZeroBubble"]
    assert main([*command, "--timeout", "90", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1F1B" in out and "ZBVZeroBubble" in out and "Schedule1F1B" not in out
    data = json.loads((tmp_path / "timelines.json").read_text())
    one_f_one_b, zbv = [ScheduleTimeline.from_dict(item) for item in data]
    assert [len(timeline.ranks) for timeline in (one_f_one_b, zbv)] == [2, 2]
    for rank in zbv.ranks:
        # the runtime's own action list: compute and communication, in order
        assert rank.compute_order() == rank.expected_order
        assert rank.comm_order() == rank.expected_comms and rank.expected_comms
        assert {action.kind for action in rank.compute_actions()} == {"F", "I", "W"}
    for rank in one_f_one_b.ranks:
        # the order Schedule1F1B's step runs (its pipeline_order names a microbatch too many on its last
        # rank, so the expected order comes from the schedule as it runs): what ran, action for action
        assert rank.compute_order() == rank.expected_order
        assert Counter(label[1:] for label in rank.compute_order()) == Counter(
            f"{kind}{microbatch}" for kind in "FB" for microbatch in range(4)
        )
        assert {action.kind for action in rank.actions} >= {"F", "B"}
        sends = [action for action in rank.actions if action.kind.startswith("SEND")]
        assert len([action for action in sends if action.phase == "issue"]) == 4
    assert one_f_one_b.ranks[1].compute_order()[:2] == ["1F0", "1B0"]
    assert 0 < zbv.bubble_fraction < 1 and 0 < one_f_one_b.bubble_fraction < 1
    assert (tmp_path / "timelines.png").read_bytes()[:4] == b"\x89PNG"
    assert "ZBVZeroBubble" in (tmp_path / "index.html").read_text()


@pytest.mark.slow
def test_a_failing_rank_is_reported_and_its_peer_ended(tmp_path: Path):
    path = tmp_path / "failing.py"
    path.write_text(
        "import torch\n"
        "from graphkit.models.pipeline_specs import mlp_pipeline\n"
        "class Broken(torch.nn.Module):\n"
        "    def forward(self, features):\n"
        "        raise ValueError('broken stage')\n"
        "def pipeline(num_stages, batch_size):\n"
        "    model = mlp_pipeline(num_stages, batch_size)\n"
        "    model.stages[1] = Broken()\n"
        "    return model\n"
    )
    with pytest.raises(TimelineError, match="rank 1 failed: .*broken stage"):
        record_schedules(f"{path}:pipeline", ["1F1B"], microbatches=2, ranks=2, timeout_s=60)


def test_the_median_of_several_recorded_steps_is_kept():
    (timeline,) = record_schedules("zoo-pipeline:mlp", ["ZBVZeroBubble"], microbatches=2, steps=3)
    times = timeline.summary()["recorded_step_seconds"]
    assert len(times) == 3
    assert timeline.step_seconds == sorted(times)[1]
    assert timeline.ranks[0].compute_order() == timeline.ranks[0].expected_order


# --- whose stage, and how many stages -----------------------------------------------------------------------
def test_timeline_runs_graphkits_stage_by_default_and_pytorchs_with_stage_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from torch.distributed.pipelining import PipelineStage as TorchStage

    from graphkit.pipelining.stage import PipelineStage as GraphkitStage

    built: list[type] = []
    original = schedule_recording.schedule_on_rank

    def spy(*args, **kwargs):
        schedule, stages = original(*args, **kwargs)
        built.extend(type(stage) for stage in stages)
        return schedule, stages

    monkeypatch.setattr(schedule_recording, "schedule_on_rank", spy)
    command = ["timeline", "zoo-pipeline:mlp", "--schedule", "ZBVZeroBubble", "--microbatches", "2"]
    assert main([*command, "--steps", "1", "-o", str(tmp_path / "graphkit.json")]) == 0
    assert built == [GraphkitStage, GraphkitStage]
    graphkit_timeline = ScheduleTimeline.from_dict(json.loads((tmp_path / "graphkit.json").read_text()))
    built.clear()
    assert main([*command, "--steps", "1", "--stage", "torch", "-o", str(tmp_path / "torch.json")]) == 0
    assert built == [TorchStage, TorchStage]
    torch_timeline = ScheduleTimeline.from_dict(json.loads((tmp_path / "torch.json").read_text()))
    # both run the schedule's own action list, F, I and W on each stage
    for timeline in (graphkit_timeline, torch_timeline):
        (rank,) = timeline.ranks
        assert rank.compute_order() == rank.expected_order
        assert {action.kind for action in rank.compute_actions()} == {"F", "I", "W"}
    built.clear()
    stage_class = "torch.distributed.pipelining:PipelineStage"
    assert main([*command, "--steps", "1", "--stage-class", stage_class, "-o", str(tmp_path / "c.json")]) == 0
    assert built == [TorchStage, TorchStage]
    assert main([*command, "--stage-class", "nowhere:Stage", "-o", str(tmp_path / "x.json")]) == 2


def test_a_spec_function_is_built_with_the_stages_the_schedules_need():
    calls: list[tuple[int, int]] = []

    def pipeline(num_stages: int, batch_size: int):
        calls.append((num_stages, batch_size))
        return mlp_pipeline(num_stages, batch_size, width=8, hidden=8)

    assert common_stage_count(["1F1B"], 2) == 2
    assert common_stage_count(["1F1B", "ZBVZeroBubble"], 2) == 4
    assert common_stage_count(["Interleaved1F1B"], 2, stages_per_rank=3) == 6
    assert common_stage_count(["ZBVZeroBubble", "Interleaved1F1B"], 1, 3) == 6
    (one_f_one_b,) = record_schedules(pipeline, ["1F1B"], microbatches=2)
    assert calls[-1] == (1, 2 * 8) and one_f_one_b.num_stages == 1  # 8 rows per microbatch by default
    timelines = record_schedules(pipeline, ["1F1B", "ZBVZeroBubble"], microbatches=4, batch_size=12)
    assert calls[-1] == (2, 12)
    assert [timeline.num_stages for timeline in timelines] == [1, 2]  # 1F1B chains the two modules
    (interleaved,) = record_schedules(pipeline, ["InterleavedZeroBubble"], microbatches=2, stages_per_rank=3)
    assert calls[-1] == (3, 16) and interleaved.ranks[0].stages == [0, 1, 2]
    with pytest.raises(SpecError, match="does not split into 4 equal microbatches"):
        record_schedules(pipeline, ["1F1B"], microbatches=4, batch_size=6)


def test_a_generated_schedule_is_recorded_under_its_own_name_not_the_runtime_class():
    (zbh1,) = record_schedules("zoo-pipeline:mlp", ["ZBH1"], microbatches=2)
    (one_f_one_b,) = record_schedules("zoo-pipeline:mlp", ["1F1B"], microbatches=2)
    assert zbh1.schedule == "ZBH1" and one_f_one_b.schedule == "1F1B"
