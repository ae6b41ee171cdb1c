"""Kernel launches: host launch cost, launch-to-start delay, short kernels, kernels per step.

Each kernel is joined to its runtime launch call (``cudaLaunchKernel``, ``cuLaunchKernel``,
``hipLaunchKernel``, ...) by ``correlation`` id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchtriage.analysis.kernels import DeviceOps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import EventKind, Trace


@dataclass(frozen=True)
class LaunchStats:
    kernels: int  # kernels (not copies/memsets) in the analysed steps
    kernels_per_step: float
    linked: int  # kernels whose launch call was found by correlation
    launch_cost_us_median: float | None  # duration of the host launch call
    launch_cost_us_p90: float | None
    launch_delay_us_median: float | None  # launch call start -> kernel start
    launch_delay_us_p90: float | None
    short_kernels: int  # kernels shorter than short_kernel_us
    short_kernel_share: float  # of kernels (count)
    short_kernel_time_share: float  # of kernel time
    short_kernel_us: float


def runtime_for(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Row of the runtime call with the same correlation as each of ``rows`` (-1 if none)."""
    ev = trace.events
    runtime = np.flatnonzero((ev.kind == EventKind.RUNTIME) & (ev.correlation >= 0))
    out = np.full(rows.size, -1, dtype=np.int64)
    if runtime.size == 0 or rows.size == 0:
        return out
    runtime = runtime[np.argsort(ev.correlation[runtime], kind="stable")]
    corr = ev.correlation[runtime]
    want = ev.correlation[rows]
    pos = np.clip(np.searchsorted(corr, want), 0, corr.size - 1)
    ok = (want >= 0) & (corr[pos] == want)
    out[ok] = runtime[pos[ok]]
    return out


def launch_stats(trace: Trace, ops: DeviceOps, steps: StepWindows,
                 short_kernel_us: float) -> LaunchStats:
    ev = trace.events
    kernels = ops.rows[ev.kind[ops.rows] == EventKind.KERNEL]
    launch = runtime_for(trace, kernels)
    linked = launch >= 0
    cost = ev.dur[launch[linked]]
    delay = ev.ts[kernels[linked]] - ev.ts[launch[linked]]
    dur = ev.dur[kernels]
    short = dur < short_kernel_us
    total = float(dur.sum())
    return LaunchStats(
        kernels=int(kernels.size),
        kernels_per_step=kernels.size / max(len(steps), 1),
        linked=int(linked.sum()),
        launch_cost_us_median=_pct(cost, 50),
        launch_cost_us_p90=_pct(cost, 90),
        launch_delay_us_median=_pct(delay, 50),
        launch_delay_us_p90=_pct(delay, 90),
        short_kernels=int(short.sum()),
        short_kernel_share=float(short.mean()) if kernels.size else 0.0,
        short_kernel_time_share=float(dur[short].sum() / total) if total > 0 else 0.0,
        short_kernel_us=short_kernel_us,
    )


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None
