"""Steps far above the run's typical step, and the period at which they recur.

Input: each step's wall time, its step number, and which steps to leave out of the median
(profiled steps, the first steps of the run).

Algorithm: the median over the steps kept is the typical step. A step stalls when it takes
more than ``ratio`` times the median and at least ``min_excess_ms`` more than it (both: a
fast loop's jitter is not a stall, nor is a slow loop's few milliseconds). Stalls of one kind
recur at a period when there are at least three and the gaps between consecutive ones agree
with their median gap within one step or ``period_tolerance`` of it (the most common spacing,
such as every epoch's first step, every eval interval), and that gap is at least 2 (stalls in
consecutive steps are a slowdown, not a period). Each stall's excess is its time above
the median; their sum over the run's wall time is what removing them would give back.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StallScan:
    median_ms: float
    threshold_ms: float  # a step above this stalls
    stalls: tuple[int, ...]  # their step numbers, in order


def find_stalls(step_numbers: Sequence[int], step_ms: Sequence[float], *,
                left_out: set[int], ratio: float, min_excess_ms: float) -> StallScan | None:
    """The typical step and the steps that stall (module docstring); None when no step is
    kept for the median."""
    kept = [ms for n, ms in zip(step_numbers, step_ms, strict=True) if n not in left_out]
    if not kept:
        return None
    median = statistics.median(kept)
    threshold = max(ratio * median, median + min_excess_ms)
    stalls = tuple(n for n, ms in zip(step_numbers, step_ms, strict=True)
                   if n not in left_out and ms > threshold)
    return StallScan(median, threshold, stalls)


def period(steps: Sequence[int], *, tolerance: float) -> int | None:
    """The period at which these step numbers recur, or None (fewer than three, or gaps that
    do not agree: more than a third of them off the median gap by more than one step and
    ``tolerance`` of it)."""
    if len(steps) < 3:
        return None
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    typical = statistics.median(gaps)
    slack = max(1.0, tolerance * typical)
    agree = sum(abs(g - typical) <= slack for g in gaps)
    return round(typical) if agree * 3 >= 2 * len(gaps) and typical >= 2 else None


def excess_ms(step_ms: Sequence[float], median_ms: float) -> float:
    """Time above the median step, summed over these steps."""
    return float(sum(max(ms - median_ms, 0.0) for ms in step_ms))
