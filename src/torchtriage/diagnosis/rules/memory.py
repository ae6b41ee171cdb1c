"""The memory rule (judged by capacity, not time), the memory ladder and what an
out-of-memory error's figures say."""

from __future__ import annotations

from torchtriage.analysis.memory import DeviceMemory
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID, Remedy
from torchtriage.diagnosis.result import Evidence, Finding, OutOfMemory
from torchtriage.diagnosis.rules.base import Facts, Verdict, share_evidence
from torchtriage.diagnosis.vocabulary import Layer


class MemoryRule:
    """`memory` is primary when the job ran out of memory or a device's peak allocated memory
    (live tensors) reaches ``memory_near_capacity`` of its known capacity; then the memory
    ladder is prescribed, cheapest rung first. A large reserved cache (``fragmentation_min_
    reserved`` of capacity) with ``memory_fragmentation`` of it idle at the allocated peak adds
    expandable segments. Capacity unknown: an info finding, no judgement.

    Over the run (``torchtriage run``'s step timeline, diagnosis/run_view.py): memory that grows
    steadily at step boundaries is a leak, whatever the batch: ``memory.fix_leak`` is
    prescribed with the growth's figures and cause, and the ladder is withheld (its rungs only
    postpone the out-of-memory error, past a short trial). Growth without an error or a peak
    near capacity does not make memory primary; it is listed with the predicted step at which
    memory is full, and when that is past ``growth_horizon_steps`` it is an info finding with
    no fix."""

    layer: Layer = "memory"
    prescribes = ("memory.expandable_segments", "memory.grad_accumulation",
                  "memory.activation_checkpointing", "memory.bf16", "memory.fsdp",
                  "memory.fix_leak")
    thresholds = (th.MEMORY_NEAR_CAPACITY, th.MEMORY_FRAGMENTATION,
                  th.FRAGMENTATION_MIN_RESERVED, th.GROWTH_MIN_STEPS, th.GROWTH_SKIP_STEPS,
                  th.GROWTH_T, th.GROWTH_HALF_SHARE, th.GROWTH_MIN_BYTES, th.GROWTH_HORIZON_STEPS)

    def judge(self, f: Facts) -> Verdict:
        return _memory(f)


def _memory(f: Facts) -> Verdict:
    v = Verdict()
    fired = False
    if f.oom or f.out_of_memory is not None:
        fired = True
        out_of_memory_evidence(v, f.out_of_memory)
    assessed = [(peak, cap, src) for peak, cap, src in f.memory if cap]
    for peak, cap, src in assessed:
        used = peak.peak_allocated
        frac = used / cap
        ev = peak_fraction_evidence(peak, cap, src)
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
    growth = f.run.growth if f.run is not None else None
    leak = growth is not None and growth.steady
    if leak:
        growth_verdict(v, growth, out_of_memory=fired)
    if fired:
        if leak:
            for remedy, _ in ladder_remedies():
                v.withheld.append((remedy, leak_withholds(growth), list(growth.evidence)))
        else:
            v.remedies.extend(ladder_remedies())
    v.decides_primary = fired
    return v


def leak_withholds(growth) -> str:
    return (f"memory grows by {_size(growth.bytes_per_step)} per step over the run: a leak, "
            "which a smaller footprint per step only postpones")


def growth_verdict(v: Verdict, growth, *, out_of_memory: bool) -> None:
    """The finding and remedy of memory that grows steadily over the run."""
    v.evidence.extend(growth.evidence)
    v.evidence.append(Evidence(metric="memory_growth_bytes_per_step",
                               value=growth.bytes_per_step, unit=f"bytes ({growth.source})"))
    if growth.full_at_step is not None:
        v.evidence.append(Evidence(metric="memory_full_at_step", value=growth.full_at_step,
                                   unit=f"step ({growth.capacity_source})"))
    full = (f"; at that rate the {_what(growth)} is full at step {growth.full_at_step}"
            if growth.full_at_step is not None else "")
    oom = " The out-of-memory error follows from it: a leak, not a batch too big." \
        if out_of_memory else ""
    cause = f" Cause: {growth.cause_detail}." if growth.cause_detail else ""
    if not out_of_memory and growth.full_at_step is not None \
            and growth.full_at_step > th.GROWTH_HORIZON_STEPS.value:
        v.findings.append(Finding(
            id="memory.growth", severity="info", layer="memory",
            message=f"Memory grows slowly over the run: {_size(growth.bytes_per_step)} per step "
                    f"({_label(growth.source)}, steps {growth.first_step}-{growth.last_step})"
                    f"{full}, past growth_horizon_steps "
                    f"({th.GROWTH_HORIZON_STEPS.value:,.0f}): not a leak this job will meet."
                    f"{cause}",
            evidence=list(growth.evidence)))
        return
    v.findings.append(Finding(
        id="memory.growth", severity="critical" if out_of_memory or full else "warning",
        layer="memory",
        message=f"Memory grows steadily over the run: {_size(growth.bytes_per_step)} per step "
                f"({_label(growth.source)}, steps {growth.first_step}-{growth.last_step}, "
                f"{_size(growth.start_bytes)} -> {_size(growth.end_bytes)}){full}.{oom}{cause}",
        evidence=list(growth.evidence)))
    held = growth.holders[0].name if growth.holders else "the list or dict that keeps them"
    v.remedies.append((BY_ID["memory.fix_leak"],
                       f"{_size(growth.bytes_per_step)} per step kept across steps "
                       f"({growth.cause.replace('_', ' ')}; held by {held})"))


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _label(source: str) -> str:
    return {"cuda_allocator": "CUDA allocated memory at step boundaries",
            "process_heap": "the process's malloc heap in use, CPU",
            "process_rss": "the process's resident set size, CPU"}.get(source, source)


def _what(growth) -> str:
    return "device" if growth.source == "cuda_allocator" else "memory limit"


def peak_fraction_evidence(peak: DeviceMemory, capacity: int, source: str | None) -> Evidence:
    """A device's peak against ``memory_near_capacity``. Pressure is what live tensors hold
    (peak allocated); a large but idle cache is fragmentation, judged apart."""
    ev = share_evidence(f"peak_memory_fraction[{peak.device}]", peak.peak_allocated / capacity,
                        th.MEMORY_NEAR_CAPACITY)
    ev.unit = f"of {capacity / 2**30:.2f} GiB ({source})"
    return ev


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
