"""The whole run from its step timeline (:class:`~torchtriage.diagnosis.result.RunView`):
memory that grows, stalls that recur, what torch.compile did, and what the timeline lacks.

- **Growth**: the memory readings from step ``growth_skip_steps`` + 1 on, fitted by
  :func:`~torchtriage.analysis.growth.fit_growth`; on the process's heap or RSS the readings
  taken under the profiler are left out and each stretch between profiled steps is its own
  segment (the profiler's buffers shift the level). Steady when the slope is ``growth_t``
  standard errors above zero, each half's slope reaches ``growth_half_share`` of it, and the
  fitted growth is at least ``growth_min_bytes``; fewer than ``growth_min_steps`` readings
  are too few to tell (said so). At that rate the memory is full (its capacity: the device,
  or the RAM limit) at the step given. The cause comes from the tensor censuses: tensors with
  a ``grad_fn`` that grow by about one per step or more are autograd graphs kept across steps
  (the container holding them is named); other tensors growing are tensors kept (a cache, a
  history); neither, with memory growing, is memory outside Python's tensors.
- **Stalls** (:mod:`~torchtriage.analysis.stalls`): steps after the second, profiled ones left
  out of the scan; a profiled step counts too when it passes the same test against the
  profiled steps' median and an event explains it (a worker start, an evaluation, a save).
  Each stall step is weighed by what the training process saw inside it: per event kind
  (a DataLoader's worker start, an evaluation, a ``torch.save``, a compilation at it) the time
  its events overlap the step; none: ``unexplained``. Steps with the same kinds form a group,
  attributed to the kind with the most time over the group; groups of one cause merge; other
  kinds at ``stall_second_cause`` of the cause's time are named beside it (``also``: their
  fixes are prescribed too). Stalls of one cause that occur at least twice are
  reported with their period and share of the run's wall time (the first step's end to the
  last's); unexplained ones only when they recur at a period. A stall step profiled by the
  second window (capture/stall_window.py; its steps are not left out as profiled) joins the
  stall holding it, with where its time went (analysis/step_parts.py).
- **Compilation**: dynamo's compilations per frame, recompilations grouped by their guard
  failure (numbers in the reason folded, so sizes 37 and 45 are one reason), the frames that
  hit the recompile limit, graph breaks (from the run record), and the ops whose shapes
  changed inside the profiled window.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections import Counter
from typing import Any

import msgspec

from torchtriage.analysis.growth import fit_growth
from torchtriage.analysis.stalls import excess_ms, find_stalls, period
from torchtriage.analysis.step_parts import StepParts
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import (
    CompileRun,
    DynamicShape,
    Evidence,
    MemoryGrowth,
    OutOfMemory,
    RecompileReason,
    RecurringStall,
    RunView,
    StallPart,
    StallProfile,
    StepTimeline,
)
from torchtriage.diagnosis.vocabulary import StallCause

PLOT_POINTS = 2000  # the most steps the report's plot carries (evenly decimated)
FIRST_STALL_STEP = 3  # steps 1-2 start the run (allocator, autotuning): not stalls
MIB = 2**20


class RunInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What a run record gives the whole-run view of one rank."""

    timeline: StepTimeline
    compile: dict[str, Any] | None = None  # the record's compile summary (graph breaks)
    exit_exception: str | None = None  # how the script failed, when it did
    job_steps: int | None = None  # the most steps any rank of the job recorded
    first_step_s: float | None = None
    # a stall step profiled by the second window (capture/runner.py reads its trace)
    stall_profile: StallProfile | None = None


