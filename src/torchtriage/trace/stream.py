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

Linear in the input, whatever it holds: a stretch with no event's end (one huge event, an
unclosed string, a writer's unfinished last event) is scanned once, block by block, carrying
the string state and depth from one block to the next, and decoded once when its end comes;
whitespace between events is dropped as it comes. Bytes that JSON never holds (control
characters such as the NULs a crashed writer leaves, a byte that cannot start a value where an
event should begin, a bracket that closes what was not opened, anything after the top-level
object) are reported at their byte as soon as they are seen.

Memory is one block plus one chunk of decoded events at a time, whatever the file's size; with
a memory limit, the bytes held besides (what is outside the array, and a stretch not cut yet)
are bounded by shares of it from the first byte (:data:`OUTSIDE_SHARE`, :data:`PENDING_SHARE`).

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
from torchtriage.trace.scan import (
    KEY,
    LOOKBACK,
    as_array,
    candidate_cuts,
    events_array_start,
    leading_separators,
    structure,
    until_closed,
)

try:  # ISA-L's inflate: the same API as zlib's, 2-3x its speed (optional, see pyproject)
    from isal import isal_zlib as _inflate_module

    _INFLATE_ERRORS: tuple[type[Exception], ...] = (zlib.error, _inflate_module.error)
except ImportError:  # pragma: no cover - isal is a default dependency
    _inflate_module = zlib  # type: ignore[assignment]
    _INFLATE_ERRORS = (zlib.error,)

