"""Step-time attribution: every microsecond of every step goes to exactly one category.

Categories claim time in priority order (:mod:`torchtriage.analysis.categories`): the time
covered by a category's events, minus what higher categories already claimed, is that
category's *exposed* time. The remainder category takes what nobody claimed, so the categories
of a step sum to its wall time exactly.

On CPU traces the optimizer claims its own time only
(:func:`~torchtriage.analysis.categories.optimizer_own_intervals`): the forward, loss and
backward of a closure that ``optimizer.step(closure)`` runs (LBFGS, Lightning) fall to the
categories of their own ops. Communication claims the training thread's own collective and
FSDP sharding time, wherever it runs (inside forward or backward too), and background
collectives only where no training-thread op hides them
(:func:`~torchtriage.analysis.categories.communication_intervals`).
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchtriage.analysis.categories import (
    categories_for,
    category_masks,
    communication_intervals,
    optimizer_own_intervals,
)
from torchtriage.analysis.intervals import boundaries, merge, segments_covered
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import Trace


class StepBreakdown(msgspec.Struct, frozen=True):
    """Exposed time per step and category, in microseconds."""

    categories: tuple[str, ...]
    step_numbers: np.ndarray  # int64
    wall_us: np.ndarray  # float64 [steps]
    exposed_us: np.ndarray  # float64 [steps, categories]

    @property
    def total_wall_us(self) -> float:
        return float(self.wall_us.sum())

    @property
    def total_exposed_us(self) -> np.ndarray:
        return self.exposed_us.sum(axis=0)

    def share(self, category: str) -> float:
        """Share of total step time exposed in ``category`` (0 when there is no step time)."""
        total = self.total_wall_us
        if total <= 0:
            return 0.0
        return float(self.total_exposed_us[self.categories.index(category)] / total)


def step_breakdown(trace: Trace, steps: StepWindows) -> StepBreakdown:
    """Attribute the wall time of each step in ``steps`` to the trace mode's categories."""
    categories = categories_for(trace)
    masks = category_masks(trace, steps.main_thread)
    claims = [(trace.events.ts[masks[c]], trace.events.end[masks[c]]) for c in categories[:-1]]
    if "optimizer" in categories:  # CPU
        claims[categories.index("optimizer")] = optimizer_own_intervals(trace)
        claims[categories.index("communication")] = communication_intervals(
            trace, masks, steps.main_thread)
    exposed = attribute(steps.start, steps.end, claims)
    return StepBreakdown(
        categories=categories,
        step_numbers=steps.numbers.copy(),
        wall_us=steps.wall.copy(),
        exposed_us=exposed,
    )


def attribute(
    window_start: np.ndarray,
    window_end: np.ndarray,
    claims: list[tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """Exposed time per window for prioritised interval sets, plus a remainder column.

    Args:
        window_start, window_end: disjoint windows (steps), sorted by start.
        claims: per category in priority order, the (starts, ends) of its intervals.

    Returns:
        float64 array [windows, len(claims) + 1]; each row sums to the window's length.
    """
    n_win, n_cat = window_start.size, len(claims) + 1
    out = np.zeros((n_win, n_cat), dtype=np.float64)
    if n_win == 0:
        return out
    lo, hi = float(window_start.min()), float(window_end.max())
    merged = []
    points = [window_start, window_end]
    for starts, ends in claims:
        s, e = merge(np.clip(starts, lo, hi), np.clip(ends, lo, hi))
        merged.append((s, e))
        points.extend((s, e))
    bounds = boundaries(points)
    seg_start, seg_end = bounds[:-1], bounds[1:]
    length = seg_end - seg_start
    # Every window's and claim's ends are bounds, so a segment lies wholly inside or outside
    # each: its start says which (exact, where a midpoint may round onto an end).
    win = np.searchsorted(window_start, seg_start, side="right") - 1
    in_win = win >= 0
    in_win[in_win] = seg_start[in_win] < window_end[win[in_win]]
    owner = np.full(seg_start.size, n_cat - 1, dtype=np.int64)
    claimed = np.zeros(seg_start.size, dtype=bool)
    for c, (s, e) in enumerate(merged):
        active = segments_covered(bounds, s, e) & ~claimed
        owner[active] = c
        claimed |= active
    np.add.at(out, (win[in_win], owner[in_win]), length[in_win])
    # Rounding: make each row sum to its window exactly by adjusting the remainder.
    out[:, -1] += (window_end - window_start) - out.sum(axis=1)
    out[:, -1] = np.maximum(out[:, -1], 0.0)
    return out
