"""``graphkit render`` and ``graphkit inspect``: a spec's autograd graph drawn with its parameter groups,
alone or in the HTML report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from graphkit.cli.options import (
    MODEL_DEVICE_HELP,
    add_drawing_size_options,
    add_dtype_option,
    add_model_device_option,
    add_model_spec,
    dtype_of,
)
from graphkit.cli.spec_tracing import trace_spec
from graphkit.cli.terminal import progress

__all__ = ["add_inspect_command", "add_render_command"]

LEGEND = {"auto": "auto", "on": True, "off": False}
"""``--legend`` values and what :func:`graphkit.drawing.rendering.render` takes for them."""


# --- render ------------------------------------------------------------------------------------------------
def add_render_command(commands: Any) -> None:
    render = commands.add_parser("render", help="draw the graph with its parameter groups")
    add_model_spec(render)
    render.add_argument(
        "-o", "--output", required=True, help="OUT.svg, .png, .pdf or .dot (missing folders are created)"
    )
    add_drawing_size_options(render)
    render.add_argument(
        "--highlight", type=int, default=None, metavar="GROUP", help="paint group GROUP, grey the others"
    )
    render.add_argument("--plain", action="store_true", help="the plain graph: no parameter groups")
    render.add_argument("--saved", action="store_true", help="add the bytes of each node's saved tensors")
    render.add_argument("--module-paths", action="store_true", help="add each node's module path")
    render.add_argument("--no-shapes", action="store_true", help="leave out the output shapes")
    render.add_argument(
        "--direction",
        choices=["BT", "TB", "LR", "RL"],
        default="BT",
        help="layout direction (default BT: stage inputs at the bottom)",
    )
    render.add_argument(
        "--legend",
        choices=list(LEGEND),
        default="auto",
        help="the legend of groups and the key: auto (groups listed up to 24), on, off",
    )
    render.add_argument("--title", default=None, help="a heading on top of the diagram")
    add_model_device_option(render, help="build the model there: cpu, cuda, meta (shapes only, no memory)")
    render.set_defaults(run=run_render)


def run_render(arguments: argparse.Namespace) -> int:
    from graphkit.drawing.rendering import render

    say = progress("render")
    say(f"loading {arguments.spec}" + (f" on {arguments.device}" if arguments.device else ""))
    module, _, graph = trace_spec(arguments.spec, arguments.device)
    say(f"captured {graph.number_of_nodes()} nodes; drawing")
    if arguments.device is not None and torch.device(arguments.device).type == "meta":
        from graphkit.models.specs import meta_graph_note

        if note := meta_graph_note(module):
            print(f"note: {note}", file=sys.stderr)
    groups = False if arguments.plain else None
    if arguments.plain and arguments.highlight is not None:
        raise ValueError("--highlight needs the groups: leave out --plain")
    path = render(
        graph,
        arguments.output,
        groups,
        timeout_s=arguments.timeout,
        progress=say,
        collapse_depth=arguments.collapse,
        max_nodes=arguments.max_nodes,
        fold=arguments.fold,
        highlight_group=arguments.highlight,
        show_saved=arguments.saved,
        show_module=arguments.module_paths,
        show_shapes=not arguments.no_shapes,
        rankdir=arguments.direction,
        legend=LEGEND[arguments.legend],
        title=arguments.title,
    )
    say("done")
    print(f"wrote {path}")
    return 0


# --- inspect -----------------------------------------------------------------------------------------------
def add_inspect_command(commands: Any) -> None:
    inspect = commands.add_parser("inspect", help="capture, group, verify, measure and draw: an HTML report")
    add_model_spec(
        inspect,
        optional=True,
        help="model spec (default: zoo:gpt_ends, a GPT-style stage with an LM head tied to its embedding)",
    )
    inspect.add_argument("-o", "--output", default="graphkit-report", metavar="DIR", help="report folder")
    add_model_device_option(inspect, help=f"{MODEL_DEVICE_HELP}; meta: shapes only, no memory, no verify")
    add_dtype_option(inspect)
    add_drawing_size_options(inspect)
    inspect.set_defaults(run=run_inspect)


def run_inspect(arguments: argparse.Namespace) -> int:
    from graphkit.apps.report import inspect

    return inspect(
        arguments.spec,
        output=Path(arguments.output),
        device=arguments.device,
        dtype=dtype_of(arguments.dtype),
        collapse_depth=arguments.collapse,
        max_nodes=arguments.max_nodes,
        fold=arguments.fold,
        timeout_s=arguments.timeout,
    )
