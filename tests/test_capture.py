"""torchtriage.profile with the real torch.profiler: schedule pitfalls, noise, run directory."""

from __future__ import annotations

import json

import pytest
import torch

import torchtriage
from torchtriage.errors import CaptureError
from torchtriage.trace import load_trace


def _loop(prof, steps: int, fail_at: int | None = None, exc: Exception | None = None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    for i in range(steps):
        if fail_at is not None and i == fail_at:
            raise exc
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()


def test_full_window_writes_trace_diagnosis_and_run_record(tmp_path):
    with torchtriage.profile(tmp_path / "run") as prof:
        _loop(prof, 10)
    d = prof.diagnosis
    assert prof.trace_path.name.endswith(".pt.trace.json.gz")
    # tensorboard_trace_handler naming: <worker>.<time_ns>.pt.trace.json.gz
    assert len(prof.trace_path.name.split(".")) == 6
    assert d.trace.steps_analyzed == [3, 4, 5, 6, 7]
    # step #1 follows the cost guard's probe: it only prepares tracing and is not in the trace
    assert d.trace.steps_excluded == {"2": "warm-up"}
    saved = json.loads((tmp_path / "run" / "diagnosis.json").read_text())
    assert saved["primary"] == d.primary and saved["schema"] == "torchtriage.diagnosis/1"
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["steps_run"] == 10 and run["trace"] == prof.trace_path.name
    # The step() that stops and exports the trace is never counted as a step.
    assert d.capture.excluded_host_steps == {
        "7": "profiler step() call (stop, post-processing and export)"}
    assert d.capture.host_step_ms_median is not None and d.capture.host_step_ms_median > 0
    # Record shapes and memory are on by default.
    trace = load_trace(prof.trace_path)
    assert (trace.events.shape_offset >= 0).any() and len(trace.memory) > 0


def test_the_profilers_results_are_reclaimed_in_the_step_that_writes_the_trace(tmp_path):
    """torch 2.11 turns every recorded event into a Python FunctionEvent, linked to its
    parent and children (cycles), when the profiler stops. Left to the garbage collector they
    were reclaimed a step or two later, inside the steps timed to check the window (H200: a
    5 ms step took 134 ms, and the window was judged not steady state, twice). The session
    drops them and runs a full collection in the step that writes the trace, which the check
    leaves out (torch 2.13 builds them only when asked, so here only that is pinned)."""
    import gc

    full: list[int] = []
    step = [0]

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(step[0])

    gc.callbacks.append(seen)
    try:
        with torchtriage.profile(tmp_path / "run", analyze=False) as prof:
            torch.manual_seed(0)
            model = torch.nn.Linear(32, 4)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            saved_at = None
            for i in range(10):
                step[0] = i
                model(torch.randn(16, 32)).sum().backward()
                opt.step()
                prof.step()
                if saved_at is None and prof.trace_path is not None:
                    saved_at = i
                    assert prof._prof.profiler is None  # nothing left to parse or collect
    finally:
        gc.callbacks.remove(seen)
    assert saved_at is not None and saved_at in full, (saved_at, full)


def test_leaving_during_warmup_keeps_what_was_recorded(tmp_path):
    with torchtriage.profile(tmp_path) as prof:
        _loop(prof, 3)  # wait=1 (probed), #1 prepares, #2 (warm-up) runs; #3 never finishes
    d = prof.diagnosis
    assert d.trace.steps_analyzed == [2]
    assert d.trace.steps_excluded == {"3": "partial: the loop ended inside this step"}


def test_leaving_mid_window_marks_last_step_partial(tmp_path):
    with torchtriage.profile(tmp_path) as prof:
        _loop(prof, 5)
    assert prof.diagnosis.trace.steps_analyzed == [3, 4]
    assert prof.diagnosis.trace.steps_excluded["5"].startswith("partial")


def test_too_few_steps_is_a_clear_error_not_a_crash(tmp_path):
    with pytest.warns(UserWarning, match="no complete step was recorded"), \
            torchtriage.profile(tmp_path) as prof:
        _loop(prof, 1)
    with pytest.raises(CaptureError, match="run at least 2"):
        _ = prof.diagnosis
    assert json.loads((tmp_path / "run.json").read_text())["error"]


def test_user_exception_propagates_and_trace_is_kept(tmp_path):
    with pytest.raises(ValueError, match="boom"), torchtriage.profile(tmp_path) as prof:
        _loop(prof, 8, fail_at=5, exc=ValueError("boom"))
    assert prof.trace_path is not None and prof.trace_path.exists()
    assert prof.diagnosis.trace.steps_analyzed == [3, 4]


def test_out_of_memory_makes_memory_primary(tmp_path):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(torch.OutOfMemoryError), torchtriage.profile(tmp_path) as prof:
        _loop(prof, 8, fail_at=6, exc=oom)
    d = prof.diagnosis
    assert d.primary == "memory" and d.capture.oom
    assert d.prescriptions[0].id == "memory.grad_accumulation"
    assert d.out_of_memory.step == 7 and d.out_of_memory.requested_bytes == 2 * 2**30


def test_out_of_memory_on_the_first_step_is_still_a_memory_diagnosis(tmp_path):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(torch.OutOfMemoryError), torchtriage.profile(tmp_path) as prof:
        _loop(prof, 8, fail_at=0, exc=oom)
    d = prof.diagnosis
    assert d.primary == "memory" and d.out_of_memory.step == 1
    assert (tmp_path / "diagnosis.json").is_file()


def test_profiler_noise_is_filtered_but_user_stderr_passes(tmp_path, capfd):
    import os

    with torchtriage.profile(tmp_path) as prof:
        os.write(2, b"user message on fd 2\n")
        _loop(prof, 8)
    err = capfd.readouterr().err
    assert "user message on fd 2" in err
    assert "profiler_start" not in err and "profiler_stop" not in err
    assert "Memory block of unknown size" not in err


def test_device_memory_budget_on_cpu(tmp_path):
    with torchtriage.profile(tmp_path) as prof:
        _loop(prof, 8)
    (cpu,) = prof.diagnosis.memory
    assert cpu.capacity_bytes is None  # nothing to judge against without a budget
    # Parameters created before recording are counted through the baseline.
    params = sum(p.numel() * 4 for p in torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.Linear(64, 4)).parameters())
    assert cpu.baseline_bytes >= params
    assert cpu.peak_allocated_bytes > cpu.baseline_bytes
    (tight,) = torchtriage.analyze(prof.trace_path, device_memory=cpu.peak_allocated_bytes)
    assert tight.primary == "memory"
    assert tight.memory[0].capacity_source == "--device-memory"
    (roomy,) = torchtriage.analyze(prof.trace_path, device_memory=cpu.peak_allocated_bytes * 2)
    assert roomy.primary != "memory"