# Uncompressed bytes read per step. A block's events are decoded at once, so the block sets
# the load's working set besides the tables: 1 MB blocks took the peak of a 10-35 MB trace
# from 31-44 MB to 12-29 MB, and loaded as fast as 4 MB ones or faster (2026-12-04).
BLOCK_BYTES = 1024 * 1024
_COMPRESSED_READ = 1024 * 1024
_SPACE = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark
_VALUE_START = frozenset(b'{["-0123456789tfn')  # the bytes a JSON value can begin with
_LITERALS = (b"true", b"false", b"null")
# Shares of the memory limit that the bytes held besides the tables may take. Outside the
# events array: a trace's metadata is kilobytes (deviceProperties, distributedInfo), and it is
# decoded into Python objects, up to ~20x its JSON ("[]," is a 56-byte list). A stretch of
# events not cut yet is one or two blocks in a trace; its decode copies it once more and makes
# at most its strings of it.
OUTSIDE_SHARE = 1 / 64
PENDING_SHARE = 1 / 4
_LIMIT_ENV = "TORCHTRIAGE_MEMORY_LIMIT"  # (ingest's MEMORY_LIMIT_ENV, named in the error)
_BOUNDARY = (False, False, 2)  # the scan's state between two events: no string, depth 2
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
    events (that is how a wrong cut is recognised); other errors propagate. ``memory_limit``
    (bytes, named by ``limit_label`` in the error) bounds the bytes held besides the decoded
    chunks: :data:`OUTSIDE_SHARE` of it outside the events array, :data:`PENDING_SHARE` for
    events text not cut yet.
    """

    def __init__(self, path: Path, decode: Callable[[bytes], T],
                 block_bytes: int = BLOCK_BYTES, memory_limit: int | None = None,
                 limit_label: str = "") -> None:
        self.path = path
        self.decode = decode
        self.block_bytes = block_bytes
        self.memory_limit = memory_limit
        self.limit_label = limit_label
        self.raw_bytes = 0
        self.outside = b""  # the document without its events, "traceEvents": [] in their place
        self.found_events = False
        self._rewound = b""  # pieces handed back, cut again (checked) before what follows
        self._checked = False  # after a rewind, every cut is checked by decoding here
        self._tail = bytearray()  # events text not cut yet, from an event boundary on
        self._scanned = 0  # of _tail, scanned without an event's end in it (0: not at all)
        self._state = _BOUNDARY  # (in_string, escaped, depth) at _tail[_scanned]

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
        suffix = bytearray()  # from the array's closing "]" on, up to the document's end
        look = b""  # (prefix phase) the bytes before the block, for a key cut by its edge
        state = (False, False, 0)  # (prefix, suffix phases) the scan's state at the end
        phase = "lead"  # -> "prefix" -> "events" -> "suffix" -> "end" (the document closed)
        for block in _blocks(self.path, self.block_bytes):
            self.raw_bytes += len(block)
            if phase == "lead":  # whitespace before the document, then its first byte
                if self.raw_bytes == len(block) and block.startswith(_BOM):
                    block = block[len(_BOM):]  # as Windows editors write: no JSON, but harmless
                block = block.lstrip(_SPACE)
                if not block:
                    continue
                self._check_top(block)
                phase = "prefix"
            if phase == "end":
                self._only_space(block, self.raw_bytes - len(block))
                continue
            if phase == "suffix":
                start = len(suffix)
                suffix += block
                state, ended = self._scan_outside(suffix, start, state)
                phase = "end" if ended else phase
                self._hold(len(prefix) + len(suffix), OUTSIDE_SHARE,
                           "outside its traceEvents array")
                continue
            if phase == "prefix":
                data, start = look + block, len(look)
                base = self.raw_bytes - len(data)  # the file offset of data[0]
                opened = None
                key = data.find(KEY, start - min(start, len(KEY)))
                if key >= 0:  # the usual case: scan only up to the key, not the whole block
                    opened, _, _ = self._prefix_scan(data[:key + len(KEY) + LOOKBACK],
                                                     start, state, base)
                if opened is None:
                    opened, state, end = self._prefix_scan(data, start, state, base)
                    if opened is None and end is not None:  # the document ended without it
                        prefix += data[start:end]
                        self._only_space(data[end:], base + end)
                        phase = "end"
                        continue
                    if opened is None:
                        prefix += block
                        self._hold(len(prefix), OUTSIDE_SHARE, "before a traceEvents array")
                        look = data[-LOOKBACK:]
                        continue
                prefix += data[start:opened + 1]
                self._tail = bytearray(memoryview(data)[opened + 1:])
                phase = "events"
                self.found_events = True
            else:
                self._tail += block
            closed = yield from self._step(check)
            if closed is not None:
                suffix = bytearray(memoryview(self._tail)[closed:])
                self._tail = bytearray()
                state, ended = self._scan_outside(suffix, 1, (False, False, 1))
                phase = "end" if ended else "suffix"
            self._hold(self._scanned, PENDING_SHARE,  # (a block or two besides, at most)
                       "in one event (or a stretch without an event's end)", self._offset())
            self._hold(len(prefix) + len(suffix), OUTSIDE_SHARE, "outside its traceEvents array")
        if phase == "events":
            closed = yield from self._finish(check)
            suffix = bytearray(memoryview(self._tail)[closed:])
            self._tail = bytearray()
            self._scan_outside(suffix, 1, (False, False, 1))
        self.outside = bytes(prefix) + bytes(suffix)

    def _step(self, check: bool) -> Iterator[Any]:
        """Cut what can be cut of the events text (``_tail``): the events before a likely cut
        (a piece, or decoded when ``check``), else the events before the last end the
        structure shows. Returns the position of the array's closing ``]`` in what is left,
        when it is there."""
        while True:
            if self._scanned:  # in a long stretch: only the structure, from where it stopped
                break
            confirmed = check or self._checked  # (else a piece's cut may be wrong: the text
            # after it is not known to be at a boundary until SYNC)
            if not self._at_boundary(strip=confirmed):
                return None
            tail = self._tail
            if confirmed:
                for cut in candidate_cuts(tail):
                    array = as_array(tail, cut)
                    try:
                        decoded = self._decode(array, self._offset() + cut + 2 - len(array))
                    except msgspec.ValidationError:
                        continue
                    except msgspec.DecodeError as exc:
                        # A wrong cut leaves the array open at its end ("truncated", or the
                        # "]" added at the end out of place), or, past the events array's own
                        # end, closes it early ("trailing characters"); any other error before
                        # the end is corrupt data, which no other cut mends.
                        if _malformed_before(exc, len(array) - 1):
                            raise self._corrupt(exc, self._offset() + cut + 2 - len(array)
                                                ) from None
                        continue
                    yield decoded
                    del tail[:cut]
                    return None
                break
            cut = next(candidate_cuts(tail), None)
            if cut is not None:
                yield Piece(self._offset(), bytes(memoryview(tail)[:cut]))
                del tail[:cut]
                return None
            yield SYNC  # a cut from the structure builds on every cut before it
            if self._rewound:
                continue  # the pieces handed back are cut again, checked
            if not self._at_boundary(strip=True):
                return None
            break
        decoded, closed = self._structural()
        if decoded is not None:
            yield decoded
        return closed

    def _finish(self, check: bool) -> Iterator[Any]:
        """At the file's end: the last events (but the last one, as a piece when cutting
        without checks; everything handed out confirmed), then, with checks, the rest up to
        the array's end. Returns the position of its closing ``]``."""
        if not (check or self._checked or self._scanned) and self._at_boundary(strip=False):
            cut = next(candidate_cuts(self._tail), None)
            if cut is not None:
                yield Piece(self._offset(), bytes(memoryview(self._tail)[:cut]))
                del self._tail[:cut]
        if not check:
            yield SYNC
        while True:
            closed = yield from self._step(check=True)
            if closed is not None:
                return closed
            if not self._tail or self._scanned == len(self._tail):
                raise TraceError(f"{self.path}: truncated trace (its traceEvents array is not "
                                 f"closed after {self.raw_bytes / 1e6:.1f} MB)")

    def _at_boundary(self, strip: bool) -> bool:
        """With the events text at an event boundary: take back what was handed back and,
        when ``strip`` (the boundary is confirmed), drop the separators and check that what
        follows can begin a JSON value. False when nothing is left."""
        if self._rewound:
            self._tail[:0] = self._rewound
            self._rewound = b""
        tail = self._tail
        if not strip:
            return bool(tail)
        skip = leading_separators(tail)
        if skip:
            del tail[:skip]
        if tail and tail[0] not in _VALUE_START and tail[0] != 93:
            raise self._bad_byte(self._offset(), tail[0], "where an event should begin")
        return bool(tail)

    def _structural(self) -> tuple[T | None, int | None]:
        """Scan the events text from where the last scan stopped: decode the events before
        the last end it shows (and drop them from ``_tail``); returns (decoded or None, the
        position of the array's closing ``]`` in what is left, if there)."""
        if self._rewound:  # handed back after the scan began: scan again from the boundary
            self._tail[:0] = self._rewound
            self._rewound = b""
            self._scanned, self._state = 0, _BOUNDARY
        tail, offset = self._tail, self._offset()
        scan = structure(tail, self._scanned, *self._state)
        self._raise_bad(tail, scan.bad, offset)
        positions, depths = scan.positions, scan.depths
        values = np.frombuffer(tail, np.uint8)[positions]
        low = np.flatnonzero(depths < 2)
        closed = None
        if len(low):  # the array's "]", or a bracket that closes what was not opened
            first = int(low[0])
            closed = int(positions[first])
            if values[first] != 93 or depths[first] != 1:
                raise self._bad_byte(offset + closed, tail[closed], "closes what was not opened")
            positions, depths, values = positions[:first], depths[:first], values[:first]
        if closed is not None:  # the rest is decoded to the "]": no entry is left out
            cut = closed if tail[:closed].strip(b" \t\r\n,") else 0
        else:
            ends = positions[(depths == 2) & (values == 125)]
            cut = int(ends[-1]) + 1 if len(ends) else 0
        if not cut:
            if closed is None:
                self._scanned = len(tail)
                self._state = (scan.in_string, scan.escaped,
                               int(depths[-1]) if len(depths) else self._state[2])
            return None, closed
        array = as_array(tail, cut)
        try:
            decoded = self._decode(array, offset + cut + 2 - len(array))
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError as exc:
            raise self._corrupt(exc, offset + cut + 2 - len(array)) from None
        del tail[:cut]
        self._scanned, self._state = 0, _BOUNDARY
        if closed is None:  # a checked boundary: the whitespace after it is not kept
            del tail[:leading_separators(tail)]
            return decoded, None
        return decoded, closed - cut

    def _prefix_scan(self, data: bytes, start: int, state: tuple[bool, bool, int], base: int
                     ) -> tuple[int | None, tuple[bool, bool, int], int | None]:
        """Scan ``data[start:]`` (before the events array; ``data[0]`` at file offset
        ``base``) from ``state``: returns where the events array opens (if it does, before
        the document's end), the state at the end, and where the document ended (just after
        its top-level value's close), if it did."""
        scan = structure(data, start, *state)
        self._raise_bad(data, scan.bad, base)
        positions, depths, end = until_closed(scan, 1)
        state = (scan.in_string, scan.escaped, int(depths[-1]) if len(depths) else state[2])
        return events_array_start(data, positions, depths), state, end

    def _scan_outside(self, data: bytearray, start: int, state: tuple[bool, bool, int]
                      ) -> tuple[tuple[bool, bool, int], bool]:
        """Scan the suffix, ``data[start:]`` (its last byte the last read), from ``state``:
        returns the state after it and whether the document ended there (its top-level value
        closed; ``data`` is cut just after that, and what followed must be whitespace)."""
        base = self.raw_bytes - len(data)
        scan = structure(data, start, *state)
        self._raise_bad(data, scan.bad, base)
        _, depths, end = until_closed(scan, 1)
        if end is None:
            return (scan.in_string, scan.escaped, int(depths[-1]) if len(depths) else state[2]
                    ), False
        self._only_space(bytes(memoryview(data)[end:]), base + end)
        del data[end:]
        return (False, False, 0), True

    def _check_top(self, block: bytes) -> None:
        """The document's first byte (after whitespace) opens an object, or the file is not
        a Kineto trace: said at once, not after reading the rest of it."""
        first = block[0]
        if first == 123:
            return
        if first in b'["-0123456789' or block.startswith(_LITERALS):
            raise TraceError(f"{self.path}: not a Kineto trace (top level is not a JSON "
                             "object)")
        if first in b"tfn" and len(block) < 5:
            return  # a literal cut by the block's edge, maybe: the decoder will say
        raise self._bad_byte(self.raw_bytes - len(block), first, "where the document should "
                             "begin")

    def _only_space(self, data: bytes, offset: int) -> None:
        """After the document's end only whitespace may follow; ``data`` is at ``offset``."""
        rest = data.lstrip(_SPACE)
        if rest:
            raise self._bad_byte(offset + len(data) - len(rest), rest[0],
                                 "after the end of the document")

    def _hold(self, held: int, share: float, what: str, at: int | None = None) -> None:
        """Refuse to hold more undecoded bytes than ``share`` of the memory limit."""
        if self.memory_limit is None or held <= self.memory_limit * share:
            return
        raise TraceError(
            f"{self.path}: too large for the memory limit: more than {held / 1e6:,.1f} MB of "
            f"JSON {what}{'' if at is None else f' at byte {at:,}'}, past {share:.1%} of "
            f"{self.limit_label or 'the limit'}; not a trace as torch.profiler writes it, or "
            f"set a larger {_LIMIT_ENV}")

    def _offset(self) -> int:
        """The file offset of the events text's first byte."""
        return self.raw_bytes - len(self._tail)

    def _raise_bad(self, data: bytes | bytearray, bad: int, base: int) -> None:
        """Raise for ``data[bad]``, a byte no JSON holds, if any (``data[0]`` is at ``base``)."""
        if bad >= 0:
            raise self._bad_byte(base + bad, data[bad], "")

    def _bad_byte(self, offset: int, byte: int, where: str) -> TraceError:
        """The one-line error for a byte that JSON never holds there."""
        if byte < 32:
            what = "a NUL byte" if byte == 0 else f"control character 0x{byte:02x}"
        else:
            what = f"{chr(byte)!r} (0x{byte:02x})" if byte < 128 else f"byte 0x{byte:02x}"
        hint = "; a writer that stopped before it finished leaves NULs" if byte == 0 else ""
        return TraceError(f"{self.path}: not valid JSON at byte {offset:,}"
                          f"{' of the uncompressed trace' if self._gzipped() else ''} "
                          f"({what}{', ' + where if where else ''}{hint})")

    def _decode(self, array: bytes, array_start: int) -> T:
        """``decode(array)``; JSON nested deeper than the decoder goes is a one-line error at
        its deepest byte (``array_start``: the file offset of ``array[1]``)."""
        try:
            return self.decode(array)
        except RecursionError:
            scan = structure(array, 0, False, False, 0)
            if not len(scan.depths):  # a control character stopped the scan: that is the error
                raise self._bad_byte(array_start + max(scan.bad - 1, 0), array[scan.bad]
                                     if scan.bad >= 0 else 0, "") from None
            deepest = int(np.argmax(scan.depths))
            raise TraceError(
                f"{self.path}: not a Kineto trace: JSON nested {int(scan.depths[deepest]) + 1} "
                f"levels deep at byte {array_start + int(scan.positions[deepest]) - 1:,}, more "
                "than the decoder takes") from None

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
            yield head + handle.read(block_bytes)  # the document's first bytes in one block
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


