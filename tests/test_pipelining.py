"""graphkit.pipelining: PyTorch's zero-bubble schedules with graphkit's split, against a full backward.

One process runs every schedule x every kind of stage graph (tests/pipeline_models.py) with all stages
on rank 0 of a world-size-1 gloo group; a spawn of 2 gloo ranks runs all of them across processes; 4
ranks run 2 pipeline x 2 data-parallel ranks with DDP and FSDP2. The oracle is a single-process full
backward over the same microbatches (:mod:`graphkit.pipelining.verification`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pipeline_models
import pytest
import torch
from torch import nn

from graphkit.pipelining import (
    TESTED_TORCH,
    PipelineCase,
    PipelineContractError,
    PipelineStage,
    build_schedule,
    check_torch_contract,
    stage_backward_input,
    stage_backward_weight,
    verify_cases,
    verify_pipeline,
)
from graphkit.pipelining.gradient_scaling import SharedGradientScaling
from graphkit.pipelining.schedules import io_schedule_rows, stage_indices

CELLS_FILE = Path(pipeline_models.__file__)
SCHEDULES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", "CSV")
RUNS = [(4, 1), (4, 2), (8, 1), (8, 2)]  # (microbatches, steps)


def spec(cell: str) -> str:
    return f"{CELLS_FILE}:{cell}"


pytestmark = pytest.mark.usefixtures("world_of_one")


@pytest.mark.matrix
@pytest.mark.parametrize(("microbatches", "steps"), RUNS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("cell", pipeline_models.CELLS)
def test_graphkit_stage_is_bitwise_exact_with_hooks_once_per_microbatch(
    cell: str, schedule: str, microbatches: int, steps: int
) -> None:
    result = verify_pipeline(spec(cell), schedule=schedule, microbatches=microbatches, steps=steps)
    assert result.error is None
    assert result.exact, result.table()
    for parameter in result.parameters:
        assert parameter.expected_hooks in (0, microbatches * steps), parameter  # 0: an unused parameter
        assert parameter.hooks == parameter.expected_hooks, result.table()
    assert result.ok


@pytest.mark.matrix
@pytest.mark.parametrize(("microbatches", "steps"), RUNS)
@pytest.mark.parametrize("schedule", ["InterleavedZeroBubble", "CSV"])
@pytest.mark.parametrize("cell", pipeline_models.CELLS)
def test_four_stages_on_one_rank_split_the_middle_stages_exactly(
    cell: str, schedule: str, microbatches: int, steps: int
) -> None:
    result = verify_pipeline(
        spec(cell), schedule=schedule, microbatches=microbatches, steps=steps, stages_per_rank=4
    )
    assert result.ok, result.error or result.table()
    assert result.backward_calls["input"] == result.backward_calls["weight"] == 3 * microbatches * steps


def _stock_four_stage_cells() -> list:
    reasons = {
        "shared_late": "PyTorch's W: 'Trying to backward through the graph a second time'",
        "view_outputs": "PyTorch's I: 'Can't detach views in-place'",
        "param_only_output": "PyTorch's W: wrong or missing gradients for a parameter-only output",
        "loss_parameter": "PyTorch's W gives parameters inside loss_fn no gradient",
    }
    hooks = "PyTorch's W never runs AccumulateGrad: post-accumulate-grad hooks stay silent"
    return [
        pytest.param(cell, schedule, marks=pytest.mark.xfail(strict=True, reason=reasons.get(cell, hooks)))
        for cell in pipeline_models.CELLS
        for schedule in ("InterleavedZeroBubble", "CSV")
    ]


@pytest.mark.matrix
@pytest.mark.parametrize(("cell", "schedule"), _stock_four_stage_cells())
def test_stock_stage_fails_on_four_stages_on_one_rank(cell: str, schedule: str) -> None:
    result = verify_pipeline(spec(cell), schedule=schedule, microbatches=4, stage="torch", stages_per_rank=4)
    assert result.ok, result.error or result.table()


TIED_SCHEDULES = [("ZBVZeroBubble", 2), ("DualPipeV", 2), ("InterleavedZeroBubble", 4), ("CSV", 4)]


@pytest.mark.parametrize(("microbatches", "steps"), [(4, 1), (8, 2)])
@pytest.mark.parametrize(("schedule", "stages_per_rank"), TIED_SCHEDULES)
def test_a_parameter_two_stages_on_one_rank_share_is_divided_once_per_step(
    schedule: str, stages_per_rank: int, microbatches: int, steps: int
) -> None:
    # PyTorch's scale_grads divides each stage's parameters: a shared one twice, the first time while
    # the other stage still adds to it. graphkit's stages divide it once, after both finished.
    result = verify_pipeline(
        spec("tied_first_and_last"),
        schedule=schedule,
        microbatches=microbatches,
        steps=steps,
        stages_per_rank=stages_per_rank,
    )
    assert result.ok, result.error or result.table()
    shared = [check for check in result.parameters if ".ends." in check.name and check.stages > 1]
    assert {check.name for check in shared} == {
        f"stage{index}.ends.{name}" for index in (0, stages_per_rank - 1) for name in ("weight", "bias")
    }
    for check in shared:
        assert check.stages == 2 and check.relative_error <= 1e-12, result.table()
        assert check.hooks == check.expected_hooks == 2 * microbatches * steps, result.table()


@pytest.mark.parametrize(("schedule", "stages_per_rank"), TIED_SCHEDULES)
def test_pytorchs_stage_divides_a_shared_parameter_once_per_stage_and_the_check_reports_it(
    schedule: str, stages_per_rank: int
) -> None:
    result = verify_pipeline(
        spec("tied_first_and_last"), schedule=schedule, stage="torch", stages_per_rank=stages_per_rank
    )
    assert not result.ok
    shared = [check for check in result.parameters if check.stages > 1]
    assert shared and all(check.relative_error > 0.1 for check in shared), result.table()


class _Holder:
    """Stands for a stage: an object a weak reference can point to, with a stage index."""

    def __init__(self, stage_index: int) -> None:
        self.stage_index = stage_index


def test_shared_gradient_scaling_divides_once_per_round_and_starts_over_after_an_aborted_step() -> None:
    scaling = SharedGradientScaling()
    shared, own = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    first, second = _Holder(0), _Holder(3)

    def step(scalers: list[_Holder]) -> None:
        shared.grad, own.grad = torch.full((2,), 16.0), torch.full((2,), 16.0)
        scaling.join(first, [shared, own])
        scaling.join(second, [shared])
        for stage in scalers:
            scaling.note_backward()
            scaling.scale(stage, [shared, own] if stage is first else [shared], 4)

    step([first])  # the step raised before the second stage scaled: the shared gradient waits
    assert own.grad[0] == 4 and shared.grad[0] == 16
    step([first, second])  # the next step starts a new round: divided once, after both
    assert own.grad[0] == 4 and shared.grad[0] == 4
    step([second, first])
    assert shared.grad[0] == 4
    outsider = nn.Parameter(torch.zeros(2))
    outsider.grad = torch.full((2,), 8.0)
    scaling.scale(first, [outsider], 4)  # never joined (scale_grads called by hand): divided at once
    assert outsider.grad[0] == 2


def test_shared_gradient_scaling_lets_rebuilt_stages_supersede_the_stale_ones_still_alive() -> None:
    # a step raised before any backward; the pipeline is rebuilt over the same modules while the old
    # stages live on (an exception's traceback holds them): the old ones must not hold the division back
    scaling = SharedGradientScaling()
    shared = nn.Parameter(torch.zeros(2))
    stale = [_Holder(0), _Holder(3)]
    for stage in stale:
        scaling.join(stage, [shared])
    rebuilt = [_Holder(0), _Holder(3)]
    shared.grad = torch.full((2,), 16.0)
    for stage in rebuilt:
        scaling.join(stage, [shared])
    for stage in rebuilt:
        scaling.note_backward()
        scaling.scale(stage, [shared], 4)
    assert shared.grad[0] == 4


def test_v_schedules_refuse_other_than_two_stages_per_rank() -> None:
    with pytest.raises(ValueError, match="exactly two stages"):
        verify_pipeline(spec("mlp"), schedule="DualPipeV", stages_per_rank=4)


# PyTorch's own stage, where it fails in one process (DualPipeV runs full backwards only there, and passes).
def _stock_cells() -> list:
    params = []
    for cell in pipeline_models.CELLS:
        for schedule in SCHEDULES:
            if schedule == "DualPipeV":
                continue
            reason = "PyTorch's W never runs AccumulateGrad: post-accumulate-grad hooks stay silent"
            if cell == "shared_late":
                reason = "PyTorch's W: 'Trying to backward through the graph a second time'"
            elif cell == "loss_parameter":
                reason = "PyTorch's W gives parameters inside loss_fn no gradient"
            params.append(pytest.param(cell, schedule, marks=pytest.mark.xfail(strict=True, reason=reason)))
    return params


@pytest.mark.matrix
@pytest.mark.parametrize(("microbatches", "steps"), [(4, 1), (8, 2)])
@pytest.mark.parametrize(("cell", "schedule"), _stock_cells())
def test_stock_pipeline_stage_fails_where_graphkit_is_exact(
    cell: str, schedule: str, microbatches: int, steps: int
) -> None:
    result = verify_pipeline(
        spec(cell), schedule=schedule, microbatches=microbatches, steps=steps, stage="torch"
    )
    assert result.ok, result.error or result.table()


def _action_counts(schedule: object, num_stages: int) -> dict[str, int]:
    """What the engine should call: I and W off stage 0 split, B (and W on stage 0) full."""
    counts = {"input": 0, "weight": 0, "full": 0}
    pending = list(schedule.pipeline_order[0])
    while pending:
        action = pending.pop()
        if action is None:
            continue
        if action.sub_actions:
            pending.extend(action.sub_actions)
            continue
        kind = str(action.computation_type)
        first = action.stage_index == 0
        if kind.endswith("BACKWARD_INPUT") or kind == "I":
            counts["input"] += 0 if first else 1
        elif kind.endswith("BACKWARD_WEIGHT") or kind == "W":
            counts["full" if first else "weight"] += 1
        elif kind.endswith("FULL_BACKWARD") or kind == "B":
            counts["full"] += 1
    return counts


@pytest.mark.parametrize("schedule_name", SCHEDULES)
def test_engine_routes_every_i_and_w_action_through_graphkit(
    schedule_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private contract, pinned: each I action is one graphkit B, each W one graphkit W."""
    import graphkit.pipelining.stage as stage_module

    calls = {"input": 0, "weight": 0}
    real_input, real_weight = stage_module.split_input_gradients, stage_module.backward_weight

    def counting_input(*args, **kwargs):
        calls["input"] += 1
        return real_input(*args, **kwargs)

    def counting_weight(*args, **kwargs):
        calls["weight"] += 1
        return real_weight(*args, **kwargs)

    monkeypatch.setattr(stage_module, "split_input_gradients", counting_input)
    monkeypatch.setattr(stage_module, "backward_weight", counting_weight)
    model = pipeline_models.mlp(2, 8)
    stages = [
        PipelineStage(module.double(), index, 2, torch.device("cpu"))
        for index, module in enumerate(model.stages)
    ]
    schedule = build_schedule(schedule_name, stages, 4, model.loss_fn, ranks=1)
    schedule.step(model.inputs[0].double(), target=model.target.double())
    expected = _action_counts(schedule, 2)
    made = {kind: sum(getattr(stage.backward_calls, kind) for stage in stages) for kind in expected}
    assert made == expected
    assert calls == {"input": expected["input"], "weight": expected["weight"]}
    if schedule_name != "DualPipeV":  # there, in one process, stage 1 runs only full backwards
        assert expected["input"] == expected["weight"] == 4