def test_bad_options_are_one_line_errors(tmp_path):
    with pytest.raises(torchtriage.TorchtriageError, match="cannot read memory size"):
        torchtriage.profile(tmp_path, device_memory="lots")
    with pytest.raises(torchtriage.TorchtriageError, match="invalid schedule"):
        torchtriage.profile(tmp_path, active=0)


def test_the_step_clock_maps_step_numbers_to_its_ends():
    """Step n (counted from 1) runs from the end of step n - 1 to its own: the window check's
    step times and the machine sampler's spans both read them from here."""
    from torchtriage.capture.steps import StepClock

    clock = StepClock()
    clock.ends = [1.0, 1.5, 2.5, 2.75, 3.0]
    assert clock.step_ms(1, 5) == [500.0, 1000.0, 250.0, 250.0]  # step 1 has no start
    assert clock.step_ms(3, 4) == [1000.0, 250.0]
    assert clock.step_ms(4, 9) == [250.0, 250.0]  # steps that have not ended are left out
    assert clock.step_ms(6, 9) == []
    assert clock.step_ms(2, 5) == clock.host_step_ms()
    assert clock.span(3, 4) == (1.5, 2.75)
    assert clock.span(4, 9) == (2.5, 3.0)
    assert clock.span(1, 3) is None and clock.span(6, 9) is None
