"""Mutated real traces for the ingest fuzzer, and the oracle that judges what torchtriage does
with them (used by ``benchmarks/fuzz.py`` and ``tests/test_fuzz_ingest.py``).

A case starts from a real trace of ``../shared/traces`` (HTA's and Kineto's test data), cut to
a window of a few hundred events around its first profiler steps. Then, drawn by a
:class:`Chooser` (a seeded ``random.Random`` in the long run, hypothesis in CI):

1. up to three changes to the document: a field removed or given another type; NaN, infinite,
   huge, negative or out-of-range numbers (written as JSON number tokens); events duplicated;
   values nested up to 5000 deep; events reordered; hostile strings (NUL, lone surrogates,
   markup, 100k characters); odd step names; a top level without ``traceEvents`` or with odd
   metadata; duplicated keys;
2. serialization (compact or indented, ASCII or not), then up to two changes to the bytes:
   truncation, flipped, inserted or deleted bytes, a range repeated, NULs, control characters,
   another encoding (UTF-16, UTF-32, Latin-1, a byte order mark, invalid UTF-8), garbage before
   or after;
3. sometimes gzip (one member or several, twice, truncated, corrupted, garbage after).

The oracle: ``torchtriage.analyze`` (what ``torchtriage analyze FILE`` runs) and the terminal
report and JSON of each diagnosis must either succeed or raise a :class:`TorchtriageError`
whose message is one line; anything else is a crash. Besides, the trace is loaded three ways,
which must agree (the same tables, or an error each): in 4 MB blocks, in blocks of a few KB
(every cut between blocks exercised), and by two processes (this one and a forked helper) in
pieces of a few KB.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import random
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
RAW_TOKENS = ["1e999", "-1e999", "1E400", "123456789012345678901234567890", "-0", "1.0e-400",
              "NaN", "Infinity", "-Infinity", "18446744073709551616", "-9223372036854775809",
              "0.000000000000000000000000000001", "1e18", "-1"]
ODD_VALUES: list[Any] = [None, True, False, "", "x", "soon", "12", "-3", "1e3", "NaN", 0, -1,
                         1, 2**31, 2**63 - 1, -2**63, 0.5, -0.0, 1e300, -1e300, 5e-324, [],
                         [1, 2], [[]], {}, {"a": 1}, {"": None}, "\u0000", "stream 7"]
HOSTILE = ["", "\u0000", "\ud800", "\udfff\ud800", "x" * 100_000, "[bold red]x[/bold red]",
           "[/bold]", "\x1b[31mred", "}, {", '"}, {"ph": "X"', "\n\r\t", "\u202eevil",
           "ProfilerStep#", "\\", "\\u0000", "🔥" * 50, "aten::mm\u0000", "ÿ" * 10]
STEP_NAMES = ["ProfilerStep#", "ProfilerStep#-5", "ProfilerStep#1e5", "ProfilerStep#0",
              "ProfilerStep#99999999999999999999999", "ProfilerStep# 1", "ProfilerStep#٣",
              "ProfilerStep#3", "ProfilerStep#3.5", "profilerstep#1"]
INSERTS = [b"\0", b"\0" * 4096, b"\x01", b"\x1f", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"]",
           b"}", b"{", b'"', b"\\", b",", b"[" * 200, b"]]]]", b"\t\n", b"NaN", b" " * 10_000,
           b'"traceEvents": [', b"\x1f\x8b"]


class Chooser(Protocol):
    """Where a case's choices come from."""

    def int(self, lo: int, hi: int) -> int: ...
    def coin(self) -> bool: ...


class RandomChooser:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def coin(self) -> bool:
        return self.rng.random() < 0.5


def pick(c: Chooser, seq: Sequence[Any]) -> Any:
    return seq[c.int(0, len(seq) - 1)]


# ---------------------------------------------------------------------------- seeds


def load_seeds(shared: Path = SHARED, max_events: int = 300, max_mb: float = 100.0
               ) -> list[tuple[str, dict[str, Any]]]:
    """The shared traces with a ``traceEvents`` array, each cut to a window of at most
    ``max_events`` events around its first two profiler steps (metadata events kept)."""
    seeds = []
    for path in sorted(shared.rglob("*")):
        if not path.is_file() or not path.name.endswith((".json", ".json.gz")):
            continue
        if path.stat().st_size > max_mb * 1e6:
            continue
        raw = path.read_bytes()
        with contextlib.suppress(OSError, EOFError):
            raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        try:
            doc = _parse(raw)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
            doc["traceEvents"] = _window(doc["traceEvents"], max_events)
            seeds.append((str(path.relative_to(shared)), doc))
    return seeds


