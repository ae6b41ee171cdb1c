"""The whole-run view (issue #33): the growth fit, the stall scan, the run view's verdicts from a
step timeline, and its bad inputs (too short, no memory counter, a rank that died, no dynamo).
End-to-end runs of the user-style scripts are in tests/test_whole_run_scripts.py."""

from __future__ import annotations

import random

import pytest

from torchtriage.analysis.growth import fit_growth
from torchtriage.analysis.stalls import find_stalls, period
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.diagnose import diagnose_out_of_memory
from torchtriage.diagnosis.result import (
    CompileEvent,
    OutOfMemory,
    RunEvent,
    StepTimeline,
    TensorCensus,
    TensorHolder,
)
from torchtriage.diagnosis.run_view import RunInputs, run_view

MIB = 2**20


def _ends(step_ms: list[float]) -> list[float]:
    """Step ends (s) for these step times, the first step ending at 1 s."""
    out = [1.0]
    for ms in step_ms:
        out.append(out[-1] + ms / 1e3)
    return out


def _timeline(steps: int = 60, *, grow: float = 0.0, noise: float = 0.0, source="cuda_allocator",
              step_ms=None, **kw) -> StepTimeline:
    rng = random.Random(0)
    memory = [int(500 * MIB + grow * i + rng.gauss(0, noise)) for i in range(steps)]
    return StepTimeline(end_s=_ends(step_ms or [50.0] * (steps - 1)), memory_source=source,
                        memory_bytes=memory if source else [], memory_first_step=1,
                        capacity_bytes=8 * 2**30, capacity_source="device total memory", **kw)


# --- the fits -------------------------------------------------------------------------------


def test_the_growth_fit_finds_a_slope_through_noise_and_none_in_flat_noise():
    rng = random.Random(1)
    steps = list(range(40))
    growing = fit_growth(steps, [1e9 + 2e6 * s + rng.gauss(0, 1e6) for s in steps])
    assert growing.whole.slope == pytest.approx(2e6, rel=0.1) and growing.whole.t > 20
    flat = fit_growth(steps, [1e9 + rng.gauss(0, 1e6) for s in steps])
    assert abs(flat.whole.t) < th.GROWTH_T.value


def test_a_level_shift_between_segments_is_not_growth():
    steps = list(range(40))
    values = [1e9 if s < 20 else 1.5e9 for s in steps]  # one jump (the profiler's buffers)
    assert fit_growth(steps, values).whole.slope > 0
    assert fit_growth(steps, values, [0 if s < 20 else 1 for s in steps]).whole.slope == 0


def test_stalls_recur_at_a_period_and_consecutive_slow_steps_have_none():
    numbers = list(range(2, 62))
    ms = [500.0 if n % 10 == 0 else 50.0 for n in numbers]
    scan = find_stalls(numbers, ms, left_out=set(), ratio=2.0, min_excess_ms=20.0)
    assert scan.stalls == (10, 20, 30, 40, 50, 60) and scan.median_ms == 50.0
    assert period(scan.stalls, tolerance=0.25) == 10
    assert period([30, 31, 32, 33], tolerance=0.25) is None  # a slowdown, not a period
    assert period([10, 20], tolerance=0.25) is None  # two are not a period yet


# --- the run view ---------------------------------------------------------------------------


def test_steady_growth_gives_bytes_per_step_and_the_step_the_device_is_full():
    view = run_view(RunInputs(timeline=_timeline(60, grow=64 * MIB, noise=MIB)))
    g = view.growth
    assert g.steady and g.bytes_per_step == pytest.approx(64 * MIB, rel=0.02)
    assert g.first_step == int(th.GROWTH_SKIP_STEPS.value) + 1 and g.last_step == 60
    # (8 GiB - the last reading) / 64 MiB after step 60
    expected = 60 + (8 * 2**30 - (500 * MIB + 64 * MIB * 59)) / (64 * MIB)
    assert abs(g.full_at_step - expected) <= 1
    assert all(e.source for e in g.evidence)


def test_allocator_noise_is_not_growth():
    g = run_view(RunInputs(timeline=_timeline(80, noise=8 * MIB))).growth
    assert g is not None and not g.steady and g.full_at_step is None


