"""Timeline pictures of recorded schedules: golden SVG structure, bubble arithmetic, PNG, HTML and JSON files.

The golden file ``tests/golden/timeline_two_ranks.svg`` is regenerated with ``pytest --update-golden``.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from graphkit.drawing.timeline import (
    KIND_COLOURS,
    comparison_rows,
    comparison_table,
    timeline_html,
    timeline_svg,
    write_timeline,
)
from graphkit.pipelining.planning import Action, RankTimeline, ScheduleTimeline, TimedAction

GOLDEN = Path(__file__).parent / "golden" / "timeline_two_ranks.svg"
SVG = "{http://www.w3.org/2000/svg}"


def hand_made_timeline() -> ScheduleTimeline:
    """Two ranks, one microbatch through two stages, in milliseconds that are easy to add up."""
    ms = 1e-3
    rank0 = [
        TimedAction(Action(0, "F", 0), 0 * ms, 2 * ms),
        TimedAction(Action(0, "SEND_F", 0), 2 * ms, 2.2 * ms, "issue"),
        TimedAction(Action(0, "RECV_B", 0), 2.2 * ms, 2.3 * ms, "issue"),
        TimedAction(Action(0, "RECV_B", 0), 2.3 * ms, 6 * ms, "wait", 4096),
        TimedAction(Action(0, "I", 0), 6 * ms, 8 * ms, memory_bytes=8192),
        TimedAction(Action(0, "W", 0), 8 * ms, 9 * ms, memory_bytes=0),
    ]
    rank1 = [
        TimedAction(Action(1, "RECV_F", 0), 0 * ms, 0.1 * ms, "issue"),
        TimedAction(Action(1, "RECV_F", 0), 0.1 * ms, 2.4 * ms, "wait"),
        TimedAction(Action(1, "F", 0), 2.4 * ms, 4 * ms),
        TimedAction(Action(1, "I", 0), 4 * ms, 6 * ms),
        TimedAction(Action(1, "SEND_B", 0), 6 * ms, 6.1 * ms, "issue"),
        TimedAction(Action(1, "W", 0), 6.1 * ms, 7 * ms),
    ]
    return ScheduleTimeline(
        "ScheduleHandMade",
        1,
        2,
        [
            RankTimeline(0, [0], rank0, 10 * ms, 8192, ["0F0", "0I0", "0W0"]),
            RankTimeline(1, [1], rank1, 8 * ms, None, ["1F0", "1I0", "1W0"]),
        ],
        memory_method="hand-made",
    )


def test_bubble_fraction_is_idle_rank_time_over_all_rank_time():
    timeline = hand_made_timeline()
    # rank 0 computes 2 + 2 + 1 = 5 ms, rank 1 1.6 + 2 + 0.9 = 4.5 ms, of 2 x 10 ms
    assert timeline.step_seconds == pytest.approx(10e-3)
    assert timeline.bubble_fraction == pytest.approx(1 - 9.5 / 20)
    assert timeline.rank_bubble_fraction(0) == pytest.approx(0.5)
    assert timeline.rank_bubble_fraction(1) == pytest.approx(1 - 4.5 / 10)
    assert timeline.ranks[0].comm_order() == ["0SEND_F0", "0RECV_B0"]


def test_svg_matches_golden_file(update_golden: bool):
    svg = timeline_svg(hand_made_timeline())
    if update_golden:
        GOLDEN.write_text(svg)
    assert GOLDEN.exists(), f"missing golden file {GOLDEN}: run pytest --update-golden"
    assert svg == GOLDEN.read_text()


def test_svg_structure_one_rect_per_action_coloured_by_kind():
    timeline = hand_made_timeline()
    root = ElementTree.fromstring(timeline_svg(timeline))
    assert root.tag == f"{SVG}svg" and root.get("class") == "graphkit-timeline"
    rects = root.iter(f"{SVG}rect")
    by_class: dict[str, list[ElementTree.Element]] = {}
    for rect in rects:
        by_class.setdefault(rect.get("class", "").split()[0], []).append(rect)
    actions = by_class["action"]
    assert len(actions) == sum(len(rank.compute_actions()) for rank in timeline.ranks) == 6
    for rect in actions:
        assert rect.get("fill") == KIND_COLOURS[rect.get("data-kind")]
        assert rect.find(f"{SVG}title").text.startswith("rank ")
    assert len(by_class["comm"]) == 6 and len(by_class["idle"]) == 2
    # idle tracks are as long as each rank's step: rank 1's is 8/10 of rank 0's
    idle = [float(rect.get("width")) for rect in by_class["idle"]]
    assert idle[1] / idle[0] == pytest.approx(0.8)
    # a wait is drawn full height on the communication track, an issue half height
    heights = {rect.get("class"): float(rect.get("height")) for rect in by_class["comm"]}
    assert heights["comm recv wait"] == 2 * heights["comm recv issue"]
    texts = " ".join(text.text or "" for text in root.iter(f"{SVG}text"))
    assert "bubble 52.5%" in texts and "rank 0" in texts and "peak 8.0 KiB" in texts


def test_repr_svg_draws_the_timeline():
    assert timeline_svg(hand_made_timeline()) == hand_made_timeline()._repr_svg_()


def test_comparison_table_puts_schedules_side_by_side():
    first = hand_made_timeline()
    second = hand_made_timeline()
    second.schedule = "ScheduleOther"
    for rank in second.ranks:
        rank.step_seconds /= 2
    table = comparison_table([first, second])
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["schedule", "step", "(ms)"]
    assert lines[2].split()[:4] == ["ScheduleHandMade", "10.000", "1.00x", "52.5%"]
    assert lines[3].split()[:3] == ["ScheduleOther", "5.000", "0.50x"]
    assert "8.0 KiB / -" in lines[2]


def test_html_page_is_self_contained_and_lists_every_schedule():
    page = timeline_html([hand_made_timeline()], title="Compared", note="made by hand")
    assert page.count("<svg") == 1 and "ScheduleHandMade" in page and "made by hand" in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "Memory: hand-made." in page


def test_write_timeline_by_suffix(tmp_path: Path):
    timeline = hand_made_timeline()
    assert write_timeline(timeline, tmp_path / "t.svg").read_text().startswith("<svg")
    assert write_timeline(timeline, tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        ScheduleTimeline.from_dict(json.loads(write_timeline(timeline, tmp_path / "t.json").read_text()))
        == timeline
    )
    assert "<!DOCTYPE html>" in write_timeline([timeline, timeline], tmp_path / "t.html").read_text()
    with pytest.raises(ValueError, match="cannot tell the format"):
        write_timeline(timeline, tmp_path / "t.gif")
    with pytest.raises(ValueError, match="ScheduleTimeline"):
        timeline_svg([])


def legend_items(svg: str) -> list[tuple[float, float, str]]:
    """The legend's swatches and labels as ``(swatch x, label x, label)``, in order."""
    root = ElementTree.fromstring(svg)
    swatches = [float(rect.get("x")) for rect in root.iter(f"{SVG}rect") if rect.get("class") == "legend"]
    labels = [
        (float(text.get("x")), text.text or "")
        for text in root.iter(f"{SVG}text")
        if text.get("class") == "legend-label"
    ]
    return [(swatch, x, label) for swatch, (x, label) in zip(swatches, labels, strict=True)]


