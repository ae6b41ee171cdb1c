"""``torchtriage fix``: profile, diagnose, try the bottleneck layer's fixes in cost order,
verify each with an A/B, keep what is proven, re-profile, move on.

1. Profile the command as written and diagnose it (round 0).
2. Take the primary layer's prescriptions in cost order. Each one that can be injected as a
   knob (:mod:`torchtriage.fix.candidates`) is A/B-tested against the best configuration so
   far, value after value while each value beats the last (``num_workers`` 2, 4, 8, ...;
   ``compile.mode`` from the cheapest compile up). A/Bs stop as soon as the answer is clear
   (``run_ab(adaptive=True)``), and the kept configuration's own trials serve as the next
   baseline, so a value search costs few trials. Failed, timed-out and OOM trials are recorded
   as such; the candidate is dropped, the run goes on. A search that keeps nothing may name a
   fallback (``optimizer.fused`` -> ``foreach``, where the optimizer is not foreach already).
   A worker search resumed in a later round only tries values above the kept one.
3. A fix is kept only when it is significantly faster and passes loss parity. After a kept
   fix the configuration is profiled again and the loop continues with whatever layer is now
   the bottleneck; a prescription measured `no_change` before may be tried once more under the
   new configuration. When nothing in the primary layer is proven, the other significant time
   layers of the diagnosis (its runner-up) are tried in turn. On the `memory` layer the ladder
   (:mod:`torchtriage.fix.ladder`) looks for the cheapest rung that fits instead.
   Cross-check: the first A/B after a profile round measures the same configuration again,
   unprofiled and further into the run. When its baseline trials' mean step is more than
   ``window_drift`` slower than the profiled median step, the profile saw something the
   running job does not (a DataLoader queue still full, a warm phase): the round is marked
   ``window_agrees: false`` and, once per fix run, the configuration is profiled again after
   the steps the trials measured, and governing goes on from that diagnosis.
4. It stops when no layer (of ``FixSettings.layers``) has anything injectable left (of
   ``FixSettings.only``'s prescriptions, when given), nothing
   was proven, or the budget is spent; then an A/B of the final configuration against the
   original gives the speedup, and ``fix.json``, ``fix.md`` and ``fix.patch`` are written.
   The budget covers the final A/B too (:mod:`torchtriage.fix.budget`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from torchtriage.capture import interrupt
from torchtriage.capture.rundir import claim_run_dir
from torchtriage.capture.runner import full_disk_reason, run_command, write_diagnosis
from torchtriage.diagnosis.result import OutOfMemory
from torchtriage.diagnosis.thresholds import WINDOW_DRIFT, window_holds
from torchtriage.diagnosis.vocabulary import LAYERS, Layer
from torchtriage.errors import TorchtriageError
from torchtriage.fix import ladder
from torchtriage.fix.budget import COMPILE_ESTIMATE_S, FINAL_FRESH, Budget, trial_estimate
from torchtriage.fix.candidates import NOT_INJECTED, machine_context, search_for
from torchtriage.fix.patch import make_patch
from torchtriage.fix.reading import (
    LEAK_FIX,
    leak_of,
    representative,
    searches_workers,
    stall_period,
)
from torchtriage.fix.summary import attempt_of, fix_summary
from torchtriage.report.fix_view import fix_markdown
from torchtriage.results.ab import ABResult, Trial
from torchtriage.results.fix import FixResult, FixStep, Profiled
from torchtriage.results.run import KnobOutcome, RunConfig, merge_knob_outcomes
from torchtriage.verify.ab import run_ab
from torchtriage.verify.settings import TrialSettings

logger = logging.getLogger(__name__)
# a `no_change` A/B whose speedup is at least 1 + this x min_effect gets a second look
PROMISING = 5
# the first profile runs at least this many steps (the window is over by then in most runs),
# so that its step timeline shows memory growth and recurring stalls; its timeout bounds it
OBSERVE_STEPS = 60
Progress = Callable[[str, int, int, Trial | None], None]


@dataclass(frozen=True)
class FixSettings:
    """What the fix loop may spend and how each of its A/Bs runs."""

    budget_s: float = 600.0  # wall-clock budget for the whole loop; no A/B starts past it
    # each A/B's trials (the most per arm: they stop earlier when clear); ``timeout`` also
    # bounds each profile run
    trial: TrialSettings = field(default_factory=lambda: TrialSettings(trials=4))
    device_memory: int | None = None  # capacity for the memory rule on CPU, as for ``run``
    layers: tuple[Layer, ...] | None = None  # only these layers' fixes (--layers); None: all
    # only these prescriptions (--only, memory rungs included); None: every one
    only: tuple[str, ...] | None = None

    def allows(self, prescription: str) -> bool:
        return self.only is None or prescription in self.only


def run_fix(
    command: list[str],
    out: Path,
    settings: FixSettings | None = None,
    *,
    store=None,
    progress: Progress | None = None,
    cwd: Path | None = None,
) -> FixResult:
    """Run the loop described in the module docstring; returns (and writes) ``fix.json``.

    Args:
        command: the training command, as for ``torchtriage run`` (python or torchrun).
        settings: budget, A/B trial settings and device memory (default :class:`FixSettings`).

    Every A/B trial is committed to ``store`` under the fix run as it finishes.

    Raises:
        TorchtriageError: the command fails as written (nothing to fix from).
        Interrupted: torchtriage got SIGTERM, SIGINT or SIGHUP: the command in flight was
            stopped, and ``fix.json`` (``stopped_because: "interrupted by SIG..."``, no final
            A/B), ``fix.md`` and ``fix.patch`` say what was found so far.
    """
    settings = settings or FixSettings()
    claim_run_dir(out)
    budget = Budget(settings.budget_s)
    store_id = store.start_run("fix", command, out_dir=out) if store else None
    # each A/B trial goes to the run store under the fix run as it finishes
    sink = (lambda ab_dir, trial: store.record_trial(store_id, trial, ab=ab_dir.name)
            ) if store else None
    loop = _Loop(command, out, budget, settings, progress, sink)
    stopped_by: interrupt.Interrupted | None = None
    with interrupt.forwarding(defer=True):
        try:
            result = loop.run()
        except interrupt.Interrupted as exc:  # keep what was found so far
            stopped_by = exc
            result = loop.interrupted(exc.name)
        except BaseException as exc:
            if store:  # the row says why
                store.finish_run(store_id, "failed", "fix did not finish: "
                                 + (str(exc) or type(exc).__name__).splitlines()[0])
            raise
        patch = make_patch(loop.kept, loop.outcomes(), command, cwd)
        if patch.diff:
            (out / "fix.patch").write_text(patch.diff)
            result.patch_file = str(out / "fix.patch")
            result.patch_files = patch.files
        result.instructions = patch.instructions
        result.store_id = store_id
        result.summary = fix_summary(result)
        result.write(out / "fix.json")
        (out / "fix.md").write_text(fix_markdown(result, patch.diff))
        if store:
            store.finish_run(store_id, "interrupted" if stopped_by else "done",
                             result.headline(), msgspec.to_builtins(result))
        if stopped_by is not None:
            stopped_by.detail = (f"what was found so far is in {out / 'fix.json'} "
                                 f"({result.trials_run} trial(s)"
                                 + (f", stored under run {store_id}" if store else "") + ")")
            raise stopped_by
    return result


class _Loop:
    def __init__(self, command: list[str], out: Path, budget: Budget, settings: FixSettings,
                 progress: Progress | None,
                 sink: Callable[[Path, Trial], None] | None = None) -> None:
        self.command, self.out, self.budget = command, out, budget
        self.settings, self.progress, self.sink = settings, progress, sink
        self.kept: dict[str, Any] = {}
        self.kept_order: list[dict[str, Any]] = []
        self.fix_steps: list[FixStep] = []
        self.rounds: list[Profiled] = []
        self.original_oom: OutOfMemory | None = None  # the original ran out of memory
        self.loader_workers = 0  # DataLoader workers the last profile round's script used
        self.loader_batches: int | None = None  # batches it fetched (None: no record)
        self.profile_cut = False  # the first profile run was stopped at the budget's end
        # the first A/B the budget could not fit: its knob and the --budget (s) that would have
        self.budget_short: tuple[str, float] | None = None
        self.original: list[Trial] = []  # baseline trials of the original configuration
        self.incumbent: list[Trial] = []  # trials of the current kept configuration
        self.trials_run = 0
        self.trials_recorded = 0  # fresh trials as they finish (an interrupted A/B's too)
        self.ab_count = 0
        # prescription -> (times tried, kept configuration then, last A/B verdict)
        self.tried: dict[str, tuple[int, dict[str, Any] | None, str | None]] = {}
        self.last_trials: list[Trial] = []  # trials of the kept configuration
        # knob outcomes of each profile run, by its run directory
        self.profile_outcomes: dict[str, dict[str, KnobOutcome]] = {}
        self.skip = 0  # steps before the profile window (set once the trials disagree)
        self.reprofile = False  # a profile round disagreed with its trials: profile again
        self.period = 0  # a recurring stall's period (steps): A/B trials measure whole ones

    # --- profiling ----------------------------------------------------------------------

    def profile(self, knobs: dict[str, Any], label: str, *, seed_offset: int = 0
                ) -> tuple[Any, list[float], bool, dict[str, KnobOutcome]]:
        """Profile the command with ``knobs`` (worker seeds shifted by ``seed_offset``): (the
        diagnosis or None, rank 0's losses, whether it ran out of memory, the knob outcomes)."""
        run_dir = self.out / "profiles" / f"{len(self.rounds)}-{label}"
        run_dir.mkdir(parents=True, exist_ok=True)
        self._say(f"profiling ({label})")
        start = time.monotonic()
        device_memory = self.settings.device_memory
        first = not self.rounds  # the original's: bounded by the budget too
        config = RunConfig(out=str(run_dir), knobs=knobs, stop_after_window=True,
                           device_memory=device_memory, skip=self.skip,
                           worker_seed_offset=seed_offset,
                           observe_steps=OBSERVE_STEPS if first else 0)
        timeout = (self.budget.first_profile_timeout(self.settings.trial.timeout) if first
                   else self.settings.trial.timeout)
        result = run_command(self.command, config, timeout=timeout, log=run_dir / "output.log")
        if result.interrupted is not None:
            raise interrupt.Interrupted(result.interrupted)
        self.profile_cut = first and result.timed_out and timeout != self.settings.trial.timeout
        if not self.budget.profile_s:
            self.budget.profile_s = time.monotonic() - start
            self.budget.trial_estimate_s = trial_estimate(result.rank0(), self.settings.trial)
        oom = result.oom
        losses = [x for r in result.records if r.rank == 0 for x in r.loss_values]
        outcomes = result.knobs
        self.profile_outcomes[str(run_dir)] = outcomes
        self.loader_workers = max((r.loader_workers for r in result.records), default=0)
        self.loader_batches = max((r.loader_batches for r in result.records), default=None)
        write_diagnosis(result, device_memory)  # None without a trace, unless it ran out
        return representative(result.diagnosis), losses, oom, outcomes

    def _round(self, diagnosis, knobs: dict[str, Any], label: str) -> None:
        self.rounds.append(Profiled(
            round=len(self.rounds), knobs=dict(knobs), primary=diagnosis.primary,
            confidence=diagnosis.confidence,
            median_step_ms=diagnosis.breakdown.median_step_ms, summary=diagnosis.summary,
            peak_fraction=ladder.peak_fraction(diagnosis),
            run_dir=str(self.out / "profiles" / f"{len(self.rounds)}-{label}")))

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> FixResult:
        diagnosis, losses, _, _ = self.profile({}, "original")
        if diagnosis is None:
            log = self.out / "profiles" / "0-original" / "output.log"
            full = full_disk_reason(log.parent)  # a full disk, say: that, not "no step"
            if full is not None:
                raise TorchtriageError(f"{full}; there is nothing to fix")
            if self.profile_cut:
                raise TorchtriageError(
                    f"the first profile did not finish within --budget "
                    f"{self.budget.seconds:g}s (stopped before its window was profiled); "
                    f"give fix a larger --budget (its output: {log})")
            raise TorchtriageError(f"the command recorded no training step as written, so "
                                   f"there is nothing to fix (its output: {log})")
        self._round(diagnosis, {}, "original")
        self.original_oom = diagnosis.out_of_memory
        self.period = stall_period(diagnosis)
        leak = leak_of(diagnosis)
        original_losses = losses
        stopped = ""
        if leak is not None and "memory" in (self.settings.layers or LAYERS):
            # memory that grows over the run: no rung is tried (it would only postpone the
            # error past a short trial); the leak's fix is the user's code change
            grows = f"memory grows by {leak.bytes_per_step / 2**20:.2f} MiB per step: a leak"
            self._say(f"{grows}; the memory ladder is not tried", lasting=True)
            for prescription in (p for p in diagnosis.prescriptions if p.id == LEAK_FIX):
                self._try(prescription, "memory", diagnosis)  # reported: a code change
            if self.original_oom is not None:  # every trial would run out of memory too
                stopped = (f"{grows} that runs the original out of memory; fix it "
                           "(memory.fix_leak) and run fix again")
        while not stopped:
            if (diagnosis.primary == "memory" and leak is None
                    and "memory" in (self.settings.layers or LAYERS)
                    and any(self.settings.allows(rung) for rung, _ in ladder.rungs())):
                steps, rung, after = ladder.climb(self.profile, self.kept, len(self.rounds) - 1,
                                                  diagnosis, original_losses,
                                                  loader_seen=self.loader_batches != 0,
                                                  allows=self.settings.allows)
                self.fix_steps.extend(steps)
                if rung is None:
                    stopped = "no memory rung that can be injected fits"
                    break
                self._keep(rung)
                self.incumbent = []
                diagnosis = after
                self._round(after, self.kept, "memory")
                continue
            stopped = self._govern(diagnosis)
            if stopped:
                break
            self.reprofile = False
            if not self.budget.allows_profile():
                stopped = "the budget is spent"
                break
            diagnosis, _, _, _ = self.profile(self.kept, f"round{len(self.rounds)}")
            if diagnosis is None:
                stopped = "the kept configuration recorded no trace"
                break
            self._round(diagnosis, self.kept, f"round{len(self.rounds)}")
        return self._finish(stopped)

    def _govern(self, diagnosis) -> str:
        """Try the prescriptions of the primary layer, then of the other significant time
        layers, until one is kept (returns "") or none is (returns why the loop stops)."""
        layers = [diagnosis.primary] + [
            p.layer for p in diagnosis.prescriptions if p.layer not in (diagnosis.primary,
                                                                        "memory")]
        layers = [x for x in dict.fromkeys(layers) if x in (self.settings.layers or LAYERS)]
        if not layers:
            return f"the {diagnosis.primary} layer is not among --layers " + \
                ",".join(self.settings.layers or ())
        tried_layers = []  # layers with an A/B run
        for layer in layers:
            todo = [p for p in diagnosis.prescriptions if p.layer == layer
                    and self.settings.allows(p.id) and self._eligible(p.id)]
            for prescription in todo:
                outcome = self._try(prescription, layer, diagnosis)
                if outcome in ("dropped", "failed") and layer not in tried_layers:
                    tried_layers.append(layer)
                if outcome == "budget":
                    return self._budget_spent()
                if outcome == "baseline_failed":
                    return "the configuration kept so far failed in an A/B trial"
                if outcome == "kept" or self.reprofile:
                    return ""
        if not tried_layers:
            among = (f" among --only {','.join(self.settings.only)}"
                     if self.settings.only is not None else "")
            return f"nothing left to try{among} for the {' or '.join(layers)} layer"
        return f"no {' or '.join(tried_layers)} fix was proven faster"

    def _budget_spent(self) -> str:
        """Why the loop stops when an A/B did not fit: the knob it would have tried and the
        ``--budget`` that fits it (this run's time so far plus the A/B's estimate and the final
        A/B's reserve, rounded up to the minute): the user's next command."""
        if self.budget_short is None:
            return "the budget is spent"
        knob, total_s = self.budget_short
        return (f"the budget is spent before {knob} could be tried "
                f"(--budget {math.ceil(total_s / 60)}m would fit its A/B)")

    def _eligible(self, prescription: str) -> bool:
        """Not tried yet, or measured `no_change` once under a configuration that has changed
        since (a fix that did not matter behind one bottleneck may matter behind the next:
        the optimizer's launches once the model runs in CUDA graphs, say). A worker search
        that kept a value may search once more from the next profile's figures (its first
        values came from a profile that saw less loading, or the budget cut it short)."""
        last = self.tried.get(prescription)
        if last is None:
            return True
        times, kept_then, verdict = last
        resumes = verdict == "faster" and searches_workers(prescription)
        return times < 2 and (verdict == "no_change" or resumes) and kept_then != self.kept

    def _try(self, prescription, layer: str, diagnosis) -> str:
        round_no = len(self.rounds) - 1
        search = search_for(prescription.id,
                            machine_context(self.kept, diagnosis, self.loader_workers))
        if search is None:
            self.tried[prescription.id] = (99, dict(self.kept), "not_injectable")
            why = NOT_INJECTED.get(prescription.id, f"needs a code change: {prescription.code}")
            self.fix_steps.append(FixStep(
                round=round_no, layer=layer, prescription=prescription.id, knob=None,
                result="not_injectable", why=why))
            return "not_injectable"
        kept_before = dict(self.kept)
        outcome, verdict = self._search(search, layer, round_no)
        while (search.fallback is not None and outcome in ("dropped", "failed")
               and not self.reprofile):
            search = search.fallback
            outcome, verdict = self._search(search, layer, round_no)
        times = self.tried.get(prescription.id, (0, None, None))[0]
        self.tried[prescription.id] = (times + 1, kept_before, verdict)
        return outcome

    def _search(self, search, layer: str, round_no: int) -> tuple[str, str | None]:
        """A/B the search's values in order while each beats the best so far; returns the
        outcome ("kept", "dropped", "failed", "skipped", "budget", "baseline_failed") and the
        verdict of the last A/B."""
        if search.why_not:
            self.fix_steps.append(FixStep(round=round_no, layer=layer,
                                          prescription=search.prescription, knob=search.knob,
                                          result="skipped", why=search.why_not))
            return "skipped", None
        kept = self.kept.get(search.knob)
        values = [v for v in search.values if kept != v]
        if searches_workers(search.prescription) and isinstance(kept, int):
            # a resumed worker search goes on up: fewer workers than the kept value was
            # measured slower already (it cost an A/B per fix run that said just that)
            values = [v for v in values if isinstance(v, int) and v > kept]
        if not values:  # already kept (the memory ladder's bf16 rung, say)
            return "skipped", None
        step = FixStep(round=round_no, layer=layer, prescription=search.prescription,
                       knob=search.knob, result="dropped", why="", attempts=[])
        self.fix_steps.append(step)
        verdict = None
        for value in values:
            compiling = search.knob == "compile.mode"
            fresh = 2 if self.incumbent else 4
            fits, need = self.budget.allows(fresh, COMPILE_ESTIMATE_S if compiling else 0.0)
            if not fits:
                step.why = (step.why + "; " if step.why else "") + (
                    f"{search.knob}={value!r} not tried: it needs ~{need:.0f} s beside the "
                    f"{self.budget.reserve_s:.0f} s kept for the final A/B, and "
                    f"{max(self.budget.seconds - self.budget.elapsed, 0):.0f} s of the budget "
                    "are left")
                if step.kept_value is None:
                    step.result = "skipped"
                if self.budget_short is None:
                    self.budget_short = (f"{search.knob}={value!r}",
                                         self.budget.elapsed + need + self.budget.reserve_s)
                return ("budget" if step.kept_value is None else "kept"), verdict
            knobs = {search.knob: value, **(search.extra or {})}
            try:
                ab = self._ab(knobs, f"{search.knob}={value}")
            except TorchtriageError as exc:  # the baseline arm itself failed
                step.result = "failed"
                step.why = f"{search.knob}={value!r}: {exc}"
                return "baseline_failed", verdict
            if self._inconclusive(ab):
                ab = self._second_look(knobs, f"{search.knob}={value}", ab)
            verdict = ab.verdict
            attempt = attempt_of(value, ab)
            step.attempts.append(attempt)
            if ab.verdict == "faster":
                step.result, step.kept_value = "kept", value
                step.why = f"{search.knob}={value!r}: {attempt.note}"
                self._keep(knobs)
                self.incumbent = [t for t in ab.trials if t.arm == "B" and t.status == "ok"]
                self.last_trials = list(self.incumbent)
                continue
            reason = f"{search.knob}={value!r}: {attempt.note}"
            if step.kept_value is None:
                step.result = "failed" if ab.verdict == "failed" else "dropped"
                step.why = reason
            else:
                step.why += f"; then {reason}"
            break
        if self.reprofile and step.kept_value is None:
            step.why += "; the profile it came from was not representative: profiled again"
        return ("kept" if step.kept_value is not None else step.result), verdict

    def _ab(self, knobs: dict[str, Any], label: str, *, settings: TrialSettings | None = None,
            prior: dict[str, list[Trial]] | None = None, min_fresh: int = 0) -> ABResult:
        self.ab_count += 1
        ab_dir = self.out / "ab" / f"{self.ab_count:02d}-{label}"
        prefix = f"{label}: "
        progress = (lambda text, k, n, trial: self.progress(prefix + text, k, n, trial)
                    ) if self.progress else None
        if prior is None and self.incumbent:
            prior = {"A": self.incumbent}
        settings = self._periodic(settings or self.settings.trial)
        ab = run_ab(self.command, ab_dir, settings, knobs=knobs,
                    baseline_knobs=self.kept, adaptive=True, progress=progress, prior=prior,
                    min_fresh=min_fresh, deadline=self.budget.start + self.budget.seconds,
                    on_trial=self._on_trial(ab_dir))
        fresh = [t for t in ab.trials if not t.reused]
        self.trials_run += len(fresh)
        self.budget.trial_s.extend(t.wall_s for t in fresh)
        if not self.kept and not self.original:
            self.original = [t for t in ab.trials if t.arm == "A" and t.status == "ok"]
        self._cross_check(ab)
        return ab

    def _cross_check(self, ab: ABResult) -> None:
        """Compare the last profile round with its configuration's first baseline trials
        (the module docstring's cross-check)."""
        last = self.rounds[-1] if self.rounds else None
        if (last is None or last.trials_step_ms is not None or ab.a.mean_step_ms is None
                or last.knobs != ab.baseline_knobs or not last.median_step_ms):
            return
        last.trials_step_ms = ab.a.mean_step_ms
        drift = ab.a.mean_step_ms / last.median_step_ms - 1
        last.window_agrees = window_holds(last.median_step_ms, ab.a.mean_step_ms)
        if last.window_agrees or self.skip or self.period:
            return  # (trials over whole stall periods include the stalls the window lies between)
        a_trials = [t for t in ab.trials if t.arm == "A" and t.status == "ok"]
        self.skip = max((t.warmup_steps or 0) + len(t.step_ms) for t in a_trials)
        self.reprofile = True
        self._say(f"round {last.round}'s profile ({last.median_step_ms:.1f} ms/step) and its "
                  f"baseline trials ({ab.a.mean_step_ms:.1f} ms/step) disagree by "
                  f"{drift:+.0%} (window_drift {WINDOW_DRIFT.value:.0%}): profiling again "
                  f"after step {self.skip}", lasting=True)

    def _inconclusive(self, ab: ABResult) -> bool:
        """A `no_change` whose point estimate is large and whose interval reaches past the
        minimum effect: too few trials to tell, not evidence of no effect."""
        min_effect = self.settings.trial.min_effect
        return (ab.verdict == "no_change" and ab.speedup is not None
                and ab.speedup >= 1 + PROMISING * min_effect
                and (ab.ci_high or 0) > 1 + min_effect)

    def _second_look(self, knobs: dict[str, Any], label: str, first: ABResult) -> ABResult:
        """The same A/B once more with up to twice the trials, the first look's trials
        reused; its interval is at 1 - (1 - confidence) / 2 so that two looks together keep
        the error rate of one (Bonferroni)."""
        trial = self.settings.trial
        settings = dataclasses.replace(trial, trials=2 * trial.trials,
                                       confidence=1 - (1 - trial.confidence) / 2)
        fits, _ = self.budget.allows(2 * trial.trials)
        if not fits:
            return first
        self._say(f"{label}: {first.speedup:.2f}x but not clear, a second look")
        prior = {arm: [t for t in first.trials if t.arm == arm and t.status == "ok"]
                 for arm in ("A", "B")}
        return self._ab(knobs, label + " (second look)", settings=settings, prior=prior,
                        min_fresh=2)

    def _on_trial(self, ab_dir: Path) -> Callable[[Trial], None]:
        def recorded(trial: Trial) -> None:
            self.trials_recorded += 1
            if self.sink is not None:
                self.sink(ab_dir, trial)

        return recorded

    def interrupted(self, signal_name: str) -> FixResult:
        """What was found before a signal stopped the loop (no final A/B): the kept fixes
        were each proven by their own A/B; a search cut short says so."""
        why = f"interrupted by {signal_name}"
        self.trials_run = max(self.trials_run, self.trials_recorded)  # the cut A/B's too
        for step in self.fix_steps:
            if step.result == "dropped" and not step.why:
                step.result, step.why = "skipped", f"{why} during its A/B"
        return self._finish(why, final_ab=False)

    def _keep(self, knobs: dict[str, Any]) -> None:
        for knob, value in knobs.items():
            self.kept[knob] = value
            self.kept_order = [k for k in self.kept_order if k["knob"] != knob]
            self.kept_order.append({"knob": knob, "value": value})

    def _periodic(self, settings: TrialSettings) -> TrialSettings:
        """Trials over whole periods of the run's recurring stall, when it has one."""
        if self.period and not settings.period_steps:
            return dataclasses.replace(settings, period_steps=self.period)
        return settings

    def _finish(self, stopped: str, *, final_ab: bool = True) -> FixResult:
        final: ABResult | None = None
        if self.kept and self.original and final_ab:
            self._say("final A/B: kept configuration against the original")
            progress = (lambda text, k, n, trial: self.progress("final: " + text, k, n, trial)
                        ) if self.progress else None
            final = run_ab(self.command, self.out / "final", self._periodic(self.settings.trial),
                           knobs=self.kept, adaptive=True, min_fresh=FINAL_FRESH,
                           progress=progress, deadline=self.budget.final_deadline(),
                           prior={"A": self.original, "B": self.incumbent},
                           on_trial=self._on_trial(self.out / "final"))
            self.trials_run += sum(not t.reused for t in final.trials)
            self.last_trials = [t for t in final.trials if t.arm == "B" and not t.reused
                                and t.status == "ok"] + self.last_trials
        final_rate = final.b.steps_per_s if final else None
        if final is None and self.original_oom is not None and self.kept:
            # the original never completed a step: the kept configuration's profiled pace
            last = self.rounds[-1].median_step_ms
            final_rate = round(1e3 / last, 3) if last else None
        return FixResult(
            summary="", command=self.command, kept=self.kept_order,
            speedup=final.speedup if final else None, ci_low=final.ci_low if final else None,
            ci_high=final.ci_high if final else None, verdict=final.verdict if final else None,
            original_steps_per_s=final.a.steps_per_s if final else None,
            final_steps_per_s=final_rate, original_out_of_memory=self.original_oom,
            steps=self.fix_steps, rounds=self.rounds, stopped_because=stopped,
            budget_s=self.budget.seconds, elapsed_s=round(self.budget.elapsed, 1),
            trials_run=self.trials_run, out=str(self.out))

    def outcomes(self) -> dict[str, KnobOutcome]:
        """Knob outcomes (with the call sites they changed) from the kept configuration's
        trials, or the last profile round (as recorded when they ran)."""
        logs = [t.knobs for t in self.last_trials]
        if self.rounds:
            logs.append(self.profile_outcomes.get(self.rounds[-1].run_dir, {}))
        return merge_knob_outcomes(logs)

    def _say(self, text: str, *, lasting: bool = False) -> None:
        """Show a phase on the progress line, or (``lasting``) a finding as a line of its
        own; findings are logged too."""
        if lasting:
            logger.info("%s", text)
        if self.progress:
            self.progress(text, 0, -1 if lasting else 0, None)
