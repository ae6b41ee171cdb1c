"""Diagnose trace files: the one place that decides between one diagnosis and a job's.

Algorithm: find the trace files at the given path(s); load and diagnose each (rank traces are
independent, so several are done in parallel processes, each with its share of the memory
limit; one trace is done in this process, whose load may use a second decoding process); one
trace gives its :class:`Diagnosis`, several give the :class:`JobDiagnosis` over them (per-rank
verdicts, stragglers, one job verdict). The pool is sized to the work: at most one process per
core and per trace, and one per :data:`JSON_PER_WORKER` of JSON, since a process costs more to
start than a small trace takes to diagnose. Workers send back the diagnosis as msgpack bytes
(a compact msgspec struct) and, when asked, the small per-trace report detail (timeline lanes
and memory curves), never the loaded trace tables.

A file that cannot be diagnosed (not a trace, truncated, an execution trace, timings past
use: any :class:`TraceError`) does not fail the others: it is listed in the document's
``skipped`` with its one-line reason, and the error is raised only when no file could be
diagnosed, or with ``strict``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from torchtriage.analysis.memory import MemoryCurve, memory_curves
from torchtriage.analysis.steps import find_steps
from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.diagnosis.job import JobDiagnosis, diagnose_job
from torchtriage.diagnosis.result import Diagnosis, OutOfMemory, SkippedFile, WindowCheck
from torchtriage.diagnosis.run_view import RunInputs
from torchtriage.errors import TraceError
from torchtriage.trace.discover import find_trace_files, rank_of_trace_file
from torchtriage.trace.ingest import MEMORY_LIMIT_ENV, default_memory_limit, load_trace
from torchtriage.trace.model import Trace
from torchtriage.trace.parallel import raw_size

if TYPE_CHECKING:
    from torchtriage.analysis.timeline import Timeline

TracePaths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
STDIN = "-"  # a path that means standard input
JSON_PER_WORKER = 16 * 2**20  # bytes of JSON that pay for starting a pool process


class DiagnoseOptions(msgspec.Struct, frozen=True):
    """How traces are diagnosed.

    Attributes:
        device_memory: capacity in bytes for the memory rule (stands in for a GPU's memory on
            CPU-only traces); None: the trace's ``deviceProperties``.
        top: rows in each top-ops table.
        oom: the profiled run ran out of memory (``torchtriage run`` knows; a trace does not).
        machine: per rank, the machine samples ``torchtriage run`` recorded.
        out_of_memory: per rank, the out-of-memory error the run raised (its figures).
        windows: per rank, ``torchtriage run``'s checks of its profiled windows.
        runs: per rank, the run record's step timeline and what goes with it (the whole-run
            view, diagnosis/run_view.py).
        workers: processes for several traces (default: one per core, at most one per trace
            and one per :data:`JSON_PER_WORKER` of JSON); 1: this process only, a single
            trace's load included.
        strict: a file that cannot be diagnosed fails the whole call (default: it is listed
            in ``skipped`` and the others are diagnosed).
    """

    device_memory: int | None = None
    top: int = 10
    oom: bool = False
    machine: Mapping[int, Any] | None = None
    out_of_memory: Mapping[int, OutOfMemory] | None = None
    windows: Mapping[int, list[WindowCheck]] | None = None
    runs: Mapping[int, RunInputs] | None = None
    workers: int | None = None
    strict: bool = False


class TraceDetail(msgspec.Struct, frozen=True):
    """What a report draws from a trace beyond its diagnosis."""

    timeline: Timeline | None
    memory: list[MemoryCurve]


def diagnose_traces(paths: TracePaths, options: DiagnoseOptions | None = None
                    ) -> Diagnosis | JobDiagnosis:
    """Diagnose the traces at ``paths`` (a file, a directory, or a list of files).

    Returns:
        The :class:`Diagnosis` of a single trace, or the :class:`JobDiagnosis` of several
        (``.rank_diagnoses`` gives the per-rank list either way).

    Raises:
        TraceError: a path that does not exist or holds no trace file; no file that could be
            diagnosed; with ``strict``, any file that could not.
    """
    pairs, skipped = _run(paths, options or DiagnoseOptions(), False)
    return _combine([d for d, _ in pairs], skipped)


def diagnose_traces_with_detail(paths: TracePaths, options: DiagnoseOptions | None = None
                                ) -> tuple[Diagnosis | JobDiagnosis, list[TraceDetail]]:
    """:func:`diagnose_traces`, also returning each trace's :class:`TraceDetail` (rank order)
    for the HTML report, from the same load."""
    pairs, skipped = _run(paths, options or DiagnoseOptions(), True)
    doc = _combine([d for d, _ in pairs], skipped)
    detail = {id(d): t for d, t in pairs}
    return doc, [detail[id(d)] for d in doc.rank_diagnoses]


def _combine(diagnoses: list[Diagnosis], skipped: list[SkippedFile]
             ) -> Diagnosis | JobDiagnosis:
    doc = diagnoses[0] if len(diagnoses) == 1 else diagnose_job(diagnoses)
    doc.skipped = skipped
    return doc


def _files(paths: TracePaths, stdin: Path | None = None) -> list[Path]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return [f for p in items
            for f in ([stdin] if stdin is not None and str(p) == STDIN
                      else find_trace_files(_readable(p)))]


def _readable(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``path`` when it is a file or directory (or does not exist: the loader says so); a
    FIFO, a device (``/dev/zero``, a terminal as ``/dev/stdin``) or a socket is refused."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return path
    kind = ("a FIFO (pipe)" if stat.S_ISFIFO(mode) else "a character device"
            if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise TraceError(f"{path}: {kind}, not a trace file or directory (a trace can be piped "
                     f"in as -: torchtriage analyze - < trace.json.gz)")


@contextlib.contextmanager
def _stdin_spool(paths: TracePaths) -> Iterator[Path | None]:
    """``-`` among ``paths``: standard input (plain or gzip JSON) read into a temporary file
    for the time of the diagnosis, at most the free space of the temporary folder less
    1 GiB; None otherwise."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not any(str(p) == STDIN for p in items):
        yield None
        return
    if sys.stdin is None or sys.stdin.isatty():
        raise TraceError("-: standard input is a terminal; pipe a trace into it "
                         "(torchtriage analyze - < trace.json.gz)")
    import shutil  # only for a trace on standard input (4 ms of every start otherwise)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="torchtriage-stdin-") as folder:
        target = Path(folder) / "stdin.json"
        room = shutil.disk_usage(folder).free - 2**30
        size = 0
        with open(target, "wb") as out:
            while chunk := sys.stdin.buffer.read(1 << 20):
                size += len(chunk)
                if size > room:
                    raise TraceError(f"-: standard input is larger than the {max(room, 0):,} "
                                     f"bytes free in {folder}; save it to a file")
                out.write(chunk)
        yield target


