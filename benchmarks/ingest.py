"""Ingest speed and memory: torchtriage vs bare orjson parsing, on real traces.

For each trace: raw JSON size, then each measured in a fresh child process:
  orjson      - gunzip + orjson.loads (the floor: parsing only)
  load        - torchtriage.trace.load_trace (gunzip + typed decode + columns)
  load+diag   - load_trace + diagnose (the whole `torchtriage analyze`)
Prints median wall time over --repeat runs, MB/s of uncompressed JSON, and the peak of
Python-heap memory (tracemalloc: every Python object, bytes buffer and numpy array) during the
work, measured in one more run, since tracing slows the work down.

    python benchmarks/ingest.py            # the largest traces in ../shared/traces
    python benchmarks/ingest.py --quick    # one small trace, one repeat (CI smoke test)
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
DEFAULT = [
    "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
]
QUICK = ["hta/trace_filter/sampled_rank-0.json.gz"]

CHILD = r"""
import gzip, json, sys, time, tracemalloc
mode, path, trace_memory = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
import orjson
from torchtriage.diagnosis import diagnose
from torchtriage.trace import load_trace
if trace_memory:
    tracemalloc.start()
t = time.perf_counter()
if mode == "orjson":
    data = open(path, "rb").read()
    doc = orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
elif mode == "load":
    trace = load_trace(path)
else:
    diagnose(load_trace(path))
elapsed = time.perf_counter() - t
peak = tracemalloc.get_traced_memory()[1] / 1e6 if trace_memory else 0.0
print(json.dumps({"s": elapsed, "peak_mb": peak}))
"""


def raw_size(path: Path) -> int:
    data = path.read_bytes()
    return len(gzip.decompress(data)) if data[:2] == b"\x1f\x8b" else len(data)


def _child(mode: str, path: Path, trace_memory: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), str(int(trace_memory))],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(mode: str, path: Path, repeat: int) -> tuple[float, float]:
    """(median seconds, peak MB of traced Python memory)."""
    seconds = statistics.median(_child(mode, path, False)["s"] for _ in range(repeat))
    return seconds, _child(mode, path, True)["peak_mb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small trace, one repeat")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("traces", nargs="*", type=Path)
    args = parser.parse_args()
    names = QUICK if args.quick else DEFAULT
    paths = args.traces or [SHARED / n for n in names if (SHARED / n).exists()]
    repeat = 1 if args.quick else args.repeat
    if not paths:
        sys.exit("benchmarks/ingest.py: no traces found (pass paths or put ../shared beside)")
    print("| trace | raw MB | orjson s (MB/s) | load s (MB/s) | load+diagnose s (MB/s) | "
          "load+diagnose / orjson | peak MB orjson / load+diagnose | peak / raw |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        mb = raw_size(path) / 1e6
        results = {m: measure(m, path, repeat) for m in ("orjson", "load", "diag")}
        cells = [f"{s:.2f} ({mb / s:.0f})" for s, _ in results.values()]
        ratio = results["diag"][0] / results["orjson"][0]
        peak = f"{results['orjson'][1]:.0f} / {results['diag'][1]:.0f}"
        print(f"| {path.name[:40]} | {mb:.1f} | {' | '.join(cells)} | {ratio:.2f}x | {peak} | "
              f"{results['diag'][1] / mb:.2f}x |")


if __name__ == "__main__":
    main()
