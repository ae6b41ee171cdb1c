"""Device time as HTA reports it: temporal breakdown, comm-compute overlap, idle breakdown.

Definitions follow Holistic Trace Analysis 0.5 (``BreakdownAnalysis``, ``CommunicationAnalysis``)
so the numbers are comparable:

- **device events**: every event with a ``stream`` (kernels, copies, memsets, CUDA syncs). With
  two or more ``ProfilerStep`` markers, HTA keeps only device events whose launch (matched by
  ``correlation``) started before the last step began: the last, possibly cut, step is left out.
- **kernel type** by name: communication ``^nccl.*Kernel``; memory ``^Memcpy|^Memset|^dma``;
  other ``Memcpy``/``Sync`` anywhere; everything else compute.
- **temporal breakdown**: over the span from the first device event start to the last end,
  idle = span minus the union of device events; compute = union of compute events;
  non-compute = the union minus the compute union.
- **comm-compute overlap**: length of (union of communication) ∩ (union of compute) over the
  length of the communication union.
- **idle breakdown**: per stream, over the same device events less syncs, each gap between
  consecutive events is *host wait* when the later event was launched after the earlier one
  ended, else *kernel wait* when shorter than ``kernel_wait_us``, else *other*.

Where we differ on purpose: HTA rounds fractional (ns-resolution) timestamps to whole µs
(``ceil(ts)``, ``floor(end)``), which gives sub-µs kernels zero or negative durations; we keep
the trace's precision.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchtriage.analysis.correlation import runtime_for
from torchtriage.analysis.intervals import merge, unique
from torchtriage.trace.model import HOST_KINDS, EventKind, Trace

_HTA_COMM = re.compile(r"^nccl.*Kernel")
_HTA_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_HTA_OTHER = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_NOT_DEVICE = (*HOST_KINDS, EventKind.RUNTIME, EventKind.PYTHON, EventKind.TRACE_SPAN)


def hta_kernel_type(name: str) -> str:
    """HTA's kernel type: "communication", "memory", "other" or "compute"."""
    if _HTA_COMM.match(name):
        return "communication"
    if _HTA_MEMORY.match(name):
        return "memory"
    if _HTA_OTHER.match(name):
        return "other"
    return "compute"


class Temporal(msgspec.Struct, frozen=True):
    span_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float

    def pct(self, part: float) -> float:
        return 100.0 * part / self.span_us if self.span_us > 0 else 0.0


def hta_device_rows(trace: Trace) -> np.ndarray:
    """HTA's device events (see module docstring), sorted by start."""
    ev = trace.events
    rows = np.flatnonzero((ev.stream >= 0) & ~np.isin(ev.kind, _NOT_DEVICE))
    host = np.isin(ev.kind, HOST_KINDS)
    steps = np.flatnonzero(host & ev.name_mask(lambda n: "ProfilerStep" in n))
    if unique(ev.name_id[steps]).size >= 2:
        last_start = ev.ts[steps].max()
        launched = np.flatnonzero(np.isin(ev.kind, (*HOST_KINDS, EventKind.RUNTIME))
                                  & (ev.correlation >= 0) & (ev.ts < last_start))
        keep = (ev.correlation[rows] >= 0) & np.isin(ev.correlation[rows],
                                                     ev.correlation[launched])
        rows = rows[keep]
    return rows[np.argsort(ev.ts[rows], kind="stable")]


def _types(trace: Trace, rows: np.ndarray) -> np.ndarray:
    ev = trace.events
    per_name = np.array([hta_kernel_type(n) for n in ev.names], dtype=object)
    return per_name[ev.name_id[rows]] if rows.size else np.zeros(0, dtype=object)


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    s, e = merge(starts, ends)
    return float((e - s).sum())


def temporal_breakdown(trace: Trace) -> Temporal | None:
    """HTA's temporal breakdown; None without device events."""
    ev = trace.events
    rows = hta_device_rows(trace)
    if rows.size == 0:
        return None
    start, end = ev.ts[rows], ev.end[rows]
    s, e = merge(start, np.maximum(end, start))
    if s.size == 0:
        return None
    span = float(e[-1] - s[0])
    busy = float((e - s).sum())
    compute = _types(trace, rows) == "compute"
    compute_us = _union_length(start[compute], end[compute])
    return Temporal(span_us=span, idle_us=span - busy, compute_us=compute_us,
                    non_compute_us=busy - compute_us)


def comm_compute_overlap(trace: Trace) -> float | None:
    """HTA's comm-compute overlap in percent; None without communication kernels."""
    ev = trace.events
    rows = hta_device_rows(trace)
    types = _types(trace, rows)
    comm, compute = rows[types == "communication"], rows[types == "compute"]
    cs, ce = merge(ev.ts[comm], ev.end[comm])
    comm_time = float((ce - cs).sum())
    if comm_time <= 0:
        return None
    ks, ke = merge(ev.ts[compute], ev.end[compute])
    return 100.0 * _intersection(cs, ce, ks, ke) / comm_time


def _intersection(as_: np.ndarray, ae: np.ndarray, bs: np.ndarray, be: np.ndarray) -> float:
    """Length of the intersection of two disjoint, sorted interval sets."""
    if as_.size == 0 or bs.size == 0:
        return 0.0
    points = np.concatenate([as_, ae, bs, be])
    order = np.argsort(points, kind="stable")
    delta = np.concatenate([np.ones(as_.size), -np.ones(ae.size),
                            2 * np.ones(bs.size), -2 * np.ones(be.size)])[order]
    level = np.cumsum(delta)
    times = points[order]
    return float(((times[1:] - times[:-1]) * (level[:-1] == 3)).sum())


class IdleSplit(msgspec.Struct, frozen=True):
    """Idle time of one stream between its consecutive device events."""

    device: int
    stream: int
    host_wait_us: float
    kernel_wait_us: float
    other_us: float


_IDLE_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)


def idle_breakdown(trace: Trace, kernel_wait_us: float) -> list[IdleSplit]:
    """HTA's idle-time breakdown, per stream, over HTA's device events (kernels, copies, memsets).

    Gaps are taken between consecutive events in start order, as HTA takes them (a negative
    gap, from overlapping events, is summed too).
    """
    ev = trace.events
    rows = hta_device_rows(trace)
    rows = rows[np.isin(ev.kind[rows], _IDLE_KINDS)]
    launch = runtime_for(trace, rows)
    launch_ts = np.where(launch >= 0, ev.ts[np.maximum(launch, 0)], -np.inf)
    out = []
    keys = np.stack([ev.device[rows], ev.stream[rows]], axis=1)
    for device, stream in unique(keys, axis=0).tolist():  # sorted (device, stream)
        sel = np.flatnonzero((keys[:, 0] == device) & (keys[:, 1] == stream))
        sel = sel[np.argsort(ev.ts[rows[sel]], kind="stable")]
        prev_end = ev.end[rows[sel]][:-1]
        gap = ev.ts[rows[sel]][1:] - prev_end
        host = launch_ts[sel][1:] > prev_end
        short = gap < kernel_wait_us
        out.append(IdleSplit(device=device, stream=stream,
                             host_wait_us=float(gap[host].sum()),
                             kernel_wait_us=float(gap[~host & short].sum()),
                             other_us=float(gap[~host & ~short].sum())))
    return out
