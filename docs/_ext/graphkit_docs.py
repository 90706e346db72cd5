"""Sphinx helpers for graphkit's documentation.

- ``graphkit-cli`` directive: the reference of the ``graphkit`` command, one section per subcommand, from
  the argparse parser itself (:func:`graphkit.cli.build_parser`), so it never drifts from the code.
- At ``builder-inited``: draws the pictures of the concepts page with graphkit into ``docs/_generated/``.
- ``autodoc-process-docstring``: escapes ``*args`` / ``**kwargs`` at the start of Google-style argument
  entries (``*args, **kwargs: ...``), which napoleon would otherwise pass on as reST emphasis.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

GENERATED = Path(__file__).resolve().parent.parent / "_generated"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse offers no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


class CliReference(SphinxDirective):
    """``{graphkit-cli}`` (in a MyST page) - the help text of ``graphkit`` and of each subcommand."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from graphkit.cli import build_parser

        previous = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "80"  # argparse wraps help text to the terminal width
        try:
            parser = build_parser()
            # The directive is used from MyST pages, so it writes Markdown: a heading and a text block each.
            lines = ["## Usage", "", "```text", *parser.format_help().splitlines(), "```"]
            for name, subparser in _subcommands(parser).items():
                lines += [
                    "",
                    f"## graphkit {name}",
                    "",
                    "```text",
                    *subparser.format_help().splitlines(),
                    "```",
                ]
        finally:
            if previous is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = previous
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="graphkit.cli"), container)
        return list(container.children)


def draw_pictures(app: Sphinx) -> None:
    """Draw the concepts page's diagrams of ``zoo.mlp`` into ``docs/_generated/``."""
    import graphkit
    from graphkit.drawing import render
    from graphkit.models import zoo

    GENERATED.mkdir(exist_ok=True)
    model, (x,) = zoo.mlp()
    _, graph = graphkit.trace(model, x)
    pictures: dict[str, dict[str, Any]] = {
        "mlp_autograd.svg": {"groups": False, "title": "the autograd graph of Linear, GELU, Linear"},
        "mlp_groups.svg": {"title": "the same graph with its two parameter groups"},
        "mlp_group1.svg": {"highlight_group": 1, "show_saved": True, "title": "group 1 highlighted"},
    }
    for name, options in pictures.items():
        render(graph, GENERATED / name, **options)


_STAR_ARGUMENTS = re.compile(r"^(\s+)(\*{1,2}\w+(?:, \*{1,2}\w+)*):")


def escape_star_arguments(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Turn ``*args, **kwargs: text`` argument entries into ``\\*args, \\*\\*kwargs: text``."""
    for position, line in enumerate(lines):
        match = _STAR_ARGUMENTS.match(line)
        if match:
            escaped = match.group(2).replace("*", "\\*")
            lines[position] = match.group(1) + escaped + line[match.end(2) :]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("graphkit-cli", CliReference)
    app.connect("builder-inited", draw_pictures)
    app.connect("autodoc-process-docstring", escape_star_arguments, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
