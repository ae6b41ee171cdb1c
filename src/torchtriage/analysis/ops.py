"""Operator statistics: nesting, self time, top ops on the host and top kernels on the device."""

from __future__ import annotations

import msgspec
import numpy as np

from torchtriage.analysis.dense import dense_unique
from torchtriage.analysis.intervals import covers
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import DEVICE_KINDS, EventKind, Trace


def _is_step_marker(name: str) -> bool:
    return name.startswith("ProfilerStep#")


class OpNesting(msgspec.Struct, frozen=True):
    """For the host ops (``cpu_op``) of a trace: row indices, self time, depth, subtree max,
    and each op's direct parent."""

    rows: np.ndarray  # int64 rows of the event table
    self_us: np.ndarray  # float64 duration minus direct children's durations
    depth: np.ndarray  # int32, 0 = outermost op on its thread
    max_self_us: np.ndarray  # float64 largest self time in the op's subtree (itself included)
    parent: np.ndarray  # int64 index into ``rows`` of the direct parent, -1 at a root


class OpStat(msgspec.Struct, frozen=True):
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
                         max_self_us=empty, parent=rows.copy())
    order, first = _by_thread_and_start(ev.thread_id[rows], ev.ts[rows], ev.dur[rows])
    rows = rows[order]
    start, dur = ev.ts[rows], ev.dur[rows]
    n = len(rows)
    # An op's parent is the op a stack of open ops would have on top when it starts: the
    # latest earlier op of its thread that is still running (ends after it starts).
    parent = _latest_still_running(start, start + dur, first)
    has = parent >= 0
    self_us = np.maximum(dur - np.bincount(parent[has], weights=dur[has], minlength=n), 0.0)
    depth = _depths(parent)
    max_self = self_us.copy()
    by_depth = np.argsort(-depth, kind="stable")  # deepest first: children before parents
    levels = np.split(by_depth, np.flatnonzero(np.diff(depth[by_depth])) + 1)
    for level in levels:
        if depth[level[0]] > 0:  # roots have no parent to pass their maximum to
            np.maximum.at(max_self, parent[level], max_self[level])
    return OpNesting(rows=rows, self_us=self_us, depth=depth, max_self_us=max_self,
                     parent=parent)


def innermost_ops(trace: Trace, nesting: OpNesting, rows: np.ndarray) -> np.ndarray:
    """For each event of ``rows`` (runtime calls, say): the innermost host op on its thread
    that contains it, as an index into ``nesting.rows``, -1 where none does.

    The events are placed among the ops of their thread in start order (ties: the longer
    first, so an op that starts with an event contains it); an event's innermost container is
    the latest earlier op still running when it starts (the search that finds an op's parent
    in :func:`op_nesting`). Its other containers follow by ``nesting.parent`` (:func:`ancestors`).
    """
    ev = trace.events
    ops = nesting.rows
    if not rows.size or not ops.size:
        return np.full(rows.size, -1, dtype=np.int64)
    start = np.concatenate([ev.ts[ops], ev.ts[rows]])
    dur = np.concatenate([ev.dur[ops], ev.dur[rows]])
    order, first = _by_thread_and_start(
        np.concatenate([ev.thread_id[ops], ev.thread_id[rows]]), start, dur)
    start, dur = start[order], dur[order]
    n = order.size
    # the queried events contain nothing (an end before every start)
    end = np.where(order < ops.size, start + dur, -np.inf)
    found = _latest_still_running(start, end, first)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    at = found[position[ops.size:]]
    return np.where(at >= 0, order[np.maximum(at, 0)], -1)


def ancestors(nesting: OpNesting, op: int) -> list[int]:
    """``op`` (an index into ``nesting.rows``) and the ops that contain it, innermost first."""
    chain = []
    while op >= 0:
        chain.append(op)
        op = int(nesting.parent[op])
    return chain


def _by_thread_and_start(tid: np.ndarray, start: np.ndarray, dur: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The order that sorts events by thread, then start (the longer first at a tie, so a
    container comes before what it contains), and for each sorted position the position of
    its thread's first event: what :func:`_latest_still_running` searches within."""
    order = np.lexsort((-dur, start, tid))
    tid = tid[order]
    new_thread = np.ones(order.size, dtype=bool)
    new_thread[1:] = tid[1:] != tid[:-1]
    return order, np.maximum.accumulate(np.where(new_thread, np.arange(order.size), 0))


def _latest_still_running(start: np.ndarray, end: np.ndarray, first: np.ndarray
                          ) -> np.ndarray:
    """For each row ``i``: the largest ``j`` in ``[first[i], i)`` with ``end[j] > start[i]``,
    else -1. A sparse table of window maxima of ``end`` is searched from ``i - 1`` backwards,
    skipping whole windows that end too early, for all rows at once (O(n log n), no loop over
    rows)."""
    n = len(start)
    maxima = [end]  # maxima[p][x] = max(end[x - 2**p + 1 : x + 1]) (clipped at 0)
    width = 1
    while width * 2 <= n:
        level = maxima[-1].copy()
        level[width:] = np.maximum(level[width:], maxima[-1][:-width])
        maxima.append(level)
        width *= 2
    pos = np.arange(n, dtype=np.int64) - 1
    for p in range(len(maxima) - 1, -1, -1):
        rows = np.flatnonzero(pos >= 0)
        skip = rows[maxima[p][pos[rows]] <= start[rows]]
        pos[skip] -= 1 << p
    found = pos >= first
    found[found] = end[pos[found]] > start[found]
    return np.where(found, pos, -1)


def _depths(parent: np.ndarray) -> np.ndarray:
    """Ancestors of each row (``parent[i] < i``, -1 at a root), by pointer jumping."""
    depth = (parent >= 0).astype(np.int32)
    ancestor = parent.copy()
    while (live := np.flatnonzero(ancestor >= 0)).size:
        up = ancestor[live]
        depth[live] += depth[up]
        ancestor[live] = ancestor[up]
    return depth


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
    uniq, inverse, counts = dense_unique(name_id, len(names))
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
