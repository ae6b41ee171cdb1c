"""`torchtriage fix`: the closed loop on real scripts, the memory ladder, the patch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchtriage.capture.machine import cpu_bf16_flags
from torchtriage.fix.patch import make_patch

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"
TINY = str(SCRIPTS / "tiny_loop.py")


def fix(tmp_path: Path, *args: str, cwd: Path = REPO, timeout: int = 600):
    out = tmp_path / "fix"
    proc = subprocess.run([sys.executable, "-m", "torchtriage", "fix", "--out", str(out),
                           *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    path = out / "fix.json"
    return proc, (json.loads(path.read_text()) if path.exists() else None), out


@pytest.mark.timing
@pytest.mark.paired("sleep")
def test_fix_data_starved_searches_workers_keeps_the_best_and_writes_a_patch(tmp_path):
    # a copy of the example, so that the patch can be applied for real
    work = tmp_path / "work"
    (work / "examples").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "data_starved.py", work / "examples")
    page = tmp_path / "fix.html"
    # --only: the loop ends once the num_workers search (a profile, 2 A/Bs) and its profile
    # again are done (~63 s on 2 cores), whose result this test checks; the budget is only a
    # bound. Bounded by a 90 s budget instead, it went on to prefetch_factor and
    # persistent_workers (91 s, none of them asserted on), and with the default 10m to bf16
    # and two compile modes too (~210 s).
    proc, result, out = fix(tmp_path, "--budget", "4m", "--trials", "3", "--steps", "6",
                            "--only", "dataloader.num_workers",
                            "--html", str(page), "--", "python", "examples/data_starved.py",
                            "--steps", "1000", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert result["schema"] == "torchtriage.fix/1"
    first = result["steps"][0]
    assert first["prescription"] == "dataloader.num_workers" and first["result"] == "kept"
    assert [a["value"] for a in first["attempts"]][:2] == [2, 4]  # a search, not one guess
    assert all(a["speedup"] is not None for a in first["attempts"])
    assert result["kept"][0]["knob"] == "dataloader.num_workers"
    # a search resumed from a later profile only goes on up: fewer workers than the kept
    # value were measured slower already
    for later in result["steps"][1:]:
        assert all(a["value"] > first["kept_value"] for a in later["attempts"]), later
    assert result["stopped_because"].startswith(
        "nothing left to try among --only dataloader.num_workers"), result["stopped_because"]
    assert {s["prescription"] for s in result["steps"]} == {"dataloader.num_workers"}
    assert result["ci_low"] > 1.5, result["summary"]
    assert result["rounds"][0]["primary"] == "data_loading"
    # the patch applies and sets the kept value where the DataLoader's comes from: the
    # script's --num-workers flag, which still overrides it
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "apply", str(out / "fix.patch")], cwd=work, check=True)
    patched = (work / "examples" / "data_starved.py").read_text()
    value = result["kept"][0]["value"]
    assert f'parser.add_argument("--num-workers", type=int, default={value})' in patched
    assert "num_workers=num_workers," in patched
    report = (out / "fix.md").read_text()
    assert "dataloader.num_workers" in report and "```diff" in report
    html = page.read_text()  # the path taken, with each attempt's interval, and the patch
    assert 'id="path"' in html and '"error_y"' in html and "num_workers=" in html
    # and again from the run directory
    assert subprocess.run([sys.executable, "-m", "torchtriage", "report", str(out)],
                          cwd=work).returncode == 0
    assert 'id="path"' in (out / "report.html").read_text()
    # in the store, and shown again
    runs = json.loads(subprocess.run([sys.executable, "-m", "torchtriage", "history",
                                      "--kind", "fix", "--json"], capture_output=True,
                                     text=True, cwd=work).stdout)
    assert runs and runs[0]["status"] == "done"


@pytest.mark.timing
@pytest.mark.paired("sleep")
def test_fix_notices_a_profile_its_own_trials_contradict_and_profiles_again(tmp_path):
    """The Dataset slows down 50x after 60 steps: long after the profile's window and its
    check, but before the A/B trials' 10 measured steps (after 60 warm-up steps). The first
    A/B's baseline trials then measure a slower job than the profile saw; the round says so
    and the next profile starts after step 70. --only ends the loop once the worker search
    and that second profile are done (54 s on 2 cores; bounded by a 75 s budget instead it
    went on with the loading layer's other knobs until the budget's end); the budget leaves
    room for the second profile beside the final A/B's reserve on a loaded machine (50 s did
    not, in a CI run: 'the budget is spent' before the second round)."""
    proc, result, out = fix(tmp_path, "--budget", "3m", "--trials", "2", "--warmup", "60",
                            "--steps", "10", "--only", "dataloader.num_workers", "--",
                            "python", str(SCRIPTS / "late_loader.py"), "400", "60")
    assert proc.returncode == 0, proc.stderr
    first = result["rounds"][0]
    assert first["window_agrees"] is False, first
    assert first["trials_step_ms"] > 1.25 * first["median_step_ms"]
    said = proc.stdout + proc.stderr
    assert "disagree" in said and "profiling again after step" in said, said
    assert len(result["rounds"]) == 2  # profiled again, from after the trials' steps
    record = json.loads((out / "profiles" / "1-round1" / "run.rank0.json").read_text())
    assert record["windows"][0]["skipped_steps"] >= 70, record["windows"]
    assert "window disagrees" in (out / "fix.md").read_text()


@pytest.mark.timing
@pytest.mark.paired("cpu")
def test_fix_compute_bound_keeps_nothing_unproven_and_says_why(tmp_path):
    # The fewest steps a trial takes (2 warm-up + 3 measured): without native bf16 a bf16
    # trial runs >10x slower per step (seconds a step here). The budget fits bf16's A/B,
    # which is tried when 5 x the first profile's time fits (a profile over 9 s, on a busy
    # machine, left 45 s too little: "skipped"), and never a compile mode's (4 trials and
    # 2 x 45 s of estimated compilation), so the loop does no more than it did with 45 s.
    proc, result, _ = fix(tmp_path, "--budget", "90s", "--trials", "3", "--warmup", "2",
                          "--steps", "3", "--", "python", "examples/compute_bound.py",
                          "--steps", "1000")
    assert proc.returncode == 0, proc.stderr
    assert result["rounds"][0]["primary"] == "kernel"
    for step in result["steps"]:
        assert step["why"] or step["attempts"], step
        if step["result"] != "kept":
            assert step["kept_value"] is None
    kept = [s for s in result["steps"] if s["result"] == "kept"]
    assert all(a["verdict"] == "faster" for s in kept for a in s["attempts"][-1:])
    results = {s["prescription"]: s for s in result["steps"]}
    bf16 = results.get("amp.bf16")
    if not cpu_bf16_flags():
        # no native bf16 on this CPU: bf16 is not prescribed, so it is never tried
        assert bf16 is None or not bf16["attempts"], bf16
    elif bf16 is not None and bf16["attempts"]:
        # native bf16 (AVX-512 BF16 / AMX): tried, kept only when measured faster (above),
        # else dropped with the numbers
        assert bf16["result"] in ("kept", "dropped"), bf16
        if bf16["result"] == "dropped":
            assert bf16["attempts"][-1]["note"], bf16
    # the budget is honoured and named as the reason
    assert result["elapsed_s"] < 90 + 30
    assert "budget" in result["stopped_because"] or "proven" in result["stopped_because"]
    short = [s for s in result["steps"] if "not tried: it needs" in s["why"]]
    if short and "budget" in result["stopped_because"]:
        # the stop names the A/B that did not fit and the --budget that would have
        said = re.search(r"before (\S+) could be tried \(--budget (\d+)m would fit its A/B\)",
                         result["stopped_because"])
        assert said, result["stopped_because"]
        assert said[1] in short[0]["why"] and int(said[2]) * 60 > 90, result["stopped_because"]
        assert f"--budget {said[2]}m" in proc.stdout
    assert "kernel" in proc.stdout


# The ladder's tests stop after it (--layers memory): the ladder profiles each rung and
# judges it by memory and loss parity, not speed, so they are not `timing` tests.
MEMORY_ONLY = ("--layers", "memory", "--min-measure-s", "0")


def test_memory_ladder_takes_the_cheapest_rung_that_fits(tmp_path):
    proc, result, _ = fix(tmp_path, *MEMORY_ONLY, "--budget", "60s", "--device-memory", "67MiB",
                          "--", "python", "examples/memory_pressure.py", "--steps", "1000",
                          "--batch-size", "4096")  # a quarter of the example's batch: ~95 %
    assert proc.returncode == 0, proc.stderr
    assert result["rounds"][0]["primary"] == "memory"
    ladder = [s for s in result["steps"] if s["layer"] == "memory"]
    assert [s["prescription"] for s in ladder][:2] == ["memory.grad_accumulation",
                                                       "memory.activation_checkpointing"]
    # memory_pressure.py builds its batches without a DataLoader: nothing to split
    assert ladder[0]["result"] == "not_applicable"
    assert "no DataLoader" in ladder[0]["why"]
    # known from the original run's record: the rung was not profiled to find out
    assert not list((tmp_path / "fix" / "profiles").glob("*grad_accumulation*"))
    rung = ladder[1]
    assert rung["result"] == "kept", rung
    before, after = result["rounds"][0]["peak_fraction"], rung["attempts"][0]["peak_fraction"]
    assert after < before and after < 0.9
    assert not any(s["prescription"] in ("memory.bf16", "memory.fsdp") for s in ladder)
    # then the kernel layer's fixes are not tried: --layers memory
    assert result["stopped_because"] == "the kernel layer is not among --layers memory"
    assert [s for s in result["steps"] if s["layer"] != "memory"] == []
    assert result["kept"][0] == {"knob": "memory.activation_checkpointing", "value": True}


def test_memory_ladder_splits_dataloader_batches_before_anything_dearer(tmp_path):
    # peak ~69 MB of a 72 MiB pretend device (92 %); 2 micro-batches: ~43 MB
    proc, result, _ = fix(tmp_path, *MEMORY_ONLY, "--budget", "60s", "--device-memory", "72MiB",
                          "--",
                          "python", str(SCRIPTS / "memory_loader.py"), "--steps", "1000")
    assert proc.returncode == 0, proc.stderr
    assert result["rounds"][0]["primary"] == "memory"
    ladder = [s for s in result["steps"] if s["layer"] == "memory"]
    assert ladder[0]["prescription"] == "memory.grad_accumulation"
    assert ladder[0]["result"] == "kept", ladder[0]
    assert ladder[0]["kept_value"] == 2
    attempt = ladder[0]["attempts"][0]
    assert attempt["peak_fraction"] < 0.75 and attempt["parity"] == "pass"
    assert len(ladder) == 1  # checkpointing, bf16 and FSDP never tried
    assert result["kept"][0] == {"knob": "memory.grad_accumulation", "value": 2}
    assert any("batch_size" in line and "accumulate" in line for line in result["instructions"])


def test_memory_ladder_shards_a_state_heavy_ddp_job_when_nothing_cheaper_fits(tmp_path):
    """A DDP job whose parameters, gradients and Adam state fill a 140 MiB stand-in device
    (2 gloo ranks): accumulation cannot apply (no DataLoader), checkpointing and bf16
    activations do not lower the peak; sharding the state with FSDP2 in DDP's place does, with
    DDP's losses (61-63 % of the device against DDP's 93 %). FSDP2 frees its gloo buffers on
    gloo's threads, which the profiler does not record: the peak is taken step by step from
    what is alive after the window (before, it climbed with the missed frees and peaked at
    91-98 % on 2 ranks, up to 104 % on 4, as the machine's load decided which thread freed
    them; the FSDP2 gradients were also counted twice)."""
    proc, result, _ = fix(tmp_path, *MEMORY_ONLY, "--budget", "6m", "--device-memory",
                          "140MiB", "--", "torchrun", "--nproc_per_node=2",
                          str(SCRIPTS / "ddp_state_heavy.py"), "--steps", "1000",
                          "--blocks", "24", "--width", "296")
    assert proc.returncode == 0, proc.stderr
    before = result["rounds"][0]
    assert before["primary"] == "memory" and before["peak_fraction"] >= 0.9, before
    ladder = {s["prescription"]: s for s in result["steps"] if s["layer"] == "memory"}
    assert ladder["memory.grad_accumulation"]["result"] == "not_applicable"
    assert ladder["memory.activation_checkpointing"]["result"] == "does_not_fit"
    assert ladder["memory.bf16"]["result"] in ("does_not_fit", "dropped")
    rung = ladder["memory.fsdp"]
    assert rung["result"] == "kept", rung
    attempt = rung["attempts"][0]
    assert attempt["parity"] == "pass" and attempt["peak_fraction"] < 0.8, attempt
    assert result["kept"] == [{"knob": "memory.fsdp", "value": True}]
    assert any("fully_shard" in line for line in result["instructions"])


def test_a_rung_that_moves_random_draws_into_workers_is_judged_by_their_spread():
    """Gradient accumulation under DataLoader workers hands each micro-batch to another
    worker: a seeded script's augmentation changes. When the rung's losses part from the
    original's, the ladder profiles it once more under other worker seeds and judges it by the
    spread of the two (the runs here stand in for profiles: the decision is the ladder's)."""
    from types import SimpleNamespace

    from torchtriage.fix import ladder

    def diagnosis(primary: str, peak: float):
        return SimpleNamespace(primary=primary, memory=[SimpleNamespace(peak_fraction=peak)],
                               breakdown=SimpleNamespace(median_step_ms=10.0))

    original = [2.0, 1.5, 1.2, 1.0, 0.9]
    draws = {0: [2.03, 1.47, 1.22, 0.98, 0.91], 1: [1.97, 1.53, 1.17, 1.02, 0.88]}
    calls = []

    def profile(knobs, label, *, seed_offset=0):
        calls.append((label, seed_offset))
        return diagnosis("kernel", 0.6), list(draws[seed_offset]), False, {}

    steps, kept, _ = ladder.climb(profile, {}, 0, diagnosis("memory", 0.95), original)
    assert kept == {"memory.grad_accumulation": 2}, steps
    assert calls == [("memory.grad_accumulation=2", 0), ("memory.grad_accumulation=2-seed1", 1)]
    assert steps[0].attempts[0].parity == "pass"
    # losses far from both draws: dropped, with the worker-seed reference named
    draws = {0: [x + 0.5 for x in draws[0]], 1: [x + 0.5 for x in draws[1]]}
    steps, kept, _ = ladder.climb(profile, {}, 0, diagnosis("memory", 0.95), original)
    assert kept is None or "memory.grad_accumulation" not in kept
    dropped = steps[0]
    assert dropped.result == "dropped" and "worker seeds" in dropped.why, dropped


def test_an_original_that_runs_out_of_memory_starts_the_ladder(tmp_path):
    """Out of memory on step 2, before any profile: the ladder's starting point, not an
    error. Half the batch fits, so the cheapest rung completes with loss parity."""
    proc, result, _ = fix(tmp_path, *MEMORY_ONLY, "--budget", "45s", "--", "python",
                          str(SCRIPTS / "oom_loader.py"), "--at", "2")
    assert proc.returncode == 0, proc.stderr
    first = result["rounds"][0]
    assert first["primary"] == "memory" and result["original_out_of_memory"]["step"] == 2
    rung = next(s for s in result["steps"] if s["layer"] == "memory")
    assert (rung["prescription"], rung["result"], rung["kept_value"]) == (
        "memory.grad_accumulation", "kept", 2), rung
    assert rung["attempts"][0]["parity"] == "pass"
    assert result["kept"][0] == {"knob": "memory.grad_accumulation", "value": 2}
    assert result["final_steps_per_s"] > 0
    # the ladder's rung first; the loop may keep more after it (a fused optimizer, say)
    assert result["summary"].startswith("the original ran out of memory on step 2; with "
                                        "memory.grad_accumulation=2"), result["summary"]
    assert " it completes: " in result["summary"]
    assert (tmp_path / "fix" / "profiles" / "0-original" / "diagnosis.json").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["--budget", "soon", "--", "python", TINY], "--budget takes a duration"),
    (["--budget", "-5m", "--", "python", TINY], "--budget must be positive"),
    (["--only", "dataloader.numworkers", "--", "python", TINY],
     "'dataloader.numworkers' is not a prescription or knob fix can try (did you mean "
     "dataloader.num_workers?)"),
    (["--only", "", "--", "python", TINY], "is not a prescription or knob fix can try"),
    ([], "no command to run"),
    (["--", "python", "-c", "print('no training here')"], "recorded no training step"),
])
def test_fix_bad_inputs(tmp_path, args, message):
    proc, _, _ = fix(tmp_path, *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


IMAGENET = """import argparse
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument('-j', '--workers', default=4, type=int, metavar='N',
                    help='number of data loading workers (default: 4)')
parser.add_argument('--prefetch', type=int)
WORKERS_FOR_VAL = 0


def main(args, train_dataset, val_dataset, extra, *, eval_workers=1):
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=256, shuffle=True,
        num_workers=args.workers, pin_memory=True)
    val_loader = torch.utils.data.DataLoader(val_dataset, num_workers=WORKERS_FOR_VAL)
    eval_loader = torch.utils.data.DataLoader(val_dataset, num_workers=eval_workers)
    auto = torch.utils.data.DataLoader(val_dataset, num_workers=min(8, os.cpu_count()))
    opts = torch.utils.data.DataLoader(val_dataset, **extra)
    pre = torch.utils.data.DataLoader(val_dataset, num_workers=1,
                                      prefetch_factor=args.prefetch)
    return train_loader, val_loader, eval_loader, auto, opts, pre
"""


def test_patch_keeps_the_scripts_own_flags(tmp_path):
    """pytorch/examples imagenet: `num_workers=args.workers` with `-j/--workers`. Hard-coding
    the kept value into the call silently disabled the flag; the patch sets the flag's default
    (and a variable's assignment, a parameter's default) instead, and says what it left."""
    from torchtriage.results.run import KnobOutcome

    script = tmp_path / "main.py"
    script.write_text(IMAGENET)
    calls = {"train": 15, "val": 17, "eval": 18, "auto": 19, "opts": 20}
    outcomes = {"dataloader.num_workers": KnobOutcome(
        value=8, applied=True, detail="DataLoader",
        where=[f"{script}:{line}" for line in calls.values()]),
        "dataloader.prefetch_factor": KnobOutcome(value=4, applied=True, detail="DataLoader",
                                                  where=[f"{script}:22"])}
    patch = make_patch({"dataloader.num_workers": 8, "dataloader.prefetch_factor": 4},
                       outcomes, ["python", "main.py"], tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(patch.diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    text = script.read_text()
    compile(text, "main.py", "exec")
    assert "parser.add_argument('-j', '--workers', default=8, type=int" in text
    assert "num_workers=args.workers, pin_memory=True)" in text  # the flag still decides
    assert "WORKERS_FOR_VAL = 8" in text and "num_workers=WORKERS_FOR_VAL)" in text
    assert "*, eval_workers=8):" in text and "num_workers=eval_workers)" in text
    assert "num_workers=min(8, os.cpu_count()))" in text  # an expression is left alone
    assert "(val_dataset, **extra)" in text  # no keyword next to **kwargs that may hold it
    assert "parser.add_argument('--prefetch', type=int, default=4)" in text
    said = "\n".join(patch.instructions)
    assert "-j/--workers (line 7), so that the flag still overrides it" in said
    assert "comes from `min(8, os.cpu_count())`; set it to 8 there" in said
    assert "takes **keyword arguments, which may hold num_workers" in said


def test_the_workers_search_counts_the_cores_the_job_may_use(tmp_path):
    """A job limited to 1.5 cores (cgroup quota) on a bigger machine: the search's per-core
    bound is the quota's, not os.cpu_count()."""
    from conftest import write_trace, x

    from torchtriage.diagnosis.diagnose import diagnose
    from torchtriage.fix.candidates import machine_context
    from torchtriage.trace import load_trace

    events = []
    for i in range(4):
        base = i * 10_000.0
        events += [x(f"ProfilerStep#{i + 1}", base, 10_000, cat="user_annotation"),
                   x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base,
                     8_000, cat="user_annotation"), x("aten::mm", base + 8_100, 1_500)]
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    machine = {"samples": 5, "cores": 64, "cpu_busy_mean": 0.1, "cpu_busy_per_core": [],
               "rss_max_bytes": 1, "child_processes": 0, "children_cpu_cores_mean": 0.0,
               "job_cpu_cores_mean": 0.9, "cores_available": 1.5,
               "cores_available_source": "cgroup CPU quota"}
    assert machine_context({}, diagnose(trace, machine=machine)).cores == 1
    assert machine_context({}, diagnose(trace)).cores == (os.cpu_count() or 1)


def test_patch_edits_calls_and_adds_flags(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader\n\n"
        "def main(ds, model):\n"
        "    loader = DataLoader(ds, batch_size=8,\n"
        "                        num_workers=0)\n"
        "    opt = torch.optim.AdamW(model.parameters(), lr=1e-3,)\n"
        "    return loader, opt\n")
    from torchtriage.results.run import KnobOutcome

    def outcome(where: str, detail: str) -> KnobOutcome:
        return KnobOutcome(value=None, applied=True, detail=detail, where=[where])

    outcomes = {
        "dataloader.num_workers": outcome(f"{script}:5", "DataLoader"),
        "dataloader.pin_memory": outcome(f"{script}:6", "DataLoader"),
        "optimizer.fused": outcome(f"{script}:7", "AdamW(fused=True) at x"),
    }
    kept = {"dataloader.num_workers": 4, "dataloader.pin_memory": True,
            "optimizer.fused": True, "matmul.tf32": True, "amp.bf16": True}
    patch = make_patch(kept, outcomes, ["python", "train.py"], tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(patch.diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    text = script.read_text()
    assert "num_workers=4, pin_memory=True)" in text
    assert "lr=1e-3, fused=True)" in text
    assert "torch.backends.cuda.matmul.allow_tf32 = True" in text
    compile(text, "train.py", "exec")
    assert any("autocast" in line for line in patch.instructions)


def _loop_for_order_tests(tmp_path: Path, outcomes: dict[str, str]):
    """A fix loop whose A/B searches are replaced by given outcomes (the searches themselves
    are covered by the end-to-end tests above); records the order of the searches."""
    from torchtriage.fix.budget import Budget
    from torchtriage.fix.loop import FixSettings, _Loop
    from torchtriage.verify.settings import TrialSettings

    settings = FixSettings(trial=TrialSettings(trials=3, warmup=3, steps=10, min_effect=0.02))
    loop = _Loop(["python", TINY], tmp_path, Budget(600), settings, None)
    order: list[str] = []

    def search(search, layer, round_no):
        order.append(f"{search.prescription}:{search.knob}")
        outcome = outcomes.get(search.knob, "dropped")
        if outcome == "kept":
            loop._keep({search.knob: search.values[0]})
        return outcome, {"kept": "faster", "dropped": "no_change"}.get(outcome, outcome)

    loop._search = search
    return loop, order


def _diagnosis(primary: str, prescriptions: list[tuple[str, str]], gpu: bool = True):
    from types import SimpleNamespace as NS

    return NS(primary=primary, trace=NS(mode="gpu" if gpu else "cpu", world_size=1),
              collectives=[], prescriptions=[NS(id=i, layer=layer, code="...")
                                             for i, layer in prescriptions],
              breakdown=NS(steps=[], median_step_ms=0.0), layers={})


def test_loop_falls_back_to_foreach_then_to_the_runner_up_layer(tmp_path):
    loop, order = _loop_for_order_tests(tmp_path, {"matmul.tf32": "kept"})
    diagnosis = _diagnosis("host", [("optimizer.fused", "host"), ("sync.remove", "host"),
                                    ("matmul.tf32", "kernel")])
    assert loop._govern(diagnosis) == ""
    # fused, then its foreach fallback, then (host proven nothing) the kernel layer
    assert order == ["optimizer.fused:optimizer.fused", "optimizer.fused:optimizer.foreach",
                     "matmul.tf32:matmul.tf32"]
    assert [s.result for s in loop.fix_steps] == ["not_injectable"]
    assert loop.fix_steps[0].why.startswith("needs a code change: ")  # the diagnosis's code
    # after a kept fix, a no_change prescription is tried once more, then never again
    assert loop._eligible("optimizer.fused") and not loop._eligible("matmul.tf32")
    assert loop._govern(diagnosis).startswith("no host")
    assert not loop._eligible("optimizer.fused") and not loop._eligible("sync.remove")
    assert loop._govern(diagnosis) == "nothing left to try for the host or kernel layer"


def test_loop_skips_the_foreach_fallback_when_the_optimizer_runs_foreach_already(tmp_path):
    """The trace's optimizer runs aten::_foreach_* ops (CUDA's default): foreach=True would
    change nothing, so after fused keeps nothing the loop moves on."""
    from types import SimpleNamespace as NS

    from torchtriage.diagnosis.rules.host import MULTI_TENSOR_OPS

    loop, order = _loop_for_order_tests(tmp_path, {})
    diagnosis = _diagnosis("host", [("optimizer.fused", "host"),
                                    ("compile.reduce_overhead", "host")])
    diagnosis.layers = {"host": NS(evidence=[NS(metric=MULTI_TENSOR_OPS, value=8.0)])}
    loop._govern(diagnosis)
    assert order[:2] == ["optimizer.fused:optimizer.fused",
                         "compile.reduce_overhead:compile.mode"]


def test_loop_never_injects_a_change_of_effective_batch(tmp_path):
    loop, order = _loop_for_order_tests(tmp_path, {})
    diagnosis = _diagnosis("communication", [("ddp.grad_accumulation", "communication")])
    assert loop._govern(diagnosis) == "nothing left to try for the communication layer"
    assert order == [] and "effective batch" in loop.fix_steps[0].why


def test_a_promising_but_unclear_ab_gets_a_second_look_before_the_search_moves_on(tmp_path):
    """num_workers=2 measured 1.52x [1.01-2.44]: `no_change` on few trials, not evidence of no
    effect. The same A/B runs again with twice the trials (the first look's reused) at a
    Bonferroni-tightened 97.5 %, and the search goes on when it is then clear."""
    from types import SimpleNamespace as NS

    from torchtriage.fix.budget import Budget
    from torchtriage.fix.candidates import Search
    from torchtriage.fix.loop import FixSettings, _Loop
    from torchtriage.verify.settings import TrialSettings

    settings = FixSettings(trial=TrialSettings(trials=3, warmup=3, steps=10, min_effect=0.02))
    loop = _Loop(["python", TINY], tmp_path, Budget(600), settings, None)
    calls = []

    def result(verdict, speedup, low, high, trials):
        return NS(verdict=verdict, speedup=speedup, ci_low=low, ci_high=high, trials=trials,
                  knobs={}, parity=NS(status="pass", max_deviation=None, tolerance=1e-3,
                                 reference="tolerance"),
                  summary="", startup=None, out="ab")

    def fake_ab(knobs, label, *, settings=None, prior=None, min_fresh=0):
        calls.append((knobs, settings, prior, min_fresh))
        value = knobs["dataloader.num_workers"]
        trial = NS(arm="B", status="ok", reused=False, compile=None, wall_s=1.0)
        if value == 2 and settings is None:
            return result("no_change", 1.52, 1.01, 2.44, [trial])
        if value == 2:
            return result("faster", 1.61, 1.35, 1.9, [trial])
        return result("no_change", 1.01, 0.95, 1.06, [trial])

    loop._ab = fake_ab
    outcome, verdict = loop._search(Search("dataloader.num_workers", "dataloader.num_workers",
                                           (2, 4)), "data_loading", 0)
    assert (outcome, verdict) == ("kept", "no_change")  # 2 kept, then 4 no better
    second = calls[1]
    assert second[1].trials == 6 and second[1].confidence == pytest.approx(0.975)
    assert second[2]["B"] and second[3] == 2
    assert loop.kept == {"dataloader.num_workers": 2}
    assert len(calls) == 3  # 4 after 2 was kept; its plain no_change gets no second look


def test_the_worker_search_starts_where_the_trace_points():
    from torchtriage.diagnosis.knobs import search_values, served, workers_to_hide_loading

    # a Python tokenizer in the training process: 130 of 145 ms per step is loading
    assert workers_to_hide_loading(130.0, 145.0, 0) == 10
    # -j 4 still loading-bound at 100 ms steps of which 40 ms compute: 4 x 100 / 40 + 1
    assert workers_to_hide_loading(60.0, 100.0, 4) == 11
    assert workers_to_hide_loading(0.0, 100.0, 0) is None
    _, serves = served("dataloader.num_workers")
    assert search_values(serves, cores=16, nccl=False, workers_hint=10) == (10, 20, 32)
    # 21 predicted on 16 cores: 15 first (one core for the training process), then more
    assert search_values(serves, cores=16, nccl=False, workers_hint=21) == (15, 30, 32)
    assert search_values(serves, cores=16, nccl=False) == (2, 4, 8, 16, 32)
    assert search_values(serves, cores=2, nccl=False, workers_hint=40) == (2, 4)


def test_the_fix_report_names_a_fallback_knob_apart_from_its_prescription():
    """optimizer.fused's foreach fallback is a second step under the same prescription: its
    values are named with their knob, so the table does not read as fused tried twice."""
    from torchtriage.report.fix_view import fix_markdown
    from torchtriage.results.fix import Attempt, FixResult, FixStep

    steps = [FixStep(round=2, layer="host", prescription="optimizer.fused", knob=knob,
                     result="dropped", why="", attempts=[Attempt(value=True,
                                                                 verdict="no_change",
                                                                 note=note)])
             for knob, note in (("optimizer.fused", "no_change 1.02x"),
                                ("optimizer.foreach", "no_change 1.00x"))]
    result = FixResult(summary="kept nothing", command=["python", "x.py"], kept=[],
                       speedup=None, ci_low=None, ci_high=None, verdict=None,
                       original_steps_per_s=None, final_steps_per_s=None, steps=steps,
                       rounds=[], stopped_because="the budget is spent", budget_s=60.0,
                       elapsed_s=60.0, trials_run=6, out="x")
    text = fix_markdown(result)
    assert "| `optimizer.fused` | dropped | True: no\\_change 1.02x |" in text
    assert "| `optimizer.fused` | dropped | optimizer.foreach=True: no\\_change 1.00x |" in text


@pytest.mark.parametrize(("verdict", "speedup", "confirmed"), [
    ("faster", 1.8, True), ("no_change", 0.49, False), ("slower", 0.7, False)])
def test_the_summary_never_calls_an_unconfirmed_final_configuration_faster(verdict, speedup,
                                                                          confirmed):
    """Seen on word_language_model: compile won its own A/B (6.62x [1.53-22.81] on a busy
    machine) and the final A/B against the original said 0.49x, no_change; the summary read
    "0.49x faster than the original"."""
    from torchtriage.fix.summary import fix_summary as _summary
    from torchtriage.results.fix import FixResult

    r = FixResult(summary="", command=["python", "main.py"],
                  kept=[{"knob": "compile.mode", "value": "default"}], speedup=speedup,
                  ci_low=speedup * 0.8, ci_high=speedup * 1.2, verdict=verdict, steps=[],
                  rounds=[], stopped_because="the budget is spent", budget_s=240,
                  elapsed_s=230, trials_run=9)
    text = _summary(r)
    assert ("faster than the original" in text) == confirmed, text
    assert confirmed or "does not confirm a gain" in text


def test_the_budget_keeps_the_final_ab_in_reserve():
    """An A/B starts only when its trials and the final A/B's fresh ones fit; a profile round
    likewise; the final A/B's trials start before the budget's end, or within their own
    estimate when the loop already ran over (imagenet on an H200: 158 s of a 120 s budget,
    the final A/B unbounded)."""
    from torchtriage.fix.budget import FINAL_FRESH, Budget

    budget = Budget(100.0)
    budget.start -= 49.5  # 49.5 s spent
    budget.trial_s = [10.0] * 4
    assert budget.reserve_s == FINAL_FRESH * 10.0 == 20.0
    assert budget.allows(3) == (True, 30.0)  # 49.5 + 30 + 20 <= 100
    assert budget.allows(4) == (False, 40.0)
    budget.profile_s = 30.0
    assert budget.allows_profile()
    budget.profile_s = 31.0
    assert not budget.allows_profile()
    assert budget.final_deadline() == pytest.approx(budget.start + 100.0)
    budget.start -= 60  # 109.5 s spent: the final A/B still gets its two trials
    now = time.monotonic()
    assert now + 20.0 <= budget.final_deadline() <= time.monotonic() + 20.0


def test_a_first_profile_longer_than_the_budget_is_stopped_at_its_end(tmp_path):
    """A script of 5-second steps needs about a minute to reach the end of its profiling
    window; `fix --budget 15s` ran it all (no timeout bounded a profile run) and only then
    found the budget spent. The profile now stops at the budget's end, and fix says so in one
    line."""
    started = time.monotonic()
    proc, result, out = fix(tmp_path, "--budget", "15s", "--", "python", TINY, "--steps", "100",
                            "--sleep-ms", "5000")
    took = time.monotonic() - started
    assert proc.returncode == 2 and result is None, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "torchtriage: error: the first profile did not finish within --budget 15s (stopped "
        "before its window was profiled); give fix a larger --budget (its output: "
        f"{out / 'profiles' / '0-original' / 'output.log'})")
    assert took < 45, took  # (a minute or more before)


def test_the_first_profile_run_gets_the_budget_or_the_timeout():
    from torchtriage.fix.budget import Budget

    budget = Budget(100.0)
    assert budget.first_profile_timeout(None) == 100.0
    assert budget.first_profile_timeout(20.0) == 20.0  # --timeout, when shorter
    assert budget.first_profile_timeout(300.0) == 100.0
