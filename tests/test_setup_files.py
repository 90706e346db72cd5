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
    assert "torch>=2.13" in project["dependencies"]
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


def test_declared_torch_range_starts_at_the_oldest_torch_ci_tests(repo_root: Path) -> None:
    """pyproject's lower bound, setup.sh's default torch and TESTED_TORCH name the same oldest release."""
    from graphkit.pipelining import TESTED_TORCH

    data = tomllib.loads((repo_root / "pyproject.toml").read_text())
    (torch_requirement,) = [r for r in data["project"]["dependencies"] if r.startswith("torch")]
    assert torch_requirement == f"torch>={TESTED_TORCH[0]}"
    assert tuple(sorted(set(TESTED_TORCH), key=lambda v: tuple(map(int, v.split("."))))) == TESTED_TORCH
    assert all(re.fullmatch(r"\d+\.\d+", release) for release in TESTED_TORCH)
    setup = (repo_root / "scripts" / "setup.sh").read_text()
    assert f'torch_spec="${{GRAPHKIT_TORCH_SPEC:-torch=={TESTED_TORCH[0]}.0}}"' in setup


def test_declared_transformers_floor_is_the_one_hf_specs_require(repo_root: Path) -> None:
    """The ``models`` extra and the dev tools ask for the transformers major release ``hf:`` specs check for."""
    from graphkit.models import huggingface

    data = tomllib.loads((repo_root / "pyproject.toml").read_text())
    optional = data["project"]["optional-dependencies"]
    declared = {r for group in ("models", "dev") for r in optional[group] if r.startswith("transformers")}
    assert declared == {f"transformers>={huggingface._MINIMUM_TRANSFORMERS_MAJOR}"}


def test_the_installed_torch_is_one_ci_tests() -> None:
    """CI runs the suite on each release of TESTED_TORCH: a new release joins the list once it passes."""
    import torch

    from graphkit.pipelining import TESTED_TORCH

    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert release in TESTED_TORCH, (
        f"torch {torch.__version__} is not in TESTED_TORCH {TESTED_TORCH}: add it (and the README's and docs' "
        "mentions) once the suite passes on it"
    )


def test_gitignore_covers_the_second_environment(repo_root: Path) -> None:
    assert ".venv-*/" in (repo_root / ".gitignore").read_text().splitlines()


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
# torch's version is the content of $FAKE_STATE/torch; a requirement torch==X is met by X and X+local.
[[ "$1" == -W ]] && shift 2
if [[ "$1" == -c ]]; then
    case "$2" in
        *torchtitan*) [[ -f "$FAKE_STATE/torchtitan" ]] || exit 1 ;;
        *"import torch"*)
            [[ -f "$FAKE_STATE/torch" ]] || exit 1
            version="$(cat "$FAKE_STATE/torch")"
            echo "${version:-2.13.0+cpu}"
            wanted="${3:-}"
            if [[ -n "$version" && "$wanted" == torch==* && "$version" != "${wanted#torch==}" &&
                "${version%%+*}" != "${wanted#torch==}" ]]; then
                exit 3
            fi
            ;;
        *importlib.metadata*) [[ -f "$FAKE_STATE/graphkit" ]] || exit 1 ;;
    esac
    exit 0
fi
echo "venv-python $*${PIP_CONFIG_FILE:+ (PIP_CONFIG_FILE=$PIP_CONFIG_FILE)}" >> "$FAKE_LOG"
if [[ "$1 $2 $3" == "-m pip index" ]]; then
    [[ -n "${FAKE_NEWEST:-}" ]] || exit 1
    echo "torch ($FAKE_NEWEST)"
    echo "Available versions: $FAKE_NEWEST, 2.13.0"
    exit 0
