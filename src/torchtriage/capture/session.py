"""``torchtriage.profile``: torch.profiler with the seed's defaults, a run directory and a verdict.

Usage::

    with torchtriage.profile("runs/exp1") as prof:
        for batch in loader:
            train_step(batch)
            prof.step()
    print(prof.diagnosis.render_text())

Schedule: ``wait`` steps unprofiled, then ``warmup`` + ``active`` steps recorded, saved once.
Unlike torch.profiler's own warm-up, warm-up steps are *recorded* and marked as warm-up in the
trace metadata: the analysis leaves them out of the statistics, but a loop that ends during
warm-up still leaves a trace instead of nothing (torch.profiler discards warm-up events). The
exception is the first warm-up step after the cost guard's probe (below), which only prepares.
A loop that ends inside the active window is saved too, and the unfinished last step is marked
partial. The profiler's own ``step()`` calls (including the one that exports the trace) are
timed separately and never counted in step times.
Profiling cost guard: an op-heavy step (LBFGS evaluating its closure a dozen times) can make a
trace whose export takes minutes and gigabytes. The last unprofiled step (``wait >= 1``) is
probed (:mod:`~torchtriage.capture.cost_probe`: ops only, stopped part-way when the process
grows by the window's memory share; the next step too, unprofiled, when it recorded nothing),
its events counted,
and the window fitted to them before anything is recorded (:mod:`~torchtriage.capture.cost_guard`:
shorter, then ops only, then one active step for the memory limit, and when one step alone
would pass that, the step's first ``slice_s`` seconds: the profiler is stopped there, on the
main thread (:mod:`~torchtriage.capture.step_cut`), the trace saved with the step marked
partial and ``slice_s`` in its metadata, and later steps only counted; a loop off the main
thread is not recorded, ``error`` says why, and training goes on, rather than the kernel
killing it for want of memory). What the guard estimated and did is logged and written to the
run record (``profile_cost``).
The probe and the window never change hands inside one step boundary: a profiler stopped and
another started in the same ``record_function`` range (the optimizer step's own, where the
step hook runs) makes the range's exit write into the stopped profiler's freed events, a
use-after-free that crashes the training process now and then. So the step that follows the
probe only *prepares* tracing (torch.profiler's own warm-up, unrecorded) and recording starts
one boundary later; with no warm-up steps the window waits one step more instead, and a
probe that saw nothing is repeated after a step's gap.
While the session is open, each call of a closure passed to ``optimizer.step(closure)`` runs in
a range of its own (:mod:`torchtriage.capture.closures`), so that its forward and backward are
not counted as optimizer time.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import msgspec

from torchtriage.capture.cost_guard import RECORDING_OPTIONS, fit_window
from torchtriage.capture.cost_probe import CostProbe, ProbeCount
from torchtriage.capture.dataset import window_figures
from torchtriage.capture.live_memory import live_cpu_tensor_bytes
from torchtriage.capture.oom import out_of_memory_report
from torchtriage.capture.profiler_results import free_results as _free_results
from torchtriage.capture.profiler_results import memory_limit as _memory_limit
from torchtriage.capture.quiet import StderrFilter
from torchtriage.capture.quiet import profiler_call as _profiler_call
from torchtriage.capture.step_cut import StepCut, on_main_thread
from torchtriage.capture.trace_file import write_trace
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import OutOfMemory
from torchtriage.errors import CaptureError, TorchtriageError
from torchtriage.results.run import (
    ProfileCost,
    ProfilerStepTime,
    RunRecord,
    Schedule,
    StepTime,
)
from torchtriage.units import parse_bytes

TRACE_SUFFIX = ".pt.trace.json.gz"
log = logging.getLogger(__name__)
DEFAULT_SCHEDULE = Schedule()
META_KEY = "torchtriage"


def default_run_dir() -> Path:
    return Path("torchtriage_runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def is_out_of_memory(exc: BaseException | None) -> bool:
    """True for CUDA/CPU out-of-memory errors raised by torch."""
    if exc is None:
        return False
    import torch

    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t)
    if oom_types and isinstance(exc, oom_types):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text
                                              or "can't allocate memory" in text)


class ProfileSession:
    """A profiling session; create it with :func:`profile`."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        *,
        wait: int = DEFAULT_SCHEDULE.wait,
        warmup: int = DEFAULT_SCHEDULE.warmup,
        active: int = DEFAULT_SCHEDULE.active,
        record_shapes: bool = True,
        profile_memory: bool = True,
        with_stack: bool = False,
        device_memory: int | str | None = None,
        analyze: bool = True,
        quiet: bool = True,
        top: int = 10,
        worker_name: str | None = None,
        record_name: str = "run.json",
        extra_record: dict[str, Any] | None = None,
        max_events: int | None = None,
    ) -> None:
        if wait < 0 or warmup < 0 or active < 1:
            raise TorchtriageError(
                f"invalid schedule wait={wait} warmup={warmup} active={active}: "
                "need wait >= 0, warmup >= 0, active >= 1")
        self.run_dir = Path(out_dir) if out_dir is not None else default_run_dir()
        self.wait, self.warmup, self.active = wait, warmup, active
        self.record_shapes, self.profile_memory, self.with_stack = (
            record_shapes, profile_memory, with_stack)
        self.device_memory = parse_bytes(device_memory) if device_memory is not None else None
        self.analyze, self.quiet, self.top = analyze, quiet, top
        self.worker_name = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        self.record_name = record_name
        # the cost guard's budget (None: the default; 0: no guard)
        self.max_events = (int(th.PROFILE_EVENTS_BUDGET.value) if max_events is None
                           else max_events)
        self.cost: ProfileCost | None = None  # what the guard estimated and did
        self._probe: CostProbe | None = None  # the probed step's, while it runs
        self._probe_retried = False
        self._prepare_only: int | None = None  # the step after the probe: prepared, unrecorded
        # why no window is recorded: one step alone would pass the memory share (cost_guard)
        self.refused: str | None = None
        self._slice_s = 0.0  # the active step is stopped this far in (cost_guard; 0: whole)
        self._cut: StepCut | None = None  # the timer that stops it
        self._sliced = False  # it was stopped: the profiler is done, steps are only counted
        # the Dataset's running totals (capture/dataset.py; torchtriage run): the window's
        # share goes into the trace metadata as "dataset"
        self.dataset_totals: Any = None
        self._dataset_start: Any = None
        # Filled by the caller (e.g. the zero-code runner) and merged into the run record:
        # values of RunRecord fields, by field name.
        self.extra_record: dict[str, Any] = extra_record if extra_record is not None else {}
        self.trace_path: Path | None = None
        self.save_error: str | None = None  # why the trace could not be written
        self.error: str | None = None
        self.out_of_memory: OutOfMemory | None = None  # the block raised OutOfMemoryError
        self._diagnosis = None
        self._prof = None
        self._steps_run = 0
        self._step_ms: list[tuple[int, float]] = []  # (step number, user time ms)
        self._profiler_ms: list[tuple[int, float]] = []  # time inside prof.step() per step
        self._last_return = 0.0

    # --- schedule -------------------------------------------------------------------------

    @property
    def last_recorded_step(self) -> int:
        return self.wait + self.warmup + self.active - 1

    def _action(self, step: int):
        from torch.profiler import ProfilerAction

        if step == self.last_recorded_step + 1:
            self._count_live_memory_at_the_end()
        if step < self.wait or self.refused:
            return ProfilerAction.NONE
        if step == self._prepare_only:
            return ProfilerAction.WARMUP
        if step < self.last_recorded_step:
            return ProfilerAction.RECORD
        if step == self.last_recorded_step:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE

    # --- context manager ------------------------------------------------------------------

    def __enter__(self) -> ProfileSession:
        import torch
        from torch.profiler import ProfilerActivity

        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TorchtriageError(f"cannot create run directory {self.run_dir}: "
                                   f"{exc.strerror or exc}") from None
        activities = [ProfilerActivity.CPU]
        self._cuda = torch.cuda.is_available()
        if self._cuda:
            activities.append(ProfilerActivity.CUDA)
        self._activities = activities
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=self._action,
            on_trace_ready=self._save,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self._stderr = StderrFilter(self.quiet)
        self._stderr.start()
        try:
            with _profiler_call():
                self._prof.__enter__()
        except BaseException:
            self._stderr.stop()
            raise
        from torchtriage.capture.closures import mark_closures

        self._closures = mark_closures()
        self._meta_added = False
        self._mark_warmup_once()
        self._probe_next_step()
        self._last_return = time.perf_counter()
        return self

    def step(self) -> None:
        """Mark the end of one training step (call once per optimizer step)."""
        if self._prof is None:
            raise TorchtriageError("profile.step() called outside the `with` block")
        entered = time.perf_counter()
        number = self._prof.step_num
        self._step_ms.append((number, (entered - self._last_return) * 1e3))
        if self._cut is not None:  # the step ended first (the probe's, or the window's:
            self._cut.cancel()  # saved whole at this boundary)
            self._cut = None
        if self._sliced:  # the profiler stopped part-way through the window's step
            self._prof.step_num += 1
            self._steps_run += 1
            self._last_return = time.perf_counter()
            return
        if self._probe is not None:
            self._guard_cost()  # before the step that starts recording
        if number == self.last_recorded_step and self._meta_added:
            self._add_dataset_metadata()  # before the step that saves the trace
        # Metadata must reach the trace before it is saved; add it while recording.
        with _profiler_call():
            self._prof.step()
        self._mark_warmup_once()
        self._start_slice_timer()
        self._probe_next_step()
        self._steps_run += 1
        self._last_return = time.perf_counter()
        self._profiler_ms.append((number, (self._last_return - entered) * 1e3))

    # --- the cost guard ---------------------------------------------------------------------

    def _start_slice_timer(self) -> None:
        """When the window's one active step (a slice: cost_guard) starts recording, stop
        the profiler ``slice_s`` into it."""
        from torch.profiler import ProfilerAction

        if self._slice_s and self._cut is None and \
                self._prof.current_action == ProfilerAction.RECORD_AND_SAVE:
            self._cut = StepCut(self._stop_mid_step, seconds=self._slice_s)
            self._cut.start()

    def _stop_mid_step(self) -> None:
        """On the main thread, part-way through the step: mark it partial and a slice, and
        stop the profiler, which saves the trace (``_save``); later steps are only counted."""
        prof = self._prof
        if prof is None or self._sliced:
            return
        self._mark_partial(prof, slice_s=self._slice_s)
        self._sliced = True
        with _profiler_call():
            prof.stop()

    def _probe_next_step(self) -> None:
        """Start the probe when the step about to run is the last unprofiled one."""
        if (not self.max_events or self.cost is not None or self._probe is not None
                or self._prof.step_num != self.wait - 1):
            return
        self._probe = CostProbe.start(self._activities)  # (None: no guard)

    def _guard_cost(self) -> None:
        """Stop the probe (unless its memory watch did), count its events, fit the window."""
        probe, self._probe = self._probe, None
        try:
            count = probe.finish()
        except Exception as exc:
            log.debug("torchtriage: the cost probe failed (%s)", exc)
            self._record_after_a_boundary()
            return
        if count.events == 0 and not self._probe_retried:
            # an empty step (two step boundaries back to back): probe again after a step's
            # gap (a probe started where this one stopped would share its boundary)
            self._probe_retried = True
            self.wait += 2
            return
        self.cost = self._fit_window(count)
        self._record_after_a_boundary()

    def _record_after_a_boundary(self) -> None:
        """Recording must not start at the boundary where the probe stopped (see the module
        docstring): the first warm-up step only prepares, or the window waits a step more."""
        if self.refused:
            pass  # nothing is recorded (see cost_guard)
        elif self.warmup:
            self._prepare_only = self.wait
        else:
            self.wait += 1
        if self.cost is not None and self.cost.action != "none":
            log.warning("torchtriage: one step records about %s profiler events; %d steps "
                        "would be %s (budget %s): %s", f"{self.cost.events_per_step:,}",
                        self.cost.planned_steps,
                        f"{self.cost.events_per_step * self.cost.planned_steps:,}",
                        f"{self.cost.budget:,}", self.cost.action)

    def _fit_window(self, count: ProbeCount) -> ProfileCost:
        """Fit the window to the probed step's events and the memory limit
        (:mod:`torchtriage.capture.cost_guard`); the profiler reads the recording options
        when recording starts."""
        fit = fit_window(count.events, warmup=self.warmup, active=self.active,
                         options={name: getattr(self, name) for name in RECORDING_OPTIONS},
                         budget=self.max_events, memory_limit=_memory_limit(),
                         probe_s=count.seconds if on_main_thread() else 0.0,
                         probe_cut=count.cut)
        self.warmup, self.active, self.refused = fit.warmup, fit.active, fit.refused
        self._slice_s = fit.slice_s
        for option in fit.drop:
            setattr(self, option, False)
            setattr(self._prof, option, False)
        return fit.cost

    def _mark_warmup_once(self) -> None:
        """Write the warm-up step numbers into the trace once recording has started."""
        from torch.profiler import ProfilerAction

        if not self._meta_added and self._prof.current_action == ProfilerAction.RECORD:
            self._meta = {"warmup_steps": self._warmup_numbers(), "partial_steps": []}
            if self.cost is not None:
                self._meta["profile_cost"] = msgspec.to_builtins(self.cost)
            if self.dataset_totals is not None:
                self._dataset_start = self.dataset_totals()
            if self.profile_memory:  # CUDA totals are absolute; CPU ones need the baseline
                self._meta["cpu_baseline_bytes"] = live_cpu_tensor_bytes()
            self._add_metadata_to(self._prof, self._meta)
            self._meta_added = True

    def _count_live_memory_at_the_end(self) -> None:
        """The CPU tensor bytes alive right after the last recorded step, into the trace. The
        profiler asks the schedule for the next step's action after it closed the last step's
        range and before it stops, so the count falls outside every step and is saved."""
        if not (self.profile_memory and self._meta_added) or self._prof is None:
            return
        if "cpu_live_end_bytes" not in self._meta:
            self._meta["cpu_live_end_bytes"] = live_cpu_tensor_bytes(gradients=True)
            self._add_metadata_to(self._prof, self._meta)

    def _add_dataset_metadata(self) -> None:
        """The Dataset's time per sample over the recorded steps (see capture/dataset.py)."""
        if self.dataset_totals is None or self._dataset_start is None:
            return
        summary = window_figures(self._dataset_start, self.dataset_totals())
        if summary is not None:
            self._meta["dataset"] = summary
            self._add_metadata_to(self._prof, self._meta)

    def _warmup_numbers(self) -> list[int]:
        """The recorded warm-up steps (a prepare-only step is not in the trace)."""
        return [n for n in range(self.wait, self.wait + self.warmup) if n != self._prepare_only]

    def __exit__(self, exc_type, exc, tb) -> bool:
        from torch.profiler import ProfilerAction

        prof, self._prof = self._prof, None
        if prof is None:
            return False
        if self._probe is not None:  # the loop ended inside the probed step
            probe, self._probe = self._probe, None
            probe.abandon()
        if self._cut is not None:
            self._cut.cancel()
        try:
            if not self._sliced:  # (a slice stopped and saved its profiler part-way already)
                if prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
                    # The step opened by the last step() call never finished as a training step.
                    self._mark_partial(prof)
                with _profiler_call():
                    prof.__exit__(exc_type, exc, tb)
        finally:
            self._closures.remove()
            self._stderr.stop()
        oom = is_out_of_memory(exc)
        self.out_of_memory = out_of_memory_report(exc, self._steps_run) if oom else None
        self._finish(oom)
        return False

    def _mark_partial(self, prof, **extra: Any) -> None:
        """The step being recorded did not finish as a training step: mark it partial in the
        trace's metadata (with ``extra``, e.g. a slice's length)."""
        meta = dict(self._meta) if self._meta_added else {
            "warmup_steps": self._warmup_numbers()}
        meta["partial_steps"] = [prof.step_num]
        meta.update(extra)
        self._add_metadata_to(prof, meta)

    @staticmethod
    def _add_metadata_to(prof, data: dict[str, Any]) -> None:
        prof.add_metadata_json(META_KEY, json.dumps(data))

    # --- results --------------------------------------------------------------------------

    def _save(self, prof) -> None:
        """Write the trace. It runs inside the training step that ends the window: a write that
        fails (a full disk, a directory gone) is one warning and no trace, never an error
        raised into the training loop; nothing partial is left (capture/trace_file.py)."""
        path = self.run_dir / f"{self.worker_name}.{time.time_ns()}{TRACE_SUFFIX}"
        try:
            write_trace(prof, path)
        except OSError as exc:
            self.save_error = f"the trace could not be written to {path}: {exc.strerror or exc}"
            log.warning("torchtriage: %s; training goes on", self.save_error)
            return
        finally:
            _free_results(prof)
        self.trace_path = path

    def _finish(self, oom: bool) -> None:
        if self.trace_path is None and self.out_of_memory is not None and self.analyze:
            # out of memory before anything was recorded: the error is the evidence
            from torchtriage.diagnosis.diagnose import diagnose_out_of_memory

            self._diagnosis = diagnose_out_of_memory(self.out_of_memory,
                                                     device_memory=self.device_memory)
            self._diagnosis.write(self.run_dir / "diagnosis.json")
            self._write_run_record(oom)
            return
        if self.refused is not None and not oom:  # logged when the guard decided
            self.error = self.refused
            self._write_run_record(oom)
            return
        if self._steps_run <= self.wait and not oom:
            kept = f"; partial trace kept at {self.trace_path}" if self.trace_path else ""
            self.error = (f"no complete step was recorded: {self._steps_run} step(s) ran and "
                          f"recording starts after {self.wait} unprofiled step(s); run at least "
                          f"{self.wait + 1} (best {self.last_recorded_step + 1}){kept}")
            warnings.warn(f"torchtriage: {self.error}", stacklevel=3)
            self._write_run_record(oom)
            return
        if self.trace_path is None:
            self.error = self.save_error or f"no trace was saved ({self._steps_run} step(s) ran)"
            if self.save_error is None:  # else logged where the write failed
                warnings.warn(f"torchtriage: {self.error}", stacklevel=3)
            self._write_run_record(oom)
            return
        if self.analyze:
            try:
                from torchtriage.capture.machine import cpu_facts
                from torchtriage.diagnosis.diagnose import diagnose
                from torchtriage.trace.ingest import load_trace

                self._diagnosis = diagnose(load_trace(self.trace_path, workers=1),
                                           device_memory=self.device_memory, oom=oom,
                                           top=self.top, out_of_memory=self.out_of_memory,
                                           machine=cpu_facts())
                self._diagnosis.capture = self._capture_info(oom)
                self._diagnosis.write(self.run_dir / "diagnosis.json")
            except Exception as exc:  # the trace is kept whatever the analysis does
                self.error = f"analysis failed ({type(exc).__name__}: {exc}); trace kept at " \
                             f"{self.trace_path}"
                warnings.warn(f"torchtriage: {self.error}", stacklevel=3)
        self._write_run_record(oom)

    def _active_numbers(self) -> set[int]:
        return set(range(self.wait + self.warmup, self.last_recorded_step + 1))

    def _capture_info(self, oom: bool):
        from torchtriage.diagnosis.result import CaptureInfo

        active = [ms for n, ms in self._step_ms if n in self._active_numbers()]
        return CaptureInfo(
            run_dir=str(self.run_dir),
            trace_file=str(self.trace_path),
            steps_run=self._steps_run,
            host_step_ms_median=round(statistics.median(active), 3) if active else None,
            excluded_host_steps={
                str(n): "profiler step() call (stop, post-processing and export)"
                for n, ms in self._profiler_ms if n == self.last_recorded_step
            },
            oom=oom,
        )

    def _write_run_record(self, oom: bool) -> None:
        import torch

        record = RunRecord(
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            argv=list(sys.argv),
            python=platform.python_version(),
            torch=str(torch.__version__),
            host=socket.gethostname(),
            schedule=Schedule(wait=self.wait, warmup=self.warmup, active=self.active),
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            device_memory=self.device_memory,
            steps_run=self._steps_run,
            profile_cost=self.cost,
            step_ms=[StepTime(n, round(ms, 3)) for n, ms in self._step_ms],
            profiler_step_ms=[ProfilerStepTime(n, round(ms, 3)) for n, ms in self._profiler_ms],
            trace=self.trace_path.name if self.trace_path else None,
            oom=oom,
            error=self.error,
            **{"out_of_memory": self.out_of_memory, **self.extra_record},
        )
        try:
            record.write(self.run_dir / self.record_name)
        except OSError as exc:  # a full disk: the trace (if written) is kept, training goes on
            log.warning("torchtriage: the run record could not be written to %s: %s",
                        self.run_dir / self.record_name, exc.strerror or exc)

    @property
    def diagnosis(self):
        """The :class:`~torchtriage.diagnosis.result.Diagnosis` (after the ``with`` block)."""
        if self._diagnosis is None:
            if self._prof is not None:
                raise CaptureError("the diagnosis is ready after the `with` block ends")
            raise CaptureError(self.error or "analysis was turned off (analyze=False)")
        return self._diagnosis


def profile(out_dir: str | os.PathLike[str] | None = None, **options: Any) -> ProfileSession:
    """Profile a training loop with the seed's defaults and diagnose it.

    Args:
        out_dir: run directory for the trace, ``diagnosis.json`` and ``run.json``
            (default ``torchtriage_runs/<time>-<pid>``).
        **options: ``wait`` (1), ``warmup`` (2), ``active`` (5): see
            :class:`~torchtriage.results.run.Schedule`; ``record_shapes`` (True),
            ``profile_memory`` (True), ``with_stack`` (False), ``device_memory`` (capacity for
            the memory rule, e.g. ``"16GiB"``; stands in for a GPU's memory on CPU),
            ``analyze`` (True), ``quiet`` (True: hide the profiler's stderr noise), ``top`` (10),
            ``max_events`` (the cost guard's budget of recorded events, default
            ``thresholds.PROFILE_EVENTS_BUDGET``; 0 turns the guard off; it probes the last
            of the ``wait`` steps, so ``wait=0`` has no guard).
    """
    return ProfileSession(out_dir, **options)
