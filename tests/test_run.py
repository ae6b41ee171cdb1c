"""`torchtriage run` on unmodified scripts: step detection, torchrun, knobs, failures."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from torchtriage.results.run import WindowMarker

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"
EXAMPLES = REPO / "examples"
TINY = str(SCRIPTS / "tiny_loop.py")


def run(tmp_path: Path, *args: str, out: str = "run", timeout: int = 300):
    """`torchtriage run --out tmp/out ARGS`; returns (completed process, out dir)."""
    out_dir = tmp_path / out
    proc = subprocess.run([sys.executable, "-m", "torchtriage", "run", "--out", str(out_dir),
                           *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return proc, out_dir


def record(out_dir: Path, rank: int = 0) -> dict:
    return json.loads((out_dir / f"run.rank{rank}.json").read_text())


def trace_text(out_dir: Path) -> str:
    (path,) = sorted(out_dir.glob("rank0_*.pt.trace.json.gz"))
    return gzip.decompress(path.read_bytes()).decode()


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """`torchtriage run --steps 9 [EXTRA] --json -- python examples/NAME.py`, run once per
    example and module: the verdict test below and the knob tests' baselines share it."""
    done: dict[tuple[str, ...], tuple[subprocess.CompletedProcess, Path]] = {}

    def get(example: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
        key = (example, *extra)
        if key not in done:
            tmp = tmp_path_factory.mktemp(example)
            with pytest.MonkeyPatch.context() as mp:  # a store of its own, never the user's
                mp.setenv("TORCHTRIAGE_STORE", str(tmp / "runs.sqlite"))
                done[key] = run(tmp, "--steps", "9", *extra, "--json", "--", "python",
                                str(EXAMPLES / f"{example}.py"))
        return done[key]

    return get


@pytest.mark.parametrize(("example", "layer", "extra"), [
    ("data_starved", "data_loading", []),
    ("compute_bound", "kernel", []),
    ("launch_bound", "host", []),
    ("memory_pressure", "memory", ["--device-memory", "267MiB"]),
])
def test_examples_unmodified_get_the_in_process_verdict(example_run, example, layer, extra):
    # The same layers as tests/test_examples.py gets through torchtriage.profile().
    proc, out = example_run(example, *extra)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "torchtriage.diagnosis/1" and doc["primary"] == layer
    assert json.loads((out / "diagnosis.json").read_text())["primary"] == layer
    rec = record(out)
    assert rec["steps_detected"] == 9  # --steps stopped the script cleanly
    assert len(rec["losses"]) == 9 and all(x["loss"] > 0 for x in rec["losses"])
    assert rec["host_step_ms"] and min(rec["host_step_ms"]) > 0


def test_several_optimizers_count_once_per_iteration(tmp_path):
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "two_optimizers.py"))
    assert proc.returncode == 0, proc.stderr
    rec = record(out)
    assert rec["steps_detected"] == 10
    assert rec["step_detection"] == "optimizer.step (2 optimizer(s) per step)"


def test_torchtriage_step_for_loops_without_optimizer(tmp_path):
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "manual_steps.py"))
    assert proc.returncode == 0, proc.stderr
    assert record(out)["step_detection"] == "torchtriage.step()"
    assert record(out)["steps_detected"] == 10


def test_hogwild_workers_without_a_launcher_each_keep_their_record(tmp_path):
    """Two processes started with multiprocessing each train a shared model (mnist_hogwild):
    no launcher gives them ranks, and both wrote rank 0's run record, the later one over the
    other's (its window check and losses lost). Each now claims its own rank at its first
    step, and the job diagnosis has both, with their window checks."""
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "hogwild.py"), "--procs", "2",
                    "--steps", "40")
    assert proc.returncode == 0, proc.stderr
    records = [record(out, r) for r in (0, 1)]
    assert [r["rank"] for r in records] == [0, 1]
    assert records[0]["trace"] != records[1]["trace"]
    assert all(r["steps_detected"] == 40 and r["windows"] for r in records), records
    doc = json.loads((out / "diagnosis.json").read_text())
    assert sorted(d["trace"]["rank"] for d in doc["diagnoses"]) == [0, 1]
    assert all(d["window"] for d in doc["diagnoses"]), [d["window"] for d in doc["diagnoses"]]


