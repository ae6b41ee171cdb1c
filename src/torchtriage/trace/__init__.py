"""Kineto trace ingest: chrome-trace JSON in, columnar :class:`Trace` tables out."""

from torchtriage.trace.discover import find_trace_files
from torchtriage.trace.ingest import load_trace
from torchtriage.trace.model import EventKind, EventTable, MemoryTable, Trace, TraceMeta

__all__ = [
    "EventKind",
    "EventTable",
    "MemoryTable",
    "Trace",
    "TraceMeta",
    "find_trace_files",
    "load_trace",
]
