"""One rule per layer: a small function that reads :class:`Facts` and returns its verdict.

Each rule returns the evidence it looked at (with the threshold from
:mod:`torchtriage.diagnosis.thresholds` that it compared against), the findings it raises and
the catalog remedies that apply, each with the reason it applies here.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchtriage.analysis.breakdown import StepBreakdown
from torchtriage.analysis.categories import (
    is_communication_kernel,
    is_dataloader,
    is_host_communication,
    optimizer_own_intervals,
)
from torchtriage.analysis.collectives import CollectiveStats
from torchtriage.analysis.intervals import covers, merge, unique
from torchtriage.analysis.kernels import KERNEL_CLASSES, DeviceOps
from torchtriage.analysis.launch import LaunchStats
from torchtriage.analysis.memory import DeviceMemory
from torchtriage.analysis.ops import OpNesting, in_steps
from torchtriage.analysis.steps import StepWindows
from torchtriage.analysis.transfers import SYNC_CALLS, Transfers
from torchtriage.analysis.utilization import ClassTime, union_in_steps
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID, Remedy
from torchtriage.diagnosis.result import Evidence, Finding, MachineInfo, OutOfMemory
from torchtriage.trace.model import HOST_KINDS, EventKind, Trace


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
    out_of_memory: OutOfMemory | None = None  # what the error said, when the run ran out

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



class Verdict(msgspec.Struct):
    evidence: list[Evidence] = msgspec.field(default_factory=list)
    findings: list[Finding] = msgspec.field(default_factory=list)
    remedies: list[tuple[Remedy, str]] = msgspec.field(default_factory=list)


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
    if f.oom or f.out_of_memory is not None:
        fired = True
        out_of_memory_evidence(v, f.out_of_memory)
    assessed = [(peak, cap, src) for peak, cap, src in f.memory if cap]
    for peak, cap, src in assessed:
        # Pressure is what live tensors hold; a large but idle cache is fragmentation (below).
        used = peak.peak_allocated
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
        big_cache = peak.peak_reserved >= th.FRAGMENTATION_MIN_RESERVED.value * cap
        if peak.peak_reserved > 0 and big_cache:
            idle = (peak.reserved_at_peak_allocated - peak.peak_allocated)
            frag = idle / peak.reserved_at_peak_allocated if peak.reserved_at_peak_allocated else 0
            _fragmentation(v, peak.device, frag,
                           f"{frag:.0%} of reserved memory on {peak.device} is idle at the "
                           "allocated peak (fragmentation).",
                           f"{frag:.0%} of the reserved cache is unused at the peak")
    if not assessed and f.memory:
        v.findings.append(Finding(
            id="memory.capacity_unknown", severity="info", layer="memory",
            message="Device capacity unknown (no deviceProperties): memory pressure not "
                    "assessed. Pass --device-memory to set it."))
    if fired:
        v.remedies.extend(ladder_remedies())
    return fired, v


def ladder_remedies() -> list[tuple[Remedy, str]]:
    """The memory ladder's rungs, cheapest first, each with why it is there."""
    ladder = ["memory.grad_accumulation", "memory.activation_checkpointing", "memory.bf16",
              "memory.fsdp"]
    reasons = ["cheapest rung: same model, smaller micro-batch",
               "next rung if accumulation alone does not fit",
               "next rung: halves activation memory",
               "last rung: shard state across ranks"]
    return [(BY_ID[i], r) for i, r in zip(ladder, reasons, strict=True)]


