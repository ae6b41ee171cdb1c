"""``torchtriage ab``: does a knob make this script faster, and does it keep its results?

Baseline (A: the command as written) and candidate (B: the same command with the knobs, or a
second command) run as separate processes, interleaved in ABBA order (A B B A A B ...), so that
slow drift of the machine (thermals, other jobs) falls on both arms alike. Each trial runs in the
bootstrap's timing mode: no profiler; ``warmup`` steps, then ``steps`` measured steps; the
process is stopped after them. Every trial is written to the run store and to
``DIR/trials.jsonl`` when it ends, so nothing completed is lost if the harness is killed.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from torchtriage.capture import interrupt
from torchtriage.capture.rundir import claim_run_dir
from torchtriage.capture.runner import NO_STEP, merge_knob_logs, no_record_reason, run_command
from torchtriage.diagnosis.knobs import reseeds_workers, warmup_for
from torchtriage.errors import TorchtriageError
from torchtriage.results.ab import ABResult, Arm, Startup, Trial
from torchtriage.results.run import RunConfig, merge_knob_outcomes
from torchtriage.verify import policy
from torchtriage.verify.parity import check_parity, eager_random_parity
from torchtriage.verify.settings import TrialSettings
from torchtriage.verify.stats import outlier_trial, speedup_interval, verdict

logger = logging.getLogger(__name__)

MIN_MEASURED_STEPS = 3
# The first step boundary is only known once the optimizer cycle repeats (step 2), so the
# first step has no duration of its own: at least two warm-up steps.
MIN_WARMUP = 2
NOTABLE_STARTUP_S = 1.0  # extra start-up worth a sentence in the summary
COMPILE_WARMUP = warmup_for("compile.mode")  # its registry entry says why


ProgressFn = Callable[[str, int, int, Trial | None], None]


def run_ab(
    command: list[str],
    out: Path,
    settings: TrialSettings | None = None,
    *,
    knobs: dict[str, Any] | None = None,
    baseline_knobs: dict[str, Any] | None = None,
    candidate: list[str] | None = None,
    adaptive: bool = False,
    prior: dict[str, list[Trial]] | None = None,
    min_fresh: int = 0,
    deadline: float | None = None,
    store=None,
    progress: ProgressFn | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> ABResult:
    """Run the A/B experiment described in the module docstring.

    Args:
        command: the baseline command (``python train.py ARGS``); arm A.
        settings: trials per arm (the most, when ``adaptive``), ``warmup``/``steps`` before /
            inside the measured window, ``timeout`` per trial (a trial past it is stopped and
            recorded as ``timeout``) and ``min_effect`` (default :class:`TrialSettings`).
        knobs: applied to arm B (``{"dataloader.num_workers": 2}``), on top of
            ``baseline_knobs``, which both arms get (fixes already kept).
        candidate: arm B's command, when it differs from ``command`` (a hand-written fix).
        adaptive: stop as soon as the answer is clear: after each ABBA block from two trials
            per arm on, when the interval is past the minimum effect either way, lies inside
            it (no change either way), or parity failed.
        prior: trials already measured for an arm's exact configuration (the fix loop reuses
            the kept configuration's trials as the next baseline); they count as trials.
        min_fresh: trials to run in any case, on top of ``prior``.
        deadline: ``time.monotonic()`` after which no trial starts and a running one is
            stopped (its measured steps still count); the fix loop's budget.
        store: a :class:`~torchtriage.verify.store.RunStore` to record into, or None.
        progress: called before each trial (``label, k, n, None``) and after (with the trial).
        on_trial: called with each trial as it is recorded (the fix loop stores its trials
            under its own run).

    Raises:
        TorchtriageError: bad settings, or the baseline failed (the trials are kept).
        Interrupted: torchtriage got SIGTERM, SIGINT or SIGHUP: the trial in flight was
            stopped (and is not recorded), the completed ones are.
    """
    settings = settings or TrialSettings()
    base = dict(baseline_knobs or {})
    knobs = {**base, **(knobs or {})}
    trials = settings.trials
    if trials < 2:
        raise TorchtriageError("--trials must be at least 2 per arm for a confidence interval")
    if settings.warmup < MIN_WARMUP or settings.steps < MIN_MEASURED_STEPS:
        raise TorchtriageError(f"--warmup must be >= {MIN_WARMUP} and --steps >= "
                               f"{MIN_MEASURED_STEPS}")
    if knobs.get("compile.mode", "none") != "none":
        settings = dataclasses.replace(settings, warmup=max(settings.warmup, COMPILE_WARMUP))
    command_b = candidate or command
    # a knob that moves random draws into DataLoader workers: B's trials run under different
    # worker seeds, and parity compares with their spread (verify.parity)
    changed = {k: v for k, v in knobs.items() if base.get(k) != v}  # B's own knobs
    reseed = candidate is None and reseeds_workers(changed)
    claim_run_dir(out)
    store_id = store.start_run("ab", command, knobs=knobs, out_dir=out) if store else None
    arms = {"A": (command, base), "B": (command_b, knobs)}
    done: list[Trial] = []
    for arm, previous in (prior or {}).items():
        done.extend(msgspec.structs.replace(t, arm=arm, idx=i, reused=True)
                    for i, t in enumerate((t for t in previous if t.status == "ok"), 1))
    if done and min_fresh:  # earlier trials may fill an arm: min_fresh run in any case
        most = max(sum(t.arm == arm for t in done) for arm in ("A", "B"))
        trials = max(trials, most + (min_fresh + 1) // 2)
    stopped: dict[str, str] = {}  # arm -> why it gets no more trials
    fresh = 0
    set_aside: str | None = None  # why the reused trials were set aside
    total = 2 * trials - len(done)
    with interrupt.forwarding(defer=True):
        try:
            while (arm := _next_arm(done, trials, skip=set(stopped))) is not None:
                label = _label(arm, changed, candidate)
                fresh += 1
                total = max(total, fresh)  # an outlier trial's replacement is one more
                if progress:
                    progress(label, fresh, total, None)
                idx = sum(t.arm == arm for t in done) + 1
                if deadline is not None and time.monotonic() >= deadline:
                    break
                trial = _run_trial(arm, idx, *arms[arm], out, settings, deadline,
                                   seed_offset=idx - 1 if reseed and arm == "B" else 0)
                done.append(trial)
                _record(trial, out, store, store_id, on_trial)
                if progress:
                    progress(label, fresh, total, trial)
                interrupt.check()
                if fresh == 2 and (why := _reused_drift(done)) is not None:
                    set_aside = why
                    done = [t for t in done if not t.reused]
                    total = max(total, 2 * trials)
                if trial.status != "ok" and all(t.status != "ok" for t in done
                                                if t.arm == arm):
                    stopped[arm] = trial.error or trial.status  # it would fail again
                    if not (arm == "A" and trial.status == "oom"):
                        break
                    # a baseline out of memory: the question is whether the candidate fits
                if (adaptive and fresh % 2 == 0 and fresh >= min_fresh
                        and _decided(done, knobs, settings.min_effect, settings.confidence,
                                     reseeded=reseed)):
                    break
            result = _result(done, arms, knobs, settings, out, reseeded=reseed)
            if _random_may_differ(result, done, deadline):  # inside: a signal is handled
                _check_eager_random(result, arms, settings, out, deadline)
        except (KeyboardInterrupt, interrupt.Interrupted) as exc:
            ran = sum(not t.reused for t in done)
            why = (f"interrupted by {exc.name}" if isinstance(exc, interrupt.Interrupted)
                   else "interrupted by the user")
            if store:
                store.finish_run(store_id, "interrupted", f"{why} after {ran} trial(s)")
            if isinstance(exc, interrupt.Interrupted):
                exc.detail = (f"the {ran} completed trial(s) are in {out / 'trials.jsonl'}"
                              + (f" and run {store_id} of the run store" if store else ""))
            raise
        except Exception as exc:  # a command not found, a full disk: the row says so
            if store:
                store.finish_run(store_id, "failed", str(exc).splitlines()[0] if str(exc)
                                 else type(exc).__name__)
            raise
    if set_aside is not None:
        result.reused_set_aside = set_aside
        result.summary += f" (earlier trials set aside: {set_aside})"
    result.baseline_knobs = base
    result.store_id = store_id
    result.write(out / "ab.json")
    if store:
        store.finish_run(store_id, "failed" if result.verdict == "failed" else "done",
                         result.headline(), msgspec.to_builtins(result))
    if "A" in stopped and result.verdict not in ("fits", "changes_results"):
        raise TorchtriageError(f"the baseline failed, so nothing was compared: {stopped['A']} "
                               f"(trial logs in {out / 'trials'})", )
    return result


def _random_may_differ(result: ABResult, done: list[Trial], deadline: float | None) -> bool:
    """Whether a failed parity may come from compiled code's own random stream (either arm
    compiled; verify.parity) and a random-aligned pair fits before ``deadline`` (each of its
    trials takes no longer than the arm's slowest trial: it runs only the first steps)."""
    if result.verdict != "changes_results" or result.speed_verdict is None:
        return False
    ok = [t for t in done if t.status == "ok" and not t.reused]
    if not any(t.compile for t in ok):
        return False
    need = sum(max((t.wall_s for t in ok if t.arm == arm), default=0.0) for arm in "AB")
    return deadline is None or time.monotonic() + need <= deadline


def _check_eager_random(result: ABResult, arms, settings: TrialSettings, out: Path,
                        deadline: float | None) -> None:
    """Run one trial per arm over the parity steps with compiled code drawing random numbers
    as eager PyTorch does, and judge parity by that pair (verify.parity.eager_random_parity);
    the verdict and summary follow. The pair is written under ``trials/`` but not to
    ``trials.jsonl`` (it measures no speed)."""
    steps = int(policy.PARITY_STEPS.value)
    short = dataclasses.replace(settings, warmup=MIN_WARMUP,
                                steps=max(steps - MIN_WARMUP, MIN_MEASURED_STEPS),
                                min_measure_s=0.0, period_steps=0)
    losses = {}
    for arm in ("A", "B"):
        trial = _run_trial(arm, 1, *arms[arm], out, short, deadline, eager_random=True)
        interrupt.check()
        logger.info("random-aligned parity trial %s: %s", arm, trial.status)
        losses[arm] = trial.losses if trial.status == "ok" else []
    result.parity = eager_random_parity(result.parity, losses["A"], losses["B"], result.b.knobs)
    if result.parity.status == "pass":
        result.verdict = result.speed_verdict
        result.summary = _summary(result)


def _reused_drift(done: list[Trial]) -> str | None:
    """Why the trials measured earlier no longer describe this machine (``reused_trial_drift``:
    an arm's fresh trials lie outside its earlier trials' range by more than it), or None."""
    tolerance = policy.REUSED_DRIFT.value
    for arm in ("A", "B"):
        ok = [t for t in done if t.arm == arm and t.status == "ok" and t.mean_step_ms]
        earlier = [t.mean_step_ms for t in ok if t.reused]
        now = [t.mean_step_ms for t in ok if not t.reused]
        if not earlier or not now:
            continue
        median, low, high = statistics.median(now), min(earlier), max(earlier)
        if median > high * (1 + tolerance) or median < low / (1 + tolerance):
            return (f"arm {arm}'s fresh trial took {median:.1f} ms a step, its earlier trials "
                    f"{low:.1f}-{high:.1f} ms: the machine's load changed, so only fresh "
                    "trials are compared")
    return None


def _record(trial: Trial, out: Path, store, store_id: int | None,
            on_trial: Callable[[Trial], None] | None) -> None:
    """Commit a finished trial: the run store (first: it is the record ``show`` and ``fix``
    read back), ``trials.jsonl``, ``on_trial``."""
    if store:
        store.record_trial(store_id, trial)
    with open(out / "trials.jsonl", "ab") as f:
        f.write(msgspec.json.encode(trial) + b"\n")
    if on_trial:
        on_trial(trial)


def _kept(trials: list[Trial]) -> tuple[list[Trial], Trial | None]:
    """An arm's completed trials without its outlier trial, and that trial (or None)."""
    ok = [t for t in trials if t.status == "ok" and t.mean_step_ms is not None]
    i = outlier_trial([t.mean_step_ms for t in ok])
    return ([t for k, t in enumerate(ok) if k != i], ok[i] if i is not None else None)


def _next_arm(done: list[Trial], trials: int, skip: set[str] = frozenset()) -> str | None:
    """The next arm in ABBA order over the fresh trials (A B B A A B ..., starting with the arm
    that has fewer trials when earlier ones are reused), skipping an arm that has ``trials``
    besides its outlier trial (which one more trial replaces) or is in ``skip`` (it stopped);
    None when both have."""
    count = {arm: trials if arm in skip else sum(t.arm == arm for t in done)
             - (_kept([t for t in done if t.arm == arm])[1] is not None) for arm in ("A", "B")}
    if min(count.values()) >= trials:
        return None
    fresh = [t.arm for t in done if not t.reused]
    reused = {arm: sum(t.arm == arm and t.reused for t in done) for arm in ("A", "B")}
    first = "B" if reused["B"] < reused["A"] else "A"
    other = "B" if first == "A" else "A"
    k = len(fresh)
    while True:
        arm = first if k % 4 in (0, 3) else other
        if count[arm] < trials:
            return arm
        k += 1


FAR_SLOWER = 3.0  # a candidate this many times slower in its first trial is not tried again


def _decided(done: list[Trial], knobs: dict[str, Any], min_effect: float,
             confidence: float = policy.CONFIDENCE.value, *, reseeded: bool = False) -> bool:
    """Whether the trials so far already answer the question (see ``run_ab(adaptive=)``)."""
    a = _kept([t for t in done if t.arm == "A"])[0]
    b = _kept([t for t in done if t.arm == "B"])[0]
    if a and b and min(t.mean_step_ms for t in b) > FAR_SLOWER * max(t.mean_step_ms
                                                                         for t in a):
        return True
    if len(a) < 2 or len(b) < 2:
        return False
    if check_parity([t.losses for t in a], [t.losses for t in b], knobs,
                    reseeded=reseeded).status == "fail":
        return True
    s = speedup_interval([t.step_ms for t in a], [t.step_ms for t in b], statistic="mean",
                         confidence=confidence)
    inside = 1 / (1 + min_effect) < s.ci_low and s.ci_high < 1 + min_effect
    return verdict(s, min_effect) != "no_change" or inside


def _label(arm: str, knobs: dict[str, Any], candidate: list[str] | None) -> str:
    if arm == "A":
        return "A baseline"
    if candidate:
        return "B candidate command"
    return "B " + (" ".join(f"{k}={v}" for k, v in knobs.items()) or "(same as A)")


def _run_trial(arm: str, idx: int, command: list[str], knobs: dict[str, Any], out: Path,
               settings: TrialSettings, deadline: float | None = None, *,
               seed_offset: int = 0, eager_random: bool = False) -> Trial:
    trial_dir = out / "trials" / (f"eager_random_{arm}" if eager_random else f"{arm}{idx}")
    trial_dir.mkdir(parents=True, exist_ok=True)
    warmup, timeout = settings.warmup, settings.timeout
    start = time.perf_counter()
    left = deadline - time.monotonic() if deadline is not None else None
    by_budget = left is not None and (timeout is None or left < timeout)
    steps, period = settings.steps, settings.period_steps
    if period > 0:  # whole periods: both arms measure the stalls the run has
        steps = max(-(-steps // period), 1) * period
    config = RunConfig(out=str(trial_dir), knobs=knobs, max_steps=warmup + steps,
                       mode="time", timing_warmup=warmup, timing_min_s=settings.min_measure_s,
                       worker_seed_offset=seed_offset, timing_period=period,
                       eager_random=eager_random)
    result = run_command(command, config, timeout=max(left, 1.0) if by_budget else timeout,
                         log=trial_dir / "output.log")
    if result.interrupted is not None:  # stopped by a signal to torchtriage: not a trial
        raise interrupt.Interrupted(result.interrupted)
    wall = round(time.perf_counter() - start, 3)
    records = result.records
    base = {"arm": arm, "idx": idx, "returncode": result.returncode, "wall_s": wall,
            "dir": str(trial_dir), "knobs": merge_knob_logs(records)}
    if result.timed_out and not by_budget:
        return Trial(status="timeout", error=f"ran past the {timeout:g}s trial timeout", **base)
    note = None
    if result.timed_out:  # stopped at the end of the budget: its measured steps still count
        note = "stopped at the end of the budget"
        result.returncode = base["returncode"] = 0
    exits = [r.exit_exception or "" for r in records]
    if result.oom:  # set by the bootstrap's is_out_of_memory()
        losses = (result.rank0() or records[0]).loss_values if records else []
        return Trial(status="oom", error=next(e for e in exits if e), losses=losses, **base)
    if result.returncode != 0:
        return Trial(status="failed", error=_failure(result.returncode, exits, trial_dir),
                     **base)
    # each rank's warm-up, grown by the bootstrap while a DataLoader queue drained
    used = max((r.warmup_steps or warmup for r in records), default=warmup)
    measured = [r.host_step_ms[used - 1:] for r in records]  # interval i is step i + 2
    n = min((len(t) for t in measured), default=0)
    detected = max((r.steps_detected for r in records), default=0)
    if n < MIN_MEASURED_STEPS:
        why = (no_record_reason(trial_dir) if not records else
               NO_STEP if not detected else f"the script ran {detected} step(s); a trial needs "
               f"{used} warm-up + at least {MIN_MEASURED_STEPS} measured")
        return Trial(status="too_few_steps", error=note or why, **base)
    if n < settings.steps and note is None:
        note = f"ended after {detected} steps: {n} of {settings.steps} measured"
    step_ms = [round(max(t[i] for t in measured), 3) for i in range(n)]
    mean_ms = statistics.fmean(step_ms)
    rank0 = result.rank0() or records[0]
    return Trial(
        status="ok", step_ms=step_ms, mean_step_ms=round(mean_ms, 3),
        steps_per_s=round(1e3 / mean_ms, 3),
        losses=rank0.loss_values,
        warmup_end_s=rank0.warmup_end_s, compile=rank0.compile,
        batch_size=statistics.median(rank0.batch_sizes) if rank0.batch_sizes else None,
        warmup_steps=used, error=note, **base)


def _failure(returncode: int, exits: list[str], trial_dir: Path) -> str:
    how = (f"killed by signal {-returncode}" if returncode < 0
           else f"exited with code {returncode}")
    said = next((e for e in exits if e), None) or _last_line(trial_dir / "output.log")
    return f"{how}: {said}" if said else how


def _last_line(log: Path) -> str | None:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return None
    return lines[-1].strip()[:300] if lines else None


def _arm(label: str, command: list[str], knobs: dict[str, Any], ok: list[Trial]) -> Arm:
    """An arm's figures from its completed trials (its outlier trial left out)."""
    if not ok:
        return Arm(label=label, command=command, knobs=knobs, trials_ok=0)
    mean_ms = statistics.fmean(t.mean_step_ms for t in ok)
    throughput = statistics.median(t.steps_per_s for t in ok)
    batch = [t.batch_size for t in ok if t.batch_size]
    warm = [t.warmup_end_s for t in ok if t.warmup_end_s is not None]
    return Arm(label=label, command=command, knobs=knobs, trials_ok=len(ok),
               mean_step_ms=round(mean_ms, 3), steps_per_s=round(throughput, 3),
               samples_per_s=round(statistics.median(batch) * throughput, 2)
               if batch else None,
               warmup_end_s=round(statistics.median(warm), 3) if warm else None)


def _result(done: list[Trial], arms, knobs: dict[str, Any], settings: TrialSettings,
            out: Path, *, reseeded: bool = False) -> ABResult:
    min_effect = settings.min_effect
    a_trials = [t for t in done if t.arm == "A"]
    b_trials = [t for t in done if t.arm == "B"]
    (a_ok, a_odd), (b_ok, b_odd) = _kept(a_trials), _kept(b_trials)
    for t in done:
        t.outlier = t is a_odd or t is b_odd
    a = _arm("baseline", arms["A"][0], {}, a_ok)
    b = _arm("candidate", arms["B"][0], knobs, b_ok)
    outcomes = merge_knob_outcomes([t.knobs for t in b_trials])  # what B's own runs recorded
    parity = check_parity([t.losses for t in a_ok], [t.losses for t in b_ok], knobs,
                          reseeded=reseeded)
    if not a_ok or not b_ok:
        parity.detail = "an arm completed no trial"
    common = dict(confidence=settings.confidence, min_effect=min_effect, parity=parity,
                  a=a, b=b, knobs=outcomes, trials_per_arm=settings.trials,
                  warmup=settings.warmup, steps=settings.steps, trials=done, out=str(out),
                  steps_measured=min((len(t.step_ms) for t in a_ok + b_ok), default=None),
                  outlier_trials=[f"{t.arm}{t.idx}" for t in done if t.outlier])
    a_oom = [t for t in a_trials if t.status == "oom"]
    if not a_ok and b_ok and a_oom and len(a_oom) == len(a_trials):
        return _fits(a_oom, b_ok, knobs, common, reseeded=reseeded)
    if not a_ok or not b_ok:
        failed = b_trials if a_ok else a_trials
        why = next((t.error for t in failed if t.error), "no trial ran")
        who = "the candidate" if a_ok else "the baseline"
        return ABResult(summary=f"failed: {who} did not complete a trial ({why}).",
                        verdict="failed", speed_verdict=None, speedup=None, ci_low=None,
                        ci_high=None, startup=None, **common)
    s = speedup_interval([t.step_ms for t in a_ok], [t.step_ms for t in b_ok],
                         statistic="mean", confidence=settings.confidence)
    speed = verdict(s, min_effect)
    if min(len(a_ok), len(b_ok)) < 2:  # no spread to judge by: only a gross slowdown counts
        speed = "slower" if s.speedup < 1 / FAR_SLOWER else "no_change"
    final = "changes_results" if parity.status == "fail" else speed
    startup = _startup(a, b, b_ok, s.a_ms, s.b_ms)
    result = ABResult(summary="", verdict=final, speed_verdict=speed,
                      speedup=round(s.speedup, 4), ci_low=round(s.ci_low, 4),
                      ci_high=round(s.ci_high, 4), startup=startup, **common)
    result.summary = _summary(result)
    return result


def _fits(a_oom: list[Trial], b_ok: list[Trial], knobs: dict[str, Any],
          common: dict[str, Any], *, reseeded: bool = False) -> ABResult:
    """The baseline ran out of memory in every trial and the candidate completes: the verdict
    is ``fits`` (``changes_results`` when the candidate's losses part from the steps the
    baseline completed before its error); no speed-up, there is nothing to divide by."""
    parity = check_parity([t.losses for t in a_oom], [t.losses for t in b_ok], knobs,
                          reseeded=reseeded)
    if not any(t.losses for t in a_oom):
        parity.detail = "the baseline recorded no loss before running out of memory"
    b = common["b"]
    steps = max((len(t.losses) for t in a_oom), default=0)
    before = (f"the baseline ran out of memory in {len(a_oom)} of {len(a_oom)} trial(s)"
              + (f" after {steps} step(s)" if steps else ""))
    after = (f"the candidate completes {b.trials_ok} trial(s): mean step {b.mean_step_ms:.1f} "
             f"ms, {b.steps_per_s:.2f} steps/s")
    if parity.status == "fail":
        verdict_ = "changes_results"
        summary = (f"changes results: {after}, but its losses deviate "
                   f"{parity.max_deviation:.2g} from the baseline's first steps (tolerance "
                   f"{parity.tolerance:.2g}); {before}.")
    else:
        verdict_ = "fits"
        summary = f"fits: {before}; {after}."
    return ABResult(summary=summary, verdict=verdict_, speed_verdict=None, speedup=None,
                    ci_low=None, ci_high=None, startup=None, **{**common, "parity": parity})


def _startup(a: Arm, b: Arm, b_ok: list[Trial], a_ms: float, b_ms: float) -> Startup | None:
    if a.warmup_end_s is None or b.warmup_end_s is None:
        return None
    extra = round(b.warmup_end_s - a.warmup_end_s, 3)
    compiled = [t.compile["seconds"] for t in b_ok if t.compile]
    saving_s = (a_ms - b_ms) / 1e3
    break_even = (int(-(-extra // saving_s)) if extra > 0 and saving_s > 0 else None)
    return Startup(extra_s=extra,
                   compile_s=round(statistics.median(compiled), 3) if compiled else None,
                   break_even_steps=break_even)


def _summary(r: ABResult) -> str:
    assert r.speedup is not None and r.ci_low is not None and r.ci_high is not None
    interval = f"{r.confidence:.0%} CI {r.ci_low:.2f}-{r.ci_high:.2f}x"
    steps = f"mean step {r.a.mean_step_ms:.1f} -> {r.b.mean_step_ms:.1f} ms"
    words = {
        "faster": f"faster: {r.speedup:.2f}x ({interval}); {steps}",
        "slower": f"slower: {r.speedup:.2f}x ({interval}); {steps}",
        "no_change": f"no change: {r.speedup:.2f}x ({interval}, not clear of "
                     f"{r.min_effect:.0%}); {steps}",
        "changes_results": f"changes results: losses deviate {r.parity.max_deviation or 0:.2g} "
                           f"(tolerance {r.parity.tolerance or 0:.2g}); speed {r.speedup:.2f}x "
                           f"({interval}) is not a win",
    }
    text = words[r.verdict] + "."
    if r.steps_measured is not None and r.steps_measured < r.steps:
        text += (f" Only {r.steps_measured} of the {r.steps} steps asked were measured per "
                 "trial: the script ends sooner.")
    if min(r.a.trials_ok, r.b.trials_ok) < 2:
        text += " Only one trial in an arm: the interval shows no spread."
    for t in r.trials:
        if t.outlier:
            arm = r.a if t.arm == "A" else r.b
            text += (f" Trial {t.arm}{t.idx} ({t.mean_step_ms:.1f} ms/step against the arm's "
                     f"{arm.mean_step_ms:.1f}) set aside as an outlier.")
    not_applied = [k for k, o in r.knobs.items() if not o.applied]
    if not_applied:
        text += f" Not applied: {', '.join(not_applied)}."
    if r.startup and r.startup.break_even_steps and (r.startup.extra_s >= NOTABLE_STARTUP_S
                                                     or r.startup.compile_s):
        text += (f" Start-up costs {r.startup.extra_s:.1f} s more, paid back after "
                 f"{r.startup.break_even_steps} steps.")
    return text
