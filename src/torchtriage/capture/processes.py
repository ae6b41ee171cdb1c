"""The processes of a command torchtriage started: its process group, and the descendants that
left it (torchrun starts each worker in a session of its own), read from ``/proc``.

Used to stop a command without leaving anything behind: a snapshot of the family is taken
while the tree is whole (a worker whose launcher died is re-parented and cannot be found from
the command any more), and what is still alive of it at the end is SIGKILLed. A pid is only
killed when its start time is the one in the snapshot (never a reused pid).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after ``pid (comm)``: state, ppid, pgrp, ... (field 3 of
    proc(5) is index 0); None when the process is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def _table() -> dict[int, list[str]]:
    table = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat(entry.name)
            if fields is not None and len(fields) > 19:
                table[int(entry.name)] = fields
    return table


def _alive(fields: list[str]) -> bool:
    return fields[0] not in ("Z", "X")  # a zombie is dead: it only waits to be reaped


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies left out) in process group ``pgid``; without ``/proc``, the
    group leader when the group still answers a signal."""
    if not _PROC.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    return [pid for pid, f in _table().items() if f[2] == str(pgid) and _alive(f)]


def family(pid: int) -> dict[int, str]:
    """``pid``'s process group and every live descendant of ``pid``: pid -> start time."""
    if not _PROC.is_dir():
        return {}
    table = _table()
    children: dict[int, list[int]] = {}
    for child, f in table.items():
        children.setdefault(int(f[1]), []).append(child)
    found = {p for p, f in table.items() if f[2] == str(pid)}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.add(pid)
    return {p: table[p][19] for p in found if p in table and _alive(table[p])}


def survivors(snapshot: dict[int, str]) -> list[int]:
    """The processes of a :func:`family` snapshot that are still alive (same start time)."""
    out = []
    for pid, started in snapshot.items():
        fields = _stat(pid)
        if fields is not None and len(fields) > 19 and fields[19] == started and _alive(fields):
            out.append(pid)
    return out


def send(pgid: int, snapshot: dict[int, str], signum: int) -> None:
    """``signum`` to process group ``pgid`` and to whatever is left of ``snapshot``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
    for pid in survivors(snapshot):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def kill(pgid: int, snapshot: dict[int, str]) -> None:
    """SIGKILL process group ``pgid`` and whatever is left of ``snapshot``."""
    send(pgid, snapshot, signal.SIGKILL)
