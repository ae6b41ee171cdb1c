"""Building the GPU part of the diagnosis document (diagnosis/gpu_result.py) from the analysed
steps' device evidence (analysis/utilization.py, analysis/idle.py, analysis/launch.py,
analysis/transfers.py)."""

from __future__ import annotations

from torchtriage.analysis.idle import comm_compute_overlap, idle_breakdown, temporal_breakdown
from torchtriage.analysis.utilization import busy_time, top_kernels
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.gpu_result import (
    Copies,
    GpuReport,
    IdleTime,
    KernelClassTime,
    KernelRow,
    Launches,
    StreamIdle,
    StreamUse,
    SyncSite,
    TemporalBreakdown,
    TransfersInfo,
)
from torchtriage.diagnosis.rules.base import Facts
from torchtriage.trace.model import Trace


def gpu_report(trace: Trace, facts: Facts, top: int) -> GpuReport:
    """The device-side evidence of a GPU trace's analysed steps (``Diagnosis.gpu``)."""
    dev = facts.device
    wall = facts.breakdown.total_wall_us or 1.0  # as profiled: the trace's own figures
    busy, streams = busy_time(trace, dev.ops, facts.steps)
    idle = idle_breakdown(trace, th.KERNEL_WAIT_US.value)
    temporal = temporal_breakdown(trace)
    summed = sum(c.time_us for c in dev.classes) or 1.0
    launches, moved = dev.launches, dev.transfers

    def copies(c) -> Copies:
        return Copies(count=c.count, pageable=c.pageable, bytes=c.bytes,
                        time_ms=round(c.time_us / 1e3, 3))

    return GpuReport(
        utilization=round(busy / wall, 4),
        busy_ms=round(busy / 1e3, 3),
        streams=[StreamUse(device=s.device, stream=s.stream, busy_ms=round(s.busy_us / 1e3, 3),
                             utilization=round(s.busy_us / wall, 4), events=s.events)
                 for s in streams],
        idle=IdleTime(
            host_wait_ms=round(sum(i.host_wait_us for i in idle) / 1e3, 3),
            kernel_wait_ms=round(sum(i.kernel_wait_us for i in idle) / 1e3, 3),
            other_ms=round(sum(i.other_us for i in idle) / 1e3, 3),
            kernel_wait_threshold_us=th.KERNEL_WAIT_US.value,
            streams=[StreamIdle(device=i.device, stream=i.stream,
                                  host_wait_ms=round(i.host_wait_us / 1e3, 3),
                                  kernel_wait_ms=round(i.kernel_wait_us / 1e3, 3),
                                  other_ms=round(i.other_us / 1e3, 3)) for i in idle]),
        temporal=None if temporal is None else TemporalBreakdown(
            span_ms=round(temporal.span_us / 1e3, 3),
            idle_pct=round(temporal.pct(temporal.idle_us), 3),
            compute_pct=round(temporal.pct(temporal.compute_us), 3),
            non_compute_pct=round(temporal.pct(temporal.non_compute_us), 3)),
        comm_compute_overlap_pct=rounded(comm_compute_overlap(trace), 3),
        kernel_classes=[KernelClassTime(
            cls=c.cls, count=c.count, time_ms=round(c.time_us / 1e3, 3),
            share=round(c.time_us / summed, 4), tensor_core_ms=round(c.tensor_core_us / 1e3, 3),
            no_tensor_core_ms=round(c.no_tensor_core_us / 1e3, 3)) for c in dev.classes],
        top_kernels=[KernelRow(name=k.name, cls=k.cls, count=k.count,
                                 time_ms=round(k.time_us / 1e3, 3),
                                 share=round(k.time_us / summed, 4),
                                 tensor_cores=k.tensor_cores, launched_by=k.launched_by)
                     for k in top_kernels(trace, dev.ops, top)],
        launches=Launches(
            kernels_per_step=round(launches.kernels_per_step, 2),
            launch_cost_us_median=rounded(launches.launch_cost_us_median, 3),
            launch_cost_us_p90=rounded(launches.launch_cost_us_p90, 3),
            launch_delay_us_median=rounded(launches.launch_delay_us_median, 3),
            launch_delay_us_p90=rounded(launches.launch_delay_us_p90, 3),
            short_kernel_share=round(launches.short_kernel_share, 4),
            short_kernel_time_share=round(launches.short_kernel_time_share, 4),
            short_kernel_us=launches.short_kernel_us,
            launch_calls_per_step=round(launches.launch_calls_per_step, 2),
            graph_kernel_share=round(launches.graph_kernel_share, 4)),
        transfers=TransfersInfo(h2d=copies(moved.h2d), d2h=copies(moved.d2h),
                                  d2d=copies(moved.d2d), sync_copy_calls=moved.sync_copy_calls,
                                  syncs_per_step=moved.syncs_per_step,
                                  cpu_scalar_reads_per_step=moved.cpu_scalar_reads_per_step,
                                  cpu_scalar_read_ms_per_step=round(
                                      moved.cpu_scalar_read_us_per_step / 1e3, 3),
                                  sync_sources=[SyncSite(
                                      kind=src.kind, op=src.op, waits_in=src.waits_in,
                                      per_step=round(src.count / max(len(facts.steps), 1), 2))
                                      for src in moved.sync_sources]),
    )


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