def test_a_job_diagnosis_without_a_ranks_window_check_is_not_taken_as_final():
    """Rank 0 writes the job's diagnosis when it ends; a rank that writes its record after
    rank 0 read the records (or within the file system's clock tick) brought a window check
    the diagnosis lacks, and the newer-file rule took it as final (1 hogwild job in a CI
    run). It is diagnosed again instead."""
    from types import SimpleNamespace as NS

    from torchtriage.capture.runner import _has_every_window

    def doc(*windows):
        return NS(rank_diagnoses=[NS(trace=NS(rank=r), window=w) for r, w in enumerate(windows)])

    records = [NS(rank=0, windows=[1]), NS(rank=1, windows=[1])]
    assert _has_every_window(doc("w", "w"), records)
    assert not _has_every_window(doc("w", None), records)
    assert _has_every_window(doc("w", None), [records[0], NS(rank=1, windows=[])])
    assert not _has_every_window(NS(rank_diagnoses=[NS(trace=NS(rank=None), window=None)]),
                                 records[:1])


def test_a_diagnosis_json_that_does_not_read_is_diagnosed_again_from_the_traces(tmp_path):
    """Two processes wrote one diagnosis.json at once with plain writes and left one's tail
    after the other's end ("trailing characters"): `run` failed with exit 2 although its
    traces were whole. Documents are written through a temporary file per process now, and a
    diagnosis.json that does not read is replaced by the traces' diagnosis."""
    import os

    from torchtriage.capture.runner import RunResult, rank_files, write_diagnosis

    proc, out = run(tmp_path, "--", "python", TINY)
    assert proc.returncode == 0, proc.stderr
    target = out / "diagnosis.json"
    whole = json.loads(target.read_text())
    target.write_text(target.read_text() + '  "primary": "kernel"}\n')  # the interleaving
    later = max(p.stat().st_mtime for p in out.iterdir()) + 5
    os.utime(target, (later, later))
    traces, records = rank_files(out)
    result = RunResult(out=out, returncode=0, timed_out=False, traces=traces, records=records)
    write_diagnosis(result, None)
    assert result.diagnosis is not None and result.diagnosis.primary == whole["primary"]
    assert json.loads(target.read_text())["primary"] == whole["primary"]
    assert not list(out.glob(".*.part"))


def test_torchrun_two_ranks_two_traces_one_diagnosis(tmp_path):
    proc, out = run(tmp_path, "--", "torchrun", "--nproc_per_node=2",
                    str(SCRIPTS / "ddp_gloo.py"))
    assert proc.returncode == 0, proc.stderr
    assert len(list(out.glob("rank0_*.pt.trace.json.gz"))) == 1
    assert len(list(out.glob("rank1_*.pt.trace.json.gz"))) == 1
    doc = json.loads((out / "diagnosis.json").read_text())
    assert doc["schema"] == "torchtriage.job/1"
    assert sorted(d["trace"]["rank"] for d in doc["diagnoses"]) == [0, 1]
    assert {d["trace"]["world_size"] for d in doc["diagnoses"]} == {2}
    assert "Memory block of unknown size" not in proc.stderr


def _losses(out_dir: Path) -> list[float]:
    return [x["loss"] for x in record(out_dir)["losses"]]


def test_dataloader_knobs_take_effect_and_keep_the_loss(tmp_path, example_run):
    script = ["--", "python", str(EXAMPLES / "data_starved.py")]
    base, base_out = example_run("data_starved")  # run --steps 9 without knobs
    proc, out = run(tmp_path, "--steps", "9", "--knob", "dataloader.num_workers=2",
                    "--knob", "dataloader.persistent_workers=true",
                    "--knob", "dataloader.prefetch_factor=4",
                    "--knob", "dataloader.pin_memory=true", *script, out="knobs")
    assert base.returncode == 0 and proc.returncode == 0, proc.stderr
    knobs = record(out)["knobs"]
    for k in ("dataloader.num_workers", "dataloader.persistent_workers",
              "dataloader.prefetch_factor"):
        assert knobs[k]["applied"], knobs[k]
    assert not knobs["dataloader.pin_memory"]["applied"]  # no CUDA here, and it says why
    assert "_MultiProcessingDataLoaderIter" in trace_text(out)
    assert "_SingleProcessDataLoaderIter" in trace_text(base_out)
    assert _losses(out) == pytest.approx(_losses(base_out), rel=1e-5)
    assert "knob dataloader.num_workers=2: applied" in proc.stdout


