"""`torchtriage run` on the shapes real training code takes: optimizers that run a closure
(LBFGS, Lightning), several optimizers per iteration (GANs), gradient accumulation, and a
Dataset whose ``__getitem__`` is the slow part. Small user-style scripts in tests/scripts/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"


def run(tmp_path: Path, *args: str, out: str = "run") -> tuple[subprocess.CompletedProcess, Path]:
    out_dir = tmp_path / out
    proc = subprocess.run([sys.executable, "-m", "torchtriage", "run", "--out", str(out_dir),
                           *args], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return proc, out_dir


def record(out_dir: Path) -> dict:
    return json.loads((out_dir / "run.rank0.json").read_text())


def diagnosis(out_dir: Path) -> dict:
    return json.loads((out_dir / "diagnosis.json").read_text())


def evidence(doc: dict, metric: str) -> float:
    return next(e["value"] for layer in doc["layers"].values() for e in layer["evidence"]
                if e["metric"] == metric)


@pytest.mark.parametrize(("optimizer", "width"), [("lbfgs", "256"), ("sgd", "512")])
def test_a_closure_is_forward_and_backward_not_optimizer_time(tmp_path, optimizer, width):
    """optimizer.step(closure): forward, loss and backward run inside the optimizer's range;
    they are attributed by their own ops, and only the optimizer's own ops are counted as
    optimizer ops (SGD with a closure, as Lightning runs every optimizer: a few). Steps of
    13-24 ms: at width 128 SGD's 4 ms steps let a loaded machine's preemptions fill the gaps
    between ops (backward 8 % of the step in one CI run, 40 % on a quiet machine)."""
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "closure_regression.py"),
                    "--optimizer", optimizer, "--max-iter", "3", "--steps", "10",
                    "--width", width)
    doc = diagnosis(out)
    share = doc["breakdown"]["share"]
    assert share["forward"] > 0.1 and share["backward"] > 0.1, share
    assert share["optimizer"] < 0.6, share
    assert not any(m.startswith("closure marks") for m in doc["missing"])
    ops = evidence(doc, "optimizer_ops_per_step")
    if optimizer == "sgd":  # 6 parameters, foreach: a handful of ops, not the model's hundreds
        assert ops < 20, ops
        assert "optimizer.fused" not in [p["id"] for p in doc["prescriptions"]]
    # one loss per step: what optimizer.step(closure) returned (the closure's first call)
    printed = [float(line.split()[-1]) for line in proc.stdout.splitlines()
               if line.startswith("step ")]
    losses = [p["loss"] for p in record(out)["losses"]]
    assert len(losses) == 10 and losses == pytest.approx(printed, abs=1e-5)


def test_a_gan_records_one_loss_and_one_batch_per_iteration(tmp_path):
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "tiny_gan.py"), "--steps", "12")
    rec = record(out)
    assert rec["steps_detected"] == 12
    assert rec["step_detection"] == "optimizer.step (2 optimizer(s) per step)"
    assert len(rec["losses"]) == 12 and rec["batch_sizes"] == [32] * 12
    # a step's loss is the discriminator's (errD = errD_real + errD_fake, two backward calls)
    loss_d = [float(line.split()[2]) for line in proc.stdout.splitlines()
              if line.startswith("[")]
    assert [p["loss"] for p in rec["losses"]] == pytest.approx(loss_d, abs=1e-4)


def test_a_loss_in_a_buffer_the_next_step_overwrites_is_recorded_as_it_was(tmp_path):
    """CUDA graphs (compile mode reduce-overhead) return the loss in a static buffer that the
    next replay overwrites: the recorded loss is a copy taken at backward(), so parity sees
    the values the script saw (an alias read at the end read -1 for every step, and a
    nanoGPT-style script's reduce-overhead A/B failed parity by 0.61 on an H200)."""
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "static_loss_buffer.py"), "20")
    printed = [float(line.split()[3]) for line in proc.stdout.splitlines()
               if line.startswith("step ")]
    recorded = [p["loss"] for p in record(out)["losses"]]
    assert len(recorded) == 20 and recorded == pytest.approx(printed, abs=1e-5)


