"""What every rule shares: the facts it reads, the verdict it returns and the :class:`Rule`
protocol; plus the CPU small-op time the facts are built with.

:class:`Facts` holds every analysis of one trace, computed once (``diagnose`` builds it); a rule
reads it and returns a :class:`Verdict`. Evidence that compares a share with a threshold is
made by :func:`share_evidence`, which carries the threshold's value and source.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec
import numpy as np

from torchtriage.analysis.breakdown import StepBreakdown
from torchtriage.analysis.categories import is_dataloader
from torchtriage.analysis.collectives import CollectiveStats
from torchtriage.analysis.intervals import covers, merge
from torchtriage.analysis.kernels import DeviceOps
from torchtriage.analysis.launch import LaunchStats
from torchtriage.analysis.memory import DeviceMemory
from torchtriage.analysis.ops import OpNesting, in_steps
from torchtriage.analysis.sharding import Sharding
from torchtriage.analysis.steps import StepWindows
from torchtriage.analysis.transfers import Transfers
from torchtriage.analysis.utilization import ClassTime
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import Remedy
from torchtriage.diagnosis.overhead import ProfilerOverhead
from torchtriage.diagnosis.result import Evidence, Finding, MachineInfo, OutOfMemory, RunView
from torchtriage.diagnosis.vocabulary import Layer
from torchtriage.trace.model import Trace


class DeviceEvidence(msgspec.Struct):
    """Device-side analyses of a GPU trace, computed once."""

    ops: DeviceOps
    classes: list[ClassTime]
    launches: LaunchStats
    transfers: Transfers
    busy_us: float

    def class_time(self, *classes: str) -> float:
        return sum(c.time_us for c in self.classes if c.cls in classes)

    @property
    def kernel_time(self) -> float:
        """Summed time of kernels (copies and memsets excluded)."""
        return sum(c.time_us for c in self.classes if c.cls not in ("memcpy", "memset"))


class Facts(msgspec.Struct):
    """Everything the rules read, computed once per trace."""

    trace: Trace
    steps: StepWindows
    breakdown: StepBreakdown
    nesting: OpNesting
    layer_us: dict[str, float]
    small_op_us: float  # CPU: outermost-op time under th.SMALL_OP_US moved from kernel to host
    memory: list[tuple[DeviceMemory, int | None, str | None]]  # peak, capacity, capacity source
    oom: bool = False
    device: DeviceEvidence | None = None  # GPU traces only
    machine: MachineInfo | None = None  # torchtriage run only
    collectives: list[CollectiveStats] = msgspec.field(default_factory=list)
    sharding: Sharding | None = None  # FSDP's footprint, when the job shards
    out_of_memory: OutOfMemory | None = None  # what the error said, when the run ran out
    # share of op time in float64 (CPU: op self time with a double input; GPU: kernel time of
    # double-precision kernels); None when the trace does not tell (analysis/dtypes.py)
    float64_share: float | None = None
    # host time the profiler added, taken out of layer_us["host"] and of wall_us
    # (diagnosis/overhead.py); None when nothing was removed
    profiler_overhead: ProfilerOverhead | None = None
    # the whole run from torchtriage run's step timeline (diagnosis/run_view.py); None for a
    # trace alone
    run: RunView | None = None

    @property
    def gpu(self) -> bool:
        return self.trace.has_device_activity

    @property
    def wall_us(self) -> float:
        """The analysed steps' wall time the layer shares are of (less the profiler's
        overhead, when some was removed)."""
        removed = self.profiler_overhead.removed_us if self.profiler_overhead else 0.0
        return self.breakdown.total_wall_us - removed

    def share(self, layer: str) -> float:
        return self.layer_us.get(layer, 0.0) / self.wall_us if self.wall_us > 0 else 0.0

    def names_matching(self, predicate) -> list[str]:
        return [n for n in self.trace.events.names if predicate(n)]


class Verdict(msgspec.Struct):
    """What one rule says: the evidence it looked at, the findings it raises, the catalog
    remedies that apply (each with why), those its gates held back (with the gate's evidence),
    and, for a rule that judges by capacity rather than
    by time (memory), whether it takes the primary verdict."""

    evidence: list[Evidence] = msgspec.field(default_factory=list)
    findings: list[Finding] = msgspec.field(default_factory=list)
    remedies: list[tuple[Remedy, str]] = msgspec.field(default_factory=list)
    # remedies a gate held back: (remedy, why, the gate's evidence with its threshold)
    withheld: list[tuple[Remedy, str, list[Evidence]]] = msgspec.field(default_factory=list)
    decides_primary: bool = False
    # the rule judged the whole run (a recurring stall, recompilation) and its figures pass
    # their threshold: the layer's remedies follow the primary layer's, whatever its share of
    # the window
    over_run: bool = False

    def merge(self, other: Verdict) -> None:
        """Add another rule's verdict for the same layer (after this one's)."""
        self.evidence.extend(other.evidence)
        self.findings.extend(other.findings)
        self.remedies.extend(other.remedies)
        self.withheld.extend(other.withheld)
        self.decides_primary = self.decides_primary or other.decides_primary
        self.over_run = self.over_run or other.over_run


@runtime_checkable
class Rule(Protocol):
    """One rule: reads :class:`Facts` once, returns its :class:`Verdict` for its ``layer``.

    ``prescribes`` names every catalog remedy the rule may return and ``thresholds`` every
    :mod:`~torchtriage.diagnosis.thresholds` entry it compares against (and reports in its
    evidence); ``tests/test_rules.py`` holds the rules to both. The class docstring states the
    algorithm.
    """

    layer: Layer
    prescribes: tuple[str, ...]
    thresholds: tuple[th.Threshold, ...]

    def judge(self, f: Facts) -> Verdict: ...


def share_evidence(metric: str, value: float, t: th.Threshold) -> Evidence:
    return Evidence(metric=metric, value=round(value, 4), unit=t.unit, threshold=t.value,
                    comparison=">=", fired=value >= t.value, source=t.source)


def small_op_time(trace: Trace, steps: StepWindows, nesting: OpNesting) -> float:
    """CPU traces: time in outermost ops on the training thread that do no real work.

    An outermost op counts when no op in its subtree has a self time of SMALL_OP_US or more:
    all of its time is dispatch, autograd bookkeeping and profiler overhead. Ops inside a
    DataLoader ``__next__`` (collation) are data loading, not dispatch overhead.
    """
    ev = trace.events
    outer = nesting.depth == 0
    rows = nesting.rows[outer]
    tiny = nesting.max_self_us[outer] < th.SMALL_OP_US.value
    if steps.main_thread >= 0:
        tiny &= ev.thread_id[rows] == steps.main_thread
    rows = rows[tiny & in_steps(ev.ts[rows], steps)]
    loader = np.flatnonzero(ev.name_mask(is_dataloader))
    if loader.size and rows.size:
        s, e = merge(ev.ts[loader], ev.end[loader])
        rows = rows[~covers(ev.ts[rows], s, e)]
    return float(ev.dur[rows].sum())
