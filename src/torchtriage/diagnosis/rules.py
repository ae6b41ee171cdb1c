"""One rule per layer: a small function that reads :class:`Facts` and returns its verdict.

Each rule returns the evidence it looked at (with the threshold from
:mod:`torchtriage.diagnosis.thresholds` that it compared against), the findings it raises and
the catalog remedies that apply, each with the reason it applies here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from torchtriage.analysis.breakdown import Breakdown
from torchtriage.analysis.categories import is_dataloader
from torchtriage.analysis.intervals import covers, merge
from torchtriage.analysis.memory import DeviceMemory
from torchtriage.analysis.ops import OpNesting, in_steps
from torchtriage.analysis.steps import StepWindows
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID, Remedy
from torchtriage.diagnosis.result import Evidence, Finding
from torchtriage.trace.model import EventKind, Trace

SYNC_NAMES = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "aten::item",
        "aten::_local_scalar_dense",
    }
)


@dataclass
class Facts:
    """Everything the rules read, computed once per trace."""

    trace: Trace
    steps: StepWindows
    breakdown: Breakdown
    nesting: OpNesting
    layer_us: dict[str, float]
    small_op_us: float  # CPU: outermost-op time under th.SMALL_OP_US moved from kernel to host
    memory: list[tuple[DeviceMemory, int | None, str | None]]  # peak, capacity, capacity source
    oom: bool = False

    @property
    def gpu(self) -> bool:
        return self.trace.has_device_activity

    @property
    def wall_us(self) -> float:
        return self.breakdown.total_wall_us

    def share(self, layer: str) -> float:
        return self.layer_us.get(layer, 0.0) / self.wall_us if self.wall_us > 0 else 0.0

    def names_matching(self, predicate) -> list[str]:
        return [n for n in self.trace.events.names if predicate(n)]

    def count_in_steps(self, predicate, kinds: tuple[EventKind, ...] | None = None) -> int:
        ev = self.trace.events
        mask = ev.name_mask(predicate)
        if kinds is not None:
            mask &= np.isin(ev.kind, kinds)
        return int(in_steps(ev.ts[mask], self.steps).sum())


@dataclass
class Verdict:
    evidence: list[Evidence] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    remedies: list[tuple[Remedy, str]] = field(default_factory=list)


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


# --- memory -------------------------------------------------------------------------------


def memory_rule(f: Facts) -> tuple[bool, Verdict]:
    """`memory` is primary when the job OOMs or its peak reaches MEMORY_NEAR_CAPACITY."""
    v = Verdict()
    fired = False
    if f.oom:
        fired = True
        v.evidence.append(Evidence(metric="out_of_memory", value=1.0, fired=True,
                                   source="the profiled run raised OutOfMemoryError"))
        v.findings.append(Finding(id="memory.oom", severity="critical", layer="memory",
                                  message="The run ran out of memory."))
    assessed = [(peak, cap, src) for peak, cap, src in f.memory if cap]
    for peak, cap, src in assessed:
        used = max(peak.peak_allocated, peak.peak_reserved)
        frac = used / cap
        ev = share_evidence(f"peak_memory_fraction[{peak.device}]", frac, th.MEMORY_NEAR_CAPACITY)
        ev.unit = f"of {cap / 2**30:.2f} GiB ({src})"
        v.evidence.append(ev)
        if frac >= th.MEMORY_NEAR_CAPACITY.value:
            fired = True
            v.findings.append(Finding(
                id="memory.near_capacity", severity="critical", layer="memory",
                message=f"Peak memory on {peak.device} is {frac:.0%} of capacity "
                        f"({used / 2**30:.2f} of {cap / 2**30:.2f} GiB): it caps the batch size.",
                evidence=[ev]))
        if peak.peak_reserved > 0:
            idle = (peak.reserved_at_peak_allocated - peak.peak_allocated)
            frag = idle / peak.reserved_at_peak_allocated if peak.reserved_at_peak_allocated else 0
            fev = share_evidence(f"fragmentation[{peak.device}]", frag, th.MEMORY_FRAGMENTATION)
            v.evidence.append(fev)
            if frag >= th.MEMORY_FRAGMENTATION.value:
                v.findings.append(Finding(
                    id="memory.fragmentation", severity="warning", layer="memory",
                    message=f"{frag:.0%} of reserved memory on {peak.device} is idle at the "
                            "allocated peak (fragmentation).", evidence=[fev]))
                v.remedies.append((BY_ID["memory.expandable_segments"],
                                   f"{frag:.0%} of the reserved cache is unused at the peak"))
    if not assessed and f.memory:
        v.findings.append(Finding(
            id="memory.capacity_unknown", severity="info", layer="memory",
            message="Device capacity unknown (no deviceProperties): memory pressure not "
                    "assessed. Pass --device-memory to set it."))
    if fired:
        ladder = ["memory.grad_accumulation", "memory.activation_checkpointing", "memory.bf16",
                  "memory.fsdp"]
        reasons = ["cheapest rung: same model, smaller micro-batch",
                   "next rung if accumulation alone does not fit",
                   "next rung: halves activation memory",
                   "last rung: shard state across ranks"]
        v.remedies.extend((BY_ID[i], r) for i, r in zip(ladder, reasons, strict=True))
    return fired, v


# --- data loading -------------------------------------------------------------------------


def data_loading_rule(f: Facts) -> Verdict:
    share = f.share("data_loading")
    v = Verdict(evidence=[share_evidence("data_loading_share", share,
                                         th.DATA_LOADING_SIGNIFICANT)])
    single = f.names_matching(lambda n: "_SingleProcessDataLoaderIter" in n)
    multi = f.names_matching(lambda n: "_MultiProcessingDataLoaderIter" in n)
    if single:
        v.findings.append(Finding(
            id="data_loading.single_process", severity="warning" if share >= 0.05 else "info",
            layer="data_loading",
            message="The DataLoader loads batches in the training process (num_workers=0)."))
    pageable = f.count_in_steps(lambda n: "Pageable" in n and ("HtoD" in n or "H2D" in n),
                                (EventKind.MEMCPY,))
    if f.gpu:
        v.evidence.append(Evidence(metric="pageable_h2d_copies", value=pageable, unit="copies"))
        h2d = f.breakdown.share("h2d_input")
        v.evidence.append(Evidence(metric="h2d_input_share", value=round(h2d, 4),
                                   unit="share of step time"))
        if pageable:
            v.findings.append(Finding(
                id="data_loading.pageable_copies", severity="warning", layer="data_loading",
                message=f"{pageable} host-to-device copies from pageable memory in the "
                        "analysed steps."))
    if share < th.DATA_LOADING_SIGNIFICANT.value:
        return v
    reason_workers = ("loading runs in the training process (num_workers=0)" if single else
                      "the workers do not keep up with the training loop" if multi else
                      f"{share:.0%} of step time is exposed data loading")
    v.remedies.append((BY_ID["dataloader.num_workers"], reason_workers))
    if f.gpu and pageable:
        v.remedies.append((BY_ID["dataloader.pin_memory"],
                           f"{pageable} pageable host-to-device copies"))
    v.remedies.append((BY_ID["dataloader.prefetch_factor"],
                       "keeps batches queued once workers run" if single else
                       "workers are sometimes late"))
    v.remedies.append((BY_ID["dataloader.persistent_workers"],
                       "avoids re-spawning workers every epoch"))
    if f.gpu and f.breakdown.share("h2d_input") > 0:
        v.remedies.append((BY_ID["h2d.non_blocking"],
                           f"{f.breakdown.share('h2d_input'):.1%} of step time is exposed "
                           "input copy"))
    return v


# --- host ---------------------------------------------------------------------------------


def host_rule(f: Facts) -> Verdict:
    share = f.share("host")
    v = Verdict(evidence=[share_evidence("host_share", share, th.HOST_SIGNIFICANT)])
    if not f.gpu:
        small = f.small_op_us / f.wall_us if f.wall_us else 0.0
        v.evidence.append(Evidence(
            metric="small_op_share", value=round(small, 4), unit="share of step time",
            threshold=th.SMALL_OP_US.value, comparison="largest self time in op <",
            source=th.SMALL_OP_US.source))
        ops_per_step = _host_ops_per_step(f)
        v.evidence.append(Evidence(metric="host_ops_per_step", value=ops_per_step, unit="ops"))
        if small >= 0.1:
            v.findings.append(Finding(
                id="host.small_ops", severity="warning", layer="host",
                message=f"{small:.0%} of step time is in ops that do no real work (no nested "
                        f"op runs {th.SMALL_OP_US.value:.0f} µs of its own; "
                        f"{ops_per_step:.0f} ops per step): dispatch overhead, not compute."))
    syncs = 0
    if f.gpu:
        syncs = f.count_in_steps(lambda n: n in SYNC_NAMES)
        per_step = syncs / max(len(f.steps), 1)
        v.evidence.append(Evidence(metric="host_syncs_per_step", value=round(per_step, 2),
                                   unit="syncs"))
        if syncs:
            v.findings.append(Finding(
                id="host.syncs", severity="warning" if per_step >= 1 else "info", layer="host",
                message=f"{per_step:.1f} host-device syncs per step "
                        "(synchronize / .item()) stall the host."))
    if share < th.HOST_SIGNIFICANT.value:
        return v
    has_optimizer = f.names_matching(lambda n: n.startswith("Optimizer.step#"))
    fused = f.names_matching(lambda n: "_fused_" in n)
    if has_optimizer and not fused:
        v.remedies.append((BY_ID["optimizer.fused"],
                           "the optimizer runs unfused (per-parameter or foreach) ops"))
    if syncs:
        v.remedies.append((BY_ID["sync.remove"], f"{syncs} syncs in the analysed steps"))
    v.remedies.append((BY_ID["compile.reduce_overhead"],
                       "many small ops: fewer launches per step" if f.gpu else
                       "many small ops: compiled graphs skip per-op dispatch"))
    return v


def _host_ops_per_step(f: Facts) -> float:
    ev = f.trace.events
    rows = f.nesting.rows
    return float(in_steps(ev.ts[rows], f.steps).sum()) / max(len(f.steps), 1)


# --- kernel -------------------------------------------------------------------------------


def kernel_rule(f: Facts, primary: bool) -> Verdict:
    share = f.share("kernel")
    v = Verdict(evidence=[share_evidence("kernel_share", share, th.KERNEL_SIGNIFICANT)])
    if not primary and share < th.KERNEL_SIGNIFICANT.value:
        return v
    ampere = any(d.compute_major >= 8 for d in f.trace.meta.devices)
    if f.gpu and (ampere or not f.trace.meta.devices):
        v.remedies.append((BY_ID["matmul.tf32"],
                           "fp32 matmuls can use TF32 tensor cores on this GPU" if ampere else
                           "if the GPU is Ampere or newer (device properties not in the trace)"))
    pre_ampere = f.trace.meta.devices and not ampere
    v.remedies.append((BY_ID["amp.bf16"],
                       "CPU compute dominates; gains need a CPU with AVX512-BF16/AMX" if not f.gpu
                       else "this GPU predates bf16 tensor cores: use dtype=torch.float16 with "
                       "torch.amp.GradScaler" if pre_ampere else "compute dominates the step"))
    v.remedies.append((BY_ID["compile.default"], "fuses elementwise work between the big ops"))
    v.remedies.append((BY_ID["compile.max_autotune"], "after compile.default, if GEMMs dominate"))
    v.remedies.append((BY_ID["kernel.custom"], "only for an op that dominates the top-ops table"))
    return v


# --- communication ------------------------------------------------------------------------


def communication_rule(f: Facts) -> Verdict:
    share = f.share("communication")
    v = Verdict(evidence=[share_evidence("communication_share", share,
                                         th.COMMUNICATION_SIGNIFICANT)])
    if share < th.COMMUNICATION_SIGNIFICANT.value:
        return v
    v.findings.append(Finding(
        id="communication.exposed", severity="warning", layer="communication",
        message=f"{share:.0%} of step time waits on collectives not hidden behind compute."))
    v.remedies.append((BY_ID["ddp.bucket_cap"], "fewer, larger all-reduce buckets"))
    v.remedies.append((BY_ID["ddp.grad_accumulation"], "all-reduce once every k micro-batches"))
    v.remedies.append((BY_ID["ddp.comm_hook"], "halve the bytes each all-reduce moves"))
    v.remedies.append((BY_ID["ddp.static_graph"], "better overlap with backward"))
    return v