def test_gradient_accumulation_sums_micro_batches_into_one_step(tmp_path):
    _, out = run(tmp_path, "--", "python", str(SCRIPTS / "accumulation.py"),
                 "--accumulate", "2", "--batch", "16", "--steps", "12")
    rec = record(out)
    assert rec["steps_detected"] == 12
    assert rec["batch_sizes"] == [32] * 12  # two micro-batches of 16 per optimizer step
    _, plain = run(tmp_path, "--", "python", str(SCRIPTS / "accumulation.py"),
                   "--accumulate", "1", "--batch", "32", "--steps", "12", out="plain")
    # each micro-batch's loss / 2, summed: the same loss as one batch of 32 (same data)
    assert [p["loss"] for p in rec["losses"]] == pytest.approx(
        [p["loss"] for p in record(plain)["losses"]], rel=1e-4)


def test_parameters_updated_by_hand_are_steps_of_backward(tmp_path):
    """No optimizer ever steps (word_language_model's default loop): after 64 backward()
    calls with none, each backward() closes a step; the window, its check, one loss per step
    and a diagnosis follow (before: 'no training step detected', after the whole run)."""
    from torchtriage.capture.steps import BACKWARD_ONLY_AFTER

    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "manual_sgd.py"), "--steps", "110")
    rec = record(out)
    assert rec["step_detection"].startswith("backward() (no optimizer.step()"), rec
    assert rec["steps_detected"] == 110 - BACKWARD_ONLY_AFTER + 1
    assert len(rec["losses"]) == rec["steps_detected"] - 1  # the first closes the uncounted
    assert rec["windows"] and rec["windows"][-1]["after_steps"] == 5
    assert diagnosis(out)["primary"] in ("kernel", "host")
    assert "step 100 loss" in proc.stdout  # the script's own output, untouched


def test_backward_closes_steps_only_where_no_optimizer_ever_stepped():
    from torchtriage.capture.steps import BACKWARD_ONLY_AFTER, StepDetector

    by_hand = StepDetector()
    assert [by_hand.backward_returned() for _ in range(BACKWARD_ONLY_AFTER - 1)] == [0] * 63
    assert by_hand.backward_returned() == 1 and by_hand.backward_returned() == 1
    assert by_hand.optimizer_stepped(object()) == 0  # optimizers are ignored from then on
    # accumulation: 40 backward() calls (nanoGPT's) before the first optimizer step
    accumulating, opt = StepDetector(), object()
    assert sum(accumulating.backward_returned() for _ in range(40)) == 0
    accumulating.optimizer_stepped(opt)
    assert sum(accumulating.backward_returned() for _ in range(200)) == 0
    assert accumulating.optimizer_stepped(opt) == 2  # the cycle known: the first step too


# --- the profiling cost guard ----------------------------------------------------------


def _lbfgs_loop(out: Path, steps: int, **options):
    """An op-heavy step (LBFGS evaluating its closure 4 times) under torchtriage.profile."""
    import torch

    import torchtriage

    torch.manual_seed(0)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4, tolerance_grad=0.0,
                            tolerance_change=0.0)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with torchtriage.profile(out, **options) as prof:
        for _ in range(steps):
            opt.step(closure)
            prof.step()
    return prof


def _trace_steps(out: Path) -> tuple[list[str], str]:
    import gzip

    (path,) = out.glob("*.pt.trace.json.gz")
    text = gzip.decompress(path.read_bytes()).decode()
    events = json.loads(text)["traceEvents"]
    names = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
    return names, text


def test_the_cost_guard_leaves_a_cheap_window_alone(tmp_path):
    prof = _lbfgs_loop(tmp_path / "cheap", 10)
    cost = prof.cost
    assert cost is not None and cost.events_per_step > 100 and cost.action == "none"
    # the first warm-up step follows the probe: it prepares tracing and is not recorded
    assert (cost.planned_steps, cost.recorded_steps) == (7, 6)
    assert _trace_steps(tmp_path / "cheap")[0] == [f"ProfilerStep#{n}" for n in range(2, 8)]
    assert json.loads((tmp_path / "cheap" / "run.json").read_text())["profile_cost"][
        "events_per_step"] == cost.events_per_step


