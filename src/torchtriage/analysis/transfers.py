"""Host-device copies and host-device syncs.

Copy direction and source memory come from the copy names Kineto writes
(``Memcpy HtoD (Pageable -> Device)``, ``Memcpy DtoH (Device -> Pinned)``, ...). A copy from or
to pageable memory is synchronous for the host whatever API issued it; a plain ``cudaMemcpy``
(no ``Async``) is synchronous too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from torchtriage.analysis.ops import in_steps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import EventKind, Trace

SYNC_CALLS = (
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
    "aten::item", "aten::_local_scalar_dense",
)
_SYNC_COPY_API = re.compile(r"^(cuda|hip)Memcpy(2D|3D)?$")
_H2D = re.compile(r"HtoD|HostToDevice", re.I)
_D2H = re.compile(r"DtoH|DeviceToHost", re.I)
_D2D = re.compile(r"DtoD|DeviceToDevice|PtoP", re.I)


@dataclass(frozen=True)
class CopyStats:
    count: int = 0
    pageable: int = 0
    bytes: int = 0
    time_us: float = 0.0


@dataclass(frozen=True)
class Transfers:
    h2d: CopyStats
    d2h: CopyStats
    d2d: CopyStats
    sync_copy_calls: int  # cudaMemcpy / hipMemcpy without Async
    syncs_per_step: dict[str, float] = field(default_factory=dict)  # call -> count per step


def transfers(trace: Trace, steps: StepWindows) -> Transfers:
    ev = trace.events
    copies = np.flatnonzero(ev.kind == EventKind.MEMCPY)
    copies = copies[in_steps(ev.ts[copies], steps)]
    names = [ev.names[i] for i in ev.name_id[copies]]

    def stats(pattern: re.Pattern[str]) -> CopyStats:
        sel = np.array([bool(pattern.search(n)) for n in names], dtype=bool)
        pageable = sum(1 for n, s in zip(names, sel, strict=True) if s and "Pageable" in n)
        moved = ev.nbytes[copies[sel]]
        return CopyStats(count=int(sel.sum()), pageable=pageable,
                         bytes=int(moved[moved > 0].sum()),
                         time_us=float(ev.dur[copies[sel]].sum()))

    n_steps = max(len(steps), 1)
    syncs = {}
    for call in SYNC_CALLS:
        count = int(in_steps(ev.ts[ev.name_mask(lambda n, c=call: n == c)], steps).sum())
        if count:
            syncs[call] = round(count / n_steps, 2)
    sync_api = ev.name_mask(_SYNC_COPY_API.match) & (ev.kind == EventKind.RUNTIME)
    return Transfers(
        h2d=stats(_H2D), d2h=stats(_D2H), d2d=stats(_D2D),
        sync_copy_calls=int(in_steps(ev.ts[sync_api], steps).sum()),
        syncs_per_step=syncs,
    )
