"""The graphkit commands as the parser defines them, for tests that check docs and listings against them."""

from __future__ import annotations


def commands_taking_pipeline_spec() -> set[str]:
    """The subcommands whose positional ``spec`` is a ``PIPELINE_SPEC``."""
    from graphkit.cli import build_parser

    (subcommands,) = [
        action for action in build_parser()._actions if action.__class__.__name__ == "_SubParsersAction"
    ]
    return {
        name
        for name, parser in subcommands.choices.items()
        if any(action.dest == "spec" and action.metavar == "PIPELINE_SPEC" for action in parser._actions)
    }
