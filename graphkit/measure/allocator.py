"""The CPU memory allocator graphkit's own processes run under: glibc's malloc told to keep freed memory
for the next tensor, unless the user opts out.

Why: glibc's malloc serves a large block (above its ``mmap`` threshold, which adapts between 128 KiB and
32 MiB) from fresh ``mmap``'ed pages and gives them back on ``free``, so every first touch of every page of a
fresh tensor page-faults, step after step. A split backward holds more tensors between B and W and so
allocates more fresh memory; on ``zoo-pipeline:mlp_wide`` W alone took 2.28 ms under glibc's defaults and
0.70 ms with ``mmap`` and trimming off, and 2 pinned ranks ran ZBH1 at 1.08-1.10x 1F1B instead of
1.33-1.42x, with identical schedules agreeing to 1-2% instead of 2-4%. PyTorch's CPU performance tuning
guide recommends jemalloc or TCMalloc for the same reason, and ``python -m torch.backends.xeon.run_cpu``
preloads TCMalloc.

- :func:`tune_allocator` tunes the calling process through glibc's ``mallopt`` (``M_MMAP_MAX`` 0: no
  ``mmap``; ``M_TRIM_THRESHOLD`` -1: never give the heap's top back; ``M_TOP_PAD`` 1 GiB: grow the heap in
  large steps; the constants of ``<malloc.h>``) and sets :data:`TUNED_ENVIRONMENT` (``MALLOC_*_``) in
  ``os.environ``, so that the processes it starts start tuned. It leaves alone an allocator that is not
  glibc's: jemalloc, TCMalloc or mimalloc preloaded (``LD_PRELOAD``), or another platform's.
- :func:`current_allocator` says which allocator serves ``malloc`` in this process and how it is set, as
  an :class:`Allocator` whose ``str`` is one line for output.
- :func:`environment_for_processes` is what :func:`graphkit.pipelining.launcher.run_on_processes` starts
  its ranks in; :func:`tune_allocator_for_benchmark` is what the ``bench/`` scripts call first.

The user's choice is :data:`ALLOCATOR_VARIABLE` (``GRAPHKIT_ALLOCATOR``): ``tuned`` (the default) or
``default``, which leaves the allocator as the process started with it (glibc's defaults, unless the
user's own ``MALLOC_*_`` variables or ``LD_PRELOAD`` say otherwise). The cost of ``tuned``: a process keeps
the most memory it ever held until it ends.

An allocator is process-wide, so this module's record of what it did is too (one process, one record).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = [
    "ALLOCATOR_CHOICES",
    "ALLOCATOR_VARIABLE",
    "TUNED_ENVIRONMENT",
    "Allocator",
    "AllocatorError",
    "allocator_choice",
    "current_allocator",
    "environment_for_processes",
    "tune_allocator",
    "tune_allocator_for_benchmark",
    "untuned_allocator_warning",
]

ALLOCATOR_VARIABLE = "GRAPHKIT_ALLOCATOR"
"""The environment variable that says which allocator graphkit's processes run under."""

ALLOCATOR_CHOICES = ("tuned", "default")
"""``tuned``: glibc's malloc without ``mmap`` or trimming (the default); ``default``: left as it started."""

TUNED_ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": "17179869184",  # 16 GiB: no tensor of a stage comes from mmap
    "MALLOC_TRIM_THRESHOLD_": "17179869184",  # 16 GiB: freed memory stays for the next tensor
    "MALLOC_TOP_PAD_": "1073741824",  # 1 GiB: the heap grows in large steps
}
"""The variables glibc reads when a process starts (the same settings as :func:`tune_allocator`'s
``mallopt`` calls): put them on a ``torchrun`` command line to start your own ranks the same way."""

# <malloc.h>: the parameters of mallopt(int param, int value)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4

_TOP_PAD_BYTES = 1 << 30
_LARGE = 1 << 30  # a threshold at least this high counts as off: stage tensors stay below it
_PRELOADABLE = ("jemalloc", "tcmalloc", "mimalloc")


class AllocatorError(ValueError):
    """An unknown allocator choice (``GRAPHKIT_ALLOCATOR`` or ``--allocator``)."""


@dataclass(frozen=True, slots=True)
class Allocator:
    """Which allocator serves ``malloc`` in a process, and how it is set.

    ``name``: ``glibc``, ``jemalloc``, ``tcmalloc``, ``mimalloc`` or the library or platform that serves
    ``malloc``; ``settings``: what is tuned, in words (``("no mmap", "no trim")``); ``tuned_by``:
    ``graphkit`` (``mallopt`` in this process), ``environment`` (``MALLOC_*_`` or ``GLIBC_TUNABLES`` when
    the process started), ``preloaded`` or ``""``; ``fresh_pages``: large tensors come from fresh pages that
    page-fault on first touch (glibc's defaults), None where unknown; ``note``: why it is as it is (an
    opt-out, a failed ``mallopt``), or ``""``.
    """

    name: str
    settings: tuple[str, ...] = ()
    tuned_by: str = ""
    fresh_pages: bool | None = None
    note: str = ""

    @property
    def glibc_default(self) -> bool:
        """Whether this is glibc's malloc with fresh pages for large tensors (what graphkit tunes away)."""
        return self.name == "glibc" and bool(self.fresh_pages)

    def __str__(self) -> str:
        if self.name == "glibc":
            if self.fresh_pages:
                text = "glibc malloc, default: large tensors on fresh mmap'ed pages that page-fault on first touch"
                if self.settings:
                    text += f" (set: {', '.join(self.settings)})"
            else:
                by = " by MALLOC_* variables" if self.tuned_by == "environment" else ""
                text = f"glibc malloc, tuned{by}: {', '.join(self.settings)}"
        elif self.tuned_by == "preloaded":
            text = f"{self.name} (preloaded), left as it is"
        else:
            text = f"{self.name}, left as it is"
        return f"{text} ({self.note})" if self.note else text


