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
- :func:`process_set_sizes`, :func:`ratio_by_set`: rounds recorded in several sets of processes (each set
  new processes, new copies of what is measured), and one candidate's median round ratio in each;
- :func:`round_spread`, :func:`rounds_for_standard_error`: how far one round's difference between two
  candidates strays, and how many rounds bring a median round ratio's standard error down to a target;
- :func:`compare_rounds`: every candidate against the first, with the noise floor where a name comes twice
  (what ``graphkit compare-schedules`` prints under its table).

Steps are seconds (any unit, the same for both sides); ratios are the first side's step over the second's.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

from graphkit.measure.timing import sign_test_p_value

__all__ = [
    "balanced_order",
    "compare_rounds",
    "median_round_ratio",
    "noise_floor",
    "process_set_sizes",
    "ratio_by_set",
    "round_ratios",
    "round_spread",
    "rounds_for_standard_error",
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


LEAST_ROUNDS_PER_SET = 5
"""No set of processes is given fewer rounds than this (:func:`process_set_sizes`): a set's median round
needs a few rounds to be its own and not one round's."""


def process_set_sizes(rounds: int, sets: int) -> list[int]:
    """How ``rounds`` rounds are split into ``sets`` sets of processes (each recorded in new processes):
    fewer sets where one would get under :data:`LEAST_ROUNDS_PER_SET` rounds, as even as can be, the larger
    first (21 rounds in 3 sets: ``[7, 7, 7]``; 31: ``[11, 10, 10]``; 9: ``[9]``).

    A candidate's speed against another moves between sets of processes by more than between the rounds of
    one set: what a set's copies of the stages happen to get (where their memory lies, which core is
    quieter) stays with them for all of its rounds, so more rounds in one set do not average it out, and
    more sets do (GPT-2 on 2 pinned ranks, sets of 7 rounds: a median 3.8 points of 1F1B's step against
    the A/A control's 2.3, whose copies share their processes).

    Raises:
        ValueError: ``rounds`` or ``sets`` below 1.
    """
    if rounds < 1 or sets < 1:
        raise ValueError(f"rounds and sets must be at least 1, got {rounds} and {sets}")
    count = max(1, min(sets, rounds // LEAST_ROUNDS_PER_SET))
    size, extra = divmod(rounds, count)
    return [size + (1 if index < extra else 0) for index in range(count)]


def ratio_by_set(steps: Sequence[float], baseline: Sequence[float], sizes: Sequence[int]) -> list[float]:
    """:func:`median_round_ratio` of ``steps`` over ``baseline`` in each set of consecutive rounds of
    ``sizes`` (the sets of processes that recorded them, in order); a set either side left without a round
    is left out."""
    ratios = []
    start = 0
    for size in sizes:
        ratio = median_round_ratio(steps[start : start + size], baseline[start : start + size])
        if ratio is not None:
            ratios.append(ratio)
        start += size
    return ratios


MEDIAN_ABSOLUTE_DEVIATION_TO_SIGMA = 1.4826
"""The median absolute deviation of normal draws times this is their standard deviation (1 / Phi^-1(3/4))."""


def round_spread(candidates: Sequence[Sequence[float]], sizes: Sequence[int]) -> float | None:
    """How far one round's difference between two candidates strays: the standard deviation, estimated
    robustly, of ``log(a[i] / b[i])`` over the rounds ``i`` of every pair ``(a, b)`` of ``candidates``
    (steps round by round, all recorded in the same rounds, ``sizes`` the sets of processes that recorded
    them, in order, as :func:`process_set_sizes` splits them).

    Each pair's differences are taken about each set's own median (what a set adds to a pair for all of
    its rounds is not round-to-round spread; in a set of an odd number of rounds the round that is the
    median itself is left out, its deviation 0 by construction: kept, sets of 7 rounds read 0.84 of the
    true spread, left out 1.03), their median absolute deviation is scaled by
    :data:`MEDIAN_ABSOLUTE_DEVIATION_TO_SIGMA` (a stall that slows one step by half counts as one
    deviation, not as its square), and the pairs' are combined as the root of their mean square. Rounds
    where either step is not a finite number above 0 are left out. None with fewer than two candidates or
    no set of at least two rounds.

    GPT-2-sized steps of 150 ms on 2 pinned ranks of a 2-core virtual machine stray by 0.04 to 0.10
    (4 to 10% of a step) from round to round.

    Raises:
        ValueError: a size below 0, or ``sizes`` does not add up to every candidate's rounds.
    """
    if len(candidates) < 2:
        return None
    if any(size < 0 for size in sizes):
        raise ValueError(f"the sets' rounds must be at least 0, got {list(sizes)}")
    lengths = sorted({len(steps) for steps in candidates})
    if lengths != [sum(sizes)]:
        raise ValueError(
            f"the sets' rounds {list(sizes)} do not add up to the rounds recorded ({', '.join(map(str, lengths))})"
        )
    squares = []
    for first, second in itertools.combinations(candidates, 2):
        deviations: list[float] = []
        start = 0
        for size in sizes:
            differences = sorted(
                math.log(a) - math.log(b)
                for a, b in zip(first[start : start + size], second[start : start + size], strict=True)
                if 0 < a < math.inf and 0 < b < math.inf
            )
            start += size
            if len(differences) >= 2:
                middle = statistics.median(differences)
                if len(differences) % 2:  # the median round itself says nothing of the spread
                    del differences[len(differences) // 2]
                deviations += [abs(difference - middle) for difference in differences]
        if deviations:
            squares.append((MEDIAN_ABSOLUTE_DEVIATION_TO_SIGMA * statistics.median(deviations)) ** 2)
    return math.sqrt(statistics.fmean(squares)) if squares else None


def rounds_for_standard_error(spread: float, standard_error: float) -> int:
    """The fewest rounds whose median round difference has a standard error of at most ``standard_error``
    where one round's strays by ``spread`` (:func:`round_spread`; both as fractions, logarithms of ratios):
    ``ceil(pi / 2 x (spread / standard_error) ** 2)``, the large-sample variance of the median of normal
    draws, ``pi sigma^2 / (2 n)`` (Laplace; e.g. Stuart and Ord, Kendall's Advanced Theory of Statistics,
    vol. 1, 10.10), at least 1. Split into sets of processes, each set's median counts alike and the
    standard error of their mean is the same.

    A spread of 0.08 needs 101 rounds for a standard error of 0.01, 26 for 0.02.

    Raises:
        ValueError: ``spread`` below 0 or not finite, ``standard_error`` not above 0 or not finite, or
            more rounds than a float can count.
    """
    if not (0 <= spread < math.inf and 0 < standard_error < math.inf):
        raise ValueError(
            f"spread must be at least 0 and standard_error above 0, got {spread} and {standard_error}"
        )
    try:
        rounds = math.pi / 2 * (spread / standard_error) ** 2
    except OverflowError:
        rounds = math.inf
    if rounds == math.inf:
        raise ValueError(
            f"a standard error of {standard_error} at a spread of {spread} needs more rounds than can be counted"
        )
    return max(1, math.ceil(rounds - 1e-9))


def noise_floor(copy: Sequence[float], original: Sequence[float]) -> float | None:
    """The spread between two copies of the same candidate recorded in the same rounds (an A/A control):
    ``|median_round_ratio(copy, original) - 1|``, e.g. 0.012 for copies 1.2% apart in the median round.

    Two identical candidates differ only by noise and their positions in the rounds, so a difference
    between two others no larger than this is not told from noise by this run. None without a round.
    """
    ratio = median_round_ratio(copy, original)
    return None if ratio is None else abs(ratio - 1.0)


def compare_rounds(
    named_steps: Sequence[tuple[str, Sequence[float]]], set_sizes: Sequence[int] | None = None
) -> dict[str, object]:
    """Every candidate's rounds against the first's, and the noise floor where a name comes twice.

    ``named_steps``: ``(name, steps)`` per candidate, steps round by round, all recorded in the same rounds;
    the first is the baseline. ``set_sizes``: where the rounds were recorded in several sets of processes,
    how many rounds each set recorded, in order (:func:`process_set_sizes`); then each candidate's ratio is
    the mean over the sets of each set's median round ratio (:func:`ratio_by_set`), so that every set
    counts alike, and the noise floor the control's, so taken. Returns ``{"baseline": name, "rows": [...],
    "noise_floor": float | None, "control": name | None, "sets": sizes}``: a row per candidate after the
    first, ``{"name", "median_round_ratio", "by_set", "won", "rounds", "p", "within_noise"}``
    (``median_round_ratio``: over all rounds, or the mean of the sets' with several sets; ``by_set``: each
    set's, [] with one set; ``p``: the one-sided sign test of its wins,
    :func:`~graphkit.measure.timing.sign_test_p_value`; ``within_noise``: its ratio is within the noise
    floor of 1); the noise floor is the spread between the first two copies of the first name that comes
    twice (an A/A control, :func:`noise_floor`), None where none does.

    Raises:
        ValueError: ``set_sizes`` does not add up to the baseline's rounds.
    """
    if not named_steps:
        return {
            "baseline": None,
            "rows": [],
            "noise_floor": None,
            "control": None,
            "sets": [],
            "round_spread": None,
            "standard_error": None,
        }
    base_name, base = named_steps[0]
    sizes = list(set_sizes or [])
    if sizes and sum(sizes) != len(base):
        raise ValueError(f"the sets' rounds {sizes} do not add up to the {len(base)} rounds recorded")
    several = len(sizes) > 1

    def ratio_of(steps: Sequence[float], against: Sequence[float]) -> tuple[float | None, list[float]]:
        if not several:
            return median_round_ratio(steps, against), []
        by_set = ratio_by_set(steps, against, sizes)
        return (statistics.fmean(by_set) if by_set else None), by_set

    floor, control = None, None
    seen: dict[str, Sequence[float]] = {}
    for name, steps in named_steps:
        if name in seen and control is None:
            ratio, _ = ratio_of(steps, seen[name])
            floor, control = (None if ratio is None else abs(ratio - 1.0)), name
        seen.setdefault(name, steps)
    rows = []
    for name, steps in named_steps[1:]:
        ratio, by_set = ratio_of(steps, base)
        won, rounds = rounds_won(steps, base)
        rows.append(
            {
                "name": name,
                "median_round_ratio": ratio,
                "by_set": by_set,
                "won": won,
                "rounds": rounds,
                "p": sign_test_p_value(won, rounds),
                "within_noise": floor is not None and ratio is not None and abs(ratio - 1.0) <= floor,
            }
        )
    rounds = len(base)
    alike = rounds and all(len(steps) == rounds for _, steps in named_steps)  # else no spread is taken
    spread = round_spread([steps for _, steps in named_steps], sizes or [rounds]) if alike else None
    return {
        "baseline": base_name,
        "rows": rows,
        "noise_floor": floor,
        "control": control,
        "sets": sizes,
        "round_spread": spread,
        "standard_error": None if spread is None else math.sqrt(math.pi / 2) * spread / math.sqrt(rounds),
    }
