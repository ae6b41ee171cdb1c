"""A fix run in words: one attempt's note (its verdict, interval, compile cost, knobs not
applied) and the run's one-line summary."""

from __future__ import annotations

from typing import Any

from torchtriage.results.ab import ABResult
from torchtriage.results.fix import Attempt, FixResult


def attempt_of(value: Any, ab: ABResult) -> Attempt:
    """The attempt of one knob value, judged by its A/B."""
    compiled = next((t.compile for t in ab.trials if t.arm == "B" and t.compile), None)
    if ab.verdict == "failed":
        note = ab.summary
    elif ab.speedup is None:
        note = ab.verdict
    else:
        note = f"{ab.verdict} {ab.speedup:.2f}x [{ab.ci_low:.2f}-{ab.ci_high:.2f}]"
        if ab.verdict == "changes_results":
            note += f", losses deviate {ab.parity.max_deviation:.2g} > {ab.parity.tolerance:.2g}"
        elif ab.parity.reference == "eager_random":
            note += (f", losses deviate {ab.parity.unaligned_deviation or 0:.2g} by compiled "
                     f"code's own random draws (dropout), "
                     f"{ab.parity.max_deviation or 0:.2g} drawn as eager draws them")
    if compiled:
        note += f"; compile {compiled['seconds']:.1f} s"
        if ab.startup and ab.startup.break_even_steps:
            note += f", pays back after {ab.startup.break_even_steps} steps"
        if ab.verdict != "faster":
            note += (f"; {compiled['graph_breaks']} graph break(s), {compiled['recompiles']} "
                     "recompile(s)")
            if compiled.get("graph_break_reasons"):
                note += f" (first: {compiled['graph_break_reasons'][0][:120]})"
    not_applied = [k for k, o in ab.knobs.items() if not o.applied]
    if not_applied:
        note += f"; not applied: {', '.join(not_applied)} ({ab.knobs[not_applied[0]].detail})"
    return Attempt(value=value, verdict=ab.verdict, speedup=ab.speedup, ci_low=ab.ci_low,
                   ci_high=ab.ci_high, parity=ab.parity.status,
                   trials=sum(not t.reused for t in ab.trials),
                   seconds=round(sum(t.wall_s for t in ab.trials if not t.reused), 1),
                   compile=compiled, note=note, ab_dir=ab.out)


def fix_summary(r: FixResult) -> str:
    """The fix run's headline: what was kept and how much faster, or why nothing was."""
    oom = r.original_out_of_memory
    ran_out = f"the original ran out of memory on step {oom.step}; " if oom else ""
    if not r.kept:
        return f"{ran_out}nothing kept: {r.stopped_because}."
    kept = ", ".join(f"{k['knob']}={k['value']!r}" for k in r.kept)
    if oom is not None and r.speedup is None:
        last = r.rounds[-1]
        peak = f", peak {last.peak_fraction:.0%} of capacity" if last.peak_fraction else ""
        return (f"{ran_out}with {kept} it completes: median step {last.median_step_ms:.1f} ms "
                f"(profiled){peak}; stopped because {r.stopped_because}.")
    if r.speedup is None:
        return f"kept {kept}; stopped because {r.stopped_because}."
    interval = f"{r.speedup:.2f}x ({r.ci_low:.2f}-{r.ci_high:.2f}x, {r.verdict})"
    if r.verdict != "faster":  # each fix won its own A/B; together they did not
        return (f"kept {kept}, but the final A/B against the original does not confirm a gain: "
                f"{interval}; measure again (more --trials, a quieter machine) before adopting "
                f"it; stopped because {r.stopped_because}.")
    return (f"kept {kept}: {r.speedup:.2f}x faster than the original ({r.ci_low:.2f}-"
            f"{r.ci_high:.2f}x, {r.verdict}); stopped because {r.stopped_because}.")

