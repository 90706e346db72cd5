"""Draw recorded pipeline schedules: one row per rank, actions coloured by kind, idle time visible.

A :class:`~graphkit.pipelining.recording.ScheduleTimeline` (what a real schedule step ran) becomes a
picture: each rank's row shows its compute actions (F, I, W, B) on a grey track - the grey that stays
visible is idle time - and its sends and receives on a thin track below (``issue``: the call that
starts an op; ``wait``: the time the rank blocked on it). The header prints the step time and the
bubble fraction; each row, the rank's own bubble fraction and peak memory. Several timelines (a
comparison of schedules) are stacked on one shared time axis, so their lengths compare at a glance.

- :func:`timeline_svg`: SVG text (what ``ScheduleTimeline._repr_svg_`` shows in notebooks);
- :func:`timeline_graph`: the same picture as a ``graphviz.Graph`` with pinned positions, laid out by
  ``neato -n2`` for PNG and PDF;
- :func:`timeline_html`: a self-contained page (``templates/timeline.html.j2``) with the pictures, a
  side-by-side table of the schedules and how everything was measured;
- :func:`write_timeline`: any of these, or JSON, chosen by the file suffix;
- :func:`comparison_table`: the side-by-side table as plain text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from graphkit.drawing.labels import format_bytes
from graphkit.drawing.palette import FONT, SECONDARY_TEXT
from graphkit.drawing.rendering import GraphvizNotFoundError, RenderTimeoutError
from graphkit.drawing.templating import environment
from graphkit.measure.paired_rounds import median_round_ratio
from graphkit.pipelining.planning.actions import TimedAction
from graphkit.pipelining.planning.timelines import ScheduleTimeline

__all__ = [
    "KIND_COLOURS",
    "KIND_NAMES",
    "comparison_table",
    "timeline_graph",
    "timeline_html",
    "timeline_notes",
    "timeline_svg",
    "write_timeline",
]

KIND_COLOURS: dict[str, str] = {
    "F": "#4477AA",  # blue: forward
    "I": "#228833",  # green: input-gradient backward (B)
    "W": "#CCBB44",  # yellow: weight-gradient backward
    "B": "#66CCEE",  # cyan: full backward
    "SEND_F": "#EE6677",
    "SEND_B": "#EE6677",  # red: sends
    "RECV_F": "#AA3377",
    "RECV_B": "#AA3377",  # purple: receives
}
"""Fill colour of each kind of action (Paul Tol's *bright* scheme)."""

KIND_NAMES: dict[str, str] = {
    "F": "F: forward",
    "I": "I: input-gradient backward (the ZB paper's B)",
    "W": "W: weight-gradient backward",
    "B": "B: full backward (I and W in one)",
    "SEND_F": "send",
    "RECV_F": "receive",
}
"""Legend entries, in PyTorch's schedule letters (sends and receives of activations and of gradients share
one entry each)."""

IDLE = "#E6E6E6"
SETUP = "#BBBBBB"  # the first step's set-up before any action (verify-pipeline --timeline, one step)

LABELS_NOTE = "Block labels read stage, action, microbatch: 3W0 is stage 3's W (weight-gradient backward) of microbatch 0."
IDLE_NOTE = (
    "Grey left visible is idle: the rank computes nothing - it waits for another rank's activations or "
    "gradients (a pipeline bubble), or runs the schedule's own code between actions."
)
ONE_RANK_NOTE = (
    "One rank: its stages run one at a time in one process, with no communication and no waiting for "
    "other ranks; the grey between actions is the schedule's own Python (choosing, starting and "
    "bookkeeping each action), which weighs most when actions are short (small microbatches), and time "
    "the operating system gave other processes on a busy machine."
)
SETUP_NOTE = (
    "Set-up (dark grey, at the start): this is the schedule's first step, which sets up the stages and "
    "infers the shapes they exchange before it runs any action; left out of the bubble. The timeline "
    "command runs an unrecorded step first, and verify-pipeline --steps 2 records a later step."
)
UNRECORDED_NOTE = "Every schedule first runs one unrecorded step (set-up and shape inference)."
_TEXT_ON = {"F": "#FFFFFF", "I": "#FFFFFF"}  # dark fills take white text

WIDTH = 960.0  # px of the time axis
LEFT = 230.0  # px for the rank labels
RIGHT = 20.0
ROW = 26.0  # compute track
COMM = 7.0  # communication track
ROW_GAP = 8.0
HEADER = 26.0
PANEL_GAP = 22.0
AXIS = 28.0
LEGEND = 22.0


@dataclass(slots=True)
class _Box:
    x: float
    y: float
    width: float
    height: float
    fill: str
    css: str
    title: str = ""
    label: str = ""
    label_fill: str = "#000000"
    data: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Text:
    x: float
    y: float
    text: str
    size: float = 12.0
    anchor: str = "start"
    fill: str = "#000000"
    css: str = ""
    bold: bool = False


@dataclass(slots=True)
class _Layout:
    width: float
    height: float
    boxes: list[_Box]
    texts: list[_Text]
    title: str


def _as_list(timelines: ScheduleTimeline | Sequence[ScheduleTimeline]) -> list[ScheduleTimeline]:
    if isinstance(timelines, ScheduleTimeline):
        return [timelines]
    listed = list(timelines)
    if not listed or not all(isinstance(item, ScheduleTimeline) for item in listed):
        raise ValueError("draw one ScheduleTimeline or a non-empty list of them (from record_schedules)")
    return listed


def _milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def _action_title(action: TimedAction, rank: int) -> str:
    what = {"run": "", "issue": " (issued)", "wait": " (waited for)"}[action.phase]
    memory = "" if action.memory_bytes is None else f", memory {format_bytes(max(action.memory_bytes, 0))}"
    return (
        f"rank {rank}: {action.label}{what} - stage {action.stage}, microbatch {action.microbatch}, "
        f"{action.start * 1e3:.3f}-{action.end * 1e3:.3f} ms{memory}"
    )


def _ticks(span: float) -> list[float]:
    """About six round tick positions in seconds over ``[0, span]``."""
    if span <= 0:
        return [0.0]
    raw = span / 6
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    count = int(span / step + 1e-9)
    return [index * step for index in range(count + 1)]


def timeline_notes(timelines: Sequence[ScheduleTimeline]) -> list[str]:
    """The sentences that explain a picture: its block labels, what idle time is, a one-rank step and
    the first step's set-up, as the picture (SVG, PNG, PDF) and the HTML page both print them."""
    listed = _as_list(timelines)
    notes = [LABELS_NOTE, IDLE_NOTE]
    if any(len(timeline.ranks) == 1 for timeline in listed):
        notes.append(ONE_RANK_NOTE)
    if any(timeline.setup_seconds > 0 for timeline in listed):
        notes.append(SETUP_NOTE)
    return notes


def _wrapped(text: str, size: float, width: float) -> list[str]:
    """``text`` cut into lines that fit ``width`` px at font ``size`` (0.6 em a character, as Graphviz's
    fallback font DejaVu Sans runs)."""
    import textwrap

    return textwrap.wrap(text, max(20, int(width / (0.6 * size))))


def _layout(timelines: list[ScheduleTimeline]) -> _Layout:
    span = max(timeline.step_seconds for timeline in timelines) or 1e-9
    scale = WIDTH / span
    boxes: list[_Box] = []
    texts: list[_Text] = []
    y = 0.0
    for timeline in timelines:
        heading = (
            f"{timeline.schedule}: {timeline.microbatches} microbatches, {timeline.num_stages} stages on "
            f"{len(timeline.ranks)} rank(s), step {_milliseconds(timeline.step_seconds)}, "
            f"bubble {_percent(timeline.bubble_fraction)}"
        )
        texts.append(_Text(8, y + 17, heading, 13, css="heading", bold=True))
        y += HEADER
        for rank in timeline.ranks:
            top = y
            peak = "-" if rank.peak_memory_bytes is None else format_bytes(max(rank.peak_memory_bytes, 0))
            texts.append(
                _Text(
                    8,
                    top + 12,
                    f"rank {rank.rank}  stage{'s' if len(rank.stages) != 1 else ''} "
                    f"{', '.join(map(str, rank.stages))}",
                    12,
                    css="rank",
                )
            )
            texts.append(
                _Text(
                    8,
                    top + 26,
                    f"bubble {_percent(timeline.rank_bubble_fraction(rank.rank))}, peak {peak}",
                    10,
                    fill=SECONDARY_TEXT,
                    css="rank-note",
                )
            )
            boxes.append(
                _Box(
                    LEFT,
                    top,
                    rank.step_seconds * scale,
                    ROW,
                    IDLE,
                    "idle",
                    f"rank {rank.rank}: idle where grey",
                )
            )
            if timeline.setup_seconds > 0:
                width = timeline.setup_seconds * scale
                text = "set-up"
                boxes.append(
                    _Box(
                        LEFT,
                        top,
                        width,
                        ROW,
                        SETUP,
                        "setup",
                        f"rank {rank.rank}: the first step's set-up (stages, shape inference), "
                        f"0-{timeline.setup_seconds * 1e3:.3f} ms: no action ran",
                        text if width >= 7.5 * len(text) else "",
                    )
                )
            for action in rank.actions:
                x = LEFT + action.start * scale
                width = max((action.end - action.start) * scale, 0.6)
                data = {
                    "kind": action.kind,
                    "stage": str(action.stage),
                    "microbatch": str(action.microbatch),
                    "phase": action.phase,
                }
                if action.is_compute:
                    label = action.label if width >= 7.5 * len(action.label) else ""
                    boxes.append(
                        _Box(
                            x,
                            top,
                            width,
                            ROW,
                            KIND_COLOURS[action.kind],
                            f"action {action.kind}",
                            _action_title(action, rank.rank),
                            label,
                            _TEXT_ON.get(action.kind, "#000000"),
                            data,
                        )
                    )
                else:
                    height = COMM if action.phase == "wait" else COMM / 2
                    boxes.append(
                        _Box(
                            x,
                            top + ROW + 1,
                            width,
                            height,
                            KIND_COLOURS[action.kind],
                            f"comm {action.kind.split('_')[0].lower()} {action.phase}",
                            _action_title(action, rank.rank),
                            data=data,
                        )
                    )
            y += ROW + COMM + ROW_GAP
        y += PANEL_GAP - ROW_GAP
    # the time axis
    for tick in _ticks(span):
        x = LEFT + tick * scale
        boxes.append(_Box(x, y, 0.8, 5, SECONDARY_TEXT, "tick"))
        texts.append(_Text(x, y + 17, f"{tick * 1e3:.4g}", 10, "middle", SECONDARY_TEXT, "tick-label"))
    texts.append(_Text(LEFT - 8, y + 17, "ms", 10, "end", SECONDARY_TEXT, "tick-label"))
    y += AXIS
    # the legend: each swatch 4 px before its own label, 28 px after the previous one; wrapped to the width
    entries = [(KIND_COLOURS[kind], name) for kind, name in KIND_NAMES.items()]
    entries.append((IDLE, "idle"))
    if any(timeline.setup_seconds > 0 for timeline in timelines):
        entries.append((SETUP, "first step's set-up"))
    right = LEFT + WIDTH
    x = 8.0
    for colour, name in entries:
        width = 16 + 0.62 * 11 * len(name)  # swatch, gap, label at 11 px (wide enough for DejaVu Sans)
        if x > 8.0 and x + width > right:
            x, y = 8.0, y + LEGEND
        boxes.append(_Box(x, y, 12, 12, colour, "legend"))
        texts.append(_Text(x + 16, y + 10, name, 11, css="legend-label"))
        x += width + 28
    y += LEGEND
    # what the picture shows, in words: the PNG and PDF carry it as the SVG and the HTML page do
    for note in timeline_notes(timelines):
        for line in _wrapped(note, 10, right - 8):
            texts.append(_Text(8, y + 10, line, 10, fill=SECONDARY_TEXT, css="note"))
            y += 14
    y += 6
    title = "; ".join(
        f"{timeline.schedule} bubble {_percent(timeline.bubble_fraction)}" for timeline in timelines
    )
    return _Layout(LEFT + WIDTH + RIGHT, y, boxes, texts, title)


def timeline_svg(timelines: ScheduleTimeline | Sequence[ScheduleTimeline]) -> str:
    """The SVG picture of one or several recorded steps (stacked on one shared time axis).

    Each action is a ``<rect class="action KIND">`` (``class="comm send issue"`` ... for communication)
    with ``data-kind``, ``data-stage``, ``data-microbatch`` and a ``<title>`` tooltip (times in ms).

    Raises:
        ValueError: ``timelines`` holds no ScheduleTimeline.
    """
    layout = _layout(_as_list(timelines))
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graphkit-timeline" width="{layout.width:.0f}" '
        f'height="{layout.height:.0f}" viewBox="0 0 {layout.width:.0f} {layout.height:.0f}" '
        f'font-family="{FONT}, Arial, sans-serif">',
        f"<title>{escape(layout.title)}</title>",
        f'<rect class="background" x="0" y="0" width="{layout.width:.0f}" height="{layout.height:.0f}" fill="#FFFFFF"/>',
    ]
    for box in layout.boxes:
        data = "".join(f" data-{key}={quoteattr(value)}" for key, value in box.data.items())
        attributes = (
            f'class="{box.css}" x="{box.x:.2f}" y="{box.y:.2f}" width="{box.width:.2f}" '
            f'height="{box.height:.2f}" fill="{box.fill}"{data}'
        )
        if box.title:
            lines.append(f"<rect {attributes}><title>{escape(box.title)}</title></rect>")
        else:
            lines.append(f"<rect {attributes}/>")
        if box.label:
            lines.append(
                f'<text class="action-label" x="{box.x + box.width / 2:.2f}" y="{box.y + box.height / 2 + 4:.2f}" '
                f'font-size="10" text-anchor="middle" fill="{box.label_fill}" pointer-events="none">'
                f"{escape(box.label)}</text>"
            )
    for text in layout.texts:
        weight = ' font-weight="bold"' if text.bold else ""
        lines.append(
            f'<text class="{text.css}" x="{text.x:.2f}" y="{text.y:.2f}" font-size="{text.size:g}" '
            f'text-anchor="{text.anchor}" fill="{text.fill}"{weight}>{escape(text.text)}</text>'
        )
    lines.append("</svg>")
    return "\n".join(lines) + "\n"


