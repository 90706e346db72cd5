"""Adapters for the frameworks users train with: thin, each imported on its own and lazily.

- :mod:`graphkit.integrations.torchtitan`: ``install()`` makes torchtitan's pipeline parallelism use
  graphkit's stage and accept graphkit's compile backends.

Importing this package imports no framework; each adapter imports its framework when called.
"""

from __future__ import annotations

__all__: list[str] = []
