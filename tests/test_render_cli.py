"""``graphkit render``: its options match the Python API, it reports progress, creates the output's folders,
folds a long recurrence, and refuses ``--highlight`` without groups."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from graphkit.cli import main

RECURRENCE = f"{Path(__file__).resolve().parent.parent / 'bench' / 'scale_models.py'}:recurrence"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(
    ("options", "present", "absent"),
    [
        ((), ["cluster_group_0", "parameter groups", "rankdir=BT", "(2, 8, 32)"], ["graphkit-highlight"]),
        (("--plain",), [], ["cluster_group_0"]),
        (("--highlight", "2"), ["graphkit-highlight", "graphkit-faded"], []),
        (("--saved",), ["saved "], []),
        (("--module-paths",), ["blocks.0.attn.qkv"], []),
        (("--no-shapes",), [], ["(2, 8, 32)"]),
        (("--direction", "LR"), ["rankdir=LR"], ["rankdir=BT"]),
        (("--legend", "off"), ["cluster_group_0"], ["parameter groups"]),
        (("--collapse", "2", "--title", "my stage"), ["module.blocks.0", "my stage"], []),
    ],
)
def test_render_options_match_the_python_api(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, options: tuple[str, ...], present: list, absent: list
) -> None:
    output = tmp_path / "new" / "folder" / "graph.dot"
    status, out, err = run(capsys, "render", "zoo:gpt_stage", "-o", str(output), *options)
    assert status == 0 and output.exists() and f"wrote {output}" in out
    assert "loading zoo:gpt_stage" in err and "captured 125 nodes" in err
    source = output.read_text()
    for text in present:
        assert text in source, text
    for text in absent:
        assert text not in source, text


def test_render_svg_reports_progress_and_folds_a_recurrence(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    output = tmp_path / "out" / "recurrence.svg"
    status, _, err = run(capsys, "render", RECURRENCE, "-o", str(output), "--max-nodes", "300")
    assert status == 0
    assert "captured 6003 nodes" in err and re.search(r"laying out \d\d? nodes", err)
    assert "repeated structure folded" in output.read_text()


def test_render_rejects_highlight_without_groups(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run(
        capsys, "render", "zoo:mlp", "-o", str(tmp_path / "x.dot"), "--plain", "--highlight", "0"
    )
    assert status == 2 and "--highlight needs the groups" in err