@pytest.mark.parametrize(("knob", "evidence", "rel"), [
    ("optimizer.foreach=true", "_foreach_", 1e-5),
    ("optimizer.fused=true", "_fused_sgd", 1e-5),
    ("amp.bf16=true", "c10::BFloat16", 5e-2),
    # compiled on a 3-layer model: the 121 layers of launch_bound take a minute of inductor
    ("compile.mode=default", "Torch-Compiled Region", 1e-3),
])
def test_model_knobs_take_effect_and_keep_the_loss(tmp_path, example_run, knob, evidence, rel):
    if knob.startswith("compile."):
        script = ["--steps", "9", "--", "python", str(SCRIPTS / "tiny_loop.py")]
        base, base_out = run(tmp_path, *script, out="base")
    else:
        script = ["--steps", "9", "--", "python", str(EXAMPLES / "launch_bound.py")]
        base, base_out = example_run("launch_bound")  # the same run without the knob
    proc, out = run(tmp_path, "--knob", knob, *script, out="knob")
    assert base.returncode == 0 and proc.returncode == 0, proc.stderr
    (entry,) = record(out)["knobs"].values()
    assert entry["applied"], entry
    assert evidence in trace_text(out) and evidence not in trace_text(base_out)
    assert _losses(out) == pytest.approx(_losses(base_out), rel=rel)


def test_bf16_wraps_the_forward_and_the_loss(tmp_path):
    """dcgan: autocast around the first model's forward only left BCELoss outside it with a
    bf16 input ("Found dtype Float but expected BFloat16"); the region runs from each model
    call to the next backward, as users wrap it."""
    proc, out = run(tmp_path, "--knob", "amp.bf16=true", "--steps", "12", "--", "python",
                    str(SCRIPTS / "gan_bce.py"))
    assert proc.returncode == 0, proc.stderr
    entry = record(out)["knobs"]["amp.bf16"]
    assert entry["applied"] and "to the next backward" in entry["detail"], entry
    text = trace_text(out)
    assert "c10::BFloat16" in text and '"aten::binary_cross_entropy"' in text


def test_json_keeps_stdout_for_the_diagnosis_and_the_scripts_output_on_stderr(tmp_path):
    """`run --json` dropped the script's own stdout (nanoGPT's "iter ..." lines): it goes to
    stderr now, and stdout is the diagnosis alone."""
    script = tmp_path / "chatty.py"
    script.write_text(TINY_LOOP_PRINTING)
    proc, _ = run(tmp_path, "--json", "--steps", "12", "--", "python", str(script))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["schema"] == "torchtriage.diagnosis/1"
    assert "iter 0: loss" in proc.stderr and "iter 10: loss" in proc.stderr


TINY_LOOP_PRINTING = """
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(40):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    print(f"iter {i}: loss {loss.item():.3f}", flush=True)
"""


def test_crash_keeps_the_trace_and_fails(tmp_path):
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "two_optimizers.py"), "crash")
    assert proc.returncode == 1
    assert "deliberate failure at step 6" in proc.stderr  # the script's own traceback
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("torchtriage: error: the command exited with code 1; recorded 1")
    assert list(out.glob("rank0_*.pt.trace.json.gz")) and (out / "diagnosis.json").exists()
    assert "RuntimeError" in record(out)["exit_exception"]


def test_out_of_memory_is_diagnosed_as_memory(tmp_path):
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "two_optimizers.py"), "oom")
    assert proc.returncode == 1
    assert json.loads((out / "diagnosis.json").read_text())["primary"] == "memory"


@pytest.mark.parametrize("at", [2, 1])
def test_out_of_memory_before_the_window_is_still_a_memory_diagnosis(tmp_path, at):
    """Step 2 (the optimizer state exists now) or the very first step: no trace, but the
    error is the evidence."""
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "oom_loader.py"), "--at", str(at))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"torchtriage: error: the command ran out of memory on step {at}; the memory "
        f"diagnosis is in {out / 'diagnosis.json'}")
    assert not list(out.glob("*.pt.trace.json*"))
    d = json.loads((out / "diagnosis.json").read_text())
    assert d["primary"] == "memory" and d["confidence"] == "high"
    oom = d["out_of_memory"]
    assert oom["step"] == at and oom["device"] == "cuda:0"
    assert oom["requested_bytes"] == 2 * 2**30 and oom["reserved_unallocated_bytes"] > 0
    ids = [p["id"] for p in d["prescriptions"]]
    # 11.9 of 77.2 GiB reserved sat idle (15 %, under memory_fragmentation): no expandable
    # segments; the ladder in cost order
    assert ids == ["memory.grad_accumulation", "memory.activation_checkpointing",
                   "memory.bf16", "memory.fsdp"]
    assert {"memory.oom"} <= {f["id"] for f in d["findings"]}
    assert record(out)["oom"] and "Bottleneck: memory" in proc.stdout


