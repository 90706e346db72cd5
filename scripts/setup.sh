#!/usr/bin/env bash
# Set up graphkit in ./.venv. Safe to run again: each step runs only when its result is missing or stale.
#
#   bash scripts/setup.sh          graphkit with the command-line and Hugging Face extras
#   bash scripts/setup.sh --dev    also the test, lint and notebook extras
#
# Steps:
#   1. Debian's `graphviz` (the `dot` binary) with apt-get, when `dot` is not on PATH; also `python3-venv`
#      when the Python interpreter cannot create virtual environments.
#   2. A virtual environment in .venv (from $GRAPHKIT_PYTHON, default python3; Python 3.11 or newer).
#   3. A CPU build of torch, when the environment cannot import torch: `pip install torch==2.13.0`
#      (pip's configured wheel folder on these machines has that CPU build); set GRAPHKIT_TORCH_SPEC to
#      another requirement (e.g. "torch==2.5.1+cpu") to override.
#   4. `pip install -e ".[EXTRAS]"`, skipped when .setup-stamp records the same pyproject.toml, extras, torch
#      requirement and folder.
# Nothing else is downloaded: no browsers, no model weights.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

extras="cli,models"
for argument in "$@"; do
    case "$argument" in
        --dev) extras="dev,models,notebook" ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "setup.sh: unknown argument '$argument' (use --dev or --help)" >&2
            exit 2
            ;;
    esac
done

say() { printf '[setup] %s\n' "$*"; }
# shellcheck source=scripts/apt_install.sh
source scripts/apt_install.sh
python_bin="${GRAPHKIT_PYTHON:-python3}"
torch_spec="${GRAPHKIT_TORCH_SPEC:-torch==2.13.0}"
venv=".venv"
stamp=".setup-stamp"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# 1. System packages --------------------------------------------------------------------------------------
apt_packages=()
if command -v dot >/dev/null 2>&1; then
    say "graphviz: $(command -v dot) is present"
else
    apt_packages+=(graphviz)
fi
if ! command -v "$python_bin" >/dev/null 2>&1; then
    apt_packages+=(python3 python3-venv)
    python_bin=python3
elif [[ ! -x "$venv/bin/python" ]] && ! "$python_bin" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    apt_packages+=(python3-venv)
fi
if ((${#apt_packages[@]})); then
    apt_install setup.sh "${apt_packages[@]}"
fi

# 2. Virtual environment ----------------------------------------------------------------------------------
if [[ -x "$venv/bin/python" ]] && ! "$venv/bin/python" -c 'pass' >/dev/null 2>&1; then
    say "$venv exists but its Python does not run: recreating it"
    rm -rf "$venv"
fi
if [[ -x "$venv/bin/python" ]]; then
    say "virtual environment: $venv is present"
else
    "$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "setup.sh: graphkit needs Python 3.11 or newer; $python_bin is $("$python_bin" -V 2>&1)." \
            "Set GRAPHKIT_PYTHON to a newer interpreter." >&2
        exit 1
    }
    say "$python_bin -m venv $venv"
    "$python_bin" -m venv "$venv"
    rm -f "$stamp"
fi
python="$venv/bin/python"

# 3. torch, CPU build -------------------------------------------------------------------------------------
if torch_version="$("$python" -W ignore -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
    say "torch: $torch_version is installed"
else
    say "pip install $torch_spec"
    "$python" -m pip install -q "$torch_spec"
    torch_version="$("$python" -W ignore -c 'import torch; print(torch.__version__)')"
fi

# 4. graphkit and its extras ------------------------------------------------------------------------------
fingerprint="$(
    {
        cat pyproject.toml
        printf 'extras=%s\ntorch=%s\nfolder=%s\n' "$extras" "$torch_spec" "$PWD"
    } | sha256sum | cut -d' ' -f1
)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$fingerprint" ]] &&
    "$python" -c 'import importlib.metadata as m; m.version("graphkit")' >/dev/null 2>&1; then
    say "graphkit[$extras]: up to date ($stamp matches)"
else
    say "pip install -e .[$extras]"
    "$python" -m pip install -q -e ".[$extras]"
    printf '%s\n' "$fingerprint" >"$stamp"
fi

say "ready: $venv/bin/graphkit (torch $torch_version)"
