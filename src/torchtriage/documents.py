"""torchtriage's JSON documents, by schema id: one table for `schema`, `show` and the docs.

Each document carries its id in a ``schema`` field; fields are only ever added within a version.
"""

from __future__ import annotations

from typing import Any

import msgspec

from torchtriage.errors import TorchtriageError


class JsonDocument(msgspec.Struct, kw_only=True):
    """Base of the documents: typed structs that print as JSON."""

    def to_json(self, *, indent: int = 2) -> str:
        """The document as JSON text (``indent=0``: one line)."""
        raw = msgspec.json.encode(self)
        return msgspec.json.format(raw, indent=indent).decode() if indent else raw.decode()

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


def _types() -> dict[str, tuple[str, type]]:
    from torchtriage.diagnosis.job import JOB_SCHEMA, JobDiagnosis
    from torchtriage.diagnosis.result import SCHEMA, Diagnosis
    from torchtriage.fix import result as fix
    from torchtriage.verify import ab, compare

    return {
        "diagnosis": (SCHEMA, Diagnosis),
        "job": (JOB_SCHEMA, JobDiagnosis),
        "compare": (compare.SCHEMA, compare.Comparison),
        "ab": (ab.SCHEMA, ab.ABResult),
        "fix": (fix.SCHEMA, fix.FixResult),
    }


DOCUMENTS = ("diagnosis", "job", "compare", "ab", "fix")


def json_schema(document: str = "diagnosis") -> dict:
    """The JSON Schema of a document (committed as ``docs/<document>.schema.json``)."""
    types = _types()
    if document not in types:
        raise TorchtriageError(f"unknown document {document!r}; one of {', '.join(DOCUMENTS)}")
    schema_id, kind = types[document]
    schema = msgspec.json.schema(kind)
    schema["$id"] = schema_id
    return schema


def decode_document(doc: dict[str, Any]) -> Any:
    """A stored JSON document back as its typed object."""
    by_id = {schema_id: kind for schema_id, kind in _types().values()}
    kind = by_id.get(doc.get("schema", ""))
    if kind is None:
        raise TorchtriageError(f"unknown document schema {doc.get('schema')!r}")
    return msgspec.convert(doc, kind)