@dataclass(slots=True)
class _Record:
    """What :func:`tune_allocator` did in this process."""

    tuned: bool = False
    failure: str = ""
    environment: dict[str, str] | None = None  # the variables it set, with the values it set


_RECORD = _Record()


def allocator_choice(choice: str | None = None) -> str:
    """``choice``, else ``GRAPHKIT_ALLOCATOR``, else ``"tuned"``: one of :data:`ALLOCATOR_CHOICES`.

    Raises:
        AllocatorError: a value that is not one of them (case and surrounding spaces do not matter).
    """
    source = "--allocator" if choice is not None else ALLOCATOR_VARIABLE
    value = choice if choice is not None else os.environ.get(ALLOCATOR_VARIABLE, "")
    normalized = value.strip().lower() or "tuned"
    if normalized not in ALLOCATOR_CHOICES:
        raise AllocatorError(
            f"{source}={value!r} is not an allocator choice: use tuned (glibc's malloc without mmap or "
            "trimming, the default) or default (the allocator left as the process started with it)"
        )
    return normalized


def _startup_environment() -> dict[str, str]:
    """The environment this process started with (what glibc read), else today's ``os.environ``."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _size(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def _bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def _glibc_settings_from(environment: dict[str, str]) -> tuple[bool, bool, list[str]]:
    """``(no_mmap, no_trim, words)`` of the malloc variables glibc read at start (``MALLOC_*_`` and
    ``GLIBC_TUNABLES``'s ``glibc.malloc.*``; the latter win, as in glibc)."""
    values = {
        "mmap_max": _size(environment.get("MALLOC_MMAP_MAX_")),
        "mmap_threshold": _size(environment.get("MALLOC_MMAP_THRESHOLD_")),
        "trim_threshold": _size(environment.get("MALLOC_TRIM_THRESHOLD_")),
    }
    for item in environment.get("GLIBC_TUNABLES", "").split(":"):
        key, _, value = item.partition("=")
        name = key.strip().removeprefix("glibc.malloc.")
        if key.strip().startswith("glibc.malloc.") and name in values:
            values[name] = _size(value)
    words = []
    no_mmap = values["mmap_max"] == 0 or (values["mmap_threshold"] or 0) >= _LARGE
    if values["mmap_max"] == 0:
        words.append("no mmap")
    elif values["mmap_threshold"] is not None:
        words.append(f"mmap above {_bytes(values['mmap_threshold'])}")
    no_trim = (values["trim_threshold"] or 0) >= _LARGE
    if values["trim_threshold"] is not None:
        words.append(f"trim above {_bytes(values['trim_threshold'])}")
    return no_mmap, no_trim, words


def _library_serving_malloc() -> str | None:
    """The path of the shared library whose ``malloc`` this process calls (``/proc/self/maps``), or None."""
    try:
        address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
        lines = Path("/proc/self/maps").read_text().splitlines()
    except (OSError, AttributeError, TypeError):  # no /proc (macOS), no C library by the name None (Windows)
        return None
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or address is None:
            continue
        start, _, end = fields[0].partition("-")
        if int(start, 16) <= address < int(end, 16):
            return fields[5].strip()
    return None


def _is_glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    except (OSError, TypeError):  # no C library to open by the name None (Windows)
        return False


def current_allocator() -> Allocator:
    """Which allocator serves ``malloc`` in this process and how it is set (reads, changes nothing).

    glibc's malloc counts as tuned when :func:`tune_allocator` tuned it here, or when it started with
    ``mmap`` off (``MALLOC_MMAP_MAX_=0`` or a threshold of 1 GiB or more) and trimming off (a threshold of
    1 GiB or more), from ``MALLOC_*_`` or ``GLIBC_TUNABLES``.
    """
    library = _library_serving_malloc()
    base = Path(library).name if library else ""
    preload = os.environ.get("LD_PRELOAD", "") + " " + os.environ.get("DYLD_INSERT_LIBRARIES", "")
    for name in _PRELOADABLE:
        if name in base or (not library and name in preload):
            return Allocator(name, tuned_by="preloaded")
    if not _is_glibc() or (library and not base.startswith("libc")):
        platform = {"darwin": "macOS", "win32": "Windows"}.get(sys.platform, sys.platform)
        return Allocator(f"{base or 'the platform'}'s malloc (not glibc, {platform})")
    if _RECORD.tuned:
        return Allocator("glibc", ("no mmap", "no trim"), "graphkit", fresh_pages=False)
    no_mmap, no_trim, words = _glibc_settings_from(_startup_environment())
    tuned = no_mmap and no_trim
    return Allocator(
        "glibc",
        tuple(words),
        "environment" if words else "",
        fresh_pages=not tuned,
        note=_RECORD.failure,
    )


def tune_allocator(choice: str | None = None) -> Allocator:
    """Tune this process's glibc malloc so that fresh tensors reuse freed memory; returns what it runs under.

    With ``choice`` (else ``GRAPHKIT_ALLOCATOR``, else ``tuned``) ``"tuned"`` on glibc: ``mallopt``
    ``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` -1 (never trim), ``M_TOP_PAD`` 1 GiB, in place (no restart), and
    :data:`TUNED_ENVIRONMENT` set in ``os.environ`` for the processes this one starts. Blocks this process
    already holds on ``mmap``'ed pages keep them until freed; from then on the heap serves every size. With
    ``"default"``, or an allocator that is not glibc's (preloaded jemalloc, TCMalloc, mimalloc, another
    platform), nothing changes. Calling it again is cheap and changes nothing more.

    Returns:
        :func:`current_allocator` afterwards; its ``note`` says why it was left as it is (the opt-out, a
        ``mallopt`` that glibc refused).

    Raises:
        AllocatorError: an unknown ``choice`` or ``GRAPHKIT_ALLOCATOR``.
    """
    source = f"{ALLOCATOR_VARIABLE}=default" if choice is None else "allocator='default'"
    choice = allocator_choice(choice)
    before = current_allocator()
    if choice == "default":
        if before.glibc_default and not before.note:  # say why it stays so
            return Allocator(before.name, before.settings, before.tuned_by, before.fresh_pages, source)
        return before
    if before.name != "glibc":
        return before
    if not _RECORD.tuned:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
        for parameter, name, value in (
            (M_MMAP_MAX, "M_MMAP_MAX", 0),
            (M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD", -1),
            (M_TOP_PAD, "M_TOP_PAD", _TOP_PAD_BYTES),
        ):
            if libc.mallopt(parameter, value) != 1:
                _RECORD.failure = f"tuning failed: glibc refused mallopt({name}, {value})"
                return current_allocator()
        _RECORD.tuned = True
        _RECORD.failure = ""
    os.environ.update(TUNED_ENVIRONMENT)
    _RECORD.environment = dict(TUNED_ENVIRONMENT)
    return current_allocator()


@contextlib.contextmanager
def environment_for_processes(choice: str | None = None) -> Iterator[str]:
    """For the duration, processes started from this one start under ``choice`` (resolved as
    :func:`allocator_choice` does, and yielded): ``tuned`` sets :data:`TUNED_ENVIRONMENT`, which glibc reads
    when a process starts; ``default`` removes the variables :func:`tune_allocator` set in this process
    (the user's own stay). ``os.environ`` is restored afterwards. Changes nothing where malloc is not glibc's.

    Raises:
        AllocatorError: an unknown ``choice`` or ``GRAPHKIT_ALLOCATOR`` (before anything changes).
    """
    choice = allocator_choice(choice)
    if current_allocator().name != "glibc":
        yield choice
        return
    saved = {key: os.environ.get(key) for key in TUNED_ENVIRONMENT}
    try:
        if choice == "tuned":
            os.environ.update(TUNED_ENVIRONMENT)
        else:
            for key, value in (_RECORD.environment or {}).items():
                if os.environ.get(key) == value:
                    del os.environ[key]
        yield choice
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def untuned_allocator_warning(allocator: Allocator | None = None) -> str | None:
    """A sentence for processes that measure under glibc's defaults (``allocator``, else this process's),
    or None where the allocator reuses freed memory."""
    allocator = allocator if allocator is not None else current_allocator()
    if not allocator.glibc_default:
        return None
    why = f" ({allocator.note})" if allocator.note else ""
    return (
        f"the processes that measure run under glibc malloc's defaults{why}: large tensors come from fresh "
        "mmap'ed pages that page-fault on first touch, so W and the splitting schedules measure slower and "
        "rounds of one schedule differ more (zoo-pipeline:mlp_wide, 2 ranks: ZBH1 1.33-1.42x 1F1B, against "
        "1.08-1.10x tuned); leave GRAPHKIT_ALLOCATOR unset and --allocator out, or preload jemalloc or TCMalloc"
    )


def tune_allocator_for_benchmark(stream: TextIO | None = None) -> Allocator:
    """What a ``bench/`` script calls first: :func:`tune_allocator`, and one line on ``stream`` (stderr)
    saying which allocator the figures were taken under."""
    allocator = tune_allocator()
    print(f"allocator: {allocator}", file=stream if stream is not None else sys.stderr, flush=True)
    return allocator
