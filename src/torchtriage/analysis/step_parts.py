"""Where one step's host time went: a stall step recorded by the second profiling window.

Input: a trace and one of its steps (its ``ProfilerStep#N`` span on the main thread; when the
profiler was stopped part-way through the step, its range ends there: the recorded part).

Algorithm: the host events (ops and ``record_function`` ranges) of the step's thread that lie
inside the step are swept in start order; an event is *top level* when it starts at or after
the end of the top-level event before it (nested events are inside their parent's time). Each
top-level event's time goes to its part:

- a known range gets its label (:data:`RANGE_LABELS`: a DataLoader's ``__next__`` waiting for
  its next batch, the optimizer's step, torchtriage's own ranges around a DataLoader's worker
  start, an evaluation pass and ``torch.save``),
- another ``record_function`` range is its own part, by name,
- an op (``aten::...``) outside any range goes to ``ops outside these ranges`` (the forward and
  backward passes, metrics computed with torch).

What no top-level event covers is ``Python outside any op``: work that runs no torch op (I/O,
logging, sleeping, garbage collection, a process start). Parts are listed largest first with
their share of the recorded step. The longest top-level ops (by name, summed) and, on a GPU,
the device's busy time in the step (kernels and copies, union) come beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchtriage.analysis.intervals import merge, total
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import DEVICE_KINDS, EventKind, Trace

# torchtriage's own ranges, entered while the second window records (capture/timeline.py)
LOADER_START_RANGE = "torchtriage: DataLoader worker start"
EVALUATION_RANGE = "torchtriage: evaluation"
CHECKPOINT_RANGE = "torchtriage: torch.save"
RANGE_LABELS: tuple[tuple[str, str], ...] = (  # (name prefix, label), first match wins
    (LOADER_START_RANGE, "starting DataLoader workers"),
    (EVALUATION_RANGE, "evaluation (model in eval mode)"),
    (CHECKPOINT_RANGE, "torch.save"),
    ("enumerate(DataLoader)#", "waiting for the next batch (DataLoader __next__)"),
    ("Optimizer.step#", "optimizer step"),
    ("Optimizer.zero_grad#", "optimizer zero_grad"),
)
OPS_LABEL = "ops outside these ranges"
PYTHON_LABEL = "Python outside any op"
TOP_OPS = 5


@dataclass(frozen=True)
class StepParts:
    step: int  # the trace's step number
    recorded_us: float
    parts: tuple[tuple[str, float], ...]  # (label, µs), largest first
    top_ops: tuple[tuple[str, float], ...]  # (op name, µs summed), longest first
    device_busy_us: float | None  # None: no device activity in the trace


def label_of(name: str, kind: int) -> str:
    for prefix, label in RANGE_LABELS:
        if name.startswith(prefix):
            return label
    return name if kind == EventKind.USER_ANNOTATION else OPS_LABEL


def step_parts(trace: Trace, steps: StepWindows, step: int) -> StepParts | None:
    """The parts of step ``step`` of ``trace`` (module docstring); None when the trace does
    not hold that step."""
    where = np.flatnonzero(steps.numbers == step)
    if not where.size:
        return None
    ev = trace.events
    lo, hi = float(steps.start[where[0]]), float(steps.end[where[0]])
    host = (ev.kind == EventKind.CPU_OP) | (ev.kind == EventKind.USER_ANNOTATION)
    if steps.main_thread >= 0:
        host &= ev.thread_id == steps.main_thread
    ends = ev.ts + ev.dur
    inside = host & (ev.ts >= lo) & (ends <= hi + 1.0)
    names = ev.names
    own_marker = np.array([names[i].startswith("ProfilerStep#") for i in ev.name_id[inside]],
                          dtype=bool)
    rows = np.flatnonzero(inside)[~own_marker] if own_marker.size else np.flatnonzero(inside)
    rows = rows[np.lexsort((-ev.dur[rows], ev.ts[rows]))]  # by start, the enclosing first
    recorded = max(hi - lo, 0.0)
    parts: dict[str, float] = {}
    ops: dict[str, float] = {}
    covered_until = -np.inf
    for row in rows:
        start, end = float(ev.ts[row]), float(ends[row])
        if start < covered_until:
            continue  # nested in the top-level event before it
        covered_until = end
        name, kind = names[ev.name_id[row]], int(ev.kind[row])
        label = label_of(name, kind)
        parts[label] = parts.get(label, 0.0) + (end - start)
        if kind == EventKind.CPU_OP:
            ops[name] = ops.get(name, 0.0) + (end - start)
    outside = recorded - sum(parts.values())
    if outside > 0:
        parts[PYTHON_LABEL] = outside
    device = None
    if trace.has_device_activity:
        on_device = np.isin(ev.kind, DEVICE_KINDS) & (ends > lo) & (ev.ts < hi)
        starts, stops = merge(np.maximum(ev.ts[on_device], lo), np.minimum(ends[on_device], hi))
        device = total(starts, stops)
    return StepParts(
        step=step, recorded_us=recorded,
        parts=tuple(sorted(parts.items(), key=lambda kv: -kv[1])),
        top_ops=tuple(sorted(ops.items(), key=lambda kv: -kv[1])[:TOP_OPS]),
        device_busy_us=device)