@pytest.mark.timing
def test_the_window_waits_for_the_dataloader_queue_to_drain(tmp_path):
    """16 batches prepared during a pause before training hide a loader that cannot keep up:
    a window at steps 4-8 measures the queue (kernel-bound); at steady state it is loading."""
    proc, out = run(tmp_path, "--steps", "110", "--", "python",
                    str(SCRIPTS / "queued_loader.py"), "--steps", "110")
    assert proc.returncode == 0, proc.stderr
    d = json.loads((out / "diagnosis.json").read_text())
    assert record(out)["loader_queue"] == 16
    window = d["window"]
    assert "DataLoader queue of 16 batches" in window["skip_reason"] or \
        "profiled again" in window["skip_reason"], window
    assert window["first_step"] > 16 + 16 and window["representative"] is True, window
    assert d["primary"] == "data_loading", (d["summary"], window)


def _checked_window(tmp_path, ready_at, step_ms_at):
    """A window at steps 36-40 (started after 16 steps, 1 wait + 18 warm-up) of a loader with
    16 batches in flight, checked step by step: the ready-queue reading and the host time of
    each step come from the two functions. Returns the check."""
    from torchtriage.capture.profiling import ProfilingWindow
    from torchtriage.capture.steps import StepClock
    from torchtriage.results.run import Schedule

    clock, readings = StepClock(), []
    window = ProfilingWindow(tmp_path, 0, Schedule(), 0, None, clock, lambda: 16,
                             ready=lambda: readings)
    window._started_at, window._warmup = 16, 18
    assert window._window() == (36, 40)
    for step in range(1, 200):
        readings.append(ready_at(step))
        clock.ends.append(clock.ends[-1] + step_ms_at(step) / 1e3 if step >= 2 else 0.0)
        if step > 40:
            window._await_check_start(step)
            check = window._check(step, final=False)
            if check is not None:
                return check
    raise AssertionError("no check")


def test_the_window_check_waits_for_a_refilled_queue_to_drain(tmp_path):
    """A pause before step 34 refilled the queue (16 batches), which drains by 0.4 batch a
    step while the workers keep producing, to step ~74: steps served from it take 40 ms, the
    loader's steady state 100. A check at the export's refill (steps 58-62) would time the
    same refill; it starts once the queue stops falling instead, sees the steady state, and
    the window (inside the refill) is not borne out."""
    def ready(step):
        return max(0, round(16 - 0.4 * (step - 34))) if step >= 34 else 0

    check = _checked_window(tmp_path, ready, lambda step: 40.0 if ready(step) else 100.0)
    assert check.after_first_step >= 70, check
    assert check.after_mean_ms >= 80 and check.representative is False, check


def test_a_queue_that_keeps_up_does_not_delay_the_check(tmp_path):
    """A loader that keeps up holds its queue near full (readings wobble by one): the check
    starts right after the export's refill (last step + 2 + the queue: step 58)."""
    check = _checked_window(tmp_path, lambda step: 14 + step % 2, lambda step: 40.0)
    assert check.after_first_step == 58 and check.representative is True, check
    assert check.after_max_ms == 40.0  # the longest checked step (diagnosis/windows.py)


@pytest.mark.timing
def test_a_pause_mid_run_does_not_hide_the_loader(tmp_path):
    """A validation pass of 2.5 s before step 34 lets the workers fill the queue again: the
    ~27 steps after it run at compute speed (the queue drains by ~0.6 batch a step, since the
    workers keep producing). A window over those steps must not be borne out by check steps
    from the same refill: the check waits for the queue to stop draining, the window is
    profiled again, and the verdict comes from a window outside the refill."""
    proc, out = run(tmp_path, "--steps", "140", "--", "python",
                    str(SCRIPTS / "queued_loader.py"), "--steps", "140", "--pause-at", "34")
    assert proc.returncode == 0, proc.stderr
    d = json.loads((out / "diagnosis.json").read_text())
    window = d["window"]
    refilled = range(34, 34 + 27)
    assert window["first_step"] not in refilled and window["last_step"] not in refilled, \
        (window, d["superseded_windows"])
    assert window["representative"] is True, window
    for old in d["superseded_windows"]:  # any window over the refill was caught by its check
        assert old["representative"] is False, old
        assert old["after_first_step"] >= old["last_step"] + 2 + 16, old
    assert d["primary"] == "data_loading", (d["summary"], window, d["superseded_windows"])