Outcome = tuple[Diagnosis, TraceDetail | None] | TraceError


def _run(paths: TracePaths, options: DiagnoseOptions, detail: bool
         ) -> tuple[list[tuple[Diagnosis, TraceDetail | None]], list[SkippedFile]]:
    with _stdin_spool(paths) as stdin:
        if stdin is None:
            return _sorted_out(_files(paths), options, detail)
        try:
            pairs, skipped = _sorted_out(_files(paths, stdin), options, detail)
        except TraceError as exc:
            raise TraceError(str(exc).replace(str(stdin), STDIN)) from None
    for d, _ in pairs:
        if d.trace.path == str(stdin):
            d.trace.path = STDIN
    for f in skipped:
        if f.path == str(stdin):
            f.path = STDIN
    return pairs, skipped


def _sorted_out(files: list[Path], options: DiagnoseOptions, detail: bool
                ) -> tuple[list[tuple[Diagnosis, TraceDetail | None]], list[SkippedFile]]:
    """The diagnosed files, and those that could not be, with why (see the module
    docstring for when that is an error)."""
    outcomes = _run_files(files, options, detail)
    failed = [(f, o) for f, o in zip(files, outcomes, strict=True) if isinstance(o, TraceError)]
    if failed and (options.strict or len(failed) == len(files)):
        if len(failed) == 1:
            raise failed[0][1]
        listed = "; ".join(str(e) for _, e in failed)
        read = len(files) - len(failed)
        raise TraceError(f"{f'only {read}' if read else 'none'} of the {len(files)} trace files "
                         f"could be read{' (--strict)' if read else ''}: {listed}")
    return ([o for o in outcomes if not isinstance(o, TraceError)],
            [SkippedFile(path=str(f), reason=_reason(str(e), f)) for f, e in failed])


