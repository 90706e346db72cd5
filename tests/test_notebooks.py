"""The notebooks: committed without outputs, and each runs top to bottom in a fresh kernel.

Every notebook is executed with nbclient in a copy under a temporary folder (so nothing is written next to
the committed files), in a kernel started from this test run's Python, so it sees the graphkit under test.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
EXPECTED = ["01_param_groups", "02_diagrams", "03_verify_split", "04_real_models"]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def kernel_for_this_python(folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Register a kernelspec named ``python3`` that runs ``sys.executable``, first on JUPYTER_PATH."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3 (graphkit tests)", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(folder))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return "python3"


def test_the_four_notebooks_are_there() -> None:
    assert [path.stem for path in notebook_paths()] == EXPECTED


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda path: path.stem)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], (
                f"cell {cell.id} of {path.name} has outputs: clear them before committing"
            )
            assert cell.execution_count is None
    assert "widgets" not in notebook.metadata, "widget state is an output: clear it before committing"


@pytest.mark.slow
@pytest.mark.parametrize("path", notebook_paths(), ids=lambda path: path.stem)
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_name = kernel_for_this_python(tmp_path / "jupyter", monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    copy = work / path.name
    shutil.copyfile(path, copy)
    notebook = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=120,  # per cell; a whole notebook takes well under a minute on a CPU
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(work)}},
    )
    client.execute()  # raises CellExecutionError, with the traceback, when a cell fails

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    stderr = "".join(
        output.text for output in outputs if output.output_type == "stream" and output.name == "stderr"
    )
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code_cells)

    mime_types = [kind for output in outputs for kind in output.get("data", {})]
    if path.stem in ("01_param_groups", "04_real_models"):
        assert WIDGET_VIEW in mime_types, "the explorer should be displayed as a widget"
    if path.stem == "02_diagrams":
        assert mime_types.count("image/svg+xml") >= 10
    if path.stem == "03_verify_split":
        text = "".join(output.get("text", "") for output in outputs)
        assert "W            : computes grad_x=False grad_weight=True" in text
        assert "accumulated over 2 microbatches: equal" in text
