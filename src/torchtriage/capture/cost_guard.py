"""The profiling cost guard's arithmetic: fit a window to the events one probed step recorded.

Algorithm (:func:`fit_window`), before anything is recorded; the first warm-up step only
prepares tracing (it follows the probe), so a window records ``warmup - 1 + active`` steps:

1. Events: when ``events per step x recorded steps`` passes the budget
   (:data:`~torchtriage.diagnosis.thresholds.PROFILE_EVENTS_BUDGET`), recorded warm-up steps go
   first, then active ones down to :data:`MIN_ACTIVE`; a window still over it records ops only
   (``record_shapes``, ``with_stack`` and ``profile_memory`` off).
2. Memory: the window's profiler memory, ``events x``
   :data:`~torchtriage.diagnosis.thresholds.PROFILE_BYTES_PER_EVENT`, is held against
   :data:`~torchtriage.diagnosis.thresholds.PROFILE_MEMORY_SHARE` of the memory limit (80% of
   the memory available, or ``TORCHTRIAGE_MEMORY_LIMIT``). Above it the window is one active
   step, ops only. A step that alone passes it is recorded in part: its first ``slice_s``
   seconds, the probed step's wall time scaled by the share of its events that fit, halved
   (:data:`SLICE_MARGIN`: events do not come at an even pace through a step), after which the
   session stops the profiler mid-step (:mod:`torchtriage.capture.step_cut`). Where that
   cannot be done (no probe time, a training loop off the main thread) the step is not
   recorded (``refused`` says why in one line), since the kernel would otherwise kill the
   training for want of memory.

The result says what to record and carries the :class:`~torchtriage.results.run.ProfileCost`
that the run record and the trace keep.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtriage.diagnosis import thresholds as th
from torchtriage.results.run import ProfileCost
from torchtriage.units import format_bytes

MIN_ACTIVE = 2  # the event budget never shortens the active steps below this
SLICE_MARGIN = 0.5  # of the share of a step's events that fit: a slice's length
RECORDING_OPTIONS = ("record_shapes", "with_stack", "profile_memory")


@dataclass(frozen=True)
class WindowFit:
    """What the window records after the guard."""

    warmup: int
    active: int
    drop: tuple[str, ...]  # recording options to turn off (of those that were on)
    refused: str | None  # why nothing is recorded (one line), or None
    slice_s: float  # the active step is cut after this many seconds (0: whole steps)
    cost: ProfileCost


def fit_window(events: int, *, warmup: int, active: int, options: dict[str, bool],
               budget: int, memory_limit: tuple[int, str] | None,
               probe_s: float = 0.0, probe_cut: bool = False) -> WindowFit:
    """Fit a ``warmup`` + ``active`` window to one probed step's ``events``.

    Args:
        events: profiler op events of the probed step.
        warmup, active: the schedule's steps (``warmup >= 1``: the first only prepares).
        options: the recording options that are on, by name (:data:`RECORDING_OPTIONS`).
        budget: events a window may record.
        memory_limit: bytes torchtriage may use and where that figure comes from, or None
            (the memory is not assessed).
        probe_s: the probed step's wall time, or 0 where a step cannot be cut (no slice).
        probe_cut: the probe was stopped part-way through its step, when the process had
            grown by the memory share: ``events`` in ``probe_s`` are a lower bound, and the
            window is a slice whatever they come to (the step is longer than the probe saw).

    Returns:
        The :class:`WindowFit`: steps, options to drop, a refusal, and the cost record.
    """
    planned = warmup + active
    prepared = 1 if warmup else 0
    per_step = max(events, 1)
    actions: list[str] = []
    on = [name for name in RECORDING_OPTIONS if options.get(name)]
    drop: list[str] = []

    def ops_only() -> None:
        new = [name for name in on if name not in drop]
        if new:
            drop.extend(new)
            actions.append(f"{', '.join(new)} turned off")

    if per_step * (planned - prepared) > budget:
        fit = budget // per_step
        fitted_active = min(active, max(MIN_ACTIVE, fit))
        fitted_warmup = prepared + min(warmup - prepared, max(fit - fitted_active, 0))
        if (fitted_warmup, fitted_active) != (warmup, active):
            actions.append(f"window shortened to {fitted_warmup} warm-up + {fitted_active} "
                           f"active step(s) from {warmup} + {active}")
            warmup, active = fitted_warmup, fitted_active
    recorded = warmup - prepared + active
    if per_step * recorded > budget:
        ops_only()
    refused = None
    slice_s = 0.0
    allowed = 0
    step_bytes = int(per_step * th.PROFILE_BYTES_PER_EVENT.value)
    if memory_limit is not None:
        limit, source = memory_limit
        allowed = int(limit * th.PROFILE_MEMORY_SHARE.value)
        share = f"{th.PROFILE_MEMORY_SHARE.value:.0%} of {format_bytes(limit)} ({source})"
        if step_bytes * recorded > allowed or probe_cut:
            ops_only()
            step = f"{'at least' if probe_cut else 'about'} {format_bytes(step_bytes)}"
            window = format_bytes(step_bytes * recorded)
            if step_bytes <= allowed and not probe_cut:
                actions.append(f"one active step recorded: {recorded} would take about "
                               f"{window} of profiler memory, more than {share}")
                warmup, active, recorded = prepared, 1, 1
            elif probe_s > 0:
                part = min(allowed / max(step_bytes, 1) * SLICE_MARGIN, 1.0)
                slice_s = round(probe_s * part, 3)
                seen = "the probe ran before it was stopped" if probe_cut else "probed"
                actions[:] = ([f"{', '.join(drop)} turned off"] if drop else []) + [
                    f"one step would take {step} of profiler memory, more than {share}: "
                    f"its first {slice_s:g} s recorded (about {part:.0%} of the "
                    f"{probe_s:.1f} s {seen})"]  # (the shortened window before: moot)
                warmup, active, recorded = prepared, 1, 1
                per_step = max(int(per_step * part), 1)
                step_bytes = int(per_step * th.PROFILE_BYTES_PER_EVENT.value)
            else:
                refused = (f"one training step records about {per_step:,} profiler events, "
                           f"{step} of profiler memory, more than {share}: not "
                           "profiled (the training went on); run fewer ops per step to "
                           "profile it (a shorter sequence, fewer closure evaluations), or "
                           "give it more memory")
                actions[:] = [f"not recorded: one step would take {step} of profiler "
                              f"memory, more than {share}"]  # (what was fitted before: moot)
                drop.clear()
                recorded = 0
    estimate = per_step * recorded
    per_event = (th.PROFILE_EXPORT_US_PER_OP_EVENT if set(drop) == set(on) else
                 th.PROFILE_EXPORT_US_PER_EVENT).value  # ops only, or shapes/memory kept
    export_s = round(estimate * per_event / 1e6, 1)
    if estimate > budget:
        actions.append(f"the export may still take about {export_s:g} s "
                       f"({estimate:,} events at most)")
    cost = ProfileCost(events_per_step=events, budget=budget, planned_steps=planned,
                       recorded_steps=recorded, estimated_events=estimate,
                       estimated_export_s=export_s, dropped=list(drop),
                       estimated_bytes=step_bytes * recorded, memory_allowed_bytes=allowed,
                       slice_s=slice_s, probe_cut=probe_cut,
                       action="; ".join(actions) or "none")
    return WindowFit(warmup=warmup, active=active, drop=tuple(drop), refused=refused,
                     slice_s=slice_s, cost=cost)
