"""The columnar trace model every analysis reads.

A :class:`Trace` holds one rank's Kineto trace as numpy columns (one row per complete ``ph: "X"``
event) plus a small table of allocator ``[memory]`` events. Strings (event names, threads) are
interned: a row stores an integer id into ``names`` / ``threads``, so per-name facts are computed
once per distinct name and broadcast with fancy indexing.

Times are microseconds, as in the trace file.
"""

from __future__ import annotations

from enum import IntEnum
from functools import cached_property
from typing import Any, Literal

import msgspec
import numpy as np


class EventKind(IntEnum):
    """Normalised event category. Raw Kineto categories map onto these (see ``CATEGORY_KIND``)."""

    OTHER = 0
    CPU_OP = 1  # cpu_op, legacy "Operator"
    USER_ANNOTATION = 2  # record_function ranges on the host
    GPU_USER_ANNOTATION = 3  # device-side copies of user annotations (ProfilerStep#N duplicates)
    KERNEL = 4  # device kernels (kernel, legacy "Kernel")
    MEMCPY = 5  # gpu_memcpy, legacy "Memcpy"
    MEMSET = 6  # gpu_memset, legacy "Memset"
    RUNTIME = 7  # cuda_runtime / cuda_driver / legacy "Runtime": launches, syncs, copies
    PYTHON = 8  # python_function (with_stack)
    SYNC = 9  # cuda_sync: device-side view of host syncs
    TRACE_SPAN = 10  # "Trace" spans written by the profiler itself


CATEGORY_KIND: dict[str, EventKind] = {
    "cpu_op": EventKind.CPU_OP,
    "Operator": EventKind.CPU_OP,
    "operator": EventKind.CPU_OP,
    "user_annotation": EventKind.USER_ANNOTATION,
    "gpu_user_annotation": EventKind.GPU_USER_ANNOTATION,
    "kernel": EventKind.KERNEL,
    "Kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.MEMCPY,
    "Memcpy": EventKind.MEMCPY,
    "gpu_memset": EventKind.MEMSET,
    "Memset": EventKind.MEMSET,
    "cuda_runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.RUNTIME,
    "Runtime": EventKind.RUNTIME,
    "python_function": EventKind.PYTHON,
    "cuda_sync": EventKind.SYNC,
    "Trace": EventKind.TRACE_SPAN,
}

HOST_KINDS = (EventKind.CPU_OP, EventKind.USER_ANNOTATION)
DEVICE_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)


