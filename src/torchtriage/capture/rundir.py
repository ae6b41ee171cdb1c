"""The output directory of ``run``, ``ab`` and ``fix`` (``--out DIR``): torchtriage never deletes
or overwrites a file it did not write in this run.

- A missing or empty DIR is used (created), and marked as torchtriage's with ``DIR/.torchtriage``.
- A DIR that holds a previous torchtriage run (the mark, or, from versions before the mark, a
  run record ``run.rank<N>.json``, ``ab.json``, ``trials.jsonl`` or ``fix.json`` among files
  that all have torchtriage's names) is reused: everything in it moves into
  ``DIR/previous-<YYYYmmdd-HHMMSS>/`` (earlier ``previous-*`` folders stay where they are), and
  the new run starts in an empty DIR.
- Any other non-empty DIR is refused with a one-line error (exit 2), as is a DIR that is a file.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from torchtriage.errors import TorchtriageError

MARK = ".torchtriage"
PREVIOUS = "previous-"
# What torchtriage writes in a run, ab or fix directory (a directory from before the mark is
# recognised by these names).
_OWN = re.compile(
    r"^(run\.rank\d+\.json|window\.rank\d+\.json|rank\d+_.*\.pt\.trace\.json(\.gz)?|"
    r"diagnosis\.json|report\.html|superseded|ab\.json|trials\.jsonl|trials|fix\.json|"
    r"fix\.md|fix\.patch|profiles|ab|final|output\.log|dataset|\.ranks)$")
_RECORDS = re.compile(r"^(run\.rank\d+\.json|ab\.json|trials\.jsonl|fix\.json)$")


def claim_run_dir(out: Path) -> Path | None:
    """Make ``out`` an empty directory of this run (see the module docstring); returns the
    folder the previous run's files were moved into, or None.

    Raises:
        TorchtriageError: ``out`` is a file, holds files torchtriage did not write, or cannot
            be created.
    """
    if out.exists() and not out.is_dir():
        raise TorchtriageError(f"--out {out} is a file, not a directory: give a directory "
                               "(a new one is created)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        entries = [e for e in out.iterdir()
                   if not (e.name.startswith(PREVIOUS) and e.is_dir())]
        moved = _move_previous(out, entries) if entries else None
        (out / MARK).write_text(json.dumps({"tool": "torchtriage", "pid": os.getpid(),
                                            "started": time.time()}) + "\n")
    except OSError as exc:
        raise TorchtriageError(f"cannot use --out {out}: {exc.strerror or exc}") from None
    return moved


def _move_previous(out: Path, entries: list[Path]) -> Path:
    names = {e.name for e in entries}
    ours = MARK in names or (any(_RECORDS.match(n) for n in names)
                             and all(_OWN.match(n) for n in names))
    if not ours:
        foreign = sorted(n for n in names if not _OWN.match(n)) or sorted(names)
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more"
                                          if len(foreign) > 3 else "")
        raise TorchtriageError(f"--out {out} holds files torchtriage did not write ({shown}); "
                               "give a new or empty directory (a previous torchtriage run "
                               "directory is fine: its files move to previous-<time>/)")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = out / f"{PREVIOUS}{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = out / f"{PREVIOUS}{stamp}-{n}"
    target.mkdir()
    for entry in entries:
        entry.rename(target / entry.name)
    return target
