"""Find trace files in a path: a file, or a directory holding ``*.json`` / ``*.json.gz`` traces."""

from __future__ import annotations

import os
import re
from pathlib import Path

from torchtriage.errors import TraceError

TRACE_SUFFIXES = (".json", ".json.gz")
# Files torchtriage itself writes next to traces (diagnosis.json, run.json, run.rank<N>.json,
# window.rank<N>.json, ab.json, compare.json, fix.json).
_OWN_FILES = re.compile(r"^(diagnosis|run(\.rank\d+)?|window\.rank\d+|ab|compare|fix)\.json$")


# a run directory's folders of traces that are not its windows: set aside, the stall window's
_ASIDE = frozenset({"superseded", "stall"})


def find_trace_files(path: str | os.PathLike[str]) -> list[Path]:
    """The trace files at ``path``, sorted by name.

    A file is returned as is, whatever its suffix. A directory is searched (not recursively,
    then one level down when the top holds none, which is the layout of a run directory with a
    ``traces/`` folder, never into a run directory's ``superseded/`` and ``stall/``) for
    ``*.json`` and ``*.json.gz``.

    Raises:
        TraceError: the path does not exist, or the directory holds no trace files.
    """
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    if p.is_file():
        return [p]
    found = _traces_in(p)
    if not found:
        for sub in sorted(q for q in p.iterdir() if q.is_dir() and q.name not in _ASIDE):
            found.extend(_traces_in(sub))
    if not found:
        raise TraceError(f"{p}: directory holds no trace files (*.json, *.json.gz)")
    return found


def _traces_in(directory: Path) -> list[Path]:
    return sorted(
        q
        for q in directory.iterdir()
        if q.is_file() and q.name.endswith(TRACE_SUFFIXES) and not _OWN_FILES.match(q.name)
    )


def rank_of_trace_file(path: Path) -> int | None:
    """The rank in a ``rank<N>_<pid>...`` file name (as ``torchtriage run`` names traces)."""
    head = path.name.split("_", 1)[0]
    return int(head[4:]) if head.startswith("rank") and head[4:].isdigit() else None
