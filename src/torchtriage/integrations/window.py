"""What every trainer callback does, whatever the trainer: profile one steady-state window of
optimizer steps inside it, then write the diagnosis and the report into its log directory.

Algorithm:

- ``begin`` (training starts): rank 0 claims ``<log dir>/torchtriage``
  (:mod:`~torchtriage.capture.rundir`: a previous run's files move to ``previous-<time>/``; a
  directory holding anyone else's files turns profiling off, with a warning), and each rank
  sets up a :class:`~torchtriage.capture.profiling.ProfilingWindow`, the window of
  ``torchtriage run``: torchtriage's schedule (wait 1, warm-up 2, active 5) after ``skip``
  steps and after the train DataLoader's batches in flight (``num_workers x
  prefetch_factor``, :func:`~torchtriage.capture.signals.batches_in_flight`) have drained,
  placed to fit the trainer's ``max_steps``.
- ``micro_batch`` and ``step_ended``: the trainer says what each forward/backward saw (its
  loss, its batch size) and when an optimizer step ended, so gradient accumulation's
  micro-batches make one step (losses averaged, batch sizes summed). Each step ticks the host
  clock and moves the window on: the profiling session starts after the skip, is stepped
  through the window, the unprofiled steps after it are timed to check that it was steady
  state (once profiled again when it was not), and once the final window is checked the
  session closes, writing the trace and ``run.rank<N>.json``. The machine is sampled only from
  the session's start to that point. Before the window a step costs a clock reading, a few
  comparisons and a reference to the trainer's loss tensor; after it, one attribute test.
- ``end`` (training ends, or fails): a window still open is closed (its trace saved, the
  unfinished step marked partial); a rank that never reached the window writes a record that
  says why; when a window profiled again had not reached its first profiled step, the earlier
  one (not steady state) is what there is, and its trace comes back. Rank 0 waits for every
  rank's record (:mod:`~torchtriage.capture.gather`), then diagnoses all rank traces as the
  job (a ``Diagnosis`` for one process, a ``JobDiagnosis`` over a DDP job's ranks) with their
  window checks and machine samples, and writes ``diagnosis.json`` and ``report.html``. The
  verdict line and a few numbers come back for the trainer's logger.

Nothing here raises into the trainer: a failure turns profiling off and is logged as one line.
Training is not touched: no function is patched, no random number is drawn, and outside the
window nothing waits for the device (losses are read once, when the window closes).
"""

from __future__ import annotations

import logging
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchtriage.capture.profiling import ProfilingWindow
from torchtriage.capture.signals import MAX_BATCH_SIZES, batches_in_flight
from torchtriage.capture.steps import StepClock
from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.errors import TorchtriageError
from torchtriage.results.run import LossPoint, RunRecord, Schedule
from torchtriage.units import parse_bytes

SUBDIR = "torchtriage"  # the folder in the trainer's log directory
REPORT = "report.html"
PENDING_RECORD = ".run.rank{rank}.pending.json"  # a record still being completed


@dataclass
class WindowResult:
    """What a callback logs when training ends (rank 0)."""

    message: str  # the verdict line, or why there is none
    out: Path  # the run directory in the trainer's log directory
    diagnosis: Diagnosis | JobDiagnosis | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # for the trainer's loggers