def run_view(inputs: RunInputs, *, out_of_memory: OutOfMemory | None = None,
             dynamic_shapes: list[DynamicShape] | None = None,
             device_memory: int | None = None) -> RunView:
    """The whole-run view (module docstring)."""
    t = inputs.timeline
    ends = t.end_s
    step_ms = [round((b - a) * 1e3, 3) for a, b in itertools.pairwise(ends)]
    numbers = list(range(2, len(ends) + 1))
    profiled = {n for first, last in t.profiled for n in range(first, last + 1)}
    # the second window's steps (capture/stall_window.py) are stalls, recorded lightly
    profiled -= {n for w in t.stall_windows for n in (w.step - 1, w.step)}
    kept = [ms for n, ms in zip(numbers, step_ms, strict=True) if n not in profiled]
    median = statistics.median(kept) if kept else 0.0
    wall_s = ends[-1] - ends[0] if len(ends) > 1 else 0.0
    growth, why_not = _growth(t, profiled, out_of_memory, device_memory)
    view = RunView(steps=len(ends), wall_s=round(wall_s, 4), median_step_ms=round(median, 3),
                   first_step_s=inputs.first_step_s, memory_source=t.memory_source,
                   growth=growth, growth_not_assessed=why_not,
                   stalls=_with_profile(_stalls(t, numbers, step_ms, profiled, wall_s),
                                        inputs.stall_profile),
                   compile=_compile(inputs, wall_s, dynamic_shapes or []),
                   gaps=_gaps(inputs, out_of_memory))
    _plot(view, t, step_ms)
    return view


# --- memory growth --------------------------------------------------------------------------


def _growth(t: StepTimeline, profiled: set[int], oom: OutOfMemory | None,
            device_memory: int | None) -> tuple[MemoryGrowth | None, str | None]:
    if t.memory_source is None or not t.memory_bytes:
        return None, ("no memory counter could be read in the training process (no CUDA, "
                      "no glibc heap statistics, no /proc/self/statm)")
    first = t.memory_first_step or 1
    skip = int(th.GROWTH_SKIP_STEPS.value)
    host = t.memory_source != "cuda_allocator"
    steps, values, segments = [], [], []
    segment = 0
    for i, value in enumerate(t.memory_bytes):
        step = first + i
        if step <= skip:
            continue
        if host and step in profiled:
            segment += 1 if segments and segments[-1] == segment else 0
            continue
        steps.append(step)
        values.append(value)
        segments.append(segment)
    need = int(th.GROWTH_MIN_STEPS.value)
    if len(steps) < need:
        return None, (f"the run is too short to fit a memory slope: {len(steps)} step "
                      f"boundaries after the first {skip} (and outside profiled steps), fewer "
                      f"than growth_min_steps {need}")
    fit = fit_growth(steps, values, segments)
    if fit is None:
        return None, "the memory readings do not span two steps of one segment"
    slope = fit.whole.slope
    grown = slope * (steps[-1] - steps[0])
    halves = [h for h in (fit.first_half, fit.second_half) if h is not None]
    half_share = min((h.slope / slope for h in halves), default=0.0) if slope > 0 else 0.0
    evidence = [
        Evidence(metric="growth_t", value=round(min(fit.whole.t, 1e9), 2),
                 unit="standard errors of the slope", threshold=th.GROWTH_T.value,
                 comparison=">=", fired=fit.whole.t >= th.GROWTH_T.value,
                 source=th.GROWTH_T.source),
        Evidence(metric="growth_half_share", value=round(half_share, 3),
                 unit="the smaller half's slope over the whole run's",
                 threshold=th.GROWTH_HALF_SHARE.value, comparison=">=",
                 fired=half_share >= th.GROWTH_HALF_SHARE.value,
                 source=th.GROWTH_HALF_SHARE.source),
        Evidence(metric="growth_bytes", value=round(grown), unit="bytes over the fitted steps",
                 threshold=th.GROWTH_MIN_BYTES.value, comparison=">=",
                 fired=grown >= th.GROWTH_MIN_BYTES.value, source=th.GROWTH_MIN_BYTES.source),
    ]
    steady = slope > 0 and all(e.fired for e in evidence)
    capacity, capacity_source = t.capacity_bytes, t.capacity_source
    if oom is not None and oom.capacity_bytes:
        capacity, capacity_source = oom.capacity_bytes, "the out-of-memory error"
    elif host and device_memory:
        capacity, capacity_source = device_memory, "--device-memory"
    full_at = None
    if steady and capacity:
        full_at = steps[-1] + max(int((capacity - values[-1]) / slope), 0)
        if oom is not None:
            full_at = min(full_at, oom.step)
    ratio = None
    if t.reserved_bytes and t.memory_bytes[-1] > 0:
        ratio = round(t.reserved_bytes[-1] / t.memory_bytes[-1], 3)
    growth = MemoryGrowth(
        source=t.memory_source, fitted_steps=len(steps), first_step=steps[0],
        last_step=steps[-1], bytes_per_step=round(slope, 1),
        stderr_bytes_per_step=round(min(fit.whole.stderr, 1e18), 1),
        start_bytes=int(values[0]), end_bytes=int(values[-1]), steady=steady,
        capacity_bytes=capacity, capacity_source=capacity_source, full_at_step=full_at,
        reserved_over_allocated=ratio, evidence=evidence)
    if steady:
        _cause(growth, t)
    return growth, None


