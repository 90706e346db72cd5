"""torchtitan's trainer with graphkit's split backward: ``torchtitan.train`` behind one call to ``install()``.

    .venv-newest/bin/torchrun --nproc-per-node 2 examples/torchtitan_train.py --module llama3 --config llama3_debugmodel \\
        --parallelism.pipeline_parallel_degree 2 \\
        --parallelism.pipeline_parallel_schedule ZBVZeroBubble \\
        --compile.enable --compile.backend graphkit_split

    .venv-newest/bin/python examples/torchtitan_train.py --only-install   # install(), print what it changed, and stop

Every argument but ``--only-install`` is torchtitan's own (``--module``, ``--config``, then any config key,
as ``python -m torchtitan.train`` takes them). ``graphkit.integrations.torchtitan.install()`` runs first, before
torchtitan builds its model: torchtitan's pipeline stages become ``graphkit.pipelining.PipelineStage`` (the
I and W actions of ``ZBVZeroBubble``, ``InterleavedZeroBubble``, ``DualPipeV`` run graphkit's split backward,
with every parameter's exact gradient) and ``--compile.backend`` takes ``graphkit_split`` (inductor) and
``graphkit_split_eager`` (aot_eager) on every model, FlexAttention ones included. It prints one line saying
so. See docs/torchtitan.md for the configuration keys, what to expect and how to check the gradients.

Needs torchtitan 0.3.0 (``bash scripts/setup.sh --torchtitan``); without it, the script says what to install
and exits with status 1.
"""

from __future__ import annotations

import sys

from graphkit.integrations import torchtitan as graphkit_torchtitan


def main() -> int:
    only_install = "--only-install" in sys.argv
    sys.argv = [argument for argument in sys.argv if argument != "--only-install"]
    try:
        graphkit_torchtitan.install()  # says what it changed, in one line
    except graphkit_torchtitan.TorchtitanIntegrationError as error:
        print(f"torchtitan_train.py: {error}", file=sys.stderr)
        return 1
    if only_install:
        return 0
    from torchtitan.train import main as torchtitan_main

    torchtitan_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
