"""Zero-code capture: profile an unmodified training script from inside its own process.

Installed by the ``sitecustomize`` that ``torchtriage run`` puts first on ``PYTHONPATH``; reads
its settings from the ``TORCHTRIAGE_RUN`` environment variable (a
:class:`~torchtriage.results.run.RunConfig` as JSON). Nothing happens until the
script trains: the first optimizer step (or :func:`torchtriage.step`) starts the profiling
session, so launcher processes such as ``torchrun`` itself are left alone.

- **Steps** are optimizer steps (:mod:`~torchtriage.capture.steps`).
- **Dataset**: ``__getitem__`` time per sample, timed in whichever process fetches
  (:mod:`~torchtriage.capture.dataset`), goes into the trace's metadata (profile mode).
- **Profiling** runs :class:`~torchtriage.capture.session.ProfileSession` with the run's schedule
  after ``skip`` steps (:mod:`~torchtriage.capture.profiling`), one trace per rank (``rank<N>``
  in the file name), and a run record ``run.rank<N>.json`` with step times, losses, batch sizes
  and knob outcomes (:mod:`~torchtriage.capture.record`); rank 0 gathers the job
  (:mod:`~torchtriage.capture.gather`).
- **Losses** are the scalar tensors passed to ``backward()``; **batch sizes** come from the first
  tensor each DataLoader yields; both are grouped into one per training step, however many
  optimizers, micro-batches or closure calls it took (:mod:`~torchtriage.capture.signals`).
  Knobs are applied by :mod:`~torchtriage.capture.knob_apply` through a
  :class:`~torchtriage.capture.knob_host.KnobHost`.
- ``max_steps`` stops the script cleanly (``SystemExit``) once that many steps ran; in timing
  mode a measured window shorter than ``timing_min_s`` runs on (one process only).
- **The whole run**: every step's timeline (:mod:`~torchtriage.capture.timeline`) and, once
  the window is done, a second window on a stall that recurs
  (:mod:`~torchtriage.capture.stall_window`).
- **Timing mode** (``mode="time"``, used by A/B trials): no profiler at all. Step boundaries
  are host clocks; when CUDA is in use the device is synchronised at exactly two boundaries,
  the end of warm-up and the last step, so the measured window's wall time is exact while the
  steps inside it keep their normal CPU/GPU overlap.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import signal
import sys
import threading
from pathlib import Path

from torchtriage.capture import gather
from torchtriage.capture.dataset import DatasetTimer
from torchtriage.capture.knob_host import KnobHost
from torchtriage.capture.oom import MemoryWatch, capped_capacity
from torchtriage.capture.profiling import ProfilingWindow
from torchtriage.capture.record import record_fields
from torchtriage.capture.session import is_out_of_memory
from torchtriage.capture.signals import SignalRecorder
from torchtriage.capture.stall_window import StallWindowRecorder
from torchtriage.capture.steps import BACKWARD, MANUAL, StepClock, StepDetector
from torchtriage.capture.timeline import TimelineRecorder
from torchtriage.results.run import RunConfig, RunRecord, decode_config

ENV = "TORCHTRIAGE_RUN"
MAX_MEASURED_STEPS = 2000  # timing mode never measures more steps than this for timing_min_s
log = logging.getLogger(__name__)
_RUN: AutoRun | None = None


def active() -> AutoRun | None:
    return _RUN


def install() -> None:
    """Install the hooks described in the module docstring (once per process)."""
    global _RUN
    if _RUN is not None:
        return
    _RUN = AutoRun(decode_config(os.environ[ENV]))
    _RUN.install()


RANKS_DIR = ".ranks"  # in the run directory: one file per rank claimed (claim_rank)
MAX_CLAIMED_RANKS = 4096


def rank() -> int | None:
    """The rank a launcher gave this process (torchrun's ``RANK``), or None."""
    for var in ("RANK", "LOCAL_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def claim_rank(out: Path) -> int:
    """A rank for a process that trains without a launcher's: the lowest number not yet
    claimed in ``out/.ranks`` (one empty file each, created exclusively), so that processes of one
    command that each train (hogwild-style workers started with ``multiprocessing``) keep their
    own trace, run record and window check instead of all writing rank 0's. 0 when the
    directory cannot be written (its writes will fail alike, and say so)."""
    folder = out / RANKS_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for number in range(MAX_CLAIMED_RANKS):
            try:
                fd = os.open(folder / str(number), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)  # empty: a full disk still has room for it
            return number
    except OSError:
        pass
    return 0


class AutoRun:
    """The coordinator: step boundaries drive the clock, the signals and the profiling window;
    the end writes the run record and gathers the ranks."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        self.timing = config.mode == "time"
        launched = rank()
        self.rank = launched or 0
        self._rank_unclaimed = launched is None  # claimed at the first step (claim_rank)
        self.host = KnobHost(config.knobs)
        self.detector = StepDetector()
        self.clock = StepClock(config.timing_warmup)
        self.signals = SignalRecorder(self.host)
        self.dataset = DatasetTimer(self.out, self.rank)
        self.max_steps = config.max_steps  # timing mode extends it by a DataLoader queue
        self.profiling = ProfilingWindow(
            self.out, self.rank, config.schedule, config.skip, config.device_memory, self.clock,
            lambda: self.signals.loader_queue, config.max_steps, config.stop_after_window,
            lambda: self.signals.ready, config.max_events, self.dataset.totals)
        self.memory = MemoryWatch()
        self.timeline = TimelineRecorder(self.clock.started, census=not self.timing)
        self.stall_window = StallWindowRecorder(
            self.out, self.clock, self.timeline.profiled_steps, self.timeline.events,
            config.max_steps)
        self.stall_window.on_annotate = self._annotate
        self._profiler_was_on = False  # the profiler ran at the end of the last step
        self.finished = False
        self._lock = threading.Lock()
        self._exception: BaseException | None = None

    # --- installation ---------------------------------------------------------------------

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._on_optimizer_step)
        self.signals.install(torch)
        self.signals.after_backward = self._on_backward
        if self.config.timeline:
            self.timeline.install(torch)
        if not self.timing:
            self.dataset.install()
        from torchtriage.capture import knob_apply

        knob_apply.apply_global(self.host)
        if self.config.worker_seed_offset:
            knob_apply.shift_worker_seeds(self.config.worker_seed_offset)
        if self.config.eager_random:
            knob_apply.eager_random()
        atexit.register(self.finish)
        previous_hook = sys.excepthook

        def excepthook(kind, value, tb):
            self._exception = value  # so finish() can tell an OOM from other crashes
            if hasattr(signal, "SIGCHLD") and threading.current_thread() is threading.main_thread():
                # The script is ending: torch's DataLoader raises from its SIGCHLD handler when
                # a worker dies, and a second worker's exit then interrupted the report of the
                # first error with "Error in sys.excepthook" and a traceback (seen under load in
                # tests/test_interrupt.py)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            previous_hook(kind, value, tb)

        sys.excepthook = excepthook
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
            if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:  # forwarded by the parent
                signal.signal(signal.SIGHUP, self._on_sigterm)

    # --- steps ----------------------------------------------------------------------------

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.memory.optimizer_stepped()
        if not self.finished and not self.timing:
            self.profiling.start_sampling()
        # losses and batches so far belong to this optimizer step; grouped into training
        # steps at the end, once the cycle is known
        self.signals.close_segment(id(optimizer))
        closed = self.detector.optimizer_stepped(optimizer)
        for i in range(closed):
            # two at once when the optimizer cycle becomes known: the first closes the previous
            # iteration late, at the same instant, so no profiling may start there
            self.boundary(may_start=i == closed - 1)

    def _on_backward(self) -> None:
        """A ``backward()`` returned outside an optimizer's closure: a step's end where no
        optimizer steps (capture/steps.py)."""
        if self.finished:
            return
        was = self.detector.by_backward
        if not self.detector.backward_returned():
            return
        if not was:  # the iterations so far were not counted: they have no one loss
            self.signals.discard_open()
        self.memory.optimizer_stepped()
        if not self.timing:
            self.profiling.start_sampling()
        self.signals.close_segment(BACKWARD)
        self.boundary()

    def manual_step(self) -> None:
        """``torchtriage.step()``: the script marks its own steps; optimizer hooks are ignored."""
        self.detector.manual = True
        if not self.finished and not self.timing:
            self.profiling.start_sampling()
        self.signals.close_segment(MANUAL)
        self.boundary()

    def boundary(self, may_start: bool = True) -> None:
        """One training step ended (``may_start``: another does not end at the same instant,
        so the profiling session may start here)."""
        stop = False
        with self._lock:
            if self.finished:
                return
            if self._rank_unclaimed:
                self._rank_unclaimed = False
                self.rank = self.dataset.rank = self.profiling.rank = claim_rank(self.out)
                self.stall_window.rank = self.rank
            steps = self.clock.steps + 1
            if self.timing:
                self._drain_before_measuring(steps)
                if steps in (self.clock.warmup, self.max_steps):
                    _synchronize_device()
            self.clock.tick()
            if self.timing and steps == self.max_steps:
                self._measure_longer(steps)
            # the profiler ran in this step, or stopped at its start (its export is in it)
            on = self._profiler_on()
            profiled = self._profiler_was_on or on
            if not self.timing:
                stop = self.profiling.step_ended(steps, may_start) \
                    and steps >= self.config.observe_steps
                if self.config.timeline:  # the second window, once the first is done
                    self.stall_window.step_ended(steps, first_window_done=self.profiling.done)
                self._profiler_was_on = on or self._profiler_on()
            if self.config.timeline:
                self.timeline.step_ended(steps, profiled)
        if stop or (self.max_steps and steps >= self.max_steps):
            self.finish()
            raise SystemExit(0)

    def _profiler_on(self) -> bool:
        if self.stall_window.recording:
            return True
        session = self.profiling.session
        return session is not None and session.trace_path is None and not self.profiling.done

    def _annotate(self, on: bool) -> None:
        self.timeline.annotate = on

    def _measure_longer(self, steps: int) -> None:
        """Timing mode: a measured window shorter than ``timing_min_s`` goes on for as many
        more steps as its pace says it needs (10 % over, at most MAX_MEASURED_STEPS in all),
        so that fast steps are not measured over a few milliseconds. One process only: ranks
        that stopped on their own clocks would leave the others waiting in a collective."""
        want = self.config.timing_min_s
        warm = self.clock.warmup
        if not want or _distributed() or warm < 1 or steps <= warm:
            return
        measured_s = self.clock.ends[-1] - self.clock.ends[warm - 1]
        if measured_s >= want:
            return
        per_step = max(measured_s / (steps - warm), 1e-6)
        extra = min(math.ceil(1.1 * (want - measured_s) / per_step),
                    MAX_MEASURED_STEPS - (steps - warm))
        period = self.config.timing_period
        if extra > 0 and period > 0:  # whole periods (RunConfig.timing_period)
            extra = -(-extra // period) * period
        if extra > 0:
            self.max_steps = steps + extra

    def _drain_before_measuring(self, steps: int) -> None:
        """Timing mode: the measured window starts only after a DataLoader's batches in
        flight were used up (the requested warm-up plus ``num_workers x prefetch_factor``
        steps); the trial runs that much longer, so it still measures ``steps`` steps."""
        queue = self.signals.loader_queue
        wanted = self.config.timing_warmup + queue
        if queue and steps <= self.clock.warmup < wanted:
            if self.max_steps:
                self.max_steps += wanted - self.clock.warmup
            self.clock.warmup = wanted

    # --- the end --------------------------------------------------------------------------

    def _on_sigterm(self, signum, frame) -> None:
        raise SystemExit(128 + signum)

    def finish(self, exc: BaseException | None = None) -> None:
        """Stop profiling (saving what was recorded) and write the run record. Idempotent."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
        exc = exc or sys.exc_info()[1] or self._exception
        restore = exc is None and \
            self.profiling.cut_short_after_a_superseded_window(self.clock.steps)
        self.profiling.finish_checks(self.clock.steps)
        session = self.profiling.session
        extra = record_fields(self.rank, self.config.mode, self.clock, self.detector,
                              self.signals, self.host)
        extra["windows"] = list(self.profiling.checks)
        failed = exc is not None and not (isinstance(exc, SystemExit) and not exc.code)
        oom = failed and is_out_of_memory(exc)
        if oom and self.config.timeline:
            self.timeline.ran_out_of_memory(exc)
        if self.config.timeline:
            self.stall_window.finish()
            extra["timeline"] = self.timeline.record(self.clock.ends, self.config.device_memory)
            extra["timeline"].stall_windows = list(self.stall_window.windows)
        else:
            extra["timeline"] = None
        extra["machine"] = self.profiling.stop_sampling()
        extra["exit_exception"] = f"{type(exc).__name__}: {exc}" if failed else None
        extra["out_of_memory"] = self.memory.report(exc) if oom else None
        device_memory = self.config.device_memory or capped_capacity(sys.modules.get("torch"))
        if session is not None:
            session.device_memory = session.device_memory or device_memory
            session.extra_record.update(extra)
            try:
                session.__exit__(type(exc) if exc else None, exc, None)
            except Exception as exc2:  # never mask the script's own exit: one line
                log.warning("torchtriage: saving the profile failed (%s: %s)",
                            type(exc2).__name__, exc2)
                log.debug("torchtriage: saving the profile failed", exc_info=True)
            if restore:  # training ended in the warm-up of the window profiled again
                session.trace_path = self.profiling.restore_superseded(
                    session.trace_path, self.out / f"run.rank{self.rank}.json"
                ) or session.trace_path
            world_size = extra["world_size"]
            if world_size > 1 and gather.share_over_store(
                    self.out, self.rank, world_size, session.trace_path, device_memory,
                    extra["machine"], extra["out_of_memory"], extra["windows"]):
                return
            if self.rank == 0:
                gather.write_job_diagnosis(self.out, world_size, device_memory)
        elif self.clock.steps or oom:
            # An out-of-memory error before the window (on step 2, say) is a finding too: the
            # record carries what the error said, and the parent diagnoses it.
            self.out.mkdir(parents=True, exist_ok=True)
            error = (None if self.timing or oom else
                     f"{self.clock.steps} step(s) ran, fewer than --skip {self.config.skip}")
            record = RunRecord(argv=list(sys.argv), trace=None, error=error, oom=oom, **extra)
            try:
                record.write(self.out / f"run.rank{self.rank}.json")
            except OSError as exc2:  # a full disk: one line, never a traceback at exit
                log.warning("torchtriage: the run record could not be written in %s: %s",
                            self.out, exc2.strerror or exc2)
        # A process that never trained and never ran out of memory (a launcher such as
        # torchrun's agent, a helper process) writes nothing: it must not overwrite the record
        # of the rank it shares a number with.


def _distributed() -> bool:
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _synchronize_device() -> None:
    """Wait for queued device work, when the script uses CUDA (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
