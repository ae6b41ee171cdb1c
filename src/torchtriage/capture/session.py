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
warm-up still leaves a trace instead of nothing (torch.profiler discards warm-up events).
A loop that ends inside the active window is saved too, and the unfinished last step is marked
partial. The profiler's own ``step()`` calls (including the one that exports the trace) are
timed separately and never counted in step times.
While the session is open, each call of a closure passed to ``optimizer.step(closure)`` runs in
a range of its own (:mod:`torchtriage.capture.closures`), so that its forward and backward are
not counted as optimizer time.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from torchtriage.capture.oom import out_of_memory_report
from torchtriage.capture.quiet import StderrFilter
from torchtriage.diagnosis.result import OutOfMemory
from torchtriage.errors import CaptureError, TorchtriageError
from torchtriage.results.run import ProfilerStepTime, RunRecord, Schedule, StepTime
from torchtriage.units import parse_bytes

TRACE_SUFFIX = ".pt.trace.json.gz"
DEFAULT_SCHEDULE = Schedule()
# torch warns about cycles it clears; this schedule records one cycle only, so it is noise.
_PROFILER_WARNINGS = r"Warning: Profiler clears events at the end of each cycle"


@contextlib.contextmanager
def _profiler_call():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PROFILER_WARNINGS)
        yield
META_KEY = "torchtriage"


def default_run_dir() -> Path:
    return Path("torchtriage_runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def live_cpu_tensor_bytes() -> int:
    """Bytes of CPU tensor storage alive now, parameter gradients excluded.

    On CPU, the profiler's ``Total Allocated`` counts only what is allocated after profiling
    starts, so parameters and optimizer state created earlier are invisible to it. This is
    measured once, when recording starts (at a step boundary), and added to the CPU peak.
    Gradients are left out because ``zero_grad()`` (set_to_none=True, the default) frees them
    and backward allocates them again inside the recorded steps, where they are counted.
    """
    import gc

    import torch

    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover - very old torch
        FakeTensor = ()  # type: ignore[assignment,misc]

    storages: dict[int, int] = {}
    grads: set[int] = set()
    objects = []
    with warnings.catch_warnings():  # isinstance() on deprecated lazy module attributes warns
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:  # dead weakref proxies (left by torch.compile) raise on isinstance()
                if isinstance(o, torch.Tensor) and not isinstance(o, FakeTensor):
                    objects.append(o)
            except ReferenceError:
                continue
    for obj in objects:
        try:
            if obj.device.type != "cpu":
                continue
            if isinstance(obj, torch.nn.Parameter) and obj.grad is not None:
                grads.add(obj.grad.untyped_storage().data_ptr())
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        except (ReferenceError, RuntimeError, NotImplementedError):
            continue  # dead weakref proxies, meta/sparse tensors without storage
    storages.pop(0, None)
    return sum(n for ptr, n in storages.items() if ptr not in grads)


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
        # Filled by the caller (e.g. the zero-code runner) and merged into the run record:
        # values of RunRecord fields, by field name.
        self.extra_record: dict[str, Any] = extra_record if extra_record is not None else {}
        self.trace_path: Path | None = None
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

        if step < self.wait:
            return ProfilerAction.NONE
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
        self._last_return = time.perf_counter()
        return self

    def step(self) -> None:
        """Mark the end of one training step (call once per optimizer step)."""
        if self._prof is None:
            raise TorchtriageError("profile.step() called outside the `with` block")
        entered = time.perf_counter()
        number = self._prof.step_num
        self._step_ms.append((number, (entered - self._last_return) * 1e3))
        # Metadata must reach the trace before it is saved; add it while recording.
        with _profiler_call():
            self._prof.step()
        self._mark_warmup_once()
        self._steps_run += 1
        self._last_return = time.perf_counter()
        self._profiler_ms.append((number, (self._last_return - entered) * 1e3))

    def _mark_warmup_once(self) -> None:
        """Write the warm-up step numbers into the trace once recording has started."""
        from torch.profiler import ProfilerAction

        if not self._meta_added and self._prof.current_action == ProfilerAction.RECORD:
            self._meta = {"warmup_steps": self._warmup_numbers(), "partial_steps": []}
            if self.profile_memory:  # CUDA totals are absolute; CPU ones need the baseline
                self._meta["cpu_baseline_bytes"] = live_cpu_tensor_bytes()
            self._add_metadata_to(self._prof, self._meta)
            self._meta_added = True

    def _warmup_numbers(self) -> list[int]:
        return list(range(self.wait, self.wait + self.warmup))

    def __exit__(self, exc_type, exc, tb) -> bool:
        from torch.profiler import ProfilerAction

        prof, self._prof = self._prof, None
        if prof is None:
            return False
        recording = prof.current_action in (ProfilerAction.RECORD,
                                             ProfilerAction.RECORD_AND_SAVE)
        if recording:
            # The step opened by the last step() call never finished as a training step.
            meta = dict(self._meta) if self._meta_added else {
                "warmup_steps": self._warmup_numbers()}
            meta["partial_steps"] = [prof.step_num]
            self._add_metadata_to(prof, meta)
        try:
            with _profiler_call():
                prof.__exit__(exc_type, exc, tb)
        finally:
            self._closures.remove()
            self._stderr.stop()
        oom = is_out_of_memory(exc)
        self.out_of_memory = out_of_memory_report(exc, self._steps_run) if oom else None
        self._finish(oom)
        return False

    @staticmethod
    def _add_metadata_to(prof, data: dict[str, Any]) -> None:
        prof.add_metadata_json(META_KEY, json.dumps(data))

    # --- results --------------------------------------------------------------------------

    def _save(self, prof) -> None:
        path = self.run_dir / f"{self.worker_name}.{time.time_ns()}{TRACE_SUFFIX}"
        prof.export_chrome_trace(str(path))
        self.trace_path = path

    def _finish(self, oom: bool) -> None:
        if self.trace_path is None and self.out_of_memory is not None and self.analyze:
            # out of memory before anything was recorded: the error is the evidence
            from torchtriage.diagnosis.diagnose import diagnose_out_of_memory

            self._diagnosis = diagnose_out_of_memory(self.out_of_memory,
                                                     device_memory=self.device_memory)
            (self.run_dir / "diagnosis.json").write_text(self._diagnosis.to_json())
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
            self.error = (f"no trace was saved ({self._steps_run} step(s) ran)")
            warnings.warn(f"torchtriage: {self.error}", stacklevel=3)
            self._write_run_record(oom)
            return
        if self.analyze:
            try:
                from torchtriage.diagnosis.diagnose import diagnose
                from torchtriage.trace.ingest import load_trace

                self._diagnosis = diagnose(load_trace(self.trace_path, workers=1),
                                           device_memory=self.device_memory, oom=oom,
                                           top=self.top, out_of_memory=self.out_of_memory)
                self._diagnosis.capture = self._capture_info(oom)
                (self.run_dir / "diagnosis.json").write_text(self._diagnosis.to_json())
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
            step_ms=[StepTime(n, round(ms, 3)) for n, ms in self._step_ms],
            profiler_step_ms=[ProfilerStepTime(n, round(ms, 3)) for n, ms in self._profiler_ms],
            trace=self.trace_path.name if self.trace_path else None,
            oom=oom,
            error=self.error,
            **{"out_of_memory": self.out_of_memory, **self.extra_record},
        )
        (self.run_dir / self.record_name).write_text(record.to_json())

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
            ``analyze`` (True), ``quiet`` (True: hide the profiler's stderr noise), ``top`` (10).
    """
    return ProfileSession(out_dir, **options)
