"""The benchmark scripts run and print their tables (smoke test on small inputs; no timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_all_benchmarks_print_their_tables(shared_traces):
    """`benchmarks/all.py --quick` runs every CPU benchmark on a small input."""
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "all.py"), "--quick"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for title in ("Trace scale", "Step overhead", "Classification accuracy", "A/B verdicts"):
        assert f"## {title}" in out
    # trace scale: a real trace, the synthetic one, and the 2-worker scaling row
    assert "| trace | raw MB | orjson s (MB/s) | torchtriage s (MB/s) | HTA s" in out
    assert "| sampled_rank-0.json.gz |" in out and "| synthetic_5MB.json |" in out
    assert "| 2 |" in out
    # step overhead
    assert "| example | trials | none ms" in out and "| launch_bound | 1 |" in out
    # classification
    assert "| shared/traces/kineto/resnet50_num_workers_0 | data_loading | data_loading |" in out
    assert "accuracy: 7/7" in out
    # A/B verdicts
    assert "| data_starved | dataloader.num_workers=2 |" in out


def test_the_peak_table_measures_each_trace_in_its_own_process(shared_traces):
    """`trace_scale.py --peaks`: a row per trace with its peak against its JSON (VmHWM, so a
    child does not inherit the benchmark's own high-water mark)."""
    trace = shared_traces / "hta" / "trace_filter" / "sampled_rank-0.json.gz"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "trace_scale.py"),
                             "--peaks", str(trace)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "sampled_rank-0" in line)
    _, _, raw_mb, peak_mb, ratio, _ = row.split("|")
    assert float(raw_mb) == 1.76 and 0 < float(peak_mb) < 20 and ratio.strip().endswith("x")
