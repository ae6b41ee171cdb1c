"""Trace-scale ingest and analysis: torchtriage against HTA 0.5 and bare orjson.

For each trace (the largest in ../shared/traces, and a synthetic GPU trace of --synthetic-mb
written by benchmarks/synthetic_trace.py), each tool runs in a fresh child process:

  orjson       gunzip + orjson.loads: parsing only, the floor any Python tool starts from
  torchtriage  load_trace + diagnose: everything `torchtriage analyze` computes
  HTA          TraceAnalysis load + temporal, idle-time, comm-compute overlap and GPU kernel
               breakdowns (needs --hta-python: an interpreter with holistictraceanalysis 0.5)

Wall time is the median over --repeat runs; MB/s is of uncompressed JSON; peak is the most
resident memory the work added (the process's VmHWM at the end minus its RSS after the
imports, plus what a parallel load's helper added beyond it), measured in the same runs.
Then multi-rank scaling: a directory of N copies of a trace as ranks, through
torchtriage.analyze with 1 and 2 worker processes.

    python benchmarks/trace_scale.py --hta-python /tmp/htavenv/bin/python   # full table
    python benchmarks/trace_scale.py --quick     # small trace, 5 MB synthetic (CI smoke test)
    python benchmarks/trace_scale.py --peaks     # peak memory on every shared trace
    python benchmarks/trace_scale.py --whole-process --hta-python /work/venv-hta/bin/python \
        --python /work/venv-tt/bin/python

--whole-process times what a user waits for instead (benchmarks/whole_process.py): whole
processes of `torchtriage --version` and `analyze` of a 1 MB CPU-only trace against importing
rich's console, `analyze --json` of the MTIA and df_index_resolver traces against HTA as a
whole process, and the load's MB/s beside `gzip -dc`, msgspec and orjson.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from synthetic_trace import write_synthetic_trace  # benchmarks/ is on sys.path as a script
from whole_process import HTA_ANALYSES, checkout_env, throughput_table, whole_process_table

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
DEFAULT = [
    "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
]
QUICK = ["hta/trace_filter/sampled_rank-0.json.gz"]
WHOLE_SMALL = "hta/rank_non_gpu/rank_non_gpu.json.gz"  # 1.0 MB, CPU ops only
WHOLE_LARGE = DEFAULT[:2]  # MTIA (87 MB) and df_index_resolver (54 MB)

CHILD = r"""
import json, os, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

if mode == "orjson":
    import gzip, orjson
elif mode == "torchtriage":
    from torchtriage.diagnosis.diagnose import diagnose
    from torchtriage.trace import load_trace
else:
    import logging, warnings
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
base = rss()
t = time.perf_counter()
failed = []
if mode == "orjson":
    data = open(path, "rb").read()
    doc = orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
elif mode == "torchtriage":
    diagnose(load_trace(path))
else:
    trace_dir = path
    exec(HTA_ANALYSES)
elapsed = time.perf_counter() - t
def high_water():
    # This process's own peak. ru_maxrss would carry the peak of the process that started
    # this one (Linux records the old image's high-water mark at exec): a benchmark that has
    # read large files would lend every child its size. VmHWM starts afresh at exec.
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

