"""The whole-run view end to end on the user-style scripts of benchmarks/realworld/ (issue #33):
`torchtriage run` over the whole run names a leak, a stall that recurs every epoch and
recompilation with their figures, and the scripts' hand fixes make them go; `torchtriage fix`
keeps no memory rung for a leak and keeps persistent workers for the epoch stalls. Sizes are
benchmarks/whole_run.py's --quick ones (CPU)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import whole_run  # noqa: E402


def _command(case: str, *extra: str) -> list[str]:
    script = whole_run.CASES[case][0]
    return whole_run.command(script, whole_run.QUICK[case], "cpu", shlex.join(extra))


def _torchtriage(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchtriage", *args], capture_output=True,
                          text=True, timeout=timeout)


def _run(tmp_path: Path, case: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / case
    proc = _torchtriage("run", "--out", str(out), "--", *_command(case, *extra))
    return proc, json.loads((out / "diagnosis.json").read_text())


def test_a_run_long_leak_is_named_with_its_rate_its_oom_step_and_what_holds_it(tmp_path):
    proc, doc = _run(tmp_path, "leak")
    assert proc.returncode == 1 and "ran out of memory on step" in proc.stderr
    growth = doc["run"]["growth"]
    assert growth["steady"] and growth["source"] == "process_heap"
    # each step keeps its logits: 16 x 32 x 2048 float32 = 4 MiB
    assert 3.5 * 2**20 < growth["bytes_per_step"] < 5 * 2**20
    oom_step = doc["out_of_memory"]["step"]
    assert growth["full_at_step"] <= oom_step and growth["full_at_step"] >= oom_step - 5
    assert growth["capacity_source"] == "RLIMIT_DATA (ulimit -d)"
    assert growth["cause"] == "autograd_graph_retained"
    assert growth["holders"][0]["name"].startswith("epoch_logits (list) in main()")
    assert doc["prescriptions"][0]["id"] == "memory.fix_leak"
    withheld = {w["id"] for w in doc["withheld"]}
    assert {"memory.grad_accumulation", "memory.activation_checkpointing"} <= withheld
    assert "a leak" in doc["summary"] and "Whole run:" in proc.stdout
    report = _torchtriage("report", str(tmp_path / "leak"))
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "leak" / "report.html").read_text()
    assert 'id="run"' in page and "MiB/step" in page


def test_the_leaks_hand_fix_runs_to_the_end_with_flat_memory(tmp_path):
    proc, doc = _run(tmp_path, "leak", "--fixed")
    assert proc.returncode == 0, proc.stderr[-2000:]
    growth = doc["run"]["growth"]
    assert growth is not None and not growth["steady"]
    assert "memory.fix_leak" not in [p["id"] for p in doc["prescriptions"]]
    assert doc["run"]["compile"] is None  # never compiled: no compile section, no error


def test_fix_keeps_no_memory_rung_for_a_leak(tmp_path):
    out = tmp_path / "fix"
    proc = _torchtriage("fix", "--out", str(out), "--budget", "2m", "--",
                        *_command("leak"))
    result = json.loads((out / "fix.json").read_text())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert result["kept"] == []
    assert "a leak" in result["stopped_because"]
    assert [(s["prescription"], s["result"]) for s in result["steps"]] == [
        ("memory.fix_leak", "not_injectable")]


def test_workers_spawned_again_every_short_epoch_are_a_recurring_stall(tmp_path):
    # room for a second window after the first (which a loaded machine may profile twice)
    proc, doc = _run(tmp_path, "short_epochs", "--epochs", "14")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (stall,) = [s for s in doc["run"]["stalls"] if s["cause"] == "dataloader_restart"]
    assert stall["period_steps"] == 4  # --epoch-steps 4
    assert stall["share_of_run"] >= 0.3
    assert "spawn start method" in stall["detail"] and "persistent_workers=False" in stall["detail"]
    assert "the Dataset pickles to" in stall["detail"]
    # a stall step, profiled by the second window: its time is the workers' start and the
    # wait for their first batch
    profile = stall["profile"]
    record = json.loads((tmp_path / "short_epochs" / "run.rank0.json").read_text())
    assert profile is not None, (record["timeline"].get("stall_windows"), stall["steps"],
                                 record.get("window"))
    assert profile["step"] in stall["steps"]
    assert (tmp_path / "short_epochs" / profile["trace"]).is_file()
    top = {p["label"]: p["share"] for p in profile["parts"][:2]}
    assert set(top) == {"starting DataLoader workers",
                        "waiting for the next batch (DataLoader __next__)"}
    assert sum(top.values()) >= 0.8
    assert f"step {profile['step']} profiled" in proc.stdout
    assert doc["primary"] == "data_loading"
    assert doc["primary_rule"]["rule"] == "recurring_stall"
    assert doc["prescriptions"][0]["id"] == "dataloader.persistent_workers"
    fixed_proc, fixed = _run(tmp_path / "fixed", "short_epochs", "--fixed")
    assert fixed_proc.returncode == 0
    assert not [s for s in fixed["run"]["stalls"] if s["cause"] == "dataloader_restart"]


def test_fix_keeps_persistent_workers_for_the_epoch_stalls(tmp_path):
    out = tmp_path / "fix"
    proc = _torchtriage("fix", "--out", str(out), "--budget", "100s", "--layers",
                        "data_loading", "--only", "dataloader.persistent_workers", "--",
                        *_command("short_epochs", "--epochs", "40"), timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "fix.json").read_text())
    assert {"knob": "dataloader.persistent_workers", "value": True} in [
        {"knob": k["knob"], "value": k["value"]} for k in result["kept"]], result["summary"]


@pytest.mark.parametrize("fixed", [False, True], ids=["as_written", "bucketed"])
def test_a_compiled_model_fed_new_lengths_recompiles_to_the_limit(tmp_path, fixed):
    proc, doc = _run(tmp_path, "varlen", *(["--fixed"] if fixed else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    c = doc["run"]["compile"]
    ids = [p["id"] for p in doc["prescriptions"]]
    if fixed:  # padded to 2 buckets (64, 96): at most one compilation per bucket
        assert c["recompilations"] <= 3 and not c["limit_hits"]
        assert "compile.dynamic" not in ids
        return
    assert c["recompilations"] >= 7 and c["limit_hits"]
    assert "size mismatch" in c["reasons"][0]["reason"]
    assert {"compile.dynamic", "compile.pad_buckets", "compile.recompile_limit"} <= set(ids)
    # the run compiles already: compiling the model is not a fix; recompiling is the verdict
    assert "compile.default" not in ids, ids
    assert c["share_of_run"] >= 0.10, c
    assert doc["primary_rule"]["rule"] == "run_recompiling" and ids[0] == "compile.dynamic"
    (finding,) = [f for f in doc["findings"] if f["id"] == "run.compile"]
    assert finding["severity"] == "warning" and "hit the recompile limit" in finding["message"]


PERIODIC = """
import json, time, torch, torch.nn as nn
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
for step in range(1, 121):
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    history.append(loss.item())
    if step % 10 == 0:  # log the metrics: the whole history as JSON, to a slow store
        time.sleep(0.15)
        json.dumps([history] * 50)
    if step % 25 == 0:
        model.eval()
        with torch.no_grad():
            for _ in range(30):
                model(torch.randn(256, 256))
        model.train()
