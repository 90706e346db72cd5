#!/usr/bin/env bash
# Set up graphkit in ./.venv. Safe to run again: each step runs only when its result is missing or stale.
#
#   bash scripts/setup.sh                 graphkit with the command-line and Hugging Face extras
#   bash scripts/setup.sh --dev           also the test, lint and notebook extras
#   bash scripts/setup.sh --venv DIR      set up the environment DIR instead of .venv (or GRAPHKIT_VENV=DIR)
#   bash scripts/setup.sh --torchtitan    also torchtitan 0.3.0, for graphkit.integrations.torchtitan
#
#   GRAPHKIT_TORCH_SPEC=newest bash scripts/setup.sh --dev --venv .venv-newest
#                                         the newest torch release on the package index (what CI tests too)
#
# Steps:
#   1. Debian's `graphviz` (the `dot` binary) with apt-get, when `dot` is not on PATH; also `python3-venv`
#      when the Python interpreter cannot create virtual environments.
#   2. A virtual environment in .venv (from $GRAPHKIT_PYTHON, default python3; Python 3.11 or newer).
#   3. A CPU build of torch, when the environment cannot import torch: `pip install torch==2.13.0`
#      (pip's configured wheel folder on these machines has that CPU build); set GRAPHKIT_TORCH_SPEC to
#      another requirement (e.g. "torch==2.5.1+cpu") to override. When GRAPHKIT_TORCH_SPEC is set, torch
#      is also reinstalled when the installed one does not satisfy it.
#      GRAPHKIT_TORCH_SPEC=newest asks the package index for its newest torch release and installs exactly
#      that (the registry's build: on Linux a CUDA build of several GB, which runs on CPU too). pip runs
#      without its configuration files (PIP_CONFIG_FILE=/dev/null) for that environment's installs, as a
#      machine's pip configuration may cap torch's version; /etc/xdg/pip and the other environments keep it.
#      With under 10 GiB free on the environment's disk it warns first (pip would end with "No space left on
#      device" alone).
#   4. `pip install -e ".[EXTRAS]"`, skipped when the stamp (.setup-stamp for .venv, DIR/.setup-stamp for
#      --venv DIR) records the same pyproject.toml, extras, torch requirement and folder.
#   5. With --torchtitan: `pip install --no-deps torchtitan==0.3.0` and the packages its model, pipeline and
#      compile code import (einops, tyro with docstring_parser, typeguard and shtab, safetensors,
#      spmd_types==0.2.3, torchdata, torch_checkpointing, tokenizers), all with --no-deps so that pip never
#      resolves torch again (a machine's cap would pull it back); datasets, wandb and tensorboard are left
#      out. Skipped when torchtitan 0.3.0 and those packages import. scripts/test_newest_torch.sh passes it.
# Nothing else is downloaded: no browsers, no model weights.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

extras="cli,models"
venv="${GRAPHKIT_VENV:-.venv}"
with_torchtitan=""
while (($#)); do
    argument="$1"
    shift
    case "$argument" in
        --dev) extras="dev,models,notebook" ;;
        --venv)
            if (($# == 0)) || [[ -z "$1" ]]; then
                echo "setup.sh: --venv needs a folder" >&2
                exit 2
            fi
            venv="$1"
            shift
            ;;
        --venv=*) venv="${argument#--venv=}" ;;
        --torchtitan) with_torchtitan=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "setup.sh: unknown argument '$argument' (use --dev, --venv DIR, --torchtitan or --help)" >&2
            exit 2
            ;;
    esac
done

say() { printf '[setup] %s\n' "$*"; }
# shellcheck source=scripts/apt_install.sh
source scripts/apt_install.sh
python_bin="${GRAPHKIT_PYTHON:-python3}"
torch_spec="${GRAPHKIT_TORCH_SPEC:-torch==2.13.0}"
requested_torch_spec="$torch_spec" # "newest" stays "newest" in the stamp, whichever release it is
venv="${venv%/}"
if [[ "$venv" == .venv ]]; then
    stamp=".setup-stamp"
else
    stamp="$venv/.setup-stamp"
fi
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
# pip in the environment; for GRAPHKIT_TORCH_SPEC=newest without the machine's pip configuration files, so
# that a configured cap on torch neither blocks the newest release nor downgrades it on later installs.
without_pip_config=""
if [[ "$torch_spec" == newest ]]; then
    without_pip_config=1
