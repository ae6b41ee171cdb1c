"""Read a Kineto chrome-trace file (``.json`` or ``.json.gz``) into a :class:`Trace`.

Decoding is typed (msgspec): only the fields the analyses use are materialised; everything else
in an event, including most of ``args``, is skipped by the decoder. ``Input Dims`` is kept as raw
JSON bytes in one blob, decoded only by the analyses that need shapes.

Accepted variations, all seen in real traces: int or float (ns-resolution) timestamps; string
or int pid/tid (``"Spans"``, ``"stream 7"``); legacy capitalised categories (``Kernel``,
``Runtime``, ``Operator``); ``External id`` or ``external id``; ``[memory]`` as an instant or as a
complete event (Python exporter); missing ``deviceProperties`` / ``distributedInfo``.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchtriage.errors import TraceError
from torchtriage.trace.model import (
    CATEGORY_KIND,
    DeviceInfo,
    EventKind,
    EventTable,
    MemoryTable,
    Trace,
    TraceMeta,
)

_Id = int | str | None
_NO_RAW = msgspec.Raw(b"")
# Numeric args are usually ints, but some exporters write them as strings (ROCm "stream") or
# floats; all are accepted and normalised by _int.
_Num = int | float | str | None


def _int(value: int | float | str | None, default: int = -1) -> int:
    if type(value) is int:
        return value
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default



class _Args(msgspec.Struct):
    external_id: _Num = msgspec.field(default=None, name="External id")
    external_id_legacy: _Num = msgspec.field(default=None, name="external id")
    correlation: _Num = None
    stream: _Num = None
    device: _Num = None
    bytes: _Num = None
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    total_allocated: _Num = msgspec.field(default=None, name="Total Allocated")
    total_reserved: _Num = msgspec.field(default=None, name="Total Reserved")
    mem_bytes: _Num = msgspec.field(default=None, name="Bytes")
    device_type: _Num = msgspec.field(default=None, name="Device Type")
    device_id: _Num = msgspec.field(default=None, name="Device Id")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: _Num = msgspec.field(default=None, name="In msg nelems")
    group_size: _Num = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")


class _Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: _Id = None
    tid: _Id = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


class _Device(msgspec.Struct):
    id: int = 0
    name: str = ""
    totalGlobalMem: int = 0
    computeMajor: int = 0
    computeMinor: int = 0
    numSms: int = 0


class _TraceFile(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    deviceProperties: list[_Device] | None = None
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    torchtriage: dict[str, Any] | None = None
    # Only used to say what a non-Kineto JSON file is.
    nodes: msgspec.Raw = _NO_RAW
    schema: msgspec.Raw = _NO_RAW


_DECODER = msgspec.json.Decoder(_TraceFile, strict=False)


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip. Raises TraceError on unreadable input."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file or directory") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    return data


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Load one Kineto trace file into columnar tables.

    Raises:
        TraceError: the path does not exist, is not JSON, has no ``traceEvents`` or holds no
            events (message is one line, naming the file).
    """
    path = Path(path)
    raw = read_bytes(path)
    if not raw.strip():
        raise TraceError(f"{path}: empty file")
    try:
        parsed = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`"):
            raise TraceError(
                f"{path}: not a Kineto trace (top level is not a JSON object)"
            ) from None
        raise TraceError(f"{path}: not a Kineto trace ({exc})") from None
    except msgspec.DecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc})") from None
    if parsed.traceEvents is None:
        if parsed.nodes and parsed.schema:
            raise TraceError(
                f"{path}: a PyTorch execution trace (Chakra ET), not a Kineto trace"
            )
        raise TraceError(f"{path}: JSON without 'traceEvents': not a Kineto trace")
    events, memory = _columns(parsed.traceEvents)
    if len(events) == 0:
        raise TraceError(f"{path}: empty trace (no complete events)")
    return Trace(events=events, memory=memory, meta=_meta(path, parsed, len(raw)))


def _meta(path: Path, parsed: _TraceFile, raw_bytes: int) -> TraceMeta:
    devices = tuple(
        DeviceInfo(
            id=d.id,
            name=d.name,
            total_memory=d.totalGlobalMem,
            compute_major=d.computeMajor,
            compute_minor=d.computeMinor,
            num_sms=d.numSms,
        )
        for d in parsed.deviceProperties or ()
    )
    dist = parsed.distributedInfo or None
    rank = dist.get("rank") if dist else None
    world = dist.get("world_size") if dist else None
    return TraceMeta(
        path=str(path),
        devices=devices,
        distributed=dist,
        rank=rank if isinstance(rank, int) else None,
        world_size=world if isinstance(world, int) else None,
        base_time_ns=parsed.baseTimeNanoseconds,
        torchtriage=parsed.torchtriage or {},
        raw_bytes=raw_bytes,
    )


def _collective(name: str, a: _Args, label) -> tuple[int, int, int, int]:
    """(collective label, elements, group size, dtype label) of a collective event."""
    dtype = a.dtype
    if dtype is None and a.input_type:
        types = msgspec.json.decode(a.input_type)
        dtype = types[0] if types and isinstance(types[0], str) else None
    op = a.collective if a.collective is not None else name[len("gloo:"):]
    return (label(op), _int(a.in_nelems), _int(a.group_size), label(dtype))


def _columns(raw_events: list[_Event]) -> tuple[EventTable, MemoryTable]:
    names: dict[str, int] = {}
    threads: dict[tuple[str, str], int] = {}
    kind_of = CATEGORY_KIND
    other = int(EventKind.OTHER)

    kinds: list[int] = []
    name_ids: list[int] = []
    thread_ids: list[int] = []
    ts: list[float] = []
    dur: list[float] = []
    ext: list[int] = []
    corr: list[int] = []
    stream: list[int] = []
    device: list[int] = []
    nbytes: list[int] = []
    shape_off: list[int] = []
    shape_len: list[int] = []
    blob = bytearray()
    labels: dict[str, int] = {}
    # Sparse collective args: row -> (collective id, elements, group size, dtype id)
    collectives: dict[int, tuple[int, int, int, int]] = {}

    def label(text: str | None) -> int:
        if text is None:
            return -1
        found = labels.get(text)
        if found is None:
            found = labels[text] = len(labels)
        return found

    mem_rows: list[tuple[float, int, int, int, int, int]] = []

    for ev in raw_events:
        if ev.name == "[memory]":
            a = ev.args
            if a is not None and ev.ts is not None and a.total_allocated is not None:
                mem_rows.append(
                    (
                        ev.ts,
                        _int(a.total_allocated),
                        _int(a.total_reserved, 0),
                        _int(a.mem_bytes, 0),
                        _int(a.device_type, 0),
                        _int(a.device_id),
                    )
                )
            continue
        if ev.ph != "X" or ev.ts is None:
            continue
        name_id = names.get(ev.name)
        if name_id is None:
            name_id = names[ev.name] = len(names)
        key = (str(ev.pid), str(ev.tid))
        thread_id = threads.get(key)
        if thread_id is None:
            thread_id = threads[key] = len(threads)
        kinds.append(kind_of.get(ev.cat, other))
        name_ids.append(name_id)
        thread_ids.append(thread_id)
        ts.append(ev.ts)
        dur.append(ev.dur if ev.dur is not None and ev.dur > 0 else 0.0)
        a = ev.args
        if a is None:
            if ev.name.startswith("gloo:"):
                collectives[len(ts) - 1] = (label(ev.name[5:]), -1, -1, -1)
            ext.append(-1)
            corr.append(-1)
            stream.append(-1)
            device.append(-1)
            nbytes.append(-1)
            shape_off.append(-1)
            shape_len.append(0)
            continue
        if a.collective is not None or ev.name.startswith("gloo:"):
            collectives[len(ts) - 1] = _collective(ev.name, a, label)
        ext.append(_int(a.external_id if a.external_id is not None else a.external_id_legacy))
        corr.append(_int(a.correlation))
        stream.append(_int(a.stream))
        device.append(_int(a.device))
        nbytes.append(_int(a.bytes))
        if a.input_dims:
            shape_off.append(len(blob))
            shape_len.append(len(a.input_dims))
            blob += a.input_dims
        else:
            shape_off.append(-1)
            shape_len.append(0)

    events = EventTable(
        kind=np.asarray(kinds, dtype=np.int8),
        name_id=np.asarray(name_ids, dtype=np.int32),
        thread_id=np.asarray(thread_ids, dtype=np.int32),
        ts=np.asarray(ts, dtype=np.float64),
        dur=np.asarray(dur, dtype=np.float64),
        external_id=np.asarray(ext, dtype=np.int64),
        correlation=np.asarray(corr, dtype=np.int64),
        stream=np.asarray(stream, dtype=np.int64),
        device=np.asarray(device, dtype=np.int64),
        nbytes=np.asarray(nbytes, dtype=np.int64),
        shape_offset=np.asarray(shape_off, dtype=np.int64),
        shape_length=np.asarray(shape_len, dtype=np.int32),
        names=list(names),
        threads=list(threads),
        shapes_blob=bytes(blob),
        labels=list(labels),
        collectives=collectives,
    )
    mem = np.asarray(mem_rows, dtype=np.float64).reshape(-1, 6)
    memory = MemoryTable(
        ts=mem[:, 0].copy(),
        total_allocated=mem[:, 1].astype(np.int64),
        total_reserved=mem[:, 2].astype(np.int64),
        nbytes=mem[:, 3].astype(np.int64),
        device_type=mem[:, 4].astype(np.int8),
        device_id=mem[:, 5].astype(np.int16),
    )
    return events, memory
