"""The run store: every run, trial and verdict, in SQLite, written the moment it completes.

Location: ``--store PATH``, else ``$TORCHTRIAGE_STORE``, else
``$XDG_DATA_HOME/torchtriage/runs.sqlite`` (``~/.local/share/...``). The database runs in WAL
mode and commits after every row, so a harness killed with SIGKILL loses at most the trial it
was running; a run whose process is gone without finishing reads back as ``interrupted``.
Opening checks the file's structure (SQLite's ``quick_check``, about 0.5 ms per MB): a damaged
store is refused with one line saying so, never read as one that lacks a run or written into
as if it were sound; a record whose text no longer decodes is refused the same way.
Results are stored as the JSON documents the commands print, so ``torchtriage show ID``
renders them again exactly.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchtriage.errors import TorchtriageError

ENV = "TORCHTRIAGE_STORE"
SCHEMA_VERSION = 1
RUN_KINDS = ("run", "ab", "compare", "fix")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    created REAL NOT NULL,
    finished REAL,
    status TEXT NOT NULL,          -- running | done | failed (| interrupted when read back)
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    cwd TEXT NOT NULL,
    command TEXT NOT NULL,         -- JSON list, or the compared paths
    knobs TEXT NOT NULL,           -- JSON object
    out_dir TEXT,
    summary TEXT,                  -- one line for `history`
    result TEXT                    -- the JSON document the command printed
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    arm TEXT NOT NULL,
    idx INTEGER NOT NULL,
    status TEXT NOT NULL,          -- ok | failed | timeout | oom
    started REAL NOT NULL,
    finished REAL NOT NULL,
    data TEXT NOT NULL             -- the trial as JSON
);
CREATE INDEX IF NOT EXISTS trials_run ON trials(run_id);
"""


