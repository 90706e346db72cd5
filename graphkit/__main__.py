"""``python -m graphkit``: the same command line as the ``graphkit`` command."""

from __future__ import annotations

from graphkit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