def _cause(growth: MemoryGrowth, t: StepTimeline) -> None:
    """The growth's likely cause from the censuses (module docstring)."""
    if len(t.census) < 2:
        if t.census:
            growth.holders = list(t.census[0].holders)
        growth.cause_detail = ("one tensor census or none was taken (the run ended first): "
                               "what holds the memory was not counted over steps")
        return
    a, b = t.census[0], t.census[-1]
    steps = max(b.step - a.step, 1)
    graph_rate = (b.with_graph - a.with_graph) / steps
    plain_rate = ((b.tensors - b.with_graph) - (a.tensors - a.with_graph)) / steps
    growth.holders = list(b.holders)
    graphs = [h for h in b.holders if h.with_graph][:2]
    where = ("; they are held by " + " and ".join(_held(h) for h in graphs)) if graphs else ""
    if graph_rate >= 0.5:
        growth.cause = "autograd_graph_retained"
        growth.cause_detail = (
            f"live tensors with a grad_fn grew from {a.with_graph} at step {a.step} to "
            f"{b.with_graph} at step {b.step} ({graph_rate:.1f} per step): each step's "
            f"results are kept with their autograd graph{where}. Keep `loss.item()` or "
            "`tensor.detach()` instead of the tensor")
    elif plain_rate >= 0.5:
        growth.cause = "tensors_retained"
        where = f"; most are held by {_held(b.holders[0])}" if b.holders else ""
        growth.cause_detail = (
            f"live tensors without a graph grew from {a.tensors - a.with_graph} at step "
            f"{a.step} to {b.tensors - b.with_graph} at step {b.step} ({plain_rate:.1f} per "
            f"step): a cache or history keeps tensors{where}")
    else:
        growth.cause = "outside_python_tensors"
        growth.cause_detail = (
            f"the number of live tensors held steady ({a.tensors} at step {a.step}, "
            f"{b.tensors} at step {b.step}) while memory grew: tensors that grow in size, an "
            "allocator cache or memory outside torch tensors (a C extension, Python objects)")


def _held(holder) -> str:
    size = f", {holder.bytes / MIB:.1f} MiB" if holder.bytes else ""
    return f"{holder.name} ({holder.tensors} tensors{size})"


# --- stalls ---------------------------------------------------------------------------------


_CAUSE_OF_EVENT: dict[str, StallCause] = {
    "loader_start": "dataloader_restart", "evaluation": "evaluation", "checkpoint": "checkpoint",
}


