"""Zero-code capture: profile an unmodified training script from inside its own process.

Installed by the ``sitecustomize`` that ``torchtriage run`` puts first on ``PYTHONPATH``; reads
its settings from the ``TORCHTRIAGE_RUN`` environment variable (JSON). Nothing happens until the
script trains: the first optimizer step (or :func:`torchtriage.step`) starts the profiling
session, so launcher processes such as ``torchrun`` itself are left alone.

- **Steps** are optimizer steps, seen through ``register_optimizer_step_post_hook``. With several
  optimizers, the first repeat of an optimizer closes an iteration; after that the cycle is
  known and each iteration closes after its last optimizer. Gradient accumulation is one step
  per optimizer step, which is what it is.
- **Profiling** runs :class:`~torchtriage.capture.session.ProfileSession` with the seed schedule
  after ``skip`` steps, one trace per rank (``rank<N>`` in the file name), and a run record
  ``run.rank<N>.json`` with step times, losses, batch sizes and knob outcomes.
- **Losses** are the scalar tensors passed to ``backward()``, kept detached and read once at the
  end (no sync per step). **Batch sizes** come from the first tensor each DataLoader yields.
- ``max_steps`` stops the script cleanly (``SystemExit``) once that many steps ran.
- **Timing mode** (``"mode": "time"``, used by A/B trials): no profiler at all. Step boundaries
  are host clocks; when CUDA is in use the device is synchronised at exactly two boundaries,
  the end of warm-up and the last step, so the measured window's wall time is exact while the
  steps inside it keep their normal CPU/GPU overlap.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ENV = "TORCHTRIAGE_RUN"
WAIT_FOR_RANKS_S = 60.0  # how long rank 0 waits for the other ranks' records at exit
_RUN: AutoRun | None = None


def active() -> AutoRun | None:
    return _RUN


def install() -> None:
    """Install the hooks described in the module docstring (once per process)."""
    global _RUN
    if _RUN is not None:
        return
    config = json.loads(os.environ[ENV])
    _RUN = AutoRun(config)
    _RUN.install()


def rank() -> int:
    for var in ("RANK", "LOCAL_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class AutoRun:
    def __init__(self, config: dict[str, Any]) -> None:
        self.out = Path(config["out"])
        self.skip = int(config.get("skip", 0))
        self.max_steps = config.get("max_steps")
        self.schedule = {k: int(config.get(k, d)) for k, d in
                         (("wait", 1), ("warmup", 2), ("active", 5))}
        self.knobs: dict[str, Any] = dict(config.get("knobs", {}))
        self.device_memory = config.get("device_memory")
        self.timing = config.get("mode") == "time"
        self.warmup = int(config.get("timing_warmup", 0))  # timing mode only
        self.started = time.perf_counter()
        self.rank = rank()
        self.steps = 0
        self.manual = False
        self.session = None
        self.finished = False
        self.step_ends: list[float] = []
        self.losses: list[Any] = []
        self.loss_counts: list[int] = []  # backward calls summed into each step's loss
        self.batch_sizes: list[int] = []
        # > 1 once memory.grad_accumulation split a DataLoader's batches: a step's loss is
        # then the mean of its micro-batches' losses and its batch size their sum
        self.micro_batches = 1
        self.knob_log: dict[str, dict[str, Any]] = {}
        self._loss_this_step = False
        self._batch_this_step = False
        self._cycle: list[int] = []  # ids of optimizers in one iteration, once known
        self._seen: list[int] = []  # optimizers stepped in the current iteration
        self._lock = threading.Lock()
        self._exception: BaseException | None = None
        self.sampler = None
        self._sampling_tried = False

    # --- installation ---------------------------------------------------------------------

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._on_optimizer_step)
        self._patch_backward(torch)
        self._patch_dataloader(torch)
        from torchtriage.capture import knob_apply

        knob_apply.apply_global(self)
        atexit.register(self.finish)
        previous_hook = sys.excepthook

        def excepthook(kind, value, tb):
            self._exception = value  # so finish() can tell an OOM from other crashes
            previous_hook(kind, value, tb)

        sys.excepthook = excepthook
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def note(self, knob: str, applied: bool, detail: str, where: str | None = None) -> None:
        """Record what a knob did (first outcome per knob wins, later ones are counted).
        ``where`` is the ``file:line`` of the user's call it changed (for the fix patch)."""
        entry = self.knob_log.setdefault(knob, {"value": self.knobs.get(knob),
                                                "applied": applied, "detail": detail,
                                                "count": 0, "where": []})
        entry["count"] += 1
        if applied and not entry["applied"]:
            entry.update(applied=True, detail=detail)
        if applied and where and where not in entry["where"]:
            entry["where"].append(where)

    def _patch_backward(self, torch) -> None:
        original = torch.Tensor.backward
        run = self

        def backward(tensor, *args, **kwargs):
            if tensor.numel() == 1:
                if not run._loss_this_step:
                    run.losses.append(tensor.detach())
                    run.loss_counts.append(1)
                    run._loss_this_step = True
                elif run.micro_batches > 1:
                    run.losses[-1] = run.losses[-1] + tensor.detach()
                    run.loss_counts[-1] += 1
            return original(tensor, *args, **kwargs)

        torch.Tensor.backward = backward

    def _patch_dataloader(self, torch) -> None:
        from torch.utils.data import dataloader

        original_next = dataloader._BaseDataLoaderIter.__next__
        run = self

        def __next__(it):
            batch = original_next(it)
            if not run._batch_this_step or run.micro_batches > 1:
                size = _batch_size(batch, torch)
                if size is not None:
                    if run._batch_this_step:
                        run.batch_sizes[-1] += size
                    else:
                        run.batch_sizes.append(size)
                    run._batch_this_step = True
            return batch

        dataloader._BaseDataLoaderIter.__next__ = __next__

    # --- steps ----------------------------------------------------------------------------

    def _start_sampling(self) -> None:
        """Sample the machine from the first training step on (not during imports)."""
        from torchtriage.capture.machine import MachineSampler

        self._sampling_tried = True
        self.sampler = MachineSampler()
        try:
            self.sampler.start()
        except Exception:  # psutil missing or refused: the run goes on without samples
            self.sampler = None

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if not self._sampling_tried and not self.finished and not self.timing:
            self._start_sampling()
        # The next backward / batch belongs to the next iteration, even before the boundary of
        # the first iteration is known.
        self._loss_this_step = self._batch_this_step = False
        if self.manual:
            return
        key = id(optimizer)
        if not self._cycle:
            if key not in self._seen:
                self._seen.append(key)
                return
            # The first optimizer came round again: the previous iteration ended with the
            # optimizer before this one (closed now, one forward/backward late, in a step that
            # is never analysed), and the cycle is known from here on.
            self._cycle, self._seen = list(self._seen), []
            self.boundary()
        if key == self._cycle[-1]:
            self.boundary()

    def manual_step(self) -> None:
        """``torchtriage.step()``: the script marks its own steps; optimizer hooks are ignored."""
        self.manual = True
        if not self._sampling_tried and not self.finished and not self.timing:
            self._start_sampling()
        self.boundary()

    def boundary(self) -> None:
        """One training step ended."""
        with self._lock:
            if self.finished:
                return
            self.steps += 1
            if self.timing and self.steps in (self.warmup, self.max_steps):
                _synchronize_device()
            self.step_ends.append(time.perf_counter())
            if self.manual:
                self._loss_this_step = self._batch_this_step = False
            if not self.timing:
                if self.session is None and self.steps >= self.skip:
                    self._start_session()
                elif self.session is not None:
                    self.session.step()
        if self.max_steps and self.steps >= self.max_steps:
            self.finish()
            raise SystemExit(0)

    def _start_session(self) -> None:
        from torchtriage.capture.session import ProfileSession

        self.session = ProfileSession(
            self.out, analyze=False, device_memory=self.device_memory,
            worker_name=f"rank{self.rank}_{os.getpid()}", record_name=f"run.rank{self.rank}.json",
            **self.schedule,
        )
        self.session.__enter__()

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
        session = self.session
        extra = self._record()
        extra["machine"] = self.sampler.stop() if self.sampler is not None else None
        failed = exc is not None and not (isinstance(exc, SystemExit) and not exc.code)
        extra["exit_exception"] = f"{type(exc).__name__}: {exc}" if failed else None
        if session is not None:
            session.extra_record.update(extra)
            try:
                session.__exit__(type(exc) if exc else None, exc, None)
            except Exception:  # the trace is what matters; never mask the script's own exit
                traceback.print_exc()
            world_size = extra["world_size"]
            if world_size > 1 and self._share_over_store(session, world_size, extra):
                return
            if self.rank == 0:
                self._write_job_diagnosis(world_size)
        elif self.steps:
            self.out.mkdir(parents=True, exist_ok=True)
            error = (None if self.timing
                     else f"{self.steps} step(s) ran, fewer than --skip {self.skip}")
            from torchtriage.capture.session import is_out_of_memory

            record = {"schema": "torchtriage.run/1", "argv": sys.argv, "trace": None,
                      "error": error, "oom": failed and is_out_of_memory(exc), **extra}
            (self.out / f"run.rank{self.rank}.json").write_text(json.dumps(record, indent=2))
        # A process that never trained (a launcher such as torchrun's agent, a helper
        # process) writes nothing: it must not overwrite the record of the rank it shares a
        # number with.

    def _share_over_store(self, session, world_size: int, extra: dict[str, Any]) -> bool:
        """Each rank diagnoses its own trace where it runs and publishes the (small) result in
        torchrun's rendezvous store; rank 0 gathers them into ``diagnosis.json``. No shared
        filesystem is needed and no rank parses another rank's trace. False when there is no
        store to reach (the caller falls back to the shared run directory)."""
        store = _torchrun_store()
        if store is None or session.trace_path is None:
            return False
        from torchtriage.diagnosis.diagnose import diagnose
        from torchtriage.trace.ingest import load_trace

        key = f"torchtriage/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{self.out}/"
        try:
            mine = diagnose(load_trace(session.trace_path), device_memory=self.device_memory,
                            machine=extra.get("machine"))
            store.set(key + str(self.rank), mine.to_json(indent=0))
            if self.rank != 0:
                return True
            from torchtriage.diagnosis.job import diagnose_job
            from torchtriage.diagnosis.result import decode_diagnosis

            keys = [key + str(r) for r in range(world_size)]
            store.wait(keys, _timedelta(WAIT_FOR_RANKS_S))
            ranks = [decode_diagnosis(store.get(k)) for k in keys]
            job = diagnose_job(ranks)
            job.gathered_via = "torchrun store"
            (self.out / "diagnosis.json").write_text(job.to_json() + "\n")
            return True
        except Exception as exc:  # a rank that never arrives, a store that went away
            print(f"torchtriage: gathering rank diagnoses over the store failed ({exc}); "
                  "using the run directory", file=sys.stderr)
            return False

    def _write_job_diagnosis(self, world_size: int) -> None:
        """Rank 0: once every rank's record is on disk (or after WAIT_FOR_RANKS_S), diagnose
        all rank traces into ``diagnosis.json``."""
        from torchtriage.capture.runner import diagnose_run_dir, rank_files

        deadline = time.monotonic() + WAIT_FOR_RANKS_S
        while time.monotonic() < deadline:
            if len(list(self.out.glob("run.rank*.json"))) >= world_size:
                break
            time.sleep(0.2)
        try:
            traces, records = rank_files(self.out)
            if traces:
                diagnose_run_dir(self.out, traces, records, self.device_memory)
        except Exception as exc:  # the parent diagnoses again; the traces are on disk
            print(f"torchtriage: rank 0 could not write the job diagnosis ({exc})",
                  file=sys.stderr)

    def _knob_outcomes(self) -> dict[str, dict[str, Any]]:
        """The knob log, plus an entry for each knob the script never reached."""
        out = dict(self.knob_log)
        for knob, value in self.knobs.items():
            if knob not in out:
                out[knob] = {"value": value, "applied": False,
                             "detail": f"not reached: {_not_reached(knob)}", "count": 0,
                             "where": []}
        return out

    def _record(self) -> dict[str, Any]:
        times = [round((b - a) * 1e3, 3) for a, b in zip(self.step_ends, self.step_ends[1:],
                                                           strict=False)]
        losses = []
        for step, (loss, count) in enumerate(zip(self.losses, self.loss_counts, strict=True)):
            try:
                losses.append({"step": step, "loss": float(loss) / count})
            except Exception:  # a tensor on a device that is gone
                continue
        return {
            "rank": self.rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
            "steps_detected": self.steps,
            "step_detection": "torchtriage.step()" if self.manual else (
                f"optimizer.step ({max(len(self._cycle), 1)} optimizer(s) per step)"),
            "host_step_ms": times,
            "losses": losses,
            "batch_sizes": self.batch_sizes[:64],
            "knobs": self._knob_outcomes(),
            "mode": "time" if self.timing else "profile",
            # seconds from the bootstrap's start (before the script's imports) to each of the
            # first step's end and the warm-up's end: start-up cost such as compilation
            "first_step_s": round(self.step_ends[0] - self.started, 4) if self.step_ends
            else None,
            "warmup_end_s": round(self.step_ends[self.warmup - 1] - self.started, 4)
            if 0 < self.warmup <= len(self.step_ends) else None,
            "compile": _compile_summary(),
        }