def test_a_probe_that_fails_leaves_the_window_unguarded_not_broken(tmp_path, monkeypatch):
    """Counting the probe's events raises: the window records as planned, with no cost, and
    still not at the boundary where the probe stopped."""
    from torchtriage.capture import cost_probe

    def broken(probe):
        raise RuntimeError("no results")

    monkeypatch.setattr(cost_probe, "count_events", broken)
    prof = _lbfgs_loop(tmp_path / "failed", 10)
    assert prof.cost is None
    assert _trace_steps(tmp_path / "failed")[0] == [f"ProfilerStep#{n}" for n in range(2, 8)]


def test_the_cost_guard_shortens_an_op_heavy_window_before_it_records(tmp_path, caplog):
    """The probed step says how many events a step records; a window that would pass the
    budget is shortened (then loses shapes) before anything is recorded, and says so."""
    probe = _lbfgs_loop(tmp_path / "probe", 3).cost.events_per_step
    with caplog.at_level("WARNING", logger="torchtriage.capture.session"):
        prof = _lbfgs_loop(tmp_path / "short", 10, max_events=int(probe * 4.5))
    cost = prof.cost
    assert (prof.warmup, prof.active) == (1, 4) and cost.recorded_steps == 4
    assert "window shortened to 1 warm-up + 4 active" in cost.action and not cost.dropped
    assert "profiler events" in caplog.text and "window shortened" in caplog.text
    names, text = _trace_steps(tmp_path / "short")
    assert names == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    assert '"Input Dims"' in text
    assert prof.diagnosis.trace.steps_analyzed == [2, 3, 4, 5]  # the warm-up step prepared

    prof = _lbfgs_loop(tmp_path / "bare", 10, max_events=probe)  # not even 3 steps fit
    assert (prof.warmup, prof.active) == (1, 2)
    assert prof.cost.dropped == ["record_shapes", "profile_memory"]
    assert "may still take" in prof.cost.action
    text = _trace_steps(tmp_path / "bare")[1]
    assert '"Input Dims"' not in text and '"[memory]"' not in text


def test_the_cost_guard_keeps_the_profilers_memory_within_its_share(tmp_path, monkeypatch):
    """A window whose profiler memory would pass its share of the memory limit records one
    active step, ops only; a step that alone would pass it is not recorded, the training runs
    to its end, and the session says why in one line (the run record too)."""
    from torchtriage.diagnosis import thresholds as th
    from torchtriage.errors import CaptureError

    probe = _lbfgs_loop(tmp_path / "probe", 3).cost.events_per_step
    step_bytes = probe * th.PROFILE_BYTES_PER_EVENT.value
    share = th.PROFILE_MEMORY_SHARE.value
    monkeypatch.setenv("TORCHTRIAGE_MEMORY_LIMIT", str(int(2.5 * step_bytes / share)))
    prof = _lbfgs_loop(tmp_path / "one", 10)
    assert (prof.warmup, prof.active, prof.cost.recorded_steps) == (1, 1, 1)
    assert "one active step recorded" in prof.cost.action
    assert prof.cost.dropped == ["record_shapes", "profile_memory"]
    assert prof.diagnosis.trace.steps_analyzed == [2]

    # one step alone past it, and a training loop off the main thread (no slice there: the
    # profiler is stopped mid-step from the main thread only): not recorded, in one line
    import threading

    monkeypatch.setenv("TORCHTRIAGE_MEMORY_LIMIT", str(int(0.5 * step_bytes / share)))
    done = []
    worker = threading.Thread(target=lambda: done.append(_lbfgs_loop(tmp_path / "none", 10)))
    worker.start()
    worker.join(timeout=120)
    (prof,) = done
    assert prof.refused and prof.error == prof.refused and "\n" not in prof.error
    assert "not profiled (the training went on)" in prof.error
    assert not list((tmp_path / "none").glob("*.pt.trace.json.gz"))
    rec = json.loads((tmp_path / "none" / "run.json").read_text())
    assert rec["steps_run"] == 10 and rec["error"] == prof.error
    assert rec["profile_cost"]["recorded_steps"] == 0
    with pytest.raises(CaptureError, match="not profiled"):
        prof.diagnosis  # noqa: B018


def _cell_loop(out: Path, steps: int):
    """tests/scripts/cell_loop.py's loop (time_sequence_prediction's shape: a recurrent cell
    stepped by hand, tens of thousands of tiny ops a step) under torchtriage.profile."""
    import runpy

    import torchtriage

    train = runpy.run_path(str(SCRIPTS / "cell_loop.py"), run_name="cell_loop")["train"]
    with torchtriage.profile(out) as prof:
        train(steps, on_step=prof.step)
    return prof


