"""Damaged inputs get the right one-line message: a run store whose file is damaged, trace
entries that are not event objects, a run that recorded nothing (issue 18, item 11)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_trace, x

from torchtriage.cli import main
from torchtriage.verify.store import RunStore

CLI = [sys.executable, "-m", "torchtriage"]
PAGE = 4096  # SQLite's default page size, which the store keeps


def _store_with_runs(path: Path, runs: int = 44) -> Path:
    with RunStore(path) as store:
        for _ in range(runs):
            run_id = store.start_run("compare", ["a", "b"])
            store.finish_run(run_id, "done", "summary", {"k": "v" * 1500})
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every row in the main file
    db.close()
    return path


def _damage_runs_root(path: Path) -> None:
    """Zero the high byte of the first cell pointer of the runs table's root page: an
    interior page (44 runs of 1.5 kB do not fit one page) whose first child is then read from
    the wrong place. SQLite reads no error when looking up run 1 through it: it finds no row."""
    db = sqlite3.connect(path)
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name='runs'").fetchone()[0]
    assert db.execute("PRAGMA page_size").fetchone()[0] == PAGE
    db.close()
    data = bytearray(path.read_bytes())
    start = (root - 1) * PAGE
    assert data[start] == 0x05, "the runs table's root should be an interior page"
    data[start + 12] = 0
    path.write_bytes(bytes(data))


def test_show_on_a_damaged_store_says_it_is_damaged_not_that_the_run_is_missing(tmp_path,
                                                                              capsys):
    store = _store_with_runs(tmp_path / "runs.sqlite")
    _damage_runs_root(store)
    assert main(["show", "1", "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no run 1" not in err
    assert err.startswith(f"torchtriage: error: run store {store} is damaged (")
    assert ".recover" in err and "\n" not in err


def test_compare_into_a_damaged_store_is_refused_not_stored_as_a_new_run(shared_traces,
                                                                        tmp_path):
    store = _store_with_runs(tmp_path / "runs.sqlite")
    _damage_runs_root(store)
    base = shared_traces / "hta" / "trace_compare"
    done = subprocess.run([*CLI, "compare", str(base / "base"), str(base / "test"),
                           "--store", str(store)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "stored as run" not in done.stdout
    assert f"run store {store} is damaged" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_compare_into_a_damaged_default_store_warns_and_still_compares(shared_traces,
                                                                      tmp_path):
    default = tmp_path / "data" / "torchtriage" / "runs.sqlite"
    default.parent.mkdir(parents=True)
    _damage_runs_root(_store_with_runs(default))
    base = shared_traces / "hta" / "trace_compare"
    env = {k: v for k, v in os.environ.items() if k != "TORCHTRIAGE_STORE"}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    done = subprocess.run([*CLI, "compare", str(base / "base"), str(base / "test")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "stored as run" not in done.stdout
    assert "is damaged" in done.stderr and "not recording this run" in done.stderr


@pytest.mark.parametrize("column, value, message", [
    ("summary", "CAST(x'ff' AS TEXT)", "a record's text is not UTF-8"),
    ("result", "'{\"unfinished'", "run 1's record does not decode"),
    ("knobs", "'[1]'", "run 1's record does not decode"),
])
def test_a_record_that_does_not_decode_is_a_damaged_store_not_a_traceback(
        tmp_path, capsys, column, value, message):
    store = _store_with_runs(tmp_path / "runs.sqlite", runs=2)
    db = sqlite3.connect(store)
    db.execute(f"UPDATE runs SET {column}={value} WHERE id=1")
    db.commit()
    db.close()
    assert main(["show", "1", "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"torchtriage: error: run store {store} is damaged ({message}")
    assert "\n" not in err and len(err) < 400


def test_a_missing_run_in_a_sound_store_is_still_no_run(tmp_path, capsys):
    store = _store_with_runs(tmp_path / "runs.sqlite", runs=2)
    assert main(["show", "7", "--store", str(store)]) == 2
    assert f"no run 7 in the run store {store}" in capsys.readouterr().err


EVENT = x("aten::mm", 10, 5)


@pytest.mark.parametrize("events, message", [
    ([5, EVENT], "traceEvents holds an entry that is not an event object: expected "
                 "`object`, got `int`"),
    ([EVENT, "text", EVENT], "traceEvents holds an entry that is not an event object: "
                             "expected `object`, got `str`"),
    ([EVENT, [1, 2], EVENT], "traceEvents holds an entry that is not an event object: "
                             "expected `object`, got `array`"),
    ([EVENT, {**EVENT, "name": 5}], "Expected `str`, got `int` in an event's name"),
])
def test_an_entry_of_trace_events_that_is_not_an_event_is_named_as_such(tmp_path, capsys,
                                                                        events, message):
    path = write_trace(tmp_path / "t.json", events)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"torchtriage: error: {path}: not a Kineto trace ({message})"
    assert "top level" not in err


def test_a_top_level_that_is_not_an_object_is_still_said_so(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text("[[1, 2], [3, 4]]")
    assert main(["analyze", str(path)]) == 2
    assert "not a Kineto trace (top level is not a JSON object)" in capsys.readouterr().err


def test_a_run_that_recorded_nothing_names_no_directory_of_run_records(tmp_path):
    from torchtriage.capture.runner import RunResult, describe_failure

    empty = RunResult(out=tmp_path, returncode=1, timed_out=False, traces=[], records=[])
    message = describe_failure(empty, None)
    assert message == "the command exited with code 1; nothing was profiled"
