"""Read a Kineto chrome-trace file (``.json`` or ``.json.gz``) into a :class:`Trace`.

The file is streamed (:mod:`torchtriage.trace.stream`): chunks of whole events are decoded with
msgspec into typed structs and turned into numpy columns one chunk at a time, so memory is the
tables plus one chunk, never the whole JSON. Decoding is typed: only the fields the analyses use
are materialised; everything else in an event, including most of ``args``, is skipped by the
decoder. ``Input Dims`` is kept as raw JSON bytes in one blob, decoded only by the analyses that
need shapes. The tables' memory is checked against a limit as they grow (the memory available
when loading starts, or ``TORCHTRIAGE_MEMORY_LIMIT``): a trace too large for it is refused with
an error naming the limit.

Accepted variations, all seen in real traces: int or float (ns-resolution) timestamps; string
or int pid/tid (``"Spans"``, ``"stream 7"``); legacy capitalised categories (``Kernel``,
``Runtime``, ``Operator``); ``External id`` or ``external id``; ``[memory]`` as an instant or as a
complete event (Python exporter); missing ``deviceProperties`` / ``distributedInfo``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchtriage.errors import TorchtriageError, TraceError
from torchtriage.trace.model import (
    CATEGORY_KIND,
    DeviceInfo,
    EventKind,
    EventTable,
    MemoryTable,
    Trace,
    TraceMeta,
)
from torchtriage.trace.stream import EventChunks

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



# The args the analyses read: (attribute, JSON key, default on the strict fast path). Numbers
# are "_Num" (int, float or str, normalised by _int) on the lenient path and plain ints on the
# strict one; the others keep their type on both.
_ARG_NUMBERS: tuple[tuple[str, str, int | None], ...] = (
    ("external_id", "External id", -1),
    ("external_id_legacy", "external id", -1),
    ("correlation", "correlation", -1),
    ("stream", "stream", -1),
    ("device", "device", -1),
    ("bytes", "bytes", -1),
    ("total_allocated", "Total Allocated", None),
    ("total_reserved", "Total Reserved", 0),
    ("mem_bytes", "Bytes", 0),
    ("device_type", "Device Type", 0),
    ("device_id", "Device Id", -1),
    ("in_nelems", "In msg nelems", -1),
    ("group_size", "Group size", -1),
)
_ARG_OTHERS: tuple[tuple[str, str, Any, Any], ...] = (
    ("input_dims", "Input Dims", msgspec.Raw, _NO_RAW),  # kept as raw JSON bytes
    ("collective", "Collective name", str | None, None),
    ("dtype", "dtype", str | None, None),
    ("input_type", "Input type", msgspec.Raw, _NO_RAW),
)


def _args_struct(name: str, strict: bool) -> type[msgspec.Struct]:
    fields = [(attr, (int if default is not None else int | None) if strict else _Num,
               msgspec.field(default=default if strict else None, name=key))
              for attr, key, default in _ARG_NUMBERS]
    fields += [(attr, kind, msgspec.field(default=default, name=key))
               for attr, key, kind, default in _ARG_OTHERS]
    return msgspec.defstruct(name, fields, frozen=strict, gc=False)


# Lenient: any number type; absent args are None.
_Args = _args_struct("_Args", strict=False)
# Strict, the fast path: every number an int (or a numeric string) and absent ones given
# their column's default, so columns are built without a per-event branch; frozen so that
# one default instance can stand for events without args.
_StrictArgs = _args_struct("_StrictArgs", strict=True)
_NO_ARGS = _StrictArgs()


def _event_struct(name: str, args: Any, default: Any) -> type[msgspec.Struct]:
    return msgspec.defstruct(name, [
        ("ph", str, ""), ("cat", str, ""), ("name", str, ""), ("pid", _Id, None),
        ("tid", _Id, None), ("ts", float | None, None), ("dur", float | None, None),
        ("args", args, default)], gc=False)


_Event = _event_struct("_Event", _Args | None, None)
_StrictEvent = _event_struct("_StrictEvent", _StrictArgs, _NO_ARGS)


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
_EVENTS = msgspec.json.Decoder(list[_Event], strict=False)
_STRICT_EVENTS = msgspec.json.Decoder(list[_StrictEvent], strict=False)
MEMORY_LIMIT_ENV = "TORCHTRIAGE_MEMORY_LIMIT"
_AVAILABLE_SHARE = 0.8  # of the memory available when loading starts, by default


def default_memory_limit() -> tuple[int, str]:
    """The most memory a trace's tables may take, and where that figure comes from."""
    configured = os.environ.get(MEMORY_LIMIT_ENV)
    if configured:
        from torchtriage.units import parse_bytes

        try:
            return parse_bytes(configured), MEMORY_LIMIT_ENV
        except TorchtriageError:
            raise TraceError(f"{MEMORY_LIMIT_ENV}={configured!r} is not a size such as "
                             "8GiB") from None
    return int(_available_memory() * _AVAILABLE_SHARE), \
        f"{_AVAILABLE_SHARE:.0%} of the memory available"