def _not_reached(knob: str) -> str:
    from torchtriage.diagnosis.knobs import not_reached

    return not_reached(knob)


def _synchronize_device() -> None:
    """Wait for queued device work, when the script uses CUDA (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _compile_summary() -> dict[str, Any] | None:
    """What torch.compile did in this process (None when dynamo never compiled anything)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    try:
        counters = utils.counters
        frames = int(counters["frames"].get("total", 0))
        if not frames:
            return None
        seconds = sum(m.entire_frame_compile_time_s or 0.0
                      for m in utils.get_compilation_metrics())
        seconds += sum(utils.compilation_time_metrics.get(
            "compile_fx.<locals>.bw_compiler", []))
        breaks = counters["graph_break"]
        return {
            "seconds": round(seconds, 3),
            "frames": frames,
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": [str(k)[:200] for k, _ in breaks.most_common(5)],
            "recompiles": int(counters["recompiles"].total())
            if "recompiles" in counters else 0,
        }
    except Exception:  # private API: its shape changes between releases
        return None


def _timedelta(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)


def _torchrun_store():
    """A client of torchrun's rendezvous store (MASTER_ADDR:MASTER_PORT), or None."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not addr or not port.isdigit() or "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        from torch.distributed import TCPStore

        return TCPStore(addr, int(port), is_master=False, timeout=_timedelta(30),
                        wait_for_workers=False)
    except Exception:
        return None


def _batch_size(batch: Any, torch) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = _batch_size(item, torch)
            if size is not None:
                return size
    if isinstance(batch, dict):
        for item in batch.values():
            size = _batch_size(item, torch)
            if size is not None:
                return size
    return None
