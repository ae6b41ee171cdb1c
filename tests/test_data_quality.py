"""Impossible timings (issue 18, item 7): a real trace with negative durations, a zero-length
ProfilerStep, absurd durations, duplicated events or events without ``ts`` gives the verdict of
the sound trace, a lower confidence, or no verdict; never a confident wrong one. What was
dropped or clamped is counted in ``data_quality`` and shown in the terminal report."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest
from conftest import SHARED_TRACES, write_trace, x

from torchtriage import render_text
from torchtriage.cli import main
from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.diagnosis.traces import diagnose_traces
from torchtriage.errors import TraceError
from torchtriage.trace.ingest import load_trace

RESNET = (SHARED_TRACES / "kineto" / "resnet50_num_workers_0"
          / "worker0.1623143089861.pt.trace.json.gz")


@pytest.fixture(scope="module")
def resnet() -> dict:
    """The real trace as JSON (GPU, 6 ProfilerSteps, data-loading bound)."""
    if not RESNET.is_file():
        pytest.skip(f"shared traces not found at {SHARED_TRACES}")
    return json.loads(gzip.decompress(RESNET.read_bytes()))


def _variant(tmp_path, doc: dict, events: list[dict], name: str = "t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({**doc, "traceEvents": events}))
    return path


def _sound(tmp_path, resnet):
    return diagnose_traces(_variant(tmp_path, resnet, resnet["traceEvents"], "sound.json"))


def _levels(confidence: str) -> int:
    return ("low", "medium", "high").index(confidence)


def test_negative_durations_everywhere_give_no_verdict(tmp_path, resnet, capsys):
    events = [{**e, "dur": -abs(e["dur"])} if "dur" in e else e for e in resnet["traceEvents"]]
    path = _variant(tmp_path, resnet, events)
    assert main(["analyze", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert err.startswith(f"torchtriage: error: {path}: timings unusable: 43,187 of 44,666 "
                          "events (97%) have impossible timings (43,187 events with a negative "
                          "duration (clamped to 0))")
    assert "timing_damage_refuse" in err and "\n" not in err


def test_absurd_durations_on_one_percent_are_dropped_and_lower_the_confidence(tmp_path,
                                                                             resnet):
    rng = random.Random(0)
    events = [{**e, "dur": 1e18} if "dur" in e and rng.random() < 0.01 else e
              for e in resnet["traceEvents"]]
    mutated = sum(e.get("dur") == 1e18 for e in events)
    sound = _sound(tmp_path, resnet)
    d = diagnose_traces(_variant(tmp_path, resnet, events))
    assert sound.primary == "data_loading"
    assert d.primary == sound.primary  # main: "kernel", confidence high (GPU util 93%)
    assert _levels(d.confidence) == _levels(sound.confidence) - 1
    assert [(q.kind, q.count, q.action, q.of) for q in d.data_quality] == [
        ("duration_past_span", mutated, "dropped", 44_666)]
    assert d.gpu.utilization == pytest.approx(sound.gpu.utilization, abs=0.02)
    assert d.findings[0].id == "data.impossible_timings"
    assert d.findings[0].evidence[0].fired


def test_duplicated_events_are_dropped_and_counts_are_not_doubled(tmp_path, resnet):
    sound = _sound(tmp_path, resnet)
    complete = [e for e in resnet["traceEvents"] if e.get("ph") == "X"]
    d = diagnose_traces(_variant(tmp_path, resnet, resnet["traceEvents"] + complete))
    assert d.gpu.transfers.h2d.count == sound.gpu.transfers.h2d.count == 12  # main: 24
    assert d.gpu.transfers.syncs_per_step == sound.gpu.transfers.syncs_per_step
    assert d.trace.events == sound.trace.events
    assert (d.primary, d.confidence) == (sound.primary, sound.confidence)  # lossless
    assert [(q.kind, q.count, q.action) for q in d.data_quality] == [
        ("duplicate", len(complete), "dropped")]


def test_events_without_ts_are_counted_and_too_many_give_no_verdict(tmp_path, resnet):
    rng = random.Random(1)
    few = [{k: v for k, v in e.items() if k != "ts"} if "dur" in e and rng.random() < 0.0005
           else e for e in resnet["traceEvents"]]
    dropped = sum("dur" in e and "ts" not in e for e in few)
    sound = _sound(tmp_path, resnet)
    d = diagnose_traces(_variant(tmp_path, resnet, few))
    assert 0 < dropped < 0.001 * 44_666  # below timing_damage_lower: confidence kept
    assert (d.primary, d.confidence) == (sound.primary, sound.confidence)
    assert [(q.kind, q.count, q.action) for q in d.data_quality] == [
        ("missing_ts", dropped, "dropped")]
    many = [{k: v for k, v in e.items() if k != "ts"} if "dur" in e and rng.random() < 0.3
            else e for e in resnet["traceEvents"]]
    with pytest.raises(TraceError, match=r"timings unusable: .* events without a timestamp"):
        diagnose_traces(_variant(tmp_path, resnet, many))  # main: "host", medium


def test_a_zero_length_profiler_step_is_left_out_and_said(tmp_path, resnet):
    events = [{**e, "dur": 0} if e.get("name") == "ProfilerStep#7" else e
              for e in resnet["traceEvents"]]
    sound = _sound(tmp_path, resnet)
    d = diagnose_traces(_variant(tmp_path, resnet, events))
    assert d.trace.steps_analyzed == [5, 6, 8, 9, 10]  # main: step 7 analysed at 0.0 ms
    assert all(s.wall_ms > 0 for s in d.breakdown.steps)
    walls = [s.wall_ms for s in sound.breakdown.steps if s.step != 7]
    assert d.breakdown.median_step_ms == pytest.approx(float(np.median(walls)), abs=1e-3)
    assert [(q.kind, q.count, q.action, q.of) for q in d.data_quality] == [
        ("zero_length_step", 1, "left out of the steps", 6)]
    text = render_text(d)
    assert "Data quality: 1 zero-length steps (left out of the steps)" in text


def test_every_step_of_zero_length_gives_no_verdict(tmp_path):
    events = [x(f"ProfilerStep#{n}", 1000.0 * n, 0, cat="user_annotation") for n in range(3)]
    events += [x("aten::mm", 1000.0 * n + 10, 100) for n in range(3)]
    path = write_trace(tmp_path / "t.json", events)
    with pytest.raises(TraceError, match=r"timings unusable: every step \(3, from profiler "
                                         r"step\) has zero length"):
        diagnose(load_trace(path))


def test_duplicates_are_exact_copies_only(tmp_path):
    """Rows that differ in any column are kept; a collective's args follow its row."""
    base = x("aten::mm", 10, 5, External_id=1)
    events = [base, dict(base), {**base, "args": {"External id": 2}}, {**base, "dur": 6},
              {**base, "tid": 2}, {**base, "ts": 11},
              x("gloo:all_reduce", 20, 3), x("gloo:all_reduce", 20, 3), x("gloo:broadcast", 30, 2)]
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    assert len(trace.events) == len(events) - 2
    assert [(i.kind, i.count) for i in trace.meta.timing.issues] == [("duplicate", 2)]
    names = [trace.events.names[i] for i in trace.events.name_id]
    labels = {names[row]: trace.events.labels[args[0]]
              for row, args in trace.events.collectives.items()}
    assert labels == {"gloo:all_reduce": "all_reduce", "gloo:broadcast": "broadcast"}


@pytest.mark.parametrize("rel", ["hta/triton_example/triton_example.json.gz",
                                 "hta/trace_file_list/inference_rank_1.json.gz"])
def test_real_events_that_outlast_the_others_are_not_impossible(shared_traces, rel):
    """A ProfilerStep 37 spans past the last start, the profiler's span 13: real timings."""
    trace = load_trace(shared_traces / rel)
    assert trace.meta.timing.issues == ()


def test_a_clean_trace_has_no_data_quality_and_no_line_for_it(tmp_path, resnet):
    d = _sound(tmp_path, resnet)
    assert d.data_quality == []
    assert "Data quality" not in render_text(d)
    assert "data.impossible_timings" not in {f.id for f in d.findings}
