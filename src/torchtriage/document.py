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
        """Write the document to ``path`` whole or not at all (:func:`write_whole`)."""
        write_whole(path, (self.to_json() + "\n").encode())

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


def write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: into a temporary file beside it (named
    for this process: two processes may write the same file, a training process and the
    ``run`` that started it), then renamed over it. A write that fails (a full disk) removes
    the temporary file and raises the ``OSError``; a reader never sees a truncated or
    interleaved file (two plain writes of one diagnosis.json left one's tail after the other's
    end: "trailing characters", in a CI run). The temporary name starts with a dot and ends
    in ``.part``, so no reader's pattern takes it for the file."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        part.write_bytes(data)
        os.replace(part, path)
    except OSError:
        part.unlink(missing_ok=True)
        raise
