"""What the commands share: sizes from options, the run store, writing reports, printing.

Everything heavy (rich, the report pages) is imported inside the function that needs it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from torchtriage.errors import TorchtriageError

if TYPE_CHECKING:
    from rich.console import Console

    from torchtriage.diagnosis.job import JobDiagnosis
    from torchtriage.diagnosis.result import Diagnosis
    from torchtriage.diagnosis.traces import TraceDetail
    from torchtriage.document import JsonDocument
    from torchtriage.verify.store import RunStore


def capacity(device_memory: str | None) -> int | None:
    """``--device-memory`` in bytes, or None."""
    if device_memory is None:
        return None
    from torchtriage.units import parse_bytes

    return parse_bytes(device_memory)


def console(*, stderr: bool = False) -> Console:
    """rich's console, without emoji codes: names from traces print as written (an op named
    ``x:fire:y`` is not given an emoji), and rich's table of emoji codes is not loaded (7 ms
    of a small ``analyze``)."""
    from rich.console import Console

    return Console(stderr=stderr, emoji=False)


def print_document(doc: JsonDocument) -> None:
    """The terminal view of any document, on stdout."""
    from torchtriage.report.render import renderable

    console().print(renderable(doc))


def write_json(doc: JsonDocument) -> None:
    sys.stdout.write(doc.to_json() + "\n")


def open_store(path: Path | None, *, required: bool) -> RunStore | None:
    """The run store; when it was not asked for explicitly and cannot be opened, a one-line
    warning and no store (profiling must not fail for want of a history)."""
    from torchtriage.verify.store import ENV, RunStore

    explicit = path is not None or bool(os.environ.get(ENV))
    try:
        return RunStore(path)
    except TorchtriageError as exc:
        if explicit or required:
            raise
        print(f"torchtriage: warning: {exc}; not recording this run", file=sys.stderr)
        return None


def write_html(target: Path, source: Path, doc: Diagnosis | JobDiagnosis,
               details: list[TraceDetail] | None, *, quiet: bool) -> None:
    """The diagnosis report; the timeline and the memory curve come from ``details``."""
    from torchtriage.report.html import diagnosis_page

    write_page(target, diagnosis_page(doc, details, title=f"torchtriage: {source.name or source}"),
               quiet=quiet)


def write_page(target: Path, page: str, *, quiet: bool) -> None:
    from torchtriage.report.html import write_page as write

    try:
        write(target, page)
    except OSError as exc:
        raise TorchtriageError(f"cannot write {target}: {exc.strerror or exc}") from None
    if not quiet:
        kind = "Markdown" if target.suffix.lower() in (".md", ".markdown") else "HTML"
        console(stderr=True).print(f"[dim]{kind} report: {target}[/dim]")
