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


@pytest.mark.parametrize("optimizer", ["lbfgs", "sgd"])
def test_a_closure_is_forward_and_backward_not_optimizer_time(tmp_path, optimizer):
    """optimizer.step(closure): forward, loss and backward run inside the optimizer's range;
    they are attributed by their own ops, and only the optimizer's own ops are counted as
    optimizer ops (SGD with a closure, as Lightning runs every optimizer: a few)."""
    proc, out = run(tmp_path, "--", "python", str(SCRIPTS / "closure_regression.py"),
                    "--optimizer", optimizer, "--max-iter", "3", "--steps", "10",
                    "--width", "128")
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
