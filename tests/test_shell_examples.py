"""The shell examples users copy: specs with ``?`` or ``&`` are quoted, and output folders are git-ignored.

An unquoted ``hf:gpt2?n_layer=4`` fails in zsh ("no matches found": ``?`` is a file-name pattern) and an
unquoted ``&`` ends the command in every shell. The examples are the shell code blocks and inline commands of
README.md, docs/*.md and the notebooks' markdown, the usage lines of examples/*.py, and what the ``graphkit``
command itself prints (its help and ``graphkit list``).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

from graphkit.cli import build_parser, main

SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console|zsh)\n(.*?)^```", re.MULTILINE | re.DOTALL)
COMMAND_WORDS = (
    "graphkit ",
    ".venv/bin/graphkit ",
    "python ",
    ".venv/bin/python ",
    "torchrun ",
    ".venv/bin/torchrun ",
)
INLINE_COMMAND = re.compile("`((?:" + "|".join(map(re.escape, COMMAND_WORDS)) + ")[^`]*)`")
SPEC_LIKE = re.compile(r"[A-Za-z][\w.-]*:")  # hf:..., zoo-pipeline:..., file.py:function


def unquoted_specs(line: str) -> list[str]:
    """The words of one shell line that look like a spec and hold ``?`` or ``&`` outside quotes."""
    found = []
    word = bare = ""  # the word as written, and its characters outside quotes
    quote = None
    for char in line + " ":
        if quote is not None:
            word += char
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
            word += char
        elif char.isspace():
            if SPEC_LIKE.match(word) and ("?" in bare or "&" in bare):
                found.append(word)
            word = bare = ""
        elif char == "#" and not word:  # a comment
            break
        else:
            word += char
            bare += char
    return found


def shell_lines(text: str) -> list[str]:
    """The command lines of a markdown text: its shell code blocks (continuations joined) and inline commands."""
    lines = []
    for block in SHELL_BLOCK.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    return lines + INLINE_COMMAND.findall(text)


def example_usage_lines(path: Path) -> list[str]:
    """The command lines in an example script's module docstring."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return [line.strip() for line in docstring.splitlines() if line.strip().startswith(COMMAND_WORDS)]


