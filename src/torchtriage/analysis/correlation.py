"""Joining device events to the host calls that launched them (``correlation`` ids)."""

from __future__ import annotations

import numpy as np

from torchtriage.trace.model import EventKind, Trace


def runtime_for(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Row of the runtime call with the same correlation as each of ``rows`` (-1 if none)."""
    ev = trace.events
    runtime = np.flatnonzero((ev.kind == EventKind.RUNTIME) & (ev.correlation >= 0))
    out = np.full(rows.size, -1, dtype=np.int64)
    if runtime.size == 0 or rows.size == 0:
        return out
    runtime = runtime[np.argsort(ev.correlation[runtime], kind="stable")]
    corr = ev.correlation[runtime]
    want = ev.correlation[rows]
    pos = np.clip(np.searchsorted(corr, want), 0, corr.size - 1)
    ok = (want >= 0) & (corr[pos] == want)
    out[ok] = runtime[pos[ok]]
    return out
