"""Operator statistics: nesting, self time, top ops on the host and top kernels on the device."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchtriage.analysis.intervals import covers
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import DEVICE_KINDS, EventKind, Trace


def _is_step_marker(name: str) -> bool:
    return name.startswith("ProfilerStep#")


@dataclass(frozen=True)
class OpNesting:
    """For the host ops (``cpu_op``) of a trace: row indices, self time, depth, subtree max."""

    rows: np.ndarray  # int64 rows of the event table
    self_us: np.ndarray  # float64 duration minus direct children's durations
    depth: np.ndarray  # int32, 0 = outermost op on its thread
    max_self_us: np.ndarray  # float64 largest self time in the op's subtree (itself included)


@dataclass(frozen=True)
class OpStat:
    name: str
    count: int
    total_us: float  # inclusive time (host ops) or kernel time (device)
    self_us: float  # exclusive time; equals total_us for device kernels
    share: float  # self_us over the analysed wall time (host) or device time (device)


def op_nesting(trace: Trace) -> OpNesting:
    """Direct-parent nesting of ``cpu_op`` events, per thread.

    ``max_self_us`` tells whether an op does real work anywhere below it: a wrapper such as
    ``aten::linear`` whose every nested op has a tiny self time is dispatch, not compute.
    """
    ev = trace.events
    # ProfilerStep#N is a cpu_op in legacy traces; it is a step marker, not an op.
    rows = np.flatnonzero((ev.kind == EventKind.CPU_OP) & ~ev.name_mask(_is_step_marker))
    if rows.size == 0:
        empty = np.zeros(0)
        return OpNesting(rows=rows, self_us=empty, depth=empty.astype(np.int32),
                         max_self_us=empty)
    order = np.lexsort((-ev.dur[rows], ev.ts[rows], ev.thread_id[rows]))
    rows = rows[order]
    tid = ev.thread_id[rows].tolist()
    start = ev.ts[rows].tolist()
    end = (ev.ts[rows] + ev.dur[rows]).tolist()
    dur = ev.dur[rows].tolist()
    n = len(rows)
    child_sum = [0.0] * n
    depth = [0] * n
    parent = [-1] * n
    stack: list[int] = []
    current_tid = None
    for i in range(n):
        if tid[i] != current_tid:
            stack.clear()
            current_tid = tid[i]
        while stack and end[stack[-1]] <= start[i]:
            stack.pop()
        if stack:
            p = stack[-1]
            child_sum[p] += dur[i]
            depth[i] = len(stack)
            parent[i] = p
        stack.append(i)
    self_us = [max(d - c, 0.0) for d, c in zip(dur, child_sum, strict=True)]
    max_self = list(self_us)
    for i in range(n - 1, -1, -1):  # children sort after their parents
        p = parent[i]
        if p >= 0 and max_self[i] > max_self[p]:
            max_self[p] = max_self[i]
    return OpNesting(rows=rows, self_us=np.asarray(self_us), depth=np.asarray(depth, np.int32),
                     max_self_us=np.asarray(max_self))


def in_steps(ts: np.ndarray, steps: StepWindows) -> np.ndarray:
    """Mask of timestamps that fall inside an analysed step."""
    return covers(ts, steps.start, steps.end)


def top_host_ops(trace: Trace, nesting: OpNesting, steps: StepWindows, limit: int) -> list[OpStat]:
    """Host ops ranked by self time within the analysed steps (``key_averages`` style)."""
    ev = trace.events
    keep = in_steps(ev.ts[nesting.rows], steps)
    rows, self_us = nesting.rows[keep], nesting.self_us[keep]
    wall = float(steps.wall.sum()) or 1.0
    return _group(ev.name_id[rows], ev.dur[rows], self_us, ev.names, wall, limit)


def top_device_ops(trace: Trace, steps: StepWindows, limit: int) -> list[OpStat]:
    """Device kernels, copies and memsets ranked by time within the analysed steps."""
    ev = trace.events
    rows = np.flatnonzero(np.isin(ev.kind, DEVICE_KINDS))
    rows = rows[in_steps(ev.ts[rows], steps)]
    busy = float(ev.dur[rows].sum()) or 1.0
    return _group(ev.name_id[rows], ev.dur[rows], ev.dur[rows], ev.names, busy, limit)


def _group(
    name_id: np.ndarray,
    total: np.ndarray,
    self_us: np.ndarray,
    names: list[str],
    denominator: float,
    limit: int,
) -> list[OpStat]:
    if name_id.size == 0:
        return []
    uniq, inverse, counts = np.unique(name_id, return_inverse=True, return_counts=True)
    tot = np.bincount(inverse, weights=total)
    slf = np.bincount(inverse, weights=self_us)
    order = np.argsort(-slf, kind="stable")[:limit]
    return [
        OpStat(
            name=names[int(uniq[i])],
            count=int(counts[i]),
            total_us=float(tot[i]),
            self_us=float(slf[i]),
            share=float(slf[i] / denominator),
        )
        for i in order
    ]
