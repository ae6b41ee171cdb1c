"""What ``torchtriage run``'s window checks say, as findings: windows set aside and profiled
again (``steps.window_profiled_again``), and a last window that still was not steady state
(``steps.window_not_steady``: slower steps after it, or a one-off step inside it), which also
lowers the confidence (diagnose.py). The checks themselves are made in the training process
(capture/profiling.py).

And a shorter one-off the check does not profile again for (:func:`without_short_one_off`):
the window's longest step, when it is over ``one_off_step`` times the window's median and
the steps checked after the window never came within that factor of it (their longest,
``after_max_ms``), is left out of the statistics, whatever its length under
``one_off_min_ms``: in a window of 5 short steps one collector pause or scheduler stall would
otherwise decide the layer shares.

And a window that is the first seconds of one step (``capture.step_slice``,
:func:`slice_finding`): a step whose profiler memory alone would pass its share of the memory
limit is recorded in part (capture/cost_guard.py); the confidence is at most medium."""

from __future__ import annotations

from torchtriage.analysis.steps import StepWindows, leave_out
from torchtriage.diagnosis import result as r
from torchtriage.diagnosis import thresholds as th
from torchtriage.trace.model import Trace


def without_short_one_off(steps: StepWindows, window: r.WindowCheck | None) -> StepWindows:
    """``steps`` without the window's short one-off step, if it has one (module docstring).
    Only for a window the check bore out or did not judge by a one-off (a longer one-off is
    profiled again, and said so when the last window still has one)."""
    if window is None or window.after_max_ms is None or window.one_off_step is not None:
        return steps
    step_ms = (steps.wall / 1e3).tolist()
    odd = th.one_off_step(step_ms, [window.after_max_ms], min_over_ms=0.0)
    if odd is None:
        return steps
    median = sorted(step_ms)[len(step_ms) // 2]
    return leave_out(steps, [int(steps.numbers[odd])], (
        f"one-off: {step_ms[odd]:.1f} ms, {step_ms[odd] / median:.1f}x the window's median "
        f"{median:.1f} ms; none of the {window.after_steps} steps checked after the window "
        f"took more than {window.after_max_ms:.1f} ms"))


def window_findings(windows: list[r.WindowCheck]) -> list[r.Finding]:
    """What the run's window checks say (see capture/profiling.py)."""
    out = []
    for old in windows[:-1]:
        why = (f"step {old.one_off_step} took {old.one_off_step_ms:.0f} ms, a one-off the "
               "steps after it did not repeat" if old.one_off_step is not None else
               f"{old.profiled_mean_ms:.1f} ms per step profiled, "
               f"{old.after_mean_ms or 0:.1f} ms after it")
        out.append(r.Finding(
            id="steps.window_profiled_again", severity="info",
            message=f"The window at steps {old.first_step}-{old.last_step} was not steady state "
                    f"({why}): profiled again later."))
    if windows and windows[-1].representative is False and windows[-1].one_off_step is not None:
        w = windows[-1]
        out.append(r.Finding(
            id="steps.window_not_steady", severity="warning",
            message=f"Profiled step {w.one_off_step} took {w.one_off_step_ms:.0f} ms, the "
                    f"{w.after_steps} steps after the window {w.after_mean_ms or 0:.1f} ms on "
                    "average and none as long: a one-off (a checkpoint, an epoch boundary, an "
                    "evaluation) weighs on the shares, so this verdict may not hold for the "
                    "rest of the run.",
            evidence=[r.Evidence(metric="one_off_step_over_after_mean",
                                 value=round((w.one_off_step_ms or 0) / (w.after_mean_ms or 1), 4),
                                 unit="ratio", threshold=th.ONE_OFF_STEP.value, comparison=">",
                                 fired=True, source=th.ONE_OFF_STEP.source)]))
    elif windows and windows[-1].representative is False:
        w = windows[-1]
        out.append(r.Finding(
            id="steps.window_not_steady", severity="warning",
            message=f"The profiled steps {w.first_step}-{w.last_step} ran at "
                    f"{w.profiled_mean_ms:.1f} ms per step, the {w.after_steps} steps after "
                    f"them at {w.after_mean_ms or 0:.1f} ms: the window was not steady state "
                    "(a DataLoader queue filled earlier, a warm-up), so this verdict may not "
                    "hold for the rest of the run.",
            evidence=[r.Evidence(metric="after_over_profiled_step_time",
                                 value=round((w.after_mean_ms or 0) / w.profiled_mean_ms, 4)
                                 if w.profiled_mean_ms else 0.0, unit="ratio",
                                 threshold=1 + w.threshold, comparison=">", fired=True,
                                 source=th.WINDOW_DRIFT.source)]))
    return out


def slice_finding(trace: Trace) -> r.Finding | None:
    """The window is the first seconds of one step (capture/cost_guard.py): say so, with the
    whole step's events, once per diagnosis."""
    meta = trace.meta.torchtriage
    if not meta.get("slice_s"):
        return None
    cost = meta.get("profile_cost") or {}
    whole = cost.get("events_per_step")
    events = f" a whole step records about {whole:,} profiler events, and" if whole else ""
    return r.Finding(
        id="capture.step_slice", severity="warning",
        message=f"The window is the first {meta['slice_s']:g} s of one step:{events} its "
                "profiler memory would pass profile_memory_share of the memory limit. The "
                "shares describe that part of the step; its step time is not the step's.")