peak = high_water() - base
# a parallel load's helper: what it added beyond the process it was forked from
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
peak += max(children - base, 0) if children else 0
print(json.dumps({"s": elapsed, "peak": peak, "failed": failed}))
""".replace("HTA_ANALYSES", repr(HTA_ANALYSES))


def raw_size(path: Path) -> int:
    with path.open("rb") as head:
        gzipped = head.read(2) == b"\x1f\x8b"
    with gzip.open(path) if gzipped else path.open("rb") as f:
        return sum(len(block) for block in iter(lambda: f.read(1 << 24), b""))


def run_child(python: str, mode: str, target: Path, timeout: float) -> dict | None:
    try:
        proc = subprocess.run([python, "-c", CHILD, mode, str(target)], capture_output=True,
                              text=True, timeout=timeout,
                              cwd=tempfile.gettempdir() if mode == "hta" else None,
                              env=None if mode == "hta" else checkout_env())
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:80]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(python: str, mode: str, target: Path, repeat: int, timeout: float) -> dict:
    runs = [run_child(python, mode, target, timeout) for _ in range(repeat)]
    ok = [r for r in runs if r and "error" not in r]
    if not ok:
        return {"error": runs[0]["error"] if runs and runs[0] else "failed"}
    return {"s": statistics.median(r["s"] for r in ok), "peak": max(r["peak"] for r in ok),
            "failed": ok[0]["failed"]}


def _cell(result: dict | None, mb: float) -> str:
    if result is None:
        return "-"
    if "error" in result:
        return f"error: {result['error']}"
    note = f" ({len(result['failed'])} analyses failed)" if result.get("failed") else ""
    return f"{result['s']:.2f} ({mb / result['s']:.0f}){note}"


def ingest_table(rows: list[tuple[Path, int]], hta_python: str | None, timeout: float,
                 hta_dir: Path, hta_max_mb: float = float("inf")) -> None:
    """One row per (trace, repeats)."""
    print("| trace | raw MB | orjson s (MB/s) | torchtriage s (MB/s) | HTA s (MB/s) | "
          "HTA / torchtriage | torchtriage / orjson | peak MB orjson / torchtriage / HTA | "
          "torchtriage peak / raw |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path, repeat in rows:
        mb = raw_size(path) / 1e6
        ours = measure(sys.executable, "torchtriage", path, repeat, timeout)
        floor = measure(sys.executable, "orjson", path, repeat, timeout)
        hta = None
        if hta_python and mb > hta_max_mb:
            hta = {"error": f"not run (> {hta_max_mb:g} MB)"}
        elif hta_python:
            folder = hta_dir / path.name.replace(".", "_")
            folder.mkdir(parents=True, exist_ok=True)
            link = folder / path.name
            if not link.exists():
                link.symlink_to(path.resolve())
            hta = measure(hta_python, "hta", folder, repeat, timeout)
        speed = (f"{hta['s'] / ours['s']:.1f}x" if hta and "s" in hta and "s" in ours
                 else "-")
        floor_ratio = (f"{ours['s'] / floor['s']:.2f}x" if "s" in ours and "s" in floor
                       else "-")
        peaks = " / ".join(f"{r['peak'] / 1e6:.0f}" if r and "peak" in r else "-"
                           for r in (floor, ours, hta))
        peak_ratio = f"{ours['peak'] / 1e6 / mb:.2f}x" if "peak" in ours else "-"
        print(f"| {path.name[:44]} | {mb:.1f} | {_cell(floor, mb)} | {_cell(ours, mb)} | "
              f"{_cell(hta, mb)} | {speed} | {floor_ratio} | {peaks} | {peak_ratio} |",
              flush=True)


SCALING_CHILD = r"""
import sys, time
from torchtriage import analyze
t = time.perf_counter()
analyze(sys.argv[1], workers=int(sys.argv[2]))
print(time.perf_counter() - t)
"""


def peaks_table(paths: list[Path], timeout: float) -> None:
    """Peak memory against the JSON's size for every trace: the most resident memory the
    load and diagnosis added (the helper of a parallel load included), one run each."""
    print("| trace | raw MB | peak MB | peak / raw |")
    print("|---|---|---|---|")
    for path in paths:
        mb = raw_size(path) / 1e6
        result = run_child(sys.executable, "torchtriage", path, timeout)
        name = str(path.relative_to(SHARED)) if path.is_relative_to(SHARED) else path.name
        if not result or "error" in result:
            print(f"| {name} | {mb:.2f} | {(result or {}).get('error', 'failed')} | - |")
            continue
        print(f"| {name} | {mb:.2f} | {result['peak'] / 1e6:.1f} | "
              f"{result['peak'] / 1e6 / mb:.2f}x |", flush=True)


def scaling_table(trace: Path, ranks: int, repeat: int, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    suffix = "".join(trace.suffixes[-2:]) if trace.name.endswith(".gz") else ".json"
    for rank in range(ranks):
        link = folder / f"rank{rank}{suffix}"
        link.unlink(missing_ok=True)  # a link left by an earlier run may dangle
        link.symlink_to(trace.resolve())
    mb = raw_size(trace) * ranks / 1e6
    print(f"\nMulti-rank: {ranks} ranks x {trace.name} ({mb:.0f} MB of JSON), "
          f"torchtriage.analyze(dir, workers=N), median of {repeat}:\n")
    print("| workers | s | MB/s | speedup over 1 worker |")
    print("|---|---|---|---|")
    one = None
    for workers in (1, 2):
        seconds = statistics.median(
            float(subprocess.run([sys.executable, "-c", SCALING_CHILD, str(folder),
                                  str(workers)], capture_output=True, text=True,
                                 env=checkout_env(), check=True).stdout.strip().splitlines()[-1])
            for _ in range(repeat))
        one = one or seconds
        print(f"| {workers} | {seconds:.2f} | {mb / seconds:.0f} | {one / seconds:.2f}x |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one small trace, a 5 MB synthetic one, one repeat, no HTA")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--synthetic-mb", type=float, default=1000.0)
    parser.add_argument("--synthetic-repeat", type=int, default=1,
                        help="repeats for the synthetic trace (it is large)")
    parser.add_argument("--hta-python", help="python with holistictraceanalysis==0.5.0")
    parser.add_argument("--hta-max-mb", type=float, default=float("inf"),
                        help="skip HTA on traces larger than this (it needs minutes per GB)")
    parser.add_argument("--ranks", type=int, default=8, help="ranks in the scaling table")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per child, seconds")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) /
                        "torchtriage-bench", help="where the synthetic trace is written")
    parser.add_argument("--whole-process", action="store_true",
                        help="time whole processes against rich's import and HTA, and the "
                             "load's MB/s against gzip -dc, msgspec and orjson")
    parser.add_argument("--python", default=sys.executable,
                        help="--whole-process: the interpreter that runs torchtriage (made "
                             "like HTA's venv, so that both start alike: see whole_process.py)")
    parser.add_argument("--peaks", action="store_true",
                        help="peak memory against the JSON's size on every shared trace (and "
                             "the synthetic one, when written)")
    parser.add_argument("traces", nargs="*", type=Path)
    args = parser.parse_args()
    if args.peaks:
        paths = args.traces or sorted(p for p in SHARED.rglob("*.json*") if p.is_file())
        synthetic = args.workdir / f"synthetic_{args.synthetic_mb:g}MB.json"
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; one run each\n")
        peaks_table(paths + ([synthetic] if synthetic.exists() and not args.traces else []),
                    args.timeout)
        return
    if args.whole_process:
        small, large = SHARED / WHOLE_SMALL, [SHARED / n for n in WHOLE_LARGE]
        if args.quick:
            small, large = SHARED / WHOLE_SMALL, [SHARED / QUICK[0]]
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores\n")
        mb = {p: raw_size(p) / 1e6 for p in (small, *large)}
        whole_process_table(small, large, None if args.quick else args.hta_python,
                            1 if args.quick else args.repeat, args.workdir, mb, args.python)
        throughput_table(large, 1 if args.quick else args.repeat, args.python)
        return
    repeat = 1 if args.quick else args.repeat
    synthetic_mb = 5.0 if args.quick else args.synthetic_mb
    hta_python = None if args.quick else args.hta_python
    names = QUICK if args.quick else DEFAULT
    paths = args.traces or [SHARED / n for n in names if (SHARED / n).exists()]

    args.workdir.mkdir(parents=True, exist_ok=True)
    synthetic = args.workdir / f"synthetic_{synthetic_mb:g}MB.json"
    if not synthetic.exists() or abs(synthetic.stat().st_size / 1e6 - synthetic_mb) > 2:
        started = time.perf_counter()
        write_synthetic_trace(synthetic, int(synthetic_mb * 1e6))
        print(f"(wrote {synthetic} in {time.perf_counter() - started:.0f} s)\n", flush=True)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; median of {repeat} "
          f"(synthetic: {1 if args.quick else args.synthetic_repeat})\n")
    rows = [(p, repeat) for p in paths]
    rows.append((synthetic, 1 if args.quick else args.synthetic_repeat))
    ingest_table(rows, hta_python, args.timeout, args.workdir / "hta", args.hta_max_mb)
    scaling = paths[0] if paths else synthetic
    scaling_table(scaling, 2 if args.quick else args.ranks, repeat,
                  args.workdir / f"ranks_{scaling.name.replace('.', '_')}")


if __name__ == "__main__":
    main()
