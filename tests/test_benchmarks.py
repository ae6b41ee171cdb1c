"""The benchmark scripts run and print their tables (smoke test on small inputs; no timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> str:
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ingest_benchmark_quick(shared_traces):
    out = _run("ingest.py", "--quick")
    assert out.startswith("| trace | raw MB | orjson s")
    assert "sampled_rank-0.json.gz" in out


def test_classification_benchmark_quick(shared_traces):
    out = _run("classification.py", "--quick")
    assert "| shared/traces/kineto/resnet50_num_workers_0 | data_loading | data_loading |" in out
    assert "accuracy: 7/7" in out


def test_ab_noise_benchmark_quick():
    out = _run("ab_noise.py", "--quick")
    assert out.startswith("| # | example | knob |")
    assert "| data_starved | dataloader.num_workers=2 |" in out
    assert "no-op knob: no_change in" in out
