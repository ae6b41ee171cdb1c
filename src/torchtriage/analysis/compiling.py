"""How much of each step torch.compile spent compiling: a window placed among compilations.

Input: a trace and its steps. torch._dynamo wraps each compilation of a frame in a host event
named ``dynamo`` (``cpu_op``) and, inside it, ``_compile.compile_inner (dynamo_timed)``
(bytecode tracing, guard building and the backend's compile all run inside;
``../shared/notes/torch-profiler-anatomy.md`` section 6). Algorithm: the union of those events'
intervals on any thread (:func:`~torchtriage.analysis.intervals.merge`), then the part of each
step it covers (:func:`~torchtriage.analysis.intervals.covered_within`). A compiled region
that runs (``Torch-Compiled Region: 0/3``) is not compiling and is not counted.

Why it matters: a step that compiles is not the steady state, and on a CPU trace the ops
dynamo runs while it traces (fake-tensor dispatch) count as op time, which reads as compute.
"""

from __future__ import annotations

import numpy as np

from torchtriage.analysis.intervals import covered_within, merge
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import HOST_KINDS, Trace

COMPILE_EVENTS = ("dynamo", "_compile.compile_inner (dynamo_timed)", "_compile.compile_inner")


def compiling_us(trace: Trace, steps: StepWindows) -> np.ndarray:
    """Microseconds of each step (float64, one per step of ``steps``) inside a compilation."""
    ev = trace.events
    rows = np.isin(ev.kind, HOST_KINDS) & ev.name_mask(lambda n: n in COMPILE_EVENTS)
    if not rows.any():
        return np.zeros(len(steps), dtype=np.float64)
    s, e = merge(ev.ts[rows], ev.end[rows])
    return covered_within(s, e, steps.start, steps.end)