fi
if [[ "$1" == -m && "$2" == pip && "$3" == install ]]; then
    case "$*" in
        *" -e "*) touch "$FAKE_STATE/graphkit" ;;
        *torchtitan==*) touch "$FAKE_STATE/torchtitan" ;;
        *torch==*) all="$*" && echo "${all##*torch==}" > "$FAKE_STATE/torch" ;;
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
        self, *arguments: str, torch_spec: str | None = "torch==9.9.9+cpu", **extra_environment: str
    ) -> subprocess.CompletedProcess[str]:
        self.log.write_text("")
        environment = {
            **extra_environment,
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
    assert "[setup] ready: .venv/bin/graphkit (torch 9.9.9+cpu)" in first.stdout

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


NO_CONFIG = " (PIP_CONFIG_FILE=/dev/null)"


def test_setup_newest_installs_the_index_newest_torch_in_its_own_environment_without_pip_config(
    tmp_path: Path, repo_root: Path
) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    first = sandbox.run("--dev", "--venv", ".venv-newest", torch_spec="newest", FAKE_NEWEST="9.10.0")
    assert first.returncode == 0, first.stderr
    assert sandbox.calls() == [
        "system-python -m venv .venv-newest",
        "venv-python -m pip index versions torch" + NO_CONFIG,
        "venv-python -m pip install -q torch==9.10.0" + NO_CONFIG,
        "venv-python -m pip install -q -e .[dev,models,notebook]" + NO_CONFIG,
    ]
    assert "[setup] ready: .venv-newest/bin/graphkit (torch 9.10.0)" in first.stdout
    assert (sandbox.project / ".venv-newest" / ".setup-stamp").is_file()
    assert not (sandbox.project / ".setup-stamp").exists() and not (sandbox.project / ".venv").exists()

    # Cached: only the index is asked while it names the installed torch.
    second = sandbox.run("--dev", "--venv", ".venv-newest", torch_spec="newest", FAKE_NEWEST="9.10.0")
    assert second.returncode == 0, second.stderr
    assert sandbox.calls() == ["venv-python -m pip index versions torch" + NO_CONFIG]
    assert "torch: 9.10.0 is installed" in second.stdout

    # A newer release replaces torch (graphkit's editable install stays).
    third = sandbox.run("--dev", "--venv", ".venv-newest", torch_spec="newest", FAKE_NEWEST="9.11.0")
    assert third.returncode == 0, third.stderr
    assert sandbox.calls() == [
        "venv-python -m pip index versions torch" + NO_CONFIG,
        "venv-python -m pip install -q torch==9.11.0" + NO_CONFIG,
    ]
    assert "9.10.0 is installed but torch==9.11.0 is asked for" in third.stdout
    assert "GiB free" not in first.stdout + third.stdout  # no df here: no warning, and no failure


def short_disk_sandbox(root: Path, repo_root: Path, available_kib: int) -> SetupSandbox:
    """A sandbox whose ``df`` says ``available_kib`` KiB are free."""
    sandbox = SetupSandbox(root, repo_root, with_dot=True)
    (sandbox.bin / "awk").symlink_to(shutil.which("awk"))
    sandbox._script(
        "df",
        '#!/usr/bin/env bash\n[[ "$1 $2" == "--output=avail -k" ]] || exit 1\n'
        f'echo "    Avail"\necho "{available_kib}"\n',
    )
    return sandbox


def test_setup_newest_warns_before_installing_where_the_disk_is_short(
    tmp_path: Path, repo_root: Path
) -> None:
    # a CI run once ended in pip's bare "No space left on device" while installing the newest torch
    available_kib = {"short": 7 * 1024 * 1024 + 600 * 1024, "roomy": 60 * 1024 * 1024}
    for case, kib in available_kib.items():
        sandbox = short_disk_sandbox(tmp_path / case, repo_root, kib)
        result = sandbox.run("--venv", f".venv-{case}", torch_spec="newest", FAKE_NEWEST="9.10.0")
        assert result.returncode == 0, result.stderr
        warning = (
            f"[setup] warning: 7.6 GiB free on the disk of .venv-{case}; torch==9.10.0 from the index (a CUDA "
            "build) takes about 10 GiB while it installs: free some, or give --venv a folder on a larger disk"
        )
        assert (warning in result.stdout) == (case == "short"), result.stdout
        assert result.stdout.index("pip install torch==9.10.0") > result.stdout.find("GiB free")
    # the pinned CPU build is a file on the machine's disk: no warning for it, however short the disk
    result = short_disk_sandbox(tmp_path / "pinned", repo_root, 1024).run()
    assert result.returncode == 0 and "pip install torch==9.9.9+cpu" in result.stdout
    assert "GiB free" not in result.stdout


def test_setup_torchtitan_installs_it_and_its_imports_without_resolving_torch_then_keeps_it(
    tmp_path: Path, repo_root: Path
) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    first = sandbox.run(
        "--dev", "--torchtitan", "--venv", ".venv-newest", torch_spec="newest", FAKE_NEWEST="9.10.0"
    )
    assert first.returncode == 0, first.stderr
    packages = (
        "torchtitan==0.3.0 einops tyro docstring_parser typeguard shtab safetensors spmd_types==0.2.3 torchdata "
        "torch_checkpointing tokenizers"
    )
    assert sandbox.calls()[-1] == f"venv-python -m pip install -q --no-deps {packages}" + NO_CONFIG
    assert sandbox.calls()[-2] == "venv-python -m pip install -q -e .[dev,models,notebook]" + NO_CONFIG
    again = sandbox.run(
        "--dev", "--torchtitan", "--venv", ".venv-newest", torch_spec="newest", FAKE_NEWEST="9.10.0"
    )
    assert again.returncode == 0, again.stderr
    assert sandbox.calls() == ["venv-python -m pip index versions torch" + NO_CONFIG]
    assert "torchtitan: 0.3.0 is installed" in again.stdout
    # without --torchtitan nothing of it is asked for
    plain = SetupSandbox(tmp_path / "plain", repo_root, with_dot=True)
    assert plain.run("--venv", "v").returncode == 0
    assert not [call for call in plain.calls() if "torchtitan" in call]


def test_setup_newest_keeps_the_installed_torch_when_the_index_does_not_answer(
    tmp_path: Path, repo_root: Path
) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    assert sandbox.run("--venv", "v", torch_spec="newest", FAKE_NEWEST="9.10.0").returncode == 0
    offline = sandbox.run("--venv", "v", torch_spec="newest")
    assert offline.returncode == 0, offline.stderr
    assert sandbox.calls() == ["venv-python -m pip index versions torch" + NO_CONFIG]
    assert "did not answer" in offline.stdout and "torch: 9.10.0 is installed" in offline.stdout


def test_setup_other_requirements_keep_the_pip_configuration(tmp_path: Path, repo_root: Path) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    assert sandbox.run("--venv", "pinned", torch_spec="torch==9.9.9").returncode == 0
    assert sandbox.calls() == [
        "system-python -m venv pinned",
        "venv-python -m pip install -q torch==9.9.9",
        "venv-python -m pip install -q -e .[cli,models]",
    ]
    assert all("PIP_CONFIG_FILE" not in call for call in sandbox.calls())


def test_setup_reinstalls_torch_only_when_an_asked_requirement_is_not_met(
    tmp_path: Path, repo_root: Path
) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    assert sandbox.run(torch_spec="torch==9.9.9").returncode == 0
    # Without GRAPHKIT_TORCH_SPEC any installed torch is kept, as the README's commands always did.
    kept = sandbox.run(torch_spec=None)
    assert kept.returncode == 0 and "torch: 9.9.9 is installed" in kept.stdout
    assert "venv-python -m pip install -q torch==2.13.0" not in sandbox.calls()
    assert sandbox.run(torch_spec="torch==9.9.9").returncode == 0
    assert not any("torch==" in call for call in sandbox.calls())
    assert sandbox.run(torch_spec="torch==9.9.8").returncode == 0
    assert "venv-python -m pip install -q torch==9.9.8" in sandbox.calls()


def test_setup_takes_the_environment_folder_from_an_option_or_graphkit_venv(
    tmp_path: Path, repo_root: Path
) -> None:
    sandbox = SetupSandbox(tmp_path, repo_root, with_dot=True)
    assert sandbox.run("--venv=first/").returncode == 0
    assert sandbox.calls()[0] == "system-python -m venv first"
    assert (sandbox.project / "first" / ".setup-stamp").is_file()
    result = sandbox.run(GRAPHKIT_VENV="second")
    assert result.returncode == 0 and sandbox.calls()[0] == "system-python -m venv second"
    assert "[setup] ready: second/bin/graphkit" in result.stdout
    missing = sandbox.run("--venv")
    assert missing.returncode == 2 and "--venv needs a folder" in missing.stderr


# --------------------------------------------------------------------------------------------------------
# scripts/test_newest_torch.sh and its place in .ci/run

FAKE_SETUP = """#!/usr/bin/env bash
echo "setup.sh $* GRAPHKIT_TORCH_SPEC=$GRAPHKIT_TORCH_SPEC" >> "$FAKE_LOG"
mkdir -p .venv-newest/bin
printf '#!/usr/bin/env bash\\necho "newest-python $*" >> "$FAKE_LOG"\\nexit ${FAKE_PYTEST_STATUS:-0}\\n' \\
    > .venv-newest/bin/python
chmod +x .venv-newest/bin/python
"""


def newest_torch_checkout(root: Path, repo_root: Path) -> Path:
    (root / "scripts").mkdir(parents=True)
    shutil.copy(repo_root / "scripts" / "test_newest_torch.sh", root / "scripts" / "test_newest_torch.sh")
    (root / "scripts" / "setup.sh").write_text(FAKE_SETUP)
    return root


@pytest.mark.parametrize(("pytest_status", "status"), [(0, 0), (1, 1), (5, 1)])
def test_newest_torch_script_sets_up_its_environment_then_runs_the_suite(
    tmp_path: Path, repo_root: Path, pytest_status: int, status: int
) -> None:
    checkout = newest_torch_checkout(tmp_path / "checkout", repo_root)
    log = tmp_path / "log.txt"
    environment = {**os.environ, "FAKE_LOG": str(log), "FAKE_PYTEST_STATUS": str(pytest_status)}
    result = subprocess.run(
        ["bash", "scripts/test_newest_torch.sh"],
        cwd=checkout,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert result.returncode == status, result.stderr
    assert log.read_text().splitlines() == [
        "setup.sh --dev --torchtitan --venv .venv-newest GRAPHKIT_TORCH_SPEC=newest",
        "newest-python -m pytest -q",
    ]
    subprocess.run(
        ["bash", "scripts/test_newest_torch.sh", "-x", "tests/test_zoo.py"],
        cwd=checkout,
        env=environment,
        capture_output=True,
    )
    assert log.read_text().splitlines()[-1] == "newest-python -m pytest -x tests/test_zoo.py"


def test_the_newest_torch_script_is_executable_and_described(repo_root: Path) -> None:
    script = repo_root / "scripts" / "test_newest_torch.sh"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert "GRAPHKIT_TORCH_SPEC=newest bash scripts/setup.sh --dev --torchtitan --venv" in text
    assert "bash scripts/test_newest_torch.sh" in (repo_root / "README.md").read_text()


@pytest.mark.parametrize(
    ("readme_status", "newest_status", "status"), [(0, 0, 0), (0, 3, 3), (4, 0, 4), (4, 3, 4)]
)
def test_ci_run_runs_the_suite_on_the_newest_torch_after_the_readme_command(
    tmp_path: Path, repo_root: Path, readme_status: int, newest_status: int, status: int
) -> None:
    readme = f"<!-- test-command -->\n```bash\necho readme-command; exit {readme_status}\n```\n"
    checkout = make_ci_checkout(tmp_path / "checkout", repo_root, readme)
    (checkout / "scripts").mkdir()
    (checkout / "scripts" / "test_newest_torch.sh").write_text(f"echo newest-suite\nexit {newest_status}\n")
    result = subprocess.run(["bash", ".ci/run"], cwd=checkout, capture_output=True, text=True)
    assert result.returncode == status
    assert result.stdout.index("readme-command") < result.stdout.index("newest-suite")
    skipped = subprocess.run(
        ["bash", ".ci/run"],
        cwd=checkout,
        env={**os.environ, "GRAPHKIT_CI_SKIP_NEWEST": "1"},
        capture_output=True,
        text=True,
    )
    assert skipped.returncode == readme_status and "newest-suite" not in skipped.stdout