def _stalls(t: StepTimeline, numbers: list[int], step_ms: list[float], profiled: set[int],
            wall_s: float) -> list[RecurringStall]:
    # the step after a census carries its cost (it ran at the boundary before it)
    left_out = profiled | set(range(1, FIRST_STALL_STEP)) | {c.step + 1 for c in t.census}
    scan = find_stalls(numbers, step_ms, left_out=left_out, ratio=th.STALL_RATIO.value,
                       min_excess_ms=th.STALL_MIN_MS.value)
    if scan is None:
        return []
    ends = t.end_s
    ms_of = dict(zip(numbers, step_ms, strict=True))
    baseline = dict.fromkeys(scan.stalls, scan.median_ms)
    # a profiled step stalls against the profiled steps' median, and only for an explained
    # cause (the profiler slows every step it records; it starts no worker, saves nothing)
    under = [n for n in numbers if n in profiled and n >= FIRST_STALL_STEP]
    if under:
        typical = statistics.median(ms_of[n] for n in under)
        for n in under:
            if (ms_of[n] > max(th.STALL_RATIO.value * typical, typical + th.STALL_MIN_MS.value)
                    and _attribute(n, ends[n - 2], ends[n - 1], t)[0] not in
                    ("unexplained", "compilation")):
                baseline[n] = typical
    # steps are grouped by the event kinds seen in them (a validation and the DataLoader
    # starts around it stall the same steps: one stall, not two halves), each group goes to
    # the kind that took the most of its time, groups of one cause merge (evaluations with
    # and without a save after them), and kinds at stall_second_cause of the cause's time
    # are named beside it
    by_kinds: dict[frozenset, list[int]] = {}
    events_of: dict[int, list] = {}
    weights_of: dict[int, dict[StallCause, float]] = {}
    for n in sorted(baseline):
        _, weights, events = _weighed(n, ends[n - 2], ends[n - 1], t)
        by_kinds.setdefault(frozenset(weights), []).append(n)
        events_of[n], weights_of[n] = events, weights
    grouped: dict[StallCause, list[int]] = {}
    for kinds, steps in by_kinds.items():
        total = {k: sum(weights_of[n].get(k, 0.0) for n in steps) for k in kinds}
        cause = max(total, key=lambda k: total[k]) if total else "unexplained"
        grouped.setdefault(cause, []).extend(steps)
    by_cause: list[tuple[StallCause, list[StallCause], list[int]]] = []
    for cause, steps in grouped.items():
        steps.sort()
        total: dict[StallCause, float] = {}
        for n in steps:
            for k, w in weights_of[n].items():
                total[k] = total.get(k, 0.0) + w
        own = total.get(cause, 0.0)
        also = [k for k in sorted(total, key=lambda k: -total[k]) if k != cause
                and own > 0 and total[k] >= th.STALL_SECOND_CAUSE.value * own]
        by_cause.append((cause, also, steps))
    out = []
    for cause, also, steps in by_cause:
        every = period(steps, tolerance=th.STALL_PERIOD_TOLERANCE.value)
        if len(steps) < 2 or (cause == "unexplained" and every is None):
            continue  # what nothing explains counts only when it recurs at a period
        excess_s = sum(excess_ms([ms_of[n]], baseline[n]) for n in steps) / 1e3
        share = excess_s / wall_s if wall_s > 0 else 0.0
        stall_median = statistics.median(ms_of[n] for n in steps)
        events = [e for n in steps for e in events_of[n]]
        detail = _detail(cause, events, t) + "".join(
            f"; also in these steps: {_detail(k, events, t)}" for k in also)
        out.append(RecurringStall(
            cause=cause, steps=steps[:200], period_steps=every,
            median_step_ms=round(scan.median_ms, 3), stall_ms_median=round(stall_median, 3),
            excess_s=round(excess_s, 3), share_of_run=round(share, 4),
            detail=detail, also=also,
            evidence=[
                Evidence(metric="stall_threshold_ms", value=round(scan.threshold_ms, 3),
                         unit=f"ms (max of {th.STALL_RATIO.value:g}x the median step and the "
                              f"median + {th.STALL_MIN_MS.value:g} ms)",
                         source=th.STALL_RATIO.source),
                Evidence(metric="stall_share_of_run", value=round(share, 4),
                         unit="share of the run's wall time",
                         threshold=th.RUN_STALL_SIGNIFICANT.value, comparison=">=",
                         fired=share >= th.RUN_STALL_SIGNIFICANT.value,
                         source=th.RUN_STALL_SIGNIFICANT.source)]))
    out.sort(key=lambda s: -s.share_of_run)
    return out


