"""Shared fixtures: paths to the shared real traces, synthetic trace writers, example runs."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("TORCHTRIAGE_SHARED_TRACES", REPO.parent / "shared" / "traces"))


def write_trace(path: Path, events: list[dict], gz: bool = False, **top) -> Path:
    """Write a chrome-trace JSON file with ``events`` and top-level keys ``top``."""
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    data = json.dumps(doc).encode()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def x(name: str, ts: float, dur: float, cat: str = "cpu_op", pid=1, tid=1, **args) -> dict:
    """A complete ("X") event."""
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = {k.replace("_", " "): v for k, v in args.items()}
    return ev


def profiler_steps(n: int, body) -> list[dict]:
    """``n`` 10 ms ``ProfilerStep#`` ranges, each with the events ``body(step_start_us)``."""
    events = []
    for i in range(n):
        base = i * 10_000.0
        events.append(x(f"ProfilerStep#{i + 1}", base, 10_000, cat="user_annotation"))
        events += body(base)
    return events


def pytest_configure(config):
    """The suite starts a few hundred Python processes that import torchtriage. Where bytecode
    is not written (``PYTHONDONTWRITEBYTECODE``, set in this project's CI machines), each of
    them compiled the package's sources again (0.5-0.6 s of a process's start, measured on
    2026-12-03); they are compiled once here (compileall writes regardless of that setting,
    and skips what is up to date). And every process they start skips the interpreter's final
    garbage collection (``tests/site/usercustomize.py``, on ``PYTHONPATH`` from here).

    Idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, unless set):
    the two workers' tests run several torch processes at once on 2 cores, each with 2
    intra-op threads, and torch's OpenMP threads spin between parallel regions, so that each
    process ran on the cores the others' spinning left. Three copies of a test script at once
    took 48.9 s with spinning and 21.4 s without (one alone: 10.6 s and 10.8 s; 2026-12-03),
    and a memory-ladder rung that takes 10 s alone took 56 s in the suite."""
    import compileall

    compileall.compile_dir(REPO / "src", quiet=2)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    site_dir = str(REPO / "tests" / "site")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if site_dir not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([site_dir, *paths])


PAIRED_LANES = ("cpu", "sleep")  # the lanes of `paired` timing tests (pytest.ini_options)


def pytest_collection_modifyitems(config, items):
    """A ``paired(lane)`` timing test runs in its lane's xdist group: the test command runs the
    paired tests with ``-n 2 --dist loadgroup``, one lane per worker, so that a test of the
    ``cpu`` lane (one that keeps both cores busy) only ever runs beside tests of the ``sleep``
    lane (sleep-bound scripts whose asserted effects are 1.5x and more), never beside another
    CPU-bound one. Measured side by side on 2 cores (2026-12-03): the sleep lane's three tests
    in 142 s (146 s alone, one after another) beside the cpu lane's one (70 s; 80 s alone), all
    passing."""
    for item in items:
        marker = item.get_closest_marker("paired")
        if marker is None:
            continue
        lane = marker.args[0] if marker.args else None
        if lane not in PAIRED_LANES or item.get_closest_marker("timing") is None:
            raise pytest.UsageError(f"{item.nodeid}: paired() takes one of {PAIRED_LANES} and "
                                    "marks timing tests only")
        item.add_marker(pytest.mark.xdist_group(name=f"paired-{lane}"))


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


@pytest.fixture(autouse=True)
def run_store(tmp_path_factory, monkeypatch) -> Path:
    """Every test records into its own run store, never the user's (subprocesses inherit it)."""
    path = tmp_path_factory.mktemp("store") / "runs.sqlite"
    monkeypatch.setenv("TORCHTRIAGE_STORE", str(path))
    return path
