"""Verification: bootstrap statistics, loss parity, the run store, compare and the A/B harness."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchtriage.errors import TorchtriageError
from torchtriage.verify.parity import check_parity, eager_random_parity
from torchtriage.verify.stats import Speedup, outlier_trial, speedup_interval, verdict
from torchtriage.verify.store import RunStore

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"
TINY = str(SCRIPTS / "tiny_loop.py")


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchtriage", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


# --- statistics ---------------------------------------------------------------------------

def test_exact_halving_is_faster_with_a_tight_interval():
    s = speedup_interval([[100.0] * 6] * 3, [[50.0] * 6] * 3, statistic="mean")
    assert (s.speedup, s.ci_low, s.ci_high) == (2.0, 2.0, 2.0)
    assert verdict(s) == "faster"


def test_trials_not_steps_are_the_unit_for_throughput():
    # Alternating fast/slow steps (two DataLoader workers) with identical window means: the
    # trial-level interval is tight even though single steps vary 5x.
    b = [[20.0, 100.0] * 3 for _ in range(3)]
    s = speedup_interval([[120.0] * 6] * 3, b, statistic="mean")
    assert s.speedup == pytest.approx(2.0)
    assert s.ci_low == pytest.approx(2.0) and s.ci_high == pytest.approx(2.0)


@pytest.mark.parametrize(("low", "high", "expected"), [
    (1.03, 1.2, "faster"), (1.01, 1.2, "no_change"), (0.97, 1.03, "no_change"),
    (0.8, 0.97, "slower"), (0.8, 0.99, "no_change"),
])
def test_verdict_needs_the_whole_interval_past_the_minimum_effect(low, high, expected):
    s = Speedup(speedup=(low + high) / 2, ci_low=low, ci_high=high, a_ms=1, b_ms=1,
                statistic="mean", confidence=0.95)
    assert verdict(s, min_effect=0.02) == expected


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(1, 1e3), min_size=3, max_size=12), st.floats(0.01, 100))
def test_interval_does_not_depend_on_the_time_unit(steps, scale):
    a = [steps, steps[::-1]]
    b = [[x * 0.9 for x in steps], steps]
    s1 = speedup_interval(a, b)
    s2 = speedup_interval([[x * scale for x in t] for t in a],
                          [[x * scale for x in t] for t in b])
    assert s1.speedup == pytest.approx(s2.speedup)
    assert s1.ci_low == pytest.approx(s2.ci_low) and s1.ci_high == pytest.approx(s2.ci_high)
    assert s1.ci_low <= s1.ci_high


def test_noisy_identical_arms_are_no_change():
    rng = np.random.default_rng(3)
    a = [list(100 + rng.normal(0, 3, 10)) for _ in range(5)]
    b = [list(100 + rng.normal(0, 3, 10)) for _ in range(5)]
    s = speedup_interval(a, b, statistic="mean")
    assert s.ci_low < 1 < s.ci_high and verdict(s) == "no_change"


# --- parity -------------------------------------------------------------------------------

def test_parity_passes_identical_losses_and_fails_changed_ones():
    base = [[2.0, 1.5, 1.2, 1.0]] * 2
    assert check_parity(base, base, {}).status == "pass"
    changed = check_parity(base, [[2.0, 1.6, 1.3, 1.1]], {"optimizer.fused": True})
    assert changed.status == "fail" and changed.max_deviation > changed.tolerance


def test_a_random_aligned_pair_decides_a_compiled_comparison_that_failed():
    """verify.parity: a deviation the aligned pair does not repeat came from compiled code's
    random stream (pass, reference eager_random, the first deviation kept); one it repeats is
    the math (the failure stands and says so); a pair without losses changes nothing."""
    base, dropout_masks = [[2.0, 1.5, 1.2, 1.0]] * 2, [[2.1, 1.4, 1.25, 0.97]] * 2
    knobs = {"compile.mode": "default"}
    first = check_parity(base, dropout_masks, knobs)
    assert first.status == "fail"
    passed = eager_random_parity(first, base[0], [2.0, 1.5, 1.2, 1.0001], knobs)
    assert (passed.status, passed.reference, passed.precision) == ("pass", "eager_random",
                                                                   "compiled")
    assert passed.unaligned_deviation == first.max_deviation and passed.max_deviation < 1e-3
    assert "fallback_random" in passed.detail
    math = eager_random_parity(first, base[0], [2.1, 1.4, 1.25, 0.97], knobs)
    assert math.status == "fail" and math.max_deviation == first.max_deviation
    assert "the math changed" in math.detail
    nothing = eager_random_parity(first, base[0], [], knobs)
    assert nothing.status == "fail" and "could not be compared" in nothing.detail


def test_parity_tolerance_follows_precision():
    base = [[2.0, 1.5, 1.2, 1.0]]
    off_by_2pc = [[2.0, 1.53, 1.22, 1.02]]
    assert check_parity(base, off_by_2pc, {}).status == "fail"
    low = check_parity(base, off_by_2pc, {"amp.bf16": True})
    assert low.status == "pass" and low.precision == "low"
    assert check_parity(base, off_by_2pc, {"compile.mode": "default"}).precision == "compiled"


def test_parity_widens_for_a_nondeterministic_baseline():
    base = [[2.0, 1.5, 1.2], [2.1, 1.6, 1.1]]
    p = check_parity(base, [[2.05, 1.55, 1.15]], {})
    assert p.status == "pass" and p.tolerance > 1e-3 and "differ" in p.detail


def test_parity_judges_a_knob_that_reseeds_workers_against_its_worker_seed_spread():
    """num_workers moves a seeded script's augmentation draws into worker streams: the
    candidate's trials under different worker seeds set the reference, and a real change of
    results still fails against it."""
    base = [[2.0, 1.5, 1.2, 1.0]] * 3  # seeded: identical baseline runs
    reseeded = [[2.03, 1.47, 1.22, 0.98], [1.97, 1.53, 1.17, 1.02], [2.01, 1.49, 1.21, 1.01]]
    knobs = {"dataloader.num_workers": 2}
    plain = check_parity(base, reseeded, knobs)
    assert plain.status == "fail" and plain.reference == "tolerance"
    p = check_parity(base, reseeded, knobs, reseeded=True)
    assert p.status == "pass" and p.reference == "worker_seeds", p
    assert p.worker_seed_spread > 0 and p.tolerance > 1e-3 and "worker seeds" in p.detail
    # the same spread around losses 0.3 higher (~20 %): not a change of random streams
    shifted = [[x + 0.3 for x in t] for t in reseeded]
    worse = check_parity(base, shifted, knobs, reseeded=True)
    assert worse.status == "fail" and worse.reference == "worker_seeds"
    # a Dataset that draws nothing random: identical trials, the plain tolerance stands
    same = check_parity(base, [[2.0, 1.6, 1.2, 1.0]] * 2, knobs, reseeded=True)
    assert same.status == "fail" and same.reference == "tolerance"


def test_which_knobs_reseed_the_workers_comes_from_the_registry():
    from torchtriage.diagnosis.knobs import reseeds_workers

    assert reseeds_workers({"dataloader.num_workers": 2})
    assert reseeds_workers({"memory.grad_accumulation": 2})
    assert not reseeds_workers({"memory.grad_accumulation": 1})  # inert: batches unchanged
    assert not reseeds_workers({"optimizer.fused": True, "dataloader.prefetch_factor": 4})


def test_parity_without_losses_or_with_divergence():
    assert check_parity([[]], [[1.0]], {}).status == "unchecked"
    assert check_parity([[1.0, 1.0]], [[1.0, float("nan")]], {}).status == "fail"


# --- store --------------------------------------------------------------------------------

def test_store_round_trip_and_interrupted_runs(tmp_path):
    store = RunStore(tmp_path / "s.sqlite")
    run_id = store.start_run("ab", ["python", "x.py"], knobs={"k": 1}, out_dir=tmp_path)
    store.add_trial(run_id, "A", 1, "ok", time.time(), {"step_ms": [1.0]})
    assert store.run(run_id).status == "running"  # this process is alive
    store.finish_run(run_id, "done", "faster", {"schema": "x"})
    row = store.run(run_id)
    assert (row.status, row.summary, row.result, row.knobs) == ("done", "faster",
                                                               {"schema": "x"}, {"k": 1})
    assert store.trials(run_id)[0]["step_ms"] == [1.0]
    # a run whose process is gone reads back as interrupted
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        db.execute("UPDATE runs SET status='running', pid=? WHERE id=?", (2**22 + 7, run_id))
    assert store.run(run_id).status == "interrupted"


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_text("not a database at all, just text" * 100), "cannot use run store"),
    (lambda p: sqlite3.connect(p).execute("CREATE TABLE other (x)").connection.commit(),
     "not a torchtriage run store"),
    (lambda p: sqlite3.connect(p).execute("PRAGMA user_version=99").connection.commit(),
     "newer torchtriage"),
])
def test_store_bad_paths_are_one_line_errors(tmp_path, make, message):
    path = tmp_path / "store.sqlite"
    make(path)
    with pytest.raises(TorchtriageError, match=message):
        RunStore(path)
    proc = cli("history", "--store", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_history_and_show_errors():
    assert "no runs recorded yet" in cli("history").stdout
    proc = cli("show", "42")
    assert proc.returncode == 2 and "no run 42" in proc.stderr
    proc = cli("history", "--kind", "nope")
    assert proc.returncode == 2 and "--kind takes one of" in proc.stderr


# --- compare ------------------------------------------------------------------------------

def _step_trace(path: Path, step_ms: list[float]) -> Path:
    from conftest import write_trace, x

    events, ts = [], 0.0
    for n, ms in enumerate(step_ms, 1):
        events += [x(f"ProfilerStep#{n}", ts, ms * 1e3), x("aten::mm", ts + 10, ms * 1e3 - 20)]
        ts += ms * 1e3
    return write_trace(path, events)


def test_compare_survives_one_slow_step_and_reports_it(tmp_path):
    """Before -> after a DataLoader fix: 4 of 5 "after" steps 14x faster, the first slow while
    the workers started. A bootstrap of medians over 5 steps alone says no_change."""
    from torchtriage.verify.compare import compare

    before = [87.1, 88.0, 86.9, 87.4, 87.9]
    after = [92.0, 6.3, 6.2, 6.35, 6.28]
    naive = speedup_interval([before], [after])
    assert verdict(naive) == "no_change"  # what a plain bootstrap of medians says
    c = compare(_step_trace(tmp_path / "a.json", before), _step_trace(tmp_path / "b.json", after))
    assert c.verdict == "faster" and c.ci_low > 10
    assert c.b.outlier_steps and not c.a.outlier_steps
    assert c.b.step_ms[0] == 92.0  # kept in the document, set aside from the statistic
    assert "set aside as outlier" in c.summary
    # alternating steps (two workers) are bimodal, not contaminated: nothing is set aside
    c = compare(_step_trace(tmp_path / "c.json", [10, 20] * 4),
                _step_trace(tmp_path / "d.json", [10, 20] * 4))
    assert not c.a.outlier_steps and c.verdict == "no_change"


def test_compare_resnet_pair_attributes_the_drop_to_data_loading(shared_traces):
    base = shared_traces / "kineto" / "resnet50_num_workers_0"
    fixed = shared_traces / "kineto" / "resnet50_num_workers_4"
    proc = cli("compare", str(base), str(fixed), "--json")
    assert proc.returncode == 0, proc.stderr
    c = json.loads(proc.stdout)
    assert c["schema"] == "torchtriage.compare/1"
    assert c["verdict"] == "faster" and c["speedup"] > 1.3 and c["ci_low"] > 1
    top = c["deltas"][0]
    assert top["category"] == "data_loading" and top["delta_ms"] < 0
    assert set(top) >= {"category", "a_ms", "b_ms", "delta_ms"}
    assert [abs(d["delta_ms"]) for d in c["deltas"]] == sorted(
        (abs(d["delta_ms"]) for d in c["deltas"]), reverse=True)
    # most of the drop: the data-loading saving exceeds the whole drop in mean step time
    assert -top["delta_ms"] > -sum(d["delta_ms"] for d in c["deltas"])
    assert min(c["layer_deltas"], key=c["layer_deltas"].get) == "data_loading"
    assert c["ops"][0]["name"].startswith("enumerate(DataLoader)")
    # stored, and shown again from the store
    (run,) = json.loads(cli("history", "--json").stdout)
    assert run["kind"] == "compare" and run["id"] == c["store_id"]
    shown = cli("show", str(run["id"]), "--json")
    assert json.loads(shown.stdout)["speedup"] == c["speedup"]
    assert "data_loading" in cli("show", str(run["id"])).stdout


def test_fail_on_regression_gate(shared_traces):
    base = shared_traces / "kineto" / "resnet50_num_workers_4"
    slower = shared_traces / "kineto" / "resnet50_num_workers_0"
    proc = cli("compare", str(base), str(slower), "--fail-on-regression", "5%")
    assert proc.returncode == 1 and "regression" in proc.stderr
    assert cli("compare", str(base), str(slower), "--fail-on-regression", "60%").returncode == 0
    assert cli("compare", str(slower), str(base), "--fail-on-regression", "5%").returncode == 0
    same = cli("compare", str(base), str(base), "--fail-on-regression", "1%")
    assert same.returncode == 0 and "no significant change" in same.stdout
    bad = cli("compare", str(base), str(base), "--fail-on-regression", "lots")
    assert bad.returncode == 2 and "percentage" in bad.stderr


def test_runs_are_recorded_and_run_dirs_compare_with_loss_parity(tmp_path):
    for name, extra in (("base", []), ("scaled", ["--scale", "3"])):
        proc = cli("run", "--out", str(tmp_path / name), "--steps", "12", "--", "python",
                   TINY, *extra)
        assert proc.returncode == 0, proc.stderr
    runs = json.loads(cli("history", "--kind", "run", "--json").stdout)
    assert [r["status"] for r in runs] == ["done", "done"]
    assert "bottleneck" in runs[0]["summary"]
    assert "Bottleneck" in cli("show", str(runs[0]["id"])).stdout
    c = json.loads(cli("compare", str(tmp_path / "base"), str(tmp_path / "scaled"),
                       "--json").stdout)
    assert c["parity"]["status"] == "fail" and "Losses differ" in c["summary"]


def test_schema_command_prints_each_document():
    for document in ("diagnosis", "job", "compare", "ab"):
        proc = cli("schema", document)
        assert proc.returncode == 0 and json.loads(proc.stdout)["$id"].startswith(
            f"torchtriage.{document}/")
    bad = cli("schema", "nope")
    assert bad.returncode == 2 and "unknown document" in bad.stderr


def test_compare_bad_inputs(tmp_path):
    proc = cli("compare", str(tmp_path / "missing"), str(tmp_path))
    assert proc.returncode == 2 and "no such file" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- the A/B harness ----------------------------------------------------------------------

def ab(tmp_path: Path, *args: str, out: str = "ab", timeout: int = 300):
    proc = cli("ab", "--out", str(tmp_path / out), *args, timeout=timeout)
    path = tmp_path / out / "ab.json"
    return proc, (json.loads(path.read_text()) if path.exists() else None)


def test_ab_says_when_the_script_ends_before_the_steps_asked(tmp_path):
    """tiny_loop.py runs 50 steps: after 3 warm-up steps (and the interval of the first) 47 are
    measured, not the 100 asked; the trials, the summary and the JSON say so."""
    proc, result = ab(tmp_path, "--trials", "2", "--steps", "100", "--", "python", TINY)
    assert proc.returncode == 0, proc.stderr
    assert (result["steps"], result["steps_measured"]) == (100, 47)
    assert "Only 47 of the 100 steps asked were measured per trial" in result["summary"]
    assert all(t["error"] == "ended after 50 steps: 47 of 100 measured"
               for t in result["trials"])
    assert "47 measured steps of the 100 asked" in proc.stdout


@pytest.mark.timing
@pytest.mark.paired("sleep")
def test_ab_more_dataloader_workers_is_faster(tmp_path):
    page = tmp_path / "ab.html"
    proc, result = ab(tmp_path, "--knob", "dataloader.num_workers=2", "--trials", "3",
                      "--steps", "6", "--html", str(page), "--", "python",
                      "examples/data_starved.py", "--steps", "100")
    assert proc.returncode == 0, proc.stderr
    assert result["verdict"] == "faster" and result["ci_low"] > 1, result["summary"]
    html = page.read_text()
    assert 'id="trials"' in html and 'id="parity"' in html and "faster" in html
    assert result["parity"]["status"] == "pass"
    assert result["knobs"]["dataloader.num_workers"]["applied"]
    arms = [t["arm"] for t in result["trials"]]
    assert arms == ["A", "B", "B", "A", "A", "B"]  # interleaved, ABBA
    assert all(len(t["step_ms"]) >= 6 for t in result["trials"])  # more: trial_min_measure_s
    # B's 2 workers keep 2 x 2 batches in flight: its measured window starts after they drain
    assert {t["arm"]: t["warmup_steps"] for t in result["trials"]} == {"A": 3, "B": 3 + 4}
    lines = (tmp_path / "ab" / "trials.jsonl").read_text().splitlines()
    assert len(lines) == 6
    assert json.loads(cli("show", str(result["store_id"]), "--json").stdout)["verdict"] \
        == "faster"


@pytest.mark.parametrize("means, expected", [
    ([163, 166, 300], 2),  # a third trial run while another job loaded the machine
    ([300, 163, 166, 170], 0),
    ([100, 104, 112], None),  # ordinary trial noise
    ([100, 100.5, 110], None),  # two close trials do not make a 10 % third an outlier
    ([35, 53, 175], 2),  # 4x the others' median, which agree within 1.5x
    ([35, 60, 120], None),  # the others disagree too much to judge by
    ([100, 180], None),  # two trials: nothing to judge by
    ([100, 100, 149], None),  # under outlier_trial_ratio
    # word_language_model on a loaded machine: the one fast trial is the clean one, the two
    # that agree were both disturbed; nothing is set aside (it set A1 aside: "6.62x faster")
    ([102.0, 898.0, 610.0], None),
    ([60, 100, 104], None),  # faster than its siblings: never the disturbed one
])
def test_outlier_trial_needs_agreeing_siblings_and_a_large_gap(means, expected):
    assert outlier_trial(means) == expected


@pytest.mark.timing
def test_ab_of_a_no_op_knob_replaces_a_disturbed_trial_and_says_so(tmp_path):
    marker = tmp_path / "first-run"
    proc, result = ab(tmp_path, "--knob", "cudnn.benchmark=true", "--trials", "3",
                      "--warmup", "2", "--steps", "4", "--", "python", TINY, "--steps", "200",
                      "--sleep-ms", "40", "--slow-first-run", str(marker))
    assert proc.returncode == 0, proc.stderr
    assert result["outlier_trials"] == ["A1"], result["trials"]
    assert [t["arm"] + str(t["idx"]) for t in result["trials"]] == \
        ["A1", "B1", "B2", "A2", "A3", "B3", "A4"]  # A1 is replaced
    assert result["a"]["trials_ok"] == 3 and result["a"]["mean_step_ms"] < 100
    # 4 steps of ~45 ms are too short a measurement: each trial ran on to trial_min_measure_s
    for t in result["trials"]:
        assert len(t["step_ms"]) >= 4 and sum(t["step_ms"]) >= 1000, t["step_ms"]
    assert all(len(t["step_ms"]) > 4 for t in result["trials"] if not t["outlier"])
    assert result["verdict"] == "no_change", result["summary"]
    assert "Trial A1" in result["summary"] and "outlier" in result["summary"]


def test_ab_a_fix_that_changes_results_is_not_a_win(tmp_path):
    proc, result = ab(tmp_path, "--trials", "2", "--steps", "4", "--candidate",
                      f"python {TINY} --scale 3", "--", "python", TINY)
    assert proc.returncode == 0, proc.stderr
    assert result["verdict"] == "changes_results" and result["parity"]["status"] == "fail"


def test_ab_of_compiling_a_model_with_dropout_judges_parity_with_eager_random_draws(tmp_path):
    """Inductor draws dropout's masks from its own stream: the compiled candidate's losses
    part from the eager baseline's at once (0.49 here) though the math is the same. ab then
    runs one trial per arm with torch._inductor.config.fallback_random and judges by them."""
    proc, result = ab(tmp_path, "--trials", "2", "--steps", "4", "--knob", "compile.mode=default",
                      "--", "python", TINY, "--dropout", "0.2")
    assert proc.returncode == 0, proc.stderr
    parity = result["parity"]
    assert parity["status"] == "pass" and parity["reference"] == "eager_random", parity
    assert parity["unaligned_deviation"] > parity["tolerance"] >= parity["max_deviation"]
    assert result["verdict"] != "changes_results", result["summary"]
    for arm in "AB":  # the pair ran, with its own logs, and is not a trial of the interval
        assert (tmp_path / "ab" / "trials" / f"eager_random_{arm}" / "output.log").exists()
    assert len(result["trials"]) == 4
    assert "fallback_random" in proc.stdout


def test_ab_candidate_crash_is_a_failed_trial_not_a_traceback(tmp_path):
    proc, result = ab(tmp_path, "--trials", "2", "--steps", "4", "--candidate",
                      f"python {TINY} --crash", "--", "python", TINY)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "the candidate did not complete a trial" in proc.stderr
    assert result["verdict"] == "failed"
    failed = [t for t in result["trials"] if t["arm"] == "B"]
    assert len(failed) == 1 and failed[0]["status"] == "failed"  # not retried
    assert "boom" in failed[0]["error"]


def test_ab_out_of_memory_candidate_is_an_oom_trial(tmp_path):
    proc, result = ab(tmp_path, "--trials", "2", "--steps", "4", "--candidate",
                      f"python {TINY} --oom-at 5", "--", "python", TINY)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (oom,) = [t for t in result["trials"] if t["arm"] == "B"]
    assert oom["status"] == "oom" and "OutOfMemoryError" in oom["error"]


def test_ab_of_an_out_of_memory_baseline_asks_whether_the_candidate_fits(tmp_path):
    """Verifying an out-of-memory fix: A runs out of memory on step 2 in its one trial (not
    retried), B (2 micro-batches of 8, the same 16 samples per optimizer step) completes its
    trials with the baseline's first loss; the verdict is `fits`, exit 0. (A candidate of
    batch 8 without accumulation fits too, but its losses part: `changes_results`.)"""
    oom = str(SCRIPTS / "oom_loader.py")
    proc, result = ab(tmp_path, "--trials", "2", "--steps", "4", "--knob",
                      "memory.grad_accumulation=2", "--", "python", oom)
    assert proc.returncode == 0, proc.stderr
    assert result["verdict"] == "fits" and result["speedup"] is None, result["summary"]
    assert [(t["arm"], t["status"]) for t in result["trials"]] == \
        [("A", "oom"), ("B", "ok"), ("B", "ok")]
    assert result["trials"][0]["losses"], "the step the baseline completed"
    assert result["b"]["trials_ok"] == 2 and result["parity"]["status"] == "pass"
    assert result["summary"].startswith("fits: the baseline ran out of memory in 1 of 1")
    assert "steps/s" in result["summary"] and "fits" in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--", "python", TINY, "--crash"], "the baseline failed"),
    (["--", "python", TINY, "--steps", "3"], "a trial needs 3 warm-up"),
    (["--knob", "nope=1", "--", "python", TINY], "unknown knob"),
    (["--", "no-such-command-xyz"], "command not found"),
    ([], "no command to run"),
    (["--trials", "1", "--", "python", TINY], "--trials"),
])
def test_ab_bad_inputs_are_one_line_errors(tmp_path, args, message):
    proc, _ = ab(tmp_path, "--steps", "4", *args)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_ab_unseeded_script_widens_the_parity_tolerance(tmp_path):
    proc, result = ab(tmp_path, "--trials", "2", "--steps", "4", "--",
                      "python", TINY, "--unseeded")
    assert proc.returncode == 0, proc.stderr
    assert result["parity"]["status"] == "pass" and "differ" in result["parity"]["detail"]


def test_ab_of_num_workers_on_a_seeded_augmenting_script_keeps_parity(tmp_path):
    """A seeded script with random per-sample augmentation: more workers change which random
    numbers each sample gets, not the math. The candidate's trials run under different worker
    seeds (their losses differ), the baseline's are identical, and parity is judged against the
    candidate's own spread (it failed at 1e-3 before)."""
    proc, result = ab(tmp_path, "--trials", "2", "--steps", "12", "--min-measure-s", "0", "--knob",
                      "dataloader.num_workers=2", "--", "python",
                      str(SCRIPTS / "augmented_loader.py"), "--delay-ms", "0.5")
    assert proc.returncode == 0, proc.stderr
    parity = result["parity"]
    assert parity["status"] == "pass" and parity["reference"] == "worker_seeds", parity
    assert result["verdict"] != "changes_results"
    losses = {arm: [tuple(t["losses"][:10]) for t in result["trials"] if t["arm"] == arm]
              for arm in "AB"}
    assert len(set(losses["A"])) == 1 and len(set(losses["B"])) == len(losses["B"]) >= 2
    assert "worker seeds" in proc.stdout