class TrainerWindow:
    """One trainer's profiling window (see the module docstring).

    Args:
        out_dir: where the trace, ``diagnosis.json`` and ``report.html`` go (default
            ``<the trainer's log directory>/torchtriage``).
        skip: steps before profiling may start (a DataLoader queue to drain can start it
            later).
        schedule: the profiler schedule (default wait 1, warm-up 2, active 5).
        device_memory: capacity for the memory rule, bytes or a size such as ``"16GiB"``.
        report: write ``report.html`` beside ``diagnosis.json``.
        top: rows in the top-ops tables.
        logger: where warnings and the verdict go (the trainer's logger).
        level: the verdict's logging level.
        step_detection: how the trainer marks steps (the run record's ``step_detection``).
    """

    def __init__(self, out_dir: str | Path | None = None, *, skip: int = 0,
                 schedule: Schedule | None = None, device_memory: int | str | None = None,
                 report: bool = True, top: int = 10,
                 logger: logging.Logger | None = None, level: int = logging.INFO,
                 step_detection: str = "trainer") -> None:
        if skip < 0:
            raise TorchtriageError(f"skip={skip}: need 0 or more steps")
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.skip = skip
        self.schedule = schedule or Schedule()
        if self.schedule.wait < 0 or self.schedule.warmup < 0 or self.schedule.active < 1:
            raise TorchtriageError(f"invalid schedule {self.schedule}: need wait >= 0, "
                                   "warmup >= 0, active >= 1")
        self.device_memory = parse_bytes(device_memory) if device_memory is not None else None
        self.report, self.top = report, top
        self.log = logger or logging.getLogger(__name__)
        self.level = level
        self.step_detection = step_detection
        self.out: Path | None = None
        self.rank, self.world_size = 0, 1
        self.active = False  # between begin and end, unless turned off
        self.window: ProfilingWindow | None = None
        self.clock: StepClock | None = None
        self.trace: Path | None = None  # this rank's trace, once saved
        self._closed = False  # the session closed: trace and record written
        self._sampling = False
        self._queue = 0
        self._losses: list[tuple[int, list[Any]]] = []  # (step index, its micro-batches' losses)
        self._batch_sizes: list[int] = []
        self._step_losses: list[Any] = []  # this step's losses so far (detached tensors)
        self._batch = 0  # this step's samples so far

    @property
    def collecting(self) -> bool:
        """Whether losses and batch sizes are still wanted (until the window closes)."""
        return self.active and not self._closed

    # --- the trainer's events -------------------------------------------------------------

    def begin(self, log_dir: str | Path, *, rank: int = 0, world_size: int = 1,
              loaders: Iterable[Any] = (), max_steps: int | None = None) -> None:
        """Training starts (every rank)."""
        from torchtriage.capture.rundir import claim_run_dir

        self.end_quietly()  # a second fit() on the same callback starts a new run
        self.rank, self.world_size = rank, world_size
        self.out = self.out_dir or Path(log_dir) / SUBDIR
        self._reset()
        try:
            self._queue = max((batches_in_flight(x) for x in loaders), default=0)
            self.clock = StepClock()
            steps = max_steps if max_steps is not None and max_steps > 0 else None
            queue = self._queue
            self.window = ProfilingWindow(self.out, rank, self.schedule, self.skip,
                                          self.device_memory, self.clock, lambda: queue, steps)
            if steps is not None and steps < self.window.steps_needed():
                if rank == 0:
                    self.log.warning(
                        "torchtriage: training is %d optimizer step(s), too short for the "
                        "profiling window (it needs %d: %d before it%s, %d unprofiled, %d "
                        "warm-up and %d profiled); not profiling", steps,
                        self.window.steps_needed(), max(self.skip, 1),
                        f", {queue} for the DataLoader's queue to drain" if queue else "",
                        self.schedule.wait, self.schedule.warmup, self.schedule.active)
                return
            if rank == 0:
                claim_run_dir(self.out)
            else:
                self.out.mkdir(parents=True, exist_ok=True)
            self.active = True
        except Exception as exc:
            self._turn_off("cannot profile", exc)

    def micro_batch(self, loss: Any = None, batch_size: int | None = None) -> None:
        """A forward/backward ran with this loss (a tensor or a number) and batch size."""
        if not self.collecting:
            return
        if loss is not None:  # kept as it is: no tensor op, no device read while training
            self._step_losses.append(loss.detach() if getattr(loss, "requires_grad", False)
                                     else loss)
        if batch_size is not None:
            self._batch += batch_size

    def loss_at(self, step: int, loss: float) -> None:
        """The trainer's logged loss after ``step`` optimizer steps (a mean over the steps
        since its previous log), for trainers that only log losses now and then."""
        if self.collecting:
            self._losses.append((step - 1, [float(loss)]))

    def step_ended(self, batch_size: int | None = None) -> None:
        """One optimizer step ended (``batch_size``: its samples, when the trainer knows them
        rather than the micro-batches)."""
        if not self.collecting:  # after the window: nothing at all
            return
        try:
            assert self.window is not None and self.clock is not None
            self._close_step(batch_size)
            self.clock.tick()
            window = self.window
            window.step_ended(self.clock.steps)
            if window.session is not None and not self._sampling:
                self._sampling = True  # from the session's start, once
                window.start_sampling()
            if window.done:
                self._close_session(None)
        except Exception as exc:
            self._turn_off("profiling failed", exc)

    def end(self, exc: BaseException | None = None) -> WindowResult | None:
        """Training ended (every rank; ``exc``: how it failed). Returns, on rank 0, what to
        log; None elsewhere, or when profiling was off."""
        if not self.active:
            return None
        self.active = False
        assert self.window is not None and self.clock is not None and self.out is not None
        try:
            if not self._closed and self.window.session is not None:
                first, _ = self.window.active_steps() or (0, 0)
                short = exc is None and self.clock.steps < first  # no profiled step yet
                restore = exc is None and \
                    self.window.cut_short_after_a_superseded_window(self.clock.steps)
                self.window.finish_checks(self.clock.steps)
                # the record appears once this rank's files are final: rank 0 reads them then
                self._close_session(exc, pending=short)
                if short:
                    restored = restore and self._restore_superseded()
                    self._publish_record()
                    if not restored:
                        return self._no_window(self.trace)
            elif not self._closed:
                return self._no_window()
            if self.rank != 0:
                return None
            return self._diagnose(wait=exc is None)
        except Exception as exc2:
            self._turn_off("the diagnosis failed", exc2, f"the trace is kept in {self.out}")
            return None

    def end_quietly(self) -> None:
        """Close whatever is open without diagnosing (a callback torn down mid-run)."""
        if self.active and self.window is not None and self.window.session is not None \
                and not self._closed:
            self.active = False
            try:
                self._close_session(None)
            except Exception as exc:
                self.log.warning("torchtriage: closing the profiler failed (%s)", exc)
        self.active = False

    # --- the steps ------------------------------------------------------------------------

    def _reset(self) -> None:
        self.trace, self._closed, self._sampling = None, False, False
        self._losses, self._batch_sizes = [], []
        self._step_losses, self._batch = [], 0

    def _close_step(self, batch_size: int | None) -> None:
        assert self.clock is not None
        if self._step_losses:
            self._losses.append((self.clock.steps, self._step_losses))
        size = batch_size if batch_size is not None else self._batch
        # index i is step i + 1: a step without a size ends the list
        if size and len(self._batch_sizes) == self.clock.steps:
            self._batch_sizes.append(size)
        self._step_losses, self._batch = [], 0

    def _record_fields(self) -> dict[str, Any]:
        """This rank's part of its run record (the session adds its own)."""
        from torchtriage.capture.record import compile_summary

        assert self.window is not None and self.clock is not None
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "steps_detected": self.clock.steps,
            "step_detection": self.step_detection,
            "host_step_ms": self.clock.host_step_ms(),
            "losses": _loss_points(self._losses),
            "batch_sizes": self._batch_sizes[:MAX_BATCH_SIZES],
            "mode": "profile",
            "first_step_s": self.clock.first_step_s(),
            "compile": compile_summary(),
            "windows": list(self.window.checks),
            "machine": self.window.stop_sampling(),
            "loader_queue": self._queue,
        }

    def _close_session(self, exc: BaseException | None, pending: bool = False) -> None:
        """Close the profiling session: its trace and run record are written (the record
        under a name rank 0 does not wait for when ``pending``, see :meth:`_publish_record`)."""
        assert self.window is not None
        session = self.window.session
        self._closed = True
        if pending:
            session.record_name = PENDING_RECORD.format(rank=self.rank)
        session.extra_record.update(self._record_fields())
        session.__exit__(type(exc) if exc is not None else None, exc, None)
        self.trace = session.trace_path

    def _no_window(self, warmup_trace: Path | None = None) -> WindowResult | None:
        """Training ended before the window's first profiled step: the line to log, and a
        record that says so (the session wrote it when a warm-up was recorded)."""
        assert self.window is not None and self.clock is not None and self.out is not None
        steps = self.clock.steps
        active = self.window.active_steps()
        if active is not None:
            message = (f"torchtriage: training ended after {steps} optimizer step(s), before "
                       f"the profiling window's first profiled step (steps {active[0]}-"
                       f"{active[1]}); not diagnosed"
                       + (f", the warm-up trace is kept in {self.out}" if warmup_trace else ""))
        else:
            start, reason = self.window.start_step(steps)
            message = (f"torchtriage: training ended after {steps} optimizer step(s), before "
                       f"the profiling window (it starts after step {max(start, 1)}: {reason},"
                       f" and takes {self.schedule.steps + self._queue} steps); nothing was "
                       "profiled")
            record = RunRecord(argv=list(sys.argv), trace=None, error=message.removeprefix(
                "torchtriage: "), **self._record_fields())
            record.write(self.out / f"run.rank{self.rank}.json")
        if self.rank != 0:
            return None
        self.log.warning(message)
        return WindowResult(message, self.out)

    def _restore_superseded(self) -> bool:
        """Training ended before the window profiled again reached its first profiled step:
        the earlier window's trace is restored (ProfilingWindow.restore_superseded) and the
        pending run record names it."""
        assert self.out is not None and self.window is not None
        restored = self.window.restore_superseded(
            self.trace, self.out / PENDING_RECORD.format(rank=self.rank))
        if restored is None:
            return False
        self.trace = restored
        return True

    def _publish_record(self) -> None:
        """The pending run record becomes ``run.rank<N>.json`` (one rename: whole or absent)."""
        assert self.out is not None
        pending = self.out / PENDING_RECORD.format(rank=self.rank)
        if pending.exists():
            pending.replace(self.out / f"run.rank{self.rank}.json")

    # --- the diagnosis --------------------------------------------------------------------

    def _diagnose(self, wait: bool) -> WindowResult:
        from torchtriage.capture.gather import WAIT_FOR_RANKS_S, wait_for_records
        from torchtriage.capture.runner import rank_files, run_dir_options
        from torchtriage.diagnosis.traces import diagnose_traces_with_detail

        assert self.out is not None
        if self.world_size > 1 and not wait_for_records(self.out, self.world_size,
                                                        WAIT_FOR_RANKS_S if wait else 0.0):
            self.log.warning("torchtriage: not every rank wrote its run record in %s; "
                             "diagnosing the traces there", self.out)
        traces, records = rank_files(self.out)
        if not traces:
            message = (f"torchtriage: no trace was saved in {self.out} (the window ended "
                       "before its first profiled step)")
            self.log.warning(message)
            return WindowResult(message, self.out)
        doc, details = diagnose_traces_with_detail(
            traces, run_dir_options(records, self.device_memory, self.top, self.out))
        doc.write(self.out / "diagnosis.json")
        report = None
        if self.report:
            from torchtriage.report.html import diagnosis_page, write_page

            report = write_page(self.out / REPORT, diagnosis_page(
                doc, details, title=f"torchtriage: {self.out}"))
        # this rank's own batch sizes: the record keeps only the first MAX_BATCH_SIZES
        sps = window_samples_per_s(doc.rank_diagnoses[0], self._batch_sizes)
        result = WindowResult(_verdict_line(doc, sps, report), self.out, doc,
                              _metrics(doc, sps))
        self.log.log(self.level, result.message)
        return result

    def _turn_off(self, what: str, exc: BaseException,
                  then: str = "training goes on without profiling") -> None:
        self.log.warning("torchtriage: %s (%s: %s); %s", what, type(exc).__name__,
                         str(exc).splitlines()[0] if str(exc) else "", then)
        try:
            self.end_quietly()
        finally:
            self.active = False