def timeline_graph(timelines: ScheduleTimeline | Sequence[ScheduleTimeline]) -> Any:
    """The picture as a ``graphviz.Graph`` of pinned boxes and labels, for ``neato -n2`` (PNG, PDF).

    Render it with ``graph.pipe(format="png", engine="neato", neato_no_op=2)`` (what
    :func:`write_timeline` does).
    """
    import graphviz

    layout = _layout(_as_list(timelines))
    graph = graphviz.Graph("timeline", engine="neato")
    graph.attr(
        bb=f"0,0,{layout.width:.0f},{layout.height:.0f}",
        bgcolor="white",
        pad="0.1",
        splines="false",
        outputorder="nodesfirst",
    )
    graph.attr("node", shape="box", style="filled", penwidth="0", fontname=FONT, margin="0", fixedsize="true")

    def flip(y: float) -> float:
        return layout.height - y

    for index, box in enumerate(layout.boxes):
        graph.node(
            f"box{index}",
            label=box.label,
            pos=f"{box.x + box.width / 2:.2f},{flip(box.y + box.height / 2):.2f}!",
            width=f"{box.width / 72:.4f}",
            height=f"{box.height / 72:.4f}",
            fillcolor=box.fill,
            fontsize="10",
            fontcolor=box.label_fill,
            tooltip=box.title,
        )
    for index, text in enumerate(layout.texts):
        width = 0.6 * text.size * len(text.text)  # about DejaVu Sans, Graphviz's usual fallback
        offset = {"start": width / 2, "middle": 0.0, "end": -width / 2}[text.anchor]
        # a left-anchored text ends in \l, so that Graphviz left-justifies it in its box: the box's width is
        # only an estimate of the text's, and a centred label would drift away from its swatch or margin
        graph.node(
            f"text{index}",
            label=text.text.replace("\\", "\\\\") + ("\\l" if text.anchor == "start" else ""),
            shape="plaintext",
            style="",
            pos=f"{text.x + offset:.2f},{flip(text.y - text.size / 3):.2f}!",
            width=f"{width / 72:.4f}",
            height=f"{text.size * 1.3 / 72:.4f}",
            fontsize=f"{text.size:g}",
            fontcolor=text.fill,
            fontname=f"{FONT} Bold" if text.bold else FONT,
        )
    return graph


