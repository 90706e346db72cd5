"""Where the split backward's extra time goes: added kernel time against everything else (CPU).

    python bench/split_profile.py [--repeat N] [--threads N] [--only NAME ...] [--target RATIO]

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from split import MODELS, built_models, set_threads  # noqa: E402  (bench/split.py)

from graphkit.measure.benchmark import account_split_time  # noqa: E402

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
    arguments = parser.parse_args(argv)
    set_threads(parser, arguments.threads)
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


if __name__ == "__main__":
    raise SystemExit(main())
