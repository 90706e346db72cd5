"""The prediction error an earlier ``graphkit plan --run`` measured, remembered for the next plan of the same set-up.

``plan --run`` chooses what to record from predictions made before anything is recorded: every schedule
predicted within the prediction's error of the best (:func:`~graphkit.pipelining.record_selection.choose_recorded`).
That error is known only after a run: the run compares each recorded schedule's predicted ratio to 1F1B
with its measured one (``SchedulePlan.selection_error``). The calibration's leave-one-out errors belong to
the calibrated predictions, which need recorded steps; the choice uses the uncalibrated ones, so the band
it needs is their error. This module keeps the worst such error of each of the last
:data:`REMEMBERED_RUNS` runs per set-up (pipeline spec, ranks, microbatches, batch size, threads, pinning)
in one small JSON file, so that the next ``plan --run`` of the same set-up allows each prediction the
largest of them, not a guess. One run's worst error alone moves too much to trust: on GPT-2 with 8
microbatches three runs measured 8.8%, 3.9% and 7.2%, and the band cut to 5% after the second left out
ZBVZeroBubble, the schedule a separate comparison had measured fastest.

The file is ``$GRAPHKIT_CACHE_DIR/prediction_errors.json``, else under ``$XDG_CACHE_HOME/graphkit/``, else
``~/.cache/graphkit/``. Delete it to forget; ``--prediction-error`` overrides it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

__all__ = [
    "LEAST_REMEMBERED_ERROR",
    "REMEMBERED_RUNS",
    "error_from_measured",
    "errors_file",
    "recording_band",
    "remember_error",
    "remembered_error",
    "setup_key",
]

REMEMBERED_RUNS = 5
"""How many of the latest runs' worst errors are kept per set-up; the band is the largest of them."""

LEAST_REMEMBERED_ERROR = 0.05
"""The narrowest band a remembered error gives: a run measures the error among the schedules it recorded
only, so a band cut to that error would leave out more next time, and measure less of it."""

_FILE_NAME = "prediction_errors.json"


def errors_file() -> Path:
    """Where remembered errors are kept (see the module's text); the file may not exist yet."""
    folder = os.environ.get("GRAPHKIT_CACHE_DIR")
    if folder:
        return Path(folder) / _FILE_NAME
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "graphkit" / _FILE_NAME


def setup_key(
    pipeline: str, ranks: int, microbatches: int, batch_size: int, threads: int, pin_cores: bool
) -> str:
    """The set-up a prediction error belongs to, as one string: a change of any of these changes the costs
    or the runtime the prediction misses."""
    pinned = "pinned" if pin_cores else "unpinned"
    return f"{pipeline} | ranks={ranks} microbatches={microbatches} batch={batch_size} threads={threads} {pinned}"


def error_from_measured(worst: float) -> float:
    """The error to allow each prediction, from the worst one measured: rounded up to the next whole
    percent, at least :data:`LEAST_REMEMBERED_ERROR` (a fraction: 0.07 for 7%). The recording band it gives
    is :func:`recording_band` of it."""
    return max(LEAST_REMEMBERED_ERROR, math.ceil(worst * 100 - 1e-9) / 100)


def recording_band(prediction_error: float) -> float:
    """The fraction of the best predicted step within which schedules are recorded, for predictions each
    off by up to ``prediction_error`` (a fraction of the step): ``(1 + e) / (1 - e) - 1``, within which a
    schedule predicted too slow by ``e`` and one predicted too fast by ``e`` swap order; 0.22 for 0.10, 0.11
    for 0.05; infinite from 1 on (any order possible).

    Raises:
        ValueError: ``prediction_error`` below 0.
    """
    if prediction_error < 0:
        raise ValueError(f"prediction_error must be at least 0, got {prediction_error}")
    if prediction_error >= 1:
        return math.inf
    return (1.0 + prediction_error) / (1.0 - prediction_error) - 1.0


def _read(path: Path) -> dict[str, dict[str, object]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or unreadable: nothing remembered (the next run writes it again)
    return data if isinstance(data, dict) else {}


def remembered_error(key: str, path: Path | None = None) -> tuple[float, str] | None:
    """``(band, where from)`` for ``key`` (:func:`setup_key`): the band the largest of the worst errors
    measured by the last :data:`REMEMBERED_RUNS` ``plan --run`` of this set-up gives
    (:func:`error_from_measured`), and a phrase saying so; None when none was remembered (or the file
    cannot be read)."""
    path = path or errors_file()
    runs = _runs(_read(path).get(key))
    if not runs:
        return None
    worst, schedule = max(runs)
    count = f"the last {len(runs)} runs" if len(runs) > 1 else "the last run"
    return (
        error_from_measured(worst),
        f"the worst error {count} of this plan measured ({worst:.1%}, {schedule}; "
        f"remembered in {path}), at least {LEAST_REMEMBERED_ERROR:.0%}",
    )


def _runs(entry: object) -> list[tuple[float, str]]:
    """``(worst, schedule)`` of each remembered run of one set-up, oldest first; what is unreadable is left out."""
    if isinstance(entry, dict) and "worst" in entry:  # one run, as the first graphkit to remember wrote it
        entry = {"runs": [entry]}
    listed = entry.get("runs") if isinstance(entry, dict) else None
    runs = []
    for run in listed if isinstance(listed, list) else []:
        worst = run.get("worst") if isinstance(run, dict) else None
        if isinstance(worst, int | float) and math.isfinite(worst) and worst >= 0:
            runs.append((float(worst), str(run.get("schedule", "a schedule"))))
    return runs


def remember_error(key: str, worst: float, schedule: str, path: Path | None = None) -> Path | None:
    """Keep ``worst`` (the fraction a run's prediction was off at worst, by ``schedule``) for ``key``, after
    the runs remembered before it (the last :data:`REMEMBERED_RUNS` are kept).

    Returns the file written, or None when it cannot be written (a read-only home: the plan goes on
    without remembering; its output still prints the error)."""
    path = path or errors_file()
    data = _read(path)
    runs = [*_runs(data.get(key)), (float(worst), schedule)][-REMEMBERED_RUNS:]
    data[key] = {"runs": [{"worst": value, "schedule": name} for value, name in runs]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(data, indent=1, sort_keys=True))
        temporary.replace(path)  # whole or not at all, with plans running side by side
    except OSError:
        return None
    return path
