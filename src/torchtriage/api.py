"""Library entry point for traces captured elsewhere."""

from __future__ import annotations

import os

from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.trace.discover import find_trace_files
from torchtriage.trace.ingest import load_trace
from torchtriage.units import parse_bytes


def analyze(
    path: str | os.PathLike[str],
    *,
    device_memory: int | str | None = None,
    top: int = 10,
) -> list[Diagnosis]:
    """Diagnose every trace at ``path`` (a trace file, or a directory of them).

    Args:
        path: ``.json`` / ``.json.gz`` trace, a directory holding traces, or a run directory.
        device_memory: device capacity for the memory rule, as bytes or a size such as
            ``"16GiB"``; on CPU-only traces it stands in for a GPU's memory.
        top: rows in the top-ops tables.

    Raises:
        TraceError: a path or file that is not a readable Kineto trace.
    """
    capacity = parse_bytes(device_memory) if device_memory is not None else None
    return [
        diagnose(load_trace(p), device_memory=capacity, top=top) for p in find_trace_files(path)
    ]
