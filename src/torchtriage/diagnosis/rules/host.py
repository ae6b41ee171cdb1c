"""The host rule: CPU-side dispatch and launch overhead, syncs, the optimizer's op count."""

from __future__ import annotations

from collections import Counter

import msgspec

from torchtriage.analysis.categories import optimizer_own_intervals
from torchtriage.analysis.intervals import covered_within, covers
from torchtriage.analysis.ops import in_steps
from torchtriage.analysis.steps import OPTIMIZER_STEP_PREFIX
from torchtriage.analysis.transfers import SyncKind, SyncSource
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID
from torchtriage.diagnosis.result import Evidence, Finding
from torchtriage.diagnosis.rules.base import Facts, Verdict, share_evidence
from torchtriage.diagnosis.rules.run import gate_compiled
from torchtriage.diagnosis.vocabulary import Layer


class HostRule:
    """Host overhead: dispatch, launches, syncs, Python glue.

    CPU traces: the share of step time in ops that do no real work (no nested op runs
    ``small_op_us`` of its own) is a finding at 10 %. GPU traces: short kernels launched one by
    one (``launch_bound_short_share`` of kernels under ``short_kernel_us``), host-device syncs
    and CPU scalar reads per step. At ``host_significant`` of step time: the fused optimizer
    when ``optimizer_ops_per_step`` host ops run inside ``Optimizer.step`` and no fused kernel
    does (when they include multi-tensor ``aten::_foreach_*`` ops, the optimizer already
    batches its parameters, and fused is prescribed only when the optimizer's own time is
    ``foreach_optimizer_share`` of the step, and withheld when no optimizer of the trace has
    a fused implementation in torch; the fix loop then skips the foreach fallback),
    removing syncs when there is at least one per step, then CUDA-graph compilation.
    """

    layer: Layer = "host"
    prescribes = ("optimizer.fused", "sync.remove", "compile.reduce_overhead")
    thresholds = (th.HOST_SIGNIFICANT, th.SMALL_OP_US, th.SHORT_KERNEL_US,
                  th.LAUNCH_BOUND_SHORT_SHARE, th.OPTIMIZER_OPS_PER_STEP,
                  th.FOREACH_OPTIMIZER_SHARE)

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
        sources = f.device.transfers.sync_sources
        steps = max(len(f.steps), 1)
        syncs_per_step = round(sum(src.count for src in sources) / steps, 2)
        v.evidence.append(Evidence(metric="host_syncs_per_step", value=syncs_per_step,
                                   unit="syncs"))
        if sources:
            v.findings.append(Finding(
                id="host.syncs", severity="warning" if syncs_per_step >= 1 else "info",
                layer="host", message=f"{syncs_per_step:g} host-device syncs per step: "
                                      f"{_sync_sites(sources, steps)}."))
        reads = f.device.transfers.cpu_scalar_reads_per_step
        if reads >= 1:
            read_ms = f.device.transfers.cpu_scalar_read_us_per_step / 1e3
            v.evidence.append(Evidence(metric="cpu_scalar_reads_per_step", value=reads,
                                       unit="reads"))
            v.findings.append(Finding(
                id="host.cpu_scalar_reads", severity="info", layer="host",
                message=f"{reads:g} scalar reads (.item()) of CPU tensors per step, "
                        f"{read_ms:.2f} ms: host work that waits for no device, not syncs."))
    work = _optimizer_work(f)
    ops = share_evidence("optimizer_ops_per_step", work.ops, th.OPTIMIZER_OPS_PER_STEP)
    multi = Evidence(metric=MULTI_TENSOR_OPS, value=work.multi_tensor_ops,
                     unit="aten::_foreach_* ops per step inside Optimizer.step")
    own = share_evidence("optimizer_share", work.share, th.FOREACH_OPTIMIZER_SHARE)
    v.evidence.extend([ops, multi, own])
    if share < th.HOST_SIGNIFICANT.value:
        return v
    fused = f.names_matching(lambda n: "_fused_" in n)
    if work.ops >= th.OPTIMIZER_OPS_PER_STEP.value and not fused:
        if not work.multi_tensor_ops:
            loop = f"the optimizer runs {work.ops:.0f} ops per step, one parameter at a time"
            own_share = share_evidence("optimizer_share", work.share,
                                       th.PER_PARAMETER_OPTIMIZER_SHARE)
            if work.share >= th.PER_PARAMETER_OPTIMIZER_SHARE.value:
                v.remedies.append((BY_ID["optimizer.fused"],
                                   f"{loop}, {work.share:.0%} of step time"))
            else:
                v.withheld.append((BY_ID["optimizer.fused"],
                                   f"{loop}, but takes {work.share:.1%} of step time: fusing "
                                   "it saves at most that", [ops, own_share]))
        elif work.share >= th.FOREACH_OPTIMIZER_SHARE.value:
            classes = _optimizer_classes(f)
            if classes and not classes & FUSED_OPTIMIZERS:  # (none named: it may be fused)
                v.withheld.append((BY_ID["optimizer.fused"],
                                   f"{', '.join(sorted(classes))} has no fused implementation "
                                   f"in torch (fused=True: {', '.join(sorted(FUSED_OPTIMIZERS))})"
                                   " and already runs multi-tensor (foreach) kernels, "
                                   f"{work.share:.0%} of step time", [multi, own]))
            else:
                v.remedies.append((BY_ID["optimizer.fused"], "the multi-tensor optimizer takes "
                                   f"{work.share:.0%} of step time"))
        else:
            v.withheld.append((BY_ID["optimizer.fused"],
                               f"the optimizer already runs multi-tensor (foreach) kernels and "
                               f"takes {work.share:.0%} of step time", [multi, own]))
    if syncs_per_step >= 1 and f.device is not None:
        _sync_remedy(f, v)
    v.remedies.append((BY_ID["compile.reduce_overhead"],
                       "many small ops: fewer launches per step" if f.gpu else
                       "many small ops: compiled graphs skip per-op dispatch"))
    if not f.gpu:  # on a CPU the same torch.compile(model) as compile.default
        gate_compiled(f, v, ("compile.reduce_overhead",))
    return v


