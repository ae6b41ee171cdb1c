"""Events to columns: one chunk of a trace's events decoded into :class:`ChunkColumns`, and the
chunks merged, in file order, into the :class:`EventTable` and :class:`MemoryTable`.

A chunk is decoded on its own (in this process or in a decoding worker): its names, threads and
labels are interned per chunk and its columns are plain bytes, so a chunk travels between
processes as one compact msgpack message, never as pickled tables. :class:`TableBuilder` maps
each chunk's ids onto the trace's (first appearance order, as a sequential decode gives) and
keeps the tables' size under the memory limit as they grow.

Decoding is typed: only the fields the analyses use are materialised; everything else in an
event, including most of ``args``, is skipped by msgspec. ``Input Dims`` is kept as raw JSON
bytes in one blob, decoded only by the analyses that need shapes. Numbers take a strict fast
path (ints, a frozen default for absent args, columns built by one pass per chunk) and a
lenient one for exporters that write ids as floats or strings.
"""

from __future__ import annotations

import contextlib
from itertools import repeat
from operator import attrgetter
from typing import Any, Union

import msgspec
import numpy as np

from torchtriage.trace.model import CATEGORY_KIND, EventKind, EventTable, MemoryTable

_Id = int | str | None
_INT_ONLY = frozenset((int,))
_NO_RAW = msgspec.Raw(b"")
# Numeric args are usually ints, but some exporters write them as strings (ROCm "stream") or
# floats; all are accepted and normalised by _int.
_Num = int | float | str | None
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int(value: int | float | str | None, default: int = -1) -> int:
    """``value`` as an int of the int64 columns; ``default`` for None, text that is not a
    number, NaN, infinities and numbers past int64."""
    if type(value) is not int:
        if value is None:
            return default
        try:
            value = int(value)
        except (TypeError, ValueError, OverflowError):
            return default
    return value if _INT64_MIN <= value <= _INT64_MAX else default


# The args the analyses read: (attribute, JSON key, default on the strict fast path). Numbers
# are "_Num" (int, float or str, normalised by _int) on the lenient path and plain ints on the
# strict one; the others keep their type on both. The first six are the int columns, in order.
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
_EVENTS = msgspec.json.Decoder(list[_Event], strict=False)


def _phase_struct(name: str, tag: str, fields: bool) -> type[msgspec.Struct]:
    return msgspec.defstruct(name, [
        ("cat", str, ""), ("name", str, ""), ("pid", _Id, None), ("tid", _Id, None),
        ("ts", float | None, None), ("dur", float | None, None),
        ("args", _StrictArgs, _NO_ARGS)] if fields else [],
        tag_field="ph", tag=tag, gc=False)


# The strict path tells events apart by their phase as msgspec decodes them: complete events
# (X) and instants (i, I: the allocator's [memory] events) get their fields, every other
# phase of the Trace Event Format an empty struct (its keys are skipped, no args are built:
# a third of a GPU trace's events are flows, two thirds of some are metadata). A phase not
# listed, or an event without one, fails validation and the chunk takes the lenient path.
_StrictComplete = _phase_struct("_StrictComplete", "X", True)
_StrictInstant = _phase_struct("_StrictInstant", "i", True)
_SKIPPED_PHASES = frozenset(("B", "E", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "M",
                             "C", "R", "c"))  # phases whose fields no table uses
_StrictInstantI = _phase_struct("_StrictInstantI", "I", True)
_STRICT_PHASES = (_StrictComplete, _StrictInstant, _StrictInstantI,
                  *(_phase_struct(f"_StrictPhase{tag}", tag, False)
                    for tag in sorted(_SKIPPED_PHASES)))
_STRICT_EVENTS = msgspec.json.Decoder(list[Union[_STRICT_PHASES]], strict=False)  # noqa: UP007
_NAMED = frozenset(_STRICT_PHASES[:3])  # the phases whose events have a name (and args)

# The int64 columns a chunk carries, in this order, as one [7, rows] block (column after
# column).
_INT_COLUMNS = ("external_id", "correlation", "stream", "device", "nbytes", "shape_offset",
                "name_id")