def comparison_rows(timelines: Sequence[ScheduleTimeline]) -> list[dict[str, Any]]:
    """One row per schedule: step time, bubble fraction, peak memory per rank, and the ratio to the first.

    The ratio is the paired one where several rounds were recorded (every timeline's ``step_times``: the
    median over the rounds of the step over the first schedule's in the same round, as the rounds lines of
    ``compare-schedules`` give it); else the ratio of the two steps. The median step itself can differ from
    the median round's ratio: a round's ratio cancels what the machine did during that round."""
    listed = _as_list(timelines)
    baseline = listed[0].step_seconds or 1e-12
    first_rounds = _round_steps(listed[0])
    rows = []
    for timeline in listed:
        paired = median_round_ratio(_round_steps(timeline), first_rounds) if len(first_rounds) > 1 else None
        rows.append(
            {
                "schedule": timeline.schedule,
                "step_ms": timeline.step_seconds * 1e3,
                "step_ratio": paired if paired is not None else timeline.step_seconds / baseline,
                "bubble_percent": 100 * timeline.bubble_fraction,
                "rank_bubble_percent": [100 * timeline.rank_bubble_fraction(r.rank) for r in timeline.ranks],
                "peak_memory": [
                    "-" if rank.peak_memory_bytes is None else format_bytes(max(rank.peak_memory_bytes, 0))
                    for rank in timeline.ranks
                ],
                "actions": sum(len(rank.compute_actions()) for rank in timeline.ranks),
            }
        )
    return rows


