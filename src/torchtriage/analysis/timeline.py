"""Timeline lanes: when each kind of work ran, over a few analysed steps (for the report's
timeline overview).

A lane is the union of one category's events (:func:`categories.category_masks`: device
kernels, communication, copies, runtime calls, data loading, host ops; on CPU traces data
loading, forward, backward, optimizer, communication), clipped to a window of steps. The gaps
in the device lanes are the device's idle time.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchtriage.analysis.categories import category_masks
from torchtriage.analysis.intervals import merge
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import Trace

# lane order, top to bottom: where the host's time goes, then what the device does
GPU_LANES = ("data_loading", "cpu_exec", "runtime", "h2d_input", "memcpy", "memset", "kernel",
             "communication")
CPU_LANES = ("data_loading", "forward", "backward", "optimizer", "communication")
MAX_INTERVALS = 4000  # per lane; beyond it the shortest gaps are closed


class Lane(msgspec.Struct, frozen=True):
    name: str
    start_ms: np.ndarray  # from the window's start
    end_ms: np.ndarray
    busy_ms: float


class Timeline(msgspec.Struct, frozen=True):
    steps: list[int]  # step numbers in the window
    step_start_ms: list[float]  # each step's start, from the window's start
    span_ms: float
    lanes: list[Lane]


def timeline(trace: Trace, steps: StepWindows, max_steps: int = 3) -> Timeline | None:
    """Lanes over the first ``max_steps`` analysed steps (None without steps)."""
    if len(steps.start) == 0:
        return None
    count = min(max_steps, len(steps.start))
    lo, hi = float(steps.start[0]), float(steps.end[count - 1])
    ev = trace.events
    masks = category_masks(trace, steps.main_thread)
    names = GPU_LANES if trace.has_device_activity else CPU_LANES
    lanes = []
    in_window = (ev.end > lo) & (ev.ts < hi)
    for name in names:
        rows = np.flatnonzero(masks[name] & in_window)
        if rows.size == 0:
            continue
        s, e = merge(np.maximum(ev.ts[rows], lo), np.minimum(ev.end[rows], hi))
        s, e = _simplify(s, e)
        lanes.append(Lane(name=name, start_ms=(s - lo) / 1e3, end_ms=(e - lo) / 1e3,
                          busy_ms=float((e - s).sum()) / 1e3))
    return Timeline(steps=[int(n) for n in steps.numbers[:count]],
                    step_start_ms=[float(x - lo) / 1e3 for x in steps.start[:count]],
                    span_ms=(hi - lo) / 1e3, lanes=lanes)


def _simplify(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most MAX_INTERVALS intervals: close the shortest gaps (a drawing, not a metric)."""
    if s.size <= MAX_INTERVALS:
        return s, e
    gaps = s[1:] - e[:-1]
    keep_gap = np.zeros(gaps.size, dtype=bool)
    keep_gap[np.argsort(gaps)[-(MAX_INTERVALS - 1):]] = True
    starts = np.concatenate([s[:1], s[1:][keep_gap]])
    ends = np.concatenate([e[:-1][keep_gap], e[-1:]])
    return starts, ends