def default_path() -> Path:
    """``$TORCHTRIAGE_STORE``, else the user data directory."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "torchtriage" / "runs.sqlite"


@dataclass(frozen=True)
class RunRow:
    id: int
    kind: str
    created: float
    finished: float | None
    status: str
    command: Any
    knobs: dict[str, Any]
    out_dir: str | None
    summary: str | None
    result: dict[str, Any] | None


class RunStore:
    """A connection to the store. Every write commits immediately."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        if self.path.is_dir():
            raise TorchtriageError(f"run store {self.path} is a directory; give a file path")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise TorchtriageError(
                    f"run store {self.path} was written by a newer torchtriage "
                    f"(store version {version}, this one knows {SCHEMA_VERSION})")
            tables = {r[0] for r in self._db.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "runs" not in tables:
                raise TorchtriageError(f"{self.path} is an SQLite file but not a torchtriage "
                                       "run store")
            problem = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
            if problem != "ok":
                raise self._damaged(problem)
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            # a malformed schema is a text that is not UTF-8 as well as a DatabaseError
            if isinstance(exc, UnicodeDecodeError) or "malformed" in str(exc):
                raise self._damaged(exc) from None
            raise TorchtriageError(f"cannot use run store {self.path}: {_line(exc)}") from None
        except OSError as exc:
            raise TorchtriageError(f"cannot create run store {self.path}: "
                                   f"{exc.strerror or exc}") from None

    def _damaged(self, problem: object) -> TorchtriageError:
        return TorchtriageError(
            f"run store {self.path} is damaged ({_line(problem)}); move it aside (a new store "
            f"starts in its place) or recover what it holds with: sqlite3 {self.path} .recover")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing ----------------------------------------------------------------------------

    def start_run(self, kind: str, command: Any, *, knobs: dict[str, Any] | None = None,
                  out_dir: str | os.PathLike[str] | None = None) -> int:
        if kind not in RUN_KINDS:
            raise ValueError(f"unknown run kind {kind!r}")
        cur = self._write(
            "INSERT INTO runs (kind, created, status, host, pid, cwd, command, knobs, out_dir) "
            "VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?)",
            (kind, time.time(), socket.gethostname(), os.getpid(), os.getcwd(),
             json.dumps(command), json.dumps(knobs or {}),
             str(Path(out_dir).resolve()) if out_dir is not None else None))
        return int(cur.lastrowid)

    def add_trial(self, run_id: int, arm: str, idx: int, status: str, started: float,
                  data: dict[str, Any]) -> None:
        self._write("INSERT INTO trials (run_id, arm, idx, status, started, finished, data) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (run_id, arm, idx, status, started, time.time(), json.dumps(data)))

    def record_trial(self, run_id: int, trial: Any, **extra: Any) -> None:
        """Commit a finished A/B trial (a :class:`~torchtriage.results.ab.Trial`) under a run,
        with ``extra`` fields beside its own (the fix loop names the trial's A/B)."""
        import msgspec

        self.add_trial(run_id, trial.arm, trial.idx, trial.status, time.time() - trial.wall_s,
                       {**msgspec.to_builtins(trial), **extra})

    def finish_run(self, run_id: int, status: str, summary: str,
                   result: dict[str, Any] | None = None) -> None:
        self._write("UPDATE runs SET finished=?, status=?, summary=?, result=? WHERE id=?",
                    (time.time(), status, summary,
                     json.dumps(result) if result is not None else None, run_id))

    def _write(self, sql: str, params: tuple) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, params)  # autocommit: one transaction per row
        except sqlite3.DatabaseError as exc:
            raise TorchtriageError(f"cannot write run store {self.path}: {_line(exc)}") from None

    # --- reading ----------------------------------------------------------------------------

    def runs(self, *, limit: int = 20, kind: str | None = None) -> list[RunRow]:
        sql, params = "SELECT * FROM runs", []
        if kind:
            sql += " WHERE kind=?"
            params.append(kind)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        return [self._row(r) for r in self._query(sql, tuple(params))]

    def run(self, run_id: int) -> RunRow:
        rows = self._query("SELECT * FROM runs WHERE id=?", (run_id,))
        if not rows:
            raise TorchtriageError(f"no run {run_id} in the run store {self.path}")
        return self._row(rows[0])

    def trials(self, run_id: int) -> list[dict[str, Any]]:
        rows = self._query("SELECT arm, idx, status, started, finished, data FROM trials "
                           "WHERE run_id=? ORDER BY id", (run_id,))
        return [{**json.loads(data), "arm": arm, "idx": idx, "status": status,
                 "started": started, "finished": finished}
                for arm, idx, status, started, finished, data in rows]

    def _query(self, sql: str, params: tuple) -> list[tuple]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            if "decode" in str(exc):  # "Could not decode to UTF-8 column ... with text ..."
                raise self._damaged("a record's text is not UTF-8") from None
            raise TorchtriageError(f"cannot read run store {self.path}: {_line(exc)}") from None

    def _row(self, r: tuple) -> RunRow:
        (run_id, kind, created, finished, status, host, pid, _cwd, command, knobs, out_dir,
         summary, result) = r
        if status == "running" and not _alive(host, pid):
            status = "interrupted"
        try:
            decoded = (json.loads(command), json.loads(knobs),
                       json.loads(result) if result else None)
            if not isinstance(decoded[1], dict) or not isinstance(decoded[2], dict | None):
                raise ValueError("not a JSON object")
        except (TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise self._damaged(f"run {run_id}'s record does not decode: {exc}") from None
        return RunRow(id=run_id, kind=kind, created=created, finished=finished, status=status,
                      command=decoded[0], knobs=decoded[1], out_dir=out_dir, summary=summary,
                      result=decoded[2])


def _line(problem: object, limit: int = 160) -> str:
    """SQLite's message as one short line (a decoding error quotes the whole text)."""
    text = " ".join(str(problem).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _alive(host: str, pid: int) -> bool:
    """Whether the process that started a run may still be running it."""
    if host != socket.gethostname():
        return True  # another machine: cannot tell
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