class EventTable(msgspec.Struct, frozen=True, dict=True):
    """One row per complete event. All arrays have the same length."""

    kind: np.ndarray  # int8, EventKind
    name_id: np.ndarray  # int32 index into names
    thread_id: np.ndarray  # int32 index into threads
    ts: np.ndarray  # float64 µs
    dur: np.ndarray  # float64 µs
    external_id: np.ndarray  # int64, -1 when absent (links ops, launches and kernels)
    correlation: np.ndarray  # int64, -1 when absent (links a launch to its kernel)
    stream: np.ndarray  # int64, -1 when absent
    device: np.ndarray  # int64, -1 when absent
    nbytes: np.ndarray  # int64 bytes moved by a memcpy/memset, -1 when absent
    shape_offset: np.ndarray  # int64 into shapes_blob, -1 when the event has no "Input Dims"
    shape_length: np.ndarray  # int32 length of the raw "Input Dims" JSON in shapes_blob
    # (each row's raw "Input type" JSON follows its dims there: see input_types_span)
    names: list[str]
    threads: list[tuple[str, str]]  # (pid, tid) as strings
    shapes_blob: bytes = b""
    labels: list[str] = msgspec.field(default_factory=list)  # collective names and dtypes
    # Collective args, only for the rows that carry them (NCCL kernels, record_param_comms,
    # gloo:*): row -> (label id of the collective, elements or -1, group size or -1,
    # label id of the dtype or -1).
    collectives: dict[int, tuple[int, int, int, int]] = msgspec.field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @cached_property
    def end(self) -> np.ndarray:
        """ts + dur, computed once (read-only)."""
        end = self.ts + self.dur
        end.flags.writeable = False
        return end

    def name_mask(self, predicate: Any) -> np.ndarray:
        """Row mask of events whose name satisfies ``predicate(name) -> bool``.

        The predicate runs once per distinct name, not once per event.
        """
        per_name = np.fromiter((bool(predicate(n)) for n in self.names), dtype=bool,
                               count=len(self.names))
        if per_name.size == 0:
            return np.zeros(len(self), dtype=bool)
        return per_name[self.name_id]

    def input_types_span(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each row's raw ``Input type`` JSON lies in ``shapes_blob``: ingest writes it
        right after the row's ``Input Dims``, so it runs from there to the next row's dims
        (or the blob's end). Rows without dims get an empty span (0, 0)."""
        start = np.zeros(len(self), dtype=np.int64)
        end = np.zeros(len(self), dtype=np.int64)
        shaped = np.flatnonzero(self.shape_offset >= 0)
        if shaped.size == 0:
            return start, end
        shaped = shaped[np.argsort(self.shape_offset[shaped], kind="stable")]
        offsets = self.shape_offset[shaped]
        start[shaped] = offsets + self.shape_length[shaped]
        end[shaped] = np.append(offsets[1:], len(self.shapes_blob))
        return start, end

    def input_dims(self, row: int) -> bytes | None:
        """The raw JSON of the event's ``Input Dims`` (record_shapes), or None."""
        offset = int(self.shape_offset[row])
        if offset < 0:
            return None
        return self.shapes_blob[offset : offset + int(self.shape_length[row])]


class MemoryTable(msgspec.Struct, frozen=True):
    """Allocator events (``[memory]``): one row per allocation or free."""

    ts: np.ndarray  # float64 µs
    total_allocated: np.ndarray  # int64 bytes after the event
    total_reserved: np.ndarray  # int64 bytes after the event
    nbytes: np.ndarray  # int64, negative for a free
    device_type: np.ndarray  # int8, 0 = CPU, 1 = CUDA (c10 DeviceType)
    device_id: np.ndarray  # int16, -1 for CPU

    def __len__(self) -> int:
        return int(self.ts.shape[0])


class DeviceInfo(msgspec.Struct, frozen=True):
    """One entry of the trace's ``deviceProperties``."""

    id: int
    name: str
    total_memory: int  # bytes; 0 when unknown
    compute_major: int
    compute_minor: int
    num_sms: int


TimingIssueKind = Literal["missing_ts", "negative_duration", "duration_past_span", "duplicate"]
TimingAction = Literal["dropped", "clamped to 0"]
# Exact copies carry no information: dropping them restores the trace.
LOSSLESS_TIMING_ISSUES: frozenset[str] = frozenset({"duplicate"})


class TimingIssue(msgspec.Struct, frozen=True):
    """One kind of impossible timing: how many events had it and what was done with them."""

    kind: TimingIssueKind
    count: int
    action: TimingAction


class TimingCheck(msgspec.Struct, frozen=True):
    """What ``trace/quality.py`` found in a trace (no issues: a clean trace)."""

    events_read: int = 0  # complete events in the file, before any was dropped
    issues: tuple[TimingIssue, ...] = ()

    @property
    def damaged(self) -> int:
        """Events whose timing was lost or changed (exact duplicates not counted)."""
        return sum(i.count for i in self.issues if i.kind not in LOSSLESS_TIMING_ISSUES)

    @property
    def damaged_share(self) -> float:
        return self.damaged / self.events_read if self.events_read else 0.0


class TraceMeta(msgspec.Struct, frozen=True):
    """Top-level facts of the trace file."""

    path: str
    devices: tuple[DeviceInfo, ...] = ()
    distributed: dict[str, Any] | None = None
    rank: int | None = None
    world_size: int | None = None
    base_time_ns: int | None = None
    # What torchtriage's own capture wrote into the trace (warm-up and partial steps).
    torchtriage: dict[str, Any] = msgspec.field(default_factory=dict)
    raw_bytes: int = 0
    timing: TimingCheck = TimingCheck()  # impossible timings dropped or clamped at load


class Trace(msgspec.Struct, frozen=True, dict=True):
    """One rank's trace: events, allocator events and file metadata."""

    events: EventTable
    memory: MemoryTable
    meta: TraceMeta

    @cached_property
    def has_device_activity(self) -> bool:
        """True when the trace holds device (GPU) kernels, copies or memsets."""
        return bool(np.isin(self.events.kind, DEVICE_KINDS).any())
