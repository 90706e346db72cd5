"""torchtitan with graphkit's split backward: one call, :func:`install`, before torchtitan builds its model.

torchtitan (PyTorch's LLM training platform) builds its pipeline stages in
``torchtitan.distributed.pipeline_parallel`` (``pipeline_llm`` -> ``_pipeline_module_split``, which looks up
the module-level name ``PipelineStage``) and compiles each transformer block with ``compile.backend``
(``torchtitan.distributed.compile.apply_compile``, which first asks ``_maybe_regional_inductor_backend`` for
the backend). :func:`install` changes two names there, and nothing else:

1. ``torchtitan.distributed.pipeline_parallel.PipelineStage`` becomes
   :class:`graphkit.pipelining.PipelineStage`, so every schedule torchtitan builds (``ZBVZeroBubble``,
   ``InterleavedZeroBubble``, ``DualPipeV``, a CSV schedule, and the others) runs its I actions as graphkit's
   B and its W actions as graphkit's W: exact gradients where PyTorch's stage crashes on compiled blocks
   ("donated buffers") or leaves FSDP2's ``norm.weight`` without a gradient;
2. ``torchtitan.distributed.compile._maybe_regional_inductor_backend`` passes ``"graphkit_split"`` and
   ``"graphkit_split_eager"`` through as they are (registered with dynamo), on every model; torchtitan's own
   function raises ``ValueError`` for any backend but ``inductor`` and ``aot_eager`` on a FlexAttention
   model. Other backend names still go to torchtitan's function.

It then logs one line (torchtitan's logger; printed when that logger does not show INFO yet, as before
torchtitan's ``init_logger()``) that says what it changed. Calling it again changes nothing.

Tested with torchtitan :data:`SUPPORTED_TORCHTITAN` (``tests/test_torchtitan.py`` pins both names and how
torchtitan looks them up). Another release is used when it still has what is patched, and refused with
:class:`TorchtitanIntegrationError`, naming both releases, when it lacks it.

Usage (a launcher that wraps ``torchtitan.train``: ``examples/torchtitan_train.py``)::

    from graphkit.integrations import torchtitan as graphkit_torchtitan

    graphkit_torchtitan.install()
    # then torchtitan's own entry point, e.g. torchtitan.train.main(...), with
    # --parallelism.pipeline_parallel_schedule ZBVZeroBubble --compile.enable --compile.backend graphkit_split
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from graphkit.pipelining.stage import PipelineStage
from graphkit.split.compile_backend import register_backends

__all__ = [
    "GRAPHKIT_BACKENDS",
    "SUPPORTED_TORCHTITAN",
    "Installation",
    "TorchtitanIntegrationError",
    "install",
    "installed",
    "uninstall",
]

SUPPORTED_TORCHTITAN = "0.3.0"
"""The torchtitan release graphkit's tests run :func:`install` against."""

GRAPHKIT_BACKENDS = ("graphkit_split", "graphkit_split_eager")
"""The ``compile.backend`` values :func:`install` makes torchtitan accept on every model."""

_PIPELINE_MODULE = "torchtitan.distributed.pipeline_parallel"
_STAGE_NAME = "PipelineStage"
_STAGE_USER = "_pipeline_module_split"  # the function that builds the stages by the module-level name
_COMPILE_MODULE = "torchtitan.distributed.compile"
_BACKEND_CHOOSER = "_maybe_regional_inductor_backend"
_BACKEND_USER = "apply_compile"  # the function that asks the chooser by the module-level name


class TorchtitanIntegrationError(RuntimeError):
    """The installed torchtitan lacks what :func:`install` patches, or torchtitan is not installed."""


@dataclass(slots=True)
class Installation:
    """What :func:`install` changed: ``changes``, one line each; ``summary``, the line it logged."""

    torchtitan_version: str
    changes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        return f"graphkit on torchtitan {self.torchtitan_version}: " + "; ".join(self.changes)


_lock = threading.Lock()
_installation: Installation | None = None
_originals: dict[str, Any] = {}


def _torchtitan_modules() -> tuple[str, Any, Any]:
    try:
        import torchtitan
        import torchtitan.distributed.compile as compile_module
        import torchtitan.distributed.pipeline_parallel as pipeline_module
    except ImportError as error:
        raise TorchtitanIntegrationError(
            f"graphkit.integrations.torchtitan needs torchtitan ({error}); install torchtitan=="
            f"{SUPPORTED_TORCHTITAN} without re-resolving torch: pip install --no-deps "
            f"torchtitan=={SUPPORTED_TORCHTITAN} (scripts/setup.sh --torchtitan installs it with the "
            "packages it needs)"
        ) from error
    return getattr(torchtitan, "__version__", "unknown"), pipeline_module, compile_module


