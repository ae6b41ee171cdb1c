"""Library entry point for traces captured elsewhere."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.diagnosis.job import JobDiagnosis, diagnose_job
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.trace.discover import find_trace_files
from torchtriage.trace.ingest import MEMORY_LIMIT_ENV, default_memory_limit, load_trace
from torchtriage.trace.model import Trace
from torchtriage.units import parse_bytes


def analyze(
    path: str | os.PathLike[str],
    *,
    device_memory: int | str | None = None,
    top: int = 10,
    workers: int | None = None,
) -> list[Diagnosis]:
    """Diagnose every trace at ``path`` (a trace file, or a directory of them).

    Args:
        path: ``.json`` / ``.json.gz`` trace, a directory holding traces, or a run directory.
        device_memory: device capacity for the memory rule, as bytes or a size such as
            ``"16GiB"``; on CPU-only traces it stands in for a GPU's memory.
        top: rows in the top-ops tables.
        workers: processes that load and diagnose rank traces in parallel (default: one per
            core); each holds one trace's tables at a time.

    Raises:
        TraceError: a path or file that is not a readable Kineto trace.
    """
    return [d for _, d in _load_and_diagnose(path, device_memory, top, workers, False)]


def analyze_with_traces(
    path: str | os.PathLike[str],
    *,
    device_memory: int | str | None = None,
    top: int = 10,
    workers: int | None = None,
) -> tuple[list[Diagnosis], list[Trace]]:
    """:func:`analyze`, also returning the loaded traces (same order), for reports that draw
    from the trace itself (the HTML timeline and memory curve) without loading it twice."""
    pairs = _load_and_diagnose(path, device_memory, top, workers, True)
    return [d for _, d in pairs], [t for t, _ in pairs]


def _load_and_diagnose(path, device_memory, top: int, workers: int | None,
                       keep_traces: bool) -> list[tuple[Trace | None, Diagnosis]]:
    capacity = parse_bytes(device_memory) if device_memory is not None else None
    paths = find_trace_files(path)
    workers = min(len(paths), workers or os.cpu_count() or 1)
    if workers <= 1:
        return [_diagnose_file(p, capacity, top, None, keep_traces) for p in paths]
    # Rank traces are independent: parse and diagnose them in parallel processes, each with
    # its share of the memory limit.
    limit, source = default_memory_limit()
    share = None if source == MEMORY_LIMIT_ENV else limit // workers
    n = len(paths)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_diagnose_file, paths, [capacity] * n, [top] * n, [share] * n,
                             [keep_traces] * n))


def analyze_job(
    path: str | os.PathLike[str],
    *,
    device_memory: int | str | None = None,
    top: int = 10,
) -> JobDiagnosis:
    """Diagnose a directory of rank traces as one job: per-rank verdicts, stragglers, one
    job-level verdict (see :mod:`torchtriage.diagnosis.job`)."""
    return diagnose_job(analyze(path, device_memory=device_memory, top=top))


def _diagnose_file(path, capacity: int | None, top: int, memory_limit: int | None,
                   keep_trace: bool) -> tuple[Trace | None, Diagnosis]:
    trace = load_trace(path, memory_limit)
    return (trace if keep_trace else None), diagnose(trace, device_memory=capacity, top=top)
