"""FSDP in a trace: which FSDP, how many sharded units, how many all-gathers per step, and how
much of the all-gather time is hidden behind compute (prefetch effectiveness).

Algorithm:

* kind: ``fsdp2`` when ``FSDP::`` hook ranges are present (``fully_shard``), ``fsdp1`` for
  ``FullyShardedDataParallel.`` ranges, else None (no FSDP, nothing else is computed);
* units: FSDP2 names each unit's hooks after its module (``FSDP::pre_forward (layers.3)``;
  the root's has no suffix), so the distinct ``FSDP::pre_forward`` names count the units;
  FSDP1 ranges carry no name, so its ``_pre_forward`` calls per analysed step stand in;
* all-gathers per step: FSDP2's ``FSDP::all_gather`` ranges (one per unit and gather) in the
  analysed steps over their number; FSDP1: all-gather collectives per step from the
  collective table. With ``reshard_after_forward`` (FSDP2's default for every unit but the
  root) a unit is gathered twice per step, for forward and again for backward;
* hidden all-gather share: the all-gather work (NCCL all-gather kernels on a GPU trace; gloo
  all-gather ranges on a CPU one) within the analysed steps, and the part of it that compute
  covers: compute kernels on a GPU; on a CPU, the training thread's ops outside FSDP's hooks
  and collectives. 1 means every gather ran behind the previous block's compute (prefetch
  worked), 0 that each one was waited for.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import numpy as np

from torchtriage.analysis.categories import (
    FSDP1_PREFIX,
    FSDP2_PREFIX,
    is_communication_kernel,
    is_host_communication,
    is_sharding_communication,
    on_training_thread,
)
from torchtriage.analysis.collectives import CollectiveStats, is_collective
from torchtriage.analysis.intervals import covered_within, merge, subtract
from torchtriage.analysis.ops import in_steps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import HOST_KINDS, EventKind, Trace

FsdpKind = Literal["fsdp2", "fsdp1"]


def _is_gather(name: str) -> bool:
    return is_collective(name, "allgather")
_FSDP2_UNIT = FSDP2_PREFIX + "pre_forward"
_FSDP2_GATHER = FSDP2_PREFIX + "all_gather"
_FSDP1_UNIT = FSDP1_PREFIX + "_pre_forward"


class Sharding(msgspec.Struct, frozen=True):
    """FSDP's footprint in one trace (see the module docstring)."""

    kind: FsdpKind
    units: int  # sharded modules (FSDP2: distinct units; FSDP1: _pre_forward calls per step)
    all_gathers_per_step: float | None  # None when the trace does not tell
    all_gather_us: float  # all-gather work within the analysed steps
    all_gather_hidden: float | None  # share of it covered by compute (None without any)


def sharding(trace: Trace, steps: StepWindows, collectives: list[CollectiveStats],
             main_thread: int) -> Sharding | None:
    """FSDP's footprint (None when the trace shows no FSDP)."""
    ev = trace.events
    names = ev.names
    if any(n.startswith(FSDP2_PREFIX) for n in names):
        kind: FsdpKind = "fsdp2"
    elif any(n.startswith(FSDP1_PREFIX) for n in names):
        kind = "fsdp1"
    else:
        return None
    host = np.isin(ev.kind, HOST_KINDS)
    inside = in_steps(ev.ts, steps)
    n_steps = max(int(steps.start.size), 1)
    if kind == "fsdp2":
        units = len({n for n in names if n == _FSDP2_UNIT or n.startswith(_FSDP2_UNIT + " (")})
        gathers = host & inside & ev.name_mask(
            lambda n: n == _FSDP2_GATHER or n.startswith(_FSDP2_GATHER + " ("))
        per_step: float | None = round(int(gathers.sum()) / n_steps, 2)
    else:
        calls = host & inside & ev.name_mask(lambda n: n == _FSDP1_UNIT)
        units = round(int(calls.sum()) / n_steps)
        rows = [c for c in collectives if is_collective(c.op, "allgather")]
        per_step = round(sum(c.per_step for c in rows), 2) if rows else None
    if trace.has_device_activity:
        kernel = ev.kind == EventKind.KERNEL
        comm = kernel & ev.name_mask(is_communication_kernel)
        gather = comm & ev.name_mask(_is_gather)
        cs, ce = merge(ev.ts[kernel & ~comm], ev.end[kernel & ~comm])
    else:
        on_main = on_training_thread(trace, main_thread)
        gather = host & ~on_main & ev.name_mask(is_host_communication) & ev.name_mask(_is_gather)
        hooks = host & on_main & ev.name_mask(
            lambda n: is_sharding_communication(n) or is_host_communication(n))
        ops = host & on_main & ~ev.name_mask(lambda n: n.startswith("ProfilerStep#"))
        cs, ce = subtract(ev.ts[ops], ev.end[ops], ev.ts[hooks], ev.end[hooks])
    gs, ge = merge(ev.ts[gather], ev.end[gather])
    busy = float(covered_within(gs, ge, steps.start, steps.end).sum())
    bare_s, bare_e = subtract(gs, ge, cs, ce)
    bare = float(covered_within(bare_s, bare_e, steps.start, steps.end).sum())
    hidden = round(1 - bare / busy, 4) if busy > 0 else None
    return Sharding(kind=kind, units=units, all_gathers_per_step=per_step,
                    all_gather_us=round(busy, 1), all_gather_hidden=hidden)
