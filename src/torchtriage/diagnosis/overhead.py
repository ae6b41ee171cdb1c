"""The profiler's own cost: take it out of the host layer before the layers are compared.

Recording every op and every kernel launch slows the host; on a GPU job with thousands of
launches per step the profiled steps can run far slower than the same steps unprofiled, and
the GPU then idles waiting for a host that is only slow because it is watched. Judged from
the trace alone, such a job looks host-bound when it is not.

``torchtriage run`` times a few unprofiled steps after each window (capture/profiling.py).
When the analysed steps' mean wall time in the trace exceeds the unprofiled steps' mean host
time by more than ``profiler_inflation``, on a GPU trace (where the kernels' own time does not
depend on the host being watched), the difference is the profiler's: ``sum(wall) - steps x
unprofiled`` is removed from the host layer (never more than the host layer holds) and from
the wall the shares are taken over, so the shares are of the unprofiled step. Steps longer
than ``overhead_outlier_step`` times the median are left out of that sum and keep their time:
such a step (an epoch boundary that saves a checkpoint and restarts the DataLoader's workers:
dcgan on an H200, 1,190 ms among steps of 20) is not the profiler's doing, while the
profiler's own cost is per op and launch, so it stretches every step alike (nanoGPT on an
H200: 227, 166 and 166 ms profiled, 107 unprofiled). On a CPU-only trace every op is slowed
alike and the shares stand; no correction there. Without a check (``analyze`` of a trace
captured elsewhere, or a run that ended before the check) nothing is known about the overhead
and nothing changes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import msgspec

from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import Evidence, Finding, WindowCheck


class ProfilerOverhead(msgspec.Struct, frozen=True):
    """What the profiler added to the analysed steps, from one window check."""

    profiled_mean_ms: float  # the analysed steps' mean wall time in the trace (outliers out)
    unprofiled_mean_ms: float  # host time per unprofiled step after the window (run's clock)
    removed_us: float  # host-layer time taken out of the analysed steps
    steps: int  # the analysed steps
    outlier_steps: int = 0  # of them, left out as outliers (their time stays)

    @property
    def ratio(self) -> float:
        return self.profiled_mean_ms / self.unprofiled_mean_ms


def profiler_overhead(window: WindowCheck | None, *, gpu: bool, step_wall_us: Sequence[float],
                      host_us: float) -> ProfilerOverhead | None:
    """The host time to remove (see the module docstring), or None when nothing is removed:
    no check with unprofiled steps, a CPU-only trace, or analysed steps within
    ``profiler_inflation`` of the unprofiled ones."""
    if window is None or not gpu or not window.after_mean_ms or not len(step_wall_us):
        return None
    limit = statistics.median(step_wall_us) * th.OVERHEAD_OUTLIER_STEP.value
    kept = [w for w in step_wall_us if w <= limit]
    profiled, later = statistics.fmean(kept) / 1e3, window.after_mean_ms
    if profiled <= later * (1 + th.PROFILER_INFLATION.value):
        return None
    removed = min(host_us, len(kept) * (profiled - later) * 1e3)
    return ProfilerOverhead(profiled_mean_ms=round(profiled, 3), unprofiled_mean_ms=later,
                            removed_us=removed, steps=len(step_wall_us),
                            outlier_steps=len(step_wall_us) - len(kept))


def overhead_finding(overhead: ProfilerOverhead) -> Finding:
    """The ``steps.profiler_overhead`` finding: the figures and what was done with them."""
    t = th.PROFILER_INFLATION
    per_step = overhead.removed_us / 1e3 / max(overhead.steps - overhead.outlier_steps, 1)
    outliers = (f" (less {overhead.outlier_steps} outlier step(s) over "
                f"{th.OVERHEAD_OUTLIER_STEP.value:g}x the median, whose time stays)"
                if overhead.outlier_steps else "")
    return Finding(
        id="steps.profiler_overhead", severity="info", layer="host",
        message=f"The profiled steps took {overhead.profiled_mean_ms:.1f} ms{outliers}, the "
                f"unprofiled steps after them {overhead.unprofiled_mean_ms:.1f} ms: the profiler "
                f"itself slowed the host, so {per_step:.1f} ms per step of host time is taken out "
                "before the layers are compared (shares are of the unprofiled step).",
        evidence=[Evidence(metric="profiled_over_unprofiled_step_time",
                           value=round(overhead.ratio, 4), unit="ratio",
                           threshold=1 + t.value, comparison=">", fired=True,
                           source=t.source)])