# What each kind of sync is (analysis/transfers.py) and the code change that removes it.
SYNC_KINDS: dict[SyncKind, tuple[str, str]] = {
    "data_dependent": ("an output shape that depends on the data: the host reads a count",
                       "x = torch.where(mask, x, 0)  # not x[mask]; repeat_interleave(..., "
                       "output_size=n)"),
    "condition": ("a tensor taken as a Python bool: an if or a while on a tensor",
                  "check it every N steps, or keep it on the device: torch.where(cond, a, b) "
                  "(Hugging Face Trainer: logging_nan_inf_filter=False)"),
    "scalar_read": ("a scalar read: .item(), float(t), int(t)", BY_ID["sync.remove"].code),
    "copy_to_host": ("a copy to the host: .cpu(), .tolist(), .numpy()",
                     "keep per-step values on the device (loss.detach()) and copy them to the "
                     "host every N steps"),
    "copy_to_device": ("a copy to the device that waits for it: from pageable memory or with "
                       "non_blocking=False",
                       "DataLoader(..., pin_memory=True); x = x.to(device, non_blocking=True)"),
    "outside_ops": ("outside any op: torch.cuda.synchronize(), or an event's or a stream's "
                    "synchronize()",
                    "drop torch.cuda.synchronize() from the step; time it with "
                    "torch.cuda.Event(enable_timing=True)"),
    "other": ("a wait inside the op", BY_ID["sync.remove"].code),
}


def _sync_sites(sources: list[SyncSource], steps: int) -> str:
    """``2 in aten::to (a copy to the device ...), 1 in aten::item (a scalar read ...)``."""
    return ", ".join(
        f"{src.count / steps:g} in {src.op or 'no op'} ({SYNC_KINDS[src.kind][0]}"
        + (f": {src.waits_in}" if src.kind == "other" else "") + ")"
        for src in sources)


