"""The command-line options several ``graphkit`` commands share, each written once.

Every function adds one option (or one block of options that always travel together) to an
``argparse.ArgumentParser``; a command's parser calls them in the order its ``--help`` lists them. Where
commands describe the same option differently (a default that differs, a device list that includes
``meta``), the help text is an argument.
"""

from __future__ import annotations

import argparse
import re

import torch

__all__ = [
    "DTYPES",
    "MODEL_DEVICE_HELP",
    "add_drawing_size_options",
    "add_dtype_option",
    "add_json_option",
    "add_microbatches_option",
    "add_model_device_option",
    "add_model_spec",
    "add_pipeline_spec",
    "add_ranks_option",
    "add_run_timeout_option",
    "add_stage_option",
    "add_stages_per_rank_option",
    "add_steps_option",
    "add_threads_option",
    "check_device",
    "dtype_of",
    "positive_bytes",
    "positive_seconds",
]

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The dtypes ``--dtype`` and ``--autocast`` name, by their spelling on the command line."""

MODEL_DEVICE_HELP = "cpu, cuda, cuda:1 ... (default: where the model is)"


def dtype_of(name: str | None) -> torch.dtype | None:
    """The torch dtype a ``--dtype`` / ``--autocast`` value names; None when the option was not given."""
    return DTYPES[name] if name else None


# --- what a command runs on --------------------------------------------------------------------------------
def add_model_spec(parser: argparse.ArgumentParser, help: str | None = None, optional: bool = False) -> None:
    """The positional model SPEC (``zoo:NAME``, ``file.py:function``, ``hf:ARCH?...``); ``optional``: may be
    left out (then None)."""
    if optional:
        parser.add_argument("spec", metavar="SPEC", nargs="?", default=None, help=help)
    else:
        parser.add_argument("spec", metavar="SPEC", help=help)


def add_pipeline_spec(parser: argparse.ArgumentParser, help: str) -> None:
    """The positional PIPELINE_SPEC of the pipeline commands."""
    parser.add_argument("spec", metavar="PIPELINE_SPEC", help=help)


def check_device(name: str | None) -> None:
    """Refuse ``--device name`` that this torch cannot use, before anything is measured or written.

    Raises:
        ValueError: not a device string, or ``cuda`` / ``cuda:N`` where this torch has no CUDA or no such
            device (the message says which and what to do instead).
    """
    if name is None:
        return
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device: give cpu, cuda, cuda:1, meta, ...") from None
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        why = (
            "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        )
        raise ValueError(
            f"--device {name}: {why} (torch {torch.__version__}); run it on the machine with the GPU, "
            "or measure here with --device cpu"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def add_model_device_option(parser: argparse.ArgumentParser, help: str = MODEL_DEVICE_HELP) -> None:
    """``--device``: where to build the model (default None: where the spec builds it)."""
    parser.add_argument("--device", default=None, help=help)


def add_dtype_option(parser: argparse.ArgumentParser) -> None:
    """``--dtype float32|float64``: cast the model and its inputs."""
    parser.add_argument("--dtype", choices=["float32", "float64"], help="cast the model and inputs")


def add_json_option(parser: argparse.ArgumentParser, help: str | None = "print JSON") -> None:
    """``--json``: print JSON instead of (or, where ``help`` says so, besides) the text output."""
    parser.add_argument("--json", action="store_true", help=help)


def add_threads_option(parser: argparse.ArgumentParser, help: str, default: int | None = 1) -> None:
    """``--threads``: intra-op CPU threads (``torch.set_num_threads``)."""
    parser.add_argument("--threads", type=int, default=default, help=help)


def add_pin_cores_option(parser: argparse.ArgumentParser, when: str = "") -> None:
    """``--pin-cores``: each spawned rank runs on one CPU core (Linux); ``when``: a condition for the help."""
    parser.add_argument(
        "--pin-cores",
        action="store_true",
        help=f"{when}run each spawned rank on one CPU core with all its threads (Linux): steadier step times "
        "on a CPU machine with a core per rank. With fewer cores than ranks, ranks share cores round robin; "
        "--ranks 1 runs in this process, unpinned",
    )


# --- drawing -----------------------------------------------------------------------------------------------
def add_drawing_size_options(parser: argparse.ArgumentParser) -> None:
    """How big a diagram may get: ``--collapse``, ``--max-nodes``, ``--fold | --no-fold`` and ``--timeout``."""
    parser.add_argument(
        "--collapse",
        type=int,
        default=None,
        metavar="DEPTH",
        help="draw each module at depth DEPTH of the module tree (blocks.0 is depth 2) as one node",
    )
    parser.add_argument(
        "--max-nodes",
        type=int,
        default=400,
        metavar="N",
        help="past N drawn nodes, collapse modules (or fold repeated structure) automatically (default 400)",
    )
    folding = parser.add_mutually_exclusive_group()
    folding.add_argument(
        "--fold",
        dest="fold",
        action="store_true",
        default=None,
        help="draw repeated structure (a loop over one module, identical blocks) once, with a count",
    )
    folding.add_argument("--no-fold", dest="fold", action="store_false", help="never fold repeated structure")
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        metavar="S",
        help="seconds Graphviz may take to lay out the diagram before a smaller one is drawn (default 60)",
    )


# --- pipeline runs -----------------------------------------------------------------------------------------
def add_microbatches_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--microbatches N`` (default 4): microbatches per schedule step."""
    parser.add_argument("--microbatches", type=int, default=4, metavar="N", help=help)