_OTHER = int(EventKind.OTHER)
_KIND_CODE = {cat: int(kind) for cat, kind in CATEGORY_KIND.items()}  # (plain ints: faster)
_NAME, _TS, _DUR, _CAT, _PID, _TID, _ARGS = map(attrgetter, ("name", "ts", "dur", "cat", "pid",
                                                             "tid", "args"))
_DIMS, _TYPES, _COLLECTIVE = map(attrgetter, ("input_dims", "input_type", "collective"))
_ALLOCATED = attrgetter("total_allocated")
_MEMORY_ARGS = tuple(map(attrgetter, ("total_reserved", "mem_bytes", "device_type",
                                      "device_id")))


class ChunkColumns(msgspec.Struct, array_like=True, gc=False):
    """One chunk's events as columns. Ids (names, threads, labels) index this chunk's own
    lists; offsets into ``blob`` are this chunk's. Arrays are raw bytes (little-endian numpy
    buffers) so that the chunk is one flat msgpack message between processes."""

    rows: int
    kind: bytes  # int8
    thread_id: bytes  # int32, into threads
    ts: bytes  # float64
    dur: bytes  # float64
    ints: bytes  # int64 [len(_INT_COLUMNS), rows]
    shape_length: bytes  # int32
    names: list[str]
    threads: list[tuple[_Id, _Id]]
    labels: list[str]
    blob: bytes
    # (row, collective label, elements, group size, dtype label) of the rows that carry them
    collectives: list[tuple[int, int, int, int, int]]
    # float64 [6, n], column after column: ts, allocated, reserved, bytes, device type and id
    memory: bytes
    no_ts: int = 0  # complete events without a ts: left out (counted for trace/quality.py)
    negative_dur: int = 0  # complete events with a negative dur: clamped to 0 (counted too)

    @property
    def nbytes(self) -> int:
        """What this chunk adds to the tables."""
        return (len(self.kind) + len(self.thread_id) + len(self.ts) + len(self.dur)
                + len(self.ints) + len(self.shape_length) + len(self.blob) + len(self.memory))


def decode_chunk(array: bytes | memoryview) -> ChunkColumns:
    """A JSON array of events (one chunk) as columns: the strict decoder where every value has
    the usual type, else the lenient one (a float id, a stream name...).

    Raises:
        msgspec.DecodeError: the text is not a JSON array of events (a wrong cut, or corrupt
            data; :class:`msgspec.ValidationError` for values of an impossible type).
    """
    try:
        return _strict_columns(_STRICT_EVENTS.decode(array))
    except (msgspec.ValidationError, OverflowError):  # (an int past int64: the lenient path
        return _lenient_columns(_lenient_events(array))  # drops it)


class _Phase(msgspec.Struct):
    ph: Any = None


_RAW_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])
_ONE_EVENT = msgspec.json.Decoder(_Event, strict=False)
_PHASE = msgspec.json.Decoder(_Phase)


def _lenient_events(array: bytes | memoryview) -> list[Any]:
    """The events of the lenient path. An event of a phase whose fields no table uses is
    skipped when its fields do not decode, as the strict path skips them: a chunk's result
    does not depend on which path its other events sent it down (so on where it was cut)."""
    try:
        return _EVENTS.decode(array)
    except msgspec.DecodeError as whole:  # (ValidationError too: a wrong type; or a string
        # that is not UTF-8, which the strict path skips in such an event's fields)
        try:
            raws = _RAW_EVENTS.decode(array)
        except msgspec.DecodeError:
            raise whole from None  # not JSON: the cut or the data
        events = []
        for raw in raws:
            try:
                events.append(_ONE_EVENT.decode(raw))
            except msgspec.DecodeError:
                try:
                    phase = _PHASE.decode(raw).ph
                except msgspec.DecodeError:
                    phase = None
                if not (isinstance(phase, str) and phase in _SKIPPED_PHASES):
                    raise whole from None
        return events


