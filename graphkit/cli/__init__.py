"""The ``graphkit`` command: a thin shell over the library.

Subcommands::

    graphkit capture SPEC [--json | --graphml FILE | --dot FILE]
    graphkit groups  SPEC [--json]
    graphkit verify  SPEC [--dtype float32|float64] [--device cpu|cuda] [--seed N] [--autocast bfloat16]
                     [--recompute in-w|keep-from-b] [--json]
    graphkit render  SPEC -o OUT.{svg,png,pdf,dot} [--collapse DEPTH] [--max-nodes N] [--fold | --no-fold]
                     [--highlight GROUP] [--plain] [--saved] [--module-paths] [--no-shapes]
                     [--direction BT|TB|LR|RL] [--legend auto|on|off] [--device cpu|meta|...] [--timeout S]
    graphkit inspect [SPEC] [-o DIR] [--device cpu|cuda|meta] [--dtype ...] [--collapse DEPTH] [--max-nodes N]
    graphkit list    [--json]
    graphkit bench   SPEC [--repeat N] [--threads N] [--json]
    graphkit costs   SPEC|PIPELINE_SPEC [--pipeline] [--num-stages N] [--batch-size B] [--microbatches M]
                     [--device ...] [--repeat N] [--warmup N] [--threads N] [--json]
    graphkit timeline PIPELINE_SPEC --schedule NAME [--microbatches N] [--ranks R] [--stage graphkit|torch]
                     [--timeout S] -o OUT.{svg,png,html,json}
    graphkit compare-schedules PIPELINE_SPEC [--schedules A,B,...] [--microbatches N] [--ranks R] [--timeout S]
                     [-o DIR]
    graphkit verify-pipeline PIPELINE_SPEC --schedule NAME --microbatches N [--ranks R] [--ddp | --fsdp]
                     [--steps N] [--stages-per-rank K] [--stage graphkit|torch] [--timeout S] [--timeline OUT]
                     [--json]
    graphkit plan    [PIPELINE_SPEC] --ranks R --microbatches M [--memory-limit BYTES] [--costs FILE.json] [--run]
                     [--steps K] [--top N] [--what-if] [-o DIR] [--json]

SPEC is ``zoo:NAME``, ``path/to/file.py:function``, ``package.module:function`` or ``hf:ARCH?key=value``
(see :mod:`graphkit.models.specs`); PIPELINE_SPEC is ``path/to/file.py:function``, ``package.module:function``,
``zoo-pipeline:NAME``, ``hf:gpt2?key=value`` or ``hf:llama?key=value`` (one format for every pipeline command, see
:mod:`graphkit.models.pipeline_specs`); ``graphkit list`` lists the built-in ones. Quote a spec with ``?``
or ``&`` in a shell (``'hf:gpt2?n_layer=4'``). The pipeline commands' ``--timeout`` is the wall-clock limit
in seconds after which graphkit ends the processes ``--ranks R`` started. Exit status: 0 on success, 1 when a
verification fails, 2 on bad input - also an exception raised inside the spec's own model, said in one line
(``--traceback``, on every command that runs a model, prints the whole traceback).

One module per command family: :mod:`~graphkit.cli.graph_commands` (capture, groups, list),
:mod:`~graphkit.cli.split_commands` (verify, bench), :mod:`~graphkit.cli.drawing_commands` (render,
inspect), :mod:`~graphkit.cli.pipeline_commands` (costs, timeline, compare-schedules, verify-pipeline), :mod:`~graphkit.cli.plan_command` (plan);
:mod:`~graphkit.cli.options` holds the options several
commands share, :mod:`~graphkit.cli.terminal` and :mod:`~graphkit.cli.spec_tracing` what they print with
and what they trace.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graphkit.cli import (
    drawing_commands,
    graph_commands,
    pipeline_commands,
    plan_command,
    split_commands,
)
from graphkit.cli.terminal import print_model_error
from graphkit.models.specs import model_frame

__all__ = ["build_parser", "main"]

COMMANDS = (
    graph_commands.add_capture_command,
    graph_commands.add_groups_command,
    split_commands.add_verify_command,
    drawing_commands.add_render_command,
    drawing_commands.add_inspect_command,
    graph_commands.add_list_command,
    split_commands.add_bench_command,
    pipeline_commands.add_costs_command,
    pipeline_commands.add_timeline_command,
    pipeline_commands.add_compare_schedules_command,
    pipeline_commands.add_verify_pipeline_command,
    plan_command.add_plan_command,
)
"""The subcommands, in the order ``graphkit --help`` lists them: each adds its parser."""

MEASURING_COMMANDS = ("costs", "timeline", "compare-schedules", "verify-pipeline", "plan")
"""The subcommands that run stages in their own process or on the ranks they start: they take
``--allocator``, and all but ``verify-pipeline`` (which times nothing: its verdict stays its last line) end
by saying which allocator those ran under."""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``graphkit`` command (also used to document the CLI)."""
    parser = argparse.ArgumentParser(
        prog="graphkit",
        description="See, analyse and split PyTorch autograd graphs.",
        epilog="SPEC: zoo:NAME | path/to/file.py:function | package.module:function | hf:ARCH?key=value. "
        "PIPELINE_SPEC (costs, timeline, compare-schedules, verify-pipeline, plan): zoo-pipeline:NAME | "
        "path/to/file.py:function | package.module:function | hf:gpt2?key=value | hf:llama?key=value. "
        "graphkit list names the built-in ones.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(commands)
    for name, command in commands.choices.items():
        if name != "list":  # every command that runs a spec's model
            command.add_argument(
                "--traceback",
                action="store_true",
                help="when the model raises, print the whole traceback after the one-line error",
            )
        if name in MEASURING_COMMANDS:
            command.add_argument(
                "--allocator",
                choices=["tuned", "default"],
                help="the CPU allocator of this process and of the ranks it starts: tuned (glibc's malloc "
                "without mmap or trimming: fresh tensors do not page-fault; the default) or default (left "
                "as it is; also GRAPHKIT_ALLOCATOR=default)",
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``graphkit`` command; returns the exit status."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    try:
        allocator = _tune_allocator(arguments) if arguments.command in MEASURING_COMMANDS else None
        status = arguments.run(arguments)
        if allocator is not None and arguments.command != "verify-pipeline":  # after the figures
            print(
                f"allocator: {allocator}",
                file=sys.stderr if getattr(arguments, "json", False) else sys.stdout,
            )
        return status
    except KeyboardInterrupt:  # Ctrl-C: the ranks it started are ended on the way out (run_on_processes)
        print(f"graphkit {arguments.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        frame = model_frame(error)
        if frame is not None:  # the spec's own model raised (a wrong shape in its forward, ...): bad input
            return _model_error(arguments, error, frame)
        if not _refused(error):
            raise  # a bug in graphkit: the whole traceback
        print(f"graphkit {arguments.command}: error: {error}", file=sys.stderr)
        return 2


def _tune_allocator(arguments: argparse.Namespace) -> Any:
    """Tune this process's allocator as ``--allocator`` (else ``GRAPHKIT_ALLOCATOR``) says, and the ranks
    it starts with it (they follow ``GRAPHKIT_ALLOCATOR``); returns what they run under."""
    from graphkit.measure.allocator import ALLOCATOR_VARIABLE, tune_allocator

    if arguments.allocator is not None:
        os.environ[ALLOCATOR_VARIABLE] = arguments.allocator
    return tune_allocator()


def _refused(error: Exception) -> bool:
    """Whether graphkit raised ``error`` to refuse something, said in one line with exit status 2: a bad
    spec or input (SpecError, GraphkitInputError are ValueErrors), a file, a split it cannot do
    (SplitError, GraphFreedError, ...), a drawing it cannot make."""
    if isinstance(error, (ValueError, ImportError, OSError)):
        return True
    names = {kind.__name__ for kind in type(error).__mro__}
    return isinstance(error, RuntimeError) and bool(
        {"GraphvizNotFoundError", "RenderTimeoutError", "SplitError"} & names
    )


def _model_error(arguments: argparse.Namespace, error: Exception, frame: traceback.FrameSummary) -> int:
    """One line naming the spec, the exception and where the model raised it (exit status 2); the whole
    traceback after it with ``--traceback``."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    print_model_error(
        arguments,
        f"{type(error).__name__}{': ' + message if message else ''}",
        f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}",
        "".join(traceback.format_exception(error)),
    )
    return 2
