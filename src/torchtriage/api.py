"""The library's facade for traces captured elsewhere: diagnose, compare, render.

Every function takes a path (a trace file, a directory of rank traces, or a run directory)
and returns a typed document; the one decision between a single diagnosis and a job's is
made by :func:`torchtriage.diagnosis.traces.diagnose_traces`.
"""

from __future__ import annotations

import os

from torchtriage.diagnosis.job import JobDiagnosis, diagnose_job
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.diagnosis.traces import DiagnoseOptions, diagnose_traces
from torchtriage.document import JsonDocument
from torchtriage.report.render import render_text as _render_text
from torchtriage.units import parse_bytes

PathLike = str | os.PathLike[str]


def _options(device_memory: int | str | None, top: int, workers: int | None
             ) -> DiagnoseOptions:
    capacity = parse_bytes(device_memory) if device_memory is not None else None
    return DiagnoseOptions(device_memory=capacity, top=top, workers=workers)


def diagnose(
    path: PathLike,
    *,
    device_memory: int | str | None = None,
    top: int = 10,
    workers: int | None = None,
) -> Diagnosis | JobDiagnosis:
    """Diagnose the trace(s) at ``path``.

    Args:
        path: ``.json`` / ``.json.gz`` trace, a directory holding traces, or a run directory.
        device_memory: device capacity for the memory rule, as bytes or a size such as
            ``"16GiB"``; on CPU-only traces it stands in for a GPU's memory.
        top: rows in the top-ops tables.
        workers: processes that load and diagnose rank traces in parallel (default: one per
            core); each holds one trace's tables at a time.

    Returns:
        A :class:`Diagnosis` for one trace, a :class:`JobDiagnosis` for several (its
        ``rank_diagnoses`` are the per-rank diagnoses).

    Raises:
        TraceError: a path or file that is not a readable Kineto trace.
    """
    return diagnose_traces(path, _options(device_memory, top, workers))


def analyze(
    path: PathLike,
    *,
    device_memory: int | str | None = None,
    top: int = 10,
    workers: int | None = None,
) -> list[Diagnosis]:
    """Diagnose every trace at ``path``, one :class:`Diagnosis` per trace (by rank).

    Args: as :func:`diagnose`.

    Returns:
        The per-rank diagnoses (one element for a single trace).

    Raises:
        TraceError: a path or file that is not a readable Kineto trace.
    """
    return diagnose(path, device_memory=device_memory, top=top, workers=workers
                    ).rank_diagnoses


def analyze_job(
    path: PathLike,
    *,
    device_memory: int | str | None = None,
    top: int = 10,
) -> JobDiagnosis:
    """Diagnose a directory of rank traces as one job: per-rank verdicts, stragglers, one
    job-level verdict (see :mod:`torchtriage.diagnosis.job`); a single trace makes a job of
    one rank.

    Args: as :func:`diagnose`.

    Returns:
        The :class:`JobDiagnosis`.
    """
    doc = diagnose(path, device_memory=device_memory, top=top)
    return doc if isinstance(doc, JobDiagnosis) else diagnose_job([doc])


def render_text(doc: JsonDocument, *, width: int = 110) -> str:
    """The terminal report of any torchtriage document (a diagnosis, a job, a comparison, an
    A/B or fix result) as plain text.

    Args:
        doc: the document, e.g. ``prof.diagnosis`` or what :func:`diagnose` returned.
        width: columns.

    Returns:
        The report, without colour codes.
    """
    return _render_text(doc, width=width)
