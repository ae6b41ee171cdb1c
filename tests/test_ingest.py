"""Trace ingest: format variations are accepted, bad input is one clear TraceError."""

from __future__ import annotations

import gzip
import json

import msgspec
import numpy as np
import pytest
from conftest import write_trace, x
from hypothesis import given, settings
from hypothesis import strategies as st

from torchtriage.errors import TraceError
from torchtriage.trace import EventKind, find_trace_files, load_trace
from torchtriage.trace.stream import SYNC, EventChunks, Piece


def test_columns_hold_events_and_interned_names(tmp_path):
    events = [
        x("ProfilerStep#3", 0.0, 100.0, cat="user_annotation"),
        x("aten::mm", 10.5, 20.25, External_id=7),
        x("aten::mm", 40.0, 10.0),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "python"}},
    ]
    t = load_trace(write_trace(tmp_path / "t.json", events))
    ev = t.events
    assert len(ev) == 3
    assert ev.names.count("aten::mm") == 1
    assert list(ev.kind) == [EventKind.USER_ANNOTATION, EventKind.CPU_OP, EventKind.CPU_OP]
    assert ev.ts[1] == pytest.approx(10.5) and ev.dur[1] == pytest.approx(20.25)
    assert list(ev.external_id) == [-1, 7, -1]


def test_accepts_legacy_categories_string_ids_and_int_timestamps(tmp_path):
    events = [
        x("ProfilerStep#1", 1623142623460000, 1000, cat="Operator", pid=25738, tid="25738"),
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm", "pid": 0, "tid": "stream 7",
         "ts": 1623142623460100, "dur": 50,
         "args": {"stream": 7, "correlation": 11, "external id": 3, "device": 0}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 25738, "tid": "25738",
         "ts": 1623142623460050, "dur": 5, "args": {"correlation": 11, "external id": 3}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": 1623142623460000, "dur": 2000},
    ]
    t = load_trace(write_trace(tmp_path / "legacy.json", events))
    assert t.has_device_activity
    kernel = int(np.flatnonzero(t.events.kind == EventKind.KERNEL)[0])
    assert t.events.external_id[kernel] == 3
    assert t.events.stream[kernel] == 7
    assert ("Spans", "PyTorch Profiler") in t.events.threads


def test_string_numbers_in_args_are_normalised(tmp_path):
    # ROCm traces write "stream" as a string.
    ev = {"ph": "X", "cat": "kernel", "name": "Cijk_x", "pid": 0, "tid": 1, "ts": 0, "dur": 1,
          "args": {"stream": "3", "correlation": "bogus"}}
    t = load_trace(write_trace(tmp_path / "amd.json", [ev]))
    assert t.events.stream[0] == 3 and t.events.correlation[0] == -1


def test_memory_events_as_instant_and_complete(tmp_path):
    mem_args = {"Total Allocated": 1000, "Total Reserved": 4096, "Bytes": 1000,
                "Device Type": 1, "Device Id": 0}
    events = [
        x("aten::empty", 0, 1),
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
         "tid": 1, "ts": 0.5, "args": mem_args},
        # Python exporter writes [memory] as a complete event.
        {"ph": "X", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
         "ts": 0.7, "dur": 0, "args": {**mem_args, "Total Allocated": 3000}},
    ]
    t = load_trace(write_trace(tmp_path / "m.json", events))
    assert len(t.events) == 1
    assert list(t.memory.total_allocated) == [1000, 3000]
    assert list(t.memory.device_type) == [1, 1]


def test_gzip_and_metadata(tmp_path):
    p = write_trace(tmp_path / "t.pt.trace.json.gz", [x("a", 0, 1)], gz=True,
                    deviceProperties=[{"id": 0, "name": "H200", "totalGlobalMem": 150 * 2**30,
                                       "computeMajor": 9, "computeMinor": 0}],
                    distributedInfo={"backend": "nccl", "rank": 3, "world_size": 8})
    t = load_trace(p)
    assert t.meta.devices[0].name == "H200" and t.meta.devices[0].compute_major == 9
    assert (t.meta.rank, t.meta.world_size) == (3, 8)


