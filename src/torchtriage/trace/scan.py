"""The JSON structure of a stretch of bytes, found with numpy, and the likely ends of events.

:func:`structure` marks every byte by one table lookup (``{`` and ``[`` +1, ``}`` and ``]`` -1,
a quote 2, a control character 3), drops the quotes escaped by an odd run of backslashes,
counts the quotes before each bracket to keep only the brackets outside strings, and sums
their steps into the nesting depth after each. The state at the end (inside a string or not,
after an escaping backslash or not, and the depth) carries to the next stretch, so a file is
scanned once, block by block. The first control character stops it: no JSON holds one.

:func:`candidate_cuts` finds the likely ends of events without any structure: a ``}`` followed
by ``,`` and ``{``; the stream checks them by decoding (or hands them out as pieces).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

KEY = b'"traceEvents"'
LOOKBACK = 256  # bytes kept before a block, to find the key of an array opened in it
SEPARATORS = frozenset(b" \t\r\n,")
_QUOTE, _BACKSLASH = 34, 92
_CODE = np.zeros(256, dtype=np.int8)
_CODE[[123, 91]] = 1
_CODE[[125, 93]] = -1
_CODE[_QUOTE] = 2
_CODE[[c for c in range(32) if c not in (9, 10, 13)]] = 3  # in no JSON, in a string or not
_SPACE = b" \t\r\n"
_CUT_TRIES = 8  # candidate cuts tried from the end of a block before scanning it
_NO_MARKS = np.zeros(0, dtype=np.int64)


class Scan(NamedTuple):
    """What :func:`structure` found: the brackets outside strings and the depth after each,
    the string state at the end, and the first byte that no JSON holds (-1: none)."""

    positions: np.ndarray
    depths: np.ndarray
    in_string: bool
    escaped: bool
    bad: int


def as_array(data: bytes, end: int) -> bytes:
    """``data[:end]`` (whole events, maybe after a comma) as a JSON array, in one copy."""
    start = 0
    while start < end and data[start] in SEPARATORS:
        start += 1
    return b"".join((b"[", memoryview(data)[start:end], b"]"))


def leading_separators(data: bytes | bytearray) -> int:
    """How many whitespace and comma bytes ``data`` starts with, without copying the rest of
    it (``lstrip`` copies what remains: a block's or a piece's worth at every cut)."""
    head = data[:64]
    run = len(head) - len(head.lstrip(b" \t\r\n,"))
    if run < len(head) or len(data) <= 64:
        return run
    return len(data) - len(data.lstrip(b" \t\r\n,"))  # a long run of them: one copy


def candidate_cuts(data: bytes) -> Iterator[int]:
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


def structure(data: bytes | bytearray, start: int, in_string: bool, escaped: bool,
               depth: int) -> Scan:
    """Scan ``data[start:]`` (the state at ``start`` given): positions of the brackets outside
    strings, the nesting depth after each, the string/escape state at the end, and the first
    control character (which JSON never holds) if any; positions are of ``data``."""
    b = np.frombuffer(data, np.uint8)[start:]
    codes = _CODE[b]  # one pass: +1 for { [, -1 for } ], 2 for a quote, 3 for a control byte
    first = int(np.argmax(codes == 3)) if len(codes) else 0
    if len(codes) and codes[first] == 3:  # the caller stops there: no structure needed
        return Scan(_NO_MARKS, _NO_MARKS, in_string, escaped, first + start)
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
    bracket = (kinds == 1) | (kinds == -1)
    brackets = marks[bracket]
    steps = kinds[bracket]
    outside = (np.searchsorted(quotes, brackets) + int(in_string)) % 2 == 0
    brackets = brackets[outside]
    depths = depth + np.cumsum(steps[outside], dtype=np.int64)
    end_in_string = in_string ^ bool(len(quotes) % 2)
    return Scan(brackets + start, depths, end_in_string,
                 end_in_string and _odd_run(b, len(b), escaped), -1)


def until_closed(scan: Scan, floor: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """The brackets of ``scan`` before the first that takes the depth below ``floor``, and
    the position just after that one (None: none does)."""
    below = np.flatnonzero(scan.depths < floor)
    if not len(below):
        return scan.positions, scan.depths, None
    first = int(below[0])
    return scan.positions[:first], scan.depths[:first], int(scan.positions[first]) + 1


def _odd_run(b: np.ndarray, position: int, escaped_at_start: bool) -> bool:
    """Whether the backslashes right before ``b[position]`` escape it (an odd run)."""
    i = position - 1
    while i >= 0 and b[i] == _BACKSLASH:
        i -= 1
    run = position - 1 - i
    if i < 0 and escaped_at_start:  # the block's first backslash was itself escaped
        run -= 1
    return run % 2 == 1


def events_array_start(data: bytes, positions: np.ndarray, depths: np.ndarray) -> int | None:
    """Position of the ``[`` that opens the top-level ``traceEvents`` array, if seen."""
    values = np.frombuffer(data, np.uint8)[positions]
    for pos in positions[(depths == 2) & (values == 91)]:
        before = data[max(int(pos) - LOOKBACK, 0):int(pos)].rstrip(b" \t\r\n")
        if before.endswith(b":") and before[:-1].rstrip(b" \t\r\n").endswith(KEY):
            return int(pos)
    return None
