"""The host rule: CPU-side dispatch and launch overhead, syncs, the optimizer's op count."""

from __future__ import annotations

from torchtriage.analysis.categories import optimizer_own_intervals
from torchtriage.analysis.intervals import covers
from torchtriage.analysis.ops import in_steps
from torchtriage.analysis.transfers import SYNC_CALLS
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID
from torchtriage.diagnosis.result import Evidence, Finding
from torchtriage.diagnosis.rules.base import Facts, Verdict, share_evidence
from torchtriage.diagnosis.vocabulary import Layer


class HostRule:
    """Host overhead: dispatch, launches, syncs, Python glue.

    CPU traces: the share of step time in ops that do no real work (no nested op runs
    ``small_op_us`` of its own) is a finding at 10 %. GPU traces: short kernels launched one by
    one (``launch_bound_short_share`` of kernels under ``short_kernel_us``), host-device syncs
    and CPU scalar reads per step. At ``host_significant`` of step time: the fused optimizer
    when ``optimizer_ops_per_step`` host ops run inside ``Optimizer.step`` and no fused kernel
    does, removing syncs when there is at least one per step, then CUDA-graph compilation.
    """

    layer: Layer = "host"
    prescribes = ("optimizer.fused", "sync.remove", "compile.reduce_overhead")
    thresholds = (th.HOST_SIGNIFICANT, th.SMALL_OP_US, th.SHORT_KERNEL_US,
                  th.LAUNCH_BOUND_SHORT_SHARE, th.OPTIMIZER_OPS_PER_STEP)

    def judge(self, f: Facts) -> Verdict:
        return _host(f)


def _host(f: Facts) -> Verdict:
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
