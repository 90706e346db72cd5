"""Shared pytest set-up for graphkit's tests.

- ``--update-golden``: tests that compare output with files under ``tests/golden/`` rewrite those files
  instead (read it through the ``update_golden`` fixture), then fail nothing; review the diff with git.
- Hypothesis runs without deadlines (no timed unit tests): profile ``graphkit``, or the profile named by
  ``HYPOTHESIS_PROFILE``.
- The test process and what it starts keep glibc's allocator as it is (``GRAPHKIT_ALLOCATOR=default``,
  unless set): the commands run in-process here would otherwise tune pytest's own malloc, which then keeps
  every byte it ever held. The tests of :mod:`graphkit.measure.allocator` ask for ``tuned`` themselves.
- Every test gets its own ``GRAPHKIT_CACHE_DIR`` (not created until written): what one ``plan --run`` remembers
  (:mod:`graphkit.pipelining.remembered_error`) never reaches another test, nor the user's ``~/.cache``.
- Tests marked ``browser`` are skipped, with the reason, when no Chromium executable is installed, unless
  ``GRAPHKIT_REQUIRE_BROWSER=1`` is set (then they run and fail loudly).
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parent.parent

settings.register_profile(
    "graphkit",
    deadline=None,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "graphkit"))
os.environ.setdefault("GRAPHKIT_ALLOCATOR", "default")

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


@pytest.fixture(autouse=True)
def _own_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv(
        "GRAPHKIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / f"cache-{next(_CACHE_NUMBERS)}")
    )


_CACHE_NUMBERS = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files under tests/golden/ from the current output instead of comparing",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("GRAPHKIT_REQUIRE_BROWSER") == "1" or find_chromium() is not None:
        return
    skip = pytest.mark.skip(
        reason="needs Chromium: apt-get install chromium (or set GRAPHKIT_REQUIRE_BROWSER=1 to fail instead)"
    )
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


def find_chromium() -> str | None:
    """Path of an installed Chromium or Chrome executable, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the folder holding pyproject.toml)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when pytest runs with ``--update-golden``: golden-file tests write instead of compare."""
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="module")
def world_of_one():
    """One world-size-1 gloo process group for a module's one-process pipeline tests (no ports: a HashStore).

    Modules use it with ``pytestmark = pytest.mark.usefixtures("world_of_one")``; it is destroyed after the
    module, unless a group already existed.
    """
    from graphkit.pipelining.launcher import local_process_group

    with local_process_group():
        yield
