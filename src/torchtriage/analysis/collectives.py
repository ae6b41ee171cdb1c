"""The collective table: which collectives run, how often, how long, how many bytes, how fast.

Sources: NCCL kernels that carry ``Collective name`` / ``In msg nelems`` / ``Group size`` /
``dtype`` (PyTorch >= 2.1 traces), else ``record_param_comms`` host ops with the same args, and
on CPU the ``gloo:*`` ranges (elements from their ``Input Dims``, dtype from ``Input type``).
Bandwidths follow nccl-tests: algbw = bytes / time; busbw = algbw x (2(n-1)/n for all-reduce,
(n-1)/n for all-gather, reduce-scatter and all-to-all, 1 otherwise).
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

import msgspec

from torchtriage.analysis.ops import in_steps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import EventKind, Trace

_DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
                "bfloat16": 2, "c10::bfloat16": 2, "c10::half": 2, "int": 4, "int32": 4,
                "long": 8, "int64": 8, "int8": 1, "uint8": 1, "char": 1, "byte": 1, "bool": 1}


class CollectiveStats(msgspec.Struct, frozen=True):
    op: str
    source: str  # "nccl kernel" | "record_param_comms" | "gloo"
    count: int
    per_step: float
    time_us: float
    mean_us: float
    bytes_per_call: float | None
    group_size: int | None
    algbw_gbps: float | None
    busbw_gbps: float | None


CollectiveKind = Literal["allreduce", "allgather", "reducescatter", "alltoall"]


def is_collective(name: str, kind: CollectiveKind) -> bool:
    """Whether a collective's name (an op, an NCCL kernel, a gloo range) is of ``kind``,
    whatever its case and underscores (``all_gather_into_tensor``, ``gloo:all_gather``,
    ``ncclDevKernel_AllGather_RING``)."""
    return kind in name.lower().replace("_", "")


def _factor(op: str, n: int) -> float:
    if n <= 1:
        return 1.0
    if is_collective(op, "allreduce"):
        return 2 * (n - 1) / n
    if any(is_collective(op, k) for k in ("allgather", "reducescatter", "alltoall")):
        return (n - 1) / n
    return 1.0


def collective_table(trace: Trace, steps: StepWindows) -> list[CollectiveStats]:
    ev = trace.events
    if not ev.collectives:
        return []
    kinds = ev.kind
    by_source: dict[str, list[int]] = {"nccl kernel": [], "record_param_comms": [], "gloo": []}
    for row in ev.collectives:
        name = ev.names[ev.name_id[row]]
        if kinds[row] == EventKind.KERNEL:
            by_source["nccl kernel"].append(row)
        elif name == "record_param_comms":
            by_source["record_param_comms"].append(row)
        elif name.startswith("gloo:"):
            by_source["gloo"].append(row)
    # Device kernels time the collective itself; host ranges are the fallback.
    source = next((s for s in ("nccl kernel", "gloo", "record_param_comms") if by_source[s]),
                  None)
    if source is None:
        return []
    candidates = by_source[source]
    keep = in_steps(ev.ts[candidates], steps)
    rows = [r for r, k in zip(candidates, keep.tolist(), strict=True) if k]
    groups: dict[str, list[int]] = {}
    for r in rows:
        groups.setdefault(ev.labels[ev.collectives[r][0]], []).append(r)
    out = []
    n_steps = max(len(steps), 1)
    world = trace.meta.world_size
    for op, members in groups.items():
        durations = [float(ev.dur[r]) for r in members]
        sizes = [s for s in (_bytes(trace, r) for r in members) if s is not None]
        group = next((g for g in (ev.collectives[r][2] for r in members) if g > 0), None) \
            or world
        total = sum(durations)
        algbw = sum(sizes) / (total * 1e-6) / 1e9 if sizes and total > 0 and \
            len(sizes) == len(members) else None
        out.append(CollectiveStats(
            op=op, source=source, count=len(members), per_step=len(members) / n_steps,
            time_us=total, mean_us=total / len(members),
            bytes_per_call=statistics.median(sizes) if sizes else None,
            group_size=group, algbw_gbps=algbw,
            busbw_gbps=algbw * _factor(op, group or 1) if algbw is not None else None,
        ))
    out.sort(key=lambda c: -c.time_us)
    return out


def _bytes(trace: Trace, row: int) -> float | None:
    ev = trace.events
    _, nelems, _, dtype_id = ev.collectives[row]
    if nelems < 0:
        dims = ev.input_dims(row)
        if dims is None:
            return None
        try:
            first = msgspec.json.decode(dims)[0]
        except (ValueError, IndexError, TypeError):
            return None
        while first and isinstance(first[0], list):  # TensorList: [[n]]
            first = first[0]
        nelems = math.prod(first) if first else -1
    if nelems < 0:
        return None
    dtype = ev.labels[dtype_id].lower() if dtype_id >= 0 else "float"
    return float(nelems * _DTYPE_BYTES.get(dtype, 4))