def test_a_step_too_large_for_memory_is_recorded_in_part_and_said_so(tmp_path, monkeypatch):
    """A step whose profiler memory alone passes its share: the window is its first seconds
    (the probed step's time scaled to what fits), stopped mid-step on the main thread; the
    trace holds that part, the diagnosis says so and is at most medium, and training goes on."""
    import gzip

    from torchtriage.diagnosis import thresholds as th

    monkeypatch.setenv("TORCHTRIAGE_MEMORY_LIMIT", "40MiB")
    prof = _cell_loop(tmp_path / "slice", 8)
    cost = prof.cost
    assert cost.events_per_step * th.PROFILE_BYTES_PER_EVENT.value > 20 * 2**20, cost
    assert cost.slice_s > 0 and cost.recorded_steps == 1 and "recorded (about" in cost.action
    assert cost.dropped == ["record_shapes", "profile_memory"]
    events = json.loads(gzip.decompress(prof.trace_path.read_bytes()))["traceEvents"]
    # part of one step: how large a part depends on how fast the recorded step runs against the
    # probed one (a loaded machine runs either slower), so only "less than the whole" is pinned.
    # A probe cut part-way (probe_cut) counted a lower bound of the step's events, so the
    # trace is then held to its slice's time instead (a CI run recorded 19,796 events against
    # the cut probe's 16,894)
    if not cost.probe_cut:
        assert len(events) < cost.events_per_step, (len(events), cost)
    ops = [e for e in events if e.get("ph") == "X"]
    span_s = (max(e["ts"] + e.get("dur", 0) for e in ops) - min(e["ts"] for e in ops)) / 1e6
    assert span_s < 4 * cost.slice_s + 0.05, (span_s, cost)
    d = prof.diagnosis
    (part,) = [f for f in d.findings if f.id == "capture.step_slice"]
    assert f"first {cost.slice_s:g} s of one step" in part.message
    assert d.confidence != "high" and d.trace.steps_analyzed == [2]
    rec = json.loads((tmp_path / "slice" / "run.json").read_text())
    assert rec["steps_run"] == 8 and rec["error"] is None and rec["profile_cost"]["slice_s"] > 0


_PROBE_INSIDE_A_RANGE = """
import sys
import torch
from torch.autograd.profiler import record_function
from torchtriage.capture.session import ProfileSession

x = torch.randn(32, 32, requires_grad=True)
for i in range(int(sys.argv[2])):
    session = ProfileSession(f"{sys.argv[1]}/{i}", analyze=False, wait=1,
                             warmup=int(sys.argv[3]), active=2)
    session.__enter__()
    for _ in range(5):
        # the step hook runs inside the optimizer step's own range, as torchtriage run's does
        with record_function("Optimizer.step#SGD.step"):
            for _ in range(10):
                (x @ x).sum().backward()
            session.step()
    session.__exit__(None, None, None)
print("ok")
"""