def documented_commands(repo_root: Path) -> dict[str, list[str]]:
    """Every shell example of README.md, docs/*.md, the notebooks' markdown and examples/*.py, by file."""
    commands = {}
    for path in [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]:
        commands[path.relative_to(repo_root).as_posix()] = shell_lines(path.read_text())
    for path in sorted((repo_root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        markdown = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")
        commands[path.relative_to(repo_root).as_posix()] = shell_lines(markdown)
    for path in sorted((repo_root / "examples").glob("*.py")):
        commands[path.relative_to(repo_root).as_posix()] = example_usage_lines(path)
    return commands


def test_the_checker_finds_unquoted_specs_only():
    assert unquoted_specs("graphkit groups hf:llama?stage=middle") == ["hf:llama?stage=middle"]
    assert unquoted_specs("graphkit costs hf:gpt2?n_layer=4&seq=16 --pipeline") == [
        "hf:gpt2?n_layer=4&seq=16"
    ]
    assert unquoted_specs("graphkit inspect 'hf:llama?stage=middle&n_layer=4' -o llama-report") == []
    assert unquoted_specs('graphkit verify "hf:gpt2?n_layer=2"   # quoted hf:gpt2?x in a comment') == []
    assert unquoted_specs("bash scripts/setup.sh && .venv/bin/graphkit inspect zoo:gpt_stage") == []
    assert unquoted_specs("graphkit render my_model.py:build -o out/x.svg &") == []
    text = "```bash\ngraphkit a \\\n  hf:t5?stage=middle\n```\nrun `graphkit b hf:bert?seq=4` or `hf:x?y`\n"
    assert shell_lines(text) == ["graphkit a    hf:t5?stage=middle", "graphkit b hf:bert?seq=4"]


def test_readme_docs_notebooks_and_examples_quote_specs_with_question_marks_and_ampersands(repo_root: Path):
    commands = documented_commands(repo_root)
    assert len(commands["README.md"]) >= 5 and commands["docs/pipelining.md"]  # the scan sees the blocks
    assert any("'hf:llama?stage=middle&n_layer=4'" in line for line in commands["README.md"])
    unquoted = {
        name: specs
        for name, lines in commands.items()
        if (specs := [spec for line in lines for spec in unquoted_specs(line)])
    }
    assert unquoted == {}, "quote these specs (zsh globs ?, every shell splits at &)"


def cli_texts() -> list[str]:
    """Every help, description and epilog of the graphkit command and its subcommands."""
    parser = build_parser()
    (subcommands,) = [
        action for action in parser._actions if action.__class__.__name__ == "_SubParsersAction"
    ]
    texts = [parser.format_help()]
    for subparser in subcommands.choices.values():
        texts += [subparser.format_help(), subparser.description or "", subparser.epilog or ""]
    return texts


def test_the_command_line_help_and_list_quote_the_specs_of_their_examples(capsys: pytest.CaptureFixture[str]):
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    lines = [line for text in [*cli_texts(), listing] for line in text.splitlines()]
    # an example command starts at "graphkit "; ";" separates two of them on one line
    commands = [
        part[part.index("graphkit ") :] for line in lines for part in line.split(";") if "graphkit " in part
    ]
    assert "graphkit verify-pipeline 'hf:gpt2?n_layer=4' --ranks 2" in commands
    assert [spec for command in commands for spec in unquoted_specs(command)] == []


# --- output folders --------------------------------------------------------------------------------------------
FOLDER_COMMANDS = {"inspect": "graphkit-report", "compare-schedules": None}  # -o is a folder; its default


def output_folders(line: str) -> set[str]:
    """The folders (relative, first path component) a command line tells its program to write into."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return set()
    folders = set()
    commands = " ".join(words).replace("&&", ";").replace("|", ";").split(";")
    for command in (command.split() for command in commands if command.strip()):
        outputs = [
            command[at + 1]
            for at, word in enumerate(command[:-1])
            if word in ("-o", "--output", "--timeline")
        ]
        folders.update(output for output in outputs if "/" in output)
        subcommand = command[1] if len(command) > 1 and command[0].endswith("graphkit") else None
        if subcommand in FOLDER_COMMANDS:  # its -o is a folder, with or without a slash
            default = FOLDER_COMMANDS[subcommand]
            folders.update(outputs or ([default] if default else []))
    return {Path(folder).parts[0] for folder in folders if not Path(folder).is_absolute()}


def test_the_output_folder_finder():
    assert output_folders("bash scripts/setup.sh && .venv/bin/graphkit inspect") == {"graphkit-report"}
    assert output_folders("graphkit inspect 'hf:llama?stage=middle' -o llama-report   # -o x/") == {
        "llama-report"
    }
    assert output_folders("graphkit compare-schedules zoo-pipeline:mlp -o compared/") == {"compared"}
    assert output_folders("graphkit render zoo:gpt_stage -o out/group3.svg") == {"out"}
    assert output_folders("graphkit render zoo:gpt_stage -o stage.svg") == set()
    assert output_folders("graphkit timeline zoo-pipeline:mlp --schedule 1F1B -o /tmp/t/x.svg") == set()


def test_every_output_folder_the_docs_tell_users_to_write_is_git_ignored(repo_root: Path):
    folders = {
        folder
        for lines in documented_commands(repo_root).values()
        for line in lines
        for folder in output_folders(line)
    }
    assert {"graphkit-report", "llama-report", "compared", "out"} <= folders  # the scan sees them
    ignored = {line.strip().strip("/") for line in (repo_root / ".gitignore").read_text().splitlines()}
    assert sorted(folders - ignored) == [], "add these output folders to .gitignore"


BARE_COMMAND = re.compile(r"(?:^|&&|;|\|\|)\s*(graphkit|torchrun|python|pip|pytest)\s")


def bare_commands(line: str) -> list[str]:
    """The commands of one shell line that a fresh shell after ``bash scripts/setup.sh`` does not find:
    ``graphkit``, ``torchrun``, ``python``, ``pip`` and ``pytest`` without ``.venv/bin/`` (the set-up puts
    them there, not on PATH)."""
    return BARE_COMMAND.findall(line.split(" #", 1)[0])


def test_the_bare_command_finder():
    assert bare_commands("graphkit verify zoo:mlp") == ["graphkit"]
    assert bare_commands("torchrun --nproc-per-node 2 examples/zero_bubble_torchrun.py") == ["torchrun"]
    assert bare_commands("bash scripts/setup.sh && python -m pytest -q") == ["python"]
    assert bare_commands("bash scripts/setup.sh && .venv/bin/graphkit inspect") == []
    assert bare_commands(".venv/bin/torchrun --nproc-per-node 2 x.py   # python x.py is not run") == []
    assert bare_commands("    .venv/bin/python examples/capture_and_draw.py") == []


def bare_inline_commands(text: str) -> list[str]:
    """The inline commands of a markdown text (`` `python bench/plan.py ...` ``) that a fresh shell after the
    set-up runs with another program or none: a bare ``python``, ``pip``, ``pytest`` or ``torchrun`` (a bare
    ``graphkit`` in prose names the command: "`graphkit verify` compares ...")."""
    return [
        command
        for command in INLINE_COMMAND.findall(text)
        if {"python", "pip", "pytest", "torchrun"} & set(bare_commands(command))
    ]


def test_the_bare_inline_command_finder():
    text = (
        "run `python bench/plan.py --ranks 2 -o DIR` or `.venv/bin/python bench/split.py`; "
        "`graphkit verify` compares, `torchrun --nproc-per-node 2 x.py` starts"
    )
    assert bare_inline_commands(text) == [
        "python bench/plan.py --ranks 2 -o DIR",
        "torchrun --nproc-per-node 2 x.py",
    ]


def test_every_documented_shell_line_runs_in_a_fresh_shell_after_the_set_up(repo_root: Path):
    # the shell code blocks of README.md and docs/*.md, and the usage lines of examples/*.py: a bare
    # `graphkit ...` or `torchrun ...` is "command not found" after bash scripts/setup.sh
    failures = []
    for path in [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]:
        for block in SHELL_BLOCK.findall(path.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                if bare_commands(line):
                    failures.append(f"{path.relative_to(repo_root)}: {line.strip()}")
        # and the commands written inline in the prose (`python bench/plan.py ...`)
        failures += [
            f"{path.relative_to(repo_root)}: {line}" for line in bare_inline_commands(path.read_text())
        ]
    for path in sorted((repo_root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        markdown = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")
        failures += [f"{path.relative_to(repo_root)}: {line}" for line in bare_inline_commands(markdown)]
    for path in sorted((repo_root / "examples").glob("*.py")):
        for line in example_usage_lines(path):
            if bare_commands(line):
                failures.append(f"{path.relative_to(repo_root)}: {line}")
    assert not failures, "spell .venv/bin/... (the set-up puts the commands there):\n" + "\n".join(failures)
