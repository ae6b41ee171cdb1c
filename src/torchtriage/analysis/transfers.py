"""Host-device copies and host-device syncs.

Copy direction and source memory come from the copy names Kineto writes
(``Memcpy HtoD (Pageable -> Device)``, ``Memcpy DtoH (Device -> Pinned)``, ...). A copy from or
to pageable memory is synchronous for the host whatever API issued it; a plain ``cudaMemcpy``
(no ``Async``) is synchronous too.

A sync is a call that waits for the device: the runtime's synchronize calls, and a scalar read
(``aten::item`` / ``aten::_local_scalar_dense``) only when a blocking runtime call (a
synchronize or a synchronous copy) runs inside it on the same thread. A scalar read of a CPU
tensor (indexing a numpy memmap with 0-d tensors, say) waits for nothing: it is counted apart,
as host work, with its time.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchtriage.analysis.intervals import unique
from torchtriage.analysis.ops import in_steps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import EventKind, Trace

DEVICE_SYNC_CALLS = (
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
)
SCALAR_READS = ("aten::item", "aten::_local_scalar_dense")
SYNC_CALLS = DEVICE_SYNC_CALLS + SCALAR_READS
_SYNC_COPY_API = re.compile(r"^(cuda|hip)Memcpy(2D|3D)?$")
_H2D = re.compile(r"HtoD|HostToDevice", re.I)
_D2H = re.compile(r"DtoH|DeviceToHost", re.I)
_D2D = re.compile(r"DtoD|DeviceToDevice|PtoP", re.I)


class CopyStats(msgspec.Struct, frozen=True):
    count: int = 0
    pageable: int = 0
    bytes: int = 0
    time_us: float = 0.0


class Transfers(msgspec.Struct, frozen=True):
    h2d: CopyStats
    d2h: CopyStats
    d2d: CopyStats
    sync_copy_calls: int  # cudaMemcpy / hipMemcpy without Async
    syncs_per_step: dict[str, float] = msgspec.field(default_factory=dict)  # call -> count per step
    cpu_scalar_reads_per_step: float = 0.0  # scalar reads that waited for no device work
    cpu_scalar_read_us_per_step: float = 0.0


def transfers(trace: Trace, steps: StepWindows) -> Transfers:
    ev = trace.events
    copies = np.flatnonzero(ev.kind == EventKind.MEMCPY)
    copies = copies[in_steps(ev.ts[copies], steps)]
    pageable_rows = ev.name_mask(lambda n: "Pageable" in n)[copies]

    def stats(pattern: re.Pattern[str]) -> CopyStats:
        sel = ev.name_mask(pattern.search)[copies]  # the pattern runs once per distinct name
        pageable = int((sel & pageable_rows).sum())
        moved = ev.nbytes[copies[sel]]
        return CopyStats(count=int(sel.sum()), pageable=pageable,
                         bytes=int(moved[moved > 0].sum()),
                         time_us=float(ev.dur[copies[sel]].sum()))

    n_steps = max(len(steps), 1)
    blocking = np.flatnonzero((ev.kind == EventKind.RUNTIME) & (
        ev.name_mask(lambda n: n in DEVICE_SYNC_CALLS) | ev.name_mask(_SYNC_COPY_API.match)))
    syncs = {}
    for call in DEVICE_SYNC_CALLS:
        rows = np.flatnonzero(ev.name_mask(lambda n, c=call: n == c))
        count = int(in_steps(ev.ts[rows], steps).sum())
        if count:
            syncs[call] = round(count / n_steps, 2)
    cpu_reads, cpu_read_us = 0, 0.0
    for call in SCALAR_READS:
        rows = np.flatnonzero(ev.name_mask(lambda n, c=call: n == c))
        rows = rows[in_steps(ev.ts[rows], steps)]
        waits = _contains(ev, rows, blocking)
        if waits.any():
            syncs[call] = round(int(waits.sum()) / n_steps, 2)
        if not cpu_reads:  # the outermost read op only (item wraps _local_scalar_dense)
            cpu_reads, cpu_read_us = int((~waits).sum()), float(ev.dur[rows[~waits]].sum())
    sync_api = ev.name_mask(_SYNC_COPY_API.match) & (ev.kind == EventKind.RUNTIME)
    return Transfers(
        h2d=stats(_H2D), d2h=stats(_D2H), d2d=stats(_D2D),
        sync_copy_calls=int(in_steps(ev.ts[sync_api], steps).sum()),
        syncs_per_step=syncs,
        cpu_scalar_reads_per_step=round(cpu_reads / n_steps, 2),
        cpu_scalar_read_us_per_step=round(cpu_read_us / n_steps, 3),
    )


def _contains(ev, rows: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Per row of ``rows``: whether an event of ``inner`` starts inside it on its thread."""
    out = np.zeros(rows.size, dtype=bool)
    if not rows.size or not inner.size:
        return out
    for thread in unique(ev.thread_id[rows]):
        mine = ev.thread_id[rows] == thread
        starts = np.sort(ev.ts[inner[ev.thread_id[inner] == thread]])
        lo = np.searchsorted(starts, ev.ts[rows[mine]], side="left")
        hi = np.searchsorted(starts, ev.end[rows[mine]], side="right")
        out[mine] = hi > lo
    return out