def _loss_points(losses: list[tuple[int, list[Any]]]) -> list[LossPoint]:
    """Each step's loss (its micro-batches' mean), read now, when the window closes: no device
    read while training."""
    points = []
    for step, values in losses:
        try:
            value = sum(float(x) for x in values) / len(values)
        except Exception:  # a tensor on a device that is gone
            continue
        points.append(LossPoint(step, value if value == value and abs(value) != float("inf")
                                else None))
    return points


def window_samples_per_s(diagnosis: Diagnosis, batch_sizes: list[int]) -> float | None:
    """Samples per second of one rank in its profiled window: the mean of the trainer's batch
    sizes of the window's steps (``batch_sizes[i]``: step i + 1) over the diagnosis's median
    step time; None when unknown."""
    window, step_ms = diagnosis.window, diagnosis.breakdown.median_step_ms
    if window is None or step_ms <= 0:
        return None
    sizes = batch_sizes[window.first_step - 1:window.last_step]
    if not sizes:
        return None
    return statistics.fmean(sizes) / (step_ms / 1e3)


def _median_step_ms(doc: Diagnosis | JobDiagnosis) -> float:
    return statistics.median(d.breakdown.median_step_ms for d in doc.rank_diagnoses)


def _metrics(doc: Diagnosis | JobDiagnosis, per_rank: float | None) -> dict[str, float]:
    """Numbers for the trainer's loggers: the median step, each layer's share (mean over
    ranks), the samples per second of the job while profiled."""
    ranks = doc.rank_diagnoses
    step_ms = _median_step_ms(doc)
    metrics = {"torchtriage/median_step_ms": round(step_ms, 3)}
    for layer in ranks[0].layers:
        if layer != "memory":
            metrics[f"torchtriage/{layer}_share"] = round(
                statistics.fmean(d.layers[layer].share for d in ranks if layer in d.layers), 4)
    if per_rank is not None:
        metrics["torchtriage/samples_per_s"] = round(per_rank * len(ranks), 2)
    return metrics


def _verdict_line(doc: Diagnosis | JobDiagnosis, sps: float | None,
                  report: Path | None) -> str:
    window = doc.rank_diagnoses[0].window
    where = []
    if window is not None:
        where.append(f"steps {window.first_step}-{window.last_step}")
        if window.representative is False:
            where.append("not steady state")
    if sps is not None:
        where.append(f"{sps * len(doc.rank_diagnoses):,.1f} samples/s while profiled")
    if isinstance(doc, JobDiagnosis):
        where.append(f"{doc.world_size} ranks")
    details = "".join(f"; {w}" for w in where)
    line = f"torchtriage: {doc.summary} (confidence {doc.confidence}{details})"
    return line + (f" Report: {report}" if report is not None else "")
