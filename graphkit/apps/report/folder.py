"""The report folder of ``graphkit inspect``: ``report.json``, ``index.html``, the diagram and the graph.

:func:`inspect` is the whole command: collect (:func:`~graphkit.apps.report.inspection.collect`), write
the folder (:func:`write_report`), print the summary and return the exit status.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from graphkit.apps.report.inspection import (
    DEFAULT_SPEC,
    FILES,
    MAX_NODES,
    META_VERIFY_NOTE,
    STEPS,
    Inspection,
    collect,
)
from graphkit.apps.report.page import report_html
from graphkit.apps.report.terminal import Progress, print_summary

__all__ = ["inspect", "report_json", "write_report"]


def report_json(inspection: Inspection, files: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """The content of ``report.json``.

    Keys: ``spec``; ``summary`` (:meth:`Inspection.summary`); ``groups`` (one dict per group, as
    ``graphkit groups --json`` prints them); ``unused_params``; ``verify`` (exactly
    :meth:`graphkit.measure.verification.VerifyReport.to_dict`, as ``graphkit verify --json`` prints it; None
    on the meta device); ``flops`` (``counted`` by FlopCounterMode, ``total`` with the estimates from
    shapes, ``partial``, ``estimated_from_shapes``, ``not_counted``: one dict per node whose backward the
    counter misses, ``note``); ``files`` (file name of each kind, relative to the report folder; None for a
    file that was not written).
    """
    groups = inspection.groups.to_dict()
    return {
        "spec": inspection.spec,
        "summary": inspection.summary(),
        "groups": groups["groups"],
        "unused_params": groups["unused_params"],
        "verify": inspection.verify.to_dict() if inspection.verify is not None else None,
        "flops": inspection.summary()["flops"],
        "files": dict(files) if files is not None else dict(FILES),
    }


def write_report(inspection: Inspection, output: Path) -> dict[str, str | None]:
    """Write the report folder: every file of :data:`FILES` (``graph.svg`` only when there is a diagram).

    Returns:
        The ``files`` map of ``report.json``: file name by kind, None for ``svg`` when there is no diagram.
    """
    output.mkdir(parents=True, exist_ok=True)
    files: dict[str, str | None] = dict(FILES)
    if inspection.svg is None:
        files["svg"] = None
    (output / FILES["dot"]).write_text(inspection.dot_source, encoding="utf-8")
    svg_path = output / FILES["svg"]
    if inspection.svg is not None:
        svg_path.write_text(inspection.svg, encoding="utf-8")
    else:
        svg_path.unlink(missing_ok=True)  # a diagram from an earlier run would not match this report
    inspection.graph.to_graphml(output / FILES["graphml"])
    document = report_json(inspection, files)
    (output / FILES["json"]).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    (output / FILES["html"]).write_text(report_html(inspection, files), encoding="utf-8")
    return files


def inspect(
    spec: str | None = None,
    *,
    output: Path | str,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    collapse_depth: int | None = None,
    max_nodes: int = MAX_NODES,
    fold: bool | None = None,
    timeout_s: float = 60.0,
) -> int:
    """Capture, group, verify, measure and draw the model ``spec`` names; write a report folder.

    Args:
        spec: a model spec (``zoo:NAME``, ``file.py:function``, ``package.module:function``,
            ``hf:ARCH?key=value``); None: :data:`DEFAULT_SPEC`.
        output: the report folder (created; existing report files in it are replaced).
        device: where to run (``"cpu"``, ``"cuda"``, ...; default: where the model is).
        dtype: cast parameters and floating inputs (``torch.float32``, ``torch.float64``).
        collapse_depth: draw modules at this depth of the module tree as one node each; None collapses (or
            folds repeated structure) only graphs of more than ``max_nodes`` nodes.
        max_nodes, fold, timeout_s: the diagram's node budget, folding and layout time budget (see
            :func:`~graphkit.apps.report.inspection.collect`).

    Returns:
        The exit status: 0 when the split backward matches the full backward (or, on the meta device,
        when graph, groups and FLOPs were found: nothing is verified there), 1 when a gradient differs
        (the wrong ones are printed). A missing Graphviz is a warning, not a failure: the report is written
        without the diagram's SVG.

    Raises:
        graphkit.models.specs.SpecError: the spec cannot be loaded.
        ValueError: bad ``collapse_depth`` or ``device``; ``output`` is a file.
        graphkit.graph.tensors.GraphkitInputError: the model's outputs have no autograd graph.
    """
    spec = spec or DEFAULT_SPEC
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise ValueError(
            f"-o {str(output)!r} is a file; the report needs a folder (it is created if missing)"
        )
    with Progress(STEPS, sys.stderr) as progress:
        inspection = collect(
            spec,
            device=device,
            dtype=dtype,
            collapse_depth=collapse_depth,
            max_nodes=max_nodes,
            fold=fold,
            timeout_s=timeout_s,
            step=progress.step,
        )
        with progress.step(STEPS[5]):
            start = time.perf_counter()
            write_report(inspection, output)
            inspection.timings[STEPS[5]] = time.perf_counter() - start
    if inspection.diagram_note is not None:
        what = "the diagram is smaller" if inspection.svg is not None else "no diagram in the report"
        print(f"graphkit inspect: warning: {what}: {inspection.diagram_note}", file=sys.stderr)
    print_summary(inspection, output, sys.stdout)
    verify = inspection.verify
    if verify is None:
        print(f"Split backward {META_VERIFY_NOTE}. Open {output / FILES['html']}")
        return 0
    if verify.ok:
        print(f"OK: split backward (B then W) matches the full backward. Open {output / FILES['html']}")
        return 0
    wrong = ", ".join(
        f"{check.name} ({check.status}"
        + (f", rel error {check.relative_error:.2e}" if check.relative_error is not None else "")
        + ")"
        for check in verify.failures
    )
    print(f"FAILED: split backward differs from the full backward for: {wrong}")
    return 1