def _available_memory() -> int:
    """Bytes of memory available now: Linux's ``MemAvailable`` read directly (what psutil
    reports there, without psutil's 40 ms import in a short command), psutil elsewhere."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    return int(psutil.virtual_memory().available)


def load_trace(path: str | os.PathLike[str], memory_limit: int | None = None) -> Trace:
    """Load one Kineto trace file into columnar tables.

    ``memory_limit`` caps the tables' bytes (default :func:`memory_limit`; the rank loader
    gives each of its parallel workers its share).

    Raises:
        TraceError: the path does not exist, is not JSON, has no ``traceEvents``, holds no
            events, is truncated, or its tables would not fit in the memory limit (message is
            one line, naming the file).
    """
    path = Path(path)
    if memory_limit is None:
        limit, limit_source = default_memory_limit()
    else:
        limit, limit_source = memory_limit, "this worker's share of the memory available"
    chunks = EventChunks(path, _decode_events)
    columns = _Columns()
    try:
        for events, strict in chunks:
            if strict:
                columns.add_strict(events)
            else:
                columns.add(events)
            if columns.nbytes > limit:
                raise TraceError(
                    f"{path}: too large for the memory limit: its tables passed "
                    f"{_size(limit)} ({limit_source}) after {chunks.raw_bytes / 1e6:,.0f} MB "
                    f"of JSON; load it on a machine with more memory, set {MEMORY_LIMIT_ENV}, "
                    "or profile fewer steps")
        if chunks.raw_bytes == 0 or not chunks.outside.strip():
            raise TraceError(f"{path}: empty file")
        parsed = _DECODER.decode(chunks.outside)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`"):
            raise TraceError(
                f"{path}: not a Kineto trace (top level is not a JSON object)"
            ) from None
        raise TraceError(f"{path}: not a Kineto trace ({exc})") from None
    except msgspec.DecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc})") from None
    if not chunks.found_events:
        if parsed.nodes and parsed.schema:
            raise TraceError(
                f"{path}: a PyTorch execution trace (Chakra ET), not a Kineto trace"
            )
        raise TraceError(f"{path}: JSON without 'traceEvents': not a Kineto trace")
    events, memory = columns.finish()
    if len(events) == 0:
        raise TraceError(f"{path}: empty trace (no complete events)")
    return Trace(events=events, memory=memory, meta=_meta(path, parsed, chunks.raw_bytes))


def _decode_events(chunk: bytes) -> tuple[list[Any], bool]:
    """A chunk's events, with the fast strict decoder where every value has the usual type
    (then True), else the lenient one (a float id, a stream name...)."""
    try:
        return _STRICT_EVENTS.decode(chunk), True
    except msgspec.ValidationError:
        return _EVENTS.decode(chunk), False


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


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


_INT_COLUMNS = ("external_id", "correlation", "stream", "device", "nbytes", "shape_offset")


class _Columns:
    """Events, chunk by chunk, into the columns of an EventTable and a MemoryTable. Names,
    threads and labels are interned across chunks; each chunk's rows become numpy arrays at
    once, so the Python objects of one chunk are all that is alive besides the tables."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        # (pid, tid) as written -> id; made (str, str) in finish(), where 1 and "1" meet
        self.raw_threads: dict[tuple[Any, Any], int] = {}
        self.labels: dict[str, int] = {}
        self.blob = bytearray()
        # Sparse collective args: row -> (collective id, elements, group size, dtype id)
        self.collectives: dict[int, tuple[int, int, int, int]] = {}
        self.parts: dict[str, list[np.ndarray]] = {}
        self.memory_parts: list[np.ndarray] = []
        self.rows = 0
        self.nbytes = 0  # of the tables so far

    def label(self, text: str | None) -> int:
        if text is None:
            return -1
        found = self.labels.get(text)
        if found is None:
            found = self.labels[text] = len(self.labels)
        return found

    def add_strict(self, raw_events: list[_StrictEvent]) -> None:
        """Add events decoded by the strict decoder: a column at a time (comprehensions and
        numpy), not an event at a time."""
        memory = [e for e in raw_events if e.name == "[memory]"]
        xs = [e for e in raw_events if e.ph == "X" and e.ts is not None and e.name != "[memory]"]
        n = len(xs)
        names, threads = self.names, self.raw_threads
        add_name, add_thread = names.setdefault, threads.setdefault
        kind_of, other = CATEGORY_KIND.get, int(EventKind.OTHER)
        args = [e.args for e in xs]

        def ints(values: list, dtype=np.int64) -> np.ndarray:
            return np.array(values, dtype=dtype)

        ext = ints([a.external_id for a in args])
        legacy = ints([a.external_id_legacy for a in args])
        shape_off = np.full(n, -1, dtype=np.int64)
        shape_len = np.zeros(n, dtype=np.int32)
        for i, a in enumerate(args):
            if a.input_dims:
                shape_off[i] = len(self.blob)
                shape_len[i] = len(a.input_dims)
                self.blob += a.input_dims
        row0 = self.rows
        for i, e in enumerate(xs):
            if e.args.collective is not None or e.name.startswith("gloo:"):
                self.collectives[row0 + i] = _collective(e.name, e.args, self.label)
        self._append({
            "kind": ints([kind_of(e.cat, other) for e in xs], np.int8),
            "name_id": ints([add_name(e.name, len(names)) for e in xs], np.int32),
            "thread_id": ints([add_thread((e.pid, e.tid), len(threads)) for e in xs],
                              np.int32),
            "ts": ints([e.ts for e in xs], np.float64),
            "dur": np.maximum(ints([e.dur or 0.0 for e in xs], np.float64), 0.0),
            "external_id": np.where(ext != -1, ext, legacy),
            "correlation": ints([a.correlation for a in args]),
            "stream": ints([a.stream for a in args]),
            "device": ints([a.device for a in args]),
            "nbytes": ints([a.bytes for a in args]),
            "shape_offset": shape_off,
            "shape_length": shape_len,
        }, n)
        rows = [(e.ts, a.total_allocated, a.total_reserved, a.mem_bytes, a.device_type,
                 a.device_id) for e in memory
                for a in (e.args,) if e.ts is not None and a.total_allocated is not None]
        if rows:
            self._append_memory(np.asarray(rows, dtype=np.float64))

    def _append(self, chunk: dict[str, np.ndarray], rows: int) -> None:
        self.rows += rows
        for column, values in chunk.items():
            self.parts.setdefault(column, []).append(values)
            self.nbytes += values.nbytes

    def _append_memory(self, rows: np.ndarray) -> None:
        self.memory_parts.append(rows)
        self.nbytes += rows.nbytes

    def add(self, raw_events: list[_Event]) -> None:
        """Add events decoded by the lenient decoder, one at a time."""
        names, threads, blob, collectives, label = (self.names, self.raw_threads, self.blob,
                                                    self.collectives, self.label)
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
        mem_rows: list[tuple[float, int, int, int, int, int]] = []
        row0 = self.rows

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
            key = (ev.pid, ev.tid)
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
                    collectives[row0 + len(ts) - 1] = (label(ev.name[5:]), -1, -1, -1)
                ext.append(-1)
                corr.append(-1)
                stream.append(-1)
                device.append(-1)
                nbytes.append(-1)
                shape_off.append(-1)
                shape_len.append(0)
                continue
            if a.collective is not None or ev.name.startswith("gloo:"):
                collectives[row0 + len(ts) - 1] = _collective(ev.name, a, label)
            ext.append(_int(a.external_id if a.external_id is not None
                            else a.external_id_legacy))
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

        self._append({
            "kind": np.asarray(kinds, dtype=np.int8),
            "name_id": np.asarray(name_ids, dtype=np.int32),
            "thread_id": np.asarray(thread_ids, dtype=np.int32),
            "ts": np.asarray(ts, dtype=np.float64),
            "dur": np.asarray(dur, dtype=np.float64),
            "external_id": np.asarray(ext, dtype=np.int64),
            "correlation": np.asarray(corr, dtype=np.int64),
            "stream": np.asarray(stream, dtype=np.int64),
            "device": np.asarray(device, dtype=np.int64),
            "nbytes": np.asarray(nbytes, dtype=np.int64),
            "shape_offset": np.asarray(shape_off, dtype=np.int64),
            "shape_length": np.asarray(shape_len, dtype=np.int32),
        }, len(ts))
        if mem_rows:
            self._append_memory(np.asarray(mem_rows, dtype=np.float64))

    def finish(self) -> tuple[EventTable, MemoryTable]:
        empty = {"kind": np.int8, "name_id": np.int32, "thread_id": np.int32,
                 "shape_length": np.int32, "ts": np.float64, "dur": np.float64}
        columns = {}
        for column in (*empty, *_INT_COLUMNS):
            parts = self.parts.pop(column, [])
            columns[column] = (np.concatenate(parts) if len(parts) > 1 else parts[0] if parts
                               else np.empty(0, dtype=empty.get(column, np.int64)))
        threads: dict[tuple[str, str], int] = {}
        remap = np.asarray([threads.setdefault((str(pid), str(tid)), len(threads))
                            for pid, tid in self.raw_threads], dtype=np.int32)
        if len(threads) < len(remap):
            columns["thread_id"] = remap[columns["thread_id"]]
        events = EventTable(
            **columns,
            names=list(self.names),
            threads=list(threads),
            shapes_blob=bytes(self.blob),
            labels=list(self.labels),
            collectives=self.collectives,
        )
        mem = (np.concatenate(self.memory_parts) if self.memory_parts
               else np.empty((0, 6), dtype=np.float64))
        memory = MemoryTable(
            ts=mem[:, 0].copy(),
            total_allocated=mem[:, 1].astype(np.int64),
            total_reserved=mem[:, 2].astype(np.int64),
            nbytes=mem[:, 3].astype(np.int64),
            device_type=mem[:, 4].astype(np.int8),
            device_id=mem[:, 5].astype(np.int16),
        )
        return events, memory
