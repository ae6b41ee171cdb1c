"""Dynamic shapes: ops whose input shapes change from step to step (needs ``record_shapes``).

Changing shapes make torch.compile recompile (or fall back to dynamic kernels) and fragment the
caching allocator, so they are reported even when they do not cost time in the profiled steps.

An op counts as dynamic when its set of input-shape lists differs between analysed steps. Calls
whose inputs all lack a dimension (``Input Dims`` of only ``[]``: 0-d tensors, Python numbers,
non-tensor arguments) are left out: their shapes cannot change, and a step that logs (the
Hugging Face Trainer every ``logging_steps``: a mean of the loss, a division of 0-d tensors)
would otherwise make an op that runs in every step look dynamic.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import EventKind, Trace

_SCALARS_ONLY = re.compile(rb"^\[\s*(\[\s*\]\s*(,\s*\[\s*\]\s*)*)?\]$")


class DynamicShapeOp(msgspec.Struct, frozen=True):
    name: str
    steps_seen: int  # analysed steps in which the op ran
    distinct_signatures: int  # distinct per-step sets of input shapes
    examples: tuple[str, ...]  # up to three input-shape lists, as JSON text


def dynamic_shape_ops(trace: Trace, steps: StepWindows, limit: int = 10) -> list[DynamicShapeOp]:
    """Ops whose set of input shapes differs between analysed steps, most variable first."""
    ev = trace.events
    if len(steps) < 2:
        return []
    rows = np.flatnonzero((ev.kind == EventKind.CPU_OP) & (ev.shape_offset >= 0))
    if rows.size == 0:
        return []
    step_idx = np.searchsorted(steps.start, ev.ts[rows], side="right") - 1
    ok = step_idx >= 0
    ok[ok] = ev.ts[rows[ok]] < steps.end[step_idx[ok]]
    rows, step_idx = rows[ok], step_idx[ok]
    per_op: dict[int, dict[int, set[bytes]]] = {}
    blob = ev.shapes_blob
    offsets, lengths, name_ids = ev.shape_offset, ev.shape_length, ev.name_id
    for row, s in zip(rows.tolist(), step_idx.tolist(), strict=True):
        off = int(offsets[row])
        dims = blob[off : off + int(lengths[row])]
        if _SCALARS_ONLY.match(dims):
            continue  # no input with a dimension: a 0-d tensor's shape cannot change
        per_op.setdefault(int(name_ids[row]), {}).setdefault(s, set()).add(dims)
    found = []
    for name_id, by_step in per_op.items():
        signatures = {frozenset(v) for v in by_step.values()}
        if len(signatures) < 2:
            continue
        shapes = sorted({d for v in by_step.values() for d in v})
        found.append(
            DynamicShapeOp(
                name=ev.names[name_id],
                steps_seen=len(by_step),
                distinct_signatures=len(signatures),
                examples=tuple(s.decode("utf-8", "replace") for s in shapes[:3]),
            )
        )
    found.sort(key=lambda d: (-d.distinct_signatures, d.name))
    return found[:limit]
