"""Hostile trace files (issue 18, items 3 and 4): the stream is linear in its input, fails at
once on bytes no JSON holds, and holds no more than the memory limit allows from the first
byte; what the ingest fuzzer found besides (deep nesting, entries that are not events)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from conftest import write_trace, x

import torchtriage
from torchtriage.errors import TraceError
from torchtriage.trace import load_trace
from torchtriage.trace.stream import EventChunks

BLOCK = 64 * 1024
HEADER = b'{"schemaVersion": 1, "traceEvents": ['
EVENT = json.dumps(x("aten::mm", 1, 2)).encode()

# Stretches of the events array with no event's end in them, as (head, filler): an unclosed
# string (as a crashed writer leaves, or one huge name), the same with "}, {" in it (a likely
# cut in every block, each one wrong), and brackets that only open.
STRETCHES = {
    "unclosed string": (HEADER + EVENT + b', {"name": "', b"a"),
    "likely cuts in a string": (HEADER + b'{"name": "', b"x}, {y"),
    "only opening": (HEADER + b'{"args": ', b"[{"),
}


def _stretch(path, name: str, size: int):
    head, filler = STRETCHES[name]
    path.write_bytes(head + filler * (size // len(filler)))
    return path


def _work(monkeypatch, path) -> tuple[int, int, BaseException | None]:
    """(bytes the structure scan looked at, bytes decoded, the error) for a load of ``path``
    in 64 KiB blocks."""
    from torchtriage.trace import scan, stream

    seen = [0, 0]
    structure = scan.structure

    def counted_structure(data, start, *state):
        seen[0] += len(data) - start
        return structure(data, start, *state)

    def counted_decode(text):
        seen[1] += len(text)
        return msgspec.json.decode(text)

    monkeypatch.setattr(stream, "structure", counted_structure)
    error = None
    try:
        for _ in EventChunks(path, counted_decode, block_bytes=BLOCK):
            pass
    except TraceError as exc:
        error = exc
    return seen[0], seen[1], error


@pytest.mark.parametrize("name", list(STRETCHES))
def test_a_stretch_without_an_event_end_is_scanned_once(tmp_path, monkeypatch, name):
    """Before: every block rescanned (and retried) the whole stretch so far, quadratic in its
    length (1.6 s at 32 MB, 55.7 s at 256 MB, past 300 s at 1 GB)."""
    path = _stretch(tmp_path / "t.json", name, 4 * 2**20)
    scanned, decoded, error = _work(monkeypatch, path)
    size = path.stat().st_size
    assert error is not None and "truncated trace" in str(error)
    assert scanned + decoded < 3 * size, (scanned / size, decoded / size)


@pytest.mark.timing
def test_a_stretch_without_an_event_end_takes_time_linear_in_its_length(tmp_path):
    """Four times the bytes take about four times as long (sixteen before)."""
    times = []
    for size in (2 * 2**20, 8 * 2**20):
        path = _stretch(tmp_path / f"{size}.json", "likely cuts in a string", size)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            with pytest.raises(TraceError, match="truncated trace"):
                for _ in EventChunks(path, msgspec.json.decode, block_bytes=BLOCK):
                    pass
            best = min(best, time.perf_counter() - start)
        times.append(best)
    assert times[1] / times[0] < 8, times


def test_nul_bytes_a_crashed_writer_leaves_are_named_at_once(tmp_path):
    """A valid start, an unfinished event and NULs: the first NUL is named (before: "truncated
    trace" after reading the whole file, 67 s for 256 MB)."""
    head = HEADER + b", ".join([EVENT] * 200) + b', {"ph": "X", "na'
    path = tmp_path / "crashed.json"
    path.write_bytes(head + b"\0" * (8 * 2**20))
    chunks = EventChunks(path, msgspec.json.decode, block_bytes=BLOCK)
    with pytest.raises(TraceError) as err:
        for _ in chunks:
            pass
    assert f"not valid JSON at byte {len(head):,} (a NUL byte" in str(err.value)
    assert chunks.raw_bytes <= len(head) + 2 * BLOCK
    with pytest.raises(TraceError, match=f"at byte {len(head):,} .a NUL byte"):
        load_trace(path)


@pytest.mark.parametrize(("content", "at", "what"), [
    (HEADER + b"#" + b"x" * 2**20, len(HEADER), "'#' (0x23), where an event should begin"),
    (HEADER + EVENT + b", " + b"\x01" * 2**20, len(HEADER + EVENT) + 2, "control character 0x01"),
    (b"\0" * 2**20, 0, "a NUL byte, where the document should begin"),
    (b"  \xff\xfe{", 2, "byte 0xff, where the document should begin"),
    (HEADER + EVENT + b"}]}", len(HEADER + EVENT), "'}' (0x7d), closes what was not opened"),
    (HEADER + EVENT + b"]} x", len(HEADER + EVENT) + 3, "'x' (0x78), after the end of the doc"),
    (b'{"a": 1} ' + HEADER + EVENT + b"]}", 9, "'{' (0x7b), after the end of the document"),
], ids=["junk event", "control", "zeros", "utf-16", "unopened", "trailing", "two documents"])
def test_bytes_no_json_holds_there_are_named_at_their_byte(tmp_path, content, at, what):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert f"not valid JSON at byte {at:,} ({what}" in message and "\n" not in message


def test_a_top_level_that_is_not_an_object_is_said_at_once(tmp_path):
    for content in (b"[" * 2**20, b' "a string"', b"12", b"null"):
        path = tmp_path / "top.json"
        path.write_bytes(content)
        with pytest.raises(TraceError, match="top level is not a JSON object"):
            load_trace(path)


def test_what_is_held_outside_the_events_is_bounded_by_the_limit(tmp_path):
    """Before: everything before the events array was kept, whatever its size (a 1 GB file of
    zeros took 2.1 GB)."""
    path = tmp_path / "meta.json"
    path.write_bytes(b'{"meta": "' + b"a" * (4 * 2**20) + b'", "traceEvents": []}')
    limit = 2**20
    chunks = EventChunks(path, msgspec.json.decode, block_bytes=BLOCK, memory_limit=limit,
                         limit_label="1.0 MiB (test)")
    with pytest.raises(TraceError) as err:
        for _ in chunks:
            pass
    assert "too large for the memory limit" in str(err.value) and "1.0 MiB (test)" in str(
        err.value)
    assert chunks.raw_bytes <= limit // 64 + 2 * BLOCK


def test_an_unfinished_event_is_bounded_by_the_limit_and_whitespace_is_not_held(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTRIAGE_MEMORY_LIMIT", "1MiB")
    path = _stretch(tmp_path / "t.json", "unclosed string", 8 * 2**20)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert "too large for the memory limit: more than" in str(err.value)
    assert "in one event (or a stretch without an event's end) at byte" in str(err.value)
    spaces = tmp_path / "spaces.json"  # 8 MB of whitespace between events: fine, not held
    later = json.dumps(x("aten::mm", 5, 2)).encode()  # (an exact duplicate would be dropped)
    spaces.write_bytes(HEADER + EVENT + b"," + b" \n" * (4 * 2**20) + later + b"]}")
    assert len(load_trace(spaces).events) == 2


def _bomb(path, head: bytes, filler: bytes, inflated: int):
    """A gzip file of ``head`` then ``filler`` repeated to ``inflated`` bytes: one compressed
    64 MiB member, repeated (a few MB on disk)."""
    member = gzip.compress(filler * (64 * 2**20 // len(filler)), 1)
    with path.open("wb") as f:
        f.write(gzip.compress(head))
        for _ in range(inflated // (64 * 2**20)):
            f.write(member)
    return path


def _analyze_in_a_child(path, limit: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """``torchtriage analyze path`` under a memory limit: the result, its peak RSS in bytes
    and its seconds; a minute at most (before the fix these ran for minutes, in GBs)."""
    src = Path(torchtriage.__file__).parents[1]  # the torchtriage under test
    env = {**os.environ, "TORCHTRIAGE_MEMORY_LIMIT": limit,
           "PYTHONPATH": str(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "p = subprocess.run([sys.executable, '-m', 'torchtriage', 'analyze', sys.argv[1]], "
            "capture_output=True, text=True); "
            "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
            "time.perf_counter() - t); print(p.stderr.strip())")
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env, timeout=60,
                          capture_output=True, text=True)
    first, _, message = done.stdout.partition("\n")
    rc, rss_kb, seconds = first.split()
    return (subprocess.CompletedProcess(done.args, int(rc), "", message.strip()),
            int(rss_kb) * 1024, float(seconds))


@pytest.mark.parametrize(("head", "filler", "expected"), [
    (b"", b"\0", "(a NUL byte, where the document should begin"),
    (HEADER + b'{"name": "', b"a", "too large for the memory limit"),
], ids=["zeros", "unfinished string"])
def test_a_gzip_bomb_stays_under_the_memory_limit(tmp_path, head, filler, expected):
    """3 GB of zeros (before: 6.36 GB of memory under a 512 MiB limit) or of one unfinished
    string, from a few MB of gzip: one line, exit 2, the process's peak under the limit."""
    path = _bomb(tmp_path / "bomb.json.gz", head, filler, 3 * 2**30)
    assert path.stat().st_size < 20 * 2**20
    done, peak_bytes, _ = _analyze_in_a_child(path, "512MiB")
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr and done.stderr.count("\n") == 0
    assert peak_bytes < 512 * 2**20, peak_bytes / 2**20


def test_json_nested_deeper_than_the_decoder_goes_is_one_line(tmp_path):
    """Before: an internal RecursionError (exit 3), inside an event or outside the events."""
    deep = b"[" * 5000 + b"]" * 5000
    inside = tmp_path / "inside.json"
    head = HEADER + b'{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"x": '
    inside.write_bytes(head + deep + b"}}]}")
    with pytest.raises(TraceError, match=f"nested 5004 levels deep at byte {len(head) + 4999:,}"):
        load_trace(inside)
    inside.write_bytes(head + deep[:5000] + b"\x01" + deep[5000:] + b"}}]}")  # (fuzzer: and a
    with pytest.raises(TraceError, match=f"at byte {len(head) + 5000:,} .control character"):
        load_trace(inside)  # control character after it was an internal ValueError)
    outside = tmp_path / "outside.json"
    outside.write_bytes(b'{"distributedInfo": {"x": ' + deep + b"}, " + HEADER[1:] + EVENT
                        + b"]}")
    with pytest.raises(TraceError, match="outside traceEvents nested deeper than"):
        load_trace(outside)


def test_an_entry_of_trace_events_that_is_not_an_event_is_said_so(tmp_path):
    """Before: "top level is not a JSON object" for a number among the events (issue 18,
    item 11), and entries after the last event before "]" were dropped unread."""
    for tail in (b", 1, 2]}", b", 1]}", b", [x]]}"):
        path = tmp_path / "t.json"
        path.write_bytes(HEADER + EVENT + tail)
        with pytest.raises(TraceError) as err:
            load_trace(path)
        assert "traceEvents holds an entry" in str(err.value) or "not valid JSON" in str(err.value)
        assert "top level" not in str(err.value)


def test_a_utf8_byte_order_mark_is_read_past(tmp_path):
    path = write_trace(tmp_path / "t.json", [x("a", 0, 1)])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert load_trace(path).events.names == ["a"]


def test_a_file_of_zeros_is_refused_after_one_block(tmp_path):
    """64 MB of zeros: the error at byte 0 after the first block (before: the whole file was
    read and held, twice, before the decoder said "byte 0")."""
    path = tmp_path / "zeros.json"
    with path.open("wb") as f:
        f.truncate(64 * 2**20)
    chunks = EventChunks(path, msgspec.json.decode)
    with pytest.raises(TraceError, match=r"at byte 0 .a NUL byte"):
        for _ in chunks:
            pass
    assert chunks.raw_bytes <= 4 * 2**20 + 2


def test_two_decoders_asked_for_in_a_daemonic_process_fall_back_to_one(tmp_path):
    """Found by the fuzzer: ``load_trace(path, workers=2)`` in a daemonic process (a
    multiprocessing pool's worker) was an internal AssertionError (it may not fork)."""
    import multiprocessing

    path = write_trace(tmp_path / "t.json", [x("a", 0, 1), x("b", 2, 1)])
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        assert pool.apply(_names_in_two, (str(path),)) == ["a", "b"]


def _names_in_two(path: str) -> list[str]:
    return load_trace(path, workers=2).events.names


def test_ids_past_int64_are_dropped_not_an_overflow(tmp_path):
    """Found by the fuzzer: an External id of 30 digits was an internal OverflowError."""
    events = [x("a", 0, 1, External_id=123456789012345678901234567890),
              x("b", 2, 1, External_id=7, correlation=-(2**70), stream=float("1e300"))]
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    assert list(trace.events.external_id) == [-1, 7] and trace.events.correlation[1] == -1


def test_where_a_trace_is_cut_does_not_change_what_loads(tmp_path, monkeypatch):
    """Found by the fuzzer: a metadata event with an odd field (its ts an array) failed the
    load when another event in its chunk sent the chunk down the lenient path, and loaded
    when it did not: the same file loaded in 4 MB blocks and failed in 4 KB ones."""
    from torchtriage.trace import ingest

    events = [{"ph": "M", "name": "process_name", "pid": 0, "ts": [1], "args": {"name": "x"}},
              x("a", 0, 1, stream="7"), *[x(f"op{i}", i, 1) for i in range(300)]]
    path = write_trace(tmp_path / "t.json", events)
    whole = load_trace(path)
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 4096)
    assert load_trace(path).events.names == whole.events.names
    assert len(whole.events) == 301 and whole.events.stream[0] == 7
    bad_phase = tmp_path / "phase.json"  # (and one whose phase is not a string)
    bad_phase.write_bytes(HEADER + EVENT + b', {"ph": [1], "ts": "x"}, ' + EVENT + b"]}")
    with pytest.raises(TraceError, match="in an event's ph"):
        load_trace(bad_phase)


def test_a_string_that_is_not_utf8_in_an_unused_event_loads_wherever_the_trace_is_cut(
        tmp_path, monkeypatch):
    """Found by the fuzzer: bytes that are not UTF-8 in a flow event's category loaded when the
    event's chunk took the strict path (which skips a flow's fields) and failed the load when
    another event in the chunk (an id written as a float) sent it down the lenient one. The
    lenient path skips such an event too; in a complete event's name they are still an
    error, on either path."""
    from torchtriage.trace import ingest

    events = [{"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 5, "cat": "@@BAD@@", "bp": "e"},
              x("a", 0, 1, correlation=7.5), *[x(f"op{i}", i, 1) for i in range(300)]]
    path = write_trace(tmp_path / "t.json", events)
    path.write_bytes(path.read_bytes().replace(b"@@BAD@@", b"\xff\xfe"))
    whole = load_trace(path)
    assert len(whole.events) == 301 and whole.events.correlation[0] == 7
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 4096)
    assert load_trace(path).events.names == whole.events.names
    named = tmp_path / "named.json"
    named.write_bytes(path.read_bytes().replace(b'"op7"', b'"op\xff"'))
    for block in (4096, 4 * 2**20):
        monkeypatch.setattr(ingest, "BLOCK_BYTES", block)
        with pytest.raises(TraceError, match="Invalid UTF-8"):
            load_trace(named)


def test_a_step_number_past_int64_is_not_a_step(tmp_path):
    """Found by the fuzzer: "ProfilerStep#99999999999999999999999" was an internal
    OverflowError in the step finder; it is not a step number, the other steps are used."""
    from torchtriage.api import analyze

    events = [x("ProfilerStep#99999999999999999999999", 0, 10, cat="user_annotation"),
              *[x(f"ProfilerStep#{i}", 100 * i, 90, cat="user_annotation") for i in (1, 2, 3)],
              *[x("aten::mm", 100 * i + 5, 50) for i in (1, 2, 3)]]
    (diagnosis,) = analyze(write_trace(tmp_path / "t.json", events))
    assert diagnosis.to_json()
