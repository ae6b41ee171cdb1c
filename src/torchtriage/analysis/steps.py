"""Step windows: where each training step starts and ends in a trace.

Sources, in order of preference (the one used is reported as ``source``):

``profiler_step``
    host-side ``ProfilerStep#N`` ranges written by ``torch.profiler.profile.step()``. The device
    copies (``gpu_user_annotation``) are ignored.
``optimizer_step``
    no step markers: windows run from the end of one ``Optimizer.step#...`` to the end of the next.
``window``
    neither: the whole trace is one step.

Steps listed by torchtriage's own capture as warm-up or partial (trace metadata ``torchtriage``)
are kept in ``excluded`` with the reason, and left out of statistics as long as one step remains
(:func:`leave_out`, which the diagnosis also uses for a one-off step its window check found).
So is a ``ProfilerStep#N`` of zero length (:data:`ZERO_LENGTH`): its marker recorded no time,
so its step cannot be measured (``trace/quality.py`` has clamped a negative one to 0).
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchtriage.trace.model import HOST_KINDS, EventKind, Trace

_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d{1,18})$")  # (longer: no step number, no int64)
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
ZERO_LENGTH = "zero length: its ProfilerStep marker recorded no time"


class StepWindows(msgspec.Struct, frozen=True):
    """The analysed steps (sorted by start) and the ones left out."""

    source: str  # "profiler_step" | "optimizer_step" | "window"
    numbers: np.ndarray  # int64 step numbers
    start: np.ndarray  # float64 µs
    end: np.ndarray  # float64 µs
    main_thread: int  # thread id that holds the steps (-1 when unknown)
    excluded: dict[int, str] = msgspec.field(default_factory=dict)  # step number -> reason

    def __len__(self) -> int:
        return int(self.numbers.size)

    @property
    def wall(self) -> np.ndarray:
        return self.end - self.start


def find_steps(trace: Trace) -> StepWindows:
    """Step windows of ``trace``, falling back as described in the module docstring."""
    ev = trace.events
    host = np.isin(ev.kind, HOST_KINDS)
    step_no = np.full(len(ev.names), -1, dtype=np.int64)
    for i, name in enumerate(ev.names):
        m = _PROFILER_STEP.match(name)
        if m:
            step_no[i] = int(m.group(1))
    rows = np.flatnonzero(host & (step_no[ev.name_id] >= 0))
    if rows.size:
        numbers = step_no[ev.name_id[rows]]
        # One range per step number (the host copy); keep the first if a number repeats.
        _, first = np.unique(numbers, return_index=True)
        rows = rows[first]
        order = np.argsort(ev.ts[rows], kind="stable")
        rows = rows[order]
        windows = StepWindows(
            source="profiler_step",
            numbers=step_no[ev.name_id[rows]],
            start=ev.ts[rows].copy(),
            end=ev.end[rows],
            main_thread=int(np.bincount(ev.thread_id[rows]).argmax()),
        )
        return _apply_exclusions(windows, trace)

    opt = np.flatnonzero(host & ev.name_mask(lambda n: n.startswith(OPTIMIZER_STEP_PREFIX)))
    if opt.size >= 2:
        ends = np.sort(ev.end[opt])
        return StepWindows(
            source="optimizer_step",
            numbers=np.arange(1, ends.size, dtype=np.int64),
            start=ends[:-1],
            end=ends[1:],
            main_thread=int(np.bincount(ev.thread_id[opt]).argmax()),
        )

    is_span = ev.kind == EventKind.TRACE_SPAN
    real = ~is_span if (~is_span).any() else np.ones(len(ev), dtype=bool)
    return StepWindows(
        source="window",
        numbers=np.zeros(1, dtype=np.int64),
        start=np.array([ev.ts[real].min()]),
        end=np.array([ev.end[real].max()]),
        main_thread=-1,
    )


def _apply_exclusions(windows: StepWindows, trace: Trace) -> StepWindows:
    """Drop zero-length steps, then partial steps, then warm-up steps, each only if some step
    remains."""
    meta = trace.meta.torchtriage
    for key, reason in ((None, ZERO_LENGTH),
                        ("partial_steps", "partial: the loop ended inside this step"),
                        ("warmup_steps", "warm-up")):
        if key is None:
            numbers = windows.numbers[windows.end <= windows.start]
        else:
            numbers = np.asarray(sorted({int(n) for n in meta.get(key, []) or []}))
        windows = leave_out(windows, numbers, reason)
    return windows


def leave_out(windows: StepWindows, numbers, reason: str) -> StepWindows:
    """``windows`` without the steps numbered ``numbers``, which are kept in ``excluded`` with
    ``reason``; unchanged when that would leave no step."""
    drop = np.isin(windows.numbers, np.asarray(numbers, dtype=np.int64))
    if not drop.any() or drop.all():
        return windows
    keep = ~drop
    return StepWindows(
        source=windows.source,
        numbers=windows.numbers[keep],
        start=windows.start[keep],
        end=windows.end[keep],
        main_thread=windows.main_thread,
        excluded={**windows.excluded, **{int(n): reason for n in windows.numbers[drop]}},
    )
