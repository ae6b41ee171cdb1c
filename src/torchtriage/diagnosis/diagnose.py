"""``diagnose(trace)``: the whole classify-then-prescribe pass over one trace.

Reading order: analyse (steps, breakdown, ops, memory, shapes) -> layer times -> every rule of
``rules.RULES`` -> primary layer and why (``primary.py``; memory's rule may claim it) ->
confidence -> prescriptions in order -> the document.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from torchtriage.analysis.breakdown import StepBreakdown, step_breakdown
from torchtriage.analysis.categories import unmarked_closure_steps
from torchtriage.analysis.collectives import collective_table
from torchtriage.analysis.compiling import compiling_us
from torchtriage.analysis.dtypes import float64_share_device, float64_share_host
from torchtriage.analysis.kernels import device_ops
from torchtriage.analysis.launch import launch_stats
from torchtriage.analysis.memory import memory_peaks
from torchtriage.analysis.ops import OpNesting, OpStat, op_nesting, top_device_ops, top_host_ops
from torchtriage.analysis.shapes import dynamic_shape_ops
from torchtriage.analysis.sharding import sharding
from torchtriage.analysis.steps import StepWindows, find_steps
from torchtriage.analysis.transfers import transfers
from torchtriage.analysis.utilization import busy_time, class_times
from torchtriage.diagnosis import data_quality as dq
from torchtriage.diagnosis import result as r
from torchtriage.diagnosis import rules
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import COST_LABELS, Remedy
from torchtriage.diagnosis.confidence import verdict_confidence
from torchtriage.diagnosis.contention import contention_finding
from torchtriage.diagnosis.dataset import dataset_verdict
from torchtriage.diagnosis.gpu_report import gpu_report, rounded
from torchtriage.diagnosis.overhead import overhead_finding, profiler_overhead
from torchtriage.diagnosis.primary import (
    SIGNIFICANT,
    memory_primary,
    out_of_memory_rule,
    time_primary,
)
from torchtriage.diagnosis.rules.memory import growth_verdict, leak_withholds
from torchtriage.diagnosis.rules.run import RECOMPILE_LEAD, STALL_REMEDY
from torchtriage.diagnosis.run_view import RunInputs, run_view
from torchtriage.diagnosis.vocabulary import (
    CONFIDENCE_LEVELS,
    CPU_CATEGORY_LAYER,
    GPU_CATEGORY_LAYER,
    LAYERS,
    TIME_LAYERS,
)
from torchtriage.diagnosis.windows import slice_finding, window_findings, without_short_one_off
from torchtriage.trace.model import EventKind, Trace
from torchtriage.version import __version__


def diagnose(
    trace: Trace,
    *,
    device_memory: int | None = None,
    oom: bool = False,
    top: int = 10,
    machine: dict | r.MachineInfo | None = None,
    out_of_memory: r.OutOfMemory | None = None,
    windows: list[r.WindowCheck] | None = None,
    run: RunInputs | None = None,
) -> r.Diagnosis:
    """Classify the trace's bottleneck layer and prescribe fixes, cheapest first.

    Args:
        trace: a loaded trace (:func:`torchtriage.trace.load_trace`).
        machine: machine samples from ``torchtriage run`` (CPU per core, workers, GPU).
        device_memory: capacity in bytes to judge memory pressure against; overrides
            ``deviceProperties`` and stands in for a GPU's memory on CPU-only traces.
        oom: the profiled run raised an out-of-memory error.
        top: rows in each top-ops table.
        out_of_memory: what that error said (its figures become the memory layer's evidence).
        windows: ``torchtriage run``'s checks of its profiled windows, the last one this
            trace's: a window that was not steady state is said so and lowers the confidence.
        run: the run record's step timeline (``torchtriage run``): the whole run's memory
            growth, recurring stalls and compilation (diagnosis/run_view.py) join the rules,
            and a recurring stall may name the primary layer.
    """
    window = windows[-1] if windows else None
    steps = without_short_one_off(find_steps(trace), window)
    quality = dq.data_quality(trace, steps)
    dq.check_usable(trace, steps, quality)  # impossible timings past repair: no verdict
    facts = build_facts(trace, device_memory=device_memory, oom=oom, machine=machine,
                        out_of_memory=out_of_memory, steps=steps, window=window)
    steps, breakdown, nesting, gpu = facts.steps, facts.breakdown, facts.nesting, facts.gpu
    dynamic = dynamic_shape_ops(trace, steps)
    dynamic_rows = [r.DynamicShape(op=d.name, steps_seen=d.steps_seen,
                                   distinct_signatures=d.distinct_signatures,
                                   examples=list(d.examples)) for d in dynamic]
    if run is not None:
        facts.run = run_view(run, out_of_memory=out_of_memory, dynamic_shapes=dynamic_rows,
                             device_memory=device_memory)
    verdicts = {layer: rules.Verdict() for layer in LAYERS}
    for rule in rules.RULES:
        verdicts[rule.layer].merge(rule.judge(facts))
    memory_verdict = verdicts["memory"]
    ranked = sorted(TIME_LAYERS, key=lambda layer: -facts.share(layer))
    primary, runner_up, primary_rule = (memory_primary(facts, memory_verdict)
                                        if memory_verdict.decides_primary
                                        else time_primary(facts))
    verdicts["data_loading"] = _with_dataset(verdicts["data_loading"], trace, facts)
    missing = _missing(trace, steps)
    confidence, margin_evidence = verdict_confidence(facts, primary, runner_up,
                                                      memory_verdict, primary_rule)
    if any(m.startswith(_ACCELERATOR_WITHOUT_KERNELS) for m in missing):
        confidence = "low"  # a device job judged from its host side alone
    verdicts[primary].evidence.insert(0, margin_evidence)

    confidence = dq.lowered(confidence, trace)
    findings = _step_findings(steps)
    if (part := slice_finding(trace)) is not None:
        findings.insert(0, part)
        confidence = "low" if confidence == "low" else "medium"  # part of one step
    if (timing := dq.finding(trace, quality)) is not None:
        findings.insert(0, timing)
    contended = contention_finding(facts.machine)
    # (a busy machine slows steps, it does not change a memory peak)
    compiling = _compiling_finding(trace, steps, primary)
    if compiling is not None:
        findings.insert(0, compiling)
    for lowered in (window is not None and window.representative is False,
                    contended is not None and primary != "memory",
                    # (a verdict over the run does not rest on the window's steps)
                    compiling is not None and primary != "memory"
                    and primary_rule.rule not in ("recurring_stall", "run_recompiling")):
        if lowered:
            confidence = CONFIDENCE_LEVELS[max(CONFIDENCE_LEVELS.index(confidence) - 1, 0)]
    if contended is not None:
        findings.insert(0, contended)
    findings.extend(window_findings(windows or []))
    if facts.profiler_overhead is not None:
        findings.append(overhead_finding(facts.profiler_overhead))
    for layer in (primary, *[x for x in ("memory", *ranked) if x != primary]):
        findings.extend(verdicts[layer].findings)
    if dynamic:
        findings.append(r.Finding(
            id="shapes.dynamic", severity="info", layer="kernel",
            message=f"{len(dynamic)} ops change input shapes between steps "
                    f"(e.g. {dynamic[0].name}): torch.compile recompiles, allocator fragments."))

    lead = (tuple(STALL_REMEDY[c] for s in facts.run.stalls for c in (s.cause, *s.also)
                  if c in STALL_REMEDY)
            if primary_rule.rule == "recurring_stall" else
            RECOMPILE_LEAD if primary_rule.rule == "run_recompiling" else ())
    prescriptions, withheld = _prescriptions(primary, ranked, facts, verdicts, lead)
    layers = {
        layer: r.LayerResult(share=round(facts.share(layer), 4) if layer in TIME_LAYERS else 0.0,
                             time_ms=round(facts.layer_us.get(layer, 0.0) / 1e3, 3),
                             evidence=verdicts[layer].evidence)
        for layer in LAYERS
    }
    doc_breakdown = _breakdown_doc(breakdown, gpu)
    return r.Diagnosis(
        tool_version=__version__,
        summary=_summary(primary, facts, doc_breakdown, prescriptions, withheld,
                         primary_rule),
        primary=primary,
        confidence=confidence,
        primary_rule=primary_rule,
        trace=r.TraceInfo(
            path=trace.meta.path, mode="gpu" if gpu else "cpu", events=len(trace.events),
            devices=[d.name for d in trace.meta.devices], rank=_rank(trace),
            world_size=trace.meta.world_size, step_source=steps.source,
            steps_analyzed=[int(n) for n in steps.numbers],
            steps_excluded={str(k): v for k, v in steps.excluded.items()},
        ),
        layers=layers,
        breakdown=doc_breakdown,
        findings=findings,
        prescriptions=prescriptions,
        withheld=withheld,
        top_ops={"host": _rows(top_host_ops(trace, nesting, steps, top)),
                 "device": _rows(top_device_ops(trace, steps, top))},
        memory=[
            r.MemoryPeak(device=p.device, peak_allocated_bytes=p.peak_allocated,
                         peak_reserved_bytes=p.peak_reserved, baseline_bytes=p.baseline,
                         unseen_free_bytes=p.unseen_free_bytes,
                         capacity_bytes=cap,
                         capacity_source=src,
                         peak_fraction=round(max(p.peak_allocated, p.peak_reserved) / cap, 4)
                         if cap else None)
            for p, cap, src in facts.memory
        ],
        dynamic_shapes=dynamic_rows,
        gpu=gpu_report(trace, facts, top) if facts.device is not None else None,
        missing=missing,
        machine=facts.machine,
        collectives=[r.CollectiveRow(
            op=c.op, source=c.source, count=c.count, per_step=round(c.per_step, 2),
            time_ms=round(c.time_us / 1e3, 3), mean_ms=round(c.mean_us / 1e3, 4),
            bytes_per_call=c.bytes_per_call, group_size=c.group_size,
            algbw_gbps=rounded(c.algbw_gbps, 3), busbw_gbps=rounded(c.busbw_gbps, 3))
            for c in facts.collectives],
        sharding=r.ShardingInfo(
            kind=facts.sharding.kind, units=facts.sharding.units,
            all_gathers_per_step=facts.sharding.all_gathers_per_step,
            all_gather_ms=round(facts.sharding.all_gather_us / 1e3, 3),
            all_gather_hidden=facts.sharding.all_gather_hidden)
        if facts.sharding is not None else None,
        out_of_memory=out_of_memory,
        window=window,
        superseded_windows=list(windows[:-1]) if windows else [],
        data_quality=quality,
        run=facts.run,
    )


def build_facts(trace: Trace, *, device_memory: int | None = None, oom: bool = False,
                machine: dict | r.MachineInfo | None = None,
                out_of_memory: r.OutOfMemory | None = None,
                steps: list | None = None,
                window: r.WindowCheck | None = None) -> rules.Facts:
    """Every analysis the rules read, computed once (arguments as :func:`diagnose`'s;
    ``steps`` when the caller found them already; ``window``: this trace's window check, whose
    unprofiled steps tell the profiler's own overhead, see diagnosis/overhead.py)."""
    steps = find_steps(trace) if steps is None else steps
    breakdown = step_breakdown(trace, steps)
    nesting = op_nesting(trace)
    gpu = trace.has_device_activity
    small = 0.0 if gpu else rules.small_op_time(trace, steps, nesting)
    collectives = collective_table(trace, steps)
    layer_us = _layer_times(breakdown, gpu, small)
    overhead = profiler_overhead(window, gpu=gpu, step_wall_us=breakdown.wall_us.tolist(),
                                 host_us=layer_us["host"])
    if overhead is not None:
        layer_us["host"] -= overhead.removed_us
    return rules.Facts(
        trace=trace, steps=steps, breakdown=breakdown, nesting=nesting,
        layer_us=layer_us, small_op_us=small, profiler_overhead=overhead,
        memory=_memory_with_capacity(trace, device_memory, steps), oom=oom,
        out_of_memory=out_of_memory,
        device=_device_evidence(trace, steps, nesting) if gpu else None,
        machine=_machine(machine),
        collectives=collectives,
        sharding=sharding(trace, steps, collectives, steps.main_thread),
        float64_share=(float64_share_device(trace, steps) if gpu else
                       float64_share_host(trace, steps, nesting)),
    )


def diagnose_out_of_memory(report: r.OutOfMemory, *, device_memory: int | None = None,
                           machine: dict | r.MachineInfo | None = None,
                           run: RunInputs | None = None) -> r.Diagnosis:
    """The diagnosis of a run that ran out of memory before the profiler recorded a step: no
    trace, so no time breakdown; `memory` from the error's own figures, with the ladder's
    prescriptions cheapest first (expandable segments first where the reserved cache sat
    idle). With the run's step timeline (``run``), memory that grew steadily up to the error
    is a leak: its fix is prescribed and the ladder withheld."""
    verdict = rules.Verdict()
    rules.out_of_memory_evidence(verdict, report)
    view = run_view(run, out_of_memory=report, device_memory=device_memory) if run else None
    growth = view.growth if view is not None else None
    withheld: list[r.Withheld] = []
    if growth is not None and growth.steady:
        growth_verdict(verdict, growth, out_of_memory=True)
        withheld = [r.Withheld(id=remedy.id, layer=remedy.layer,
                               reason=leak_withholds(growth), evidence=list(growth.evidence))
                    for remedy, _ in rules.ladder_remedies()]
    else:
        verdict.remedies.extend(rules.ladder_remedies())
    gpu = bool(report.device and report.device.startswith("cuda"))
    capacity = report.capacity_bytes or device_memory
    if capacity:
        verdict.evidence.append(r.Evidence(
            metric="capacity_bytes", value=capacity, unit="bytes",
            source="the error" if report.capacity_bytes else "--device-memory"))
    prescriptions = [_prescription(remedy, reason) for remedy, reason in
                     sorted(verdict.remedies, key=lambda x: x[0].cost)
                     if gpu or not remedy.gpu_only]
    mode = "gpu" if gpu else "cpu"
    layers = {layer: r.LayerResult(share=0.0, time_ms=0.0,
                                   evidence=verdict.evidence if layer == "memory" else [])
              for layer in LAYERS}
    first = f" First fix: {prescriptions[0].id}." if prescriptions else ""
    return r.Diagnosis(
        tool_version=__version__,
        summary=f"memory is the bottleneck: the run ran out of memory on step {report.step}, "
                f"before a step could be profiled.{first}",
        primary="memory", confidence="high",
        primary_rule=out_of_memory_rule(report.step),
        trace=r.TraceInfo(path="", mode=mode, events=0,
                          devices=[report.device] if report.device else []),
        layers=layers,
        breakdown=r.Breakdown(mode=mode, categories=[], wall_ms=0.0, exposed_ms={}, share={},
                              steps=[], median_step_ms=0.0),
        findings=verdict.findings, prescriptions=prescriptions, withheld=withheld,
        missing=["a trace: the run ran out of memory before the profiler recorded a step; the "
                 "figures come from the error and the allocator"],
        machine=_machine(machine), out_of_memory=report, run=view,
    )


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def _rank(trace: Trace) -> int | None:
    """The trace's rank: ``distributedInfo.rank``, else a ``rank<N>`` in the file name."""
    if trace.meta.rank is not None:
        return trace.meta.rank
    found = _RANK_IN_NAME.search(Path(trace.meta.path).name)
    return int(found.group(1)) if found else None


def _machine(summary: dict | r.MachineInfo | None) -> r.MachineInfo | None:
    if not summary:
        return None
    if isinstance(summary, r.MachineInfo):  # already typed (a window marker's)
        return summary
    fields = set(r.MachineInfo.__struct_fields__)
    return r.MachineInfo(**{k: v for k, v in summary.items() if k in fields})


def _device_evidence(trace: Trace, steps: StepWindows, nesting: OpNesting
                     ) -> rules.DeviceEvidence:
    ops = device_ops(trace, steps)
    busy, _ = busy_time(trace, ops, steps)
    return rules.DeviceEvidence(
        ops=ops, classes=class_times(trace, ops),
        launches=launch_stats(trace, ops, steps, th.SHORT_KERNEL_US.value),
        transfers=transfers(trace, steps, nesting), busy_us=busy,
    )


_ACCELERATOR_WITHOUT_KERNELS = ("device events of a non-GPU accelerator", "device kernels (")


def _with_dataset(verdict: rules.Verdict, trace: Trace, facts: rules.Facts) -> rules.Verdict:
    """The data-loading verdict with the Dataset timing of ``torchtriage run`` (when the trace
    has it): its evidence, and the finding that names the slow part first."""
    evidence, findings = dataset_verdict(trace.meta.torchtriage.get("dataset"),
                                         facts.share("data_loading"))
    verdict.evidence.extend(evidence)
    verdict.findings[:0] = findings
    return verdict


def _missing(trace: Trace, steps: StepWindows) -> list[str]:
    """What the trace lacks, each with the analysis it costs."""
    ev = trace.events
    out = []
    names = set(ev.names)
    if not trace.has_device_activity:
        if (ev.kind == EventKind.OTHER).any() and any("mtia" in n.lower() for n in names):
            out.append("device events of a non-GPU accelerator (MTIA): GPU analyses skipped; "
                       "host-side breakdown only")
        elif any(n.startswith(("cuda", "hip")) for n in names):
            out.append("device kernels (runtime calls but no kernel events: CUPTI counter mode "
                       "or device activity off): GPU analyses skipped")
        else:
            out.append("device events (CPU-only trace): GPU analyses skipped")
    if trace.has_device_activity and not trace.meta.devices:
        out.append("deviceProperties: GPU memory capacity and tensor-core support unknown")
    if steps.source != "profiler_step":
        out.append(f"ProfilerStep#N markers: steps taken from {steps.source.replace('_', ' ')}")
    if len(trace.memory) == 0:
        out.append("[memory] events (profile_memory=False): memory peaks not assessed")
    if not (ev.shape_offset >= 0).any():
        out.append("Input Dims (record_shapes=False): dynamic shapes not assessed")
    if trace.has_device_activity and not (ev.correlation >= 0).any():
        out.append("correlation ids: kernels cannot be linked to launches")
    unmarked = unmarked_closure_steps(trace)
    if unmarked:
        out.append(f"closure marks: {unmarked} Optimizer.step range(s) ran backward inside "
                   "(optimizer.step(closure)); its backward is told apart by name, its forward "
                   "is counted as optimizer time (torchtriage run or profile() marks closures)")
    return out


def _layer_times(breakdown: StepBreakdown, gpu: bool, small_op_us: float) -> dict[str, float]:
    mapping = GPU_CATEGORY_LAYER if gpu else CPU_CATEGORY_LAYER
    out = {layer: 0.0 for layer in LAYERS}
    for cat, us in zip(breakdown.categories, breakdown.total_exposed_us, strict=True):
        out[mapping[cat]] += float(us)
    moved = min(small_op_us, out["kernel"])
    out["kernel"] -= moved
    out["host"] += moved
    return out


def _memory_with_capacity(trace: Trace, device_memory: int | None, steps: StepWindows):
    """Each device's peak with the capacity it is judged against.

    ``device_memory`` applies to the accelerators when the trace has any, else to the CPU
    (where it stands in for a GPU's memory); otherwise CUDA devices use deviceProperties.
    """
    by_id = {d.id: d.total_memory for d in trace.meta.devices}
    peaks = memory_peaks(trace, steps.start)
    has_accelerator = trace.has_device_activity or any(p.device != "cpu" for p in peaks)
    out = []
    for peak in peaks:
        accelerator = peak.device != "cpu"
        if device_memory and accelerator == has_accelerator:
            out.append((peak, device_memory, "--device-memory"))
        elif accelerator and by_id.get(int(peak.device.split(":")[1])):
            out.append((peak, by_id[int(peak.device.split(":")[1])], "deviceProperties"))
        else:
            out.append((peak, None, None))
    return out


def _compiling_finding(trace: Trace, steps, primary: str) -> r.Finding | None:
    """``steps.window_compiling`` when torch.compile compiled for ``window_compiling`` of the
    analysed steps' time (analysis/compiling.py): not the steady state."""
    per_step = compiling_us(trace, steps)
    wall = float(steps.wall.sum())
    share = float(per_step.sum()) / wall if wall > 0 else 0.0
    if share < th.WINDOW_COMPILING.value:
        return None
    which = ", ".join(f"#{n}" for n, us in zip(steps.numbers, per_step, strict=True) if us > 0)
    return r.Finding(
        id="steps.window_compiling", severity="warning", layer=None if primary == "memory"
        else "host",
        message=f"torch.compile was compiling during the window (steps {which}): "
                f"{per_step.sum() / 1e3:.0f} ms, {share:.0%} of its step time (dynamo's tracing, "
                "guards and backend compile). These steps are not the steady state"
                + ("; on a CPU trace dynamo's tracing counts as op time, so the layer shares "
                   "overstate compute" if not trace.has_device_activity else "") + ".",
        evidence=[r.Evidence(metric="window_compiling_share", value=round(share, 4),
                             unit="share of the window's step time compiling",
                             threshold=th.WINDOW_COMPILING.value, comparison=">=", fired=True,
                             source=th.WINDOW_COMPILING.source)])


def _step_findings(steps) -> list[r.Finding]:
    out = []
    if steps.source == "optimizer_step":
        out.append(r.Finding(
            id="steps.no_profiler_steps", severity="warning",
            message="No ProfilerStep#N markers: steps run from one Optimizer.step to the next."))
    elif steps.source == "window":
        out.append(r.Finding(
            id="steps.no_profiler_steps", severity="warning",
            message="No ProfilerStep#N or Optimizer.step markers: the whole trace is one step."))
    if steps.excluded:
        listed = ", ".join(f"#{k} ({v})" for k, v in sorted(steps.excluded.items()))
        out.append(r.Finding(id="steps.excluded", severity="info",
                             message=f"Left out of the statistics: {listed}."))
    if len(steps) < th.MIN_STEPS_FOR_CONFIDENCE.value:
        out.append(r.Finding(
            id="steps.few", severity="warning",
            message=f"Only {len(steps)} step(s) analysed; profile at least "
                    f"{th.MIN_STEPS_FOR_CONFIDENCE.value:.0f} for a stable verdict."))
    return out


def _prescriptions(primary, ranked, facts, verdicts, lead: tuple[str, ...] = ()
                   ) -> tuple[list[r.Prescription], list[r.Withheld]]:
    """The prescriptions of the primary layer, then of the layers whose whole-run figures
    passed their thresholds (a recurring stall, recompilation), then of the other significant
    layers (and the memory ladder when memory's rule fired), cheapest first within a layer
    (``lead``: the fix of what named the primary layer, such as a recurring stall's, before the
    rest); and the ones their rules' gates held back, in the same order."""
    order = [primary] + [layer for layer in ranked if layer != primary
                         and verdicts[layer].over_run] + [
        layer for layer in ranked
        if layer != primary and facts.share(layer) >= SIGNIFICANT[layer].value
        and not verdicts[layer].over_run
    ]
    if primary != "memory" and verdicts["memory"].remedies:
        order.append("memory")
    out: list[r.Prescription] = []
    held: list[r.Withheld] = []
    seen: set[str] = set()
    device = "cuda" if facts.gpu else "cpu"
    for layer in order:
        remedies: list[tuple[Remedy, str]] = sorted(
            verdicts[layer].remedies, key=lambda x: (x[0].id not in lead, x[0].cost))
        for remedy, reason in remedies:
            if remedy.id in seen or (remedy.gpu_only and not facts.gpu):
                continue
            seen.add(remedy.id)
            out.append(_prescription(remedy, reason, device))
    for layer in order:
        for remedy, reason, evidence in verdicts[layer].withheld:
            if remedy.id in seen or (remedy.gpu_only and not facts.gpu):
                continue
            seen.add(remedy.id)
            held.append(r.Withheld(id=remedy.id, layer=remedy.layer, reason=reason,
                                   evidence=evidence))
    return out, held


def _prescription(remedy: Remedy, reason: str, device: str = "cuda") -> r.Prescription:
    """The catalog entry as a prescription; autocast snippets name the trace's device, and
    on a CPU trace an entry's CPU title and code replace its own."""
    cpu = device == "cpu"
    title = remedy.cpu_title if cpu and remedy.cpu_title else remedy.title
    code = remedy.cpu_code if cpu and remedy.cpu_code else remedy.code
    return r.Prescription(
        id=remedy.id, layer=remedy.layer, cost=remedy.cost, cost_label=COST_LABELS[remedy.cost],
        title=title, code=code.replace('device_type="cuda"', f'device_type="{device}"'),
        expected_gain=remedy.expected_gain,
        verify=remedy.verify, reason=reason)


def _breakdown_doc(b: StepBreakdown, gpu: bool) -> r.Breakdown:
    total = b.total_exposed_us
    wall = b.total_wall_us
    return r.Breakdown(
        mode="gpu" if gpu else "cpu",
        categories=list(b.categories),
        wall_ms=round(wall / 1e3, 3),
        exposed_ms={c: round(float(t) / 1e3, 3) for c, t in zip(b.categories, total, strict=True)},
        share={c: round(float(t) / wall, 4) if wall else 0.0
               for c, t in zip(b.categories, total, strict=True)},
        steps=[
            r.StepTimes(step=int(n), wall_ms=round(float(w) / 1e3, 3),
                        exposed_ms={c: round(float(t) / 1e3, 3)
                                    for c, t in zip(b.categories, row, strict=True)})
            for n, w, row in zip(b.step_numbers, b.wall_us, b.exposed_us, strict=True)
        ],
        # statistics.median: numpy's imports numpy.ma (35 ms of a short command's start-up)
        median_step_ms=(round(statistics.median(b.wall_us.tolist()) / 1e3, 3) if b.wall_us.size
                        else 0.0),
    )


def _rows(stats: list[OpStat]) -> list[r.OpRow]:
    return [r.OpRow(name=s.name, count=s.count, total_ms=round(s.total_us / 1e3, 3),
                    self_ms=round(s.self_us / 1e3, 3), share=round(s.share, 4)) for s in stats]


def _summary(primary, facts, b: r.Breakdown, prescriptions, withheld=(),
             primary_rule: r.PrimaryRule | None = None) -> str:
    first = f" First fix: {prescriptions[0].id}." if prescriptions else ""
    held = [w for w in withheld if w.layer == primary]
    if held:
        # the primary layer's own fixes a gate held back: say which and why, so that a first
        # fix from another layer is not read as the answer to this one
        first += (f" Not prescribed for {primary}: "
                  + "; ".join(f"{w.id} ({w.reason})" for w in held[:1])
                  + (f" and {len(held) - 1} more" if len(held) > 1 else "") + ".")
    n = len(b.steps)
    growth = facts.run.growth if facts.run is not None else None
    if primary == "memory" and growth is not None and growth.steady:
        what = (f"memory is the bottleneck: it grows by {growth.bytes_per_step / 2**20:.2f} MiB "
                "per step over the run (a leak)")
    elif primary == "memory":
        what = "memory is the bottleneck: the job is at its device memory limit"
    elif primary_rule is not None and primary_rule.rule == "run_recompiling":
        c = facts.run.compile
        what = (f"{primary} is the bottleneck over the run: torch.compile recompiled "
                f"{c.recompilations} time(s), {c.share_of_run:.0%} of its wall time compiling "
                "after the first step")
    elif primary_rule is not None and primary_rule.rule == "recurring_stall":
        stall = next(s for s in facts.run.stalls if s.cause != "unexplained")
        what = (f"{primary} is the bottleneck over the run: stalls "
                + (f"every {stall.period_steps} steps" if stall.period_steps else
                   f"at {len(stall.steps)} steps")
                + f" ({stall.cause.replace('_', ' ')}) take {stall.share_of_run:.0%} of its "
                "wall time")
    else:
        what = f"{primary} is the bottleneck: {facts.share(primary):.0%} of step time"
    if primary_rule is not None and primary_rule.rule in ("recurring_stall", "run_recompiling"):
        # a verdict over the run quotes the run's steps, not the window's
        return (f"{what} (median step {facts.run.median_step_ms:.1f} ms over the run's "
                f"{facts.run.steps} steps).{first}")
    return f"{what} (median step {b.median_step_ms:.1f} ms over {n} step(s)).{first}"
