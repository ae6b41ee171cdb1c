"""The whole run's step timeline, recorded inside the training process without the profiler
(:class:`~torchtriage.diagnosis.result.StepTimeline` in the run record).

At each step boundary: the step's end is the step clock's (capture/steps.py); memory is one
counter read, no sync: on CUDA (once the script initialised it) the caching allocator's
allocated and reserved bytes of the current device, from one call of its statistics; else, on
glibc, the bytes malloc has handed out and not had back (``mallinfo2``: in-use heap chunks plus
mmapped ones, 0.3 us a call; labelled ``process_heap``: CPU tensors, the Python heap and the
profiler's buffers, so readings under the profiler are marked and the growth fit puts them in
their own segment); else the process's resident set size from ``/proc/self/statm`` (labelled
``process_rss``: pages freed back to malloc stay resident, so it rises in steps and falls
late). Nothing when none can be read.

Inside steps, what the evidence of a recurring stall needs, from patched entry points:

- a DataLoader starting worker processes (``_MultiProcessingDataLoaderIter.__init__``): its
  workers, ``persistent_workers``, start method, and the time to its first batch; under
  ``spawn``/``forkserver`` the Dataset's pickled size (counted, not kept, once a run), which
  every worker unpickles;
- an evaluation: the outermost ``Module.train(False)`` on a module in training mode until the
  same module's ``train(True)``, or, where the script restores the mode by setting
  ``module.training`` itself (Lightning's evaluation loop restores every submodule's flag that
  way), until the first sign of training seen after it: a module called while the evaluated
  one is in training mode again (a forward pre-hook registered only while an evaluation is
  open), a DataLoader starting its workers, or the step's end. A module still in eval mode at
  a step's end was not evaluating (a frozen module) and is dropped;
- a checkpoint: each ``torch.save`` and its duration;
- while the second window records (capture/stall_window.py), each of these runs inside a
  ``record_function`` range of its own (``torchtriage: ...``), so its trace names them;
- torch.compile: each new entry of dynamo's compilation metrics (frame, time, the guard that
  failed), read at the boundary that follows it; dynamo's warning that a frame hit the
  recompile limit (it then runs eager), caught by a handler on its logger.

When the memory readings grow (the growth fit over the last ``ONLINE_WINDOW`` readings:
``GROWTH_T`` standard errors and ``ONLINE_MIN_BYTES``), a census of live tensors
(capture/census.py) is taken, and one more ``CENSUS_GAP`` steps later (or at an
out-of-memory error, when that comes first), outside profiled steps and never in timing mode.
The timeline stops growing after ``MAX_STEPS`` steps.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import pickle
import sys
import threading
import time
from typing import Any

from torchtriage.analysis.growth import within_segment_slope
from torchtriage.analysis.step_parts import (
    CHECKPOINT_RANGE,
    EVALUATION_RANGE,
    LOADER_START_RANGE,
)
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import CompileEvent, RunEvent, StepTimeline, TensorCensus

log = logging.getLogger(__name__)
MAX_STEPS = 200_000
MAX_EVENTS = 5_000
MAX_COMPILES = 2_000
ONLINE_WINDOW = 48  # readings the online growth check fits
ONLINE_EVERY = 8  # steps between online checks
ONLINE_MIN_BYTES = 2**20  # growth over the online window that triggers a census
CENSUS_GAP = 8  # steps between the two censuses
DYNAMO_LOGGER = "torch._dynamo.convert_frame"
LIMIT_MESSAGE = "hit config."


class _CountingSink:
    """A file object that only counts what is written to it (the Dataset's pickled size)."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data) -> int:
        size = memoryview(data).nbytes  # bytes, or a PickleBuffer (numpy's large arrays)
        self.bytes += size
        return size


class _LimitHits(logging.Handler):
    """Catches dynamo's 'hit config.recompile_limit' warnings."""

    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:
            return
        if LIMIT_MESSAGE in text and len(self.sink) < 100:
            lines = [x.strip() for x in text.splitlines() if x.strip()]
            self.sink.append(" / ".join(lines[:3])[:400])


class TimelineRecorder:
    """Memory per step boundary and the events inside steps (module docstring)."""

    def __init__(self, started: float, *, census: bool) -> None:
        self.started = started  # the step clock's start (perf_counter)
        self.census_allowed = census
        self.memory_source: str | None = None
        self.memory: list[int] = []
        self.reserved: list[int] = []
        self.profiled_steps: list[int] = []
        self.events: list[RunEvent] = []
        self.compiles: list[CompileEvent] = []
        self.limit_hits: list[str] = []
        self.census: list[TensorCensus] = []
        self.truncated_at: int | None = None
        self._statm: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._last_metric: object = None
        self._next_census: int | None = None
        self._eval_open: dict[int, tuple[float, int, Any]] = {}  # id -> start, step, module
        self._eval_hook: Any = None  # the forward pre-hook watching for the end of one
        self._eval_ranges: dict[int, Any] = {}  # evaluations opened while annotating
        self.annotate = False  # the second window records: name what it patches (ranges)
        self._local = threading.local()
        self._pickled_once = False
        self._steps = 0
        self._segments: list[int] = []  # per reading: its segment for the fit (-1: profiled)
        self._segment = 0
        self._was_profiled = False
        self._memory_from = 0  # the step at whose end the first memory reading was taken

    # --- installation -----------------------------------------------------------------

    def install(self, torch) -> None:
        self._patch_loader(torch)
        self._patch_train(torch)
        self._patch_save(torch)
        logging.getLogger(DYNAMO_LOGGER).addHandler(_LimitHits(self.limit_hits))

    def _now(self) -> float:
        return time.perf_counter() - self.started

    def _event(self, **fields) -> RunEvent | None:
        if len(self.events) >= MAX_EVENTS:
            return None
        event = RunEvent(step=self._steps + 1, **fields)
        self.events.append(event)
        return event

    def _patch_loader(self, torch) -> None:
        module = torch.utils.data.dataloader
        cls = getattr(module, "_MultiProcessingDataLoaderIter", None)
        if cls is None or getattr(cls.__init__, "_torchtriage", False):
            return
        init, next_data = cls.__init__, cls._next_data
        recorder = self

        def patched_init(it, loader, *args, **kwargs):
            if recorder._eval_open:
                recorder._evals_at(boundary=False)
            start = recorder._now()
            with recorder.profiler_range(LOADER_START_RANGE):
                init(it, loader, *args, **kwargs)
            try:
                method = _start_method(loader)
                event = recorder._event(
                    kind="loader_start", start_s=round(start, 6),
                    duration_s=round(recorder._now() - start, 6),
                    workers=int(loader.num_workers),
                    persistent=bool(getattr(loader, "persistent_workers", False)),
                    start_method=method)
                if event is not None and method in ("spawn", "forkserver") \
                        and not recorder._pickled_once:
                    recorder._pickled_once = True
                    event.dataset_bytes = _pickled_size(loader.dataset)
                it._torchtriage_start = (event, start)
            except Exception:  # never break the script's loader
                log.debug("torchtriage: loader start not recorded", exc_info=True)

        def patched_next_data(it):
            data = next_data(it)
            pending = it.__dict__.pop("_torchtriage_start", None)
            if pending is not None and pending[0] is not None:
                event, start = pending
                event.duration_s = round(recorder._now() - start, 6)
            return data

        patched_init._torchtriage = True
        cls.__init__, cls._next_data = patched_init, patched_next_data

    def _patch_train(self, torch) -> None:
        module_cls = torch.nn.Module
        train = module_cls.train
        if getattr(train, "_torchtriage", False):
            return
        recorder, local = self, self._local

        def patched_train(module, mode: bool = True):
            if getattr(local, "inside", False):
                return train(module, mode)
            local.inside = True
            try:
                was = getattr(module, "training", True)
                result = train(module, mode)
                recorder._mode_changed(module, was, bool(mode))
                return result
            finally:
                local.inside = False

        patched_train._torchtriage = True
        module_cls.train = patched_train

    def _mode_changed(self, module, was: bool, mode: bool) -> None:
        key = id(module)
        if was and not mode:
            self._eval_open[key] = (self._now(), self._steps + 1, module)
            if self.annotate:
                self._eval_ranges[key] = self._enter_range(
                    f"{EVALUATION_RANGE} ({type(module).__name__})")
            if self._eval_hook is None:
                try:
                    self._eval_hook = sys.modules["torch"].nn.modules.module \
                        .register_module_forward_pre_hook(self._watch_eval)
                except Exception:  # never break the script's modules
                    log.debug("torchtriage: no forward pre-hook for evaluations", exc_info=True)
        elif mode and not was and key in self._eval_open:
            self._close_eval(key)

    def _close_eval(self, key: int, *, event: bool = True) -> None:
        start, step, module = self._eval_open.pop(key)
        opened = self._eval_ranges.pop(key, None)
        if opened is not None:
            opened.__exit__(None, None, None)
        if not self._eval_open and self._eval_hook is not None:
            self._eval_hook.remove()
            self._eval_hook = None
        if not event:
            return
        recorded = self._event(kind="evaluation", start_s=round(start, 6),
                               duration_s=round(self._now() - start, 6),
                               detail=type(module).__name__)
        if recorded is not None:
            recorded.step = step

    def _watch_eval(self, module, args) -> None:
        """Forward pre-hook while an evaluation is open: one whose module is in training mode
        again (its flag set directly, not through ``train()``) ended before this call."""
        for key, (_, _, evaluated) in list(self._eval_open.items()):
            if evaluated.training:
                self._close_eval(key)

    def _evals_at(self, boundary: bool) -> None:
        """At a DataLoader start or a step's end: evaluations whose module trains again ended;
        at a step's end, a module still in eval mode was not evaluating (frozen)."""
        for key, (_, _, evaluated) in list(self._eval_open.items()):
            if evaluated.training:
                self._close_eval(key)
            elif boundary:
                self._close_eval(key, event=False)

    def _patch_save(self, torch) -> None:
        save = torch.save
        if getattr(save, "_torchtriage", False):
            return
        recorder = self

        def patched_save(obj, f, *args, **kwargs):
            start = recorder._now()
            try:
                with recorder.profiler_range(CHECKPOINT_RANGE):
                    return save(obj, f, *args, **kwargs)
            finally:
                name = os.path.basename(os.fspath(f)) if isinstance(f, (str, os.PathLike)) \
                    else type(f).__name__
                recorder._event(kind="checkpoint", start_s=round(start, 6),
                                duration_s=round(recorder._now() - start, 6), detail=name[:200])

        patched_save._torchtriage = True
        torch.save = patched_save

    # --- ranges for the second window -------------------------------------------------

    def _enter_range(self, name: str) -> Any:
        torch = sys.modules["torch"]
        opened = torch.autograd.profiler.record_function(name)
        opened.__enter__()
        return opened

    @contextlib.contextmanager
    def profiler_range(self, name: str):
        """A ``record_function`` range named ``name`` while :attr:`annotate` is set (the
        second window records: capture/stall_window.py); nothing otherwise."""
        if not self.annotate:
            yield
            return
        opened = self._enter_range(name)
        try:
            yield
        finally:
            opened.__exit__(None, None, None)

    # --- step boundaries --------------------------------------------------------------

    def step_ended(self, steps: int, profiled: bool) -> None:
        """Step ``steps`` ended (``profiled``: it ran under the profiler)."""
        if self._eval_open:
            self._evals_at(boundary=True)
        self._steps = steps
        if steps > MAX_STEPS:
            self.truncated_at = self.truncated_at or MAX_STEPS
            return
        if profiled:
            self.profiled_steps.append(steps)
        if profiled != self._was_profiled:
            self._was_profiled, self._segment = profiled, self._segment + 1
        source = self.memory_source
        self._read_memory()
        if self.memory_source != source:  # CUDA started: the readings began again
            self._segments = []
        if len(self.memory) > len(self._segments):
            self._segments.append(-1 if profiled else self._segment)
        self._read_compiles(steps)
        if self.census_allowed and not profiled and self.memory_source is not None:
            self._maybe_census(steps)

    def _read_memory(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            try:
                allocated, reserved = cuda_counters(torch)
            except Exception:
                allocated = reserved = None
            if allocated is not None:
                if self.memory_source != "cuda_allocator":
                    # readings before CUDA started were the RSS: not comparable, dropped
                    self.memory, self.reserved = [], []
                    self.memory_source = "cuda_allocator"
                    self._memory_from = self._steps
                self.memory.append(allocated)
                self.reserved.append(reserved)
                return
        if self.memory_source == "cuda_allocator":
            return
        heap = _heap_in_use()
        if heap is not None and self.memory_source in (None, "process_heap"):
            if self.memory_source is None:
                self.memory_source = "process_heap"
                self._memory_from = self._steps
            self.memory.append(heap)
            return
        rss = self._rss()
        if rss is not None and self.memory_source in (None, "process_rss"):
            if self.memory_source is None:
                self.memory_source = "process_rss"
                self._memory_from = self._steps
            self.memory.append(rss)

    def _rss(self) -> int | None:
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            fields = os.pread(self._statm, 128, 0).split()
            return int(fields[1]) * self._page
        except (OSError, ValueError, IndexError):
            return None

    def _read_compiles(self, steps: int) -> None:
        utils = sys.modules.get("torch._dynamo.utils")
        metrics = getattr(utils, "_compilation_metrics", None) if utils is not None else None
        if not metrics or metrics[-1] is self._last_metric:
            return
        new = []
        for m in reversed(metrics):
            if m is self._last_metric:
                break
            new.append(m)
        self._last_metric = metrics[-1]
        for m in reversed(new):
            if len(self.compiles) >= MAX_COMPILES:
                return
            self.compiles.append(compile_event(m, steps))

    def _maybe_census(self, steps: int) -> None:
        if len(self.census) >= 2:
            return
        if self._next_census is not None:
            if steps >= self._next_census:
                self._census(steps)
            return
        first = self._memory_from + int(th.GROWTH_SKIP_STEPS.value)
        if steps % ONLINE_EVERY or steps - first < 2 * ONLINE_EVERY:
            return
        start_index = max(len(self.memory) - ONLINE_WINDOW,
                          int(th.GROWTH_SKIP_STEPS.value))
        picked = [(i, v, g) for i, (v, g) in enumerate(
            zip(self.memory[start_index:], self._segments[start_index:], strict=False))
            if g >= 0]
        values = [v for _, v, _ in picked]
        fit = within_segment_slope([i for i, _, _ in picked], values,
                                   [g for _, _, g in picked])
        if fit is not None and fit.slope > 0 and fit.t >= th.GROWTH_T.value \
                and fit.slope * len(values) >= ONLINE_MIN_BYTES:
            self._census(steps)
            self._next_census = steps + CENSUS_GAP

    def ran_out_of_memory(self, exc: BaseException) -> None:
        """The script failed for memory: a census of what was alive then (its holders named
        from the error's traceback), when the growth's second census had not been taken yet
        (the run ended before it was due)."""
        if self.census_allowed and len(self.census) == 1:
            frames = []
            tb = exc.__traceback__
            while tb is not None:
                frames.append(tb.tb_frame)
                tb = tb.tb_next
            self._census(self._steps, frames[::-1])

    def _census(self, steps: int, frames: list | None = None) -> None:
        from torchtriage.capture.census import take_census

        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            self.census.append(take_census(torch, steps, frames))
        except Exception:  # never break the script
            log.debug("torchtriage: tensor census failed", exc_info=True)
            self.census_allowed = False

    # --- the record -------------------------------------------------------------------

    def capacity(self, device_memory: int | None) -> tuple[int | None, str | None]:
        """What the memory readings fill: the CUDA device (or the share the script capped),
        else ``device_memory`` when given, else the cgroup limit or the machine's RAM."""
        if self.memory_source == "cuda_allocator":
            torch = sys.modules.get("torch")
            from torchtriage.capture.oom import capped_capacity

            capped = capped_capacity(torch)
            if capped:
                return capped, "set_per_process_memory_fraction"
            try:
                device = torch.cuda.current_device()
                return int(torch.cuda.get_device_properties(device).total_memory), \
                    "device total memory"
            except Exception:
                return None, None
        if device_memory:
            return device_memory, "--device-memory"
        capped = rlimit_capacity(self.memory[-1] if self.memory else None)
        return capped if capped[0] else ram_limit()

    def record(self, ends: list[float], device_memory: int | None) -> StepTimeline:
        """The timeline of the steps that ended at ``ends`` (the step clock's)."""
        ends = ends[:MAX_STEPS]
        capacity, source = self.capacity(device_memory)
        spans: list[list[int]] = []
        for step in self.profiled_steps:
            if spans and spans[-1][1] == step - 1:
                spans[-1][1] = step
            else:
                spans.append([step, step])
        compiles = list(self.compiles)
        return StepTimeline(
            end_s=[round(t - self.started, 6) for t in ends],
            memory_source=self.memory_source, memory_bytes=list(self.memory),
            reserved_bytes=list(self.reserved), capacity_bytes=capacity,
            capacity_source=source, profiled=spans, events=list(self.events),
            compiles=compiles, recompile_limit_hits=list(self.limit_hits),
            census=list(self.census), truncated_at=self.truncated_at,
            memory_first_step=self._memory_from if self.memory else None)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_MALLINFO2: Any = False  # not looked up yet; None: unavailable


def _heap_in_use() -> int | None:
    """glibc's bytes in use (in-use arena chunks plus mmapped chunks), or None off glibc."""
    global _MALLINFO2
    if _MALLINFO2 is False:
        _MALLINFO2 = None
        try:
            libc = ctypes.CDLL(None)
            function = libc.mallinfo2
            function.restype = _MallInfo2
            function.argtypes = []
            _MALLINFO2 = function
        except (OSError, AttributeError):
            pass
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


def cuda_counters(torch) -> tuple[int, int]:
    """The current CUDA device's allocated and reserved bytes, from one statistics call
    (the nested form: ``torch.cuda.memory_allocated`` flattens every statistic first)."""
    device = torch.cuda.current_device()
    nested = getattr(torch._C, "_cuda_memoryStats", None)
    if nested is not None:
        stats = nested(device)
        return (int(stats["allocated_bytes"]["all"]["current"]),
                int(stats["reserved_bytes"]["all"]["current"]))
    return int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device))