"""


def test_periodic_work_of_the_scripts_own_is_profiled_and_placed_outside_any_op(tmp_path):
    """A script as users write one: metrics logged every 10 steps (no torch op: nothing the
    timeline sees explains it) and an evaluation every 25."""
    script = tmp_path / "train.py"
    script.write_text(PERIODIC)
    out = tmp_path / "run"
    proc = _torchtriage("run", "--out", str(out), "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "diagnosis.json").read_text())
    stalls = {s["cause"]: s for s in doc["run"]["stalls"]}
    assert stalls["unexplained"]["period_steps"] == 10
    assert stalls["evaluation"]["period_steps"] == 25
    assert doc["primary"] == "host"
    profiled = [s for s in stalls.values() if s.get("profile")]
    assert len(profiled) == 1
    (stall,) = profiled
    assert stall["profile"]["parts"][0]["label"] == "Python outside any op"
    assert stall["profile"]["parts"][0]["share"] > 0.5


RESTORED_BY_FLAG = """
import time, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
teacher = nn.Linear(32, 32)
teacher.eval()  # frozen for the whole run: never an evaluation
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(640, 32)), batch_size=64, num_workers=1)
step = 0
for epoch in range(4):
    for (x,) in data:  # a new epoch: its worker starts again
        step += 1
        with torch.no_grad():
            x = teacher(x)
        loss = model(x).square().mean()
        opt.zero_grad(); loss.backward(); opt.step()
    # Lightning's evaluation loop: eval(), then every submodule's flag restored directly
    modes = {name: m.training for name, m in model.named_modules()}
    model.eval()
    with torch.no_grad():
        for _ in range(5):
            model(torch.randn(256, 32))
            time.sleep(0.02)
    for name, m in model.named_modules():
        m.training = modes[name]
"""


def test_an_evaluation_whose_mode_is_restored_by_flag_ends_at_the_next_module_call(tmp_path):
    """Lightning restores training mode by setting each submodule's ``training`` flag, not
    through ``train(True)``: the evaluation still ends where training resumes (here the next
    epoch's DataLoader starting its worker, before the first module call), not at the step's
    end; a module left in eval mode for the run is no evaluation."""
    script = tmp_path / "train.py"
    script.write_text(RESTORED_BY_FLAG)
    out = tmp_path / "run"
    proc = _torchtriage("run", "--out", str(out), "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = json.loads((out / "run.rank0.json").read_text())["timeline"]["events"]
    evals = [e for e in events if e["kind"] == "evaluation"]
    starts = [e for e in events if e["kind"] == "loader_start"]
    assert [e["step"] for e in evals] == [11, 21, 31], evals  # the last one never ends
    assert {e["detail"] for e in evals} == {"Sequential"}
    for e in evals:  # 5 x 20 ms of evaluation, ended before the next epoch's worker start
        assert 0.09 < e["duration_s"] < 0.145, e
        (after,) = [s for s in starts if s["step"] == e["step"]]
        assert e["start_s"] + e["duration_s"] <= after["start_s"] + 1e-6, (e, after)
