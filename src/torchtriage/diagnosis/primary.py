"""The primary-layer rule: which layer the verdict names, and why, in one line.

``memory`` when the run ran out of memory or a device's peak reached ``memory_near_capacity``;
else, on a CPU-only job whose own processes saturate its cores (``cpu_saturated``) mostly with
DataLoader workers (``loader_cpu_share`` of its CPU), ``data_loading`` when significant: the
training process computes on cores its loading holds, so its compute time is contention;
else ``data_loading`` when the DataLoader's workers (timed by ``torchtriage run`` in the
window) take longer per batch, over their number, than ``loader_outpaced`` times the work of
the window's median step besides waiting for data (its wall time less its exposed loading):
batches come slower than the loop would use them, so at steady state each step waits for the
loader (a window's steps can draw on batches prepared before it, a queue the checks did not
see drain, and show loading smaller than it is); else ``kernel`` at
``compute_bound``; else the largest non-compute layer that reaches its
significance threshold (it is what keeps the compute idle); else ``kernel``. Before all
of these (memory aside), stalls that recur over the whole run and cost
``run_stall_significant`` of its wall time name their cause's layer (``recurring_stall``), and
so does torch.compile recompiling after the first step (``run_recompiling``: ``host``, at least
``recompile_min_count`` recompilations or a frame at the recompile limit); the larger share of
the two wins.
So a smaller
share can win (data loading at 35 % over kernels at 55 %): each verdict carries the branch
that decided (:class:`~torchtriage.diagnosis.result.PrimaryRule`), its comparisons and a line
built from the thresholds themselves, which the reports print beside the layer shares.
"""

from __future__ import annotations

import numpy as np

from torchtriage.diagnosis import result as r
from torchtriage.diagnosis import rules
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.dataset import loader_period_ms
from torchtriage.diagnosis.rules.data_loading import job_cpu_evidence
from torchtriage.diagnosis.rules.run import STALL_LAYER
from torchtriage.diagnosis.vocabulary import TIME_LAYERS

# each time layer's significance: the share at which its prescriptions are listed and at which
# a non-compute layer can be primary
SIGNIFICANT = {
    "data_loading": th.DATA_LOADING_SIGNIFICANT,
    "host": th.HOST_SIGNIFICANT,
    "kernel": th.KERNEL_SIGNIFICANT,
    "communication": th.COMMUNICATION_SIGNIFICANT,
}
MEMORY_FIRST = "memory is primary before any share of step time"


def time_primary(facts: rules.Facts) -> tuple[str, str, r.PrimaryRule]:
    """The primary time layer, the candidate it is compared with for confidence, and why.

    ``kernel`` when compute reaches COMPUTE_BOUND; otherwise the largest non-compute layer whose
    share reaches its significance threshold (it is what keeps the compute idle); ``kernel``
    when none does. The comparisons that decide are the rule's evidence, and its one-line
    reason names each threshold with its value (the views print it beside the layer shares,
    where a smaller share that wins would otherwise look wrong).
    """
    waste = sorted((x for x in TIME_LAYERS if x != "kernel"), key=lambda x: -facts.share(x))
    bound = rules.share_evidence("kernel_share", facts.share("kernel"), th.COMPUTE_BOUND)
    kernel = f"kernel {bound.value:.1%}"  # the rounded share, as the layer table shows it
    over_run = [x for x in (_recurring_stall(facts), _recompiling(facts)) if x is not None]
    if over_run:  # compared with what the window names
        layer, rule = max(over_run, key=lambda x: x[1].evidence[0].value)
        return layer, waste[0] if waste[0] != layer else "kernel", rule
    contended = _contended_by_loading(facts)
    if contended is not None:  # compared with the compute it slows down
        return "data_loading", "kernel", contended
    outpaced = _outpaced_loader(facts)
    if outpaced is not None:  # compared with what the window's steps did instead
        return "data_loading", waste[0] if waste[0] != "data_loading" else "kernel", outpaced
    if bound.fired:
        return "kernel", waste[0], r.PrimaryRule(
            rule="compute_bound", evidence=[bound],
            reason=f"{kernel} >= {_named(th.COMPUTE_BOUND)}: compute is the bottleneck "
                   "whatever else is exposed.")
    checks = {x: rules.share_evidence(f"{x}_share", facts.share(x), SIGNIFICANT[x])
              for x in waste}
    significant = [x for x in waste if checks[x].fired]
    below = f"{kernel} < {_named(th.COMPUTE_BOUND)}"
    if significant:
        primary = significant[0]
        return primary, waste[1] if waste[0] == primary else waste[0], r.PrimaryRule(
            rule="largest_significant", evidence=[bound, checks[primary]],
            reason=f"{below}, so the largest layer that keeps compute idle and reaches its "
                   f"threshold wins: {primary} {checks[primary].value:.1%} >= "
                   f"{_named(SIGNIFICANT[primary])}.")
    return "kernel", waste[0], r.PrimaryRule(
        rule="none_significant", evidence=[bound, *checks.values()],
        reason=f"{below}, but no other layer reaches its threshold ("
               + ", ".join(f"{x} {checks[x].value:.1%} < {_named(SIGNIFICANT[x])}"
                           for x in waste)
               + "): kernel stays primary.")


