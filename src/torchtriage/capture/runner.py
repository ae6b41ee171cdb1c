"""``torchtriage run``: start a command with the zero-code bootstrap and collect what it recorded.

The parent process validates knobs before anything starts, claims the run directory
(:mod:`~torchtriage.capture.rundir`: never deletes a file it did not write), runs the command
in its own process group with ``TORCHTRIAGE_RUN`` set and the bootstrap first on
``PYTHONPATH``, stops it after the timeout or when torchtriage itself gets SIGTERM, SIGINT or
SIGHUP (:mod:`~torchtriage.capture.interrupt`: the signal to the command, which the bootstrap
turns into a clean exit that saves the trace, a grace period, then SIGKILL for whatever is left
of its process group and descendants), and finally diagnoses every rank trace in the run
directory into ``diagnosis.json``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from torchtriage.capture import interrupt, processes
from torchtriage.capture.rundir import claim_run_dir
from torchtriage.diagnosis.diagnose import diagnose_out_of_memory
from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.result import Diagnosis, StallProfile, StepTimeline
from torchtriage.diagnosis.run_view import RunInputs
from torchtriage.diagnosis.traces import DiagnoseOptions, diagnose_traces
from torchtriage.errors import TorchtriageError
from torchtriage.results.registry import read_document
from torchtriage.results.run import (
    WINDOW_MARKER,
    KnobOutcome,
    RunConfig,
    RunRecord,
    WindowMarker,
    decode_record,
    merge_knob_outcomes,
)
from torchtriage.trace.discover import TRACE_SUFFIXES

BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds torchtriage/
TERM_GRACE_S = 15.0  # for the command to save and exit after SIGTERM
GROUP_GRACE_S = 5.0  # then for the rest of its process group
POLL_S = 0.5  # how often the parent looks for an early window while the command trains
log = logging.getLogger(__name__)


@dataclass
class RunResult:
    out: Path
    returncode: int
    timed_out: bool
    traces: list[Path]
    records: list[RunRecord]
    interrupted: int | None = None  # the signal torchtriage got and forwarded to it
    diagnosis: Diagnosis | JobDiagnosis | None = None  # once write_diagnosis ran

    @property
    def knobs(self) -> dict[str, KnobOutcome]:
        """Knob outcomes merged over ranks (see :func:`merge_knob_logs`)."""
        return merge_knob_logs(self.records)

    @property
    def oom(self) -> bool:
        """Whether a rank ran out of memory (set by the session's is_out_of_memory())."""
        return any(r.oom for r in self.records)

    def rank0(self) -> RunRecord | None:
        return next((r for r in self.records if r.rank == 0), None)


def merge_knob_logs(records: list[RunRecord]) -> dict[str, KnobOutcome]:
    """Knob outcomes merged over run records (ranks, trials): applied anywhere counts as
    applied, with that outcome's detail; the call sites each changed (``where``) are united."""
    return merge_knob_outcomes([r.knobs for r in records])


def run_command(
    command: list[str],
    config: RunConfig,
    *,
    timeout: float | None = None,
    stdout_to_stderr: bool = False,
    log: Path | None = None,
    on_window: Callable[[Path, WindowMarker], None] | None = None,
) -> RunResult:
    """Run ``command`` under the bootstrap with ``config`` (its ``out`` is the run directory);
    return what it recorded (never raises for the command's own failures: the caller reports
    them).

    ``config.mode`` is ``"profile"`` (torch.profiler with ``config.schedule`` after ``skip``
    steps) or ``"time"`` (no profiler: step times only, for A/B trials; ``timing_warmup`` steps
    before the measured window, see :mod:`torchtriage.capture.autorun`).

    Args:
        timeout: seconds before the command is stopped (SIGTERM, then SIGKILL).
        stdout_to_stderr: send the command's stdout to torchtriage's stderr (``--json``
            keeps stdout for the JSON document; the script's output is not lost).
        log: send the command's stdout and stderr to this file instead of the terminal.
        on_window: called once, while the command goes on training, when a single-process
            run has profiled and checked its window (``window.rank0.json``), with the run
            directory and the marker (the window checks, the training process's CPU facts):
            diagnose it now, not at exit.
    """
    out = Path(config.out)
    if not command:
        raise TorchtriageError("no command to run: put it after --, e.g. "
                               "torchtriage run -- python train.py")
    interrupt.check()  # no new command once torchtriage was told to stop
    claim_run_dir(out)
    resolved = msgspec.structs.replace(config, out=str(out.resolve()))
    env = dict(os.environ)
    env["TORCHTRIAGE_RUN"] = resolved.to_json(indent=0)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(BOOTSTRAP), str(_PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    stdout = stderr = None
    with contextlib.ExitStack() as files:
        if log is not None:
            stdout = stderr = files.enter_context(open(log, "wb"))
        elif stdout_to_stderr:
            stdout = sys.stderr.fileno()
        files.enter_context(interrupt.forwarding(defer=True, convert=False))
        files.enter_context(interrupt.waiting_on_command())
        try:
            proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=stdout,
                                    stderr=stderr)
        except FileNotFoundError:
            raise TorchtriageError(f"command not found: {command[0]}") from None
        except PermissionError:
            raise TorchtriageError(f"command not executable: {command[0]}") from None
        try:
            returncode, timed_out, signalled = _wait(proc, timeout,
                                                     _window_watch(out, on_window))
        finally:
            _kill_group(proc)  # an exception in the wait (a second signal): nothing survives
    traces, records = rank_files(out)
    return RunResult(out=out, returncode=returncode, timed_out=timed_out, traces=traces,
                     records=records, interrupted=signalled)


def _window_watch(out: Path, on_window: Callable[[Path, WindowMarker], None] | None
                  ) -> Callable[[], None] | None:
    """A poll that calls ``on_window`` once rank 0's window marker appears (one rank only)."""
    if on_window is None:
        return None
    done = False

    def poll() -> None:
        nonlocal done
        marker = out / WINDOW_MARKER.format(rank=0)
        if done or not marker.exists() or (out / WINDOW_MARKER.format(rank=1)).exists():
            return
        done = True
        try:
            on_window(out, msgspec.json.decode(marker.read_bytes(), type=WindowMarker))
        except Exception as exc:  # the final diagnosis at exit still comes
            log.warning("torchtriage: diagnosing the window early failed (%s)", exc)

    return poll


def _wait(proc: subprocess.Popen, timeout: float | None,
          poll: Callable[[], None] | None = None) -> tuple[int, bool, int | None]:
    """Wait for the command, calling ``poll`` now and then; stop it after ``timeout``, or when
    torchtriage receives a signal (forwarded to the command's group, see
    :mod:`torchtriage.capture.interrupt`). Returns its exit status, whether it timed out and
    the signal that stopped it (None)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            signum = interrupt.pending()
            if signum is not None:
                return _stop(proc, signum), False, signum
            left = None if deadline is None else deadline - time.monotonic()
            step = POLL_S if left is None else min(POLL_S, max(left, 0.0))
            try:
                return proc.wait(timeout=step), False, None
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    return _stop(proc, signal.SIGTERM), True, None
                if poll is not None and interrupt.pending() is None:
                    poll()
    except KeyboardInterrupt:  # no guard installed (not the main thread)
        _stop(proc, signal.SIGINT)
        raise


def _stop(proc: subprocess.Popen, signum: int) -> int:
    """Stop the command, leaving nothing behind: ``signum`` to the command (the bootstrap
    saves and exits; a DataLoader or torchrun stops its own workers), ``TERM_GRACE_S`` for it
    and ``GROUP_GRACE_S`` for the rest of its group and its descendants to go by themselves;
    then ``signum`` to what is left (the child of a shell wrapper, say) and ``GROUP_GRACE_S``
    more; then SIGKILL. A second signal to torchtriage cuts every wait short."""
    snapshot = processes.family(proc.pid)

    def gone() -> bool:
        return proc.poll() is not None and not processes.survivors(snapshot)

    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signum)
    _wait_until(lambda: proc.poll() is not None, TERM_GRACE_S)
    if proc.poll() is not None:
        _wait_until(gone, GROUP_GRACE_S)
    if not gone():
        snapshot.update(processes.family(proc.pid) if proc.poll() is None else {})
        processes.send(proc.pid, snapshot, signum)
        _wait_until(gone, GROUP_GRACE_S)
    _kill_group(proc, snapshot)
    return proc.returncode


def _wait_until(done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline and not interrupt.insists():
        time.sleep(0.1)


def _kill_group(proc: subprocess.Popen, snapshot: dict[int, str] | None = None) -> None:
    """SIGKILL whatever is left of the command's group (and of ``snapshot``); reap it."""
    snapshot = snapshot or {}
    if proc.poll() is None:
        snapshot = {**snapshot, **processes.family(proc.pid)}
    if proc.poll() is None or processes.group_members(proc.pid) or \
            processes.survivors(snapshot):
        processes.kill(proc.pid, snapshot)
    proc.wait()


def _trace_files(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir()
                  if p.name.endswith(TRACE_SUFFIXES) and p.name.startswith("rank"))


def write_diagnosis(result: RunResult, device_memory: int | None, top: int = 10) -> None:
    """Fill ``result.diagnosis``: read ``DIR/diagnosis.json`` when rank 0 already wrote it for
    these traces, else diagnose every rank trace and write it (a crashed or killed job); with
    no trace but an out-of-memory record, the diagnosis of that error. Nothing when there is
    neither."""
    target = result.out / "diagnosis.json"
    if not result.traces:
        report = next((r.out_of_memory for r in result.records if r.out_of_memory), None)
        if report is not None:
            rank = next(r for r in result.records if r.out_of_memory)
            result.diagnosis = diagnose_out_of_memory(
                report, device_memory=device_memory, machine=result.records[0].machine,
                run=run_inputs(result.records, result.out).get(rank.rank))
            result.diagnosis.write(target)
        return
    # rank 0's diagnosis holds for these traces and every run record (a rank that finished
    # after it, such as a hogwild worker with its own claimed rank, brings its window check)
    written = [*result.traces, *result.out.glob("run.rank*.json")]
    newest = max((p.stat().st_mtime for p in written if p.exists()), default=0.0)
    if target.exists() and target.stat().st_mtime >= newest:
        try:
            doc = read_document(target.read_bytes(), str(target))
        except (TorchtriageError, OSError) as exc:  # the traces decide: diagnosed again
            log.warning("torchtriage: %s; diagnosing the traces again", exc)
            doc = None
        if isinstance(doc, (Diagnosis, JobDiagnosis)) and \
                len(doc.rank_diagnoses) == len(result.traces) and \
                _has_every_window(doc, result.records) and \
                _has_every_timeline(doc, result.records):
            result.diagnosis = doc
            return
    result.diagnosis = diagnose_run_dir(result.out, result.traces, result.records,
                                        device_memory, top)


def _has_every_window(doc: Diagnosis | JobDiagnosis, records: list[RunRecord]) -> bool:
    """Whether ``doc`` has the window check of every rank whose record has one. Modification
    times cannot tell: rank 0 may read the records, another rank write its own, and rank 0
    write the diagnosis after it (a hogwild worker's window check was missing from 1 job in
    a CI run), or all within the file system's clock tick."""
    checked = {r.rank for r in records if r.windows}
    return all(d.window is not None for d in doc.rank_diagnoses
               if d.trace.rank in checked or (d.trace.rank is None and 0 in checked))


def _has_every_timeline(doc: Diagnosis | JobDiagnosis, records: list[RunRecord]) -> bool:
    """Whether ``doc`` has the whole-run view of every rank whose record has a timeline (the
    diagnosis written at the window, while training went on, has none)."""
    timed = {r.rank for r in records if r.timeline is not None and r.timeline.end_s}
    return all(d.run is not None for d in doc.rank_diagnoses
               if d.trace.rank in timed or (d.trace.rank is None and 0 in timed))


def diagnose_run_dir(out: Path, traces: list[Path], records: list[RunRecord],
                     device_memory: int | None, top: int = 10) -> Diagnosis | JobDiagnosis:
    """Diagnose rank traces (with each rank's machine samples) into ``out/diagnosis.json``:
    one diagnosis, or the job diagnosis (``torchtriage.job/1``) over several ranks."""
    doc = diagnose_traces(traces, run_dir_options(records, device_memory, top, out))
    doc.write(out / "diagnosis.json")
    return doc


def run_dir_options(records: list[RunRecord], device_memory: int | None, top: int = 10,
                    out: Path | None = None) -> DiagnoseOptions:
    """How a run directory's traces are diagnosed: with each rank's machine samples, window
    checks and out-of-memory report from its run record, in this process (no fork: this may
    be the training process)."""
    return DiagnoseOptions(
        device_memory=device_memory, top=top,
        oom=any(r.oom for r in records),  # set by the session's is_out_of_memory()
        machine={r.rank: r.machine for r in records},
        out_of_memory={r.rank: r.out_of_memory for r in records if r.out_of_memory},
        windows={r.rank: r.windows for r in records if r.windows},
        runs=run_inputs(records, out),
        workers=1)


def run_inputs(records: list[RunRecord], out: Path | None = None) -> dict[int, RunInputs]:
    """Each rank's step timeline with what the whole-run view reads beside it: with the run
    directory ``out``, the stall step its second window profiled."""
    job_steps = max((len(r.timeline.end_s) for r in records if r.timeline), default=0)
    return {r.rank: RunInputs(timeline=r.timeline, compile=r.compile,
                              exit_exception=r.exit_exception, job_steps=job_steps or None,
                              first_step_s=r.first_step_s,
                              stall_profile=_stall_profile(out, r.timeline))
            for r in records if r.timeline is not None and r.timeline.end_s}


def _stall_profile(out: Path | None, timeline: StepTimeline) -> StallProfile | None:
    """The last stall step the second window kept (capture/stall_window.py), analysed from
    its trace; None without one, or when its trace cannot be read (a warning)."""
    window = next((w for w in reversed(timeline.stall_windows) if w.trace and w.stalled),
                  None)
    if out is None or window is None or window.trace is None:
        return None
    from torchtriage.analysis.step_parts import step_parts
    from torchtriage.analysis.steps import find_steps
    from torchtriage.diagnosis.run_view import stall_profile
    from torchtriage.trace import load_trace

    try:
        trace = load_trace(out / window.trace)
        steps = find_steps(trace)
        parts = step_parts(trace, steps, int(steps.numbers.max())) if len(steps) else None
    except (OSError, TorchtriageError) as exc:
        log.warning("torchtriage: the stall window's trace %s cannot be read (%s)",
                    window.trace, exc)
        return None
    if parts is None:
        return None
    return stall_profile(parts, step=window.step, wall_ms=window.step_ms, trace=window.trace)


def rank_files(out: Path) -> tuple[list[Path], list[RunRecord]]:
    """The rank traces and run records in a run directory."""
    records = []
    for path in sorted(out.glob("run.rank*.json")):
        try:
            records.append(decode_record(path.read_bytes()))
        except (OSError, msgspec.DecodeError) as exc:  # a writer killed mid-write, say
            log.warning("torchtriage: left out %s, which cannot be read (%s)", path, exc)
    return _trace_files(out), records


def describe_failure(result: RunResult, timeout: float | None) -> str | None:
    """One line saying what went wrong with the command, or None when it went well."""
    kept = (f"; recorded {len(result.traces)} trace(s), kept in {result.out}"
            if result.traces else f"; nothing was profiled (run records in {result.out})"
            if result.records else "; nothing was profiled")
    if result.interrupted is not None:
        return (f"interrupted by {interrupt.signal_name(result.interrupted)}: the command was "
                f"stopped{kept}")
    report = next((r.out_of_memory for r in result.records if r.out_of_memory), None)
    if report is not None:
        return (f"the command ran out of memory on step {report.step}; the memory diagnosis "
                f"is in {result.out / 'diagnosis.json'}")
    if result.timed_out:
        return f"the command ran past --timeout {timeout:g}s and was stopped{kept}"
    if result.returncode not in (0, None):
        how = (f"was killed by signal {-result.returncode}" if result.returncode < 0
               else f"exited with code {result.returncode}")
        return f"the command {how}{kept}"
    if not result.traces:
        errors = {r.error for r in result.records if r.error}
        if not result.records:
            return no_record_reason(result.out)
        return "; ".join(sorted(errors)) or "no trace was recorded"
    return None


NO_STEP = ("no training step detected (no optimizer.step(), no backward() and no "
           "torchtriage.step())")
FULL_DISK_BYTES = 1 << 20  # less free space than this where nothing was saved: a full disk


def no_record_reason(out: Path) -> str:
    """Why a command left no run record in ``out``: a full file system, else no step."""
    return full_disk_reason(out) or NO_STEP


def full_disk_reason(out: Path) -> str | None:
    """One line saying that ``out``'s file system is too full to save anything, or None."""
    free = _free_bytes(out)
    if free is not None and free < FULL_DISK_BYTES:
        return (f"nothing could be saved in {out}: its file system has {free // 1024} KiB "
                "free (the trace and the run record need more)")
    return None


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def python_command(argv: list[str]) -> list[str]:
    """Resolve a leading ``python`` to the interpreter torchtriage runs on when it is absent."""
    if argv and argv[0] in ("python", "python3") and not _which(argv[0]):
        return [sys.executable, *argv[1:]]
    return argv


def _which(name: str) -> str | None:
    from shutil import which

    return which(name)