def out_of_memory_evidence(v: Verdict, report: OutOfMemory | None) -> None:
    """Evidence and findings of an out-of-memory error: the step it failed on and the figures
    it gave; expandable segments when much of the reserved cache sat idle (fragmentation)."""
    v.evidence.append(Evidence(metric="out_of_memory", value=1.0, fired=True,
                               source="the profiled run raised OutOfMemoryError"))
    if report is None:
        v.findings.append(Finding(id="memory.oom", severity="critical", layer="memory",
                                  message="The run ran out of memory."))
        return
    v.evidence.append(Evidence(metric="oom_step", value=report.step, unit="training step"))
    figures = []
    for metric, value, words in (
            ("oom_requested_bytes", report.requested_bytes, "requested"),
            ("oom_allocated_bytes", report.allocated_bytes, "allocated by PyTorch"),
            ("oom_reserved_unallocated_bytes", report.reserved_unallocated_bytes,
             "reserved but unallocated"),
            ("oom_capacity_bytes", report.capacity_bytes, "capacity"),
            ("peak_allocated_bytes_completed_steps",
             max(report.peak_allocated_bytes_by_step, default=None), "peak of the completed "
             "steps")):
        if value is not None:
            v.evidence.append(Evidence(metric=metric, value=value, unit="bytes"))
            figures.append(f"{value / 2**30:.2f} GiB {words}")
    where = f" on {report.device}" if report.device else ""
    v.findings.append(Finding(
        id="memory.oom", severity="critical", layer="memory",
        message=f"The run ran out of memory{where} on step {report.step}"
                + (f" ({', '.join(figures)})" if figures else "") + "."))
    idle, used = report.reserved_unallocated_bytes, report.allocated_bytes
    if idle and used is not None and idle + used > 0:
        frag = idle / (idle + used)
        _fragmentation(v, "oom", frag,
                       f"{frag:.0%} of the reserved memory was idle when it ran out "
                       "(fragmentation).",
                       f"{idle / 2**30:.2f} GiB reserved but unallocated at the error")


def _fragmentation(v: Verdict, where: str, frag: float, message: str, reason: str) -> None:
    """Fragmentation evidence; at MEMORY_FRAGMENTATION or more a finding and expandable
    segments."""
    fev = share_evidence(f"fragmentation[{where}]", frag, th.MEMORY_FRAGMENTATION)
    v.evidence.append(fev)
    if frag >= th.MEMORY_FRAGMENTATION.value:
        v.findings.append(Finding(id="memory.fragmentation", severity="warning", layer="memory",
                                  message=message, evidence=[fev]))
        v.remedies.append((BY_ID["memory.expandable_segments"], reason))


# --- data loading -------------------------------------------------------------------------


