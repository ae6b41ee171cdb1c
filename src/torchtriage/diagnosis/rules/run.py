"""Rules over the whole run (``torchtriage run``'s step timeline, diagnosis/run_view.py): the
stalls that recur and what torch.compile did. The profiled window sits between stalls, so
these rules read the run's figures, not the window's shares."""

from __future__ import annotations

from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID
from torchtriage.diagnosis.result import Evidence, Finding, RecurringStall
from torchtriage.diagnosis.rules.base import Facts, Verdict
from torchtriage.diagnosis.run_view import profile_summary
from torchtriage.diagnosis.vocabulary import Layer, StallCause

# the layer a recurring stall's cause belongs to (the primary rule's recurring_stall branch)
STALL_LAYER: dict[StallCause, Layer] = {
    "dataloader_restart": "data_loading", "evaluation": "host", "checkpoint": "host",
    "compilation": "host", "unexplained": "host",
}
STALL_REMEDY: dict[StallCause, str] = {
    "dataloader_restart": "dataloader.persistent_workers", "evaluation": "eval.interval",
    "checkpoint": "checkpoint.async",
}


def stall_finding(stall: RecurringStall) -> Finding:
    every = (f"every {stall.period_steps} steps" if stall.period_steps else
             f"{len(stall.steps)} times")
    listed = ", ".join(str(n) for n in stall.steps[:6]) + ("..." if len(stall.steps) > 6 else "")
    return Finding(
        id=f"run.stall.{stall.cause}",
        severity="warning" if stall.share_of_run >= th.RUN_STALL_SIGNIFICANT.value else "info",
        layer=STALL_LAYER[stall.cause],
        message=f"Steps stall {every} (steps {listed}): {stall.stall_ms_median:.0f} ms against "
                f"a median step of {stall.median_step_ms:.1f} ms, {stall.excess_s:.2f} s in "
                f"all, {stall.share_of_run:.1%} of the run's wall time. Cause "
                f"({stall.cause.replace('_', ' ')}): {stall.detail}." + _profiled(stall),
        evidence=list(stall.evidence))


def _profiled(stall: RecurringStall) -> str:
    p = stall.profile
    if p is None:
        return ""
    return (f" Step {p.step}, profiled by a second window, took {p.wall_ms:.0f} ms: "
            f"{profile_summary(p)} (trace {p.trace}).")


class _StallRule:
    causes: tuple[StallCause, ...] = ()

    def judge(self, f: Facts) -> Verdict:
        v = Verdict()
        if f.run is None:
            return v
        for stall in f.run.stalls:
            if stall.cause in self.causes:
                v.evidence.extend(stall.evidence)
                v.findings.append(stall_finding(stall))
            for cause in (stall.cause, *stall.also):
                if cause in self.causes:
                    self._remedy(v, stall, cause)
        return v

    def _remedy(self, v: Verdict, stall: RecurringStall, cause: StallCause) -> None:
        """The fix for ``cause`` in ``stall`` (its own cause, or one seen beside it)."""
        remedy = STALL_REMEDY.get(cause)
        if remedy is None:
            return
        v.over_run = v.over_run or stall.share_of_run >= th.RUN_STALL_SIGNIFICANT.value
        reason = (f"{stall.share_of_run:.1%} of the run's wall time in stalls "
                  + (f"every {stall.period_steps} steps" if stall.period_steps else
                     f"at {len(stall.steps)} steps") + f" ({stall.cause.replace('_', ' ')}"
                  + (f", with {cause.replace('_', ' ')} in the same steps"
                     if cause != stall.cause else "") + ")")
        if cause == "dataloader_restart" and "persistent_workers=True" in stall.detail:
            v.withheld.append((BY_ID[remedy], "the DataLoader is persistent already: it is "
                               "built again each epoch (build it once)", list(stall.evidence)))
            return
        v.remedies.append((BY_ID[remedy], reason))


class LoaderRestartRule(_StallRule):
    """Over the run, steps that stall when a DataLoader starts its worker processes again
    (each epoch without ``persistent_workers``; slower under ``spawn`` and with a large Dataset
    pickled into every worker), at least twice: a finding with their period and share of the
    run's wall time (compared with ``run_stall_significant``), and ``persistent_workers`` (held
    back when the DataLoader is persistent already but built again)."""

    layer: Layer = "data_loading"
    prescribes = ("dataloader.persistent_workers",)
    thresholds = (th.STALL_RATIO, th.STALL_MIN_MS, th.STALL_PERIOD_TOLERANCE,
                  th.RUN_STALL_SIGNIFICANT)
    causes = ("dataloader_restart",)


class PeriodicWorkRule(_StallRule):
    """Over the run, steps that stall at least twice for an evaluation pass, a
    ``torch.save`` or nothing the training process saw (logging, metrics): a finding each, with
    period and share of the run's wall time; evaluating less often (or on fewer batches) and
    saving checkpoints asynchronously are prescribed for the first two."""

    layer: Layer = "host"
    prescribes = ("eval.interval", "checkpoint.async")
    thresholds = (th.STALL_RATIO, th.STALL_MIN_MS, th.STALL_PERIOD_TOLERANCE,
                  th.RUN_STALL_SIGNIFICANT)
    causes = ("evaluation", "checkpoint", "unexplained")


