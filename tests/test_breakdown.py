"""Step-time attribution: exact on hand-built traces, sums to wall time on random ones."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_trace, x
from hypothesis import given, settings
from hypothesis import strategies as st

from torchtriage.analysis.breakdown import attribute, step_breakdown
from torchtriage.analysis.categories import CLOSURE_PREFIX, unmarked_closure_steps
from torchtriage.analysis.collectives import collective_table
from torchtriage.analysis.intervals import covered_within, merge, subtract, total
from torchtriage.analysis.sharding import sharding
from torchtriage.analysis.steps import find_steps
from torchtriage.trace import load_trace


def test_merge_unions_overlaps_and_drops_empty():
    s, e = merge(np.array([5.0, 0.0, 2.0, 20.0, 30.0]), np.array([8.0, 3.0, 6.0, 25.0, 30.0]))
    assert s.tolist() == [0.0, 20.0] and e.tolist() == [8.0, 25.0]
    assert total(np.array([0.0, 1.0]), np.array([2.0, 3.0])) == 3.0


def test_priority_subtraction_on_one_window():
    # Window [0, 100). Category 0 covers [10, 40); category 1 covers [30, 60) and [90, 120).
    out = attribute(np.array([0.0]), np.array([100.0]),
                    [(np.array([10.0]), np.array([40.0])),
                     (np.array([30.0, 90.0]), np.array([60.0, 120.0]))])
    assert out.tolist() == [[30.0, 30.0, 40.0]]


intervals = st.lists(
    st.tuples(st.floats(0, 1000, allow_nan=False), st.floats(0, 200, allow_nan=False)),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    cats=st.lists(intervals, min_size=1, max_size=5),
    cuts=st.lists(st.floats(0, 1200, allow_nan=False), min_size=2, max_size=8, unique=True),
)
def test_attribution_rows_sum_to_window_and_respect_priority(cats, cuts):
    cuts = np.sort(np.array(cuts))
    starts, ends = cuts[:-1], cuts[1:]
    claims = [(np.array([a for a, _ in c], dtype=float),
               np.array([a + d for a, d in c], dtype=float)) for c in cats]
    out = attribute(starts, ends, claims)
    np.testing.assert_allclose(out.sum(axis=1), ends - starts, rtol=0, atol=1e-6)
    assert (out >= -1e-9).all()
    # The first category gets exactly its covered time inside each window.
    s0, e0 = claims[0]
    for i, (ws, we) in enumerate(zip(starts, ends, strict=True)):
        covered = total(np.clip(s0, ws, we), np.clip(e0, ws, we))
        assert out[i, 0] == pytest.approx(covered, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    cats=st.lists(st.lists(st.tuples(st.integers(0, 400), st.integers(0, 80)), max_size=20),
                  min_size=1, max_size=5),
    cuts=st.lists(st.integers(0, 480), min_size=2, max_size=6, unique=True),
    base=st.sampled_from([0.0, 1712195495406752.75]),  # ns-resolution clocks: 0.25 µs apart
)
def test_each_category_gets_what_it_covers_beyond_those_before_it(cats, cuts, base):
    """Exact on a fine grid, even where adjacent times are one float apart (µs timestamps of
    an epoch clock, 0.25 µs spacing): in each window, the first c categories' exposed time is
    what the union of their intervals covers there."""
    step = np.spacing(base) if base else 0.25
    cuts = base + np.sort(np.array(cuts)) * step
    starts, ends = cuts[:-1], cuts[1:]
    claims = [(base + np.array([a for a, _ in c], dtype=float) * step,
               base + np.array([a + d for a, d in c], dtype=float) * step) for c in cats]
    out = attribute(starts, ends, claims)
    for c in range(len(claims)):
        union = (np.concatenate([s for s, _ in claims[:c + 1]]),
                 np.concatenate([e for _, e in claims[:c + 1]]))
        for i, (ws, we) in enumerate(zip(starts, ends, strict=True)):
            covered = total(np.clip(union[0], ws, we), np.clip(union[1], ws, we))
            assert out[i, :c + 1].sum() == covered


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60), st.integers(0, 20))
def test_dense_unique_is_numpys_unique(keys, extra):
    from torchtriage.analysis.dense import dense_unique

    keys = np.asarray(keys, dtype=np.int64)
    distinct, inverse, counts = dense_unique(keys, 41 + extra)
    expected = np.unique(keys, return_inverse=True, return_counts=True)
    assert [distinct.tolist(), inverse.tolist(), counts.tolist()] == \
        [a.tolist() for a in expected]


def _gpu_trace(tmp_path):
    """Two steps of 1000 µs with known overlaps (all times µs)."""
    events = []
    for step, base in ((1, 0.0), (2, 1000.0)):
        events += [
            x(f"ProfilerStep#{step}", base, 1000.0, cat="user_annotation"),
            # Device copy of the step marker: must not become a step of its own.
            x(f"ProfilerStep#{step}", base, 1000.0, cat="gpu_user_annotation", pid=0, tid=7),
            x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, 300.0,
              cat="user_annotation"),
            x("aten::linear", base + 300, 200.0),
            x("cudaLaunchKernel", base + 310, 20.0, cat="cuda_runtime", correlation=1),
            x("Memcpy HtoD (Pageable -> Device)", base + 250, 100.0, cat="gpu_memcpy", pid=0,
              tid=7, stream=7),
            x("volta_sgemm_128x64_nn", base + 400, 300.0, cat="kernel", pid=0, tid=7, stream=7),
            x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", base + 600, 300.0, cat="kernel", pid=0,
              tid=20, stream=20),
            x("cudaStreamSynchronize", base + 900, 50.0, cat="cuda_runtime"),
        ]
    return load_trace(write_trace(tmp_path / "gpu.json", events))


def test_gpu_breakdown_exact(tmp_path):
    trace = _gpu_trace(tmp_path)
    steps = find_steps(trace)
    assert steps.source == "profiler_step" and steps.numbers.tolist() == [1, 2]
    b = step_breakdown(trace, steps)
    per_step = dict(zip(b.categories, b.exposed_us[0], strict=True))
    assert per_step["kernel"] == pytest.approx(300)  # sgemm [400, 700)
    assert per_step["communication"] == pytest.approx(200)  # nccl [600, 900) minus kernel
    assert per_step["h2d_input"] == pytest.approx(100)  # memcpy [250, 350)
    assert per_step["runtime"] == pytest.approx(50)  # sync [900, 950); launch under memcpy
    assert per_step["data_loading"] == pytest.approx(250)  # [0, 300) minus memcpy
    assert per_step["cpu_exec"] == pytest.approx(50)  # linear [300, 500) minus copy/kernel
    assert per_step["idle"] == pytest.approx(50)  # [950, 1000)
    np.testing.assert_allclose(b.exposed_us.sum(axis=1), b.wall_us)


def test_cpu_breakdown_exact(tmp_path):
    events = [
        x("ProfilerStep#5", 0, 1000, cat="user_annotation"),
        x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, 100,
          cat="user_annotation"),
        x("aten::linear", 120, 200),
        x("autograd::engine::evaluate_function: AddmmBackward0", 350, 250),
        x("AddmmBackward0", 360, 200),
        x("Optimizer.step#SGD.step", 650, 100, cat="user_annotation"),
        x("aten::add_", 660, 20),
        # gloo on its own thread: [500, 900) overlaps backward [350, 600).
        x("gloo:all_reduce", 500, 400, cat="user_annotation", tid=99),
    ]
    trace = load_trace(write_trace(tmp_path / "cpu.json", events))
    b = step_breakdown(trace, find_steps(trace))
    got = dict(zip(b.categories, b.exposed_us[0], strict=True))
    assert got == pytest.approx({"data_loading": 100, "optimizer": 100, "backward": 250,
                                 "forward": 200, "communication": 200, "other": 150})


def _fsdp2_step() -> list[dict]:
    """One FSDP2 step on gloo, [0, 1000) µs: the training thread gathers a block's parameters
    inside its pre-forward hook (waiting on gloo's thread), computes, and in backward waits for
    the block's gather again inside a backward node; one gather of another block runs on
    gloo's thread while the training thread computes (prefetched, hidden)."""
    return [
        x("ProfilerStep#4", 0, 1000, cat="user_annotation"),
        x("FSDP::pre_forward (0)", 0, 300, cat="user_annotation"),
        x("FSDP::all_gather (0)", 0, 280, cat="user_annotation"),
        x("aten::cat", 0, 40),
        x("c10d::_allgather_base_", 40, 10),
        x("gloo:all_gather", 50, 230, cat="user_annotation", tid=99),
        x("FSDP::all_gather_copy_out (0)", 280, 20, cat="user_annotation"),
        x("aten::linear", 300, 200),
        x("gloo:all_gather", 350, 100, cat="user_annotation", tid=99),  # hidden by linear
        x("autograd::engine::evaluate_function: AddmmBackward0", 500, 400),
        x("FSDP::pre_backward (0)", 510, 200, cat="user_annotation"),
        x("FSDP::all_gather (0)", 510, 190, cat="user_annotation"),
        x("gloo:all_gather", 520, 180, cat="user_annotation", tid=99),
        x("AddmmBackward0", 710, 190),
        x("FSDP::cast_forward_inputs", 950, 10, cat="user_annotation"),  # not communication
    ]


def test_fsdp_hooks_on_the_training_thread_are_communication(tmp_path):
    """FSDP2 on gloo waits for each gather inside its hooks, within forward and backward: that
    time is communication, not forward or backward; a gather behind compute is hidden."""
    trace = load_trace(write_trace(tmp_path / "fsdp.json", _fsdp2_step()))
    steps = find_steps(trace)
    b = step_breakdown(trace, steps)
    got = dict(zip(b.categories, b.exposed_us[0], strict=True))
    assert got == pytest.approx({"data_loading": 0, "communication": 500, "optimizer": 0,
                                 "backward": 200, "forward": 210, "other": 90})
    s = sharding(trace, steps, collective_table(trace, steps), steps.main_thread)
    assert (s.kind, s.units, s.all_gathers_per_step) == ("fsdp2", 1, 2.0)
    # 510 µs of gloo all-gather, 100 of them under aten::linear
    assert s.all_gather_us == pytest.approx(510) and s.all_gather_hidden == pytest.approx(
        100 / 510, abs=1e-4)


def test_no_fsdp_no_sharding(tmp_path):
    events = [x("ProfilerStep#1", 0, 100, cat="user_annotation"), x("aten::mm", 10, 50)]
    trace = load_trace(write_trace(tmp_path / "plain.json", events))
    steps = find_steps(trace)
    assert sharding(trace, steps, [], steps.main_thread) is None


def _closure_step(marked: bool) -> list[dict]:
    """One step of an optimizer that runs a closure twice (LBFGS): [0, 1000) µs, the
    optimizer's own ops at [110, 150) and [560, 600), zero_grad inside each closure call."""
    events = [x("ProfilerStep#3", 0, 1000, cat="user_annotation"),
              x("Optimizer.step#LBFGS.step", 100, 800, cat="user_annotation"),
              x("aten::dot", 110, 40)]
    for start in (150, 600):  # closure calls of 250 µs (the second ends at 850)
        if marked:
            events.append(x(CLOSURE_PREFIX + "LBFGS", start, 250, cat="user_annotation"))
        events += [x("Optimizer.zero_grad#LBFGS.zero_grad", start + 5, 10,
                     cat="user_annotation"),
                   x("aten::linear", start + 20, 100),  # forward and loss
                   x("autograd::engine::evaluate_function: AddmmBackward0", start + 130, 100),
                   x("AddmmBackward0", start + 135, 90)]
    return [*events, x("aten::add_", 560, 40)]


@pytest.mark.parametrize("marked", [True, False])
def test_a_closure_is_forward_and_backward_not_optimizer(tmp_path, marked):
    """optimizer.step(closure): the closure's forward and backward are attributed by their
    own ops. A trace torchtriage did not capture has no closure marks: its backward is still
    told apart by name, its forward stays optimizer time, and the trace says so."""
    trace = load_trace(write_trace(tmp_path / "closure.json", _closure_step(marked)))
    b = step_breakdown(trace, find_steps(trace))
    got = dict(zip(b.categories, b.exposed_us[0], strict=True))
    own = 50 + 200 + 50  # the step range outside the closures: [100, 150), [400, 600), [850, 900)
    if marked:  # each closure call: 250 = 10 zero_grad (optimizer) + 100 backward + 140 forward
        assert got == pytest.approx({"data_loading": 0, "optimizer": own + 2 * 10,
                                     "backward": 2 * 100, "forward": 2 * 140,
                                     "communication": 0, "other": 1000 - 800})
        assert unmarked_closure_steps(trace) == 0
    else:
        assert got["backward"] == pytest.approx(2 * 100)
        assert got["optimizer"] == pytest.approx(800 - 2 * 100)
        assert unmarked_closure_steps(trace) == 1


def test_subtract_removes_the_cuts_from_the_union():
    s, e = subtract(np.array([0.0, 50.0]), np.array([40.0, 100.0]),
                    np.array([10.0, 30.0, 90.0]), np.array([20.0, 60.0, 200.0]))
    assert s.tolist() == [0.0, 20.0, 60.0] and e.tolist() == [10.0, 30.0, 90.0]
    s, e = subtract(np.array([0.0]), np.array([5.0]), np.zeros(0), np.zeros(0))
    assert (s.tolist(), e.tolist()) == ([0.0], [5.0])


def test_step_fallbacks(tmp_path):
    opt = [x("Optimizer.step#Adam.step", t, 10, cat="user_annotation") for t in (100, 300, 600)]
    trace = load_trace(write_trace(tmp_path / "opt.json", [x("aten::mm", 0, 50), *opt]))
    steps = find_steps(trace)
    assert steps.source == "optimizer_step"
    assert steps.start.tolist() == [110, 310] and steps.end.tolist() == [310, 610]

    trace = load_trace(write_trace(tmp_path / "none.json", [x("aten::mm", 5, 50),
                                                             x("aten::add", 80, 40)]))
    steps = find_steps(trace)
    assert steps.source == "window"
    assert (steps.start.tolist(), steps.end.tolist()) == ([5], [120])


def test_warmup_and_partial_steps_are_excluded(tmp_path):
    events = [x(f"ProfilerStep#{n}", n * 100, 100, cat="user_annotation") for n in range(1, 6)]
    meta = {"warmup_steps": [1, 2], "partial_steps": [5]}
    trace = load_trace(write_trace(tmp_path / "w.json", events, torchtriage=meta))
    steps = find_steps(trace)
    assert steps.numbers.tolist() == [3, 4]
    assert steps.excluded == {1: "warm-up", 2: "warm-up",
                              5: "partial: the loop ended inside this step"}
    # Only warm-up steps recorded: they are analysed rather than nothing.
    trace = load_trace(write_trace(tmp_path / "w2.json", events[:2],
                                   torchtriage={"warmup_steps": [1, 2], "partial_steps": []}))
    assert find_steps(trace).numbers.tolist() == [1, 2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.floats(0, 100)), max_size=40),
       st.lists(st.tuples(st.floats(0, 1100), st.floats(0, 300)), min_size=1, max_size=10))