@pytest.mark.timing
def test_a_window_that_was_not_steady_state_is_profiled_again_and_shown_early(tmp_path):
    """Steps slow down after step 12: the first window (before step 12; where exactly depends
    on the profiling cost guard's probe) is faster than the steps after it, so it is set aside
    and profiled again; without --steps the verdict is printed while the script trains on."""
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "phase_change.py"), "60", "12")
    assert proc.returncode == 0, proc.stderr
    assert "the profiling window is diagnosed" in proc.stdout
    assert "final diagnosis: host (as above)" in proc.stdout
    d = json.loads((out / "diagnosis.json").read_text())
    (old,) = d["superseded_windows"]
    assert old["first_step"] < 12 and old["representative"] is False, old
    assert old["after_mean_ms"] > 1.25 * old["profiled_mean_ms"]
    assert d["window"]["first_step"] > 12 and d["window"]["representative"] is True
    assert "steps.window_profiled_again" in {f["id"] for f in d["findings"]}
    assert len(list((out / "superseded").glob("rank0_*.pt.trace.json.gz"))) == 1
    assert len(list(out.glob("rank0_*.pt.trace.json.gz"))) == 1
    assert "Traceback" not in proc.stderr


@pytest.mark.timing
def test_a_run_that_ends_before_the_window_profiled_again_keeps_the_first_one(tmp_path):
    """The same phase change, but the script ends in the warm-up of the window profiled again:
    its warm-up-only trace is set aside and the first window, said not steady state, is the
    one diagnosed (not the warm-up steps, profiler start-up included)."""
    proc, out = run(tmp_path / "long", "--", "python", str(SCRIPTS / "phase_change.py"), "60",
                    "12")
    assert proc.returncode == 0, proc.stderr
    (first,) = json.loads((out / "diagnosis.json").read_text())["superseded_windows"]
    # the window is checked 5 steps after the step that exports it, then profiled again from
    # there: 1 wait and 2 warm-up steps, so its first profiled step is last + 10
    steps = first["last_step"] + 8
    proc, out = run(tmp_path / "short", "--", "python", str(SCRIPTS / "phase_change.py"),
                    str(steps), "12")
    assert proc.returncode == 0, proc.stderr
    d = json.loads((out / "diagnosis.json").read_text())
    assert d["superseded_windows"] == []
    assert (d["window"]["first_step"], d["window"]["representative"]) == (first["first_step"],
                                                                          False)
    assert "steps.window_not_steady" in {f["id"] for f in d["findings"]}
    (trace,) = out.glob("rank0_*.pt.trace.json.gz")
    assert json.loads((out / "run.rank0.json").read_text())["trace"] == trace.name
    assert len(list((out / "superseded").glob("rank0_*.pt.trace.json.gz"))) == 1
    assert len(d["breakdown"]["steps"]) == 5


def test_steps_that_end_before_the_window_are_refused(tmp_path):
    proc, out = run(tmp_path, "--skip", "30", "--steps", "12", "--", "python",
                    str(SCRIPTS / "tiny_loop.py"))
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip() == (
        "torchtriage: error: --steps 12 stops the script before profiling starts after --skip "
        "30 steps (--steps counts every training step, skipped ones too); for a whole window "
        "use --steps 38 or more")


def test_early_exit_says_no_step_was_detected(tmp_path):
    proc, _ = run(tmp_path, "--", "python", str(SCRIPTS / "two_optimizers.py"), "early")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "torchtriage: error: no training step detected (no optimizer.step(), no backward() and "
        "no torchtriage.step())")


def test_hang_past_timeout_is_stopped_and_keeps_the_trace(tmp_path):
    # (the script must reach its 6th step first: 8 s was too short for a loaded CI worker)
    proc, out = run(tmp_path, "--timeout", "20", "--", "python",
                    str(SCRIPTS / "two_optimizers.py"), "hang")
    assert proc.returncode == 124
    assert "ran past --timeout 20s" in proc.stderr
    assert list(out.glob("rank0_*.pt.trace.json.gz"))


