"""GPU busy time per stream and overall, and the kernel-class breakdown.

Busy time is the union of device-event intervals (kernels, copies, memsets) inside the analysed
steps; utilization is busy time over the steps' wall time.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchtriage.analysis.dense import dense_unique
from torchtriage.analysis.intervals import covered_within, merge, unique
from torchtriage.analysis.kernels import KERNEL_CLASSES, DeviceOps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import Trace


class StreamBusy(msgspec.Struct, frozen=True):
    device: int
    stream: int
    busy_us: float
    events: int


class ClassTime(msgspec.Struct, frozen=True):
    cls: str
    count: int
    time_us: float
    tensor_core_us: float  # matrix kernels whose name shows tensor-core use
    no_tensor_core_us: float  # matrix kernels whose name shows they do not use them


class KernelTime(msgspec.Struct, frozen=True):
    name: str
    cls: str
    count: int
    time_us: float
    tensor_cores: bool | None
    launched_by: str | None  # the most frequent launching host op


def union_in_steps(trace: Trace, rows: np.ndarray, steps: StepWindows) -> float:
    """Length of the union of the events' intervals, clipped to the step windows."""
    ev = trace.events
    s, e = merge(ev.ts[rows], ev.end[rows])
    return float(covered_within(s, e, steps.start, steps.end).sum())


def busy_time(trace: Trace, ops: DeviceOps, steps: StepWindows) -> tuple[float, list[StreamBusy]]:
    """(overall busy µs, per-stream busy) within the analysed steps."""
    ev = trace.events
    overall = union_in_steps(trace, ops.rows, steps)
    per_stream = []
    keys = np.stack([ev.device[ops.rows], ev.stream[ops.rows]], axis=1) if ops.rows.size else \
        np.zeros((0, 2), dtype=np.int64)
    for device, stream in unique(keys, axis=0).tolist():  # sorted (device, stream)
        sel = ops.rows[(keys[:, 0] == device) & (keys[:, 1] == stream)]
        per_stream.append(StreamBusy(device=device, stream=stream,
                                     busy_us=union_in_steps(trace, sel, steps),
                                     events=int(sel.size)))
    per_stream.sort(key=lambda s: -s.busy_us)
    return overall, per_stream


def class_times(trace: Trace, ops: DeviceOps) -> list[ClassTime]:
    """Device time per kernel class, largest first (sums of durations, overlap counted twice)."""
    dur = trace.events.dur[ops.rows]
    out = []
    for i, cls in enumerate(KERNEL_CLASSES):
        sel = ops.cls == i
        if not sel.any():
            continue
        out.append(ClassTime(
            cls=cls, count=int(sel.sum()), time_us=float(dur[sel].sum()),
            tensor_core_us=float(dur[sel & (ops.tensor_core == 1)].sum()),
            no_tensor_core_us=float(dur[sel & (ops.tensor_core == 0)].sum()),
        ))
    out.sort(key=lambda c: -c.time_us)
    return out


def top_kernels(trace: Trace, ops: DeviceOps, limit: int) -> list[KernelTime]:
    """Kernels by total time, each with the host op that most often launched it."""
    ev = trace.events
    if ops.rows.size == 0:
        return []
    name_ids = ev.name_id[ops.rows]
    uniq, inverse, counts = dense_unique(name_ids, len(ev.names))
    times = np.bincount(inverse, weights=ev.dur[ops.rows])
    out = []
    for u in np.argsort(-times, kind="stable")[:limit]:
        sel = inverse == u
        launchers = ops.launcher[sel]
        launchers = launchers[launchers >= 0]
        launched_by = None
        if launchers.size:
            ids, n = np.unique(ev.name_id[launchers], return_counts=True)
            launched_by = ev.names[int(ids[np.argmax(n)])]
        tc = int(ops.tensor_core[sel][0])
        out.append(KernelTime(
            name=ev.names[int(uniq[u])], cls=KERNEL_CLASSES[int(ops.cls[sel][0])],
            count=int(counts[u]), time_us=float(times[u]),
            tensor_cores=None if tc < 0 else bool(tc), launched_by=launched_by,
        ))
    return out