def add_ranks_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--ranks R`` (default 1): processes on 127.0.0.1; 1 runs every stage in this process."""
    parser.add_argument("--ranks", type=int, default=1, metavar="R", help=help)


def add_steps_option(parser: argparse.ArgumentParser, default: int, metavar: str, help: str) -> None:
    """``--steps``: schedule steps to run."""
    parser.add_argument("--steps", type=int, default=default, metavar=metavar, help=help)


def add_stage_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--stage graphkit|torch`` (default graphkit): whose ``PipelineStage`` runs the schedule."""
    parser.add_argument("--stage", choices=["graphkit", "torch"], default="graphkit", help=help)


def add_stages_per_rank_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--stages-per-rank K`` (default 2)."""
    parser.add_argument("--stages-per-rank", type=int, default=2, metavar="K", help=help)


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a number of seconds above 0 (``--timeout 0`` would stop every run at once)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not seconds > 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {text}")
    return seconds


_BYTE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_BYTE_QUANTITY = re.compile(
    r"\s*(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[A-Za-z]*)\s*"
)


def positive_bytes(text: str) -> float:
    """An argparse ``type``: a number of bytes above 0, plain (``4e6``) or with a unit (``4MiB``, ``4 MB``).

    KiB, MiB and GiB are powers of 2 (``1KiB`` = 1024 bytes); KB, MB and GB powers of 10 (``1KB`` = 1000
    bytes); B or no unit is bytes. Units are read without regard to case.

    Returns:
        The bytes, as a float.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a number with an optional unit, the unit is unknown (the
            message lists the accepted ones), or the number of bytes is 0 or below.
    """
    quantity = _BYTE_QUANTITY.fullmatch(text)
    if quantity is None:
        raise argparse.ArgumentTypeError(
            f"expected a number of bytes such as 4000000, 4e6, 4MB or 4MiB, got {text!r}"
        )
    unit = quantity["unit"]
    if unit.lower() not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(
            f"unknown unit {unit!r} in {text!r}; use B, KiB, MiB, GiB (powers of 2) or KB, MB, GB "
            "(powers of 10), or no unit for bytes"
        )
    count = float(quantity["number"]) * _BYTE_UNITS[unit.lower()]
    if not 0 < count < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of bytes, got {text!r}")
    return count


def add_run_timeout_option(
    parser: argparse.ArgumentParser, default: float, old_spelling: str | None = None
) -> None:
    """``--timeout S``: the wall-clock limit of a pipeline run, after which graphkit ends what it started.

    It limits the processes ``--ranks R`` (R > 1) starts; with one rank every stage runs in the command's
    own process, which graphkit does not end. A limit of 0 or less is refused (exit status 2).

    Args:
        parser: the command's parser.
        default: the limit in seconds when the option is not given.
        old_spelling: an earlier name of the option (``--deadline``), still accepted but not listed in
            ``--help``; it sets the same value.
    """
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=default,
        metavar="S",
        help="wall-clock limit in seconds, after which graphkit ends the processes it started with --ranks "
        f"above 1 (default {default:g})",
    )
    if old_spelling is not None:
        parser.add_argument(
            old_spelling,
            dest="timeout",
            type=positive_seconds,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