def test_a_run_too_short_to_fit_a_slope_says_so():
    view = run_view(RunInputs(timeline=_timeline(8, grow=64 * MIB)))
    assert view.growth is None
    assert "too short to fit a memory slope" in view.growth_not_assessed


def test_without_a_memory_counter_the_view_says_why_and_still_times_the_steps():
    view = run_view(RunInputs(timeline=_timeline(40, source=None)))
    assert view.growth is None and "no memory counter" in view.growth_not_assessed
    assert view.steps == 40 and view.median_step_ms == pytest.approx(50.0)


def test_on_cpu_the_process_rss_is_labelled_as_such():
    view = run_view(RunInputs(timeline=_timeline(60, grow=8 * MIB, source="process_rss")))
    assert view.growth.source == "process_rss" and view.memory_source == "process_rss"


def test_a_rank_that_died_is_a_gap_not_an_error():
    view = run_view(RunInputs(timeline=_timeline(30), job_steps=90))
    assert view.gaps and "stops at step 30" in view.gaps[0]


def test_the_census_names_the_cause_and_the_holder():
    census = [TensorCensus(step=24, tensors=300, with_graph=20, holders=[]),
              TensorCensus(step=32, tensors=316, with_graph=36, holders=[
                  TensorHolder(name="outputs (list) in train() at train.py:40", tensors=30,
                               with_graph=30, bytes=480 * MIB)])]
    g = run_view(RunInputs(timeline=_timeline(60, grow=16 * MIB, census=census))).growth
    assert g.cause == "autograd_graph_retained"
    assert "outputs (list) in train() at train.py:40" in g.cause_detail
    assert "480.0 MiB" in g.cause_detail


def test_a_loader_restart_every_epoch_is_a_recurring_stall_with_its_share():
    ms = [50.0] * 59
    events = []
    t = 1.0
    ends = _ends(ms)
    for epoch_start in range(10, 60, 10):  # step n's time is ms[n - 2]
        ms[epoch_start - 2] = 2050.0
    ends = _ends(ms)
    for n in range(10, 60, 10):
        t = ends[n - 2]
        events.append(RunEvent(kind="loader_start", step=n, start_s=t + 0.001, duration_s=2.0,
                               workers=4, persistent=False, start_method="spawn",
                               dataset_bytes=300 * MIB if n == 10 else None))
    timeline = StepTimeline(end_s=ends, events=events)
    (stall,) = run_view(RunInputs(timeline=timeline)).stalls
    assert stall.cause == "dataloader_restart" and stall.period_steps == 10
    assert stall.steps == [10, 20, 30, 40, 50]
    assert stall.excess_s == pytest.approx(10.0, rel=0.01)
    assert stall.share_of_run == pytest.approx(10.0 / (ends[-1] - ends[0]), rel=0.01)
    assert "persistent_workers=False" in stall.detail and "300.0 MiB" in stall.detail


def test_unexplained_slow_steps_count_only_when_they_recur_at_a_period():
    ms = [50.0] * 59
    for n in (21, 22, 23, 24):
        ms[n - 2] = 400.0
    assert run_view(RunInputs(timeline=StepTimeline(end_s=_ends(ms)))).stalls == []
    ms = [400.0 if n % 7 == 0 else 50.0 for n in range(2, 61)]
    (stall,) = run_view(RunInputs(timeline=StepTimeline(end_s=_ends(ms)))).stalls
    assert stall.cause == "unexplained" and stall.period_steps == 7


def test_recompilations_are_grouped_by_their_guard_with_sizes_folded():
    compiles = [CompileEvent(step=1, frame="forward (model.py:10)", seconds=2.0)] + [
        CompileEvent(step=n, frame="forward (model.py:10)", seconds=1.0,
                     reason=f"tensor 'x' size mismatch at index 1. expected {n}, actual {n + 9}")
        for n in range(3, 10)]
    timeline = StepTimeline(end_s=_ends([50.0] * 39), compiles=compiles,
                            recompile_limit_hits=["forward (model.py:10)"])
    c = run_view(RunInputs(timeline=timeline)).compile
    assert c.compilations == 8 and c.recompilations == 7 and len(c.reasons) == 1
    assert c.reasons[0].count == 7 and "size mismatch" in c.reasons[0].reason
    assert c.after_first_step_s == pytest.approx(7.0) and c.limit_hits