def compile_event(metric: Any, steps: int) -> CompileEvent:
    """One dynamo compilation metric as a timeline entry (seen at the end of step
    ``steps``)."""
    name = getattr(metric, "co_name", None) or "?"
    filename = getattr(metric, "co_filename", None)
    line = getattr(metric, "co_firstlineno", None)
    frame = f"{name} ({os.path.basename(filename)}:{line})" if filename else name
    fail = getattr(metric, "fail_type", None)
    reason = getattr(metric, "recompile_reason", None)
    return CompileEvent(
        step=max(steps, 1), frame=frame[:300],
        seconds=round(float(getattr(metric, "entire_frame_compile_time_s", None) or 0.0), 4),
        reason=str(reason)[:400] if reason else None,
        failed=f"{fail}: {getattr(metric, 'fail_reason', '')}"[:400] if fail else None)


def _start_method(loader) -> str | None:
    ctx = getattr(loader, "multiprocessing_context", None)
    if isinstance(ctx, str):
        return ctx
    if ctx is not None and hasattr(ctx, "get_start_method"):
        try:
            return ctx.get_start_method()
        except Exception:
            return None
    # the default without fixing it (get_context().get_start_method() would)
    return multiprocessing.get_start_method(allow_none=True) or \
        multiprocessing.get_all_start_methods()[0]


