"""The documentation site builds with warnings as errors, and its pages hold what they promise.

The build runs Sphinx in a subprocess into a temporary folder, executing the notebooks (myst-nb) in a
kernel of this test run's Python.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("sphinx", reason="the docs extra (sphinx, myst-nb, pydata-sphinx-theme) is not installed")
pytest.importorskip("myst_nb")
pytest.importorskip("pydata_sphinx_theme")


@pytest.fixture(scope="module")
def built_docs(tmp_path_factory: pytest.TempPathFactory, repo_root: Path) -> Path:
    folder = tmp_path_factory.mktemp("docs")
    spec = folder / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )
    environment = dict(os.environ, JUPYTER_PATH=str(folder / "jupyter"), PYDEVD_DISABLE_FILE_VALIDATION="1")
    output = folder / "html"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(folder / "doctrees"),
            "docs",
            str(output),
        ],
        cwd=repo_root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    warnings = "\n".join(line for line in result.stderr.splitlines() if "IPKernelApp" not in line)
    assert result.returncode == 0, f"sphinx -W failed (exit {result.returncode}):\n{warnings}"
    return output


@pytest.mark.slow
def test_docs_build_every_page(built_docs: Path) -> None:
    pages = ["index", "getting_started", "concepts", "notebooks", "cli", "api"]
    pages += [
        f"notebooks/{name}"
        for name in ("01_param_groups", "02_diagrams", "03_verify_split", "04_real_models")
    ]
    for page in pages:
        assert (built_docs / f"{page}.html").is_file(), page


@pytest.mark.slow
def test_cli_reference_lists_every_subcommand(built_docs: Path) -> None:
    from graphkit.cli import build_parser

    text = (built_docs / "cli.html").read_text()
    parser = build_parser()
    (subcommands,) = [
        action for action in parser._actions if action.__class__.__name__ == "_SubParsersAction"
    ]
    assert subcommands.choices
    for name, subparser in subcommands.choices.items():
        assert f"graphkit {name}" in text
        for action in subparser._actions:
            if action.help == argparse.SUPPRESS:  # an old spelling kept working (--deadline), not listed
                continue
            for option in action.option_strings:
                assert option in text, f"{option} of graphkit {name}"


@pytest.mark.slow
def test_api_reference_documents_the_public_functions(built_docs: Path) -> None:
    text = (built_docs / "api.html").read_text()
    for anchor in [
        "graphkit.graph.autograd_graph.capture",
        "graphkit.graph.tracing.trace",
        "graphkit.analysis.parameter_groups.param_groups",
        "graphkit.split.backward.backward_input",
        "graphkit.split.backward.backward_weight",
        "graphkit.split.backward.backward_full",
        "graphkit.split.stage_compute.StageCompute",
        "graphkit.measure.verification.verify_split",
        "graphkit.drawing.diagram.draw",
        "graphkit.apps.explorer.explore",
        "graphkit.models.specs.load_spec",
    ]:
        assert f'id="{anchor}"' in text, anchor


@pytest.mark.slow
def test_concepts_page_shows_the_diagrams_and_the_schedule(built_docs: Path) -> None:
    text = (built_docs / "concepts.html").read_text()
    for picture in ("mlp_autograd.svg", "mlp_groups.svg", "mlp_group1.svg"):
        assert picture in text
        assert (built_docs / "_images" / picture).is_file()
    assert "graphviz" in text  # the B/W schedule, drawn by sphinx.ext.graphviz


@pytest.mark.slow
def test_notebook_pages_carry_their_executed_outputs(built_docs: Path) -> None:
    verify = (built_docs / "notebooks" / "03_verify_split.html").read_text()
    assert "accumulated over 2 microbatches: equal" in verify
    assert "computes grad_x=False grad_weight=True" in verify
    groups = (built_docs / "notebooks" / "01_param_groups.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in groups  # the explorer, as saved widget state
    assert "blocks.0.attn.proj.weight" in groups


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize(
    "page",
    [
        "index.md",
        "getting_started.md",
        "cli.md",
        "pipeline_specs.md",
        "pipeline_costs.md",
        "compiled_blocks.md",
    ],
)
def test_python_examples_on_the_page_run(
    page: str, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = PYTHON_BLOCK.findall((repo_root / "docs" / page).read_text())
    assert blocks
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    namespace: dict[str, object] = {"__name__": f"docs_{page}"}
    threads = torch.get_num_threads()  # pipeline_costs.md sets one thread, as graphkit costs does
    try:
        for block in blocks:  # one namespace per page: later examples use what earlier ones made
            exec(compile(block, f"docs/{page}", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    if page == "cli.md":
        module, inputs = namespace["make_stage"]()
        assert isinstance(module, torch.nn.Module) and inputs[0].requires_grad
    if page == "pipeline_costs.md":  # four stages, and one recorded ZBV step of two on this process's rank
        assert len(namespace["config"]["cost_f"]) == 4 and namespace["timeline"].bubble_fraction < 1
        stages, _, (features,), _ = namespace["pipeline"](num_stages=2, batch_size=8)
        assert len(stages) == 2 and features.shape == (8, 64)


def test_the_tracing_frontends_complete_example_runs_and_matches_a_full_backward(
    repo_root: Path, tmp_path: Path
) -> None:
    # it makes a process group of its own: a fresh interpreter, not this test process
    (block,) = [
        block
        for block in PYTHON_BLOCK.findall((repo_root / "docs" / "pipelining.md").read_text())
        if "build_stage(" in block and "init_process_group" in block
    ]
    script = tmp_path / "traced_example.py"
    script.write_text(block)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == (
        "[BackwardCalls(input=0, weight=0, full=4), BackwardCalls(input=4, weight=4, full=0)]"
    )


def test_choosing_a_schedules_examples_run_and_train_with_the_plans_csv(
    repo_root: Path, tmp_path: Path
) -> None:
    # the first block is "your own model" (a file the plan's command reads); the others make a process
    # group of their own: every one, in order, in a fresh interpreter
    model, *blocks = PYTHON_BLOCK.findall((repo_root / "docs" / "choosing_a_schedule.md").read_text())
    assert model.startswith("# mymodel.py") and len(blocks) == 2
    script = tmp_path / "choosing_a_schedule.py"
    script.write_text("\n".join(blocks))
    environment = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(repo_root), os.environ.get("PYTHONPATH", "")])
    )
    # the model file as the page gives it plans (without --run: the costs, the table, the header)
    (tmp_path / "mymodel.py").write_text(model)
    run = functools.partial(
        subprocess.run, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=environment
    )
    planned = run(
        [sys.executable, "-m", "graphkit", "plan", "mymodel.py:make", "--ranks", "2", "--microbatches", "8"]
        + ["--batch-size", "32"]
    )
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert planned.stdout.startswith(
        "mymodel.py:make: 2 ranks, 8 microbatches of 4 rows (batch 32, --batch-size)"
    )
    result = run([sys.executable, str(script)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "best predicted:" in result.stdout and "1F1B" in result.stdout
    assert result.stdout.strip().endswith("True")
    assert (tmp_path / "plan" / "best.csv").is_file()
