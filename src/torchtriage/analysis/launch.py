"""Kernel launches: host launch cost, launch-to-start delay, short kernels, kernels per step.

Each kernel is joined to its runtime launch call (``cudaLaunchKernel``, ``cuLaunchKernel``,
``hipLaunchKernel``, ...) by ``correlation`` id.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchtriage.analysis.correlation import runtime_for
from torchtriage.analysis.kernels import DeviceOps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import EventKind, Trace


class LaunchStats(msgspec.Struct, frozen=True):
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
    launch_calls_per_step: float  # kernels launched one by one (cudaLaunchKernel & co.)
    graph_kernel_share: float  # of kernels, launched as part of a CUDA/HIP graph
    short_launched_share: float  # of kernels: short AND launched one by one


_SINGLE_LAUNCH = re.compile(r"Launch(Kernel|CooperativeKernel)|ModuleLaunchKernel", re.I)
_GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.I)


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
    launchers = launch[linked]  # the patterns are matched once per distinct name
    single = np.zeros(kernels.size, dtype=bool)
    single[linked] = ev.name_mask(_SINGLE_LAUNCH.search)[launchers]
    graph = np.zeros(kernels.size, dtype=bool)
    graph[linked] = ev.name_mask(_GRAPH_LAUNCH.search)[launchers]
    n = max(kernels.size, 1)
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
        launch_calls_per_step=float(single.sum()) / max(len(steps), 1),
        graph_kernel_share=float(graph.sum()) / n,
        short_launched_share=float((short & single).sum()) / n,
    )


def _pct(values: np.ndarray, q: float) -> float | None:
    """``np.percentile(values, q)`` (its default linear method, the same float), without
    numpy's import of ``numpy.ma`` on that path (20 ms of a command's start-up)."""
    if not values.size:
        return None
    rank = q / 100 * (values.size - 1)
    low = int(rank)
    high = min(low + 1, values.size - 1)
    part = np.partition(values, [low, high])
    a, b, t = float(part[low]), float(part[high]), rank - low
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t
