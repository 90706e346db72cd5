"""graphkit inspect on real Hugging Face architectures (tiny configs, random weights, no download).

Each report is checked against the ``graphkit groups --json`` and ``graphkit verify --json`` commands run on
the same spec, and against the model's own parameters.
"""

from __future__ import annotations

import contextlib
import io
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from graphkit.apps.report import FILES, inspect  # noqa: E402
from graphkit.cli import main  # noqa: E402
from graphkit.models.specs import load_spec  # noqa: E402

pytestmark = pytest.mark.slow

WHOLE = ["hf:gpt2", "hf:llama", "hf:bert", "hf:t5", "hf:mixtral"]
MIDDLE = ["hf:llama?stage=middle", "hf:mixtral?stage=middle"]
# the verification is the slow part: compare it with `graphkit verify --json` on one whole model and one stage
VERIFY_COMPARED = ["hf:gpt2", "hf:llama?stage=middle"]


class GroupRows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[str] = []
        self.diagrams = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "tr" and "group-row" in (attributes.get("class") or "").split():
            self.rows.append(attributes.get("data-group") or "")
        if tag == "div" and attributes.get("id") == "diagram-box":
            self.diagrams += 1


@pytest.fixture(scope="module", params=WHOLE + MIDDLE)
def hf_report(request, tmp_path_factory) -> tuple[str, int, Path]:
    spec = request.param
    folder = tmp_path_factory.mktemp("hf")
    print(f"inspect {spec}")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = inspect(spec, output=folder)
    return spec, status, folder


def command_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_writes_every_file_and_verifies(hf_report):
    spec, status, folder = hf_report
    assert status == 0
    for name in FILES.values():
        assert (folder / name).stat().st_size > 0, name
    report = json.loads((folder / "report.json").read_text())
    assert report["spec"] == spec and report["verify"]["ok"] is True
    module, inputs = load_spec(spec)
    assert report["summary"]["parameters"] == len(list(module.parameters()))
    assert report["summary"]["parameter_values"] == sum(p.numel() for p in module.parameters())
    assert [item["name"] for item in report["summary"]["inputs"]] == list(inputs)
    flops = report["verify"]["flops"]
    assert flops["b"] + flops["w"] == pytest.approx(flops["full"], rel=0.05)
    if "stage=middle" in spec:
        assert report["summary"]["stage_inputs"] == ["hidden_states"] and flops["b"] > 0
    else:
        assert report["summary"]["stage_inputs"] == [] and flops["b"] == 0


def test_report_groups_and_html_rows_match_graphkit_groups_json(hf_report, capsys):
    spec, _, folder = hf_report
    expected = command_json(capsys, "groups", spec, "--json")
    report = json.loads((folder / "report.json").read_text())
    assert report["groups"] == expected["groups"]
    assert report["unused_params"] == expected["unused_params"]
    assert report["summary"]["nodes"] == expected["nodes"]
    page = GroupRows()
    page.feed((folder / "index.html").read_text())
    assert page.rows == [str(group["index"]) for group in expected["groups"]]
    assert page.diagrams == 1


@pytest.mark.parametrize("hf_report", VERIFY_COMPARED, indirect=True)
def test_report_verify_equals_graphkit_verify_json(hf_report, capsys):
    spec, _, folder = hf_report
    expected = command_json(capsys, "verify", spec, "--json")
    assert json.loads((folder / "report.json").read_text())["verify"] == expected
