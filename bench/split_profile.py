"""Where the split backward's extra time goes: piece by piece (--breakdown), or kernels against the rest.

    python bench/split_profile.py --breakdown [--repeat N] [--threads N] [--clock wall|cpu] [--only NAME ...]
    python bench/split_profile.py [--repeat N] [--threads N] [--only NAME ...] [--target RATIO]

``--breakdown``: for every model of ``bench/split.py``, per microbatch (medians, full backward and B + W
alternating in one run), the full backward, B and W, and each piece of them in microseconds, timed with
``time.perf_counter`` around the pieces (:mod:`graphkit.split.laps`, no profiler): B's argument checks
(``args``), Node walk (``walk``), plan lookup (``plan``), run-once and checkpoint scans (``opaque``), hook
registration and removal (``hooks``), custom-Function flags (``cfn``), engine call (``eng``), weight
formula preparation (``prep``), state building (``state``), output watch (``watch``) and the rest
(``other``); W's checks, direct Node calls (``calls``), formulas (``form``: their kernels included), root
building (``roots``), engine call (``eng``), release and the rest. ``Bpy/eng``: B's time outside its engine
call over that engine call; ``Wpy``: W's time outside its formulas and engine call, over the full backward.

Without ``--breakdown``:

For every model of ``bench/split.py``: wall time of a full backward and of B + W (alternating
microbatches, in the same run), the ``aten::`` operators' own time under ``torch.profiler`` in each,
and from these the time the split adds in kernels and the rest (Python, hooks, engine scheduling),
as fractions of the full backward. ``room/int`` is the non-kernel time each intermediate may cost for
B + W to stay within ``--target`` times the full backward, given the added kernel time; a negative
figure means the kernels alone already exceed it. The last column names the operators whose time
grew most. The profiler's own cost inflates tiny operators a little: confirm small differences by
wall time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from split import MODELS, add_clock_option, built_models, clock_of, set_threads  # noqa: E402  (bench/split.py)

from graphkit.measure.benchmark import account_split_time, breakdown_split  # noqa: E402

HEADER = (
    f"{'model':24s} {'full ms':>8s} {'B+W ms':>8s} {'ratio':>6s} {'kern full':>9s} {'kern B+W':>9s} "
    f"{'+kern':>6s} {'+other':>6s} {'int':>4s} {'other/int':>9s} {'room/int':>9s}  most added (ms)"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, help="intra-op CPU threads (default: PyTorch's choice)")
    parser.add_argument("--target", type=float, default=1.10, help="(B+W)/full ratio for room/int")
    parser.add_argument("--only", nargs="*", help="model names to run (default: all)")
    parser.add_argument("--breakdown", action="store_true", help="time each piece of B and W (see above)")
    add_clock_option(parser)
    arguments = parser.parse_args(argv)
    set_threads(parser, arguments.threads)
    clock = clock_of(parser, arguments)
    if arguments.breakdown:
        return print_breakdown(arguments, clock)
    print(HEADER)
    for name, module, inputs in built_models(MODELS, arguments.only):
        account = account_split_time(module, inputs, repeat=arguments.repeat, warmup=arguments.warmup)
        full = account.full_s
        most = ", ".join(
            f"{operator.removeprefix('aten::')} {seconds * 1e3:+.2f}"
            for operator, seconds in account.largest_added(3)
        )
        print(
            f"{name:24s} {full * 1e3:8.2f} {account.split_s * 1e3:8.2f} {account.split_s / full:5.2f}x "
            f"{account.full_kernel_s * 1e3:9.2f} {account.split_kernel_s * 1e3:9.2f} "
            f"{account.added_kernel_s / full:+6.2f} {account.other_s / full:+6.2f} {account.intermediates:4d} "
            f"{account.other_s / max(account.intermediates, 1) * 1e6:7.1f}us "
            f"{account.room_per_intermediate_s(arguments.target) * 1e6:7.1f}us  {most}",
            flush=True,
        )
    return 0


B_PIECES = (
    ("args", "b.arguments"), ("walk", "b.walk"), ("plan", "b.plan"), ("opaque", "b.opaque"),
    ("hooks", "b.hooks"), ("cfn", "b.custom_functions"), ("eng", "b.engine"), ("prep", "b.formulas"),
    ("state", "b.state"), ("watch", "b.watch"), ("other", "b.other"),
)  # fmt: skip
W_PIECES = (
    ("checks", "w.checks"), ("calls", "w.node_calls"), ("form", "w.formulas"), ("roots", "w.roots"),
    ("eng", "w.engine"), ("release", "w.release"), ("other", "w.other"),
)  # fmt: skip


def print_breakdown(arguments: argparse.Namespace, clock: Any) -> int:
    """One line per model: times per microbatch, each piece of B and W in microseconds."""
    b_header = " ".join(f"{short:>6s}" for short, _ in B_PIECES)
    w_header = " ".join(f"{short:>6s}" for short, _ in W_PIECES)
    print(
        f"{'model':20s} {'int':>4s} {'full us':>8s} {'B us':>7s} {'W us':>7s} {'B+W':>6s} {'Bpy/eng':>7s} "
        f"{'Wpy':>5s} | B: {b_header} | W: {w_header}"
    )
    for name, module, inputs in built_models(MODELS, arguments.only):
        result = breakdown_split(
            module, inputs, repeat=arguments.repeat, warmup=arguments.warmup, clock=clock
        )
        pieces = result.pieces
        engine = pieces.get("b.engine", 0.0)
        b_cells = " ".join(f"{pieces.get(key, 0.0) * 1e6:6.0f}" for _, key in B_PIECES)
        w_cells = " ".join(f"{pieces.get(key, 0.0) * 1e6:6.0f}" for _, key in W_PIECES)
        print(
            f"{name:20s} {result.intermediates:4d} {result.full_s * 1e6:8.0f} {result.b_s * 1e6:7.0f} "
            f"{result.w_s * 1e6:7.0f} {(result.b_s + result.w_s) / result.full_s:5.2f}x "
            f"{result.python_s('b') / engine if engine else float('nan'):7.2f} "
            f"{result.python_s('w') / result.full_s:5.2f} | B: {b_cells} | W: {w_cells}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    from graphkit.measure.allocator import tune_allocator_for_benchmark

    tune_allocator_for_benchmark()  # first, and said on stderr; GRAPHKIT_ALLOCATOR=default opts out
    raise SystemExit(main())
