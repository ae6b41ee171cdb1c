"""The memory ladder: when the job runs out of memory or is near capacity, find the cheapest
rung that fits.

Rungs in cost order (the catalog's memory prescriptions, with the settings that the knob
registry's ``rungs`` give them): gradient accumulation (2, then 4 micro-batches per batch),
activation checkpointing, bf16, FSDP/ZeRO (a code change). Each injectable rung is
profiled on top of the fixes kept so far; it *fits* when the run does not run out of memory and
the diagnosis no longer names `memory` (its peak is under ``memory_near_capacity``), and its
losses pass parity with the original run (for a rung that moves the Dataset's random draws
into other DataLoader workers, a seeded script's augmentation changes: when its losses part
from the original's, the rung is profiled once more under other worker seeds and judged
against the spread of the two, see :mod:`torchtriage.verify.parity`). The first rung that fits
is kept and the ladder stops there: an expensive rung is never tried while a cheaper one fits.
A rung whose knob could not apply to this script (gradient accumulation needs a DataLoader
whose batches it can split) is reported with the reason and the ladder goes on; when the
profiled run fetched no DataLoader batch at all, such a rung is not even profiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torchtriage.diagnosis import knobs as registry
from torchtriage.diagnosis.catalog import CATALOG, remedies_for
from torchtriage.results.fix import Attempt, FixStep
from torchtriage.verify.parity import check_parity

# memory prescriptions that are not rungs: the ladder fits a batch that is too big; these fix
# something else
NOT_RUNGS: dict[str, str] = {
    "memory.fix_leak": "memory that grows over the run is a leak, fixed in the script; a rung "
                       "would only postpone its out-of-memory error",
}


def rungs() -> tuple[tuple[str, tuple[dict[str, Any], ...] | None], ...]:
    """The ladder, from the knob registry: the catalog's memory prescriptions in cost order that
    a knob's rung injects (-> the knob settings, tried in order) or that need a code change
    (-> None)."""
    injected = registry.rungs()
    out: list[tuple[str, tuple[dict[str, Any], ...] | None]] = []
    for remedy in remedies_for("memory"):
        if remedy.id in injected:
            knob, rung = injected[remedy.id]
            out.append((remedy.id, tuple({knob.id: v} for v in rung.values)))
        elif remedy.id in registry.CODE_CHANGES and remedy.id not in NOT_RUNGS:
            out.append((remedy.id, None))
    return tuple(out)


class Profile(Protocol):
    def __call__(self, knobs: dict[str, Any], label: str, *, seed_offset: int = 0
                 ) -> tuple[Any, list[float], bool, dict[str, Any]]: ...

_CODE = {r.id: r.code for r in CATALOG}


def peak_fraction(diagnosis) -> float | None:
    fractions = [m.peak_fraction for m in diagnosis.memory if m.peak_fraction is not None]
    return max(fractions) if fractions else None


def climb(profile: Profile, kept: dict[str, Any], round_no: int, before,
          before_losses: list[float], *, loader_seen: bool = True,
          allows: Callable[[str], bool] = lambda rung: True
          ) -> tuple[list[FixStep], dict[str, Any] | None, Any]:
    """Try the rungs in order; return the steps, the kept rung's knobs (or None) and the
    diagnosis of the configuration with it.

    Args:
        profile: runs the command with knobs (its DataLoader workers' seeds shifted by
            ``seed_offset``), returns (diagnosis or None when nothing was recorded, rank 0's
            losses, whether it ran out of memory, the knob outcomes); the label names the run
            directory.
        before: the diagnosis of the current configuration (memory-bound).
        loader_seen: whether the profiled run fetched a DataLoader batch (a rung whose knob
            patches DataLoaders is not applicable without one).
        allows: whether a rung may be tried (``fix --only``); the others are passed over.
    """
    steps = []
    peak_before = peak_fraction(before)
    for rung, settings in rungs():
        if not allows(rung):
            continue
        if settings is None:
            steps.append(FixStep(round=round_no, layer="memory", prescription=rung, knob=None,
                                 result="not_injectable",
                                 why=f"needs a code change: {_CODE.get(rung, '')}"))
            continue
        knob = next(iter(settings[0]))
        step = FixStep(round=round_no, layer="memory", prescription=rung, knob=knob,
                       result="does_not_fit", why="", attempts=[])
        spec = registry.knob(knob)
        if not loader_seen and spec and "dataloader" in (spec.site, *spec.also):
            step.result = "not_applicable"
            step.why = (f"{knob} cannot apply: {spec.not_reached}; the profiled run "
                        f"fetched no DataLoader batch")
            steps.append(step)
            continue
        for knobs in settings:
            if all(kept.get(k) == v for k, v in knobs.items()):
                break
            value = knobs[knob]
            diagnosis, losses, oom, outcomes = profile({**kept, **knobs}, f"{rung}={value}")
            outcome = outcomes.get(knob)
            if outcome is not None and not outcome.applied and not oom:
                step.result, step.why = "not_applicable", f"{knob}={value!r} did not apply: " \
                                                          f"{outcome.detail}"
                break
            if diagnosis is None:
                step.attempts.append(Attempt(value=value, verdict="does_not_fit",
                                             note="nothing was recorded"))
                step.why = "the run recorded no trace"
                continue
            peak = peak_fraction(diagnosis)
            fits = not oom and diagnosis.primary != "memory"
            parity = check_parity([before_losses], [losses], knobs)
            if fits and parity.status == "fail" and registry.reseeds_workers(knobs):
                # the rung moves random draws into other workers: measure what that alone
                # does to the losses (the same rung under other worker seeds)
                _, again, _, _ = profile({**kept, **knobs}, f"{rung}={value}-seed1",
                                         seed_offset=1)
                parity = check_parity([before_losses], [losses, again], knobs, reseeded=True)
            moved = (f"peak {_pct(peak_before)} -> {_pct(peak)} of capacity"
                     + (", out of memory" if oom else ""))
            step.attempts.append(Attempt(value=value, verdict="fits" if fits else "does_not_fit",
                                         parity=parity.status, peak_fraction=peak, note=moved))
            if fits and parity.status == "fail":
                step.result = "dropped"
                step.why = f"{knob}={value!r} fits ({moved}) but changes results " \
                           f"({parity.detail})"
                break
            if fits:
                step.result, step.kept_value = "kept", value
                step.why = (f"the cheapest rung that fits: {knob}={value!r}, {moved}; median "
                            f"step {before.breakdown.median_step_ms:.1f} -> "
                            f"{diagnosis.breakdown.median_step_ms:.1f} ms")
                steps.append(step)
                return steps, knobs, diagnosis
            step.why = f"still memory-bound with {knob}={value!r}: {moved}"
        if step.attempts or step.result == "not_applicable":
            steps.append(step)
    return steps, None, before


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"