def _pickled_size(dataset) -> int | None:
    sink = _CountingSink()
    try:
        pickle.Pickler(sink, protocol=pickle.HIGHEST_PROTOCOL).dump(dataset)
    except Exception:  # the workers would fail to start too; they will say so
        log.debug("torchtriage: the Dataset's pickled size not counted", exc_info=True)
        return None
    return sink.bytes


def rlimit_capacity(reading: int | None) -> tuple[int | None, str | None]:
    """The memory readings' ceiling under a data-segment or address-space limit (``ulimit -d``
    / ``-v``): the limit less what the segment holds besides the readings now (the limit
    counts libraries, stacks and arenas' reserve, which the heap reading does not)."""
    import resource

    if reading is None:
        return None, None
    for limit_id, field, name in ((resource.RLIMIT_DATA, "VmData:", "RLIMIT_DATA (ulimit -d)"),
                                  (resource.RLIMIT_AS, "VmSize:", "RLIMIT_AS (ulimit -v)")):
        soft = resource.getrlimit(limit_id)[0]
        if soft == resource.RLIM_INFINITY:
            continue
        try:
            with open("/proc/self/status") as f:
                used = next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
        except (OSError, StopIteration, ValueError):
            continue
        return max(soft - (used - reading), reading), name
    return None, None


def ram_limit() -> tuple[int | None, str | None]:
    """The memory this process's RSS may reach: the cgroup's limit, else the machine's RAM."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text), "cgroup memory limit"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024, "MemTotal"
    except (OSError, ValueError, IndexError):
        pass
    return None, None