def test_without_dynamo_there_is_no_compile_section():
    assert run_view(RunInputs(timeline=_timeline(30))).compile is None


def test_an_out_of_memory_error_after_steady_growth_is_a_leak_and_the_ladder_is_withheld():
    timeline = _timeline(50, grow=128 * MIB, noise=MIB)
    oom = OutOfMemory(step=51, message="CUDA out of memory", device="cuda:0",
                      capacity_bytes=8 * 2**30)
    doc = diagnose_out_of_memory(oom, run=RunInputs(timeline=timeline))
    assert doc.primary == "memory" and doc.run.growth.steady
    assert doc.prescriptions[0].id == "memory.fix_leak"
    assert {w.id for w in doc.withheld} >= {"memory.grad_accumulation",
                                            "memory.activation_checkpointing"}
    assert any(f.id == "memory.growth" for f in doc.findings)
    assert doc.run.growth.full_at_step <= 51
    # the same error without growth is a batch too big: the ladder is prescribed
    flat = diagnose_out_of_memory(oom, run=RunInputs(timeline=_timeline(50, noise=MIB)))
    assert "memory.grad_accumulation" in [p.id for p in flat.prescriptions]
    assert "memory.fix_leak" not in [p.id for p in flat.prescriptions]


def test_the_census_counts_a_list_of_outputs_kept_with_their_graph():
    import torch

    from torchtriage.capture.census import take_census

    model = torch.nn.Linear(64, 64)
    kept_outputs = [model(torch.randn(8, 64)) for _ in range(5)]
    census = take_census(torch, step=5)
    assert census.with_graph >= 5
    top = census.holders[0]
    assert top.name.startswith("kept_outputs (list) in ") and top.with_graph == 5
    assert top.bytes == 5 * 8 * 64 * 4
    del kept_outputs


# --- recompilation over the run as the verdict ------------------------------------------------


def _kernel_bound_cpu_trace(tmp_path):
    """Six 10 ms CPU steps, each all one matmul: kernel at compute_bound, compile.default."""
    from conftest import profiler_steps, write_trace, x

    from torchtriage.trace import load_trace

    return load_trace(write_trace(tmp_path / "cpu.json", profiler_steps(
        6, lambda t: [x("aten::mm", t + 100, 9_800)])))


def _recompiling(recompiles: int, seconds: float, steps: int = 60, limit: bool = False):
    compiles = [CompileEvent(step=1, frame="forward (model.py:10)", seconds=2.0)] + [
        CompileEvent(step=n, frame="forward (model.py:10)", seconds=seconds,
                     reason=f"tensor 'x' size mismatch at index 1. expected {n}, actual {n + 9}")
        for n in range(3, 3 + recompiles)]
    return StepTimeline(end_s=_ends([50.0] * (steps - 1)), compiles=compiles,
                        recompile_limit_hits=["forward (model.py:10)"] if limit else [])


def test_a_run_that_spends_its_time_recompiling_is_host_bound_whatever_the_window(tmp_path):
    """The window (here kernel-bound) can sit among the recompiles, whose own tracing a CPU
    trace counts as op time; over the run, compile time after the first step at
    run_stall_significant names host, with compile.dynamic first, and a run that compiles
    already is not told to compile its model."""
    from torchtriage.diagnosis.diagnose import diagnose

    trace = _kernel_bound_cpu_trace(tmp_path)
    alone = diagnose(trace)
    assert alone.primary == "kernel" and alone.prescriptions[0].id == "compile.default"
    # 8 recompiles of 0.3 s in a 3 s run: 80% of it compiling, one frame at the limit
    doc = diagnose(trace, run=RunInputs(timeline=_recompiling(8, 0.3, limit=True)))
    assert doc.primary == "host" and doc.primary_rule.rule == "run_recompiling"
    assert doc.primary_rule.evidence[0].metric == "recompile_share_of_run"
    assert doc.prescriptions[0].id == "compile.dynamic"
    assert "recompiled 8 time(s)" in doc.summary and "over the run's 60 steps" in doc.summary
    held = {w.id: w for w in doc.withheld}
    assert "compile.default" in held and "compiles already" in held["compile.default"].reason
    assert "compile.default" not in [p.id for p in doc.prescriptions]