def _missing(pipeline_module: Any, compile_module: Any) -> list[str]:
    """What :func:`install` patches and the installed torchtitan lacks (an empty list: all there)."""
    missing = []
    for module, name, user in (
        (pipeline_module, _STAGE_NAME, _STAGE_USER),
        (compile_module, _BACKEND_CHOOSER, _BACKEND_USER),
    ):
        if not hasattr(module, name):
            missing.append(f"{module.__name__}.{name}")
        code = getattr(getattr(module, user, None), "__code__", None)
        if code is None:
            missing.append(f"{module.__name__}.{user}")
        elif name not in code.co_names:
            missing.append(f"{module.__name__}.{user} looking up {name} by its module-level name")
    return missing


def _backend_chooser(original: Any) -> Any:
    def choose_backend(model: Any, backend: Any) -> Any:
        """torchtitan's ``_maybe_regional_inductor_backend``, with graphkit's backend names passed through."""
        if isinstance(backend, str) and backend in GRAPHKIT_BACKENDS:
            return backend
        return original(model, backend)

    choose_backend.__wrapped__ = original  # type: ignore[attr-defined]
    choose_backend.__name__ = original.__name__
    return choose_backend


def install() -> Installation:
    """Make torchtitan's pipeline use graphkit's stage and accept graphkit's compile backends (module docstring).

    Call it once in the launcher, before torchtitan builds its model (before ``Trainer(...)``). Idempotent:
    later calls change nothing and return the first call's :class:`Installation`.

    Returns:
        What it changed; its ``summary`` is the one line it logged through torchtitan's logger (or printed).

    Raises:
        TorchtitanIntegrationError: torchtitan is not installed, or the installed release lacks a name it
            patches (the message names that release, :data:`SUPPORTED_TORCHTITAN` and what is missing).
    """
    global _installation
    with _lock:
        if _installation is not None:
            return _installation
        version, pipeline_module, compile_module = _torchtitan_modules()
        missing = _missing(pipeline_module, compile_module)
        if missing:
            raise TorchtitanIntegrationError(
                f"graphkit.integrations.torchtitan.install() supports torchtitan {SUPPORTED_TORCHTITAN}; the "
                f"installed torchtitan {version} lacks {', '.join(missing)}. Install torchtitan=="
                f"{SUPPORTED_TORCHTITAN}, or build graphkit.pipelining.PipelineStage yourself"
            )
        register_backends()
        _originals[_STAGE_NAME] = getattr(pipeline_module, _STAGE_NAME)
        _originals[_BACKEND_CHOOSER] = getattr(compile_module, _BACKEND_CHOOSER)
        setattr(pipeline_module, _STAGE_NAME, PipelineStage)
        setattr(compile_module, _BACKEND_CHOOSER, _backend_chooser(_originals[_BACKEND_CHOOSER]))
        installation = Installation(
            version,
            [
                f"{_PIPELINE_MODULE}.{_STAGE_NAME} is graphkit.pipelining.PipelineStage "
                "(I and W actions run graphkit's split backward)",
                f"compile.backend {' / '.join(GRAPHKIT_BACKENDS)} accepted on every model, FlexAttention "
                f"ones included ({_COMPILE_MODULE}.{_BACKEND_CHOOSER} passes them through)",
            ],
        )
        from torchtitan.tools.logging import logger

        if logger.isEnabledFor(logging.INFO):
            logger.info(installation.summary)
        else:  # before torchtitan's init_logger(): the root logger drops INFO
            print(installation.summary, flush=True)
        _installation = installation
        return installation


def installed() -> Installation | None:
    """What :func:`install` changed, or None when it has not run (or :func:`uninstall` undid it)."""
    return _installation


def uninstall() -> None:
    """Put back the names :func:`install` replaced (nothing when it has not run)."""
    global _installation
    with _lock:
        if _installation is None:
            return
        _, pipeline_module, compile_module = _torchtitan_modules()
        setattr(pipeline_module, _STAGE_NAME, _originals.pop(_STAGE_NAME))
        setattr(compile_module, _BACKEND_CHOOSER, _originals.pop(_BACKEND_CHOOSER))
        _installation = None
