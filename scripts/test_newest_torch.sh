#!/usr/bin/env bash
# Run graphkit's tests on the newest torch release, in a second environment, .venv-newest.
#
#   bash scripts/test_newest_torch.sh               the whole suite (CI runs it after the README's test command)
#   bash scripts/test_newest_torch.sh -x tests/test_zoo.py    other pytest arguments instead of -q
#
# Steps:
#   1. `GRAPHKIT_TORCH_SPEC=newest bash scripts/setup.sh --dev --torchtitan --venv .venv-newest`: asks the
#      package index for its newest torch release and installs it (the registry's build, several GB; it runs
#      on CPU) with pip's configuration files ignored for that environment only, since a machine's pip
#      configuration may cap torch; then torchtitan 0.3.0 and the packages it imports, with --no-deps (torch is
#      never resolved again), for tests/test_torchtitan.py. Run again, it only asks the index and checks the
#      imports: an environment with that torch and torchtitan is kept as it is.
#   2. `.venv-newest/bin/python -m pytest -q`, or pytest with the arguments given.
# Set GRAPHKIT_NEWEST_VENV to use another folder.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="${GRAPHKIT_NEWEST_VENV:-.venv-newest}"
say() { printf '[newest-torch] %s\n' "$*"; }

say "GRAPHKIT_TORCH_SPEC=newest bash scripts/setup.sh --dev --torchtitan --venv $venv"
GRAPHKIT_TORCH_SPEC=newest bash scripts/setup.sh --dev --torchtitan --venv "$venv"

arguments=("$@")
if ((${#arguments[@]} == 0)); then
    arguments=(-q)
fi
say "$venv/bin/python -m pytest ${arguments[*]}"
status=0
"$venv/bin/python" -m pytest "${arguments[@]}" </dev/null || status=$?
if [[ $status -eq 5 ]]; then
    echo "test_newest_torch.sh: pytest collected no tests (exit 5): treated as a failure" >&2
    exit 1
fi
exit "$status"
