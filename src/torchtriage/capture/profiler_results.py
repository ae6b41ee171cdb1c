"""What a stopped profiler holds: its events counted, its results dropped and their memory
given back to the system; the memory limit the cost guard holds a window against, and the
process's resident memory that the probe's watch reads.

The profiling session (:mod:`torchtriage.capture.session`) calls these between steps, on the
training thread; none raises into the training loop except :func:`count_events` (the session
catches it).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from typing import Any

from torchtriage.errors import TorchtriageError

log = logging.getLogger(__name__)


def memory_limit() -> tuple[int, str] | None:
    """The memory torchtriage may use (trace/ingest.py's limit), or None when
    ``TORCHTRIAGE_MEMORY_LIMIT`` is not a size: the training goes on, the memory unassessed."""
    from torchtriage.trace.ingest import default_memory_limit

    try:
        return default_memory_limit()
    except TorchtriageError as exc:
        log.warning("torchtriage: %s; the profiler's memory is not assessed", exc)
        return None


def count_events(probe: Any) -> int:
    """Events a stopped profiler recorded (ops, memory, device activity), without building
    the Python event list, and its results freed now rather than by the garbage collector at
    some later point. The probe never profiles memory: with ``profile_memory`` its
    allocations, freed while the window recorded, crashed the process (segmentation fault in
    2 runs of 10 of tests/scripts/closure_regression.py; none in 20 without)."""
    inner = getattr(probe, "profiler", None)
    results = getattr(inner, "kineto_results", None)
    try:
        return len(results.events()) if results is not None else len(probe.events())
    finally:
        del results
        free_results(probe, collect=False)
        return_freed_memory()


def free_results(prof: Any, collect: bool = True) -> None:
    """Drop what a stopped profiler keeps of its window once the trace is written, and
    (``collect``) reclaim it now. torch 2.11 turns every recorded event into a Python
    ``FunctionEvent`` when the profiler stops, linked to its parent and children (cycles): on
    an H200 a window of 6,612 events left ~130 ms of garbage collection that ran one or two
    steps later, inside the steps timed to check the window (a 5 ms step took 134 ms, and the
    window was judged not steady state). Collected here, in the step that writes the trace,
    which the check leaves out."""
    inner = getattr(prof, "profiler", None)
    if inner is not None:
        inner.kineto_results = None
        inner._function_events = None
        inner._old_function_events = None
    prof.profiler = None
    if collect:
        gc.collect()
        return_freed_memory()


def return_freed_memory() -> None:
    """Give the memory the profiler's results freed back to the system (glibc's
    ``malloc_trim``): glibc keeps it otherwise, and the training process would hold the
    window's peak for the rest of its life (time_sequence_prediction: 10.5 GB after its probed
    step, 1.4 GB before it). Nothing where there is no glibc."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # (no glibc: musl, macOS)
        ctypes.CDLL(None).malloc_trim(0)


def resident_bytes() -> int:
    """This process's resident memory now: Linux's ``/proc/self/statm`` read directly (a few
    µs, polled while the probe records), psutil elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil

        return int(psutil.Process().memory_info().rss)