def _sync_remedy(f: Facts, v: Verdict) -> None:
    """sync.remove, with the code for the kind of sync found most (ties: the first in
    :data:`SYNC_KINDS`); the copies to the device are left to the data-loading rule's pinned
    memory and non-blocking copies when that layer is significant (the same change, prescribed
    there)."""
    transfers = f.device.transfers
    steps = max(len(f.steps), 1)
    copies_per_step = transfers.sync_count("copy_to_device") / steps
    covered = copies_per_step > 0 and (f.share("data_loading")
                                       >= th.DATA_LOADING_SIGNIFICANT.value)
    left = [src for src in transfers.sync_sources
            if not (covered and src.kind == "copy_to_device")]
    per_step = sum(src.count for src in left) / steps
    if covered and per_step < 1:
        v.withheld.append((BY_ID["sync.remove"], (
            f"{copies_per_step:g} syncs per step are copies to the device, which pinned memory "
            "and non-blocking copies remove (dataloader.pin_memory, h2d.non_blocking)"),
            [Evidence(metric="input_copy_syncs_per_step", value=round(copies_per_step, 2),
                      unit="syncs")]))
        return
    if per_step < 1:
        return
    kinds: Counter[SyncKind] = Counter()
    for src in left:
        kinds[src.kind] += src.count
    order = list(SYNC_KINDS)  # ties: the order of SYNC_KINDS
    code = SYNC_KINDS[max(kinds, key=lambda k: (kinds[k], -order.index(k)))][1]
    remedy = BY_ID["sync.remove"]
    if code != remedy.code:
        remedy = msgspec.structs.replace(remedy, code=code)
    v.remedies.append((remedy, f"{per_step:g} syncs per step: {_sync_sites(left, steps)}"))


# The torch.optim classes that take fused=True (inspect.signature, torch 2.13 CPU and 2.11
# CUDA, 2026-12-03; Adadelta, Adamax, ASGD, NAdam, RAdam, RMSprop, Rprop, Adafactor do not).
FUSED_OPTIMIZERS = frozenset(("Adam", "AdamW", "SGD", "Adagrad"))


def _optimizer_classes(f: Facts) -> set[str]:
    """The classes in the trace's ``Optimizer.step#<Class>.step`` ranges."""
    return {name[len(OPTIMIZER_STEP_PREFIX):].split(".")[0] for name in f.trace.events.names
            if name.startswith(OPTIMIZER_STEP_PREFIX)}


def _host_ops_per_step(f: Facts) -> float:
    ev = f.trace.events
    rows = f.nesting.rows
    return float(in_steps(ev.ts[rows], f.steps).sum()) / max(len(f.steps), 1)


MULTI_TENSOR_OPS = "optimizer_multi_tensor_ops_per_step"  # read by the fix loop's context


class OptimizerWork(msgspec.Struct, frozen=True):
    ops: float  # host ops per analysed step inside the optimizer's own time
    multi_tensor_ops: float  # of those, aten::_foreach_* ops
    share: float  # the optimizer's own host time over the analysed steps' wall time


def _optimizer_work(f: Facts) -> OptimizerWork:
    """Host ops that start inside ``Optimizer.step#...`` ranges, outside the closures they
    run (forward and backward), per analysed step; how many of them are multi-tensor
    (``aten::_foreach_*``); and the ranges' own time as a share of the analysed steps."""
    ev = f.trace.events
    s, e = optimizer_own_intervals(f.trace, zero_grad=False)
    if s.size == 0:
        return OptimizerWork(0.0, 0.0, 0.0)
    rows = f.nesting.rows
    inside = rows[covers(ev.ts[rows], s, e) & in_steps(ev.ts[rows], f.steps)]
    steps = max(len(f.steps), 1)
    foreach = ev.name_mask(lambda n: n.startswith("aten::_foreach_"))[inside]
    own_us = float(covered_within(s, e, f.steps.start, f.steps.end).sum())
    return OptimizerWork(ops=float(inside.size) / steps,
                         multi_tensor_ops=float(foreach.sum()) / steps,
                         share=own_us / f.wall_us if f.wall_us > 0 else 0.0)