def test_covered_within_equals_clipping_each_window(intervals, windows):
    starts = np.array([a for a, _ in intervals], dtype=np.float64)
    ends = starts + np.array([d for _, d in intervals], dtype=np.float64)
    s, e = merge(starts, ends)
    lo = np.array([a for a, _ in windows])
    hi = lo + np.array([d for _, d in windows])
    expected = [np.clip(np.minimum(e, b) - np.maximum(s, a), 0, None).sum()
                for a, b in zip(lo, hi, strict=True)]
    assert covered_within(s, e, lo, hi) == pytest.approx(expected, abs=1e-6)


def _stack_nesting(tid: list, start: list, dur: list) -> tuple[list, list, list]:
    """The definition op_nesting computes without a loop: a stack of open ops per thread
    (sorted by thread, start, longest first); an op's parent is the top once the ops that
    ended by its start are popped."""
    n = len(start)
    child_sum, depth, parent, stack, current = [0.0] * n, [0] * n, [-1] * n, [], None
    for i in range(n):
        if tid[i] != current:
            stack, current = [], tid[i]
        while stack and start[stack[-1]] + dur[stack[-1]] <= start[i]:
            stack.pop()
        if stack:
            child_sum[stack[-1]] += dur[i]
            depth[i], parent[i] = len(stack), stack[-1]
        stack.append(i)
    self_us = [max(d - c, 0.0) for d, c in zip(dur, child_sum, strict=True)]
    max_self = list(self_us)
    for i in range(n - 1, -1, -1):
        if parent[i] >= 0:
            max_self[parent[i]] = max(max_self[parent[i]], max_self[i])
    return self_us, depth, max_self


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60),
                              st.sampled_from([0.0, 1.0, 2.5, 7.0, 30.0, 61.0])),
                    min_size=1, max_size=200))
def test_op_nesting_is_the_stack_of_open_ops(tmp_path_factory, ops):
    """Nested, partly overlapping, zero-length and tied ops: the vectorised nesting gives
    exactly what the stack gives."""
    from torchtriage.analysis.ops import op_nesting

    path = write_trace(tmp_path_factory.mktemp("n") / "t.json",
                       [x(f"op{i}", s, d, tid=t) for i, (t, s, d) in enumerate(ops)])
    trace = load_trace(path)
    nesting = op_nesting(trace)
    ev = trace.events
    rows = nesting.rows
    want = _stack_nesting(ev.thread_id[rows].tolist(), ev.ts[rows].tolist(),
                          ev.dur[rows].tolist())
    assert nesting.self_us.tolist() == want[0]
    assert nesting.depth.tolist() == want[1]
    assert nesting.max_self_us.tolist() == want[2]
