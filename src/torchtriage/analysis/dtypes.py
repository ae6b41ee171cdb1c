"""Float64 work: how much of the analysed steps' op time runs in double precision.

Autocast leaves float64 tensors in float64, so a step spent in float64 gains nothing from bf16
autocast. Host ops: record_shapes writes each op's ``Input type`` ("double" for a float64
tensor, "Scalar" for a Python number); ingest keeps it right after the op's ``Input Dims`` in
the shapes blob (see :meth:`~torchtriage.trace.model.EventTable.input_types_span`). The share
is the self time of ops in the analysed steps with a float64 tensor input over the self time of
all ops there. A 0-dim "double" input is a Python number wrapped by the op (``x.mul_(0.5)``
records ``["float", "double"]`` with dims ``[[256, 512], []]``): the op runs in float32, so an
op counts only when one of its double inputs has dimensions. Device kernels: the kernel time
of kernels whose names say double precision (``dgemm``, ``double``, ``f64``) over all kernel
time.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchtriage.analysis.intervals import unique
from torchtriage.analysis.ops import OpNesting, in_steps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import EventKind, Trace

_DOUBLE_TYPE = re.compile(rb'"double"')
_DOUBLE_KERNEL = re.compile(r"double|dgemm|dgemv|ddot|\bf64\b|fp64|_f64_", re.I)


def float64_share_host(trace: Trace, steps: StepWindows, nesting: OpNesting) -> float | None:
    """Share of host-op self time in the analysed steps spent in ops with a float64 tensor
    input; None when the trace has no input types (record_shapes off) or no op time."""
    ev = trace.events
    start, end = ev.input_types_span()
    rows = nesting.rows
    keep = in_steps(ev.ts[rows], steps)
    rows, self_us = rows[keep], nesting.self_us[keep]
    total = float(self_us.sum())
    if total <= 0 or not (end > start).any():
        return None
    typed = np.flatnonzero(end > start)  # rows with an Input type, in blob order
    typed = typed[np.argsort(start[typed], kind="stable")]
    hits = np.asarray([m.start() for m in _DOUBLE_TYPE.finditer(ev.shapes_blob)], np.int64)
    double = np.zeros(len(ev), dtype=bool)
    if hits.size:
        starts = start[typed]
        at = np.searchsorted(starts, hits, side="right") - 1
        ok = at >= 0
        at, found = at[ok], hits[ok]
        inside = found < end[typed][at]
        blob, offset, length = ev.shapes_blob, ev.shape_offset, ev.shape_length
        answers: dict[bytes, bool] = {}  # by the op's dims and types as written: ops repeat
        for row in unique(typed[at[inside]]).tolist():  # (np.unique here imports numpy.ma)
            signature = blob[offset[row]:end[row]]
            answer = answers.get(signature)
            if answer is None:
                answer = answers[signature] = _has_double_tensor(
                    signature, int(length[row]))
            double[row] = answer
    return float(self_us[double[rows]].sum()) / total


def _has_double_tensor(signature: bytes, dims_length: int) -> bool:
    """Whether one of the op's "double" inputs is a tensor with dimensions (not a wrapped
    Python number), from its ``Input Dims`` and ``Input type`` JSON written one after the
    other (``signature``, the dims its first ``dims_length`` bytes); True when they cannot be
    read that finely."""
    try:
        dims = msgspec.json.decode(signature[:dims_length] or b"[]")
        types = msgspec.json.decode(signature[dims_length:])
    except ValueError:
        return True
    if not isinstance(types, list) or not isinstance(dims, list) or len(types) != len(dims):
        return True
    return any(t == "double" and d != [] for t, d in zip(types, dims, strict=True))


def float64_share_device(trace: Trace, steps: StepWindows) -> float | None:
    """Share of kernel time in the analysed steps in kernels named for double precision; None
    without kernels."""
    ev = trace.events
    kernels = np.flatnonzero((ev.kind == EventKind.KERNEL) & in_steps(ev.ts, steps))
    total = float(ev.dur[kernels].sum())
    if total <= 0:
        return None
    double = ev.name_mask(lambda n: bool(_DOUBLE_KERNEL.search(n)))[kernels]
    return float(ev.dur[kernels][double].sum()) / total