def test_input_dims_kept_raw(tmp_path):
    ev = x("aten::mm", 0, 1)
    ev["args"] = {"Input Dims": [[8, 64], [64, 64]], "Input type": ["float", "float"]}
    t = load_trace(write_trace(tmp_path / "s.json", [ev]))
    assert json.loads(t.events.input_dims(0)) == [[8, 64], [64, 64]]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"this is not json", "not valid JSON"),
        (b"", "empty file"),
        (b'{"schemaVersion": 1}', "without 'traceEvents'"),
        (b'{"traceEvents": []}', "empty trace"),
        (b"[[1, 2], [3, 4]]", "top level is not a JSON object"),
        (b'{"schema": "1.0.3", "nodes": [{"id": 1}]}', "execution trace"),
        (b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "not a Kineto trace"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}, {"ph": "X", "ts"', "truncated trace"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}]] }', "not valid JSON"),
    ],
)
def test_bad_files_raise_one_line_trace_error(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps({"traceEvents": [x("a", 0, 1)] * 500}).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        load_trace(p)


def test_multi_member_gzip(tmp_path):
    text = json.dumps({"traceEvents": [x("a", 0, 1), x("b", 2, 1)]}).encode()
    p = tmp_path / "two.json.gz"
    p.write_bytes(gzip.compress(text[:20]) + gzip.compress(text[20:]))
    assert load_trace(p).events.names == ["a", "b"]


_TEXT = st.text(alphabet='ab{}[]",:\\ \n\u00e9<>', max_size=12) | st.just('"}, {"x": [')


@settings(max_examples=150, deadline=None)
@given(names=st.lists(_TEXT, min_size=1, max_size=30), block=st.integers(1, 97),
       before=st.booleans(), nested=st.booleans(), pretty=st.booleans())
def test_streamed_chunks_are_exactly_the_events(tmp_path_factory, names, block, before, nested,
                                                pretty):
    """Cut at any block size, with brackets, quotes and backslashes in strings, other arrays
    before the events and nested objects inside them: the chunks decode to the events, in
    order, and what is outside the array survives."""
    events = [{"ph": "X", "name": n, "ts": i, "dur": 1,
               "args": {"Input Dims": [[1, 2], []], "objs": [{"a": n}, {"b": 1}],
                        "note": {"k": [n]}} if nested else {}}
              for i, n in enumerate(names)]
    doc = {"deviceProperties": [{"id": 0, "name": "[gpu]"}]} if before else {}
    doc.update(traceEvents=events, baseTimeNanoseconds=7, tail=["}]"])
    path = tmp_path_factory.mktemp("s") / "t.json"
    path.write_text(json.dumps(doc, indent=2 if pretty else None))
    chunks = EventChunks(path, msgspec.json.decode, block_bytes=block)
    seen = [e for chunk in chunks for e in chunk]
    assert seen == events
    outside = json.loads(chunks.outside)
    assert outside == {**doc, "traceEvents": []}
    assert chunks.raw_bytes == path.stat().st_size


def test_a_trace_larger_than_the_memory_limit_is_refused(tmp_path, monkeypatch):
    path = write_trace(tmp_path / "big.json", [x(f"op{i}", i, 1) for i in range(20000)])
    assert len(load_trace(path).events) == 20000
    monkeypatch.setenv("TORCHTRIAGE_MEMORY_LIMIT", "64KiB")
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert "too large for the memory limit" in str(err.value)
    assert "64.0 KiB (TORCHTRIAGE_MEMORY_LIMIT)" in str(err.value)
    monkeypatch.setenv("TORCHTRIAGE_MEMORY_LIMIT", "lots")
    with pytest.raises(TraceError, match="not a size"):
        load_trace(path)


def test_find_trace_files(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        find_trace_files(tmp_path / "missing")
    with pytest.raises(TraceError, match="holds no trace files"):
        find_trace_files(tmp_path)
    write_trace(tmp_path / "b.pt.trace.json.gz", [x("a", 0, 1)], gz=True)
    write_trace(tmp_path / "a.json", [x("a", 0, 1)])
    (tmp_path / "diagnosis.json").write_text("{}")
    (tmp_path / "run.rank1.json").write_text("{}")
    assert [p.name for p in find_trace_files(tmp_path)] == ["a.json", "b.pt.trace.json.gz"]
    nested = tmp_path / "run"
    (nested / "traces").mkdir(parents=True)
    write_trace(nested / "traces" / "r0.json", [x("a", 0, 1)])
    assert [p.name for p in find_trace_files(nested)] == ["r0.json"]


def _pieces_decoded(chunks: EventChunks) -> list:
    """What a parallel load does with EventChunks.pieces(): decode each piece (elsewhere),
    and on the first that does not decode, hand it and the later ones back."""
    out, pending = [], []
    for item in chunks.pieces():
        if item is SYNC or isinstance(item, Piece):
            if isinstance(item, Piece):
                pending.append(item)
            if item is SYNC or len(pending) >= 3:
                for i, piece in enumerate(pending):
                    try:
                        out.extend(msgspec.json.decode(b"[" + piece.text.lstrip(b" \n,") + b"]"))
                    except msgspec.DecodeError:
                        chunks.rewind(pending[i:])
                        break
                pending = []
        else:  # checked and decoded by the stream itself, after a rewind
            out.extend(item)
    return out


@settings(max_examples=100, deadline=None)
@given(names=st.lists(_TEXT, min_size=1, max_size=30), block=st.integers(1, 97),
       nested=st.booleans(), pretty=st.booleans())
def test_pieces_for_another_decoder_are_exactly_the_events(tmp_path_factory, names, block,
                                                           nested, pretty):
    """Pieces cut without decoding (for the parallel load): whatever the strings hold, the
    pieces that decode plus what the stream decodes after a rewind are the events, in order."""
    events = [{"ph": "X", "name": n, "ts": i, "dur": 1,
               "args": {"objs": [{"a": n}, {"b": 1}]} if nested else {}}
              for i, n in enumerate(names)]
    doc = {"traceEvents": events, "baseTimeNanoseconds": 7, "tail": ["}, {"]}
    path = tmp_path_factory.mktemp("p") / "t.json"
    path.write_text(json.dumps(doc, indent=2 if pretty else None))
    chunks = EventChunks(path, msgspec.json.decode, block_bytes=block)
    assert _pieces_decoded(chunks) == events
    assert json.loads(chunks.outside) == {**doc, "traceEvents": []}


def _tricky_trace(path, n: int = 3000, gz: bool = False):
    """Events whose strings hold '}, {' (wrong cuts), shapes, collectives, memory events and
    string thread ids: every column and id table a parallel load has to merge."""
    events = []
    for i in range(n):
        name = f'op{i % 37}"}}, {{"x": [' if i % 11 == 0 else f"aten::op{i % 53}"
        events.append(x(name, i * 10, 5, pid=1 + i % 2, tid="stream 7" if i % 5 else 3,
                        Input_Dims=[[i % 4, 2]], External_id=i))
        if i % 97 == 0:
            events.append(x(f"gloo:all_reduce{i % 3}", i * 10, 2, cat="cpu_op"))
            events.append(x("ncclKernel_AllReduce", i * 10, 3, cat="kernel",
                            Collective_name="allreduce", In_msg_nelems=i, dtype="Float"))
        if i % 13 == 0:
            events.append({"ph": "i", "name": "[memory]", "ts": i * 10, "pid": 1, "tid": 1,
                           "args": {"Total Allocated": i, "Bytes": 8, "Device Type": 1}})
    return write_trace(path, events, gz=gz)


def _tables(path, parallel: bool):
    from torchtriage.trace.columns import TableBuilder, decode_chunk
    from torchtriage.trace.parallel import decode_in_two

    chunks = EventChunks(path, decode_chunk, block_bytes=20_000)
    builder = TableBuilder()
    if parallel:
        decode_in_two(chunks, builder.add)
    else:
        for chunk in chunks:
            builder.add(chunk)
    events, memory = builder.finish()
    return ([getattr(events, c).tolist() for c in ("kind", "name_id", "thread_id", "ts", "dur",
                                                   "external_id", "correlation", "stream",
                                                   "device", "nbytes", "shape_offset",
                                                   "shape_length")],
            events.names, events.threads, events.labels, events.collectives,
            events.shapes_blob, memory.total_allocated.tolist())


@pytest.mark.parametrize("gz", [False, True])
def test_a_parallel_load_gives_exactly_the_sequential_tables(tmp_path, gz):
    path = _tricky_trace(tmp_path / ("t.json.gz" if gz else "t.json"), gz=gz)
    sequential = _tables(path, parallel=False)
    assert _tables(path, parallel=True) == sequential
    columns, names, _, _, collectives, _, allocated = sequential
    assert len(columns[0]) > 3000 and collectives and len(allocated) > 200
    assert load_trace(path, workers=2).events.names == names


def test_pieces_too_large_for_the_helpers_slots_are_decoded_here(tmp_path, monkeypatch):
    from torchtriage.trace import parallel

    path = _tricky_trace(tmp_path / "t.json", n=6000)
    sequential = _tables(path, parallel=False)
    monkeypatch.setattr(parallel, "SLOT_BYTES", 24_000)  # some 20-40 KB pieces fit, some not
    handed = []
    give = parallel._Helper.give
    monkeypatch.setattr(parallel._Helper, "give",
                        lambda self, i, piece, ahead=2: handed.append(give(self, i, piece, ahead))
                        or handed[-1])
    assert _tables(path, parallel=True) == sequential
    assert True in handed and False in handed


def test_the_helper_is_kept_one_piece_ahead_in_the_files_last_pieces(tmp_path, monkeypatch):
    """Two pieces ahead while the file lasts, one in its last two pieces' worth: the last
    pieces are shared out instead of this process waiting on the helper's two."""
    from torchtriage.trace import parallel

    path = _tricky_trace(tmp_path / "t.json", n=6000)
    monkeypatch.setattr(parallel, "PIECE_BYTES", 20_000)  # (the pieces of _tables)
    aheads = []
    give = parallel._Helper.give
    monkeypatch.setattr(parallel._Helper, "give",
                        lambda self, i, piece, ahead=2: aheads.append(ahead)
                        or give(self, i, piece, ahead))
    assert _tables(path, parallel=True) == _tables(path, parallel=False)
    assert aheads[:10] == [2] * 10 and aheads[-1] == 1 and 1 <= aheads.count(1) <= 4


def test_a_helper_that_dies_mid_load_leaves_its_pieces_to_this_process(tmp_path, monkeypatch):
    import multiprocessing
    import os

    from torchtriage.trace import parallel

    path = _tricky_trace(tmp_path / "t.json", n=6000)
    sequential = _tables(path, parallel=False)
    decode_slots = parallel._decode_slots

    def dies_after_a_few(slots, orders, answers, parent_ends):
        class Few:  # three orders, then the helper is gone (as if killed)
            left = 3

            def recv_bytes(self):
                Few.left -= 1
                if Few.left < 0:
                    os._exit(1)
                return orders.recv_bytes()
        decode_slots(slots, Few(), answers, parent_ends)

    monkeypatch.setattr(parallel, "_decode_slots", dies_after_a_few)
    assert _tables(path, parallel=True) == sequential
    assert multiprocessing.active_children() == []


def test_a_corrupt_chunk_in_a_parallel_load_names_its_byte_offset(tmp_path):
    path = _tricky_trace(tmp_path / "t.json", n=20000)
    text = path.read_bytes()
    at = text.index(b'"name": "aten::op7"', len(text) // 2)
    path.write_bytes(text[:at] + b"#" + text[at + 1:])  # a quote turned into junk
    with pytest.raises(TraceError) as err:
        load_trace(path, workers=2)
    message = str(err.value)
    assert "\n" not in message and "not valid JSON at byte" in message
    assert f"at byte {at:,} (" in message, message


def test_an_interrupted_parallel_load_leaves_no_process_and_no_file(tmp_path, monkeypatch):
    import multiprocessing
    import tempfile

    from torchtriage.trace import columns

    path = _tricky_trace(tmp_path / "t.json", n=20000)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def interrupted(self, chunk):  # Ctrl-C while the decoder is running
        raise KeyboardInterrupt

    monkeypatch.setattr(columns.TableBuilder, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_trace(path, workers=2)
    assert multiprocessing.active_children() == []
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == \
        ["t.json", "tmp"]


def test_a_parallel_load_over_the_memory_limit_is_refused_in_one_line(tmp_path, monkeypatch):
    import multiprocessing

    path = _tricky_trace(tmp_path / "t.json", n=20000)
    monkeypatch.setenv("TORCHTRIAGE_MEMORY_LIMIT", "64KiB")
    with pytest.raises(TraceError) as err:
        load_trace(path, workers=2)
    assert "too large for the memory limit" in str(err.value) and "\n" not in str(err.value)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("odd", [None, {"ph": "Q", "name": "new phase"}, {"name": "no phase"}])
def test_every_phase_loads_and_only_complete_events_become_rows(tmp_path, odd):
    """Metadata, flows, counters and instants are decoded (by phase) and skipped; [memory]
    instants are kept; an unknown phase or none takes the lenient path to the same tables."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        x("ProfilerStep#1", 0, 100, cat="user_annotation"), x("aten::mm", 10, 50),
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 10, "cat": "ac2g", "name": "flow"},
        {"ph": "f", "id": 1, "pid": 1, "tid": 2, "ts": 60, "cat": "ac2g", "bp": "e"},
        {"ph": "C", "name": "util", "pid": 1, "ts": 5, "args": {"value": 3}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 20, "s": "t",
         "args": {"Total Allocated": 512, "Bytes": 512, "Device Type": 0}},
        {"ph": "I", "name": "marker", "pid": 1, "tid": 1, "ts": 30},
        *([odd] if odd else []),
    ]
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    assert trace.events.names == ["ProfilerStep#1", "aten::mm"]
    assert trace.memory.total_allocated.tolist() == [512]


def test_two_decoders_only_for_a_large_trace_on_a_free_second_core(tmp_path, monkeypatch):
    import os

    from torchtriage.trace import parallel

    small = write_trace(tmp_path / "small.json", [x("a", 0, 1)])
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(parallel.PARALLEL_MIN_BYTES)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.3, 0.3))
    monkeypatch.setattr(parallel, "_runnable_now", lambda: 1)  # this process alone
    assert (parallel.decoders(small, None), parallel.decoders(big, None)) == (1, 2)
    assert parallel.decoders(small, 2) == 2 and parallel.decoders(big, 1) == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (2.2, 2.0, 1.0))  # the cores were taken...
    assert parallel.decoders(big, None) == 2  # ...and are free now: a training run ended
    monkeypatch.setattr(parallel, "_runnable_now", lambda: 3)  # and taken now
    assert parallel.decoders(big, None) == 1
    monkeypatch.setattr(parallel, "_runnable_now", lambda: None)  # (no /proc: the average)
    assert parallel.decoders(big, None) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(parallel, "_runnable_now", lambda: 1)
    assert parallel.decoders(big, None) == 1  # one core for this process


@pytest.mark.parametrize("workers", [1, 2])
def test_a_corrupt_byte_in_a_large_gzip_trace_is_named_at_once(tmp_path, workers):
    """A broken quote turns every later string inside out: the load names the byte (in one
    process or two) instead of reading the rest of the file as one unfinished event."""
    text = json.dumps({"traceEvents": [x(f"aten::op{i % 50}", i, 1, External_id=i)
                                       for i in range(80000)]}).encode()
    at = text.index(b'"name"', len(text) // 2)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text[:at] + b"#" + text[at + 1:], 1))
    with pytest.raises(TraceError) as err:
        load_trace(path, workers=workers)
    assert f"not valid JSON at byte {at:,} of the uncompressed trace (" in str(err.value)


def test_the_strict_path_builds_the_lenient_paths_columns_for_the_rare_events():
    """The strict path's columns come from passes over whole lists (and skip the rare fields
    when no event has them); the lenient path goes event by event. On a chunk of the rare
    cases (a complete event named [memory] among [memory] instants, one without a ts, one
    without a dur, the older exporters' "external id", shapes, a collective, an "I" instant)
    both give the same columns."""
    import msgspec

    from torchtriage.trace import columns

    def memory(ph, ts, allocated):
        return {"ph": ph, "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Total Allocated": allocated, "Bytes": 8, "Device Type": 1}}

    events = [
        x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        memory("i", 5, 100),
        {**x("aten::mm", 10, 50), "args": {"external id": 7, "Input Dims": [[2, 3], [3, 4]],
                                           "Input type": ["float", "float"]}},
        memory("X", 12, 200),  # (a complete event named so is a memory row, not an event)
        {"ph": "X", "name": "no ts", "pid": 1, "tid": 1, "dur": 3, "cat": "cpu_op"},
        {"ph": "X", "name": "no dur", "pid": 1, "tid": 2, "ts": 20, "cat": "kernel"},
        memory("I", 25, 300),
        x("ncclKernel_AllReduce", 30, 5, cat="kernel", Collective_name="allreduce",
          In_msg_nelems=8, dtype="Float"),
        {"ph": "f", "id": 1, "pid": 1, "tid": 2, "ts": 60, "cat": "ac2g", "bp": "e"},
    ]
    text = msgspec.json.encode(events)
    strict = columns._strict_columns(columns._STRICT_EVENTS.decode(text))
    lenient = columns._lenient_columns(columns._lenient_events(text))
    assert msgspec.msgpack.encode(strict) == msgspec.msgpack.encode(lenient)
    assert strict.rows == 4 and strict.no_ts == 1 and strict.collectives
    columns = np.frombuffer(strict.memory, np.float64).reshape(6, -1)  # column after column
    assert columns[1].tolist() == [100, 200, 300]  # in file order


def test_absurd_memory_values_load_without_a_warning(tmp_path):
    """A [memory] event whose numbers do not fit their columns (a device type of 10**22)
    loads, and prints nothing on the user's terminal (numpy warns of such casts)."""
    import warnings

    events = [x("aten::mm", 0, 5),
              {"ph": "i", "name": "[memory]", "ts": 2, "pid": 1, "tid": 1,
               "args": {"Total Allocated": 5, "Device Type": 10**22, "Device Id": 10**20}}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = load_trace(write_trace(tmp_path / "t.json", events))
    assert trace.memory.total_allocated.tolist() == [5]