def test_contract_check_names_the_torch_version_when_the_engine_changes() -> None:
    class Changed:
        def backward_maybe_with_nosync(self, kind, kwargs):  # lost last_backward
            pass

        def backward_one_chunk(self):
            return None

    with pytest.raises(PipelineContractError, match=torch.__version__.replace("+", r"\+")) as error:
        check_torch_contract(Changed)
    assert "backward_weight_one_chunk" in str(error.value)
    assert f"tested with torch {' and '.join(TESTED_TORCH)}" in str(error.value)
    check_torch_contract()  # the installed torch keeps the contract


def test_ddp_with_find_unused_parameters_is_rejected() -> None:
    module = nn.parallel.DistributedDataParallel(nn.Linear(2, 2), find_unused_parameters=True)
    with pytest.raises(ValueError, match="find_unused_parameters"):
        PipelineStage(module, 0, 2, torch.device("cpu"))


def test_drop_in_functions_match_a_full_backward_and_write_inputs_grad_as_pytorchs() -> None:
    model = pipeline_models.custom_function(1, 6)
    stage = model.stages[0].double()
    reference = pipeline_models.custom_function(1, 6).stages[0].double()
    reference.load_state_dict(stage.state_dict())
    x = model.inputs[0].double().requires_grad_()
    x_reference = x.detach().clone().requires_grad_()
    output = stage(x)
    cotangent = torch.randn_like(output)
    grads, groups = stage_backward_input([output], [cotangent], [x, 3], stage.parameters())
    assert output.grad_fn is None  # detached in place, as by PyTorch's: the W state holds an anchor
    assert x.grad is grads[0] and grads[1] is None
    stage_backward_weight(stage.parameters(), groups)
    reference(x_reference).backward(cotangent)
    assert torch.equal(grads[0], x_reference.grad)
    for parameter, expected in zip(stage.parameters(), reference.parameters(), strict=True):
        assert torch.equal(parameter.grad, expected.grad)
    with pytest.raises(ValueError, match="PyTorch's"):
        stage_backward_weight(stage.parameters(), [{"params": set(), "intermediates": []}])