def _round_steps(timeline: ScheduleTimeline) -> list[float]:
    """The step of every recorded round (its slowest rank's, as every rank's ``step_times`` holds it)."""
    return list(timeline.ranks[0].step_times) if timeline.ranks and timeline.ranks[0].step_times else []


def comparison_table(timelines: Sequence[ScheduleTimeline]) -> str:
    """Schedules side by side as plain text: step time (and ratio to the first, in the median round where
    rounds were recorded: :func:`comparison_rows`), bubble, peak memory per rank."""
    rows = [("schedule", "step (ms)", "vs first", "bubble", "bubble per rank", "peak memory per rank")]
    for row in comparison_rows(timelines):
        rows.append(
            (
                row["schedule"],
                f"{row['step_ms']:.3f}",
                f"{row['step_ratio']:.2f}x",
                f"{row['bubble_percent']:.1f}%",
                " / ".join(f"{value:.1f}%" for value in row["rank_bubble_percent"]),
                " / ".join(row["peak_memory"]),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for position, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        if position == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def timeline_html(
    timelines: ScheduleTimeline | Sequence[ScheduleTimeline],
    *,
    title: str = "graphkit timeline",
    note: str = "",
) -> str:
    """A self-contained HTML page: the comparison table, the picture of every step, and the method.

    ``note``: a sentence shown under the title (the pipeline spec, the command that made the page).
    """
    listed = _as_list(timelines)
    template = environment().get_template("timeline.html.j2")
    return template.render(
        title=title,
        note=note,
        rows=comparison_rows(listed),
        pictures=[{"schedule": timeline.schedule, "svg": timeline_svg(timeline)} for timeline in listed],
        memory_methods=sorted({timeline.memory_method for timeline in listed if timeline.memory_method}),
        legend=[
            {"kind": kind, "name": name, "colour": KIND_COLOURS[kind]} for kind, name in KIND_NAMES.items()
        ],
        idle=IDLE,
        notes=timeline_notes(listed),
        setup=any(timeline.setup_seconds > 0 for timeline in listed),
        setup_colour=SETUP,
        unrecorded_note=UNRECORDED_NOTE,
    )


def write_timeline(
    timelines: ScheduleTimeline | Sequence[ScheduleTimeline],
    path: str | Path,
    *,
    title: str = "graphkit timeline",
    note: str = "",
    timeout_s: float = 60.0,
) -> Path:
    """Write the timeline(s) to ``path``: ``.svg``, ``.png``, ``.pdf`` (Graphviz ``neato``), ``.html`` or ``.json``.

    Raises:
        ValueError: unknown suffix, or no timeline.
        GraphvizNotFoundError: PNG or PDF without Graphviz installed.
        RenderTimeoutError: Graphviz ran past ``timeout_s``.
    """
    import json

    path = Path(path)
    listed = _as_list(timelines)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        path.write_text(timeline_svg(listed), encoding="utf-8")
    elif suffix == ".html":
        path.write_text(timeline_html(listed, title=title, note=note), encoding="utf-8")
    elif suffix == ".json":
        payload = [timeline.to_dict() for timeline in listed]
        path.write_text(json.dumps(payload[0] if len(payload) == 1 else payload, indent=1), encoding="utf-8")
    elif suffix in (".png", ".pdf"):
        path.write_bytes(_pipe(timeline_graph(listed), suffix[1:], timeout_s))
    else:
        raise ValueError(
            f"cannot tell the format of {str(path)!r}: end it in .svg, .png, .pdf, .html or .json"
        )
    return path


def _pipe(graph: Any, output_format: str, timeout_s: float) -> bytes:
    import shutil
    import subprocess

    program = shutil.which("neato")
    if program is None:
        raise GraphvizNotFoundError(
            "the Graphviz 'neato' program is not installed (or not on PATH), so graphkit cannot write a "
            f".{output_format} timeline; install Graphviz, or write .svg or .html, which need no Graphviz"
        )
    try:
        completed = subprocess.run(
            [program, "-n2", f"-T{output_format}"],
            input=graph.source.encode("utf-8"),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RenderTimeoutError(f"Graphviz 'neato' did not finish within {timeout_s:g} s") from None
    if completed.returncode != 0:
        message = completed.stderr.decode("utf-8", "replace").strip()
        raise RuntimeError(f"Graphviz 'neato' failed (exit status {completed.returncode}): {message}")
    return completed.stdout