def _reason(message: str, path: Path) -> str:
    """A one-line error without the path it starts with."""
    return message[len(f"{path}: "):] if message.startswith(f"{path}: ") else message


def _run_files(files: list[Path], options: DiagnoseOptions, detail: bool) -> list[Outcome]:
    workers = _pool_size(files, options.workers)
    if workers <= 1:
        # one trace may be decoded by a second process, unless one process was asked for
        # (the bootstrap diagnoses inside the training process, at its exit: no fork there)
        alone = len(files) == 1 and options.workers != 1
        return [_attempt(p, options, None, detail, alone) for p in files]
    # imported here: concurrent.futures registers an atexit hook on import, which fails when
    # this runs at interpreter exit (the bootstrap's rank 0 diagnoses its run at exit)
    from concurrent.futures import ProcessPoolExecutor

    limit, source = default_memory_limit()
    share = None if source == MEMORY_LIMIT_ENV else limit // workers
    n = len(files)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        packed = list(pool.map(_diagnose_packed, files, [options] * n, [share] * n,
                               [detail] * n))
    unpack = msgspec.msgpack.Decoder(Diagnosis)
    return [TraceError(extra) if doc is None else (unpack.decode(doc), extra)
            for doc, extra in packed]


def _pool_size(files: list[Path], workers: int | None) -> int:
    if workers is not None:
        return min(len(files), workers)
    if len(files) <= 1:
        return 1
    json_bytes = sum(raw_size(f) for f in files)
    return max(1, min(len(files), os.cpu_count() or 1, json_bytes // JSON_PER_WORKER))


def _diagnose_packed(path: Path, options: DiagnoseOptions, memory_limit: int | None,
                     detail: bool) -> tuple[bytes | None, TraceDetail | str | None]:
    """:func:`_diagnose_file` in a pool process: the diagnosis as msgpack, one decoder; a
    file that cannot be diagnosed gives (None, its one-line error)."""
    outcome = _attempt(path, options, memory_limit, detail, False)
    if isinstance(outcome, TraceError):
        return None, str(outcome)
    diagnosis, extra = outcome
    return msgspec.msgpack.encode(diagnosis), extra


def _attempt(path: Path, options: DiagnoseOptions, memory_limit: int | None, detail: bool,
             alone: bool) -> Outcome:
    """:func:`_diagnose_file`, or the one-line error of a file that cannot be diagnosed."""
    try:
        return _diagnose_file(path, options, memory_limit, detail, alone)
    except TraceError as exc:
        return exc


def _diagnose_file(path: Path, options: DiagnoseOptions, memory_limit: int | None,
                   detail: bool, alone: bool) -> tuple[Diagnosis, TraceDetail | None]:
    """``alone``: the only trace of this call, whose load may use a second process."""
    trace = load_trace(path, memory_limit, workers=None if alone else 1)
    rank = rank_of_trace_file(path) or 0
    machine = options.machine.get(rank) if options.machine else None
    report = options.out_of_memory.get(rank) if options.out_of_memory else None
    diagnosis = diagnose(trace, device_memory=options.device_memory, oom=options.oom,
                         top=options.top, machine=machine, out_of_memory=report,
                         windows=options.windows.get(rank) if options.windows else None,
                         run=options.runs.get(rank) if options.runs else None)
    return diagnosis, (_detail(trace) if detail else None)


def _detail(trace: Trace) -> TraceDetail:
    from torchtriage.analysis.timeline import timeline  # for the HTML report only

    return TraceDetail(timeline=timeline(trace, find_steps(trace)), memory=memory_curves(trace))


def trace_details(paths: TracePaths) -> list[TraceDetail]:
    """The :class:`TraceDetail` of each trace at ``paths`` without diagnosing them again (for
    a report of traces diagnosed elsewhere, e.g. inside the training processes), in rank
    order when the file names carry ranks."""
    files = _files(paths)
    if all(rank_of_trace_file(f) is not None for f in files):
        files.sort(key=lambda f: rank_of_trace_file(f) or 0)
    return [_detail(load_trace(path)) for path in files]