def test_sigkill_mid_run_leaves_every_completed_trial_in_the_store(tmp_path, run_store):
    out = tmp_path / "ab"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchtriage", "ab", "--out", str(out), "--trials", "5",
         "--steps", "4", "--min-measure-s", "0", "--json", "--", "python", TINY,
         "--sleep-ms", "200"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            if run_store.exists():
                try:  # the file exists a moment before its tables do
                    with sqlite3.connect(run_store) as db:
                        if db.execute("SELECT COUNT(*) FROM trials").fetchone()[0] >= 2:
                            break
                except sqlite3.OperationalError:
                    pass
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    store = RunStore(run_store)
    (run,) = store.runs()
    assert run.kind == "ab" and run.status == "interrupted"
    trials = store.trials(run.id)
    on_disk = (out / "trials.jsonl").read_text().splitlines()
    # the store commits first: a kill between the two leaves trials.jsonl one trial behind
    assert len(trials) >= 2 and len(on_disk) <= len(trials) <= len(on_disk) + 1
    # 4 steps at least; 4 x 200 ms is under trial_min_measure_s, so the trial ran on
    assert all(t["status"] == "ok" and len(t["step_ms"]) >= 4 for t in trials)
    history = cli("history")
    assert "interrupted" in history.stdout
    shown = cli("show", str(run.id))
    assert shown.returncode == 2 and "completed trial(s) are stored" in shown.stderr


