"""Stream a Kineto JSON file as chunks of whole events, without holding the file in memory.

A trace is one JSON object whose ``traceEvents`` array holds nearly all of its bytes. The
file is read (and gunzipped) block by block. The array is cut after the last ``}`` of a block
that is followed by ``,`` and ``{`` and the events before the cut are decoded at once: the cut
is right exactly when they decode (a cut inside a string or a nested object leaves the chunk
unbalanced, which the decoder rejects). Where no cut decodes, and at the two ends of the array,
the JSON structure is tracked with numpy instead (string state from the unescaped quotes,
nesting depth from the brackets outside strings). Everything outside the array (the prefix
with ``deviceProperties`` and ``distributedInfo``, the suffix with ``baseTimeNanoseconds``) is
kept and returned as one small JSON object with an empty ``traceEvents``.

Memory is one block plus one chunk of decoded events at a time, whatever the file's size.

For a decoder in another process, :meth:`EventChunks.pieces` hands out the events text itself,
cut at the likely ends of events without decoding it here: a piece that then fails to decode
(a cut inside a string, or corrupt data) is handed back with :meth:`EventChunks.rewind`, and
from there the cuts are checked by decoding here again, where corrupt data is reported with its
byte offset. Gzip is inflated by ISA-L (``isal``) when it is installed, else by zlib.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec
import numpy as np

from torchtriage.errors import TraceError

try:  # ISA-L's inflate: the same API as zlib's, 2-3x its speed (optional, see pyproject)
    from isal import isal_zlib as _inflate_module

    _INFLATE_ERRORS: tuple[type[Exception], ...] = (zlib.error, _inflate_module.error)
except ImportError:  # pragma: no cover - isal is a default dependency
    _inflate_module = zlib  # type: ignore[assignment]
    _INFLATE_ERRORS = (zlib.error,)

BLOCK_BYTES = 4 * 1024 * 1024  # uncompressed bytes read per step
_COMPRESSED_READ = 1024 * 1024
_QUOTE, _BACKSLASH = 34, 92
_KEY = b'"traceEvents"'
_CODE = np.zeros(256, dtype=np.int8)
_CODE[[123, 91]] = 1
_CODE[[125, 93]] = -1
_CODE[_QUOTE] = 2
_LOOKBACK = 256  # bytes kept before a block, to find the key of an array opened in it
_SPACE = b" \t\r\n"
_SEPARATORS = frozenset(b" \t\r\n,")
_CUT_TRIES = 8  # candidate cuts tried from the end of a block before scanning it

T = TypeVar("T")


class Piece(NamedTuple):
    """Whole events as written in the file (separators included), not decoded yet."""

    offset: int  # of text[0] in the uncompressed file
    text: bytes


SYNC = Piece(-1, b"")  # from pieces(): confirm (or rewind) every piece handed out so far


class EventChunks(Generic[T]):
    """Iterate over ``decode(b"[ev, ev, ...]")`` for chunks of complete events; afterwards
    :attr:`outside` holds the rest of the document and :attr:`raw_bytes` its total size.

    ``decode`` must raise :class:`msgspec.DecodeError` for text that is not a JSON array of
    events (that is how a wrong cut is recognised); other errors propagate.
    """

    def __init__(self, path: Path, decode: Callable[[bytes], T],
                 block_bytes: int = BLOCK_BYTES) -> None:
        self.path = path
        self.decode = decode
        self.block_bytes = block_bytes
        self.raw_bytes = 0
        self.outside = b""  # the document without its events, "traceEvents": [] in their place
        self.found_events = False
        self._rewound = b""  # pieces handed back, cut again (checked) before what follows
        self._checked = False  # after a rewind, every cut is checked by decoding here

    def __iter__(self) -> Iterator[T]:
        return self._run(check=True)  # type: ignore[return-value]

    def pieces(self) -> Iterator[Piece | T]:
        """The events as :class:`Piece` texts to decode elsewhere, cut at each block's last
        likely end of an event without decoding. :data:`SYNC` asks the caller to make sure
        every piece so far decodes (a cut that is not checked must not be built on), calling
        :meth:`rewind` when one does not; from a rewind on, this yields what ``decode``
        returns instead, for the rest of the file."""
        return self._run(check=False)

    def rewind(self, pieces: list[Piece]) -> None:
        """Hand back the pieces from the first that did not decode on (in order): they are
        cut again, each cut checked by decoding, and so is everything after them."""
        self._rewound = b"".join(p.text for p in pieces) + self._rewound
        self._checked = True

    def _run(self, check: bool) -> Iterator[Any]:
        prefix = bytearray()  # bytes before the events array, up to and including its "["
        suffix = bytearray()  # from the array's closing "]" on
        tail = b""  # bytes carried into the next block
        in_string, escaped, depth = False, False, 0  # (prefix phase) state at the end of tail
        phase = "prefix"  # -> "events" -> "suffix"
        for block in _blocks(self.path, self.block_bytes):
            self.raw_bytes += len(block)
            if phase == "suffix":
                suffix += block
                continue
            if phase == "prefix":
                data, start = tail + block, len(tail)
                opened = None
                key = data.find(_KEY, start - min(start, len(_KEY)))
                if key >= 0:  # the usual case: scan only up to the key, not the whole block
                    head = data[:key + len(_KEY) + _LOOKBACK]
                    positions, depths, _, _ = _structure(head, start, in_string, escaped,
                                                         depth)
                    opened = _events_array_start(head, positions, depths)
                if opened is None:
                    positions, depths, in_string, escaped = _structure(
                        data, start, in_string, escaped, depth)
                    if len(depths):
                        depth = int(depths[-1])
                    opened = _events_array_start(data, positions, depths)
                if opened is None:
                    prefix += block
                    tail = data[-_LOOKBACK:]
                    continue
                prefix += data[start:opened + 1]
                phase, tail = "events", data[opened + 1:]
                self.found_events = True
            else:
                tail += block
            # events phase: tail starts at an event boundary (outside strings, depth 2)
            tail, self._rewound = self._rewound + tail, b""
            if not (check or self._checked):
                cut = next(_candidate_cuts(tail), None)
                if cut is not None:
                    yield Piece(self.raw_bytes - len(tail), tail[:cut])
                    tail = tail[cut:]
                    continue
                yield SYNC  # a cut from the structure builds on every cut before it
                tail, self._rewound = self._rewound + tail, b""
            decoded, cut, closed = self._cut(tail, self.raw_bytes - len(tail), at_end=False)
            if decoded is not None:
                yield decoded
            if closed is not None:
                suffix += tail[closed:]
                phase, tail = "suffix", b""
            else:
                tail = tail[cut:]
        if phase == "events":
            if not (check or self._checked):
                # The last block's events but the last go out as a piece too, so that only
                # one event and the array's end are cut here from the structure.
                cut = next(_candidate_cuts(tail), None)
                if cut is not None:
                    yield Piece(self.raw_bytes - len(tail), tail[:cut])
                    tail = tail[cut:]
            if not check:
                yield SYNC
                closed = None
                if self._rewound:  # pieces handed back: their cuts checked, not one chunk
                    tail, self._rewound = self._rewound + tail, b""
                    decoded, cut, closed = self._cut(tail, self.raw_bytes - len(tail),
                                                     at_end=False)
                    if decoded is not None:
                        yield decoded
                    if closed is None:
                        tail = tail[cut:]
                if closed is not None:  # the array's end was in what was handed back
                    suffix += tail[closed:]
                    phase = "suffix"
        if phase == "events":
            decoded, cut, closed = self._cut(tail, self.raw_bytes - len(tail), at_end=True)
            if decoded is not None:
                yield decoded
            if closed is None:
                raise TraceError(f"{self.path}: truncated trace (its traceEvents array is not "
                                 f"closed after {self.raw_bytes / 1e6:.1f} MB)")
            suffix += tail[closed:]
        self.outside = bytes(prefix) + bytes(suffix)

    def _cut(self, data: bytes, offset: int, at_end: bool) -> tuple[T | None, int, int | None]:
        """Decode the complete events at the start of ``data`` (which starts at an event
        boundary, at byte ``offset`` of the file): returns (decoded or None, where the rest
        begins, position of the array's closing ``]`` when it is in ``data``)."""
        if not at_end:
            for cut in _candidate_cuts(data):
                array = _as_array(data, cut)
                try:
                    return self.decode(array), cut, None
                except msgspec.ValidationError:
                    continue
                except msgspec.DecodeError as exc:
                    # A wrong cut leaves the array open at its end ("truncated", or the "]"
                    # added at the end out of place), or, past the events array's own end,
                    # closes it early ("trailing characters"); any other error before the end
                    # is corrupt data, which no other cut mends (the structure would not find
                    # the array's end past it either, and read the rest of the file into one
                    # chunk).
                    if _malformed_before(exc, len(array) - 1):
                        raise self._corrupt(exc, offset + cut + 2 - len(array)) from None
                    continue
        # The structure, then: the ends of the events and the array's end, if here.
        positions, depths, _, _ = _structure(data, 0, False, False, 2)
        values = np.frombuffer(data, np.uint8)[positions]
        closes = positions[(depths == 1) & (values == 93)]
        closed = int(closes[0]) if len(closes) else None
        ends = positions[(depths == 2) & (values == 125)]
        if closed is not None:
            ends = ends[ends < closed]
        if not len(ends):
            return None, 0, closed
        cut = int(ends[-1]) + 1
        array = _as_array(data, cut)
        try:
            return self.decode(array), cut, closed
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError as exc:
            raise self._corrupt(exc, offset + cut + 2 - len(array)) from None

    def _corrupt(self, exc: msgspec.DecodeError, array_start: int) -> TraceError:
        """The one-line error for JSON that does not decode, at its byte in the file."""
        return TraceError(f"{self.path}: not valid JSON at byte "
                          f"{_error_offset(exc, array_start):,}"
                          f"{' of the uncompressed trace' if self._gzipped() else ''} ({exc})")

    def _gzipped(self) -> bool:
        with self.path.open("rb") as f:
            return f.read(2) == b"\x1f\x8b"


def _malformed_before(exc: msgspec.DecodeError, position: int) -> bool:
    """Whether msgspec found malformed JSON before ``position`` of what it decoded."""
    message = str(exc)
    found = re.search(r"\(byte (\d+)\)", message)
    return (found is not None and int(found.group(1)) < position
            and "trailing characters" not in message)


def _error_offset(exc: msgspec.DecodeError, array_start: int) -> int:
    """The file offset of a decode error, from msgspec's "(byte N)" in the array decoded
    (``array_start``: the file offset of the array's first event, after its ``[``)."""
    found = re.search(r"\(byte (\d+)\)", str(exc))
    return array_start + max(int(found.group(1)) - 1, 0) if found else array_start


def _as_array(data: bytes, end: int) -> bytes:
    """``data[:end]`` (whole events, maybe after a comma) as a JSON array, in one copy."""
    start = 0
    while start < end and data[start] in _SEPARATORS:
        start += 1
    return b"".join((b"[", memoryview(data)[start:end], b"]"))


def _candidate_cuts(data: bytes) -> Iterator[int]:
    """Positions just after a ``}`` followed by ``,`` and ``{`` (whitespace allowed), from the
    end of ``data`` backwards: the likely ends of events."""
    end = len(data)
    for _ in range(_CUT_TRIES):
        brace = data.rfind(b"}", 0, end)
        if brace < 0:
            return
        end = brace
        rest = data[brace + 1:brace + 64].lstrip(_SPACE)
        if rest[:1] == b"," and rest[1:].lstrip(_SPACE)[:1] == b"{":
            yield brace + 1


def _blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    """The file's bytes (gunzipped when it is gzip) in blocks of at most ``block_bytes``."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file or directory") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with handle:
        head = handle.read(2)
        if head != b"\x1f\x8b":
            yield head
            while block := handle.read(block_bytes):
                yield block
            return
        inflate = _inflate_module.decompressobj(wbits=31)
        in_member = False  # a gzip member was begun and has not ended
        data = head
        while True:
            data += handle.read(_COMPRESSED_READ)
            if not data:
                break
            try:
                while data:
                    in_member = True
                    out = inflate.decompress(data, block_bytes)
                    if out:
                        yield out
                    if inflate.eof:  # a multi-member gzip file: the next member may follow
                        in_member = False
                        data = inflate.unused_data
                        inflate = _inflate_module.decompressobj(wbits=31)
                        if data[:2] != b"\x1f\x8b":
                            data = b""  # padding after the last member
                        continue
                    data = inflate.unconsumed_tail
            except _INFLATE_ERRORS as exc:
                raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
        if in_member:
            raise TraceError(f"{path}: truncated or corrupt gzip (the file ends inside its "
                             "compressed stream)")


def _structure(data: bytes, start: int, in_string: bool, escaped: bool, depth: int
               ) -> tuple[np.ndarray, np.ndarray, bool, bool]:
    """Scan ``data[start:]`` (the state at ``start`` given): positions of the brackets outside
    strings, the nesting depth after each, and the string/escape state at the end."""
    b = np.frombuffer(data, np.uint8)[start:]
    codes = _CODE[b]  # one pass: +1 for { [, -1 for } ], 2 for a quote, 0 elsewhere
    marks = np.flatnonzero(codes)
    kinds = codes[marks]
    is_quote = kinds == 2
    quotes = marks[is_quote]
    if len(quotes):
        # A quote is escaped when an odd run of backslashes precedes it (rare: check each one).
        after_backslash = quotes[quotes > 0]
        after_backslash = after_backslash[b[after_backslash - 1] == _BACKSLASH]
        drop = [int(q) for q in after_backslash if _odd_run(b, int(q), escaped)]
        if escaped and quotes[0] == 0:
            drop.append(0)
        if drop:
            quotes = np.setdiff1d(quotes, np.asarray(drop, dtype=quotes.dtype),
                                  assume_unique=True)
    brackets = marks[~is_quote]
    steps = kinds[~is_quote]
    outside = (np.searchsorted(quotes, brackets) + int(in_string)) % 2 == 0
    brackets = brackets[outside]
    depths = depth + np.cumsum(steps[outside], dtype=np.int64)
    end_in_string = in_string ^ bool(len(quotes) % 2)
    return brackets + start, depths, end_in_string, end_in_string and _odd_run(
        b, len(b), escaped)


def _odd_run(b: np.ndarray, position: int, escaped_at_start: bool) -> bool:
    """Whether the backslashes right before ``b[position]`` escape it (an odd run)."""
    i = position - 1
    while i >= 0 and b[i] == _BACKSLASH:
        i -= 1
    run = position - 1 - i
    if i < 0 and escaped_at_start:  # the block's first backslash was itself escaped
        run -= 1
    return run % 2 == 1


def _events_array_start(data: bytes, positions: np.ndarray, depths: np.ndarray) -> int | None:
    """Position of the ``[`` that opens the top-level ``traceEvents`` array, if seen."""
    values = np.frombuffer(data, np.uint8)[positions]
    for pos in positions[(depths == 2) & (values == 91)]:
        before = data[max(int(pos) - _LOOKBACK, 0):int(pos)].rstrip(b" \t\r\n")
        if before.endswith(b":") and before[:-1].rstrip(b" \t\r\n").endswith(_KEY):
            return int(pos)
    return None