def data_loading_rule(f: Facts) -> Verdict:
    """DataLoader four-piece when the loader is exposed; pinned, async copies when the copy is.

    Loader fixes are listed only when the trace has a DataLoader; when exposed host-to-device
    copies outweigh exposed loading, the copy fixes come first.
    """
    share = f.share("data_loading")
    v = Verdict(evidence=[share_evidence("data_loading_share", share,
                                         th.DATA_LOADING_SIGNIFICANT)])
    single = f.names_matching(lambda n: "_SingleProcessDataLoaderIter" in n)
    multi = f.names_matching(lambda n: "_MultiProcessingDataLoaderIter" in n)
    has_loader = bool(f.names_matching(is_dataloader))
    if single:
        v.findings.append(Finding(
            id="data_loading.single_process", severity="warning" if share >= 0.05 else "info",
            layer="data_loading",
            message="The DataLoader loads batches in the training process (num_workers=0)."))
    h2d_share = f.breakdown.share("h2d_input") if f.gpu else 0.0
    pageable = f.device.transfers.h2d.pageable if f.device else 0
    if f.device is not None:
        h2d = f.device.transfers.h2d
        v.evidence.append(Evidence(metric="pageable_h2d_copies", value=pageable, unit="copies"))
        v.evidence.append(Evidence(metric="h2d_input_share", value=round(h2d_share, 4),
                                   unit="share of step time"))
        v.evidence.append(Evidence(metric="h2d_bytes_per_step",
                                   value=round(h2d.bytes / max(len(f.steps), 1)), unit="bytes"))
        if pageable:
            v.findings.append(Finding(
                id="data_loading.pageable_copies", severity="warning", layer="data_loading",
                message=f"{pageable} host-to-device copies from pageable memory in the "
                        f"analysed steps ({h2d.bytes / 2**20 / max(len(f.steps), 1):.1f} MiB "
                        "per step): each is staged and synchronous."))
    if share < th.DATA_LOADING_SIGNIFICANT.value:
        return v
    copy_fixes: list[tuple[Remedy, str]] = []
    if f.gpu and pageable:
        copy_fixes.append((BY_ID["dataloader.pin_memory"],
                           f"{pageable} pageable host-to-device copies"))
    syncs = max(f.device.transfers.syncs_per_step.values(), default=0.0) if f.device else 0.0
    if f.gpu and h2d_share > 0 and (pageable or syncs >= 1):
        copy_fixes.append((BY_ID["h2d.non_blocking"],
                           f"{h2d_share:.1%} of step time is exposed input copy, issued "
                           + ("from pageable memory" if pageable else "before a sync")))
    elif f.gpu and h2d_share >= th.DATA_LOADING_SIGNIFICANT.value:
        v.findings.append(Finding(
            id="data_loading.exposed_copy", severity="warning", layer="data_loading",
            message=f"{h2d_share:.0%} of step time is an input copy that is already pinned "
                    "and asynchronous but nothing overlaps it: copy the next batch on a side "
                    "stream while this one computes (prefetch)."))
    saturated = f.machine is not None and f.machine.cpu_busy_mean >= th.CPU_SATURATED.value
    if f.machine is not None:
        v.evidence.append(share_evidence("cpu_busy_mean", f.machine.cpu_busy_mean,
                                         th.CPU_SATURATED))
    if saturated:
        v.findings.append(Finding(
            id="data_loading.cpu_saturated", severity="warning", layer="data_loading",
            message=f"Every core is already busy ({f.machine.cpu_busy_mean:.0%} on "
                    f"{f.machine.cores} cores): more DataLoader workers will not help; make "
                    "preprocessing cheaper (decode, resize, augment on the GPU) or add cores."))
    loader_fixes: list[tuple[Remedy, str]] = []
    if has_loader and not saturated:
        loader_fixes.append((BY_ID["dataloader.num_workers"],
                             "loading runs in the training process (num_workers=0)" if single
                             else "the workers do not keep up with the training loop" if multi
                             else f"{share:.0%} of step time is exposed data loading"))
        loader_fixes.append((BY_ID["dataloader.prefetch_factor"],
                             "keeps batches queued once workers run" if single else
                             "workers are sometimes late"))
        loader_fixes.append((BY_ID["dataloader.persistent_workers"],
                             "avoids re-spawning workers every epoch"))
    copy_first = h2d_share > f.breakdown.share("data_loading")
    v.remedies.extend(copy_fixes + loader_fixes if copy_first else loader_fixes + copy_fixes)
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
    syncs_per_step = 0.0
    if f.device is not None:
        launches = f.device.launches
        v.evidence.append(Evidence(metric="kernels_per_step",
                                   value=round(launches.kernels_per_step, 1), unit="kernels"))
        # Kernels in a CUDA graph are launched once per graph, not one by one: only short
        # kernels that each paid a launch call are launch-bound evidence.
        short = launches.short_launched_share
        v.evidence.append(share_evidence("short_launched_kernel_share", short,
                                         th.LAUNCH_BOUND_SHORT_SHARE))
        v.evidence.append(Evidence(metric="graph_kernel_share",
                                   value=round(launches.graph_kernel_share, 4),
                                   unit="share of kernels"))
        if launches.launch_cost_us_median is not None:
            v.evidence.append(Evidence(metric="launch_cost_us_median",
                                       value=round(launches.launch_cost_us_median, 2), unit="µs"))
            v.evidence.append(Evidence(metric="launch_delay_us_median",
                                       value=round(launches.launch_delay_us_median or 0, 2),
                                       unit="µs"))
        if short >= th.LAUNCH_BOUND_SHORT_SHARE.value and share >= th.HOST_SIGNIFICANT.value:
            v.findings.append(Finding(
                id="host.launch_bound", severity="warning", layer="host",
                message=f"{short:.0%} of {launches.kernels_per_step:.0f} kernels per step run "
                        f"shorter than {th.SHORT_KERNEL_US.value:.0f} µs and are launched one "
                        "by one: the GPU waits on the host."))
        syncs = {k: n for k, n in f.device.transfers.syncs_per_step.items() if k in SYNC_CALLS}
        syncs_per_step = max(syncs.values(), default=0.0)
        v.evidence.append(Evidence(metric="host_syncs_per_step", value=syncs_per_step,
                                   unit="syncs"))
        if syncs:
            listed = ", ".join(f"{k} {n:g}" for k, n in sorted(syncs.items()))
            v.findings.append(Finding(
                id="host.syncs", severity="warning" if syncs_per_step >= 1 else "info",
                layer="host", message=f"Host-device syncs per step: {listed}."))
        reads = f.device.transfers.cpu_scalar_reads_per_step
        if reads >= 1:
            read_ms = f.device.transfers.cpu_scalar_read_us_per_step / 1e3
            v.evidence.append(Evidence(metric="cpu_scalar_reads_per_step", value=reads,
                                       unit="reads"))
            v.findings.append(Finding(
                id="host.cpu_scalar_reads", severity="info", layer="host",
                message=f"{reads:g} scalar reads (.item()) of CPU tensors per step, "
                        f"{read_ms:.2f} ms: host work that waits for no device, not syncs."))
    optimizer_ops = _optimizer_ops_per_step(f)
    v.evidence.append(share_evidence("optimizer_ops_per_step", optimizer_ops,
                                     th.OPTIMIZER_OPS_PER_STEP))
    if share < th.HOST_SIGNIFICANT.value:
        return v
    fused = f.names_matching(lambda n: "_fused_" in n)
    if optimizer_ops >= th.OPTIMIZER_OPS_PER_STEP.value and not fused:
        v.remedies.append((BY_ID["optimizer.fused"],
                           f"the optimizer runs {optimizer_ops:.0f} ops per step"))
    if syncs_per_step >= 1:
        v.remedies.append((BY_ID["sync.remove"], f"{syncs_per_step:g} syncs per step"))
    v.remedies.append((BY_ID["compile.reduce_overhead"],
                       "many small ops: fewer launches per step" if f.gpu else
                       "many small ops: compiled graphs skip per-op dispatch"))
    return v