@pytest.mark.parametrize("warmup", [2, 0])
def test_the_probe_and_the_window_never_change_hands_inside_one_range(tmp_path, warmup):
    """A profiler stopped and another started inside one record_function range (the
    optimizer step's, where `run` steps the session) crashed the training process now and
    then with SIGSEGV: the range's exit wrote into the stopped profiler's freed events. Many
    sessions in a row, each probed, must all finish."""
    proc = subprocess.run([sys.executable, "-c", _PROBE_INSIDE_A_RANGE, str(tmp_path), "25",
                           str(warmup)], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
    traces = sorted(tmp_path.glob("*/*.pt.trace.json.gz"))
    assert len(traces) == 25


def test_run_checks_the_window_the_cost_guard_shortened(tmp_path):
    """Under `torchtriage run` the steady-state check times the window that was recorded."""
    import os

    from torchtriage.capture.runner import BOOTSTRAP

    out = tmp_path / "run"
    config = {"out": str(out), "max_events": 1000}
    env = {**os.environ, "TORCHTRIAGE_RUN": json.dumps(config),
           "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), str(REPO / "src")])}
    proc = subprocess.run([sys.executable, str(SCRIPTS / "closure_regression.py"),
                           "--max-iter", "3", "--steps", "16", "--width", "32"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "torchtriage: one step records about" in proc.stderr
    rec = record(out)
    assert rec["profile_cost"]["recorded_steps"] == 2  # 2 active; the warm-up step prepared
    # a loaded machine may find the first window unsteady and profile again: each window
    # recorded, a retry included, keeps the shortened length
    windows = rec["windows"]
    assert windows and all(w["last_step"] - w["first_step"] + 1 == 2 for w in windows), windows
    doc = diagnosis(out) if (out / "diagnosis.json").exists() else None
    assert doc is None or len(doc["trace"]["steps_analyzed"]) == 2


def test_the_probe_stops_mid_step_once_the_process_grew_by_the_memory_share(
        tmp_path, monkeypatch):
    """The probe's memory watch: once the process has grown by the share (here: at once, the
    watch's reading of resident memory made to say so), the probe is stopped part-way through
    its step on the main thread, its events are a lower bound, and the window is a slice."""
    from torchtriage.capture import cost_probe

    whole = _cell_loop(tmp_path / "whole", 3).cost.events_per_step
    readings = iter(range(0, 10**15, 2**40))  # +1 TiB at each reading after the first
    monkeypatch.setattr(cost_probe, "resident_bytes", lambda: next(readings))
    monkeypatch.setenv("TORCHTRIAGE_MEMORY_LIMIT", "8GiB")
    prof = _cell_loop(tmp_path / "cut", 8)
    cost = prof.cost
    assert cost.probe_cut and 0 < cost.events_per_step < whole, (cost, whole)
    assert cost.slice_s > 0 and cost.recorded_steps == 1 and "at least" in cost.action
    # the finding says so when the cut came first; on a loaded machine the probed step can be
    # slower than the recorded one, which then ends (and is saved whole) before slice_s
    sliced = "capture.step_slice" in [f.id for f in prof.diagnosis.findings]
    assert sliced == prof._sliced, (sliced, prof._sliced, cost)


def test_run_records_a_step_too_large_for_memory_in_part(tmp_path):
    """`torchtriage run` on the same shape of script: a verdict from the first part of one
    step, the finding that says so, and the run record's slice."""
    import os

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stop-after-window",
         "--", sys.executable, str(SCRIPTS / "cell_loop.py"), "30"],
        env={**os.environ, "TORCHTRIAGE_MEMORY_LIMIT": "40MiB"}, capture_output=True,
        text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "capture.step_slice" in [f["id"] for f in diagnosis(out)["findings"]]
    assert "The window is the first" in proc.stdout
    rec = record(out)
    assert rec["profile_cost"]["slice_s"] > 0 and rec["profile_cost"]["recorded_steps"] == 1


# --- the Dataset as the slow part of the input pipeline --------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_dataset_is_named_with_its_time_per_sample(tmp_path, workers):
    """__getitem__ busy for 2 ms per sample: timed in the training process (num_workers=0) or
    in the workers, and named as the slow part of the loading layer."""
    _, out = run(tmp_path, "--", "python", str(SCRIPTS / "slow_getitem.py"), "--workers",
                 str(workers), "--getitem-ms", "2", "--steps", "30")
    doc = diagnosis(out)
    assert doc["primary"] == "data_loading"
    per_sample = evidence(doc, "dataset_getitem_ms_per_sample")
    assert 2.0 <= per_sample < 20.0, per_sample  # at least the busy wait; a loaded machine adds
    finding = next(f for f in doc["findings"] if f["id"] == "data_loading.dataset")
    assert finding["message"].startswith(f"Dataset.__getitem__ {per_sample:.2f} ms/sample")
    where = "in the DataLoader's 2 workers" if workers else "in the training process"
    assert where in finding["message"]


def test_a_window_without_new_worker_totals_takes_the_totals_up_to_its_end():
    """Workers rewrite their totals every 50 ms: a 5-step window of 10 ms steps could see no
    new ones (the figure was missing from 1 run in 4 of the test above); the totals up to the
    window's end stand in, marked as such, and the finding says so."""
    from torchtriage.capture.dataset import DatasetTotals, window_figures
    from torchtriage.diagnosis.dataset import dataset_verdict

    start = DatasetTotals(fetches=6, samples=48, getitem_s=0.1, collate_s=0.006, processes=2,
                          workers=True)
    later = DatasetTotals(fetches=10, samples=80, getitem_s=0.18, collate_s=0.01, processes=2,
                          workers=True)
    window = window_figures(start, later)
    assert window["over"] == "window" and window["fetches"] == 4
    assert window["getitem_ms_per_sample"] == 2.5  # 80 ms over 32 samples
    run = window_figures(start, start)
    assert run["over"] == "run" and run["fetches"] == 6
    assert window_figures(DatasetTotals(), DatasetTotals()) is None  # nothing fetched yet
    message = dataset_verdict(run, loading_share=0.9)[1][0].message
    assert "in 2 DataLoader worker(s), over the fetches before the window's end" in message
    assert "before the window" not in dataset_verdict(window, loading_share=0.9)[1][0].message


def test_dataset_figures_name_the_larger_part():
    from torchtriage.diagnosis.dataset import dataset_verdict

    meta = {"getitem_ms_per_sample": 0.05, "collate_ms_per_batch": 9.0,
            "samples_per_batch": 16, "fetches": 5, "processes": 1, "where": "training process"}
    evidence_, findings = dataset_verdict(meta, loading_share=0.5)
    assert [f.id for f in findings] == ["data_loading.collate"]
    assert next(e for e in evidence_ if e.metric == "dataset_getitem_share").fired is False
    assert dataset_verdict(meta, loading_share=0.01)[1] == []  # loading is not significant
    assert dataset_verdict(None, 0.5) == ([], []) and dataset_verdict({"x": 1}, 0.5) == ([], [])


def test_the_window_names_the_workers_that_fetched_in_it_not_every_epochs():
    """A DataLoader without persistent workers starts new ones each epoch: timm's resnet50 on
    an H200, 4 workers and a window in the second epoch, was said to load "in 8 DataLoader
    worker(s)". The window counts the workers whose totals grew in it and names their
    DataLoader's num_workers."""
    from torchtriage.capture.dataset import DatasetTotals, window_figures

    def totals(fetches: dict[str, int]) -> DatasetTotals:
        n = sum(fetches.values())
        return DatasetTotals(fetches=n, samples=8 * n, getitem_s=0.01 * n, collate_s=0.001 * n,
                             processes=len(fetches), workers=True, num_workers=4,
                             by_process={name: (k, 4) for name, k in fetches.items()})

    epoch0 = {f"rank0.{pid}.json": 10 for pid in (1, 2, 3, 4)}
    start = totals({**epoch0, **{f"rank0.{pid}.json": 2 for pid in (5, 6, 7, 8)}})
    end = totals({**epoch0, **{f"rank0.{pid}.json": 4 for pid in (5, 6, 7, 8)}})
    window = window_figures(start, end)
    assert (window["processes"], window["num_workers"], window["fetches"]) == (4, 4, 8)
    assert window_figures(end, end)["processes"] == 8  # the run's: every worker that fetched


def test_more_workers_names_how_many_the_loader_has_and_the_cores(tmp_path):
    """A loader whose 4 workers do not keep up, on a machine where the job may use 16 cores:
    the recipe says 8 (twice as many, at most one per core) and that it has 4 now, instead of
    the catalog's generic `num_workers=4`."""
    from conftest import profiler_steps, write_trace, x

    from torchtriage.diagnosis.diagnose import diagnose
    from torchtriage.trace import load_trace

    def body(b):
        return [x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", b, 8_000,
                  cat="user_annotation"), x("aten::mm", b + 8_100, 1_500)]

    dataset = {"over": "window", "getitem_ms_per_sample": 6.9, "collate_ms_per_batch": 60.0,
               "samples_per_batch": 128, "fetches": 5, "processes": 4, "where": "workers",
               "num_workers": 4}
    trace = load_trace(write_trace(tmp_path / "t.json", profiler_steps(6, body),
                                   torchtriage={"dataset": dataset}))
    machine = {"samples": 9, "cores": 16, "cpu_busy_mean": 0.26, "cpu_busy_per_core": [0.26],
               "rss_max_bytes": 1, "child_processes": 4, "children_cpu_cores_mean": 3.6,
               "job_cpu_cores_mean": 4.0, "job_processes": 5}
    d = diagnose(trace, machine=machine)
    (fix,) = [p for p in d.prescriptions if p.id == "dataloader.num_workers"]
    assert fix.code == ("DataLoader(dataset, batch_size=..., num_workers=8)  # now 4, at most "
                        "one per core: 16"), fix.code
    assert fix.reason == ("its 4 workers do not keep up with the training loop (the job's "
                          "processes use 4.0 of the 16 cores it may use)"), fix.reason
    finding = next(f for f in d.findings if f.id == "data_loading.dataset")
    assert "in the DataLoader's 4 workers" in finding.message, finding.message
    # without the Dataset timing (a trace from elsewhere): the catalog's recipe
    plain = diagnose(load_trace(write_trace(tmp_path / "p.json", profiler_steps(6, body))))
    (fix,) = [p for p in plain.prescriptions if p.id == "dataloader.num_workers"]
    assert "# try 2..cores" in fix.code and fix.reason.startswith("the workers do not keep up")


def test_a_window_that_outpaced_its_loader_names_data_loading(tmp_path):
    """pytorch/examples' mnist on an H200: after the checks saw its queue drain, the window's
    steps (median 5.7 ms) still ran faster than its one worker loads a batch (9.0 ms): they drew
    on batches prepared before. The window said host at 71 %; fix's trials then measured
    10.4 ms per step, and 4 workers made it 2.56x faster. The workers' timing in the window
    decides: loading per batch over the workers past loader_outpaced times the median step
    names data_loading, with the branch and its comparison."""
    from conftest import profiler_steps, write_trace, x

    from torchtriage.diagnosis import thresholds as th
    from torchtriage.diagnosis.diagnose import diagnose
    from torchtriage.trace import load_trace

    def body(b, wait_us=1_000):  # 10 ms steps: waiting for the loader, then compute
        return [x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", b, wait_us,
                  cat="user_annotation"), x("aten::mm", b + wait_us + 50, 9_900 - wait_us)]

    def verdict(wait_us=1_000, **dataset):
        meta = {"over": "window", "getitem_ms_per_sample": 0.2, "collate_ms_per_batch": 0.5,
                "samples_per_batch": 64, "fetches": 5, "processes": 1, "where": "workers",
                "num_workers": 1, **dataset}
        name = f"t{len(list(tmp_path.iterdir()))}.json"
        steps = profiler_steps(6, lambda b: body(b, wait_us))
        return diagnose(load_trace(write_trace(tmp_path / name, steps,
                                               torchtriage={"dataset": meta})))

    d = verdict()  # 13.3 ms per batch, one worker: 1.48x the 9 ms a step does besides waiting
    assert d.primary == "data_loading" and d.primary_rule.rule == "loader_outpaced", d.summary
    (ratio,) = d.primary_rule.evidence
    assert (ratio.metric, ratio.value, ratio.threshold) == (
        "loader_period_over_step_work", 1.4778, th.LOADER_OUTPACED.value)
    assert "1 worker(s) load a batch every 13.3 ms at best, 1.48x the 9.0 ms" in \
        d.primary_rule.reason
    # confidence from the loader's pace, not the window's shares (kernel 89 % there): a
    # steady-state step would wait 32 % of its time, 12 points past the boundary's 20 %
    margin = next(e for e in d.layers["data_loading"].evidence
                  if e.metric == "loader_wait_share_over_boundary")
    assert margin.value == pytest.approx(0.1233, abs=1e-3) and d.confidence == "medium"
    assert verdict(getitem_ms_per_sample=0.3).confidence == "high"  # 2.19x: 34 points
    # as in the H200 runs of session 15: a 10 ms step that waits 3.5 ms for a worker that
    # needs 11.4 ms a batch is 1.14x the step (which let it pass) but 1.75x its other work
    late = verdict(wait_us=3_500, getitem_ms_per_sample=0.17)
    assert late.primary == "data_loading" and late.primary_rule.rule == "loader_outpaced"
    assert late.primary_rule.evidence[0].value == pytest.approx(11.38 / 6.5, abs=0.01)
    assert d.prescriptions[0].id == "dataloader.num_workers"
    # two workers feed a step every 6.65 ms: the window's compute decides
    assert verdict(num_workers=2, processes=2).primary == "kernel"
    # timings over the run, not the window, or fetched in the training process: not used
    assert verdict(over="run").primary == "kernel"
    assert verdict(where="training process").primary == "kernel"