@pytest.mark.parametrize(("knob", "message"), [
    ("bogus.knob=1", "unknown knob 'bogus.knob'"),
    ("dataloader.num_workers=lots", "takes an integer"),
    ("dataloader.num_workers=-1", "must be >= 0"),
    ("amp.bf16=maybe", "takes true or false"),
    ("compile.mode=fast", "takes one of none, default, reduce-overhead, max-autotune"),
    ("amp.bf16", "is not ID=VALUE"),
])
def test_bad_knobs_are_refused_before_the_script_starts(tmp_path, knob, message):
    proc, out = run(tmp_path, "--knob", knob, "--", "python",
                    str(SCRIPTS / "two_optimizers.py"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"torchtriage: error: {proc.stderr.strip().split(': ', 2)[2]}"
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_missing_command(tmp_path):
    proc, _ = run(tmp_path, "--", "no-such-command-xyz")
    assert proc.returncode == 2 and "command not found: no-such-command-xyz" in proc.stderr
    proc, _ = run(tmp_path)
    assert proc.returncode == 2 and "no command to run" in proc.stderr


def test_activation_checkpointing_knob(tmp_path):
    script = ["--", "python", str(SCRIPTS / "blocks.py")]
    base, base_out = run(tmp_path, *script, out="base")
    proc, out = run(tmp_path, "--knob", "memory.activation_checkpointing=true", *script)
    assert base.returncode == 0 and proc.returncode == 0, proc.stderr
    entry = record(out)["knobs"]["memory.activation_checkpointing"]
    assert entry["applied"] and "6 x Block" in entry["detail"]
    # Recomputation in backward runs the blocks' forward ops again.
    assert trace_text(out).count('"aten::linear"') > trace_text(base_out).count('"aten::linear"')
    # blocks.py's loss overflows after a few steps: the record keeps those as None. They must
    # fall on the same steps, and the finite ones agree (pytest >= 9.2 refuses None in approx)
    losses, base_losses = _losses(out), _losses(base_out)
    assert [x is None for x in losses] == [x is None for x in base_losses]
    assert [x for x in losses if x is not None] == pytest.approx(
        [x for x in base_losses if x is not None], rel=1e-5)


def test_ddp_knobs_on_two_ranks(tmp_path):
    proc, out = run(tmp_path, "--knob", "ddp.bucket_cap_mb=1", "--knob", "ddp.static_graph=true",
                    "--knob", "ddp.gradient_as_bucket_view=true", "--knob", "ddp.comm_hook=bf16",
                    "--", "torchrun", "--nproc_per_node=2", str(SCRIPTS / "ddp_gloo.py"))
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        knobs = record(out, rank)["knobs"]
        assert all(knobs[k]["applied"] for k in ("ddp.bucket_cap_mb", "ddp.static_graph",
                                                  "ddp.gradient_as_bucket_view"))
        # bf16 compression needs NCCL: refused, said so, and the run went on.
        assert not knobs["ddp.comm_hook"]["applied"]
        assert "NCCL" in knobs["ddp.comm_hook"]["detail"]


def test_grad_accumulation_splits_batches_and_all_reduces_once_per_step(tmp_path):
    script = ["--", "torchrun", "--nproc_per_node=2", str(SCRIPTS / "ddp_loader.py"),
              "--steps", "20"]
    base, base_out = run(tmp_path, *script, out="base")
    proc, out = run(tmp_path, "--knob", "memory.grad_accumulation=2", *script)
    assert base.returncode == 0 and proc.returncode == 0, proc.stderr
    rec = record(out)
    entry = rec["knobs"]["memory.grad_accumulation"]
    assert entry["applied"] and "batch_size 32 -> 16" in entry["detail"]
    assert rec["batch_sizes"][0] == 32  # two micro-batches of 16 make one step
    text = trace_text(out)
    # no_sync on the first micro-batch: one all-reduce per optimizer step, not two (a step
    # the loop ended inside, after the last optimizer step, has none)
    partial = json.loads(text)["torchtriage"]["partial_steps"]
    assert text.count('"c10d::allreduce_"') == text.count('"ProfilerStep#') - len(partial)
    # the same updates (and LR schedule, stepped once per optimizer step) as one full batch
    # (the script counts loop iterations: 20 micro-batches are 10 optimizer steps)
    assert len(_losses(out)) == 10
    assert _losses(out) == pytest.approx(_losses(base_out)[:10], rel=1e-4)


@pytest.mark.timing
def test_busy_cores_mean_cheaper_preprocessing_not_more_workers(tmp_path):
    # 120 steps: the machine samples cover the whole run, start-up and trace export (one core)
    # included; 40 steps (~4 s) left the job's mean at 83 % of the cores in a CI run
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "cpu_bound_loader.py"), "120")
    assert proc.returncode == 0, proc.stderr
    d = json.loads((out / "diagnosis.json").read_text())
    assert d["machine"]["samples"] > 0 and d["machine"]["child_processes"] >= 2
    assert d["machine"]["cpu_busy_mean"] >= 0.9, d["machine"]
    # The primary layer is not asserted: with 3 CPU-bound workers on 2 cores the training
    # process's own ops run slowed by the contention (a Linear(1024, 4) step takes 30-90 ms),
    # and in some runs its forward and backward outweigh the exposed loading (CI 2026-12-02:
    # `kernel`). Known, open (issue 15 note): the saturation finding below holds either way.
    assert "data_loading.cpu_saturated" in {f["id"] for f in d["findings"]}
    assert "dataloader.num_workers" not in [p["id"] for p in d["prescriptions"]]