def test_the_legend_names_f_i_w_b_in_pytorchs_letters_and_each_swatch_sits_by_its_own_label():
    svg = timeline_svg(hand_made_timeline())
    items = legend_items(svg)
    names = [label for _, _, label in items]
    assert names[:4] == [
        "F: forward",
        "I: input-gradient backward (the ZB paper's B)",
        "W: weight-gradient backward",
        "B: full backward (I and W in one)",
    ]
    for (swatch, label_x, label), following in zip(items, items[1:], strict=False):
        assert label_x - swatch == pytest.approx(16)  # 4 px after its own 12 px swatch
        next_swatch = following[0]
        if next_swatch > swatch:  # the same legend line: the next swatch is well past this label's end
            assert next_swatch - (label_x + 0.6 * 11 * len(label)) >= 20


def test_the_picture_explains_block_labels_and_idle_time_in_svg_png_and_html(tmp_path: Path):
    timeline = hand_made_timeline()
    svg = timeline_svg(timeline)
    notes = " ".join(text.text or "" for text in ElementTree.fromstring(svg).iter(f"{SVG}text"))
    assert "3W0 is stage 3's W (weight-gradient backward) of microbatch 0" in notes
    assert "Grey left visible is idle" in notes
    assert "One rank:" not in notes  # two ranks: no one-rank note
    # the PNG is drawn from the same layout: its Graphviz source carries the same words
    from graphkit.drawing.timeline import timeline_graph

    source = timeline_graph(timeline).source
    assert "3W0 is stage 3" in source and "Grey left visible is idle" in source
    page = timeline_html(timeline)
    assert "3W0 is stage 3" in page and "the ZB paper" in page


def test_a_one_rank_timeline_says_why_it_idles_without_communication():
    timeline = hand_made_timeline()
    timeline.ranks = timeline.ranks[:1]
    svg = timeline_svg(timeline)
    assert "One rank: its stages run one at a time in one process" in svg.replace("\n", " ")


def test_a_first_step_set_up_is_drawn_labelled_and_left_out_of_the_bubble(tmp_path: Path):
    timeline = hand_made_timeline()
    plain = timeline.bubble_fraction
    timeline.setup_seconds = 2e-3  # no action before 2 ms on rank 0 ... (hand-made: set it by hand)
    # rank 0 computes 5 ms, rank 1 4.5 ms, of 2 x (10 - 2) ms
    assert timeline.bubble_fraction == pytest.approx(1 - 9.5 / 16) and timeline.bubble_fraction < plain
    root = ElementTree.fromstring(timeline_svg(timeline))
    setups = [rect for rect in root.iter(f"{SVG}rect") if rect.get("class") == "setup"]
    assert len(setups) == 2 and "set-up" in setups[0].find(f"{SVG}title").text
    texts = " ".join(text.text or "" for text in root.iter(f"{SVG}text"))
    assert "first step's set-up" in texts and "left out of the bubble" in texts
    again = ScheduleTimeline.from_dict(json.loads(write_timeline(timeline, tmp_path / "t.json").read_text()))
    assert again.setup_seconds == timeline.setup_seconds
    page = timeline_html(timeline)
    assert "Every schedule first runs one unrecorded step" not in page
    assert "Every schedule first runs one unrecorded step" in timeline_html(hand_made_timeline())


def test_with_rounds_the_table_gives_the_ratio_in_the_median_round():
    # the second schedule is 0.9x the first in every round, while the machine slowed down over the rounds:
    # the ratio of the kept steps (12.5 ms against 10 ms: 1.25x) is not the paired one
    first, second = hand_made_timeline(), hand_made_timeline()
    second.schedule = "ScheduleOther"
    for rank in first.ranks:
        rank.step_times = [0.010, 0.020, 0.040]
    for rank in second.ranks:
        rank.step_times = [0.009, 0.018, 0.036]
        rank.step_seconds = 0.0125  # its kept step came from another part of the run
    rows = comparison_rows([first, second])
    assert rows[1]["step_ratio"] == pytest.approx(0.9)
    assert comparison_table([first, second]).splitlines()[3].split()[:3] == [
        "ScheduleOther",
        "12.500",
        "0.90x",
    ]