def test_a_few_recompiles_or_a_small_share_leave_the_window_its_verdict(tmp_path):
    """Two recompiles (below recompile_min_count, no limit hit) cost a large share here, and
    eight cost 2% of a long run: neither is the verdict; compiling the model stays withheld
    (it is compiled), the next compile mode does not."""
    from torchtriage.diagnosis.diagnose import diagnose

    trace = _kernel_bound_cpu_trace(tmp_path)
    few = diagnose(trace, run=RunInputs(timeline=_recompiling(2, 0.5)))
    cheap = diagnose(trace, run=RunInputs(timeline=_recompiling(8, 0.01, steps=200)))
    for doc in (few, cheap):
        assert doc.primary == "kernel" and doc.primary_rule.rule == "compute_bound", doc.summary
        assert "compile.default" in {w.id for w in doc.withheld}
        assert "compile.max_autotune" in [p.id for p in doc.prescriptions]


def test_of_a_recurring_stall_and_recompilation_the_larger_share_names_the_layer(tmp_path):
    from torchtriage.diagnosis.diagnose import diagnose

    trace = _kernel_bound_cpu_trace(tmp_path)

    def with_restarts(recompile_s: float):
        ms = [50.0] * 59
        for n in range(10, 60, 10):
            ms[n - 2] = 550.0
        ends = _ends(ms)
        events = [RunEvent(kind="loader_start", step=n, start_s=ends[n - 2] + 0.001,
                           duration_s=0.5, workers=4, persistent=False, start_method="spawn")
                  for n in range(10, 60, 10)]
        t = _recompiling(8, recompile_s)
        return StepTimeline(end_s=ends, events=events, compiles=t.compiles)

    # restarts: 2.5 s of a 5.4 s run; recompiles 8 x 0.05 s (7%) or 8 x 0.5 s (74%)
    stalled = diagnose(trace, run=RunInputs(timeline=with_restarts(0.05)))
    assert stalled.primary_rule.rule == "recurring_stall" and stalled.primary == "data_loading"
    compiling = diagnose(trace, run=RunInputs(timeline=with_restarts(0.5)))
    assert compiling.primary_rule.rule == "run_recompiling" and compiling.primary == "host"


def test_a_window_among_compilations_says_so_and_is_less_sure(tmp_path):
    """dynamo's compile ranges over 20% of the window's step time: steps.window_compiling names
    the steps, and the window's own verdict is one level less sure; a compiled region that
    only runs is not compiling."""
    from conftest import profiler_steps, write_trace, x

    from torchtriage.diagnosis.diagnose import diagnose
    from torchtriage.trace import load_trace

    def step(t, compiling: bool):
        body = [x("aten::mm", t + 100, 9_800)]
        if compiling:
            body += [x("dynamo", t + 100, 4_000), x("_compile.compile_inner (dynamo_timed)",
                                                    t + 150, 3_900)]
        return [*body, x("Torch-Compiled Region: 0/1", t + 4_200, 5_000)]

    events = profiler_steps(6, lambda t: step(t, compiling=t < 30_000))
    doc = diagnose(load_trace(write_trace(tmp_path / "c.json", events)))
    plain = diagnose(load_trace(write_trace(tmp_path / "p.json", profiler_steps(
        6, lambda t: step(t, compiling=False)))))
    (f,) = [f for f in doc.findings if f.id == "steps.window_compiling"]
    assert "steps #1, #2, #3)" in f.message and "op time" in f.message, f.message
    assert f.evidence[0].value == pytest.approx(0.2, abs=0.01)
    assert "steps.window_compiling" not in [f.id for f in plain.findings]
    levels = ("low", "medium", "high")
    assert levels.index(doc.confidence) == levels.index(plain.confidence) - 1