def test_csv_schedule_has_separate_i_and_w_actions_on_every_rank() -> None:
    rows = io_schedule_rows(4, 2, 2)
    assert rows[0] == ["0F0", "0F1", "2F0", "2F1", "2I0", "2I1", "0I0", "0I1", "2W0", "2W1", "0W0", "0W1"]
    assert stage_indices("CSV", 1, 2) == [1, 3]
    assert stage_indices("ZBVZeroBubble", 0, 2) == [0, 3]


def test_import_graphkit_does_not_import_torch_distributed_pipelining() -> None:
    code = "import sys, graphkit; print('torch.distributed.pipelining' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_across_two_gloo_processes_every_cell_is_exact() -> None:
    """One spawn: 2 ranks x 2 stages each, every schedule x every cell on one process group; and tied
    first and last stages on rank 0 of the V schedules."""
    cases = [
        PipelineCase(spec(cell), schedule, 4, 1) for cell in pipeline_models.CELLS for schedule in SCHEDULES
    ] + [
        PipelineCase(spec("tied_first_and_last"), schedule, 4, 1)
        for schedule in ("ZBVZeroBubble", "DualPipeV")
    ]
    results = verify_cases(cases, ranks=2, deadline=240)
    failures = [(result.case.spec, result.case.schedule, result.error) for result in results if not result.ok]
    assert not failures
    for result in results:
        assert result.ranks == 2
        assert result.backward_calls["input"] > 0 and result.backward_calls["weight"] > 0