def _recurring_stall(facts: rules.Facts) -> tuple[str, r.PrimaryRule] | None:
    """The recurring-stall branch: over the whole run (``torchtriage run``'s step timeline),
    stalls of one explained cause (not ``unexplained``) that cost ``run_stall_significant`` of
    the run's wall time name their layer, whatever the window's shares: the window's steps
    lie between the stalls and do not contain them."""
    run = facts.run
    if run is None:
        return None
    for stall in run.stalls:  # the costliest first
        if stall.cause == "unexplained":
            continue
        ev = rules.share_evidence("stall_share_of_run", stall.share_of_run,
                                  th.RUN_STALL_SIGNIFICANT)
        ev.unit = f"of the run's wall time, in stalls ({stall.cause.replace('_', ' ')})"
        if not ev.fired:
            return None
        every = (f"every {stall.period_steps} steps" if stall.period_steps
                 else f"at {len(stall.steps)} steps")
        layer = STALL_LAYER[stall.cause]
        return layer, r.PrimaryRule(
            rule="recurring_stall", evidence=[ev],
            reason=f"over the whole run, steps stall {every} ({stall.cause.replace('_', ' ')}"
                   f"), {ev.value:.1%} of its wall time >= {_named(th.RUN_STALL_SIGNIFICANT)}: "
                   f"{layer} comes first whatever the window's shares (its steps lie between "
                   "the stalls).")
    return None


def _recompiling(facts: rules.Facts) -> tuple[str, r.PrimaryRule] | None:
    """The run-recompiling branch: over the whole run, torch.compile's compile time after the
    first step (recompilations at new shapes; ``CompileRun.share_of_run``) costs
    ``run_stall_significant`` of the run's wall time over at least ``recompile_min_count``
    recompilations (or a frame hit the recompile limit): ``host``, whatever the window's
    shares (a window placed among the recompiles holds dynamo's own tracing, which on a CPU
    trace is op time)."""
    c = facts.run.compile if facts.run is not None else None
    if c is None or (c.recompilations < th.RECOMPILE_MIN_COUNT.value and not c.limit_hits):
        return None
    ev = rules.share_evidence("recompile_share_of_run", c.share_of_run,
                              th.RUN_STALL_SIGNIFICANT)
    ev.unit = "of the run's wall time, compiling after the first step"
    if not ev.fired:
        return None
    return "host", r.PrimaryRule(
        rule="run_recompiling", evidence=[ev],
        reason=f"over the whole run, torch.compile recompiled {c.recompilations} time(s)"
               + (f" and {len(c.limit_hits)} frame(s) hit the recompile limit" if c.limit_hits
                  else "")
               + f", {ev.value:.1%} of its wall time compiling after the first step >= "
               f"{_named(th.RUN_STALL_SIGNIFICANT)}: host comes first whatever the window's "
               "shares.")