fi
run_pip() {
    if [[ -n "$without_pip_config" ]]; then
        PIP_CONFIG_FILE=/dev/null "$python" -m pip "$@"
    else
        "$python" -m pip "$@"
    fi
}

# 3. torch, CPU build -------------------------------------------------------------------------------------
if [[ "$torch_spec" == newest ]]; then
    say "pip index versions torch (newest release, pip configuration files ignored)"
    newest="$(
        run_pip index versions torch 2>/dev/null | sed -n 's/^torch (\(.*\))$/\1/p'
    )" || true
    if [[ -n "$newest" ]]; then
        torch_spec="torch==$newest"
        say "newest torch release: $newest"
    else
        # Offline, say: keep whichever torch is installed, or let pip try (and fail with its own message).
        say "the package index did not answer: keeping the installed torch, if any"
        torch_spec="torch"
    fi
fi
# Prints the installed torch's version; exit status 1: no torch, 3: it does not satisfy the requirement.
check_torch='
import sys
import torch
print(torch.__version__)
if len(sys.argv) > 1:
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    try:
        wanted = Requirement(sys.argv[1])
    except InvalidRequirement:  # a wheel file or URL: its version is not known before installing it
        sys.exit(0)
    if not wanted.url and not wanted.specifier.contains(torch.__version__, prereleases=True):
        sys.exit(3)
'
torch_arguments=()
if [[ -n "${GRAPHKIT_TORCH_SPEC:-}" ]]; then
    torch_arguments=("$torch_spec")
fi
torch_status=0
torch_version="$("$python" -W ignore -c "$check_torch" "${torch_arguments[@]}" 2>/dev/null)" || torch_status=$?
if ((torch_status == 0)); then
    say "torch: $torch_version is installed"
else
    if ((torch_status == 3)); then
        say "torch: $torch_version is installed but $torch_spec is asked for"
    fi
    if [[ "$requested_torch_spec" == newest ]]; then
        # the index's build of torch is a CUDA one: 6 GB in the environment, and its wheels beside it while
        # pip unpacks them; short of space, pip ends with "No space left on device" alone
        free_kib="$(df --output=avail -k "$venv" 2>/dev/null | awk 'NR == 2 { print $1 }' 2>/dev/null)" ||
            free_kib=""
        if [[ "$free_kib" =~ ^[0-9]{1,15}$ ]] && ((10#$free_kib < 10 * 1024 * 1024)); then
            free_gib="$(awk -v kib="$free_kib" 'BEGIN { printf "%.1f", kib / 1048576 }')"
            say "warning: $free_gib GiB free on the disk of $venv; $torch_spec from the index (a CUDA build)" \
                "takes about 10 GiB while it installs: free some, or give --venv a folder on a larger disk"
        fi
    fi
    say "pip install $torch_spec"
    run_pip install -q "$torch_spec"
    torch_version="$("$python" -W ignore -c 'import torch; print(torch.__version__)')"
fi

# 4. graphkit and its extras ------------------------------------------------------------------------------
fingerprint="$(
    {
        cat pyproject.toml
        printf 'extras=%s\ntorch=%s\nfolder=%s\n' "$extras" "$requested_torch_spec" "$PWD"
    } | sha256sum | cut -d' ' -f1
)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$fingerprint" ]] &&
    "$python" -c 'import importlib.metadata as m; m.version("graphkit")' >/dev/null 2>&1; then
    say "graphkit[$extras]: up to date ($stamp matches)"
else
    say "pip install -e .[$extras]"
    run_pip install -q -e ".[$extras]"
    printf '%s\n' "$fingerprint" >"$stamp"
fi

# 5. torchtitan ---------------------------------------------------------------------------------------------
torchtitan_packages=(
    torchtitan==0.3.0 einops tyro docstring_parser typeguard shtab safetensors spmd_types==0.2.3 torchdata
    torch_checkpointing tokenizers
)
check_torchtitan='
import importlib, importlib.metadata, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
sys.exit(importlib.metadata.version("torchtitan") != "0.3.0")
'
if [[ -n "$with_torchtitan" ]]; then
    if "$python" -W ignore -c "$check_torchtitan" torchtitan einops tyro docstring_parser typeguard shtab \
        safetensors spmd_types torchdata torch_checkpointing tokenizers >/dev/null 2>&1; then
        say "torchtitan: 0.3.0 is installed"
    else
        say "pip install --no-deps ${torchtitan_packages[*]}"
        run_pip install -q --no-deps "${torchtitan_packages[@]}"
    fi
fi

say "ready: $venv/bin/graphkit (torch $torch_version)"
