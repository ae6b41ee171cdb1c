"""Profile mode's window inside the training process: machine sampling from the first training
step, and a :class:`~torchtriage.capture.session.ProfileSession` with the run's schedule (one
trace and one ``run.rank<N>.json`` per rank), placed at steady state and checked to be.

Where the window starts: after ``skip`` steps, and at least after as many steps as a
DataLoader with workers has batches in flight (``num_workers x prefetch_factor``): those were
prepared before or during the first steps (and during any pause before training), so the
first steps run at compute speed even when the loader cannot keep up. Workers keep producing
while the queue drains, so past that point the window also waits until the batches waiting in
the queue stop falling (the queue is empty, or holds steady because the loader keeps up), at
most ``DRAIN_LIMIT`` times the queue. The profiler's own pauses (starting to trace, writing
the trace) let the workers refill the queue, so with such a loader the warm-up is longer by the
queue's size and the check below starts as many steps after the export. With ``max_steps`` the
window starts late enough to fit, no later.

Whether it was steady state: after the window, ``window_check_steps`` unprofiled steps are
timed and their mean host time is compared with the window's. They start no earlier than the
queue's size after the step that carries the trace export, and not while the queue is still
draining (at most ``DRAIN_LIMIT`` queues later): a pause during or after the window (a
validation pass, a checkpoint) refills the queue, and steps served from a refilled queue run at
compute speed, so a check timed there would bear out a window that was itself served from it.
Draining: over the last ``DRAIN_READINGS`` ready-queue readings the queue fell by at least 2
batches and still holds more than one (a queue that keeps up hovers near full; one that cannot
stays near empty). The mean is compared (means, not medians: a loader-bound job's steps alternate
fast and slow as its workers deliver in turn, and a median of five picks a side); when it is
more than ``window_drift`` slower, the window was not representative. Nor was it when one of
its steps is a one-off (``one_off_step``: far longer than the window's median, and no checked
step as long: a checkpoint or an epoch boundary inside the window; not where the ranks of a
job each decide alone). Its trace moves to
``superseded/`` and the window is profiled again from the next step (once); when training
ends before that window's first profiled step, the earlier window's trace is restored (its
check says it was not steady state) and the new warm-up-only trace is set aside. With
``stop_after_window`` the script is stopped once the final window is checked (``fix`` profile
rounds). In a torchrun job, rank 0 makes these decisions for every rank and publishes them
``LEAD_STEPS`` ahead; the others follow (capture/agreement.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from torchtriage.capture.agreement import (
    FOLLOW_WAIT_S,
    LEAD_STEPS,
    Decision,
    WindowAgreement,
    world_size,
)
from torchtriage.capture.steps import StepClock
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import MachineInfo, WindowCheck
from torchtriage.document import write_whole
from torchtriage.results.run import WINDOW_MARKER, Schedule, WindowMarker, decode_record

log = logging.getLogger(__name__)
CHECK_STEPS = int(th.WINDOW_CHECK_STEPS.value)
DRAIN_LIMIT = 4  # the window waits for a draining queue at most this many queues' steps
DRAIN_READINGS = 6  # ready-queue readings over which a draining queue falls by 2 or more
RETRIES = 1  # windows profiled again after one that was not steady state


class ProfilingWindow:
    def __init__(self, out: Path, rank: int, schedule: Schedule, skip: int,
                 device_memory: int | None, clock: StepClock,
                 loader_queue: Callable[[], int], max_steps: int | None = None,
                 stop_after_window: bool = False,
                 ready: Callable[[], list[int]] = list,
                 max_events: int | None = None, dataset_totals: Any = None) -> None:
        self.out, self.rank, self.schedule = out, rank, schedule
        self.skip, self.device_memory = skip, device_memory
        self.clock, self.loader_queue, self.ready = clock, loader_queue, ready
        self.max_steps, self.stop_after_window = max_steps, stop_after_window
        self.max_events = max_events  # the session's cost guard budget (None: default)
        self.dataset_totals = dataset_totals  # the Dataset's running totals, for the session
        self.session: Any = None  # the ProfileSession, once started
        self.sampler: Any = None  # the MachineSampler, once started
        self.checks: list[WindowCheck] = []  # one per window, the last one current
        self.done = False  # the final window is checked: nothing more to profile
        self._started_at = 0  # steps run when the current session started
        self._warmup = schedule.warmup  # the current session's warm-up steps
        self._reason = ""
        self._check_from: int | None = None  # the current window's first checked step, once set
        self._retries = RETRIES
        self._sampling_tried = False
        # the ranks of a torchrun job agree on their windows (capture/agreement.py); looked
        # up at the first step, not while the script imports
        self.agreement: WindowAgreement | None = None
        self._agreement_pending = True
        # a window decided but not started yet: after how many steps, why, and whether it
        # sets the current one aside (a window profiled again)
        self._pending: tuple[int, str, bool] | None = None
        self._windows = 0  # windows started so far: the index of the next one
        self._checked = False  # the current window's check is complete
        self._decided_at: float | None = None  # when a follower began to wait for rank 0
        self._stop_at: int | None = None  # done, stop_after_window: stop after this many steps

    def start_sampling(self) -> None:
        """Sample the machine from the first training step on (not during imports); once."""
        if self._sampling_tried:
            return
        from torchtriage.capture.machine import MachineSampler

        self._sampling_tried = True
        self.sampler = MachineSampler()
        try:
            self.sampler.start()
        except Exception:  # psutil missing or refused: the run goes on without samples
            self.sampler = None

    def stop_sampling(self) -> dict[str, Any] | None:
        """The machine summary, its CPU means over the last window's steady steps when they
        hold enough samples (capture/machine.py)."""
        return self.sampler.stop(self._steady_spans()) if self.sampler is not None else None

    def _steady_spans(self) -> list[tuple[float, float]]:
        """``time.perf_counter()`` spans of the last window's profiled steps and of the
        unprofiled steps its check timed (not the export between them): each from the end of
        the step before its first to the end of its last. Empty before any window ran."""
        last = self.checks[-1] if self.checks else None
        runs = ([(last.first_step, last.last_step)] if last else
                [s for s in (self.active_steps(),) if s is not None])
        if last is not None and last.after_first_step and last.after_steps:
            runs.append((last.after_first_step, last.after_first_step + last.after_steps - 1))
        return [span for a, b in runs if (span := self.clock.span(a, b)) is not None]

    def start_step(self, steps: int) -> tuple[int, str]:
        """After how many steps the window starts, and why there (asked at each step until it
        starts: a draining queue moves it on)."""
        start = self.skip
        reason = f"--skip {self.skip}" if self.skip else "the first step"
        queue = self.loader_queue()
        if queue > start:
            start = queue
            reason = (f"a DataLoader queue of {queue} batches (num_workers x prefetch_factor) "
                      "drains first")
        if queue and steps >= start and self._draining() and steps < start + DRAIN_LIMIT * queue:
            start = steps + 1
            reason += " (and the queue was still draining)"
        length = self.schedule.steps + queue  # the warm-up grows by the queue, see above
        if self.agreement is not None and self.agreement.leader:
            length += LEAD_STEPS  # a job's leader starts it that much later
        if self.max_steps is not None and start > self.max_steps - length:
            start = max(self.max_steps - length, self.skip, 1)
            reason += f" (as far as --steps {self.max_steps} allows)"
        return start, reason

    def _draining(self) -> bool:
        """Whether the batches waiting in the queue are still falling (see the module
        docstring)."""
        ready = self.ready()[-DRAIN_READINGS:]
        return len(ready) == DRAIN_READINGS and ready[-1] > 1 and ready[0] - ready[-1] >= 2

    def step_ended(self, steps: int, may_start: bool = True) -> bool:
        """``steps`` training steps ran. Returns True when the script should stop now (the
        final window is checked and ``stop_after_window``). ``may_start=False``: another step
        ends at this same instant (see StepDetector), so the session starts there instead (a
        probe started here would see an empty step)."""
        if self.done:  # a job's ranks stop together, after the step rank 0 named
            return self._stop_due(steps)
        if self._agreement_pending:
            self._agreement_pending = False
            self.agreement = WindowAgreement.for_job(self.out, self.rank)
        decision = self._follow(steps) if self._following() and self._pending is None else None
        if self._pending is not None:
            after, reason, again = self._pending
            if steps >= after and may_start:
                self._pending = None
                self._start_session(steps, reason, self._supersede() if again else None)
            return False
        if self.session is None:
            if not self._following():  # a follower waits for rank 0's decision
                start, reason = self.start_step(steps)
                if steps >= start and may_start:
                    self._decide(steps, reason, again=False)
            return False
        if self.session.trace_path is None:
            if self.session.save_error is None and self.session.refused is None:
                self.session.step()
                return False
            # a full disk, or a step too large to record: no window to check, none again
            if not self._following():
                return self._last_window(steps, marker=False)
            if not self._checked:  # nothing to check: the leader says when to stop
                self._checked, self._decided_at = True, time.monotonic()
            return self._follower_done(decision, steps)
        self._await_check_start(steps)
        if not self._checked:
            check = self._check(steps, final=False)
            if check is None:
                return False  # still timing the steps after the window
            self.checks.append(check)
            self._checked, self._decided_at = True, time.monotonic()
        if self._following():
            return self._follower_done(decision, steps)
        check = self.checks[-1]
        if check.representative is False and self._retries > 0:
            self._retries -= 1
            self._decide(steps, f"profiled again: the window at steps {check.first_step}"
                                f"-{check.last_step} was not steady state", again=True)
            return False
        return self._last_window(steps)

    def _following(self) -> bool:
        return self.agreement is not None and not self.agreement.leader

    def _decide(self, steps: int, reason: str, *, again: bool) -> None:
        """Start a window (``again``: after setting the current one aside) after this step,
        or, for a job's leader, publish it for ``LEAD_STEPS`` later and start it then."""
        if self.agreement is not None and self.agreement.leader:
            after = steps + LEAD_STEPS
            if self.max_steps is not None:  # no later than --steps allows, if it can be helped
                latest = self.max_steps - self.schedule.steps - self.loader_queue()
                after = max(steps + 1, min(after, latest))
            reason += "; rank 0 decides for the job's ranks"
            self.agreement.publish(self._windows, after, reason)
            self._pending = (after, reason, again)
            return
        self._start_session(steps, reason, self._supersede() if again else None)

    def _follow(self, steps: int) -> Decision | None:
        """A follower between windows: rank 0's decision on the next window (its start is
        then pending), or None while there is none; after waiting ``FOLLOW_WAIT_S`` past the
        point where its own rules would have acted, it decides alone from then on (see
        capture/agreement.py)."""
        assert self.agreement is not None
        if self.session is not None and self.session.trace_path is None \
                and self.session.save_error is None and self.session.refused is None:
            return None  # profiling: nothing to decide
        decision = self.agreement.decision(self._windows)
        if decision is None:
            if self._decided_at is None and self.session is None \
                    and steps >= self.start_step(steps)[0]:
                self._decided_at = time.monotonic()
            if self._decided_at is not None and \
                    time.monotonic() - self._decided_at > FOLLOW_WAIT_S:
                log.warning("torchtriage: rank %d heard no profiling decision from rank 0 in "
                            "%.0f s; it decides alone", self.rank, FOLLOW_WAIT_S)
                self.agreement = None
            return None
        again = self.session is not None
        # rank 0 decided first: this rank's check as it stands, when a new window starts, or
        # the job stops now; with no further window and no stop, the check goes on
        cut = not decision.last or (self.stop_after_window and steps >= decision.after_steps)
        if again and not self._checked and cut:
            check = self._check(steps, final=True)
            if check is not None:
                self.checks.append(check)
            self._checked = True
        if decision.last:
            return decision
        if again:
            self._retries -= 1
        after, reason, _ = decision
        if steps > after:
            log.warning("torchtriage: rank %d learned of rank 0's window (after step %d) at "
                        "step %d; it starts now", self.rank, after, steps)
        self._pending = (after, reason, again)
        return decision

    def _last_window(self, steps: int, *, marker: bool = True) -> bool:
        """No further window (``marker``: the last one was checked; else its trace could not
        be written, and the next write would fail alike). A job's leader says so, and with
        ``stop_after_window`` names the step after which every rank stops, ``LEAD_STEPS``
        ahead: a rank that stopped alone would leave the others waiting in their next
        collective."""
        stop_at = steps
        if self.agreement is not None:
            if self.stop_after_window:
                stop_at += LEAD_STEPS
            self.agreement.publish(self._windows, stop_at, last=True)
        return self._finish_window(stop_at, steps, marker=marker)

    def _follower_done(self, decision: Decision | None, steps: int) -> bool:
        """A follower whose window is checked (or lost) ends when rank 0 says there is no
        further window, and stops after the step it names."""
        if decision is None or not decision.last:
            return False
        return self._finish_window(decision.after_steps, steps)

    def _finish_window(self, stop_at: int, steps: int, *, marker: bool = True) -> bool:
        """Nothing more to profile: the marker for the parent (``marker``), and whether to
        stop now (``stop_after_window``: after ``stop_at`` steps)."""
        self.done = True
        if marker:  # the parent may diagnose it
            from torchtriage.capture.machine import cpu_facts

            # the sampler read them at the first step: not again on a training step
            static = self.sampler.static if self.sampler is not None else None
            facts = msgspec.convert(cpu_facts(static), MachineInfo)
            # whole or not at all: the parent polls for it and reads it as soon as it exists
            write_whole(self.out / WINDOW_MARKER.format(rank=self.rank),
                        msgspec.json.encode(WindowMarker(checks=self.checks, machine=facts)))
        self._stop_at = stop_at if self.stop_after_window else None
        return self._stop_due(steps)

    def _stop_due(self, steps: int) -> bool:
        """Whether the script stops now: done, ``stop_after_window``, at its stop step."""
        return self._stop_at is not None and steps >= self._stop_at

    def finish_checks(self, steps: int) -> None:
        """At the end of the run: a window whose check was cut short is recorded as is."""
        if not self.done and not self._checked and self.session is not None \
                and self.session.trace_path is not None:
            check = self._check(steps, final=True)
            if check is not None:
                self.checks.append(check)

    def cut_short_after_a_superseded_window(self, steps: int) -> bool:
        """Whether training ended (after ``steps`` steps) before the window profiled again
        reached its first profiled step: its trace would hold warm-up steps only, and the
        earlier window, set aside as not steady state, is the one there is."""
        if self.done or self.session is None or self._retries == RETRIES:
            return False
        first, _ = self._window()
        return steps < first

    def restore_superseded(self, trace: Path | None, record: Path) -> Path | None:
        """After :meth:`cut_short_after_a_superseded_window` and the session's close: the
        earlier window's trace moves back from ``superseded/``, the new warm-up trace
        (``trace``) goes there instead, and the run record at ``record`` names the restored
        trace. Returns it (None when there is none: nothing moves). The earlier window's
        check, not steady state, stays the last one."""
        aside = self.out / "superseded"
        earlier = sorted(aside.glob(f"rank{self.rank}_*"), key=lambda p: p.stat().st_mtime)
        if not earlier:
            return None
        if trace is not None and trace.exists():
            trace.rename(aside / trace.name)
        restored = earlier[-1].rename(self.out / earlier[-1].name)
        written = decode_record(record.read_bytes())
        msgspec.structs.replace(written, trace=restored.name).write(record)
        return restored

    def _window(self) -> tuple[int, int]:
        # the session's schedule: its cost guard may have moved or shortened the window
        wait, warmup, active = self.schedule.wait, self._warmup, self.schedule.active
        if self.session is not None:
            wait, warmup, active = self.session.wait, self.session.warmup, self.session.active
        first = self._started_at + wait + warmup + 1
        return first, first + active - 1

    def active_steps(self) -> tuple[int, int] | None:
        """The current session's first and last profiled (active) step, counted from the first
        training step; None before a session started."""
        return self._window() if self.session is not None else None

    def steps_needed(self) -> int:
        """Steps a run needs for one whole window when profiling starts as early as it may
        (after ``skip`` steps, at least one): those, the schedule and a DataLoader's queue, and
        in a job of several ranks the step rank 0's decision needs to reach the others."""
        lead = 1 if world_size() > 1 else 0
        return max(self.skip, 1) + self.schedule.steps + self.loader_queue() + lead

    def _earliest_check_step(self) -> int:
        # last + 1 carries the trace export, during which the workers refill their queue
        return self._window()[1] + 2 + self.loader_queue()

    def _await_check_start(self, steps: int) -> None:
        """After step ``steps`` of a profiled window's session: fix the first step of its check
        once the export's refill has had its steps and the queue no longer drains (see the
        module docstring)."""
        if self._check_from is not None:
            return
        earliest = self._earliest_check_step()
        if steps < earliest - 1:
            return
        if not self._draining() or steps >= earliest - 1 + DRAIN_LIMIT * self.loader_queue():
            self._check_from = steps + 1

    def _check(self, steps: int, *, final: bool) -> WindowCheck | None:
        first, last = self._window()
        after_first = self._check_from
        if after_first is None:
            if not final:
                return None
            after_first = self._earliest_check_step()
        if steps < after_first + CHECK_STEPS - 1 and not final:
            return None
        inside = self.clock.step_ms(first, last)
        after = self.clock.step_ms(after_first, min(steps, after_first + CHECK_STEPS - 1))
        if not inside:
            return None
        profiled = statistics.fmean(inside)
        check = WindowCheck(first_step=first, last_step=last, skipped_steps=self._started_at,
                            skip_reason=self._reason, profiled_mean_ms=round(profiled, 3),
                            threshold=th.WINDOW_DRIFT.value)
        if len(after) >= CHECK_STEPS:
            later = statistics.fmean(after)
            check.after_mean_ms, check.after_steps = round(later, 3), len(after)
            check.after_max_ms = round(max(after), 3)
            check.after_first_step = after_first
            check.representative = th.window_holds(profiled, later)
            # one process, or a job whose ranks agree: a rank of several deciding alone would
            # move its window apart from the others' for one slow step of its own
            odd = th.one_off_step(inside, after) if self._decides_for_job() else None
            if odd is not None:
                check.one_off_step = max(first, 2) + odd
                check.one_off_step_ms = inside[odd]
                check.representative = False
        return check

    def _decides_for_job(self) -> bool:
        return world_size() == 1 or self.agreement is not None

    def _supersede(self) -> Any:
        """Close the current session and keep its trace aside, in ``superseded/``; returns the
        closed session."""
        session, self.session = self.session, None
        aside = self.out / "superseded"
        aside.mkdir(parents=True, exist_ok=True)
        # its run record goes aside too: in the run directory, rank 0 (waiting for every
        # rank's record) would take it for this rank's final one and diagnose without its trace
        session.record_name = str(Path("superseded") / session.record_name)
        try:
            session.__exit__(None, None, None)
        finally:
            if session.trace_path is not None and session.trace_path.exists():
                shutil.move(str(session.trace_path), aside / session.trace_path.name)
        return session

    def _start_session(self, steps: int, reason: str, previous: Any = None) -> None:
        """Open a session now. A window profiled again (``previous``: the first one's session)
        keeps the first one's cost decisions and probes nothing: its probe would start at the
        step boundary where the first window's profiler stopped (see capture/session.py)."""
        from torchtriage.capture.session import ProfileSession

        self._started_at, self._reason = steps, reason
        self._check_from = None
        self._checked, self._decided_at = False, None
        self._windows += 1
        # tracing starts with a pause in which a worker DataLoader refills its queue
        self._warmup = self.schedule.warmup + self.loader_queue()
        settings: dict[str, Any] = {"warmup": self._warmup, "active": self.schedule.active,
                                    "max_events": self.max_events}
        if previous is not None:
            settings.update(warmup=min(previous.warmup, self._warmup), active=previous.active,
                            record_shapes=previous.record_shapes,
                            with_stack=previous.with_stack,
                            profile_memory=previous.profile_memory, max_events=0)
        self.session = ProfileSession(
            self.out, analyze=False, device_memory=self.device_memory,
            worker_name=f"rank{self.rank}_{os.getpid()}", record_name=f"run.rank{self.rank}.json",
            wait=self.schedule.wait, **settings)
        if previous is not None:
            self.session.cost = previous.cost
        self.session.dataset_totals = self.dataset_totals
        self.session.__enter__()