def _contended_by_loading(facts: rules.Facts) -> r.PrimaryRule | None:
    """The contended-compute branch (see the module docstring), or None when it does not
    apply: a GPU trace, no machine samples, cores not saturated by the job, workers using
    less than ``loader_cpu_share`` of its CPU, or data loading below its significance."""
    m = facts.machine
    if facts.gpu or m is None or not m.job_cpu_cores_mean:
        return None
    busy = job_cpu_evidence(m)
    workers = rules.share_evidence("loader_cpu_share", m.children_cpu_cores_mean
                                   / m.job_cpu_cores_mean, th.LOADER_CPU_SHARE)
    workers.unit = "of the job's CPU, used by its DataLoader workers (child processes)"
    loading = rules.share_evidence("data_loading_share", facts.share("data_loading"),
                                   th.DATA_LOADING_SIGNIFICANT)
    if busy is None or not (busy.fired and workers.fired and loading.fired):
        return None
    return r.PrimaryRule(
        rule="contended_compute", evidence=[busy, workers, loading],
        reason=f"the job's own processes use {busy.value:.0%} of its cores (>= "
               f"{_named(th.CPU_SATURATED)}), its DataLoader workers {workers.value:.0%} of that "
               f"(>= {_named(th.LOADER_CPU_SHARE)}): the training process computes on cores "
               f"its loading holds, so data_loading {loading.value:.1%} >= "
               f"{_named(th.DATA_LOADING_SIGNIFICANT)} comes first whatever the kernel share.")


def _outpaced_loader(facts: rules.Facts) -> r.PrimaryRule | None:
    """The outpaced-loader branch (see the module docstring), or None when it does not apply:
    no worker timing of the window (``torchtriage run`` records it), or workers that keep up,
    within ``loader_outpaced``, with the work the window's median step does besides waiting
    for data (its wall time less its exposed data loading): the step the loop would run if
    batches were always ready."""
    period = loader_period_ms(facts.trace.meta.torchtriage.get("dataset"))
    b = facts.breakdown
    if period is None or len(facts.steps) == 0 or b.wall_us.size == 0:
        return None
    period_ms, workers = period
    waits = (b.exposed_us[:, b.categories.index("data_loading")]
             if "data_loading" in b.categories else np.zeros_like(b.wall_us))
    work_ms = float(np.median(b.wall_us - waits)) / 1e3
    ratio = rules.share_evidence("loader_period_over_step_work",
                                 period_ms / work_ms if work_ms > 0 else th.LOADER_OUTPACED.value,
                                 th.LOADER_OUTPACED)
    ratio.unit = ("the workers' loading time per batch over their number, against the median "
                  "step's wall time less its exposed data loading")
    if not ratio.fired:
        return None
    return r.PrimaryRule(
        rule="loader_outpaced", evidence=[ratio],
        reason=f"the DataLoader's {workers} worker(s) load a batch every {period_ms:.1f} ms at "
               f"best, {ratio.value:.2f}x the {work_ms:.1f} ms the window's median step "
               f"spends on anything but waiting for data (>= {_named(th.LOADER_OUTPACED)}): "
               "batches come slower than the loop uses them, so at steady state every step "
               "waits for data, whatever the shares inside the window (its steps drew on "
               "batches prepared before it).")


def memory_primary(facts: rules.Facts, verdict: rules.Verdict
                   ) -> tuple[str, None, r.PrimaryRule]:
    """``memory`` as primary (its rule fired), with why: an out-of-memory error, else the
    device peaks that reached MEMORY_NEAR_CAPACITY."""
    if facts.oom or facts.out_of_memory is not None:
        return "memory", None, out_of_memory_rule(
            facts.out_of_memory.step if facts.out_of_memory else None)
    near = [e for e in verdict.evidence
            if e.metric.startswith("peak_memory_fraction") and e.fired]
    peaks = ", ".join(f"{e.metric.removeprefix('peak_memory_fraction[').rstrip(']')} "
                      f"{e.value:.0%}" for e in near)
    return "memory", None, r.PrimaryRule(
        rule="memory_near_capacity", evidence=near,
        reason=f"peak memory on {peaks} of capacity >= {_named(th.MEMORY_NEAR_CAPACITY)}: "
               f"{MEMORY_FIRST}.")


def out_of_memory_rule(step: int | None = None) -> r.PrimaryRule:
    """Why ``memory`` is primary in a run that ran out of memory."""
    on = f" on step {step}" if step is not None else ""
    return r.PrimaryRule(rule="out_of_memory",
                         reason=f"the run ran out of memory{on}: {MEMORY_FIRST}.")


def _named(t: th.Threshold) -> str:
    """A share threshold as the rule line names it: ``compute_bound 85%``."""
    return f"{t.name} {t.value * 100:g}%"
