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


def memory_peaks(trace: Trace) -> list[DeviceMemory]:
    """Per-device peaks, largest allocated first. Empty when the trace has no ``[memory]``.

    CUDA totals are absolute (the caching allocator's own counters). CPU totals start at zero
    when recording starts; torchtriage's capture writes the CPU tensor bytes alive at that
    moment as ``cpu_baseline_bytes`` in the trace metadata, and it is added here.
    """
    mem = trace.memory
    cpu_baseline = int(trace.meta.torchtriage.get("cpu_baseline_bytes", 0) or 0)
    if len(mem) == 0:
        return []
    key = mem.device_type.astype(np.int64) * 1_000 + mem.device_id.astype(np.int64)
    out = []
    for k in unique(key):
        sel = key == k
        alloc = mem.total_allocated[sel]
        reserved = mem.total_reserved[sel]
        at = int(np.argmax(alloc))
        dtype, did = int(mem.device_type[sel][0]), int(mem.device_id[sel][0])
        baseline = cpu_baseline if dtype == CPU_DEVICE_TYPE else 0
        out.append(
            DeviceMemory(
                device="cpu" if dtype == CPU_DEVICE_TYPE else f"cuda:{max(did, 0)}",
                peak_allocated=int(alloc.max()) + baseline,
                # On CPU "Total Reserved" only tracks shared-memory tensors from loader workers.
                peak_reserved=0 if dtype == CPU_DEVICE_TYPE else int(reserved.max()),
                reserved_at_peak_allocated=0 if dtype == CPU_DEVICE_TYPE else int(reserved[at]),
                events=int(sel.sum()),
                baseline=baseline,
            )
        )
    return sorted(out, key=lambda d: -d.peak_allocated)


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
