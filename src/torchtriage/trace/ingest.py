"""Read a Kineto chrome-trace file (``.json`` or ``.json.gz``) into a :class:`Trace`.

The file is streamed (:mod:`torchtriage.trace.stream`): chunks of whole events are decoded with
msgspec into typed structs and turned into columns one chunk at a time
(:mod:`torchtriage.trace.columns`), so memory is the tables plus the chunks in flight, never the
whole JSON. A large trace is decoded by two processes where there are two cores
(:mod:`torchtriage.trace.parallel`). The tables' memory is checked against a limit as they grow
(the memory available when loading starts, or ``TORCHTRIAGE_MEMORY_LIMIT``): a trace too large
for it is refused with an error naming the limit.

Accepted variations, all seen in real traces: int or float (ns-resolution) timestamps; string
or int pid/tid (``"Spans"``, ``"stream 7"``); legacy capitalised categories (``Kernel``,
``Runtime``, ``Operator``); ``External id`` or ``external id``; ``[memory]`` as an instant or as a
complete event (Python exporter); missing ``deviceProperties`` / ``distributedInfo``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec

from torchtriage.errors import TorchtriageError, TraceError
from torchtriage.trace.columns import ChunkColumns, TableBuilder, decode_chunk
from torchtriage.trace.model import DeviceInfo, Trace, TraceMeta
from torchtriage.trace.quality import check_timings
from torchtriage.trace.stream import BLOCK_BYTES, EventChunks
from torchtriage.units import format_bytes

_NO_RAW = msgspec.Raw(b"")


class _Device(msgspec.Struct):
    id: int = 0
    name: str = ""
    totalGlobalMem: int = 0
    computeMajor: int = 0
    computeMinor: int = 0
    numSms: int = 0


class _TraceFile(msgspec.Struct):
    traceEvents: list[Any] | None = None  # always empty: the events are streamed
    deviceProperties: list[_Device] | None = None
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    torchtriage: dict[str, Any] | None = None
    # Only used to say what a non-Kineto JSON file is.
    nodes: msgspec.Raw = _NO_RAW
    schema: msgspec.Raw = _NO_RAW


_DECODER = msgspec.json.Decoder(_TraceFile, strict=False)
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


def load_trace(path: str | os.PathLike[str], memory_limit: int | None = None,
               workers: int | None = None) -> Trace:
    """Load one Kineto trace file into columnar tables.

    ``memory_limit`` caps the tables' bytes (default :func:`default_memory_limit`; the rank
    loader gives each of its parallel workers its share). ``workers``: processes that decode
    (default: 2 for a trace of :data:`~torchtriage.trace.parallel.PARALLEL_MIN_BYTES` or more
    where two cores are free to this process, else 1).

    Raises:
        TraceError: the path does not exist, is not JSON, has no ``traceEvents``, holds no
            events, is truncated, or its tables would not fit in the memory limit (message is
            one line, naming the file).
    """
    from torchtriage.trace.parallel import PIECE_BYTES, decode_in_two, decoders

    path = Path(path)
    if memory_limit is None:
        limit, limit_source = default_memory_limit()
    else:
        limit, limit_source = memory_limit, "this worker's share of the memory available"
    parallel = decoders(path, workers) > 1
    label = f"{format_bytes(limit)} ({limit_source})"
    chunks: EventChunks[ChunkColumns] = EventChunks(
        path, decode_chunk, block_bytes=PIECE_BYTES if parallel else BLOCK_BYTES,
        memory_limit=limit, limit_label=label)
    tables = TableBuilder()

    def add(chunk: ChunkColumns) -> None:
        tables.add(chunk)
        if tables.nbytes > limit:
            raise TraceError(
                f"{path}: too large for the memory limit: its tables passed "
                f"{label} after {chunks.raw_bytes / 1e6:,.0f} MB "
                f"of JSON; load it on a machine with more memory, set {MEMORY_LIMIT_ENV}, "
                "or profile fewer steps")

    try:
        if parallel:
            decode_in_two(chunks, add)
        else:
            for chunk in chunks:
                add(chunk)
    except msgspec.ValidationError as exc:  # (the index in "$[N]" is the chunk's, not said)
        raise TraceError(f"{path}: not a Kineto trace ({_invalid(exc)})") from None
    try:
        if chunks.raw_bytes == 0 or not chunks.outside.strip():
            raise TraceError(f"{path}: empty file")
        parsed = _DECODER.decode(chunks.outside)
    except msgspec.ValidationError as exc:
        raise TraceError(f"{path}: not a Kineto trace ({_invalid(exc)})") from None
    except msgspec.DecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:  # (of the events: a one-line error of the stream's, at its byte)
        raise TraceError(f"{path}: not a Kineto trace: JSON outside traceEvents nested deeper "
                         "than the decoder takes") from None
    if not chunks.found_events:
        if parsed.nodes and parsed.schema:
            raise TraceError(
                f"{path}: a PyTorch execution trace (Chakra ET), not a Kineto trace"
            )
        raise TraceError(f"{path}: JSON without 'traceEvents': not a Kineto trace")
    events, memory = tables.finish()
    events, timing = check_timings(events, tables.no_ts, tables.negative_dur)
    if len(events) == 0:
        raise TraceError(f"{path}: empty trace (no complete events" + (
            f"; {tables.no_ts:,} without a timestamp)" if tables.no_ts else ")"))
    meta = msgspec.structs.replace(_meta(path, parsed, chunks.raw_bytes), timing=timing)
    return Trace(events=events, memory=memory, meta=meta)


def _invalid(exc: msgspec.ValidationError) -> str:
    """What a validation error says about the file. A chunk of events is decoded as an array
    of its own, so ``$[i]`` is an entry of ``traceEvents`` (its index is the chunk's: not
    said); the top level is decoded as itself (no path)."""
    text = str(exc)
    what, _, where = text.partition(" - at `")
    if what.startswith("Expected `object`") and not where:
        return "top level is not a JSON object"
    if what.startswith("Expected `object`") and re.fullmatch(r"\$\[\d+\]`", where):
        return f"traceEvents holds an entry that is not an event object: {what.lower()}"
    field = re.fullmatch(r"\$\[\d+\]\.(.+)`", where)
    if field:  # the chunk's index would mislead: the field alone
        return f"{what} in an event's {field.group(1)}"
    return text


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