def test_rank_zero_writes_the_job_diagnosis_itself(tmp_path):
    """Without the `torchtriage run` parent (only its environment), rank 0 writes it."""
    import os

    from torchtriage.capture.runner import BOOTSTRAP

    out = tmp_path / "job"
    env = {**os.environ, "TORCHTRIAGE_RUN": json.dumps({"out": str(out)}),
           "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), str(REPO / "src")])}
    proc = subprocess.run(["torchrun", "--nproc_per_node=2", str(SCRIPTS / "ddp_gloo.py")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "diagnosis.json").read_text())
    assert sorted(d["trace"]["rank"] for d in doc["diagnoses"]) == [0, 1]
    # Each rank diagnosed its own trace and rank 0 gathered them over torchrun's store.
    assert doc["gathered_via"] == "torchrun store"


def test_backend_knobs_are_set_and_say_they_do_nothing_on_cpu(tmp_path):
    proc, out = run(tmp_path, "--steps", "9", "--knob", "matmul.tf32=true",
                    "--knob", "cudnn.benchmark=true", "--knob", "h2d.non_blocking=true", "--",
                    "python", str(SCRIPTS / "two_optimizers.py"))
    assert proc.returncode == 0, proc.stderr
    knobs = record(out)["knobs"]
    for k in ("matmul.tf32", "cudnn.benchmark"):
        assert knobs[k]["applied"] and "no effect on CPU" in knobs[k]["detail"]
    assert not knobs["h2d.non_blocking"]["applied"]
    assert "no CUDA device" in knobs["h2d.non_blocking"]["detail"]


def test_out_holding_files_torchtriage_did_not_write_is_refused_and_left_alone(tmp_path):
    """A profiler's own traces and a diagnosis.json of the user's: nothing is deleted (issue 18,
    item 2); the run is refused before the script starts."""
    out = tmp_path / "run"
    out.mkdir()
    theirs = {"rank0_7.pt.trace.json": '{"traceEvents": []}', "diagnosis.json": '{"mine": 1}'}
    for name, text in theirs.items():
        (out / name).write_text(text)
    proc, _ = run(tmp_path, "--", "python", str(SCRIPTS / "tiny_loop.py"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"torchtriage: error: --out {out} holds files torchtriage did not write (diagnosis.json, "
        "rank0_7.pt.trace.json); give a new or empty directory (a previous torchtriage run "
        "directory is fine: its files move to previous-<time>/)")
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs


@pytest.mark.parametrize("marked", [True, False])
def test_a_previous_run_directory_moves_into_previous(tmp_path, marked):
    """A run directory of torchtriage's (marked, or from before the mark: a run record among
    torchtriage's file names) is reused: its files move to DIR/previous-<time>/, untouched."""
    out = tmp_path / "run"
    out.mkdir()
    old = {"run.rank0.json": "{}", "rank0_1.2.pt.trace.json.gz": "trace", "diagnosis.json": "{}"}
    if marked:  # the mark says the directory was torchtriage's: all of it moves
        old.update({".torchtriage": "{}", "notes.txt": "written during that run"})
    for name, text in old.items():
        (out / name).write_text(text)
    proc, _ = run(tmp_path, "--", "python", "-c", "pass")
    assert proc.returncode == 1 and "no training step detected" in proc.stderr
    (previous,) = out.glob("previous-*")
    assert {p.name: p.read_text() for p in previous.iterdir()} == old
    assert sorted(p.name for p in out.iterdir()) == [".torchtriage", previous.name]


@pytest.mark.parametrize("command", ["run", "ab", "fix"])
def test_out_naming_a_file_is_a_one_line_error(tmp_path, command):
    target = tmp_path / "afile"
    target.write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "torchtriage", command, "--out", str(target),
                           "--", "python", str(SCRIPTS / "tiny_loop.py")], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"torchtriage: error: --out {target} is a file, not a directory: give a directory (a new "
        "one is created)")
    assert target.read_text() == "mine"