def _with_profile(stalls: list[RecurringStall], profile: StallProfile | None
                  ) -> list[RecurringStall]:
    """The profiled stall step goes to the stall that holds it; for an unexplained one, its
    largest part says where the time went."""
    for stall in stalls if profile is not None else ():
        if profile.step not in stall.steps:
            continue
        stall.profile = profile
        if stall.cause == "unexplained" and profile.parts:
            part = profile.parts[0]
            stall.detail += (f"; the profiled stall (step {profile.step}) spent "
                             f"{part.share:.0%} of its time in {part.label}")
        stall.evidence.append(Evidence(
            metric="stall_step_profiled_ms", value=profile.wall_ms,
            unit=f"ms, step {profile.step} profiled by a second window: " + profile_summary(
                profile)))
        break
    return stalls


def profile_summary(profile: StallProfile, parts: int = 3) -> str:
    """``89% waiting for the next batch (DataLoader __next__), 8% ...``: the largest parts."""
    shown = ", ".join(f"{p.share:.0%} {p.label}" for p in profile.parts[:parts])
    cut = (f" (the first {profile.recorded_ms / 1e3:.1f} s recorded)"
           if profile.recorded_ms < 0.95 * profile.wall_ms else "")
    return shown + cut


def stall_profile(parts: StepParts, *, step: int, wall_ms: float | None, trace: str
                  ) -> StallProfile:
    """The second window's step (:mod:`~torchtriage.analysis.step_parts`) as a record."""
    recorded = parts.recorded_us / 1e3
    base = recorded or 1.0

    def part(label: str, us: float) -> StallPart:
        return StallPart(label=label, ms=round(us / 1e3, 3), share=round(us / 1e3 / base, 4))

    return StallProfile(
        step=step, wall_ms=round(wall_ms if wall_ms is not None else recorded, 3),
        recorded_ms=round(recorded, 3), parts=[part(*p) for p in parts.parts],
        top_ops=[part(*p) for p in parts.top_ops],
        device_busy_ms=(round(parts.device_busy_us / 1e3, 3)
                        if parts.device_busy_us is not None else None), trace=trace)


def _attribute(step: int, start_s: float, end_s: float, t: StepTimeline
               ) -> tuple[StallCause, list]:
    """What a stall step is attributed to: the event kind overlapping it longest (summed over
    its events of that kind), or a compilation in it (module docstring)."""
    cause, _, found = _weighed(step, start_s, end_s, t)
    return cause, found


def _weighed(step: int, start_s: float, end_s: float, t: StepTimeline
             ) -> tuple[StallCause, dict[StallCause, float], list]:
    weights: dict[StallCause, float] = {}
    found = []
    for event in t.events:
        lo, hi = event.start_s, event.start_s + event.duration_s
        overlap = min(hi, end_s) - max(lo, start_s)
        if overlap > 0 or event.step == step:
            found.append(event)
            kind = _CAUSE_OF_EVENT[event.kind]
            weights[kind] = weights.get(kind, 0.0) + max(overlap, 0.0)
    compiled = sum(c.seconds for c in t.compiles if c.step == step)
    if compiled:
        weights["compilation"] = compiled
    if not weights:
        return "unexplained", weights, found
    return max(weights, key=lambda k: weights[k]), weights, found


def _detail(cause: StallCause, events: list, t: StepTimeline) -> str:
    if cause == "dataloader_restart":
        starts = [e for e in events if e.kind == "loader_start"]
        if not starts:
            return "a DataLoader started its workers in these steps"
        e = starts[0]
        seconds = statistics.median(x.duration_s for x in starts)
        size = next((x.dataset_bytes for x in t.events if x.kind == "loader_start"
                     and x.dataset_bytes), None)
        pickled = (f"; the Dataset pickles to {size / MIB:.1f} MiB, unpickled by every worker"
                   if size else "")
        why = ("persistent_workers=False: its workers are shut down at the end of every epoch "
               "and started again" if not e.persistent else
               "persistent_workers=True, yet a new DataLoader is built each time: its "
               "workers cannot outlive it (build the DataLoader once)")
        return (f"a DataLoader started {e.workers} worker process(es) again "
                f"({e.start_method or 'default'} start method{pickled}), {seconds:.2f} s to "
                f"its first batch (median): {why}")
    if cause == "evaluation":
        evals = [e for e in events if e.kind == "evaluation"]
        seconds = statistics.median(e.duration_s for e in evals) if evals else 0.0
        name = evals[0].detail if evals else "the model"
        return (f"{name} was switched to eval() and back in these steps: an evaluation pass "
                f"of {seconds:.2f} s (median)")
    if cause == "checkpoint":
        saves = [e for e in events if e.kind == "checkpoint"]
        seconds = sum(e.duration_s for e in saves) / max(len(saves), 1)
        return (f"torch.save ran in these steps ({saves[0].detail if saves else ''}), "
                f"{seconds:.2f} s per save")
    if cause == "compilation":
        return "torch.compile compiled a frame again in these steps (see the compile section)"
    return ("no DataLoader start, evaluation, torch.save or compilation was seen in these "
            "steps: logging, metrics, garbage collection or the script's own periodic work")


