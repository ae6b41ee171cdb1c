"""Timings that cannot be real: found, dropped or clamped, and counted.

A trace whose events carry impossible timings gives a confident wrong verdict unless they are
taken out; this module takes them out and says how many, so that the diagnosis can say so and
judge whether what is left still bears a verdict (``diagnosis/thresholds.py``:
``timing_damage_lower`` and ``timing_damage_refuse``).

Algorithm, over the loaded event columns (vectorised numpy; on the 87 MB MTIA trace, 138,000
events, 5-12 ms of a 1.0-1.3 s load, most of it one sort of a uint64 column):

1. Counted while decoding (``trace/columns.py``): a complete event without ``ts`` has no place
   in time and is left out (``missing_ts``: dropped); a negative ``dur`` is clamped to 0
   (``negative_duration``: clamped).
2. Durations past the trace's span: with ``S`` = the latest start minus the earliest, an event
   that ends more than :data:`PAST_SPAN_FACTOR` times ``S`` after the latest start cannot be a
   timing of this trace (a ``dur`` of 1e18 µs is 31,000 years). Real traces do hold events
   that outlast the others' starts many times over (HTA's triton_example: a ProfilerStep ends
   37 S after the last start; the profiler's own span 13 S), so the factor is far above them.
   Dropped (``duration_past_span``): its length is unknown, and clamping it would still count
   time that never ran. Not checked when every event starts at one instant (``S`` = 0).
3. Exact duplicates: events equal in every column (kind, name, thread, ts, dur, external id,
   correlation, stream, device, bytes, shape length) but the first of each are dropped
   (``duplicate``). Rows are hashed to one uint64 and sorted; only rows whose hash repeats are
   compared column by column, so a hash collision never drops a distinct event.

Exact duplicates carry no information, so dropping them restores the trace; the other kinds
lose timings, and their share of the events read is the trace's ``damaged_share``.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchtriage.trace.model import (
    EventTable,
    TimingAction,
    TimingCheck,
    TimingIssue,
)

_ACTION: dict[str, TimingAction] = {"missing_ts": "dropped", "negative_duration": "clamped to 0",
                                    "duration_past_span": "dropped", "duplicate": "dropped"}
PAST_SPAN_FACTOR = 1000.0  # spans of the starts past the last start at which a dur is impossible
# Odd 64-bit multipliers (splitmix64 / xxhash primes) for the row hash.
_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5,
        0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9,
        0x85EBCA77C2B2AE63, 0xD6E8FEB86659FD93, 0xA0761D6478BD642F)
_COLUMNS = ("ts", "dur", "kind", "name_id", "thread_id", "external_id", "correlation",
            "stream", "device", "nbytes", "shape_length")


def check_timings(events: EventTable, missing_ts: int = 0, negative_duration: int = 0
                  ) -> tuple[EventTable, TimingCheck]:
    """``events`` without impossible timings, and what was found (see the module docstring).

    ``missing_ts`` and ``negative_duration`` are the counts the decoder kept (those events are
    already left out or clamped)."""
    counts = {"missing_ts": missing_ts, "negative_duration": negative_duration}
    keep = np.ones(len(events), dtype=bool)
    if len(events):
        first, last = float(events.ts.min()), float(events.ts.max())
        if last > first:
            past = events.ts + events.dur > last + PAST_SPAN_FACTOR * (last - first)
            counts["duration_past_span"] = int(np.count_nonzero(past))
            keep &= ~past
        duplicate = _duplicates(events)
        duplicate &= keep
        counts["duplicate"] = int(np.count_nonzero(duplicate))
        keep &= ~duplicate
    issues = tuple(TimingIssue(kind=k, count=n, action=_ACTION[k])  # type: ignore[arg-type]
                   for k, n in counts.items() if n)
    check = TimingCheck(events_read=len(events) + missing_ts, issues=issues)
    return (events if keep.all() else _take(events, keep)), check


def _duplicates(events: EventTable) -> np.ndarray:
    """Rows equal in every column of :data:`_COLUMNS` to an earlier row."""
    columns = [_bits(getattr(events, c)) for c in _COLUMNS]
    with np.errstate(over="ignore"):
        h = np.zeros(len(events), dtype=np.uint64)
        for column, mix in zip(columns, _MIX, strict=False):
            h = (h ^ column) * np.uint64(mix)
    ordered = np.sort(h)  # a plain sort: several times faster than an argsort
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    out = np.zeros(len(events), dtype=bool)
    if not repeated.size:
        return out
    suspects = np.flatnonzero(np.isin(h, repeated))  # ascending rows: the first one is kept
    rows = np.rec.fromarrays([c[suspects] for c in columns])
    _, first = np.unique(rows, return_index=True)
    out[suspects] = True
    out[suspects[first]] = False
    return out


def _bits(column: np.ndarray) -> np.ndarray:
    """A column as uint64 with equal values equal (floats by their bits, -0.0 as 0.0)."""
    if column.dtype == np.float64:
        return (column + 0.0).view(np.uint64)
    return column.astype(np.int64, copy=False).view(np.uint64)


def _take(events: EventTable, keep: np.ndarray) -> EventTable:
    """The rows of ``keep``; the collective args follow their rows."""
    index = np.cumsum(keep) - 1
    fields = {c: getattr(events, c)[keep] for c in (
        "kind", "name_id", "thread_id", "ts", "dur", "external_id", "correlation", "stream",
        "device", "nbytes", "shape_offset", "shape_length")}
    collectives = {int(index[row]): args for row, args in events.collectives.items()
                   if keep[row]}
    return msgspec.structs.replace(events, collectives=collectives, **fields)
