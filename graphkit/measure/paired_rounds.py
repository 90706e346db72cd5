"""Steps measured in rounds: the order a round visits its candidates in, and what two candidates' rounds say.

A *round* runs one step of every candidate (schedule, variant) under the same load; the same round of two
candidates is a *pair*. Pairs cancel what the machine does between rounds (another process waking up, the
frequency changing), but not what a candidate's *position* in the round does to it (the first step after a
barrier) nor what the candidate run just before does to it (its allocations left in the heap, its caches,
its ranks' skew): :func:`balanced_order` gives each candidate every position equally often *and* puts it
right after every other candidate equally often.

- :func:`balanced_order`: the visiting order of a round (a Williams design; a plain rotation, which it
  replaced, balanced positions only);
- :func:`round_ratios`, :func:`median_round_ratio`, :func:`rounds_won`: one candidate against another,
  round by round (the median ratio is the paired effect, the wins feed a sign test,
  :func:`~graphkit.measure.timing.sign_test_p_value`);
- :func:`noise_floor`: the spread between two copies of the same candidate (an A/A control) recorded in
  the same rounds, below which no difference is called;
- :func:`compare_rounds`: every candidate against the first, with the noise floor where a name comes twice
  (what ``graphkit compare-schedules`` prints under its table).

Steps are seconds (any unit, the same for both sides); ratios are the first side's step over the second's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from graphkit.measure.timing import sign_test_p_value

__all__ = [
    "balanced_order",
    "compare_rounds",
    "median_round_ratio",
    "noise_floor",
    "round_ratios",
    "rounds_won",
]


def balanced_order(round_index: int, count: int) -> list[int]:
    """The order in which round ``round_index`` (from 0) visits ``count`` candidates: row
    ``round_index mod rows`` of a Williams design, a Latin square balanced for the candidate run just before.

    Over every cycle of rows (``count`` rounds for an even ``count``, ``2 x count`` for an odd one) each
    candidate takes every position equally often, and each ordered pair ``(a, b)`` of different candidates
    is adjacent (``b`` right after ``a``) equally often within the rounds, so what one candidate leaves
    behind touches every other alike. A plain rotation (round ``r`` visiting ``r, r + 1, ...``) keeps
    candidate ``k`` right after ``k - 1`` in every round: three copies of 1F1B listed with two of ZBVZeroBubble (GPT-2, 4
    microbatches, 2 pinned ranks, 31 rounds) measured the second copy 4 to 6% slower than the first in
    two runs, faster in only 8 and 12 of 31 rounds.

    Row 0 is ``0, 1, count - 1, 2, count - 2, ...``; row ``r`` adds ``r`` to every entry (mod ``count``); for
    an odd ``count`` rows ``count`` to ``2 x count - 1`` are those rows reversed. Williams, E. J. (1949),
    "Experimental designs balanced for the estimation of residual effects of treatments", Australian
    Journal of Scientific Research A 2(2): 149-168.

    Raises:
        ValueError: ``round_index`` or ``count`` below 0.
    """
    if round_index < 0 or count < 0:
        raise ValueError(f"round_index and count must be at least 0, got {round_index} and {count}")
    if count == 0:
        return []
    first = [0]
    low, high = 1, count - 1
    while len(first) < count:
        first.append(low)
        low += 1
        if len(first) < count:
            first.append(high)
            high -= 1
    rows = count if count % 2 == 0 else 2 * count
    row = round_index % rows
    order = [(entry + row) % count for entry in first]
    return order if row < count else order[::-1]


def round_ratios(steps: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """``steps[i] / baseline[i]`` for every round both recorded (the shorter list sets the rounds), leaving
    out rounds whose baseline step is not above 0."""
    return [step / base for step, base in zip(steps, baseline, strict=False) if base > 0]


def median_round_ratio(steps: Sequence[float], baseline: Sequence[float]) -> float | None:
    """The median of :func:`round_ratios` (the paired effect: 0.95 is 5% faster in the median round);
    None without a round."""
    ratios = round_ratios(steps, baseline)
    return statistics.median(ratios) if ratios else None


def rounds_won(steps: Sequence[float], baseline: Sequence[float]) -> tuple[int, int]:
    """``(won, rounds)``: in how many rounds ``steps`` was shorter than ``baseline`` (ties count as lost),
    out of the rounds both recorded."""
    pairs = list(zip(steps, baseline, strict=False))
    return sum(step < base for step, base in pairs), len(pairs)


def noise_floor(copy: Sequence[float], original: Sequence[float]) -> float | None:
    """The spread between two copies of the same candidate recorded in the same rounds (an A/A control):
    ``|median_round_ratio(copy, original) - 1|``, e.g. 0.012 for copies 1.2% apart in the median round.

    Two identical candidates differ only by noise and their positions in the rounds, so a difference
    between two others no larger than this is not told from noise by this run. None without a round.
    """
    ratio = median_round_ratio(copy, original)
    return None if ratio is None else abs(ratio - 1.0)


def compare_rounds(named_steps: Sequence[tuple[str, Sequence[float]]]) -> dict[str, object]:
    """Every candidate's rounds against the first's, and the noise floor where a name comes twice.

    ``named_steps``: ``(name, steps)`` per candidate, steps round by round, all recorded in the same rounds;
    the first is the baseline. Returns ``{"baseline": name, "rows": [...], "noise_floor": float | None,
    "control": name | None}``: a row per candidate after the first, ``{"name", "median_round_ratio",
    "won", "rounds", "p", "within_noise"}`` (``p``: the one-sided sign test of its wins,
    :func:`~graphkit.measure.timing.sign_test_p_value`; ``within_noise``: its median round ratio is within
    the noise floor of 1); the noise floor is :func:`noise_floor` between the first two copies of the
    first name that comes twice (an A/A control), None where none does.
    """
    if not named_steps:
        return {"baseline": None, "rows": [], "noise_floor": None, "control": None}
    floor, control = None, None
    seen: dict[str, Sequence[float]] = {}
    for name, steps in named_steps:
        if name in seen and control is None:
            floor, control = noise_floor(steps, seen[name]), name
        seen.setdefault(name, steps)
    base_name, base = named_steps[0]
    rows = []
    for name, steps in named_steps[1:]:
        ratio = median_round_ratio(steps, base)
        won, rounds = rounds_won(steps, base)
        rows.append(
            {
                "name": name,
                "median_round_ratio": ratio,
                "won": won,
                "rounds": rounds,
                "p": sign_test_p_value(won, rounds),
                "within_noise": floor is not None and ratio is not None and abs(ratio - 1.0) <= floor,
            }
        )
    return {"baseline": base_name, "rows": rows, "noise_floor": floor, "control": control}