class _Interner:
    """Chunk-local ids for strings and threads, in first-appearance order."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.threads: dict[tuple[Any, Any], int] = {}
        self.labels: dict[str, int] = {}

    def label(self, text: str | None) -> int:
        if text is None:
            return -1
        return self.labels.setdefault(text, len(self.labels))


def _ids(values: list[Any]) -> tuple[list[Any], np.ndarray]:
    """The distinct values in first-appearance order, and each value's index among them."""
    distinct = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return list(distinct), np.fromiter(map(distinct.__getitem__, values), np.int32,
                                       len(values))


def _pair_ids(pids: list[Any], tids: list[Any]) -> tuple[list[tuple[Any, Any]], np.ndarray]:
    """:func:`_ids` of the (pid, tid) pairs, built from the ids of each half (no tuple per
    event): the pairs in first-appearance order and each event's index among them. Where
    every pid and tid is an int (as Kineto writes them), numpy does it (:func:`_int_pair_ids`,
    2-3x faster)."""
    pid_keys, tid_keys = dict.fromkeys(pids), dict.fromkeys(tids)
    if len(pid_keys) == 1 and len(tid_keys) == 1:  # one thread in the chunk: the usual case
        return [(*pid_keys, *tid_keys)], np.zeros(len(pids), np.int32)
    if pids and _INT_ONLY.issuperset(map(type, (*pid_keys, *tid_keys))):
        with contextlib.suppress(OverflowError):  # (past int64: the general path)
            return _int_pair_ids(np.fromiter(pids, np.int64, len(pids)),
                                 np.fromiter(tids, np.int64, len(tids)))
    pid_values, pid_ids = _ids(pids)
    tid_values, tid_ids = _ids(tids)
    codes = pid_ids.astype(np.int64) * max(len(tid_values), 1) + tid_ids
    distinct, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # first appearance
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    width = max(len(tid_values), 1)
    pairs = [(pid_values[c // width], tid_values[c % width]) for c in distinct[order].tolist()]
    return pairs, rank[inverse.reshape(-1)]


def _int_pair_ids(pids: np.ndarray, tids: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """:func:`_pair_ids` of int columns: a stable sort by (pid, tid) puts each pair's first
    appearance first in its run; the runs, ordered by those, are the pairs."""
    n = len(pids)
    order = np.lexsort((tids, pids))
    sorted_pids, sorted_tids = pids[order], tids[order]
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    starts[1:] = (sorted_pids[1:] != sorted_pids[:-1]) | (sorted_tids[1:] != sorted_tids[:-1])
    run = np.cumsum(starts) - 1  # each sorted event's pair
    by_appearance = np.argsort(order[starts], kind="stable")
    rank = np.empty(len(by_appearance), dtype=np.int32)
    rank[by_appearance] = np.arange(len(by_appearance), dtype=np.int32)
    ids = np.empty(n, dtype=np.int32)
    ids[order] = rank[run]
    pairs = list(zip(sorted_pids[starts][by_appearance].tolist(),
                     sorted_tids[starts][by_appearance].tolist(), strict=True))
    return pairs, ids


def _collective(name: str, a: Any, label) -> tuple[int, int, int, int]:
    """(collective label, elements, group size, dtype label) of a collective event."""
    dtype = a.dtype
    if dtype is None and a.input_type:
        types = msgspec.json.decode(a.input_type)
        dtype = types[0] if types and isinstance(types[0], str) else None
    op = a.collective if a.collective is not None else name[len("gloo:"):]
    return (label(op), _int(a.in_nelems), _int(a.group_size), label(dtype))


def _strict_columns(raw_events: list[Any]) -> ChunkColumns:
    """Columns of events decoded by the strict decoder: a pass per column or two, in C where
    it can be (``map`` with ``attrgetter``, ``numpy.fromiter``, ``list.count``), one Python
    pass to sort the events by phase, and none per event for the rare fields."""
    xs: list[Any] = []  # complete events
    instants: list[Any] = []  # the phases with a name but no duration: [memory] events
    to_xs, to_instants = xs.append, instants.append
    for e in raw_events:
        phase = type(e)
        if phase is _StrictComplete:
            to_xs(e)
        elif phase is _StrictInstant or phase is _StrictInstantI:
            to_instants(e)
    event_names = list(map(_NAME, xs))
    if "[memory]" in event_names:  # (complete events named so are memory rows, not events)
        instants = [e for e in raw_events if type(e) in _NAMED and e.name == "[memory]"]
        xs = [e for e in xs if e.name != "[memory]"]
        event_names = list(map(_NAME, xs))
    starts = list(map(_TS, xs))
    no_ts = starts.count(None)  # a C scan; the filter below runs only when there are some
    if no_ts:
        kept = [i for i, t in enumerate(starts) if t is not None]
        xs = [xs[i] for i in kept]
        event_names = [event_names[i] for i in kept]
        starts = [starts[i] for i in kept]
    n = len(xs)
    args = list(map(_ARGS, xs))

    def column(field: str) -> np.ndarray:
        return np.fromiter(map(attrgetter(field), args), np.int64, n)

    external = column("external_id")
    if n and int(external.min()) == -1:  # the older exporters' key, where the newer is absent
        external = np.where(external != -1, external, column("external_id_legacy"))
    names, name_id = _ids(event_names)
    threads, thread_id = _pair_ids(list(map(_PID, xs)), list(map(_TID, xs)))
    shape_off = np.full(n, -1, dtype=np.int64)
    shape_len = np.zeros(n, dtype=np.int32)
    blob = b""
    dims = list(map(_DIMS, args))
    if dims.count(_NO_RAW) != n:  # (an identity scan: absent dims share one default)
        dims_length = np.fromiter(map(len, dims), np.int64, n)
        shaped = np.flatnonzero(dims_length)
        shaped_args = list(map(args.__getitem__, shaped.tolist()))
        types = list(map(_TYPES, shaped_args))
        sizes = dims_length[shaped] + np.fromiter(map(len, types), np.int64, len(types))
        shape_off[shaped] = np.cumsum(sizes) - sizes
        shape_len[shaped] = dims_length[shaped]
        parts: list[Any] = [None] * (2 * len(types))  # each row's dims, then its input types
        parts[0::2] = list(map(_DIMS, shaped_args))  # (up to the next row's: EventTable)
        parts[1::2] = types
        blob = b"".join(parts)
    gloo = [i for i, name in enumerate(names) if name.startswith("gloo:")]
    named = list(map(_COLLECTIVE, args))
    rows = sorted(({i for i, c in enumerate(named) if c is not None}
                   if named.count(None) != n else set())
                  | set(np.flatnonzero(np.isin(name_id, gloo)).tolist() if gloo else ()))
    ids = _Interner()
    collectives = [(i, *_collective(xs[i].name, args[i], ids.label)) for i in rows]
    durations = list(map(_DUR, xs))
    if None in durations:  # (numpy would make an absent dur NaN, not 0)
        durations = [d or 0.0 for d in durations]
    dur = np.fromiter(durations, np.float64, n)
    negative = int(np.count_nonzero(dur < 0))
    return ChunkColumns(
        rows=n,
        kind=np.fromiter(map(_KIND_CODE.get, map(_CAT, xs), repeat(_OTHER)), np.int8,
                         n).tobytes(),
        thread_id=thread_id.tobytes(),
        ts=np.fromiter(starts, np.float64, n).tobytes(),
        dur=(np.maximum(dur, 0.0) if negative else dur).tobytes(),
        ints=b"".join([external.tobytes(), column("correlation").tobytes(),
                       column("stream").tobytes(), column("device").tobytes(),
                       column("bytes").tobytes(), shape_off.tobytes(),
                       name_id.astype(np.int64).tobytes()]),
        shape_length=shape_len.tobytes(), names=names, threads=threads,
        labels=list(ids.labels), blob=blob, collectives=collectives,
        memory=_memory_columns(instants), no_ts=no_ts, negative_dur=negative)


def _memory_columns(instants: list[Any]) -> bytes:
    """The ``[memory]`` events among ``instants`` (strict structs) as the float64 [6, n] block
    of :attr:`ChunkColumns.memory`, column after column; those without a ts or a ``Total
    Allocated`` are left out."""
    if not instants:
        return b""
    names = list(map(_NAME, instants))
    events = (instants if names.count("[memory]") == len(instants)
              else [e for e, name in zip(instants, names, strict=True) if name == "[memory]"])
    starts = list(map(_TS, events))
    args = list(map(_ARGS, events))
    allocated = list(map(_ALLOCATED, args))
    if starts.count(None) or allocated.count(None):
        kept = [i for i, (t, a) in enumerate(zip(starts, allocated, strict=True))
                if t is not None and a is not None]
        starts, allocated = [starts[i] for i in kept], [allocated[i] for i in kept]
        args = [args[i] for i in kept]
    if not args:
        return b""
    n = len(args)
    columns = [np.fromiter(starts, np.float64, n), np.fromiter(allocated, np.float64, n),
               *(np.fromiter(map(get, args), np.float64, n) for get in _MEMORY_ARGS)]
    return b"".join([c.tobytes() for c in columns])


def _lenient_columns(raw_events: list[Any]) -> ChunkColumns:
    """Columns of events decoded by the lenient decoder, one event at a time."""
    ids = _Interner()
    names, threads, label = ids.names, ids.threads, ids.label
    blob = bytearray()
    kinds: list[int] = []
    thread_ids: list[int] = []
    ts: list[float] = []
    dur: list[float] = []
    ints: list[int] = []  # _INT_COLUMNS, row after row
    shape_len: list[int] = []
    collectives: list[tuple[int, int, int, int, int]] = []
    mem_rows: list[tuple[float, int, int, int, int, int]] = []
    no_ts = negative = 0
    for ev in raw_events:
        a = ev.args
        if ev.name == "[memory]":
            if (ev.ph not in _SKIPPED_PHASES and a is not None and ev.ts is not None
                    and a.total_allocated is not None):
                mem_rows.append((ev.ts, _int(a.total_allocated), _int(a.total_reserved, 0),
                                 _int(a.mem_bytes, 0), _int(a.device_type, 0),
                                 _int(a.device_id)))
            continue
        if ev.ph != "X" or ev.ts is None:
            no_ts += ev.ph == "X"
            continue
        row = len(ts)
        kinds.append(CATEGORY_KIND.get(ev.cat, _OTHER))
        thread_ids.append(threads.setdefault((ev.pid, ev.tid), len(threads)))
        ts.append(ev.ts)
        dur.append(ev.dur if ev.dur is not None and ev.dur > 0 else 0.0)
        negative += ev.dur is not None and ev.dur < 0
        name_id = names.setdefault(ev.name, len(names))
        if a is None:
            if ev.name.startswith("gloo:"):
                collectives.append((row, label(ev.name[5:]), -1, -1, -1))
            ints += (-1, -1, -1, -1, -1, -1, name_id)
            shape_len.append(0)
            continue
        if a.collective is not None or ev.name.startswith("gloo:"):
            collectives.append((row, *_collective(ev.name, a, label)))
        offset = -1
        if a.input_dims:
            offset = len(blob)
            blob += a.input_dims
            blob += a.input_type
        shape_len.append(len(a.input_dims))
        ints += (_int(a.external_id if a.external_id is not None else a.external_id_legacy),
                 _int(a.correlation), _int(a.stream), _int(a.device), _int(a.bytes), offset,
                 name_id)
    return ChunkColumns(
        rows=len(ts), kind=np.asarray(kinds, np.int8).tobytes(),
        thread_id=np.asarray(thread_ids, np.int32).tobytes(),
        ts=np.asarray(ts, np.float64).tobytes(), dur=np.asarray(dur, np.float64).tobytes(),
        ints=np.asarray(ints, np.int64).reshape(-1, len(_INT_COLUMNS)).T.tobytes(),
        shape_length=np.asarray(shape_len, np.int32).tobytes(), names=list(names),
        threads=list(threads), labels=list(ids.labels), blob=bytes(blob),
        collectives=collectives,
        memory=np.asarray(mem_rows, dtype=np.float64).T.tobytes() if mem_rows else b"",
        no_ts=no_ts, negative_dur=negative)


class TableBuilder:
    """Chunks, in file order, into the trace's tables: ids re-interned across chunks (first
    appearance, as one sequential pass gives), shape offsets and collective rows shifted."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        # (pid, tid) as written -> id; made (str, str) in finish(), where 1 and "1" meet
        self.raw_threads: dict[tuple[Any, Any], int] = {}
        self.labels: dict[str, int] = {}
        self.blob = bytearray()
        self.collectives: dict[int, tuple[int, int, int, int]] = {}
        self.parts: dict[str, list[np.ndarray]] = {}
        self.memory_parts: list[np.ndarray] = []
        self.rows = 0
        self.nbytes = 0  # of the tables so far
        self.no_ts = 0  # complete events left out for want of a ts
        self.negative_dur = 0  # complete events whose negative dur was clamped to 0

    def add(self, chunk: ChunkColumns) -> None:
        n = chunk.rows
        if chunk.memory:
            self.memory_parts.append(np.frombuffer(chunk.memory, np.float64).reshape(6, -1))
        self.nbytes += chunk.nbytes
        self.no_ts += chunk.no_ts
        self.negative_dur += chunk.negative_dur
        if not n:
            return
        ints = np.frombuffer(chunk.ints, np.int64).reshape(len(_INT_COLUMNS), n)
        names = self._remap(self.names, chunk.names)
        threads = self._remap(self.raw_threads, [tuple(t) for t in chunk.threads])
        offsets = ints[5]
        columns = {"kind": np.frombuffer(chunk.kind, np.int8),
                   "name_id": names[ints[6]],
                   "thread_id": threads[np.frombuffer(chunk.thread_id, np.int32)],
                   "ts": np.frombuffer(chunk.ts, np.float64),
                   "dur": np.frombuffer(chunk.dur, np.float64),
                   "shape_offset": np.where(offsets >= 0, offsets + len(self.blob), -1),
                   "shape_length": np.frombuffer(chunk.shape_length, np.int32)}
        for i, column in enumerate(_INT_COLUMNS[:5]):
            columns[column] = ints[i]
        for column, values in columns.items():
            self.parts.setdefault(column, []).append(values)
        self.blob += chunk.blob
        if chunk.collectives:
            labels = self._remap(self.labels, chunk.labels).tolist()
            for row, op, elements, group, dtype in chunk.collectives:
                self.collectives[self.rows + row] = (labels[op], elements, group,
                                                     labels[dtype] if dtype >= 0 else -1)
        self.rows += n

    @staticmethod
    def _remap(table: dict[Any, int], local: list[Any]) -> np.ndarray:
        return np.asarray([table.setdefault(key, len(table)) for key in local], np.int32)

    def finish(self) -> tuple[EventTable, MemoryTable]:
        dtypes = {"kind": np.int8, "name_id": np.int32, "thread_id": np.int32,
                  "shape_length": np.int32, "ts": np.float64, "dur": np.float64}
        columns = {}
        for column in (*dtypes, "external_id", "correlation", "stream", "device", "nbytes",
                       "shape_offset"):
            dtype = dtypes.get(column, np.int64)
            parts = self.parts.pop(column, [])
            columns[column] = (np.concatenate(parts).astype(dtype, copy=False) if parts
                               else np.empty(0, dtype=dtype))
        threads: dict[tuple[str, str], int] = {}
        remap = np.asarray([threads.setdefault((str(pid), str(tid)), len(threads))
                            for pid, tid in self.raw_threads], dtype=np.int32)
        if len(threads) < len(remap):
            columns["thread_id"] = remap[columns["thread_id"]]
        events = EventTable(**columns, names=list(self.names), threads=list(threads),
                            shapes_blob=bytes(self.blob), labels=list(self.labels),
                            collectives=self.collectives)
        mem = (np.concatenate(self.memory_parts, axis=1) if self.memory_parts
               else np.empty((6, 0), dtype=np.float64))
        with np.errstate(invalid="ignore"):  # an absurd value (10**22 as a device type) is
            memory = MemoryTable(  # cast as it falls, not warned about on the user's terminal
                ts=mem[0].copy(),
                total_allocated=mem[1].astype(np.int64),
                total_reserved=mem[2].astype(np.int64),
                nbytes=mem[3].astype(np.int64),
                device_type=mem[4].astype(np.int8),
                device_id=mem[5].astype(np.int16),
            )
        return events, memory