def test_a_run_record_with_a_diverged_loss_reads_back_and_fails_parity():
    """JSON has no NaN: a diverged step's loss is written null and read back as NaN."""
    import math

    from torchtriage.results.run import LossPoint, RunRecord, decode_record

    record = RunRecord(losses=[LossPoint(0, 2.0), LossPoint(1, math.nan)])
    back = decode_record(record.to_json())
    assert back.loss_values[0] == 2.0 and math.isnan(back.loss_values[1])
    parity = check_parity([[2.0, 1.9]], [back.loss_values], {})
    assert parity.status == "fail" and "diverged" in parity.detail


def test_earlier_trials_from_another_load_period_are_set_aside(tmp_path):
    """fix's final A/B starts from trials measured earlier (the original's, the kept
    configuration's). When an arm's first fresh trial lies far outside its earlier trials'
    range, the machine's load changed since: comparing one arm's earlier trials with the
    other's later ones would measure the load. They are all set aside, and fresh trials of
    both arms decide (before: the 10 s earlier steps made the no-op candidate 'faster')."""
    from torchtriage.results.ab import Trial
    from torchtriage.verify.ab import run_ab
    from torchtriage.verify.settings import TrialSettings

    def earlier(arm: str, step_ms: float) -> list[Trial]:
        return [Trial(arm=arm, idx=i, status="ok", returncode=0, wall_s=5.0,
                      step_ms=[step_ms] * 5, mean_step_ms=step_ms, steps_per_s=1e3 / step_ms,
                      losses=[]) for i in (1, 2)]

    # not adaptive: a loaded CI worker once measured the no-op candidate 7x slower in its
    # first trial, and the adaptive stop for a far slower candidate left one trial an arm
    result = run_ab([sys.executable, TINY], tmp_path / "final",
                    TrialSettings(trials=2, warmup=3, steps=5), knobs={},
                    prior={"A": earlier("A", 10_000.0), "B": earlier("B", 5_000.0)},
                    min_fresh=2)
    assert result.reused_set_aside and "load changed" in result.reused_set_aside
    assert not any(t.reused for t in result.trials)
    # (an arm whose trial is set aside as an outlier runs one more, so the counts may differ)
    assert min(result.a.trials_ok, result.b.trials_ok) >= 2
    # the arms are the fresh trials' (~1 ms steps), not the 10 s and 5 s earlier ones that
    # made the no-op candidate 'faster' (its verdict on fresh trials depends on the machine's
    # load, so it is not asserted: a loaded CI worker once measured 2.4x)
    assert result.a.mean_step_ms < 1000 and result.b.mean_step_ms < 1000, result.summary
    # earlier trials that fill both arms still leave min_fresh fresh ones (before: none ran)
    again = run_ab([sys.executable, TINY], tmp_path / "again",
                   TrialSettings(trials=2, warmup=3, steps=5), knobs={}, adaptive=True,
                   prior={arm: [t for t in result.trials if t.arm == arm][:2]
                          for arm in ("A", "B")}, min_fresh=2)
    for arm in ("A", "B"):
        assert any(t.arm == arm and not t.reused for t in again.trials), again.trials