def _parse(raw: bytes) -> Any:
    try:
        import orjson  # (a test and benchmark dependency: 5x json's speed on the big seeds)
    except ImportError:
        return json.loads(raw)
    return orjson.loads(raw)


def _window(events: list[Any], max_events: int) -> list[Any]:
    steps = [e for e in events if isinstance(e, dict)
             and str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    meta = [e for e in events if isinstance(e, dict) and e.get("ph") == "M"][:20]
    if not steps:
        return meta + [e for e in events if e not in meta][:max_events]
    steps.sort(key=lambda e: float(e.get("ts", 0)))
    start = float(steps[0]["ts"])
    end = max(float(s["ts"]) + float(s.get("dur", 0)) for s in steps[:2])
    inside = [e for e in events if isinstance(e, dict) and e.get("ph") != "M"
              and isinstance(e.get("ts"), (int, float)) and start <= e["ts"] <= end]
    stride = max(1, len(inside) // max_events)
    kept = [e for i, e in enumerate(inside)
            if i % stride == 0 or str(e.get("name", "")).startswith("ProfilerStep#")]
    return meta + kept[:max_events + 2]


# ---------------------------------------------------------------------------- the document


def _events(doc: dict[str, Any]) -> list[Any]:
    events = doc.get("traceEvents")
    return events if isinstance(events, list) else []


def _event(c: Chooser, doc: dict[str, Any]) -> dict[str, Any] | None:
    events = doc.get("traceEvents")
    if not isinstance(events, list) or not events:
        return None
    event = pick(c, events)
    return event if isinstance(event, dict) else None


def _slot(c: Chooser, doc: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """A place to put a value: a field of an event, of its args, or of the top level."""
    event = _event(c, doc)
    where = c.int(0, 3)
    if where == 3 or event is None:
        return doc, pick(c, [*doc, "deviceProperties", "distributedInfo"])
    if where == 2 and isinstance(event.get("args"), dict) and event["args"]:
        return event["args"], pick(c, list(event["args"]))
    return event, pick(c, ["ph", "ts", "dur", "name", "cat", "pid", "tid", "args", "id", "s"])


def drop_field(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    slot = _slot(c, doc)
    if slot:
        slot[0].pop(slot[1], None)


def retype(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    slot = _slot(c, doc)
    if slot:
        slot[0][slot[1]] = pick(c, ODD_VALUES)


def odd_number(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    """A number no float holds, or an odd one, written as a raw JSON token."""
    event = _event(c, doc)
    if event is not None:
        raw.append(pick(c, RAW_TOKENS))
        field = pick(c, ["ts", "dur", "ts", "dur", "pid", "tid"])
        if c.coin() and isinstance(event.get("args"), dict):
            event["args"][pick(c, ["External id", "correlation", "stream", "Total Allocated",
                                   "Bytes", "device", "Device Type"])] = f"@@RAW{len(raw) - 1}@@"
        else:
            event[field] = f"@@RAW{len(raw) - 1}@@"


def timing(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    """Every event's ts or dur transformed: negated, zeroed, scaled, made equal."""
    field = pick(c, ["ts", "dur"])
    how = c.int(0, 4)
    for event in _events(doc):
        if isinstance(event, dict) and isinstance(event.get(field), (int, float)):
            value = event[field]
            event[field] = [-value, 0, value * 1e9, 1, value + 2**53][how]


def duplicate(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    events = doc.get("traceEvents")
    if isinstance(events, list) and events:
        if c.coin():
            i = c.int(0, len(events) - 1)
            events[i:i] = [events[i]] * c.int(1, 50)
        else:
            events.extend(list(events))


def nest(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    """A value wrapped in lists and objects, up to 5000 deep (a raw token: json.dumps
    recurses)."""
    slot = _slot(c, doc)
    if slot:
        opens, closes = [], []
        for _ in range(pick(c, [1, 2, 5, 60, 500, 1500, 5000])):
            wrap = c.coin()
            opens.append("[" if wrap else '{"a": ')
            closes.append("]" if wrap else "}")
        value = json.dumps(slot[0].get(slot[1], 1))
        raw.append("".join(opens) + value + "".join(reversed(closes)))
        slot[0][slot[1]] = f"@@RAW{len(raw) - 1}@@"


def reorder(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    events = doc.get("traceEvents")
    if isinstance(events, list) and len(events) > 1:
        if c.coin():
            events.reverse()
        for _ in range(c.int(1, 20)):
            i, j = c.int(0, len(events) - 1), c.int(0, len(events) - 1)
            events[i], events[j] = events[j], events[i]


def hostile_string(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    event = _event(c, doc)
    if event is not None:
        event[pick(c, ["name", "name", "cat", "ph", "tid", "pid"])] = pick(c, HOSTILE)


def step_names(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    for event in _events(doc):
        if isinstance(event, dict) and str(event.get("name", "")).startswith("ProfilerStep#"):
            event["name"] = pick(c, STEP_NAMES)
            if c.coin():
                break


def top_level(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    key = pick(c, ["traceEvents", "deviceProperties", "distributedInfo", "baseTimeNanoseconds",
                   "torchtriage", "schemaVersion"])
    if key == "traceEvents" and c.coin():
        doc.pop("traceEvents", None)
    elif key == "distributedInfo" and c.coin():
        doc[key] = {"rank": pick(c, ODD_VALUES), "world_size": pick(c, ODD_VALUES)}
    elif key == "deviceProperties" and c.coin():
        doc[key] = [{"id": pick(c, ODD_VALUES), "name": pick(c, ODD_VALUES),
                     "totalGlobalMem": pick(c, ODD_VALUES)}]
    else:
        doc[key] = pick(c, ODD_VALUES)


def empty(c: Chooser, doc: dict[str, Any], raw: list[str]) -> None:
    events = doc.get("traceEvents")
    if isinstance(events, list):
        doc["traceEvents"] = [e for e in events if isinstance(e, dict) and e.get("ph") == "M"
                              ] if c.coin() else []


DOC_MUTATIONS: list[Callable[[Chooser, dict[str, Any], list[str]], None]] = [
    drop_field, retype, odd_number, timing, duplicate, nest, reorder, hostile_string,
    step_names, top_level, empty]


# ---------------------------------------------------------------------------- the bytes


def serialize(c: Chooser, doc: dict[str, Any], raw: list[str]) -> bytes:
    text = json.dumps(doc, indent=2 if c.coin() else None, ensure_ascii=c.coin())
    for i, token in enumerate(raw):
        text = text.replace(f'"@@RAW{i}@@"', token)
    if c.int(0, 5) == 0:  # a duplicated key, in an event or at the top
        at = text.find('"ts": ')
        if at >= 0 and c.coin():
            text = text[:at] + f'"ts": {pick(c, RAW_TOKENS)}, ' + text[at:]
        else:
            cut = text.rfind("}")
            text = text[:cut] + ', "traceEvents": [{"ph": "X", "ts": 1}]' + text[cut:]
    return text.encode("utf-8", "surrogatepass")


def _pos(c: Chooser, data: bytes) -> int:
    return c.int(0, len(data))


def truncate(c: Chooser, data: bytes) -> bytes:
    return data[:_pos(c, data)]


def flip(c: Chooser, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(c.int(1, 8)):
        if out:
            out[c.int(0, len(out) - 1)] = c.int(0, 255)
    return bytes(out)


def insert(c: Chooser, data: bytes) -> bytes:
    at = _pos(c, data)
    return data[:at] + pick(c, INSERTS) + data[at:]


def delete(c: Chooser, data: bytes) -> bytes:
    at = _pos(c, data)
    return data[:at] + data[at + c.int(1, 4096):]


def repeat(c: Chooser, data: bytes) -> bytes:
    at = _pos(c, data)
    end = min(len(data), at + c.int(1, 20_000))
    return data[:end] + data[at:end] * c.int(1, 5) + data[end:]


def encoding(c: Chooser, data: bytes) -> bytes:
    text = data.decode("utf-8", "replace")
    how = c.int(0, 5)
    if how == 0:
        return text.encode(pick(c, ["utf-16", "utf-16-le", "utf-32"]), "replace")
    if how == 1:
        return text.encode("latin-1", "replace")
    if how == 2:
        return b"\xef\xbb\xbf" + data
    if how == 3:
        return text.replace("aten", "at\xe9n").encode("latin-1", "replace")
    at = _pos(c, data)
    return data[:at] + pick(c, [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]) \
        + data[at:]


def garbage(c: Chooser, data: bytes) -> bytes:
    junk = pick(c, [b"x", b"\0" * 100, b" \n", b"{}", b"]", b"\x1f\x8b\x08", b'{"a": 1}'])
    return junk + data if c.coin() else data + junk


BYTE_MUTATIONS: list[Callable[[Chooser, bytes], bytes]] = [
    truncate, flip, insert, delete, repeat, encoding, garbage]


def compress(c: Chooser, data: bytes) -> bytes:
    how = c.int(0, 5)
    if how == 0 and len(data) > 2:  # several members
        at = c.int(1, len(data) - 1)
        return gzip.compress(data[:at], 1) + gzip.compress(data[at:], 1)
    packed = gzip.compress(data, c.int(1, 9))
    if how == 1:
        return packed[:_pos(c, packed)]
    if how == 2:
        return flip(c, packed)
    if how == 3:
        return packed + pick(c, [b"\0" * 10, b"junk", gzip.compress(b"{}")])
    if how == 4:
        return gzip.compress(packed)
    return packed


@dataclass
class Case:
    seed: str  # the shared trace it came from
    mutations: list[str]
    data: bytes
    gz: bool


def make_case(c: Chooser, seeds: list[tuple[str, dict[str, Any]]]) -> Case:
    """One mutated trace, every choice drawn from ``c``."""
    name, original = pick(c, seeds)
    doc = json.loads(json.dumps(original))  # a copy
    raw: list[str] = []
    done = []
    for _ in range(c.int(0, 3)):
        mutation = pick(c, DOC_MUTATIONS)
        mutation(c, doc, raw)
        done.append(mutation.__name__)
    data = serialize(c, doc, raw)
    for _ in range(pick(c, [0, 0, 0, 0, 1, 2])):
        mutation = pick(c, BYTE_MUTATIONS)
        data = mutation(c, data)
        done.append(mutation.__name__)
    gz = c.int(0, 3) == 0
    if gz:
        data = compress(c, data)
        done.append("gzip")
    return Case(name, done, data, gz)


def write_case(case: Case, directory: Path, stem: str = "case") -> Path:
    path = directory / f"{stem}.json{'.gz' if case.gz else ''}"
    path.write_bytes(case.data)
    return path


# ---------------------------------------------------------------------------- the oracle


@dataclass
class Verdict:
    outcome: str  # "ok" (a diagnosis), "error" (one line), "crash", "mismatch"
    detail: str  # the error line, the traceback, or the disagreement


@contextlib.contextmanager
def _blocks(block_bytes: int, piece_bytes: int) -> Iterator[None]:
    """Loads in smaller blocks and pieces (module constants, restored after)."""
    from torchtriage.trace import ingest, parallel

    saved = ingest.BLOCK_BYTES, parallel.PIECE_BYTES
    ingest.BLOCK_BYTES, parallel.PIECE_BYTES = block_bytes, piece_bytes
    try:
        yield
    finally:
        ingest.BLOCK_BYTES, parallel.PIECE_BYTES = saved


def _load(path: Path, workers: int) -> tuple[str, str]:
    from torchtriage.errors import TorchtriageError
    from torchtriage.trace import load_trace

    try:
        trace = load_trace(path, workers=workers)
    except TorchtriageError as exc:
        return "error", str(exc)
    ev, mem = trace.events, trace.memory
    digest = hashlib.sha1()
    for column in (ev.kind, ev.name_id, ev.ts, ev.dur, ev.external_id, ev.correlation,
                   ev.stream, mem.total_allocated):
        digest.update(column.tobytes())
    digest.update(repr((ev.names, ev.threads, trace.meta.rank, trace.meta.devices)).encode())
    return "ok", f"{len(ev)} events {digest.hexdigest()[:12]}"


def judge(path: Path, block_bytes: int = 4096, compare: bool = True,
          two_processes: bool = True) -> Verdict:
    """What torchtriage does with ``path``: a diagnosis or a one-line error, and the same
    load in 4 MB blocks, in ``block_bytes`` blocks and (``two_processes``) in two
    processes."""
    from torchtriage.api import analyze, render_text
    from torchtriage.errors import TorchtriageError

    try:
        for diagnosis in analyze(path, workers=1):
            render_text(diagnosis)
            diagnosis.to_json()
        verdict = Verdict("ok", "")
    except TorchtriageError as exc:
        message = str(exc)
        if "\n" in message or not message:
            return Verdict("crash", f"a TorchtriageError of {message.count(chr(10)) + 1} "
                                    f"lines: {message[:300]!r}")
        verdict = Verdict("error", message)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return Verdict("crash", "".join(traceback.format_exception(exc))[-3000:])
    if compare:
        try:
            results = [_load(path, 1)]
            with _blocks(block_bytes, block_bytes):
                results += [_load(path, 1), *([_load(path, 2)] if two_processes else [])]
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            return Verdict("crash", "".join(traceback.format_exception(exc))[-3000:])
        kinds = {kind for kind, _ in results}
        oks = {detail for kind, detail in results if kind == "ok"}
        if len(kinds) > 1 or len(oks) > 1:
            return Verdict("mismatch", " | ".join(f"{k}: {d[:200]}" for k, d in results))
    return verdict
