"""What ``graphkit inspect`` prints: a progress line per step, then a short summary table.

``rich`` draws both when it is installed (extra ``cli``) and the stream is a terminal; plain text otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from graphkit.apps.report.formatting import flop_text, shape_text, tolerance_text
from graphkit.apps.report.inspection import FILES, Inspection

__all__ = ["Progress", "print_summary", "terminal_rows"]

_LISTED = 3
"""Opaque Nodes named in the summary's ``repeated`` row (costliest first) before the rest is counted."""


class Progress:
    """One line per step on ``stream``; a ``rich`` progress bar instead when rich is installed and
    ``stream`` is a terminal."""

    def __init__(self, steps: tuple[str, ...], stream: TextIO) -> None:
        self.steps = steps
        self.stream = stream
        self.done = 0
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    SpinnerColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )
            except ImportError:
                return self
            self._rich = Progress(
                SpinnerColumn(),
                TextColumn("[bold]graphkit inspect[/bold] {task.description:<18}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._rich.__enter__()
            self._task = self._rich.add_task(self.steps[0], total=len(self.steps))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc_info)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time one step and report it."""
        position = self.done + 1
        if self._rich is not None:
            self._rich.update(self._task, description=name)
        else:
            print(f"[{position}/{len(self.steps)}] {name} ...", end="", file=self.stream, flush=True)
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            if self._rich is None:
                print(" failed", file=self.stream, flush=True)
            raise
        seconds = time.perf_counter() - start
        self.done += 1
        if self._rich is not None:
            self._rich.update(self._task, advance=1)
        else:
            print(f" {seconds:.2f} s", file=self.stream, flush=True)


def _plain_input(item: Mapping[str, Any]) -> str:
    name = item["name"] if item["name"] == item["argument"] else f"{item['name']} ({item['argument']})"
    grad = "requires grad" if item["requires_grad"] else "no grad"
    return f"{name} {item['dtype']} {shape_text(item['shape'])} {grad}"


def _flops_row(inspection: Inspection) -> str:
    flops = inspection.flops
    share = (
        (lambda value: f" ({100 * value / flops['full']:.0f}%)") if flops["full"] > 0 else (lambda value: "")
    )
    if flops["b"] >= 0:
        text = (
            f"full backward {flop_text(flops['full'])}, B {flop_text(flops['b'])}{share(flops['b'])}, "
            f"W {flop_text(flops['w'])}{share(flops['w'])}"
        )
        if inspection.verify is None:
            text += " (counted from shapes on the meta device)"
    elif inspection.verify is None:
        text = f"full backward {flop_text(flops['full'])} (from shapes on the meta device); B and W not run"
    else:
        text = f"full backward {flop_text(flops['full'])}; B and W not counted (activation checkpointing)"
    note = inspection.coverage.note()
    if note:
        text += f"; {note}"
        missing = [item for item in inspection.coverage.not_counted if item.estimated is None]
        if missing:
            listed = ", ".join(f"{item.node} {item.op}" for item in missing[:4])
            more = f" (+{len(missing) - 4})" if len(missing) > 4 else ""
            text += f"; not counted: {listed}{more}"
    return text


def _diagram_row(inspection: Inspection) -> str:
    if inspection.svg is not None:
        return "graph.svg" + (f" ({inspection.diagram_note})" if inspection.diagram_note else "")
    note = inspection.diagram_note or ""
    if "not installed" in note:
        return "none (Graphviz missing): graph.dot only"
    if "did not finish" in note:
        return "none (the layout ran past its time budget): graph.dot only; try --fold or --collapse 1"
    return "none (Graphviz failed): graph.dot only"


def terminal_rows(inspection: Inspection, output: Path) -> list[tuple[str, str]]:
    summary = inspection.summary()
    verify = inspection.verify
    tied = "; tied: " + "; ".join(" = ".join(names) for names in summary["tied_parameters"])
    if verify is None:
        verdict = f"NOT RUN ({inspection.device}): needs real values; run without --device meta to verify"
    else:
        verdict = (  # worded as graphkit verify words it
            f"{verify.verdict()} ({verify.dtype}, {verify.device}, rel tol {tolerance_text(verify.tolerance)})"
        )
    saved = summary["saved_bytes_total"]
    rows = [
        ("model", f"{inspection.spec} ({inspection.module_class})"),
        ("inputs", "; ".join(_plain_input(item) for item in inspection.inputs) or "none"),
        *(
            [
                (
                    "outputs",
                    "left out, as no tensors (no gradient flows through them): "
                    + ", ".join(f"{item['name']} ({item['type']})" for item in summary["skipped_outputs"]),
                )
            ]
            if summary["skipped_outputs"]
            else []
        ),
        (
            "graph",
            f"{summary['nodes']} nodes, {summary['edges']} edges"
            + (f"; {inspection.graph_note}" if inspection.graph_note else ""),
        ),
        (
            "parameters",
            f"{summary['parameters']} tensors, {summary['parameter_values']:,} values"
            + (tied if summary["tied_parameters"] else ""),
        ),
        ("groups", str(summary["groups"])),
        ("saved", f"{saved:,} bytes of saved tensors" if saved is not None else "unknown"),
        ("FLOPs", _flops_row(inspection)),
        ("verify", verdict),
        ("diagram", _diagram_row(inspection)),
        ("report", str(output / FILES["html"])),
    ]
    if inspection.groups.unused_params:
        rows.insert(3, ("unused", ", ".join(inspection.groups.unused_params)))
    position = next(index for index, (label, _) in enumerate(rows) if label == "FLOPs") + 1
    measured = verify.opaque if verify is not None else []  # on the meta device nothing ran
    repeating = sorted((cost for cost in measured if cost.repeated > 0), key=lambda cost: -cost.repeated)
    if repeating:  # where B + W costs more than a full backward, as verify_split measured it
        listed = "; ".join(
            f"{cost.node} {cost.op} [{cost.kind}] {flop_text(cost.repeated)}" for cost in repeating[:_LISTED]
        )
        more = f"; {len(repeating) - _LISTED} more" if len(repeating) > _LISTED else ""
        rows.insert(position, ("repeated", listed + more))
        position += 1
    if verify is not None and verify.grads_in_b:
        rows.insert(position, ("grads in B", ", ".join(verify.grads_in_b) + " (reentrant checkpoint)"))
    return rows


def print_summary(inspection: Inspection, output: Path, stream: TextIO) -> None:
    rows = terminal_rows(inspection, output)
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        width = max(len(label) for label, _ in rows)
        for label, value in rows:
            print(f"{label.ljust(width)}  {value}", file=stream)
        return
    console = Console(file=stream, highlight=False, soft_wrap=False)
    table = Table(title=f"graphkit inspect {inspection.spec}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for label, value in rows:  # plain text: "[checkpointed]" or "layers[0]" are no rich markup
        table.add_row(Text(label), Text(value))
    console.print(table)