@pytest.mark.slow
def test_two_pipeline_by_two_data_parallel_ranks_with_ddp_and_fsdp2_average_like_ddp() -> None:
    cases = [
        PipelineCase(spec(cell), "ZBVZeroBubble", 4, 2, data_parallel=data_parallel)
        for data_parallel in ("ddp", "fsdp")
        for cell in (
            "mlp",
            "shared_late",
            "tied",
        )  # DDP needs every parameter used (no find_unused_parameters)
    ]
    results = verify_cases(cases, ranks=4, deadline=300)
    for result in results:
        assert result.ok, (result.case, result.error, result.table())
        assert result.max_relative_error < 1e-12


def test_verify_pipeline_command_exits_0_when_exact_and_1_on_pytorchs_stage(
    capsys: pytest.CaptureFixture,
) -> None:
    from graphkit.cli import main

    assert (
        main(["verify-pipeline", spec("shared_late"), "--schedule", "ZBVZeroBubble", "--microbatches", "4"])
        == 0
    )
    out = capsys.readouterr().out
    assert "stage1.shared.scale" in out and "bit for bit" in out and "4/4" in out
    status = main(["verify-pipeline", spec("shared_late"), "--schedule", "zbvzerobubble", "--stage", "torch"])
    assert status == 1
    out = capsys.readouterr().out
    assert "backward through the graph a second time" in out
    # a step that did not run passes no parameter: every row says it was not compared
    rows = [line for line in out.splitlines() if line.startswith("stage")]
    assert rows and all("not compared: the step did not run" in row for row in rows)
    assert not any(" yes " in row for row in rows)
    assert out.strip().splitlines()[-1].startswith("FAILED: the schedule step did not run to the end")
    assert main(["verify-pipeline", spec("mlp"), "--schedule", "GPipe"]) == 2
    assert "unknown schedule 'GPipe'" in capsys.readouterr().err
    # right gradients but silent hooks: the verdict says that the hooks are what failed
    assert main(["verify-pipeline", spec("mlp"), "--schedule", "CSV", "--stage", "torch"]) == 1
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("NOT exact: post-accumulate-grad hooks did not fire once per microbatch")
    assert "gradients differ" not in verdict