def _host_ops_per_step(f: Facts) -> float:
    ev = f.trace.events
    rows = f.nesting.rows
    return float(in_steps(ev.ts[rows], f.steps).sum()) / max(len(f.steps), 1)


def _optimizer_ops_per_step(f: Facts) -> float:
    """Host ops that start inside ``Optimizer.step#...`` ranges, outside the closures they
    run (forward and backward), per analysed step."""
    ev = f.trace.events
    s, e = optimizer_own_intervals(f.trace, zero_grad=False)
    if s.size == 0:
        return 0.0
    rows = f.nesting.rows
    inside = covers(ev.ts[rows], s, e) & in_steps(ev.ts[rows], f.steps)
    return float(inside.sum()) / max(len(f.steps), 1)


# --- kernel -------------------------------------------------------------------------------


def kernel_rule(f: Facts, primary: bool) -> Verdict:
    """Precision first (when matrix kernels run fp32 without tensor cores), then fusion."""
    share = f.share("kernel")
    v = Verdict(evidence=[share_evidence("kernel_share", share, th.KERNEL_SIGNIFICANT)])
    devices = f.trace.meta.devices
    major = max((d.compute_major for d in devices), default=0)
    fp32_share, tc_share, elementwise, unfused = None, None, None, False
    if f.device is not None:
        matrix = f.device.classes
        mat_time = sum(c.time_us for c in matrix if c.cls in _MATRIX_CLASSES)
        no_tc = sum(c.no_tensor_core_us for c in matrix)
        tc = sum(c.tensor_core_us for c in matrix)
        if mat_time > 0:
            fp32_share, tc_share = no_tc / mat_time, tc / mat_time
            v.evidence.append(share_evidence("fp32_matmul_share", fp32_share,
                                             th.FP32_MATMUL_SHARE))
            v.evidence.append(Evidence(metric="tensor_core_share", value=round(tc_share, 4),
                                       unit="share of matrix-kernel time"))
        kernel_time = f.device.kernel_time
        if kernel_time > 0:
            elementwise = f.device.class_time("elementwise", "reduction") / kernel_time
            v.evidence.append(share_evidence("elementwise_share", elementwise,
                                             th.ELEMENTWISE_SHARE))
        if fp32_share is not None and fp32_share >= th.FP32_MATMUL_SHARE.value and major >= 7:
            v.findings.append(Finding(
                id="kernel.fp32_matmul", severity="warning", layer="kernel",
                message=f"{fp32_share:.0%} of matrix-kernel time runs fp32 without tensor "
                        f"cores on a GPU that has them (compute capability {major}.x)."))
        chain = _pointwise_per_matrix_kernel(f)
        if chain is not None:
            v.evidence.append(share_evidence("pointwise_kernels_per_matrix_kernel", chain,
                                             th.UNFUSED_CHAIN))
        unfused = (elementwise is not None and elementwise >= th.ELEMENTWISE_SHARE.value
                   and (chain is None or chain >= th.UNFUSED_CHAIN.value))
        if unfused:
            per_step = sum(c.count for c in f.device.classes
                           if c.cls in ("elementwise", "reduction")) / max(len(f.steps), 1)
            v.findings.append(Finding(
                id="kernel.unfused_elementwise", severity="warning", layer="kernel",
                message=f"{elementwise:.0%} of kernel time is elementwise/reduction work "
                        f"({per_step:.0f} kernels per step"
                        + (f", {chain:.0f} per matrix kernel" if chain is not None else "")
                        + "): fusing the chains would cut memory traffic."))
    if not primary and share < th.KERNEL_SIGNIFICANT.value:
        return v
    if not f.gpu:
        v.remedies.append((BY_ID["amp.bf16"],
                           "CPU compute dominates; gains need a CPU with AVX512-BF16/AMX"))
        v.remedies.append((BY_ID["compile.default"], "fuses elementwise work between the big ops"))
    else:
        precision_known = fp32_share is not None
        fp32_heavy = precision_known and fp32_share >= th.FP32_MATMUL_SHARE.value
        if major >= 8 and (fp32_heavy or not precision_known):
            v.remedies.append((BY_ID["matmul.tf32"],
                               f"{fp32_share:.0%} of matrix time is fp32 without tensor cores"
                               if fp32_heavy else
                               "if matmuls run in fp32 (kernel names do not tell)"))
        low_precision = precision_known and tc_share >= 0.5 and _runs_low_precision(f)
        if not low_precision:
            v.remedies.append((BY_ID["amp.bf16"],
                               "matrix kernels run in fp32/TF32" if precision_known else
                               "compute dominates the step" if major >= 8 or not devices else
                               "this GPU predates bf16 tensor cores: use dtype=torch.float16 "
                               "with torch.amp.GradScaler"))
        v.remedies.append((BY_ID["compile.default"],
                           f"{elementwise:.0%} of kernel time is unfused elementwise work"
                           if unfused else "fuses elementwise work between the big ops"))
    v.remedies.append((BY_ID["compile.max_autotune"], "after compile.default, if GEMMs dominate"))
    v.remedies.append((BY_ID["kernel.custom"], "only for an op that dominates the top-ops table"))
    return v


