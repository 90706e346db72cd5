#!/usr/bin/env bash
# Run the real-browser test: JupyterLab runs notebooks/01_param_groups.ipynb in headless Chromium.
#
#   bash scripts/browser_test.sh      (after `bash scripts/setup.sh --dev`; .ci/run calls it last)
#
# Steps:
#   1. Debian's `chromium` with apt-get, when no Chromium is on PATH (as root, or with sudo).
#      Playwright drives that browser; it never downloads one of its own.
#   2. `pytest -m browser tests/test_browser.py` with GRAPHKIT_REQUIRE_BROWSER=1, so a missing browser or
#      Playwright fails the run instead of skipping. The screenshot lands in test-artifacts/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '[browser] %s\n' "$*"; }
# shellcheck source=scripts/apt_install.sh
source scripts/apt_install.sh
python=".venv/bin/python"
if [[ ! -x "$python" ]]; then
    echo "browser_test.sh: $python is missing; run 'bash scripts/setup.sh --dev' first" >&2
    exit 1
fi

# 1. Chromium --------------------------------------------------------------------------------------------
if chromium="$(command -v chromium || command -v chromium-browser)"; then
    say "chromium: $chromium is present"
else
    apt_install browser_test.sh chromium
fi

# 2. The test --------------------------------------------------------------------------------------------
say "pytest -m browser tests/test_browser.py"
status=0
GRAPHKIT_REQUIRE_BROWSER=1 timeout 300 "$python" -m pytest -q -m browser -p no:cacheprovider \
    tests/test_browser.py </dev/null || status=$?
if [[ $status -eq 5 ]]; then
    echo "browser_test.sh: pytest collected no browser test (exit 5): treated as a failure" >&2
    exit 1
fi
exit "$status"
