"""The project files a newcomer and CI rely on: README set-up commands, .ci/run, pyproject, setup.sh."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

MARKER = re.compile(r"^<!-- (?P<kind>[a-z-]+)-command -->\s*$")


def readme_commands(text: str) -> dict[str, list[str]]:
    """For each ``<!-- KIND-command -->`` marker, the lines of the fenced block that follows it."""
    lines = text.splitlines()
    commands: dict[str, list[str]] = {}
    for index, line in enumerate(lines):
        match = MARKER.match(line)
        if not match:
            continue
        assert lines[index + 1].startswith("```"), f"a fenced block must follow {line!r} directly"
        end = next(i for i in range(index + 2, len(lines)) if lines[i].startswith("```"))
        assert match["kind"] not in commands, f"{line!r} appears twice"
        commands[match["kind"]] = lines[index + 2 : end]
    return commands


# --------------------------------------------------------------------------------------------------------
# README and .ci/run


def test_readme_has_exactly_two_single_line_setup_commands(repo_root: Path) -> None:
    commands = readme_commands((repo_root / "README.md").read_text())
    assert set(commands) == {"main", "test"}
    main, test = commands["main"], commands["test"]
    assert len(main) == 1 and len(test) == 1
    assert main[0].startswith("bash scripts/setup.sh && .venv/bin/graphkit ")
    assert test[0] == "bash scripts/setup.sh --dev && .venv/bin/python -m pytest -q"


def test_readme_main_command_comes_first_and_names_a_zoo_model(repo_root: Path) -> None:
    text = (repo_root / "README.md").read_text()
    assert text.index("<!-- main-command -->") < text.index("<!-- test-command -->")
    main = readme_commands(text)["main"][0]
    spec = main.split()[-1]
    if spec.startswith("zoo:"):
        from graphkit.models import zoo

        assert spec.removeprefix("zoo:") in zoo.MODELS


def test_ci_run_extracts_the_readme_test_command(repo_root: Path) -> None:
    result = subprocess.run(
        ["bash", ".ci/run", "--print-command"], cwd=repo_root, capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == readme_commands((repo_root / "README.md").read_text())["test"]


def make_ci_checkout(root: Path, repo_root: Path, readme: str) -> Path:
    (root / ".ci").mkdir(parents=True)
    shutil.copy(repo_root / ".ci" / "run", root / ".ci" / "run")
    (root / "README.md").write_text(readme)
    return root


@pytest.mark.parametrize(("command", "status"), [("true", 0), ("false", 1), ("exit 5", 5), ("exit 3", 3)])
def test_ci_run_passes_the_test_command_status_through(
    tmp_path: Path, repo_root: Path, command: str, status: int
) -> None:
    readme = (
        "# x\n\n<!-- main-command -->\n```bash\ntrue\n```\n\n"
        f"<!-- test-command -->\n```bash\n{command}\n```\n"
    )
    checkout = make_ci_checkout(tmp_path, repo_root, readme)
    result = subprocess.run(["bash", ".ci/run"], cwd=checkout, capture_output=True, text=True)
    assert result.returncode == status
    assert f"[ci] {command}" in result.stdout
    if status == 5:
        assert "collected no tests" in result.stderr


def test_ci_run_runs_from_any_folder(tmp_path: Path, repo_root: Path) -> None:
    readme = "<!-- test-command -->\n```bash\ntest -f README.md && echo ran-in-root\n```\n"
    checkout = make_ci_checkout(tmp_path / "checkout", repo_root, readme)
    result = subprocess.run(
        ["bash", str(checkout / ".ci" / "run")], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0 and "ran-in-root" in result.stdout


@pytest.mark.parametrize(
    "readme",
    [
        "no marker at all\n",
        "<!-- test-command -->\n```bash\n```\n",
        "<!-- test-command -->\n```bash\nfirst\nsecond\n```\n",
        "<!-- test-command -->\n```bash\nnever closed\n",
    ],
)
def test_ci_run_fails_when_the_readme_has_no_single_test_command(
    tmp_path: Path, repo_root: Path, readme: str
) -> None:
    checkout = make_ci_checkout(tmp_path, repo_root, readme)
    result = subprocess.run(["bash", ".ci/run"], cwd=checkout, capture_output=True, text=True)
    assert result.returncode != 0
    assert "expected one command line" in result.stderr


# --------------------------------------------------------------------------------------------------------
# pyproject.toml


def test_pyproject_declares_package_dependencies_extras_and_tools(repo_root: Path) -> None:
    data = tomllib.loads((repo_root / "pyproject.toml").read_text())
    project = data["project"]
    assert project["name"] == "graphkit"
    assert project["requires-python"] == ">=3.11"
    names = {re.split(r"[<>=!~\[ ]", requirement)[0] for requirement in project["dependencies"]}
    # jinja2 renders the report's and the explorer's templates
    assert names == {"torch", "networkx", "graphviz", "jinja2"}
    assert "drawing/templates/*" in data["tool"]["setuptools"]["package-data"]["graphkit"]
    assert "torch>=2.4" in project["dependencies"]
    assert project["scripts"] == {"graphkit": "graphkit.cli:main"}

    extras = project["optional-dependencies"]
    assert {"notebook", "models", "docs", "dev"} <= set(extras)

    def extra_names(extra: str) -> set[str]:
        return {re.split(r"[<>=!~\[ ]", requirement)[0] for requirement in extras[extra]}

    assert {"jupyterlab", "ipywidgets", "nbclient", "nbformat", "ipykernel"} <= extra_names("notebook")
    assert "transformers" in extra_names("models")
    assert {"pytest", "pytest-timeout", "hypothesis", "ruff", "torchviz"} <= extra_names("dev")

    assert data["tool"]["ruff"]["line-length"] == 110
    assert data["tool"]["ruff"]["target-version"] == "py311"
    assert set(data["tool"]["ruff"]["lint"]["select"]) >= {"E", "F", "I", "UP", "B", "SIM"}
    pytest_options = data["tool"]["pytest"]["ini_options"]
    assert pytest_options["testpaths"] == ["tests"]
    assert {marker.split(":")[0] for marker in pytest_options["markers"]} == {"slow", "browser", "matrix"}
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["graphkit"]
    assert (repo_root / "graphkit" / "py.typed").is_file()


def test_python_dash_m_graphkit_runs_the_cli(repo_root: Path) -> None:
    main_source = (repo_root / "graphkit" / "__main__.py").read_text()
    assert "from graphkit.cli import main" in main_source and "raise SystemExit(main())" in main_source
    if not (repo_root / "graphkit" / "cli" / "__init__.py").exists():
        pytest.skip("graphkit/cli/ is not written yet")
    result = subprocess.run(
        [sys.executable, "-m", "graphkit", "--help"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "capture" in result.stdout


# --------------------------------------------------------------------------------------------------------
# scripts/setup.sh, run against stand-ins for python, pip, dot and apt-get

FAKE_SYSTEM_PYTHON = """#!/usr/bin/env bash
if [[ "$1" == -c ]]; then
    [[ "$2" == *ensurepip* && -f "$FAKE_STATE/no-ensurepip" ]] && exit 1
    exit 0