def _pointwise_per_matrix_kernel(f: Facts) -> float | None:
    """Elementwise + reduction kernels per matrix kernel (None without matrix kernels)."""
    counts = {c.cls: c.count for c in f.device.classes}
    matrix = sum(counts.get(c, 0) for c in _MATRIX_CLASSES)
    if matrix == 0:
        return None
    return (counts.get("elementwise", 0) + counts.get("reduction", 0)) / matrix


# nvjet_* are cuBLASLt's Hopper kernels for 16/8-bit inputs (fp32 and TF32 GEMMs there run
# sm90_xmma_gemm_f32f32_* kernels, measured on an H200).
_LOW_PRECISION = re.compile(r"bf16|f16|fp16|e4m3|e5m2|fp8|h884|h1688|h16816|i8816|nvjet", re.I)
_MATRIX_CLASSES = ("gemm", "convolution", "attention")


def _runs_low_precision(f: Facts) -> bool:
    """Most matrix time is on tensor cores and some matrix kernel is 16-bit or 8-bit."""
    ops = f.device.ops
    ev = f.trace.events
    matrix = np.isin(ops.cls, [KERNEL_CLASSES.index(c) for c in _MATRIX_CLASSES])
    names = (ev.names[i] for i in unique(ev.name_id[ops.rows[matrix]]))
    return any(_LOW_PRECISION.search(n) for n in names)


