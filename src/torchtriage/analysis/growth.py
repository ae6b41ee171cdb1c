"""Whether a per-step memory reading grows steadily: a fitted slope and its noise.

Input: the step number of each reading, its bytes, and a segment id per reading (readings of
one segment are comparable; a new segment starts where something shifted the level without
being growth, such as the profiler's buffers in the process's RSS).

Algorithm: one least-squares slope shared by all segments, each segment centred on its own
mean (the within-segment estimator: a level shift between segments is not slope); its standard
error from the residuals, with one degree of freedom spent per segment and one on the slope.
The same fit over the first and over the second half of the readings (by position) says
whether the growth holds over the run or was one jump. Nothing here decides what is enough:
the caller compares the figures with its thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SlopeFit:
    slope: float  # bytes per step
    stderr: float  # the slope's standard error (inf with no residual degrees of freedom)
    points: int

    @property
    def t(self) -> float:
        """The slope in standard errors (inf for an exact fit with a non-zero slope)."""
        if self.stderr > 0:
            return self.slope / self.stderr
        return float("inf") if self.slope else 0.0


@dataclass(frozen=True)
class GrowthFit:
    whole: SlopeFit
    first_half: SlopeFit | None
    second_half: SlopeFit | None


def within_segment_slope(steps: Sequence[float], values: Sequence[float],
                         segments: Sequence[int]) -> SlopeFit | None:
    """The pooled within-segment least-squares slope (module docstring); None when fewer
    than two readings share a segment or every segment has a single step."""
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    seg = np.asarray(segments)
    if x.size < 2:
        return None
    xc = np.empty_like(x)
    yc = np.empty_like(y)
    groups = np.unique(seg)
    for g in groups:
        mask = seg == g
        xc[mask] = x[mask] - x[mask].mean()
        yc[mask] = y[mask] - y[mask].mean()
    sxx = float((xc * xc).sum())
    if sxx <= 0:
        return None
    slope = float((xc * yc).sum()) / sxx
    dof = x.size - groups.size - 1
    if dof <= 0:
        return SlopeFit(slope, float("inf"), int(x.size))
    residual = yc - slope * xc
    stderr = float(np.sqrt((residual * residual).sum() / dof / sxx))
    return SlopeFit(slope, stderr, int(x.size))


def fit_growth(steps: Sequence[float], values: Sequence[float],
               segments: Sequence[int] | None = None) -> GrowthFit | None:
    """The slope over all readings and over each half (module docstring); None when no slope
    can be fitted."""
    segments = [0] * len(steps) if segments is None else segments
    whole = within_segment_slope(steps, values, segments)
    if whole is None:
        return None
    half = len(steps) // 2
    first = within_segment_slope(steps[:half], values[:half], segments[:half])
    second = within_segment_slope(steps[half:], values[half:], segments[half:])
    return GrowthFit(whole, first, second)
