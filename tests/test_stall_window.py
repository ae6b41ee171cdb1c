"""The second profiling window (issue #33, item 3): placed on a stall that recurs, it records
one stall step with the real torch.profiler; the step's host time is split into what ran
(analysis/step_parts.py) and joins the whole-run view's stall. Its bad inputs: a due step that
does not stall, a stall longer than the recording cap, training that ends inside the window,
a trace gone or unreadable."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import msgspec
import torch

from torchtriage.analysis.step_parts import (
    LOADER_START_RANGE,
    OPS_LABEL,
    PYTHON_LABEL,
    step_parts,
)
from torchtriage.analysis.steps import find_steps
from torchtriage.capture.runner import run_inputs
from torchtriage.capture.stall_window import StallWindowRecorder, on_a_grid
from torchtriage.capture.steps import StepClock
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import RunEvent, StallWindow, StepTimeline
from torchtriage.diagnosis.run_view import RunInputs, run_view
from torchtriage.results.run import RunRecord
from torchtriage.trace import load_trace
from torchtriage.trace.discover import find_trace_files


def test_stalls_on_a_grid_give_the_period_despite_an_odd_slow_step():
    assert on_a_grid([21, 31, 33, 41, 61, 71]) == ([21, 31, 41, 61, 71], 10)
    assert on_a_grid([7, 13, 19, 25]) == ([7, 13, 19, 25], 6)
    assert on_a_grid([21, 31, 33]) is None  # no spacing seen twice
    assert on_a_grid([5, 6, 7, 8]) is None  # consecutive slow steps: a slowdown, no period
    assert on_a_grid([10, 20]) is None  # two are too few


class _Loop:
    """A training loop as users write one: a small model, an optimizer, and every
    ``period``-th step a stall of ``stall_s`` seconds of Python (logging, say) inside a
    ``record_function`` range or none."""

    def __init__(self, tmp: Path, *, period: int = 5, stall_s: float = 0.08,
                 stall_until: int = 10_000, max_steps: int | None = None) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(64, 64)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.clock = StepClock()
        self.events: list[RunEvent] = []
        self.recorder = StallWindowRecorder(tmp, self.clock, [], self.events, max_steps)
        self.period, self.stall_s, self.stall_until = period, stall_s, stall_until

    def run(self, steps: int, *, range_name: str | None = None) -> None:
        for step in range(1, steps + 1):
            if step % self.period == 0 and step <= self.stall_until:
                if range_name:
                    with torch.profiler.record_function(range_name):
                        _busy_python(self.stall_s)
                else:
                    _busy_python(self.stall_s)
            loss = self.model(torch.randn(32, 64)).square().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.clock.tick()
            self.recorder.step_ended(step, first_window_done=True)
        self.recorder.finish()


def _busy_python(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        time.sleep(0.005)


def test_the_window_records_the_due_stall_step_and_names_where_its_time_went(tmp_path):
    loop = _Loop(tmp_path)
    loop.run(30, range_name=LOADER_START_RANGE)
    (window,) = loop.recorder.windows
    assert window.period_steps == 5 and window.step % 5 == 0
    assert window.stalled and window.error is None and not window.partial
    assert window.step_ms > window.threshold_ms
    trace_path = tmp_path / window.trace
    assert trace_path.parent.name == "stall" and trace_path.is_file()
    trace = load_trace(trace_path)
    steps = find_steps(trace)
    parts = step_parts(trace, steps, int(steps.numbers.max()))
    labels = dict(parts.parts)
    assert parts.parts[0][0] == "starting DataLoader workers"
    assert labels["starting DataLoader workers"] >= 0.9 * loop.stall_s * 1e6
    assert OPS_LABEL in labels and "optimizer step" in labels
    assert abs(parts.recorded_us / 1e3 - window.step_ms) < 0.1 * window.step_ms + 5
    assert parts.device_busy_us is None  # a CPU trace
    # the stall trace is not the run directory's trace
    (tmp_path / "rank0_1.1.pt.trace.json.gz").write_bytes(trace_path.read_bytes())
    assert [p.name for p in find_trace_files(tmp_path)] == ["rank0_1.1.pt.trace.json.gz"]


def test_python_outside_any_op_is_its_own_part(tmp_path):
    loop = _Loop(tmp_path)
    loop.run(30)
    (window,) = loop.recorder.windows
    trace = load_trace(tmp_path / window.trace)
    steps = find_steps(trace)
    parts = step_parts(trace, steps, int(steps.numbers.max()))
    assert parts.parts[0][0] == PYTHON_LABEL
    assert parts.parts[0][1] >= 0.9 * loop.stall_s * 1e6


def test_a_due_step_that_does_not_stall_keeps_no_trace_and_tries_once_more(tmp_path):
    loop = _Loop(tmp_path, stall_until=15)  # the stalls stop once the window is placed
    loop.run(60)
    (window,) = loop.recorder.windows
    assert window.stalled is False and window.trace is None
    assert "under the stall threshold" in window.error
    assert not (tmp_path / "stall").exists()


def test_a_stall_longer_than_the_cap_is_recorded_that_far(tmp_path, monkeypatch):
    capped = msgspec.structs.replace(th.STALL_WINDOW_MAX_S, value=0.1)
    monkeypatch.setattr(th, "STALL_WINDOW_MAX_S", capped)
    loop = _Loop(tmp_path, stall_s=0.5)
    loop.run(30)
    (window,) = loop.recorder.windows
    assert window.stalled and window.cut_after_s is not None and window.cut_after_s < 0.3
    trace = load_trace(tmp_path / window.trace)
    steps = find_steps(trace)
    parts = step_parts(trace, steps, int(steps.numbers.max()))
    assert parts.recorded_us < 0.5 * window.step_ms * 1e3


def test_training_that_ends_inside_the_window_keeps_what_was_recorded(tmp_path):
    # stalls at 5, 10 and 15: the window on step 20 starts after step 18 (warm-up: 19)
    loop = _Loop(tmp_path / "a")
    loop.run(18)
    (window,) = loop.recorder.windows
    assert window.step == 20 and window.partial and window.trace is None
    assert window.error == "training ended after step 18, before step 20"
    loop = _Loop(tmp_path / "b")
    loop.run(19)  # ended as step 20 began: its start is recorded
    (window,) = loop.recorder.windows
    assert window.partial and window.trace and (tmp_path / "b" / window.trace).is_file()


def test_no_window_past_max_steps_nor_for_stalls_that_stopped(tmp_path):
    loop = _Loop(tmp_path / "a", max_steps=19)
    loop.run(19)
    assert loop.recorder.windows == []
    loop = _Loop(tmp_path / "b", stall_until=15)
    loop.run(100)
    assert len(loop.recorder.windows) == 1


def _timeline_with_window(window: StallWindow) -> StepTimeline:
    step_ms = [10.0] * 40
    for n in (5, 10, 15, 20, 25, 30, 35, 40):
        step_ms[n - 2] = 300.0
    ends = [1.0]
    for ms in step_ms:
        ends.append(ends[-1] + ms / 1e3)
    return StepTimeline(end_s=ends, profiled=[[3, 8], [24, 26]], stall_windows=[window])


def test_the_profiled_step_joins_its_stall_with_where_its_time_went(tmp_path):
    loop = _Loop(tmp_path)
    loop.run(30)
    (window,) = loop.recorder.windows
    record = RunRecord(argv=["train.py"], trace=None, rank=0,
                       timeline=_timeline_with_window(window))
    inputs = run_inputs([record], tmp_path)[0]
    assert inputs.stall_profile is not None and inputs.stall_profile.step == window.step
    view = run_view(inputs)
    (stall,) = view.stalls
    assert stall.cause == "unexplained" and window.step in stall.steps  # not left out
    assert stall.profile is inputs.stall_profile
    assert f"the profiled stall (step {window.step}) spent" in stall.detail
    assert PYTHON_LABEL in stall.detail
    (ev,) = [e for e in stall.evidence if e.metric == "stall_step_profiled_ms"]
    assert PYTHON_LABEL in ev.unit


def test_a_stall_trace_gone_or_unreadable_is_a_warning_and_no_profile(tmp_path, caplog):
    window = StallWindow(step=25, period_steps=5, predicted_from=[10, 15, 20],
                         threshold_ms=20.0, step_ms=300.0, stalled=True,
                         trace="stall/rank0_1.1.pt.trace.json.gz")
    record = RunRecord(argv=["train.py"], trace=None, rank=0,
                       timeline=_timeline_with_window(window))
    with caplog.at_level(logging.WARNING):
        assert run_inputs([record], tmp_path)[0].stall_profile is None  # gone
        (tmp_path / "stall").mkdir()
        (tmp_path / window.trace).write_bytes(b"\x1f\x8b not a trace")
        assert run_inputs([record], tmp_path)[0].stall_profile is None  # unreadable
    assert "the stall window's trace" in caplog.text
    assert run_view(RunInputs(timeline=record.timeline)).stalls  # the stall itself stays