fi
echo "system-python $*" >> "$FAKE_LOG"
if [[ "$1" == -m && "$2" == venv ]]; then
    mkdir -p "$3/bin"
    cp "$FAKE_VENV_PYTHON" "$3/bin/python"
fi
exit 0
"""

FAKE_VENV_PYTHON = """#!/usr/bin/env bash
[[ "$1" == -W ]] && shift 2
if [[ "$1" == -c ]]; then
    case "$2" in
        *"import torch"*) [[ -f "$FAKE_STATE/torch" ]] || exit 1; echo "2.13.0+cpu" ;;
        *importlib.metadata*) [[ -f "$FAKE_STATE/graphkit" ]] || exit 1 ;;
    esac
    exit 0
fi
echo "venv-python $*" >> "$FAKE_LOG"
if [[ "$1" == -m && "$2" == pip && "$3" == install ]]; then
    case "$*" in
        *" -e "*) touch "$FAKE_STATE/graphkit" ;;
        *torch*) touch "$FAKE_STATE/torch" ;;
    esac
fi
exit 0
"""

FAKE_APT_GET = """#!/usr/bin/env bash
echo "apt-get $*" >> "$FAKE_LOG"
exit 0
"""

TOOLS = ("bash", "env", "dirname", "cat", "sha256sum", "cut", "rm", "sed", "mkdir", "cp", "touch")


class SetupSandbox:
    """A copy of the project files setup.sh reads, with a PATH of real basic tools and stand-ins."""

    def __init__(self, root: Path, repo_root: Path, *, with_dot: bool) -> None:
        self.project = root / "project"
        (self.project / "scripts").mkdir(parents=True)
        shutil.copy(repo_root / "scripts" / "setup.sh", self.project / "scripts" / "setup.sh")
        shutil.copy(repo_root / "scripts" / "apt_install.sh", self.project / "scripts" / "apt_install.sh")
        shutil.copy(repo_root / "pyproject.toml", self.project / "pyproject.toml")
        self.state = root / "state"
        self.state.mkdir()
        self.log = root / "log.txt"
        self.log.touch()
        self.bin = root / "bin"
        self.bin.mkdir()
        for tool in TOOLS:
            found = shutil.which(tool)
            assert found, tool
            (self.bin / tool).symlink_to(found)
        self._script("apt-get", FAKE_APT_GET)
        if with_dot:
            self._script("dot", "#!/usr/bin/env bash\nexit 0\n")
        self.system_python = self._script("fake-python3", FAKE_SYSTEM_PYTHON)
        self.venv_python = self._script("fake-venv-python", FAKE_VENV_PYTHON)

    def _script(self, name: str, text: str) -> Path:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)
        return path

    def run(
        self, *arguments: str, torch_spec: str | None = "torch==9.9.9+cpu"
    ) -> subprocess.CompletedProcess[str]:
        self.log.write_text("")
        environment = {
            "PATH": str(self.bin),
            "HOME": str(self.project),
            "GRAPHKIT_PYTHON": str(self.system_python),
            "FAKE_VENV_PYTHON": str(self.venv_python),
            "FAKE_LOG": str(self.log),
            "FAKE_STATE": str(self.state),
        }
        if torch_spec is not None:
            environment["GRAPHKIT_TORCH_SPEC"] = torch_spec
        return subprocess.run(
            ["bash", "scripts/setup.sh", *arguments],
            cwd=self.project,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


def test_setup_builds_everything_from_nothing_then_does_nothing(tmp_path: Path, repo_root: Path) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    first = sandbox.run()
    assert first.returncode == 0, first.stderr
    assert sandbox.calls() == [
        "system-python -m venv .venv",
        "venv-python -m pip install -q torch==9.9.9+cpu",
        "venv-python -m pip install -q -e .[cli,models]",
    ]
    assert (sandbox.project / ".setup-stamp").is_file()
    assert "[setup] ready: .venv/bin/graphkit (torch 2.13.0+cpu)" in first.stdout

    second = sandbox.run()
    assert second.returncode == 0, second.stderr
    assert sandbox.calls() == []
    assert "up to date (.setup-stamp matches)" in second.stdout


def test_setup_default_torch_requirement_is_the_cpu_build(tmp_path: Path, repo_root: Path) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    assert sandbox.run(torch_spec=None).returncode == 0
    assert "venv-python -m pip install -q torch==2.13.0" in sandbox.calls()


def test_setup_dev_installs_the_dev_extras_and_reinstalls_when_pyproject_changes(
    tmp_path: Path, repo_root: Path
) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    assert sandbox.run().returncode == 0
    assert sandbox.run("--dev").returncode == 0
    assert sandbox.calls() == ["venv-python -m pip install -q -e .[dev,models,notebook]"]
    assert sandbox.run("--dev").returncode == 0
    assert sandbox.calls() == []

    pyproject = sandbox.project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# changed\n")
    assert sandbox.run("--dev").returncode == 0
    assert sandbox.calls() == ["venv-python -m pip install -q -e .[dev,models,notebook]"]


def test_setup_installs_graphviz_only_when_dot_is_missing(tmp_path: Path, repo_root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("setup.sh uses sudo for apt-get when not root")
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=False)
    result = sandbox.run()
    assert result.returncode == 0, result.stderr
    calls = sandbox.calls()
    assert calls[:2] == ["apt-get update -q", "apt-get install -y -q graphviz"]
    assert "system-python -m venv .venv" in calls


def test_setup_installs_python3_venv_when_the_interpreter_cannot_make_environments(
    tmp_path: Path, repo_root: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("setup.sh uses sudo for apt-get when not root")
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    (sandbox.state / "no-ensurepip").touch()
    assert sandbox.run().returncode == 0
    assert sandbox.calls()[:3] == [
        "apt-get update -q",
        "apt-get install -y -q python3-venv",
        "system-python -m venv .venv",
    ]


def test_setup_rejects_unknown_arguments(tmp_path: Path, repo_root: Path) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    result = sandbox.run("--everything")
    assert result.returncode == 2
    assert "unknown argument '--everything'" in result.stderr
    assert sandbox.calls() == []


def test_setup_help_describes_both_modes(tmp_path: Path, repo_root: Path) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    result = sandbox.run("--help")
    assert result.returncode == 0
    assert "bash scripts/setup.sh --dev" in result.stdout and "GRAPHKIT_TORCH_SPEC" in result.stdout
    assert sandbox.calls() == []
