"""The base of torchtriage's JSON documents (no torchtriage imports: every floor may use it).

Each document carries its id in a ``schema`` field; fields are only ever added within a
version. The table of document types by schema id is :mod:`torchtriage.results.registry`.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec


class JsonDocument(msgspec.Struct, kw_only=True):
    """Base of the documents: typed structs that print as JSON."""

    def to_json(self, *, indent: int = 2) -> str:
        """The document as JSON text (``indent=0``: one line)."""
        raw = msgspec.json.encode(self)
        return msgspec.json.format(raw, indent=indent).decode() if indent else raw.decode()

    def write(self, path: Path) -> None:
        """Write the document to ``path`` whole or not at all: into a temporary file beside it,
        then renamed over it. A write that fails (a full disk) removes the temporary file and
        raises the ``OSError``; a reader never sees a truncated document."""
        part = path.with_name(f".{path.name}.part")
        try:
            part.write_text(self.to_json())
            os.replace(part, path)
        except OSError:
            part.unlink(missing_ok=True)
            raise

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)