# --- communication ------------------------------------------------------------------------


def _communication_busy_us(f: Facts) -> float:
    """Time in the analysed steps during which any collective runs: NCCL/RCCL kernels on a GPU
    trace, gloo/c10d/nccl host ranges (background threads included) on a CPU trace."""
    ev = f.trace.events
    if f.gpu:
        rows = ev.name_mask(is_communication_kernel) & (ev.kind == EventKind.KERNEL)
    else:
        rows = ev.name_mask(is_host_communication) & np.isin(ev.kind, HOST_KINDS)
    return union_in_steps(f.trace, np.flatnonzero(rows), f.steps)


def communication_rule(f: Facts) -> Verdict:
    share = f.share("communication")
    v = Verdict(evidence=[share_evidence("communication_share", share,
                                         th.COMMUNICATION_SIGNIFICANT)])
    busy = _communication_busy_us(f)
    if busy > 0:
        exposed = f.layer_us.get("communication", 0.0)
        v.evidence.append(Evidence(metric="communication_overlapped", value=round(
            max(0.0, 1 - exposed / busy), 4), unit="share of communication time hidden "
            "behind other work"))
    for c in f.collectives[:3]:
        v.evidence.append(Evidence(metric=f"{c.op}_per_step", value=round(c.per_step, 2),
                                   unit="calls"))
        if c.busbw_gbps is not None:
            v.evidence.append(Evidence(metric=f"{c.op}_busbw", value=round(c.busbw_gbps, 2),
                                       unit="GB/s", source="nccl-tests bus bandwidth"))
    slow = [c for c in f.collectives if c.source == "nccl kernel" and c.busbw_gbps is not None
            and (c.bytes_per_call or 0) >= 16e6 and c.busbw_gbps < th.SLOW_LINK_BUSBW.value]
    for c in slow:
        v.findings.append(Finding(
            id="communication.slow_link", severity="warning", layer="communication",
            message=f"{c.op} moves {c.bytes_per_call / 1e6:,.0f} MB per call at "
                    f"{c.busbw_gbps:.1f} GB/s bus bandwidth: far below NVLink or InfiniBand. "
                    "Check NCCL's transport (NCCL_DEBUG=INFO: NVLink/P2P, IB, or sockets).",
            evidence=[Evidence(metric=f"{c.op}_busbw", value=round(c.busbw_gbps, 3),
                               unit="GB/s", threshold=th.SLOW_LINK_BUSBW.value,
                               comparison="<", fired=True,
                               source=th.SLOW_LINK_BUSBW.source)]))
    ops = {c.op.lower().replace("_", "") for c in f.collectives}
    if any("reducescatter" in o for o in ops):
        v.findings.append(Finding(
            id="communication.sharded", severity="info", layer="communication",
            message="All-gather / reduce-scatter traffic: the model is sharded (FSDP / ZeRO). "
                    "Fewer, larger shards (coarser wrapping), reshard_after_forward=False for "
                    "small models, or hybrid sharding within a node cut this traffic; plain DDP "
                    "communicates less when the model fits on one device."))
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