def test_a_stall_of_two_kinds_is_one_stall_naming_both_and_prescribing_both(tmp_path):
    """Lightning's epoch end: the validation loader starts its workers, the model evaluates,
    the next epoch's loader starts again, all in the first step of each epoch; half of the
    evaluations are followed by a short save. One stall every 10 steps, attributed to the kind
    with the most time, the other named beside it (stall_second_cause) and both fixes
    prescribed; the saves (a small share) split nothing."""
    from torchtriage.diagnosis.diagnose import diagnose

    ms = [50.0] * 59
    for n in range(10, 60, 10):
        ms[n - 2] = 550.0
    ends = _ends(ms)
    events = []
    for n in range(10, 60, 10):
        t0 = ends[n - 2]
        events += [
            RunEvent(kind="loader_start", step=n, start_s=t0 + 0.001, duration_s=0.08,
                     workers=2, persistent=False, start_method="fork"),
            RunEvent(kind="evaluation", step=n, start_s=t0 + 0.09, duration_s=0.25,
                     detail="Net"),
            RunEvent(kind="loader_start", step=n, start_s=t0 + 0.35, duration_s=0.1,
                     workers=2, persistent=False, start_method="fork")]
        if n % 20 == 0:
            events.append(RunEvent(kind="checkpoint", step=n, start_s=t0 + 0.46,
                                   duration_s=0.01, detail="ckpt.pt"))
    timeline = StepTimeline(end_s=ends, events=events)
    (stall,) = run_view(RunInputs(timeline=timeline)).stalls
    assert stall.cause == "evaluation" and stall.also == ["dataloader_restart"]
    assert stall.period_steps == 10 and stall.steps == [10, 20, 30, 40, 50]
    assert "also in these steps: a DataLoader started 2 worker" in stall.detail
    doc = diagnose(_kernel_bound_cpu_trace(tmp_path), run=RunInputs(timeline=timeline))
    assert doc.primary_rule.rule == "recurring_stall"
    assert [p.id for p in doc.prescriptions][:2] == ["eval.interval",
                                                    "dataloader.persistent_workers"]


def test_a_first_compile_longer_than_the_rest_of_the_run_is_said_to_not_pay_back(tmp_path):
    """A short run that compiled for 30 s before its first step ended (3 s of steps after it):
    the compile finding says what each step would have to gain; a long run's does not."""
    from torchtriage.diagnosis.diagnose import diagnose

    trace = _kernel_bound_cpu_trace(tmp_path)

    def finding(steps: int):
        t = StepTimeline(end_s=_ends([50.0] * (steps - 1)), compiles=[
            CompileEvent(step=1, frame="forward (model.py:10)", seconds=30.0)])
        doc = diagnose(trace, run=RunInputs(timeline=t))
        return next(f for f in doc.findings if f.id == "run.compile").message

    short = finding(60)
    assert "took 30.0 s, longer than the 3.0 s of the 59 steps after it" in short, short
    assert "saves 508 ms a step" in short
    assert "pays back" not in finding(1000)  # 50 s of steps after it


def test_growth_that_fills_memory_only_past_the_horizon_is_info_without_a_fix(tmp_path):
    """70 KiB a step on 8 GiB is full after ~112k steps (past growth_horizon_steps): said, at
    info, with no fix_leak; 128 MiB a step on the same device is a leak with its fix."""
    from torchtriage.diagnosis.diagnose import diagnose

    trace = _kernel_bound_cpu_trace(tmp_path)
    slow = diagnose(trace, run=RunInputs(timeline=_timeline(100, grow=70 * 1024)))
    assert slow.run.growth.steady and slow.run.growth.full_at_step > 100_000
    (f,) = [f for f in slow.findings if f.id == "memory.growth"]
    assert f.severity == "info" and "past growth_horizon_steps" in f.message, f.message
    assert "memory.fix_leak" not in [p.id for p in slow.prescriptions]
    fast = diagnose(trace, run=RunInputs(timeline=_timeline(60, grow=128 * MIB)))
    assert "memory.fix_leak" in [p.id for p in fast.prescriptions]
