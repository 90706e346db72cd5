"""The package's layout: folders by layer, imports one way, no module shadowing an exported function, and
one home for schedules as data.

Layers, lowest first: ``graph`` and ``models`` (side by side, independent of each other), ``analysis``,
``split``, ``measure``, ``pipelining``, ``drawing``, ``apps`` and ``integrations``, the package's public API
(``graphkit/__init__.py``), then the command line on top: the ``graphkit/cli/`` package and its entry
point ``graphkit/__main__.py``, which nothing else imports. A module-level import never points from a lower layer to a higher one; inside a
function, only the display hooks (``_repr_*`` methods of graphs and groups) may reach for drawing. Below the
command line, graphkit modules import each other at module level only (a cycle is restructured, not hidden
in a function): the exceptions are those display hooks and the lazy ``__getattr__`` of
``graphkit/__init__.py``, which keeps ``import graphkit`` light.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import graphviz
import pytest
import torch

import graphkit

PACKAGE = Path(graphkit.__file__).parent
LAYERS = {
    "graph": 0,
    "models": 0,
    "analysis": 1,
    "split": 2,
    "measure": 3,
    "pipelining": 4,
    "drawing": 5,
    "apps": 6,
    "integrations": 6,  # adapters for training frameworks (torchtitan), beside the apps
    "graphkit": 7,  # the public API: graphkit/__init__.py
    "cli": 8,  # the command line, on top: nothing but python -m graphkit imports it
}
LAYER_OF_LOOSE_MODULES = {"__main__": "cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(name: str) -> tuple[str, int] | None:
    """``("split", 2)`` for ``graphkit.split.backward``; None for modules outside graphkit."""
    parts = name.split(".")
    if parts[0] != "graphkit":
        return None
    layer = "graphkit" if len(parts) == 1 else LAYER_OF_LOOSE_MODULES.get(parts[1], parts[1])
    return layer, LAYERS[layer]


def imported_names(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # a relative import: resolve it against the importing module's package
        package = module.split(".")
        if not (PACKAGE / Path(*package[1:]) / "__init__.py").exists() or len(package) == 1:
            package = package[:-1]
        base = ".".join(package[: len(package) - node.level + 1])
        return [f"{base}.{node.module}" if node.module else base]
    names = [node.module or ""]
    # ``from graphkit import zoo`` imports a module, not a name: check the module it names
    names += [f"{node.module}.{alias.name}" for alias in node.names if node.module == "graphkit"]
    return names


def imports(path: Path) -> list[tuple[str, int, str | None]]:
    """Every ``graphkit`` import of a file: (imported module, line, enclosing function or None)."""
    module = module_name(path)
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    stack: list[tuple[ast.AST, str | None]] = [(tree, None)]
    while stack:
        node, function = stack.pop()
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in imported_names(child, module):
                    if (
                        name.split(".")[0] == "graphkit"
                        and name != "graphkit"
                        or name.startswith("graphkit.")
                    ):
                        found.append((name, child.lineno, function))
            stack.append((child, inner))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_lives_in_a_layer_folder():
    # besides the package's entry points, no module outside the layer folders
    loose = {path.name for path in PACKAGE.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert loose == set(), f"modules outside the layer folders: {sorted(loose)}"
    for folder in set(LAYERS) - {"graphkit"}:
        assert (PACKAGE / folder / "__init__.py").is_file(), folder
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders == set(LAYERS) - {"graphkit"}, f"folders without a layer: {sorted(folders - set(LAYERS))}"


def wrong_imports(path: Path) -> list[str]:
    """The imports of ``path`` that point to a higher layer, or sideways between graph and models."""
    importer = module_name(path)
    importer_layer, importer_rank = layer_of(importer)
    wrong = []
    for imported, line, function in imports(path):
        imported_layer, imported_rank = layer_of(imported)
        if imported_layer == importer_layer:
            continue
        upward = imported_rank > importer_rank
        sideways = imported_rank == importer_rank  # graph and models stay independent of each other
        display_hook = function is not None and function.startswith("_repr_") and imported_layer == "drawing"
        if (upward or sideways) and not display_hook:
            where = f"inside {function}()" if function else "at module level"
            wrong.append(
                f"line {line}: {importer} ({importer_layer}) imports {imported} ({imported_layer}) {where}"
            )
    return sorted(wrong)


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_imports_point_from_higher_layers_to_lower_ones(path: Path):
    assert wrong_imports(path) == []


def test_the_checker_reports_upward_imports_but_not_display_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fake_package = tmp_path / "graphkit"
    (fake_package / "graph").mkdir(parents=True)
    (fake_package / "__init__.py").write_text("")
    (fake_package / "graph" / "__init__.py").write_text("")
    module = fake_package / "graph" / "bad.py"
    module.write_text(
        "import torch\n"
        "from graphkit.drawing.diagram import draw\n"
        "from graphkit.graph import tensors\n"
        "class G:\n"
        "    def _repr_svg_(self):\n"
        "        from graphkit.drawing import draw\n"
        "    def export(self):\n"
        "        from graphkit.split import backward\n"
        "        from graphkit.models import zoo\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake_package)
    assert wrong_imports(module) == [
        "line 2: graphkit.graph.bad (graph) imports graphkit.drawing.diagram (drawing) at module level",
        "line 8: graphkit.graph.bad (graph) imports graphkit.split (split) inside export()",
        "line 9: graphkit.graph.bad (graph) imports graphkit.models (models) inside export()",
    ]


def in_function_imports(path: Path) -> list[str]:
    """The graphkit imports of ``path`` made inside a function, but for display hooks reaching for drawing.

    The command line (``cli/``, ``__main__.py``) and the package root (its lazy ``__getattr__``) may import
    inside functions: they are what keeps ``import graphkit`` and ``python -m graphkit --help`` light.
    """
    importer = module_name(path)
    importer_layer, _ = layer_of(importer)
    if importer_layer in ("cli", "graphkit"):
        return []
    found = []
    for imported, line, function in imports(path):
        if function is None:
            continue
        if function.startswith("_repr_") and layer_of(imported)[0] == "drawing":
            continue
        found.append(f"line {line}: {importer} imports {imported} inside {function}()")
    return sorted(found)


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_graphkit_modules_import_each_other_at_module_level(path: Path):
    assert in_function_imports(path) == []


def test_the_checker_reports_imports_inside_functions_but_not_display_hooks_or_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fake_package = tmp_path / "graphkit"
    for folder in ("measure", "cli"):
        (fake_package / folder).mkdir(parents=True)
        (fake_package / folder / "__init__.py").write_text("")
    (fake_package / "__init__.py").write_text(
        "def __getattr__(name):\n    from graphkit.measure.verification import verify_split\n"
    )
    module = fake_package / "measure" / "bad.py"
    module.write_text(
        "import torch\n"
        "from graphkit.graph import tensors\n"
        "def export():\n"
        "    import transformers\n"
        "    from graphkit.models import specs\n"
        "class Report:\n"
        "    def _repr_html_(self):\n"
        "        from graphkit.drawing import diagram\n"
        "    def _repr_svg_(self):\n"
        "        from graphkit.split import backward\n"
    )
    (fake_package / "cli" / "commands.py").write_text("def run():\n    from graphkit.measure import bad\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake_package)
    assert in_function_imports(module) == [
        "line 10: graphkit.measure.bad imports graphkit.split inside _repr_svg_()",
        "line 5: graphkit.measure.bad imports graphkit.models inside export()",
    ]
    assert in_function_imports(fake_package / "cli" / "commands.py") == []
    assert in_function_imports(fake_package / "__init__.py") == []


def test_the_command_line_is_the_top_layer_that_only_python_dash_m_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fake_package = tmp_path / "graphkit"
    (fake_package / "cli").mkdir(parents=True)
    (fake_package / "cli" / "__init__.py").write_text(
        "from graphkit.cli import graph_commands\nfrom graphkit.drawing import draw\nimport graphkit\n"
    )
    (fake_package / "cli" / "graph_commands.py").write_text("from graphkit.models import zoo\n")
    (fake_package / "__main__.py").write_text("from graphkit.cli import main\n")
    (fake_package / "__init__.py").write_text(
        "from graphkit.split import backward\nfrom graphkit.cli import main\n"
    )
    (fake_package / "pipelining.py").write_text("from graphkit.pipelining import stage\n")
    (fake_package / "drawing").mkdir()
    (fake_package / "drawing" / "__init__.py").write_text("def f():\n    from graphkit.cli import options\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake_package)
    wrong = {
        path.relative_to(fake_package).as_posix(): wrong_imports(path) for path in fake_package.rglob("*.py")
    }
    assert wrong == {
        "__init__.py": ["line 2: graphkit (graphkit) imports graphkit.cli (cli) at module level"],
        "__main__.py": [],
        "pipelining.py": [],
        "cli/__init__.py": [],
        "cli/graph_commands.py": [],
        "drawing/__init__.py": ["line 2: graphkit.drawing (drawing) imports graphkit.cli (cli) inside f()"],
    }


def all_modules() -> list[str]:
    return [
        info.name
        for info in pkgutil.walk_packages([str(PACKAGE)], prefix="graphkit.")
        if info.name != "graphkit.__main__"
    ]


def test_no_module_is_named_like_a_name_the_package_exports():
    modules = set(all_modules())
    for package in [
        "graphkit",
        *(name for name in modules if hasattr(importlib.import_module(name), "__path__")),
    ]:
        exported = getattr(importlib.import_module(package), "__all__", [])
        clashes = [name for name in exported if f"{package}.{name}" in modules]
        assert clashes == [], f"{package} exports names that are also its submodules: {clashes}"


def small_graph() -> graphkit.AutogradGraph:
    layer = torch.nn.Linear(3, 2)
    hidden = torch.randn(4, 3, requires_grad=True)
    return graphkit.capture(layer(hidden), inputs=[hidden], module=layer)


def test_draw_works_every_time_whatever_was_imported_before():
    graph = small_graph()
    first = graphkit.draw(graph)
    for name in all_modules():
        importlib.import_module(name)
    for _ in range(2):
        assert callable(graphkit.draw)
        again = graphkit.draw(graph)
        assert isinstance(again, graphviz.Digraph) and again.source == first.source
    assert callable(graphkit.trace) and callable(graphkit.capture) and callable(graphkit.param_groups)
    assert callable(graphkit.verify_split)


def run_python(script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter that imports this checkout's graphkit; it must succeed."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_draw_works_after_importing_the_explorer_in_a_fresh_process():
    script = (
        "import torch, graphkit\n"
        "import graphkit.apps.explorer, graphkit.drawing.diagram, graphkit.apps.report\n"
        "from graphkit.drawing import diagram\n"
        "layer = torch.nn.Linear(3, 2)\n"
        "x = torch.randn(4, 3, requires_grad=True)\n"
        "graph = graphkit.capture(layer(x), inputs=[x], module=layer)\n"
        "for _ in range(2):\n"
        "    assert 'cluster_group_0' in graphkit.draw(graph).source\n"
        "print('drawn twice')\n"
    )
    result = run_python(script)
    assert result.stdout.strip() == "drawn twice"


def test_import_graphkit_stays_light():
    # the public API loads the lower layers only; drawing, verification and models load on first use
    script = (
        "import sys, graphkit\n"
        "heavy = [name for name in sys.modules if name.startswith(('graphkit.drawing', 'graphkit.measure.verification',"
        " 'graphkit.models', 'transformers', 'ipywidgets', 'jinja2'))]\n"
        "print(heavy)\n"
    )
    result = run_python(script)
    assert result.stdout.strip() == "[]"


SCHEDULE_DATA = PACKAGE / "pipelining" / "planning"


def schedule_data_outside_planning(path: Path) -> list[str]:
    """What ``path`` does that only ``pipelining/planning/`` may: define an action record (a class with
    ``kind``, ``microbatch`` and ``stage`` or ``stage_index`` fields) or read and write CSV files (the
    ``csv`` module: schedule CSVs have one reader and one writer)."""
    if SCHEDULE_DATA in path.parents:
        return []
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ClassDef):
            fields = {
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
            if {"kind", "microbatch"} <= fields and fields & {"stage", "stage_index"}:
                found.append(f"line {node.lineno}: class {node.name} is an action record")
        elif isinstance(node, ast.Import) and any(alias.name == "csv" for alias in node.names):
            found.append(f"line {node.lineno}: imports csv")
        elif isinstance(node, ast.ImportFrom) and node.module == "csv":
            found.append(f"line {node.lineno}: imports from csv")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_only_planning_defines_action_records_or_reads_schedule_csv(path: Path):
    assert schedule_data_outside_planning(path) == []


def test_the_schedule_data_checker_reports_records_and_csv_outside_planning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fake_package = tmp_path / "graphkit"
    (fake_package / "pipelining" / "planning").mkdir(parents=True)
    source = (
        "import csv\n"
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class Step:\n"
        "    stage_index: int\n"
        "    kind: str\n"
        "    microbatch: int\n"
        "class Other:\n"
        "    kind: str\n"
    )
    outside = fake_package / "pipelining" / "recorder.py"
    inside = fake_package / "pipelining" / "planning" / "actions.py"
    outside.write_text(source)
    inside.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "SCHEDULE_DATA", fake_package / "pipelining" / "planning")
    assert schedule_data_outside_planning(outside) == [
        "line 1: imports csv",
        "line 4: class Step is an action record",
    ]
    assert schedule_data_outside_planning(inside) == []