def test_verify_pipeline_json_reports_every_parameter(capsys: pytest.CaptureFixture) -> None:
    import json

    from graphkit.cli import main

    assert main(["verify-pipeline", spec("loss_parameter"), "--schedule", "CSV", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    names = {parameter["name"] for parameter in payload["parameters"]}
    assert {"loss_fn.log_scale", "loss_fn.bias", "stage0.linear.weight"} <= names
    assert payload["ok"] and payload["exact"] and payload["backward_calls"]["weight"] == 4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pipeline", "schedule"),
    [("hf:gpt2?n_layer=4", "DualPipeV"), ("hf:llama?num_hidden_layers=4", "ZBVZeroBubble")],
)
def test_hugging_face_models_cut_into_stages_are_exact_across_two_processes(
    pipeline: str, schedule: str
) -> None:
    result = verify_pipeline(pipeline, schedule=schedule, microbatches=4, ranks=2, deadline=240)
    assert result.ok, result.error or result.table()
    assert any(name.endswith("lm_head.weight") for name in (check.name for check in result.parameters))


@pytest.mark.parametrize(
    ("schedule", "stages_per_rank"), [("ZBVZeroBubble", 2), ("InterleavedZeroBubble", 4)]
)
def test_llama_cut_into_stages_is_bitwise_exact_in_one_process(schedule: str, stages_per_rank: int) -> None:
    pytest.importorskip("transformers")
    result = verify_pipeline(
        "hf:llama?num_hidden_layers=4",
        schedule=schedule,
        microbatches=4,
        steps=2,
        stages_per_rank=stages_per_rank,
    )
    assert result.ok and result.exact, result.error or result.table()
    names = {check.name for check in result.parameters}
    last = stages_per_rank - 1
    assert {"stage0.embed_tokens.weight", f"stage{last}.lm_head.weight", f"stage{last}.norm.weight"} <= names
    assert all(
        check.hooks == check.expected_hooks == 8 for check in result.parameters
    )  # 4 microbatches x 2 steps
    assert (
        len(names) == 9 * 4 + 3
    )  # 9 parameters per decoder layer, the embedding, the final norm and the head


def test_verify_pipeline_command_checks_llama_cut_into_stages(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("transformers")
    from graphkit.cli import main

    command = ["verify-pipeline", "hf:llama?num_hidden_layers=4", "--schedule", "InterleavedZeroBubble"]
    assert main([*command, "--stages-per-rank", "4", "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    assert "stage3.lm_head.weight" in out and "bit for bit" in out
    assert main(["verify-pipeline", "hf:llama?tie_word_embeddings=1", "--schedule", "ZBVZeroBubble"]) == 2
    assert "tie_word_embeddings=1 ties stage 0's embedding" in capsys.readouterr().err


def test_split_state_holds_no_output_so_outputs_may_be_dropped_or_detached_after_b() -> None:
    """A custom Function's Node is called in W: the state keeps its graph through an empty anchor only."""
    import gc
    import weakref

    from graphkit import backward_input, backward_weight

    stage = pipeline_models.custom_function(1, 6).stages[0].double()
    reference = pipeline_models.custom_function(1, 6).stages[0].double()
    reference.load_state_dict(stage.state_dict())
    x = torch.randn(6, pipeline_models.WIDTH, dtype=torch.float64, requires_grad=True)
    output = stage(x)
    cotangent = torch.randn_like(output)
    state = backward_input(output, cotangent, x)
    assert state.num_node_calls == 1  # W calls the custom Function's Node
    alive = weakref.ref(output)
    del output
    gc.collect()
    assert alive() is None
    backward_weight(state)
    reference(x.detach().clone().requires_grad_()).backward(cotangent)
    assert torch.equal(stage.weight.grad, reference.weight.grad)


def test_verify_pipeline_timeline_draws_the_checked_step(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import json
    from collections import Counter

    from graphkit.cli import main
    from graphkit.pipelining.planning import ScheduleTimeline

    svg, data = tmp_path / "checked.svg", tmp_path / "checked.json"
    command = ["verify-pipeline", "zoo-pipeline:mlp", "--schedule", "ZBVZeroBubble", "--microbatches", "4"]
    assert main([*command, "--steps", "2", "--timeline", str(svg), "--timeline", str(data)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {svg}" in out and "bubble" in out and "bit for bit" in out
    assert svg.read_text().startswith("<svg")
    timeline = ScheduleTimeline.from_dict(json.loads(data.read_text()))
    (rank,) = timeline.ranks
    assert timeline.schedule == "ZBVZeroBubble" and rank.stages == [0, 1]
    assert rank.compute_order() == rank.expected_order  # the schedule's own action list
    counts = Counter((action.stage, action.kind) for action in rank.compute_actions())
    assert counts == {(stage, kind): 4 for stage in (0, 1) for kind in "FIW"}  # one step recorded: the last
    assert main([*command, "--json", "--timeline", str(tmp_path / "again.html")]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] and payload["timeline"]["schedule"] == "ZBVZeroBubble"
    assert payload["timeline_files"] == [str(tmp_path / "again.html")]


@pytest.mark.slow
def test_check_pipeline_records_a_timeline_on_every_rank_across_two_processes() -> None:
    result = verify_pipeline(
        spec("mlp"), schedule="ZBVZeroBubble", microbatches=4, ranks=2, timeline=True, deadline=240
    )
    assert result.ok, result.error or result.table()
    timeline = result.timeline
    assert [rank.rank for rank in timeline.ranks] == [0, 1]
    assert [rank.stages for rank in timeline.ranks] == [[0, 3], [1, 2]]
    for rank in timeline.ranks:
        assert rank.compute_order() == rank.expected_order
        assert rank.comm_order() == rank.expected_comms and rank.expected_comms
    assert 0 < timeline.bubble_fraction < 1


def test_a_loss_that_does_not_require_grad_is_a_clear_error_in_the_last_stages_b() -> None:
    # PyTorch's full backward raises for it; graphkit's B must not return no gradients silently
    from graphkit.graph.tensors import GraphkitInputError

    stage = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    loss = (stage(x).detach() ** 2).sum()
    with pytest.raises(GraphkitInputError, match="does not require grad"):
        stage_backward_input([loss], None, [x], stage.parameters())


def test_the_documented_pipeline_spec_whose_target_is_none_verifies_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # docs/pipeline_costs.md's mlp_pipeline.py returns target=None: its loss ignores the target
    import re

    from graphkit.cli import main

    page = (Path(__file__).parents[1] / "docs" / "pipeline_costs.md").read_text()
    (block,) = [b for b in re.findall(r"^```python\n(.*?)^```", page, re.M | re.S) if "def pipeline(" in b]
    assert "None\n" in block.splitlines()[-1] + "\n"  # its target is None
    (tmp_path / "mlp_pipeline.py").write_text(block)
    assert main(["verify-pipeline", f"{tmp_path / 'mlp_pipeline.py'}:pipeline"]) == 0
    out = capsys.readouterr().out
    assert "bit for bit" in out and "not compared" not in out
    # one vocabulary: I = input-gradient backward (the ZB paper's B), W, and B = the full backward
    (calls,) = [line for line in out.splitlines() if line.startswith("backwards run:")]
    assert re.match(
        r"backwards run: 4 I, 4 W \(graphkit's split: I = input-gradient backward, the ZB "
        r"paper's B; W = weight-gradient backward\), \d+ B \(full backward; PyTorch's runtime runs a first "
        r"stage's I as nothing and its W as one full backward, counted here as B\)",
        calls,
    ), calls


def test_a_loss_given_none_for_its_target_sees_none_in_the_schedule_and_the_reference() -> None:
    from graphkit.models.pipeline_specs import PipelineModel

    seen: list[object] = []

    def build(num_stages: int, batch_size: int) -> PipelineModel:
        stages = [nn.Linear(4, 4) for _ in range(num_stages)]

        def loss(output: torch.Tensor, target: object) -> torch.Tensor:
            seen.append(target)
            return (output**2).mean()

        return PipelineModel(stages, loss, (torch.randn(batch_size, 4),), None)

    result = verify_pipeline(build, schedule="ZBVZeroBubble", microbatches=2)
    assert result.ok, result.error or result.table()
    assert seen and all(target is None for target in seen)