def gate_compiled(f: Facts, v: Verdict, ids: tuple[str, ...]) -> None:
    """Compiling the model is not prescribed to a run that compiles already: when dynamo
    compiled frames over the run (``CompileRun.compilations``), the remedies ``ids`` move to
    ``withheld`` with that count as their evidence."""
    c = f.run.compile if f.run is not None else None
    if c is None or c.compilations == 0:
        return
    found = [(remedy, why) for remedy, why in v.remedies if remedy.id in ids]
    if not found:
        return
    ev = Evidence(metric="compilations", value=c.compilations, unit="frames torch.compile "
                  "compiled over the run", comparison=">=", threshold=1, fired=True,
                  source="torch._dynamo's counters in the training process")
    v.remedies = [(remedy, why) for remedy, why in v.remedies if remedy.id not in ids]
    for remedy, _ in found:
        v.withheld.append((remedy, f"the run compiles already: torch.compile compiled "
                           f"{c.compilations} frame(s), {c.recompilations} of them "
                           "recompilations", [ev]))


# recompilation as the primary layer's cause (primary.py's run_recompiling branch): its fixes first
RECOMPILE_LEAD = ("compile.dynamic", "compile.pad_buckets", "compile.recompile_limit",
                  "compile.remove_graph_break")


def _at_least(metric: str, value: float, unit: str, threshold: th.Threshold) -> Evidence:
    return Evidence(metric=metric, value=value, unit=unit, threshold=threshold.value,
                    comparison=">=", fired=value >= threshold.value, source=threshold.source)


class RecompileRule:
    """torch.compile over the run: frames compiled, recompilations with their guard failures,
    frames that hit the recompile limit and run eager, graph breaks. An info finding whenever
    dynamo compiled; a warning with prescriptions when compile time after the first step
    reaches ``recompile_significant`` of the run's wall time over at least
    ``recompile_min_count`` recompilations, or a frame hit the limit:
    ``compile.dynamic`` when a guard failed on a size (or shapes changed in the window), padding
    to a few lengths, raising the limit when frames hit it; removing graph breaks when there
    are any."""

    layer: Layer = "host"
    prescribes = RECOMPILE_LEAD
    thresholds = (th.RECOMPILE_SIGNIFICANT, th.RECOMPILE_MIN_COUNT)

    def judge(self, f: Facts) -> Verdict:
        v = Verdict()
        c = f.run.compile if f.run is not None else None
        if c is None:
            return v
        share = _at_least("recompile_share_of_run", c.share_of_run,
                          "share of the run's wall time compiling after the first step",
                          th.RECOMPILE_SIGNIFICANT)
        count = _at_least("recompilations", c.recompilations, "recompilations over the run",
                          th.RECOMPILE_MIN_COUNT)
        v.evidence.extend((share, count))
        reasons = "; ".join(f"{r.count}x {r.frame}: {r.reason}" for r in c.reasons[:3])
        limit = (f" {len(c.limit_hits)} frame(s) hit the recompile limit and run eager from "
                 f"then on ({c.limit_hits[0]})." if c.limit_hits else "")
        breaks = f" {c.graph_breaks} graph break(s)." if c.graph_breaks else ""
        upfront = c.seconds - c.after_first_step_s
        if f.run.steps > 1 and upfront > f.run.wall_s > 0:  # a short run compiled
            breaks += (f" Compiling before the first step ended took {upfront:.1f} s, longer "
                       f"than the {f.run.wall_s:.1f} s of the {f.run.steps - 1} steps after it:"
                       f" in a run this short it pays back only if it saves "
                       f"{upfront / (f.run.steps - 1) * 1e3:.0f} ms a step.")
        serious = (share.fired and count.fired) or bool(c.limit_hits)
        v.findings.append(Finding(
            id="run.compile", severity="warning" if serious else "info", layer="host",
            message=f"torch.compile compiled {c.compilations} frame(s), {c.recompilations} of "
                    f"them recompilations, {c.seconds:.1f} s in all ({c.after_first_step_s:.1f} "
                    f"s after the first step, {c.share_of_run:.1%} of the run)."
                    + (f" Recompiled because: {reasons}." if reasons else "") + limit + breaks,
            evidence=[share, count]))
        if not serious:
            return v
        v.over_run = True
        sizes = any("size" in r.reason or "stride" in r.reason for r in c.reasons) \
            or bool(c.changed_shapes)
        gain = f"{c.share_of_run:.1%} of the run compiling"
        if sizes:
            v.remedies.append((BY_ID["compile.dynamic"],
                               f"guards failed on input sizes: {gain}"
                               + (", and frames past the recompile limit run eager"
                                  if c.limit_hits else "")))
            v.remedies.append((BY_ID["compile.pad_buckets"],
                               "a few fixed lengths compile once each, even without dynamic "
                               "shapes"))
        if c.limit_hits:
            v.remedies.append((BY_ID["compile.recompile_limit"],
                               f"{len(c.limit_hits)} frame(s) fell back to eager at the limit"))
        if c.graph_breaks:
            v.remedies.append((BY_ID["compile.remove_graph_break"],
                               f"{c.graph_breaks} graph break(s): "
                               + "; ".join(c.graph_break_reasons[:2])))
        return v
