"""The second profiling window: one step where a recurring stall is due, profiled.

The first window is placed at steady state, between stalls; what a stall step does (a
DataLoader starting its workers, an evaluation, a save, the script's own periodic work) is in
no trace. Once the first window is done (its trace saved and checked: no profiler is open, and
none is started again in that process), the last ``SCAN_STEPS`` steps' wall times are scanned
for stalls as the whole-run view scans them (:func:`~torchtriage.analysis.stalls.find_stalls`,
profiled steps and the first two left out), then again at each step above the last scan's
stall threshold (a stall) and every ``RESCAN_EVERY`` steps, one subtraction a step otherwise;
stalls are grouped by the event that began in their step (the timeline's DataLoader
starts, evaluations and saves; or none), and when at least three of a group lie on a grid
of one period (:func:`on_a_grid`), the next one is due at the last one plus a whole number
of periods (unless a stall was due since the last one and did not come: they stopped). A
profiler then starts at the end of the step two before it (its
warm-up step prepares tracing), records the due step and saves it at its end
(``stall/rank<N>_<pid>.<ns>.pt.trace.json.gz`` in the run directory):
ops, kernels and ``record_function`` ranges, no shapes, memory or stacks, so that the
profiler adds little to the step. While it records, the timeline recorder names what it
patches with ranges of its own (capture/timeline.py). A step longer than
``stall_window_max_s`` is recorded that far (the profiler is stopped there, on the main
thread, by :mod:`~torchtriage.capture.step_cut`). When the due step did not stall, its trace
is not kept and the next one is predicted again (``ATTEMPTS`` in all). A loop off the main
thread, ``max_steps`` that ends before the due step, or a timing run: no second window.

What was done is written to the step timeline (``stall_windows``); the parent analyses the
trace (:mod:`~torchtriage.analysis.step_parts`) beside the whole-run view's stalls.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from torchtriage.analysis.stalls import find_stalls
from torchtriage.capture.quiet import profiler_call
from torchtriage.capture.step_cut import StepCut, on_main_thread
from torchtriage.capture.steps import StepClock
from torchtriage.capture.trace_file import write_trace
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import RunEvent, StallWindow

log = logging.getLogger(__name__)
STALL_DIR = "stall"  # in the run directory
RESCAN_EVERY = 64  # steps after which the threshold is scanned again
SCAN_STEPS = 512  # the most recent steps a scan reads
ATTEMPTS = 2  # windows placed, the first one's due step not having stalled
FIRST_STEPS = 2  # steps 1-2 start the run: not stalls (as the whole-run view)
TRACE_SUFFIX = ".pt.trace.json.gz"


class StallWindowRecorder:
    """Places, records and saves the second window (module docstring)."""

    def __init__(self, out: Path, clock: StepClock, profiled: list[int],
                 events: list[RunEvent], max_steps: int | None = None) -> None:
        self.out, self.clock, self.max_steps = out, clock, max_steps
        self.events = events  # the timeline's (capture/timeline.py), growing
        self.rank = 0
        self.profiled = profiled  # the timeline's profiled steps (the first window's)
        self.windows: list[StallWindow] = []
        self.recording = False  # a profiler is open (for the timeline's profiled steps)
        self.on_annotate: Any = None  # called with True/False as the profiler records
        self._prof: Any = None
        self._start_after: int | None = None  # the step after whose end the profiler starts
        self._cut: StepCut | None = None
        self._cut_at: float | None = None
        self._threshold_ms: float | None = None  # the last scan's stall threshold
        self._scanned_at = 0

    @property
    def current(self) -> StallWindow | None:
        return self.windows[-1] if self.windows else None

    def step_ended(self, steps: int, *, first_window_done: bool) -> None:
        """Step ``steps`` ended. Never raises into the training loop."""
        try:
            self._step_ended(steps, first_window_done)
        except Exception as exc:
            log.warning("torchtriage: the stall window failed (%s: %s); training goes on",
                        type(exc).__name__, exc)
            log.debug("torchtriage: the stall window failed", exc_info=True)
            self._abandon(f"{type(exc).__name__}: {exc}")

    def _step_ended(self, steps: int, first_window_done: bool) -> None:
        window = self.current
        if self._prof is not None:
            assert window is not None
            if steps == window.step - 1:
                self._record(window)
            elif steps >= window.step:
                self._save(window, steps)
            return
        if self._start_after is not None:
            if steps == self._start_after:
                self._start()
            elif steps > self._start_after:  # (missed: a boundary not seen)
                self._start_after = None
            return
        if (not first_window_done or len(self.windows) >= ATTEMPTS
                or (window is not None and window.stalled is not False)):
            return
        ends = self.clock.ends
        last_ms = (ends[-1] - ends[-2]) * 1e3 if len(ends) > 1 else 0.0
        if (self._threshold_ms is None or last_ms > self._threshold_ms
                or steps - self._scanned_at >= RESCAN_EVERY):
            self._place(steps)

    def _place(self, steps: int) -> None:
        """Scan the recent steps; when stalls recur at a period, arm the next one."""
        ends = self.clock.ends
        first = max(2, len(ends) - SCAN_STEPS + 1)
        numbers = list(range(first, len(ends) + 1))
        step_ms = [(ends[n - 1] - ends[n - 2]) * 1e3 for n in numbers]
        left_out = set(self.profiled) | set(range(1, FIRST_STEPS + 1)) | {
            w.step for w in self.windows}
        scan = find_stalls(numbers, step_ms, left_out=left_out, ratio=th.STALL_RATIO.value,
                           min_excess_ms=th.STALL_MIN_MS.value)
        if scan is None:
            return
        self._threshold_ms, self._scanned_at = scan.threshold_ms, steps
        found = self._recurring(scan.stalls, dict(zip(numbers, step_ms, strict=True)),
                                scan.median_ms)
        if found is None:
            return
        stalls, every = found
        if steps - stalls[-1] > every:
            return  # a stall was due and did not come: they stopped
        due = stalls[-1] + every
        while due < steps + 2:  # the profiler starts two steps before it
            due += every
        if self.max_steps is not None and due > self.max_steps:
            return
        if not on_main_thread():
            return  # (the cut runs on the main thread only)
        self.windows.append(StallWindow(step=due, period_steps=every,
                                        predicted_from=list(stalls[-6:]),
                                        threshold_ms=round(scan.threshold_ms, 3)))
        self._start_after = due - 2
        log.info("torchtriage: stalls every %d steps; profiling step %d", every, due)
        if steps == self._start_after:
            self._start()

    def _recurring(self, stalls: tuple[int, ...], ms_of: dict[int, float], median_ms: float
                   ) -> tuple[list[int], int] | None:
        """The stalls of one kind that recur at a period, and the period: grouped by the
        event that began in their step (a DataLoader start, an evaluation, a save: the
        timeline's), or none, so that a slow step of another kind does not break a period;
        of the groups that recur (:func:`on_a_grid`), the one whose stalls cost the most."""
        kinds = {e.step: e.kind for e in self.events[-512:]}
        groups: dict[str, list[int]] = {}
        for n in stalls:
            groups.setdefault(kinds.get(n, ""), []).append(n)
        best: tuple[float, list[int], int] | None = None
        for steps in groups.values():
            found = on_a_grid(steps)
            if found is None:
                continue
            cost = sum(ms_of[n] - median_ms for n in found[0])
            if best is None or cost > best[0]:
                best = (cost, *found)
        return (best[1], best[2]) if best is not None else None

    def _start(self) -> None:
        import torch

        self._start_after = None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1),
            record_shapes=False, profile_memory=False, with_stack=False)
        with profiler_call():
            self._prof.__enter__()  # the next step is its warm-up: tracing prepared
        self.recording = True

    def _record(self, window: StallWindow) -> None:
        """The due step starts: record it, for at most ``stall_window_max_s``."""
        with profiler_call():
            self._prof.step()
        self._annotate(True)
        self._cut = StepCut(lambda: self._stop_part_way(window),
                            seconds=th.STALL_WINDOW_MAX_S.value)
        self._cut.start()
        self._cut_at = time.perf_counter()

    def _stop_part_way(self, window: StallWindow) -> None:
        if self._prof is None:
            return
        window.cut_after_s = round(time.perf_counter() - (self._cut_at or 0.0), 3)
        self._annotate(False)
        with profiler_call():
            self._prof.stop()

    def _save(self, window: StallWindow, steps: int) -> None:
        """The due step ended: save its trace (or the recorded part), and judge it."""
        if self._cut is not None:
            self._cut.cancel()
            self._cut = None
        prof, self._prof = self._prof, None
        self._annotate(False)
        self.recording = False
        cut = window.cut_after_s is not None  # (then the profiler is stopped already)
        if not cut:
            with profiler_call():
                prof.step()  # stop tracing
        ms = self.clock.step_ms(window.step, window.step)
        window.step_ms = ms[0] if ms else None
        window.stalled = window.step_ms is not None and window.step_ms > window.threshold_ms
        if steps > window.step:  # a boundary was not seen: the trace spans more than one step
            window.error = f"the window ended after step {steps}, not {window.step}"
        self._write(prof, window, keep=bool(window.stalled) and window.error is None,
                    close=not cut)

    def _write(self, prof: Any, window: StallWindow, *, keep: bool, close: bool) -> None:
        """Export the trace (``keep``), then close the profiler (``close``: it was not
        stopped: torch's ``stop()`` may not run twice)."""
        folder = self.out / STALL_DIR
        name = f"rank{self.rank}_{os.getpid()}.{time.time_ns()}{TRACE_SUFFIX}"
        try:
            if keep:
                folder.mkdir(parents=True, exist_ok=True)
                with profiler_call():
                    write_trace(prof, folder / name)
                window.trace = f"{STALL_DIR}/{name}"
            elif window.error is None:
                window.error = (f"step {window.step} took {window.step_ms} ms, under the "
                                f"stall threshold {window.threshold_ms} ms: no stall there")
        except OSError as exc:
            window.error = f"the trace could not be written: {exc.strerror or exc}"
            log.warning("torchtriage: the stall window's %s", window.error)
        finally:
            if close:
                with profiler_call():
                    prof.__exit__(None, None, None)

    def finish(self) -> None:
        """At the end of the run: a window still recording is saved as far as it got."""
        window = self.current
        if self._prof is None or window is None:
            return
        if self._cut is not None:
            self._cut.cancel()
        prof, self._prof = self._prof, None
        self._annotate(False)
        self.recording = False
        window.partial = True
        began = self.clock.steps >= window.step - 1  # the due step began
        if not began:
            window.error = (f"training ended after step {self.clock.steps}, before step "
                            f"{window.step}")
        try:
            if window.cut_after_s is None:
                with profiler_call():
                    prof.stop()
            self._write(prof, window, keep=began, close=False)
        except Exception as exc:
            window.error = f"{type(exc).__name__}: {exc}"

    def _abandon(self, why: str) -> None:
        prof, self._prof = self._prof, None
        self._start_after = None
        self.recording = False
        self._annotate(False)
        if self.current is not None:
            self.current.error = why
        if prof is not None:
            try:
                with profiler_call():
                    prof.__exit__(None, None, None)
            except Exception:
                log.debug("torchtriage: closing the stall window failed", exc_info=True)

    def _annotate(self, on: bool) -> None:
        if self.on_annotate is not None:
            self.on_annotate(on)


def on_a_grid(steps: list[int], *, least: int = 3) -> tuple[list[int], int] | None:
    """Stall steps that lie on a grid of one period, and the period: the most common gap
    (at least 2, seen ``least - 1`` times; ties go to the shorter) between a stall and the
    next two, and the stalls a
    whole number of periods before the last one on it (or the one before it: a last stall
    off the grid, say), when at least ``least`` are. Unlike the whole-run view's
    :func:`~torchtriage.analysis.stalls.period`, an odd slow step among them (garbage
    collection, a page fault) does not break it: the next stall is predicted from few."""
    if len(steps) < least:
        return None
    gaps = Counter(b - a for i, a in enumerate(steps) for b in steps[i + 1:i + 3] if b - a >= 2)
    if not gaps:
        return None
    every = min(gaps, key=lambda g: (-gaps[g], g))
    if gaps[every] < least - 1:
        return None  # no spacing seen twice: three stalls at 21, 31 and 33 are no grid
    for last in steps[::-1][:2]:
        chain = [n for n in steps if n <= last and (last - n) % every == 0]
        if len(chain) >= least:
            return chain, every
    return None