# --- compilation ----------------------------------------------------------------------------


_NUMBER = re.compile(r"\d+")


def _compile(inputs: RunInputs, wall_s: float, shapes: list[DynamicShape]) -> CompileRun | None:
    t, summary = inputs.timeline, inputs.compile or {}
    if not t.compiles and not summary:
        return None  # dynamo did nothing (or was never imported): no section
    recompiles = [c for c in t.compiles if c.reason]
    grouped = Counter((c.frame, _NUMBER.sub("N", c.reason or "")) for c in recompiles)
    example = {(c.frame, _NUMBER.sub("N", c.reason or "")): c.reason for c in recompiles}
    later = sum(c.seconds for c in t.compiles if c.step >= 2)
    return CompileRun(
        compilations=len(t.compiles) or int(summary.get("frames", 0)),
        recompilations=len(recompiles) or int(summary.get("recompiles", 0)),
        seconds=round(sum(c.seconds for c in t.compiles) or float(summary.get("seconds", 0.0)),
                      3),
        after_first_step_s=round(later, 3),
        share_of_run=round(later / wall_s, 4) if wall_s > 0 else 0.0,
        reasons=[RecompileReason(frame=frame, reason=example[(frame, key)] or key, count=n)
                 for (frame, key), n in grouped.most_common(5)],
        graph_breaks=int(summary.get("graph_breaks", 0)),
        graph_break_reasons=list(summary.get("graph_break_reasons", []))[:5],
        limit_hits=list(t.recompile_limit_hits)[:10],
        changed_shapes=[f"{d.op}: {d.distinct_signatures} shapes" for d in shapes[:5]])


# --- gaps and the plot ----------------------------------------------------------------------


def _gaps(inputs: RunInputs, oom: OutOfMemory | None) -> list[str]:
    t = inputs.timeline
    out = []
    steps = len(t.end_s)
    if inputs.job_steps and steps < inputs.job_steps:
        out.append(f"this rank's timeline stops at step {steps} while another rank recorded "
                   f"{inputs.job_steps}: it died, hung or was stopped first")
    if t.truncated_at:
        out.append(f"the timeline stops at step {t.truncated_at} (its recording limit)")
    if inputs.exit_exception and oom is None:
        out.append(f"the script failed after step {steps}: {inputs.exit_exception[:200]}")
    return out


def _plot(view: RunView, t: StepTimeline, step_ms: list[float]) -> None:
    n = len(t.end_s)
    if n < 2:
        return
    stride = max(1, -(-n // PLOT_POINTS))
    picked = list(range(2, n + 1, stride))
    view.plot_steps = picked
    view.plot_step_ms = [step_ms[i - 2] for i in picked]
    first = t.memory_first_step or 1
    if t.memory_bytes:
        view.plot_memory_bytes = [t.memory_bytes[i - first] if 0 <= i - first <
                                  len(t.memory_bytes) else -1 for i in picked]
    if t.reserved_bytes:
        view.plot_reserved_bytes = [t.reserved_bytes[i - first] if 0 <= i - first <
                                    len(t.reserved_bytes) else -1 for i in picked]