def test_a_truncated_run_record_is_left_out_with_a_warning_not_an_internal_error(tmp_path,
                                                                                  caplog):
    """A record cut short (its writer killed mid-write, before records were written whole)
    is named and left out; the readable ones are used."""
    from torchtriage.capture.runner import rank_files
    from torchtriage.results.run import RunRecord

    RunRecord(argv=["train.py"], trace=None, rank=0).write(tmp_path / "run.rank0.json")
    (tmp_path / "run.rank1.json").write_text('{"schema": "torchtriage.run/1", "argv": [')
    with caplog.at_level("WARNING"):
        traces, records = rank_files(tmp_path)
    assert [r.rank for r in records] == [0] and traces == []
    assert "run.rank1.json" in caplog.text and "cannot be read" in caplog.text
    assert not list(tmp_path.glob(".*.part"))  # written whole: no temporary file left


def test_the_cost_probe_sees_a_whole_step_where_the_optimizer_cycle_becomes_known(tmp_path):
    """The second optimizer.step() closes two steps at one instant (the first iteration, late,
    and its own): the session does not start between them, so its probe covers a real step
    and is not repeated (before: an empty probe, and the window 2 steps later)."""
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "tiny_loop.py"))
    assert proc.returncode == 0, proc.stderr
    rec = record(out)
    assert rec["schedule"]["wait"] == 1 and rec["profile_cost"]["events_per_step"] > 0, rec
    assert rec["windows"][0]["first_step"] == 6  # started after step 2; 1 wait + 2 warm-up


def test_a_one_off_step_in_the_window_is_not_steady_state(tmp_path):
    """A checkpoint or an epoch boundary inside the window (dcgan on an H200: 1,190 ms among
    steps of 20) makes one step far longer than the others, and the steps checked after the
    window do not repeat it: the window is not steady state, and says which step."""
    from torchtriage.diagnosis import thresholds as th

    check = _checked_window(tmp_path, lambda step: 0,
                            lambda step: 1190.0 if step == 39 else 20.0)
    assert check.representative is False and check.one_off_step == 39, check
    assert check.one_off_step_ms == 1190.0
    # a loader whose two workers deliver in turn: slow every other step, after the window too
    alternating = _checked_window(tmp_path, lambda step: 0,
                                  lambda step: 185.0 if step % 2 else 20.0)
    assert alternating.one_off_step is None and alternating.representative is True
    assert th.one_off_step([20.0, 20.0], [20.0]) is None  # no median to judge by
    # a stall of tens of ms among 8 ms steps (a busy machine's scheduler): not a one-off
    assert th.one_off_step([8.0, 9.0, 60.0, 8.0, 5.0], [5.0, 6.0, 4.0, 5.0, 6.0]) is None
    assert th.one_off_step([8.0, 9.0, 160.0, 8.0, 5.0], [5.0, 6.0, 4.0, 5.0, 6.0]) == 2


def test_a_checkpoint_inside_the_window_is_found_and_the_window_profiled_again(tmp_path):
    """A 1 s checkpoint after step 9 lands in the window (steps 6-10 or so) of a 1 ms step;
    the checked steps after it (before the next one, after step 18) do not repeat it."""
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "checkpoint_step.py"), "--steps",
                    "60", "--every", "9")
    assert proc.returncode == 0, proc.stderr
    d = json.loads((out / "diagnosis.json").read_text())
    first = (d["superseded_windows"] or [d["window"]])[0]
    assert first["first_step"] <= 10 <= first["last_step"], first
    assert first["one_off_step"] == 10 and first["one_off_step_ms"] > 900, first
    assert first["representative"] is False
    messages = " ".join(f["message"] for f in d["findings"])
    assert "step 10 took" in messages and "one-off" in messages, messages


def test_the_early_verdict_reads_the_training_process_cpu_facts_not_torch_in_the_cli(tmp_path):
    """Without --steps the window is diagnosed while the script trains on. The CPU facts that
    diagnosis reads (torch's CPU capability, native bf16) come from the training process in
    the window marker: the CLI process imports no torch (it did, for one string: ~1.5 s of
    CPU taken from the training beside it)."""
    out = tmp_path / "run"
    cli = ("import runpy, sys\n"
           "try:\n    runpy.run_module('torchtriage', run_name='__main__')\n"
           "finally:\n    print('torch in the CLI:', 'torch' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", cli, "run", "--out", str(out), "--", "python",
                           TINY, "--steps", "150", "--sleep-ms", "20"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "the profiling window is diagnosed" in proc.stdout
    assert "torch in the CLI: False" in proc.stderr, proc.stderr
    marker = msgspec.json.decode((out / "window.rank0.json").read_bytes(), type=WindowMarker)
    assert marker.checks and marker.checks[-1].representative is not None, marker
    assert marker.machine is not None and marker.machine.cpu_capability, marker.machine
