"""Bad input to the planning commands, refused in one line before anything runs or is written: a costs JSON
missing a field (or empty, or not JSON) names the file and the field; ``costs --device cuda`` without CUDA
writes nothing; a CSV schedule planned for other ranks than ``--ranks`` is refused before any rank starts."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from graphkit.cli import main
from graphkit.pipelining.planning import write_schedule_csv, zb_h1
from graphkit.pipelining.planning.cost_model import CostsFileError, validate_costs_json


def costs_json(stages: int = 2) -> dict:
    """What `graphkit costs --json` writes, the fields the planner reads."""
    return {
        "method": "made up",
        "stages": [
            {
                "stage_index": index,
                "forward": {"seconds": 2e-3, "flops": 0, "peak_bytes": 0},
                "backward_input": {"seconds": 2e-3, "flops": 0, "peak_bytes": 0},
                "backward_weight": {"seconds": 2e-3, "flops": 0, "peak_bytes": 0},
                "full_backward_seconds": None,
                "activation_bytes": 1000,
                "b_keeps_bytes": 400,
                "input_grad_bytes": 100,
            }
            for index in range(stages)
        ],
    }


def written(tmp_path: Path, data: dict | str) -> Path:
    path = tmp_path / "costs.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_complete_costs_json_passes_unchanged(tmp_path):
    data = costs_json()
    assert validate_costs_json(data) is data
    assert validate_costs_json(written(tmp_path, data)) == data


@pytest.mark.parametrize(
    ("remove", "field"),
    [
        (("backward_weight",), "stages[1].backward_weight.seconds is missing (seconds"),
        (("backward_input", "seconds"), "stages[1].backward_input.seconds is missing"),
        (("activation_bytes",), "stages[1].activation_bytes is missing (bytes"),
        (("b_keeps_bytes",), "stages[1].b_keeps_bytes is missing"),
        (("input_grad_bytes",), "stages[1].input_grad_bytes is missing"),
    ],
)
def test_a_missing_field_is_named_with_the_file_in_one_line(tmp_path, remove, field):
    data = copy.deepcopy(costs_json())
    entry = data["stages"][1]
    for key in remove[:-1]:
        entry = entry[key]
    del entry[remove[-1]]
    path = written(tmp_path, data)
    with pytest.raises(CostsFileError) as caught:
        validate_costs_json(path)
    assert str(caught.value).startswith(f"{path}: {field}") and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"^the costs JSON: stages\[1\]"):
        validate_costs_json(data)


def test_the_first_stage_needs_no_input_gradient_bytes_and_optional_fields_are_checked_when_given():
    data = costs_json()
    del data["stages"][0]["input_grad_bytes"]  # nothing before stage 0 receives them
    validate_costs_json(data)
    data["stages"][0]["recompute_seconds"] = -1.0
    with pytest.raises(
        CostsFileError, match=r"stages\[0\].recompute_seconds must be a number of seconds >= 0"
    ):
        validate_costs_json(data)
    data["stages"][0]["recompute_seconds"] = 0.0
    data["stages"][1]["activation_bytes"] = "1000"
    with pytest.raises(CostsFileError, match=r"stages\[1\].activation_bytes must be a number of bytes"):
        validate_costs_json(data)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty, not a costs JSON"),
        ("  \n", "the file is empty"),
        ("{not json", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2)"),
        ("[1, 2]", "holds a list, not a costs JSON object"),
        ('{"stages": []}', "no 'stages' list"),
    ],
)
def test_an_empty_or_invalid_file_is_named(tmp_path, text, message):
    path = written(tmp_path, text)
    with pytest.raises(CostsFileError) as caught:
        validate_costs_json(path)
    assert str(caught.value).startswith(f"{path}: {message}") and "\n" not in str(caught.value)
    with pytest.raises(CostsFileError, match="nowhere.json: cannot be read"):
        validate_costs_json(tmp_path / "nowhere.json")


@pytest.mark.parametrize("text", ["", "{not json", '{"stages": []}'])
def test_a_bad_costs_file_says_how_to_measure_one_with_pipeline_only_for_hf(tmp_path, text):
    with pytest.raises(CostsFileError) as caught:
        validate_costs_json(written(tmp_path, text))
    assert str(caught.value).endswith(
        "`graphkit costs PIPELINE_SPEC --json -o FILE` writes it, with --pipeline for hf:gpt2 or hf:llama"
        + (")" if text.startswith('{"') else "")
    )


def test_costs_on_cuda_without_cuda_is_refused_before_anything_is_measured_or_written(
    tmp_path, capsys, monkeypatch
):
    import graphkit.measure.costs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    measured = []
    monkeypatch.setattr(graphkit.measure.costs, "spec_costs", lambda *a, **k: measured.append(a))
    output = tmp_path / "gpu_costs.json"
    argv = ["costs", "zoo-pipeline:mlp", "--pipeline", "--device", "cuda", "--json", "-o", str(output)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("graphkit costs: error: --device cuda: ") and "--device cpu" in err
    assert "\n" not in err and not output.exists() and measured == []
    assert main(["costs", "zoo-pipeline:mlp", "--device", "cuda:x", "-o", str(output)]) == 2
    assert "'cuda:x' is not a device" in capsys.readouterr().err and not output.exists()


def test_costs_writes_its_json_to_a_file_the_planner_accepts(tmp_path, capsys):
    output = tmp_path / "costs.json"
    argv = [
        "costs",
        "zoo-pipeline:mlp",
        "--pipeline",
        "--num-stages",
        "2",
        "--json",
        "--repeat",
        "1",
        "--warmup",
        "0",
    ]
    assert main([*argv, "-o", str(output)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {output}"
    assert len(validate_costs_json(output)["stages"]) == 2


def test_a_csv_schedule_for_other_ranks_is_refused_before_any_rank_starts(tmp_path, capsys, monkeypatch):
    import graphkit.pipelining.recording
    import graphkit.pipelining.verification
    from graphkit.pipelining.recording import TimelineError, record_schedules
    from graphkit.pipelining.schedules import check_ranks
    from graphkit.pipelining.verification import verify_pipeline

    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(graphkit.pipelining.verification, "run_on_processes", no_ranks)
    monkeypatch.setattr(graphkit.pipelining.recording, "run_on_processes", no_ranks)
    path = tmp_path / "zbh1.csv"
    write_schedule_csv(zb_h1(2, 8), path)
    check_ranks(f"csv:{path}", 2)
    check_ranks("ZBH1", 4)  # a schedule by name fits any ranks
    message = r"holds 2 rows, one per pipeline rank, not 4: run it with --ranks 2"
    with pytest.raises(ValueError, match=message):
        verify_pipeline("zoo-pipeline:mlp", schedule=f"csv:{path}", microbatches=8, ranks=4)
    with pytest.raises(ValueError, match="rank, not 4"):  # 8 ranks = 4 pipeline ranks x 2 replicas
        verify_pipeline(
            "zoo-pipeline:mlp", schedule=f"csv:{path}", microbatches=8, ranks=8, data_parallel="ddp"
        )
    with pytest.raises(TimelineError, match=message):
        record_schedules("zoo-pipeline:mlp", [f"csv:{path}"], microbatches=8, ranks=4)
    argv = ["verify-pipeline", "zoo-pipeline:mlp", "--schedule", f"csv:{path}", "--ranks", "4"]
    assert main([*argv, "--microbatches", "8"]) == 2
    assert "run it with --ranks 2" in capsys.readouterr().err
