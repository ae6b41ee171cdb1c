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

Where the syncs come from (:func:`sync_sources`): each blocking runtime call in the analysed
steps is placed in the innermost host op that contains it (one sync per op: a synchronous
copy and a synchronize inside one ``aten::copy_`` wait once), and the op's chain of
containers says what the code asked for: an op with a data-dependent output shape
(``aten::nonzero``, ``masked_select``, ``unique``, ...) anywhere in it, a tensor taken as a
Python bool (``aten::is_nonzero``: an ``if`` or a ``while`` on a tensor), a scalar read, a copy
whose device copy (joined by correlation) goes host-to-device (``x.to(device)`` from pageable
memory or without ``non_blocking``) or device-to-host (``.cpu()``, ``.tolist()``), or no op at
all (``torch.cuda.synchronize()``, an event's or a stream's ``synchronize()``). The site
named is the outermost operator (a name with ``::``) of the chain: the call the code made.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Literal

import msgspec
import numpy as np

from torchtriage.analysis.correlation import runtime_for
from torchtriage.analysis.intervals import unique
from torchtriage.analysis.ops import OpNesting, ancestors, in_steps, innermost_ops
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
COPY_OPS = ("aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::_to_copy",
            "aten::to")
# ops whose output shape depends on the data: the host reads a count from the device
DATA_DEPENDENT_OPS = ("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique",
                      "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim",
                      "aten::unique_dim_consecutive", "aten::repeat_interleave",
                      "aten::bincount")
SyncKind = Literal["data_dependent", "condition", "scalar_read", "copy_to_device",
                   "copy_to_host", "outside_ops", "other"]


class SyncSource(msgspec.Struct, frozen=True):
    """Syncs of one kind at one site, over the analysed steps."""

    kind: SyncKind
    op: str  # the outermost operator the syncs run inside (the code's call); "" outside ops
    waits_in: str  # the innermost op that waited; "" outside ops
    count: int


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
    sync_sources: list[SyncSource] = msgspec.field(default_factory=list)  # most syncs first

    def sync_count(self, kind: SyncKind) -> int:
        """The syncs of one kind over the analysed steps, all sites."""
        return sum(src.count for src in self.sync_sources if src.kind == kind)


def transfers(trace: Trace, steps: StepWindows, nesting: OpNesting) -> Transfers:
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
        sync_sources=sync_sources(trace, steps, nesting, blocking, copies),
    )


def sync_sources(trace: Trace, steps: StepWindows, nesting: OpNesting,
                 blocking: np.ndarray, copies: np.ndarray) -> list[SyncSource]:
    """The syncs among ``blocking`` runtime calls in the analysed steps, by kind and site: on
    the training thread when the steps name one (a sync on another thread, a logger's, does
    not stop the loop). ``copies``: the device copies in the analysed steps, which tell a copy
    op's direction."""
    ev = trace.events
    blocking = blocking[in_steps(ev.ts[blocking], steps)]
    if steps.main_thread >= 0:
        blocking = blocking[ev.thread_id[blocking] == steps.main_thread]
    if not blocking.size:
        return []
    inner = innermost_ops(trace, nesting, blocking)
    waits = sorted(set(inner[inner >= 0].tolist()))
    directions = _copy_directions(trace, nesting, copies, waits)

    def name(op: int) -> str:
        return ev.names[ev.name_id[nesting.rows[op]]]

    counts: Counter[tuple[SyncKind, str, str]] = Counter()
    counts.update(("outside_ops", "", "") for _ in range(int((inner < 0).sum())))
    for op in waits:  # one sync per op that waited
        chain = [name(i) for i in ancestors(nesting, op)]
        calls = [n for n in chain if "::" in n]
        site = calls[-1] if calls else chain[-1]
        counts[(_sync_kind(chain, directions.get(op)), site, chain[0])] += 1
    return [SyncSource(kind=kind, op=op, waits_in=inner_name, count=n)
            for (kind, op, inner_name), n in counts.most_common()]


def _sync_kind(chain: list[str], direction: str | None) -> SyncKind:
    if any(n in DATA_DEPENDENT_OPS for n in chain):
        return "data_dependent"
    if "aten::is_nonzero" in chain:  # bool(t): a tensor in an if or a while
        return "condition"
    if any(n in SCALAR_READS for n in chain):
        return "scalar_read"
    if chain[0] in COPY_OPS and direction in ("h2d", "d2h"):
        return "copy_to_device" if direction == "h2d" else "copy_to_host"
    return "other"


def _copy_directions(trace: Trace, nesting: OpNesting, copies: np.ndarray,
                     ops: list[int]) -> dict[int, str]:
    """For the ops of ``ops`` (indices into ``nesting.rows``) that issued one of the device
    ``copies``: its direction, "h2d", "d2h" or "d2d" (the copy is joined to its runtime call by
    correlation, the call to the innermost op that contains it)."""
    ev = trace.events
    calls = runtime_for(trace, copies)
    copies, calls = copies[calls >= 0], calls[calls >= 0]
    if not copies.size or not ops:
        return {}
    issuer = innermost_ops(trace, nesting, calls)
    wanted = np.isin(issuer, ops)
    out: dict[int, str] = {}
    for op, row in zip(issuer[wanted].tolist(), copies[wanted].tolist(), strict=True):
        copy = ev.names[ev.name_id[row]]
        out.setdefault(op, "h2d" if _H2D.search(copy) else "d2h" if _D2H.search(copy)
                       else "d2d")
    return out


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
