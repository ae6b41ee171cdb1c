"""Every JSON document type by name and schema id: one table for ``torchtriage schema``,
``torchtriage show``, stored results and the committed ``docs/*.schema.json``.

Adding a document type is one row here (and its schema file, which a test regenerates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from torchtriage.diagnosis.job import JOB_SCHEMA, JobDiagnosis
from torchtriage.diagnosis.result import SCHEMA as DIAGNOSIS_SCHEMA
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.document import JsonDocument
from torchtriage.errors import TorchtriageError
from torchtriage.results import ab, compare, fix, run


@dataclass(frozen=True)
class DocumentType:
    name: str  # what `torchtriage schema NAME` takes
    schema_id: str  # the value of the document's `schema` field
    type: type[JsonDocument]
    what: str  # where users meet it


REGISTRY: tuple[DocumentType, ...] = (
    DocumentType("diagnosis", DIAGNOSIS_SCHEMA, Diagnosis,
                 "analyze --json, diagnosis.json of one trace"),
    DocumentType("job", JOB_SCHEMA, JobDiagnosis, "diagnosis.json of several ranks"),
    DocumentType("compare", compare.SCHEMA, compare.Comparison, "compare --json"),
    DocumentType("ab", ab.SCHEMA, ab.ABResult, "ab.json, ab --json"),
    DocumentType("fix", fix.SCHEMA, fix.FixResult, "fix.json, fix --json"),
    DocumentType("run", run.SCHEMA, run.RunRecord,
                 "run.rank<N>.json of torchtriage run, run.json of torchtriage.profile"),
)
DOCUMENTS: tuple[str, ...] = tuple(d.name for d in REGISTRY)
_BY_NAME = {d.name: d for d in REGISTRY}
_BY_ID = {d.schema_id: d for d in REGISTRY}


def json_schema(document: str = "diagnosis") -> dict:
    """The JSON Schema of a document (committed as ``docs/<document>.schema.json``)."""
    kind = _BY_NAME.get(document)
    if kind is None:
        raise TorchtriageError(f"unknown document {document!r}; one of {', '.join(DOCUMENTS)}")
    schema = msgspec.json.schema(kind.type)
    schema["$id"] = kind.schema_id
    return schema


def decode_document(doc: dict[str, Any]) -> JsonDocument:
    """A stored JSON document (already parsed) back as its typed object."""
    kind = _BY_ID.get(doc.get("schema", ""))
    if kind is None:
        raise TorchtriageError(f"unknown document schema {doc.get('schema')!r}")
    return msgspec.convert(doc, kind.type)


def read_document(data: bytes | str, source: str = "document") -> JsonDocument:
    """A document from its JSON text; one-line error when it is not one of ours."""
    try:
        return decode_document(msgspec.json.decode(data))
    except (msgspec.DecodeError, msgspec.ValidationError, AttributeError) as exc:
        raise TorchtriageError(f"{source}: not a readable torchtriage document ({exc})") \
            from None
