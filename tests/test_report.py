"""graphkit inspect: the report folder, its HTML page and JSON, the terminal summary and the exit status.

Oracles: the library calls the report is built from (trace, param_groups), the ``graphkit groups --json``
and ``graphkit verify --json`` commands, and the deliberately broken custom Function of
``tests/specs/broken_split.py`` (its weight gradient is doubled in the W phase only).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import networkx as nx
import pytest
import torch

from graphkit.analysis.parameter_groups import param_groups
from graphkit.apps.report import DEFAULT_SPEC, FILES, inspect
from graphkit.cli import main
from graphkit.graph.tracing import trace
from graphkit.models import zoo

BROKEN = f"{Path(__file__).parent / 'specs' / 'broken_split.py'}:build"


@dataclass
class Run:
    """One call of :func:`inspect`: its status, what it printed and what it wrote."""

    status: int
    out: str
    err: str
    folder: Path

    @property
    def report(self) -> dict:
        return json.loads((self.folder / "report.json").read_text())

    @property
    def html(self) -> str:
        return (self.folder / "index.html").read_text()


def run_inspect(folder: Path, spec: str | None = None, **options) -> Run:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = inspect(spec, output=folder, **options)
    return Run(status, out.getvalue(), err.getvalue(), folder)


def cli_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    status = main(list(argv))
    out = capsys.readouterr().out
    assert status in (0, 1)
    return json.loads(out)


class PageParser(HTMLParser):
    """Collects what the tests ask of index.html: group rows, SVG elements, references to other files."""

    def __init__(self) -> None:
        super().__init__()
        self.group_rows: list[str] = []
        self.failed_rows = 0
        self.svg_ids: list[str | None] = []
        self.references: list[str] = []
        self.tags: list[str] = []
        self.rects: list[dict[str, str | None]] = []
        self.open_tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append(tag)
        classes = (attributes.get("class") or "").split()
        if tag == "tr" and "group-row" in classes:
            self.group_rows.append(attributes.get("data-group") or "")
        if tag == "tr" and "failed" in classes:
            self.failed_rows += 1
        if tag == "svg":
            self.svg_ids.append(attributes.get("class"))
        if tag == "rect":
            self.rects.append(attributes)
        for name in ("src", "href"):
            if attributes.get(name):
                self.references.append(attributes[name])


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return parser


def oracle_graph(spec_name: str):
    module, inputs = zoo.build(spec_name)
    _, graph = trace(module, *inputs)
    return module, graph


# --------------------------------------------------------------------------------------------------------
# The default model


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Run:
    # the first-stage GPT (token ids in, tied head): everything happens in the W phase
    return run_inspect(tmp_path_factory.mktemp("gpt") / "graphkit-report", "zoo:gpt")


def test_default_spec_is_the_zoo_default_model():
    assert DEFAULT_SPEC == f"zoo:{zoo.DEFAULT_MODEL}" == "zoo:gpt_ends"


def test_inspect_without_a_spec_reports_the_default_model(tmp_path):
    run = run_inspect(tmp_path / "graphkit-report")
    assert run.status == 0
    for name in FILES.values():
        assert (run.folder / name).is_file(), name
        assert (run.folder / name).stat().st_size > 0, name
    report = run.report
    assert set(report) == {"spec", "summary", "groups", "unused_params", "verify", "flops", "files"}
    assert report["spec"] == "zoo:gpt_ends"
    assert report["files"] == FILES
    # the tied weight reaches the head's intermediate and the embedding output: both flags show
    tied = [group for group in report["groups"] if "wte.weight" in group["params"]]
    assert len(tied) == 1
    assert set(tied[0]["flags"]) == {"shared-parameter", "parameter-only-output"}
    assert report["verify"]["ok"] is True
    flops = report["verify"]["flops"]
    assert flops["b"] > 0 and flops["w"] > 0 and flops["b"] + flops["w"] == flops["full"]
    assert len(parse(run.html).group_rows) == len(report["groups"]) == 8


def test_inspect_writes_every_file_and_exits_0(default_run):
    assert default_run.status == 0
    for name in FILES.values():
        assert (default_run.folder / name).is_file(), name
        assert (default_run.folder / name).stat().st_size > 0, name
    report = default_run.report
    assert set(report) == {"spec", "summary", "groups", "unused_params", "verify", "flops", "files"}
    assert report["spec"] == "zoo:gpt"
    assert report["files"] == FILES


def test_default_report_summary_matches_the_captured_graph(default_run):
    module, graph = oracle_graph("gpt")
    summary = default_run.report["summary"]
    assert summary["nodes"] == graph.number_of_nodes() == 136
    assert summary["edges"] == graph.number_of_edges()
    # lm_head.weight is wte.weight: one tensor under two names
    assert summary["parameters"] == len(list(module.parameters())) == 28
    assert summary["parameter_values"] == sum(p.numel() for p in module.parameters())
    assert summary["tied_parameters"] == [["wte.weight", "lm_head.weight"]]
    assert summary["inputs"] == [
        {"name": "0", "argument": "token_ids", "shape": [2, 8], "dtype": "int64", "requires_grad": False}
    ]
    assert summary["stage_inputs"] == []
    assert summary["outputs"] == [{"name": "output", "shape": [2, 8, 64], "dtype": "float32"}]
    assert summary["verdict"] == "OK" and summary["ok"] is True and summary["wrong"] == []
    assert summary["groups"] == len(param_groups(graph)) == 1
    assert summary["diagram"] == {"svg": True, "collapse_depth": None, "note": None}


def test_default_report_groups_match_graphkit_groups_json(default_run, capsys):
    expected = cli_json(capsys, "groups", "zoo:gpt", "--json")
    report = default_run.report
    assert report["groups"] == expected["groups"]
    assert report["unused_params"] == expected["unused_params"] == []
    assert report["groups"][0]["flags"] == ["parameter-only-output"]


def test_default_report_verify_equals_graphkit_verify_json(default_run, capsys):
    expected = cli_json(capsys, "verify", "zoo:gpt", "--json")
    verify = default_run.report["verify"]
    assert verify == expected
    # a first stage: token ids need no gradient, so B computes nothing and W everything
    assert verify["flops"]["b"] == 0 and verify["flops"]["w"] == verify["flops"]["full"] > 0


def test_default_index_html_parses_with_the_diagram_and_one_row_per_group(default_run):
    page = parse(default_run.html)
    assert page.group_rows == ["0"]
    svg = (default_run.folder / "graph.svg").read_text()
    assert "graphkit&#45;group&#45;0" in svg  # graphviz writes "-" in ids as &#45;
    assert svg[svg.index("<svg") :].strip() in default_run.html  # the diagram, inlined
    assert "zoo:gpt" in default_run.html and "No stage input requires grad" in default_run.html
    assert "wte.weight" in default_run.html and "lm_head.weight" in default_run.html
    assert "B + W costs" not in default_run.html


def test_index_html_is_self_contained(default_run):
    page = parse(default_run.html)
    assert "link" not in page.tags and "img" not in page.tags and "iframe" not in page.tags
    # links point at the report's own files or at anchors on the page, never at the network
    for reference in page.references:
        assert reference.startswith("#") or reference in FILES.values(), reference
    assert "http://" not in default_run.html.replace('xmlns="http://www.w3.org/', "").replace(
        'xmlns:xlink="http://www.w3.org/', ""
    )


def test_default_graphml_and_dot_describe_the_captured_graph(default_run):
    _, graph = oracle_graph("gpt")
    loaded = nx.read_graphml(default_run.folder / "graph.graphml")
    assert loaded.number_of_nodes() == graph.number_of_nodes()
    assert loaded.number_of_edges() == graph.number_of_edges()
    dot = (default_run.folder / "graph.dot").read_text()
    assert dot.startswith("digraph autograd {") and "cluster_group_0" in dot


def test_terminal_shows_progress_summary_and_verdict(default_run):
    for position, step in enumerate(
        ("load model", "capture graph", "parameter groups", "verify split", "draw diagram", "write files"),
        start=1,
    ):
        assert f"[{position}/6] {step} ..." in default_run.err
    assert "136 nodes, 144 edges" in default_run.out
    assert "28 tensors" in default_run.out
    assert "OK: split backward (B then W) matches the full backward" in default_run.out
    assert str(default_run.folder / "index.html") in default_run.out


# --------------------------------------------------------------------------------------------------------
# A middle stage: several groups, B and W both at work


@pytest.fixture(scope="module")
def stage_run(tmp_path_factory) -> Run:
    return run_inspect(tmp_path_factory.mktemp("stage"), "zoo:gpt_stage")


def test_middle_stage_has_one_html_row_per_group(stage_run):
    _, graph = oracle_graph("gpt_stage")
    groups = param_groups(graph)
    assert len(groups) == 12
    page = parse(stage_run.html)
    assert page.group_rows == [str(group.index) for group in groups]
    assert [group["params"] for group in stage_run.report["groups"]] == [list(g.params) for g in groups]
    assert page.failed_rows == 0


def test_middle_stage_verify_equals_graphkit_verify_json(stage_run, capsys):
    expected = cli_json(capsys, "verify", "zoo:gpt_stage", "--json")
    assert stage_run.report["verify"] == expected
    assert [check["name"] for check in expected["inputs"]] == ["0"]


def test_flops_chart_bars_are_proportional_to_the_phases(stage_run):
    flops = stage_run.report["verify"]["flops"]
    assert flops["b"] > 0 and flops["w"] > 0
    page = parse(stage_run.html)
    widths = [float(rect["width"]) for rect in page.rects if "var(--" in (rect.get("style") or "")]
    largest = max(flops["full"], flops["b"] + flops["w"])
    expected = [flops["full"], flops["b"], flops["w"], flops["b"], flops["w"]]
    assert widths == pytest.approx([300 * value / largest for value in expected], abs=0.06)


# --------------------------------------------------------------------------------------------------------
# A failing verification


def test_broken_split_exits_1_and_names_the_wrong_parameter(tmp_path):
    run = run_inspect(tmp_path, BROKEN)
    assert run.status == 1
    failed_line = next(line for line in run.out.splitlines() if line.startswith("FAILED"))
    assert "weight (wrong" in failed_line and "first.weight" not in failed_line
    report = run.report
    assert report["summary"]["verdict"] == "FAILED"
    assert report["summary"]["wrong"] == ["weight"]
    wrong = [check for check in report["verify"]["params"] if check["status"] != "ok"]
    assert [check["name"] for check in wrong] == ["weight"]
    # the W phase doubles the gradient: relative error 1
    assert wrong[0]["relative_error"] == pytest.approx(1.0)
    assert [check["status"] for check in report["verify"]["inputs"]] == ["ok"]
    page = parse(run.html)
    assert page.failed_rows == 1 and "FAILED" in run.html
    # its backward computes both gradients in B and in W: the page says B + W costs more than a full backward
    flops = report["verify"]["flops"]
    extra = flops["b"] + flops["w"] - flops["full"]
    assert extra > 0 and f"B + W costs {extra} FLOP ({100 * extra / flops['full']:.0f}%) more" in run.html
    for name in FILES.values():
        assert (tmp_path / name).is_file(), name


def test_broken_split_report_agrees_with_graphkit_verify_json(tmp_path, capsys):
    expected = cli_json(capsys, "verify", BROKEN, "--json")
    assert run_inspect(tmp_path, BROKEN).report["verify"] == expected
    assert expected["ok"] is False


def test_cli_inspect_passes_the_exit_status_through(tmp_path, capsys):
    assert main(["inspect", BROKEN, "-o", str(tmp_path / "broken")]) == 1
    assert main(["inspect", "zoo:mlp", "-o", str(tmp_path / "mlp")]) == 0
    out = capsys.readouterr().out
    assert "FAILED" in out and "OK: split backward" in out
    assert json.loads((tmp_path / "mlp" / "report.json").read_text())["spec"] == "zoo:mlp"


# --------------------------------------------------------------------------------------------------------
# Without Graphviz, options, errors


def test_without_graphviz_everything_but_the_svg_is_written(tmp_path, monkeypatch):
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "graph.svg").write_text("<svg>an old diagram</svg>")
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))
    run = run_inspect(folder, "zoo:mlp")
    assert run.status == 0
    assert not (folder / "graph.svg").exists()  # the stale diagram is gone
    for kind, name in FILES.items():
        assert (folder / name).is_file() == (kind != "svg"), name
    assert "warning: no diagram" in run.err and "apt-get install graphviz" in run.err
    report = run.report
    assert report["files"]["svg"] is None and report["files"]["dot"] == "graph.dot"
    assert report["summary"]["diagram"]["svg"] is False
    assert "Graphviz" in report["summary"]["diagram"]["note"]
    page = parse(run.html)
    assert page.svg_ids == ["flops"]  # the FLOPs chart only, no diagram
    assert "No diagram" in run.html and "apt-get install graphviz" in run.html
    assert 'id="diagram-box"' not in run.html
    _, graph = oracle_graph("mlp")
    assert page.group_rows == [str(group.index) for group in param_groups(graph)] == ["0", "1"]


def test_a_failing_dot_program_leaves_a_report_without_the_diagram(tmp_path, monkeypatch):
    programs = tmp_path / "bin"
    programs.mkdir()
    (programs / "dot").write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 3\n")
    (programs / "dot").chmod(0o755)
    monkeypatch.setenv("PATH", str(programs))
    run = run_inspect(tmp_path / "report", "zoo:mlp")
    assert run.status == 0
    assert not (run.folder / "graph.svg").exists() and (run.folder / "graph.dot").is_file()
    note = run.report["summary"]["diagram"]["note"]
    assert "exit status 3" in note and "syntax error in line 1" in note
    assert "No diagram" in run.html and "warning: no diagram" in run.err


def test_dtype_and_collapse_depth_reach_the_report(tmp_path):
    run = run_inspect(tmp_path, "zoo:gpt_stage", dtype=torch.float64, collapse_depth=2)
    report = run.report
    assert run.status == 0
    assert report["verify"]["dtype"] == "float64" and report["verify"]["tolerance"] == 1e-9
    assert report["summary"]["dtype"] == "float64"
    assert report["summary"]["diagram"]["collapse_depth"] == 2
    assert report["summary"]["outputs"][0]["dtype"] == "float64"
    dot = (tmp_path / "graph.dot").read_text()
    assert "module.blocks.0" in dot and "module.blocks.1" in dot  # blocks.0 has depth 2: drawn as one node
    assert "module.blocks.0.attn" not in dot
    page_text = " ".join(run.html.split())
    assert "Each module at depth 2 of the module tree is collapsed into one node" in page_text
    loaded = nx.read_graphml(tmp_path / "graph.graphml")
    assert {json.loads(dtypes)[0] for _, dtypes in loaded.nodes(data="dtypes") if dtypes} == {"float64"}


def test_bad_collapse_depth_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="module depth >= 1"):
        inspect("zoo:mlp", output=tmp_path / "never", collapse_depth=0)
    assert not (tmp_path / "never").exists()


def test_an_output_path_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "report").write_text("not a folder")
    assert main(["inspect", "zoo:mlp", "-o", str(tmp_path / "report")]) == 2
    assert "is a file; the report needs a folder" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path, capsys):
    assert main(["inspect", "zoo:mlp", "-o", str(tmp_path), "--device", "cuda"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err


def test_unknown_spec_exits_2_with_the_spec_error(tmp_path, capsys):
    assert main(["inspect", "zoo:no_such_model", "-o", str(tmp_path)]) == 2
    assert "known models" in capsys.readouterr().err


def test_plain_summary_without_rich(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setitem(sys.modules, "rich.table", None)
    run = run_inspect(tmp_path, "zoo:mlp")
    lines = run.out.splitlines()
    assert lines[0].split() == ["model", "zoo:mlp", "(Sequential)"]
    _, graph = oracle_graph("mlp")
    assert any(line.split()[:2] == ["groups", str(len(param_groups(graph)))] for line in lines)
    assert "\u2502" not in run.out  # no table borders


# --------------------------------------------------------------------------------------------------------
# The README, which sends newcomers here


def test_readme_python_example_runs_and_its_images_exist(repo_root, capsys):
    readme = (repo_root / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    model = namespace["model"]
    assert all(parameter.grad is not None for parameter in model.parameters())
    assert namespace["grad_hidden"].shape == namespace["hidden"].shape
    assert "OK: all 25 gradients match (24 parameters, 1 input)" in capsys.readouterr().out
    for image in ("docs/images/llama-stage.png", "docs/images/inspect-report.png"):
        assert f'src="{image}"' in readme
        assert (repo_root / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image


def test_a_checkpointed_stage_names_the_nodes_that_repeat_work(tmp_path):
    spec = f"{Path(__file__).parent / 'specs' / 'checkpointed_stage.py'}:build"
    run = run_inspect(tmp_path, spec, dtype=torch.float64)
    assert run.status == 0, run.out
    report = run.report
    repeated = [node for node in report["verify"]["opaque_nodes"] if node["repeated_flops"] > 0]
    assert repeated and all(node["kind"] == "checkpointed" for node in repeated)
    flops = report["verify"]["flops"]
    assert sum(node["repeated_flops"] for node in report["verify"]["opaque_nodes"]) == (
        flops["b"] + flops["w"] - flops["full"]
    )
    assert "The work repeated, by Node" in run.html and "[checkpointed] repeats" in run.html
    # the terminal summary names them too, costliest first
    costliest = max(repeated, key=lambda node: node["repeated_flops"])
    assert "repeated" in run.out and f"{costliest['node']} {costliest['op']} [checkpointed]" in run.out


def test_inputs_are_described_in_the_dtype_they_were_checked_in(tmp_path):
    run = run_inspect(tmp_path, "zoo:gpt_stage", dtype=torch.float64)
    inputs = run.report["summary"]["inputs"]
    assert inputs and all(item["dtype"] == "float64" for item in inputs if item["requires_grad"])
    assert run.report["verify"]["dtype"] == "float64"
    assert "float64" in run.out and "float32" not in run.out  # the terminal's inputs row too


def test_the_diagram_box_leaves_room_for_verification_and_files_below_it():
    # a tall diagram scrolls inside its box: at most 70% of the window, so the sections after it stay in reach
    import re

    from graphkit.drawing.templating import environment

    css = environment().loader.get_source(environment(), "report.css")[0]
    (rule,) = re.findall(r"^\.diagram \{[^}]*\}", css, re.M)
    assert "max-height:70vh" in rule and "overflow:auto" in rule


def test_the_group_table_shows_tied_weights_as_one_tensor(tmp_path):
    from graphkit.cli import main

    assert main(["inspect", "zoo:gpt_ends", "-o", str(tmp_path)]) == 0
    page = (tmp_path / "index.html").read_text()
    groups = page.split('<section id="groups">', 1)[1].split("</section>", 1)[0]
    assert "wte.weight</code> = <code>lm_head.weight" in groups or "wte.weight = lm_head.weight" in groups
