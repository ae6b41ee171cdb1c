"""Peak memory from allocator events (``[memory]``, written with ``profile_memory=True``)."""

from __future__ import annotations

import msgspec
import numpy as np

from torchtriage.analysis.intervals import unique
from torchtriage.trace.model import Trace

CPU_DEVICE_TYPE = 0


class DeviceMemory(msgspec.Struct, frozen=True):
    """Peak usage of one device, as the allocator saw it."""

    device: str  # "cpu" or "cuda:N"
    peak_allocated: int  # bytes held by live tensors at the peak
    peak_reserved: int  # bytes held by the caching allocator (0 on CPU)
    reserved_at_peak_allocated: int
    events: int
    baseline: int = 0  # CPU: bytes alive before recording started, included in peak_allocated
    # CPU: bytes whose free the profiler did not see (freed on a thread it does not record),
    # when they made the peak be taken step by step (over UNSEEN_FREES_SLACK_BYTES); else 0
    unseen_free_bytes: int = 0


def memory_peaks(trace: Trace, step_starts_us: np.ndarray | None = None) -> list[DeviceMemory]:
    """Per-device peaks, largest allocated first. Empty when the trace has no ``[memory]``.

    CUDA totals are absolute (the caching allocator's own counters). CPU totals start at zero
    when recording starts; torchtriage's capture writes the CPU tensor bytes alive at that
    moment (gradients left out, see capture/live_memory.py) as ``cpu_baseline_bytes`` in the trace
    metadata, and the peak is that plus the largest total.

    The CPU total misses frees made on threads the profiler does not record: a tensor
    allocated by the training thread and freed by a gloo worker thread (FSDP2's all-gather and
    reduce-scatter buffers) stays counted, and the total climbs step after step (6-10 MiB a
    step on a 2-rank FSDP2 job, torch 2.13, more or less as the machine's load decides which
    thread frees them). The capture also counts the bytes alive right after the last recorded
    step (``cpu_live_end_bytes``, gradients included); the frees it did not see are then
    ``baseline + last total - live at the end``. When they pass ``UNSEEN_FREES_SLACK_BYTES`` and
    ``step_starts_us`` is given, the peak is taken step by step instead, the steps assumed at
    steady state (each starts with what is alive at the end): the first step's as above, each
    later step's as the bytes alive at the end plus how far its total rises above the total at
    its start. That is exact for a steady loop whatever was missed before the step; a missed
    free inside a step still counts, once.
    """
    mem = trace.memory
    meta = trace.meta.torchtriage
    cpu_baseline = _byte_count(meta.get("cpu_baseline_bytes")) or 0
    cpu_live_end = _byte_count(meta.get("cpu_live_end_bytes"))
    if len(mem) == 0:
        return []
    key = mem.device_type.astype(np.int64) * 1_000 + mem.device_id.astype(np.int64)
    out = []
    for k in unique(key):
        sel = np.flatnonzero(key == k)
        alloc = mem.total_allocated[sel]
        reserved = mem.total_reserved[sel]
        at = int(np.argmax(alloc))
        dtype, did = int(mem.device_type[sel[0]]), int(mem.device_id[sel[0]])
        cpu = dtype == CPU_DEVICE_TYPE
        baseline = cpu_baseline if cpu else 0
        peak = int(alloc.max()) + baseline
        unseen = 0
        if cpu and cpu_live_end is not None and step_starts_us is not None:
            ts = mem.ts[sel]
            last = int(alloc[ts.size - 1 - np.argmax(ts[::-1])])  # the last in time order
            unseen = max(0, baseline + last - cpu_live_end)
            if unseen > UNSEEN_FREES_SLACK_BYTES:
                order = np.argsort(ts, kind="stable")
                peak = _steady_state_peak(ts[order], alloc[order], step_starts_us, baseline,
                                          cpu_live_end)
            else:
                unseen = 0  # the peak as recorded
        out.append(
            DeviceMemory(
                device="cpu" if cpu else f"cuda:{max(did, 0)}",
                peak_allocated=peak,
                # On CPU "Total Reserved" only tracks shared-memory tensors from loader workers.
                peak_reserved=0 if cpu else int(reserved.max()),
                reserved_at_peak_allocated=0 if cpu else int(reserved[at]),
                events=int(sel.size),
                baseline=baseline,
                unseen_free_bytes=unseen,
            )
        )
    return sorted(out, key=lambda d: -d.peak_allocated)


UNSEEN_FREES_SLACK_BYTES = 1 << 20  # below this, the peak is taken as recorded


def _byte_count(value: object) -> int | None:
    """A capture's byte count from the trace metadata; None when absent or not one (an edited
    trace: the peak is then taken as for a trace captured elsewhere)."""
    return value if type(value) is int and value >= 0 else None


def _steady_state_peak(ts: np.ndarray, alloc: np.ndarray, step_starts_us: np.ndarray,
                       baseline: int, live_end: int) -> int:
    """The CPU peak step by step (see memory_peaks): ``ts``/``alloc`` in time order."""
    starts = np.sort(np.asarray(step_starts_us, dtype=np.float64))
    step = np.searchsorted(starts, ts, side="right")  # 0: before the 2nd step starts
    step = np.maximum(step - 1, 0)
    peak = 0
    for k in unique(step).tolist():
        rows = np.flatnonzero(step == k)
        high = int(alloc[rows].max())
        if k == 0:
            peak = max(peak, baseline + high)
        else:
            at_start = int(alloc[rows[0] - 1]) if rows[0] > 0 else 0
            peak = max(peak, live_end + high - at_start)
    return peak


class MemoryCurve(msgspec.Struct, frozen=True):
    """Allocated bytes over time on one device, for the report's memory figure."""

    device: str  # "cpu" or "cuda:N"
    time_ms: np.ndarray  # from the trace's first memory event
    allocated_bytes: np.ndarray


def memory_curves(trace: Trace, max_points: int = 3000) -> list[MemoryCurve]:
    """Each device's ``total allocated`` series in time order, evenly thinned to at most
    ``max_points`` samples (the first and last kept). Empty without ``[memory]`` events."""
    mem = trace.memory
    if len(mem.ts) == 0:
        return []
    t0 = float(mem.ts.min())
    curves = []
    pairs = unique(np.stack([mem.device_type, mem.device_id], 1), axis=0).tolist()
    for device_type, device_id in pairs:
        sel = np.flatnonzero((mem.device_type == device_type) & (mem.device_id == device_id))
        sel = sel[np.argsort(mem.ts[sel], kind="stable")]
        if sel.size > max_points:
            sel = sel[np.linspace(0, sel.size - 1, max_points).astype(int)]
        device = "cpu" if device_type == CPU_DEVICE_TYPE else f"cuda:{device_id}"
        curves.append(MemoryCurve(device=device, time_ms=(mem.ts[sel] - t0) / 1e3,
                                  allocated_bytes=mem.total_allocated[sel]))
    return curves
