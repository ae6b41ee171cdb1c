"""What a user waits for: whole processes, imports and interpreter start included.

Run by ``benchmarks/trace_scale.py --whole-process``. Every command is a fresh process started
from here (the same interpreter for torchtriage and for the baseline), timed from start to
exit; each cell is the median of ``repeat`` runs, the runs of one row interleaved. torchtriage
runs from this checkout's ``src`` with its bytecode compiled first (``compileall``), as a wheel
install leaves it; HTA runs in its own interpreter (``--hta-python``) as a script that loads
the trace and computes the temporal, idle-time, comm-compute overlap and GPU-kernel
breakdowns.

Both sides should start alike: an interpreter's ``site`` runs every ``.pth`` file of its
site-packages, and a machine's own ones can cost more than the work (this sandbox's
certificate hook: 40 ms per start against 10 ms in a fresh venv). So ``--python`` names the
interpreter that runs torchtriage (default: this one), made like HTA's (``python -m venv``, then
``pip install msgspec isal numpy plotly psutil rich orjson``, orjson for the throughput
table's floor; ``analyze`` never imports torch), and the
tables print each interpreter's bare start (``-c pass``).

The throughput table puts the load in MB/s of uncompressed JSON beside the floors it is built
on: ``gzip -dc > /dev/null``, a bare ``msgspec.json.decode`` and ``orjson.loads`` of the
inflated bytes (each timed inside its process, without imports), torchtriage's ``load_trace``
(the same) and the whole ``torchtriage analyze --json`` process.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
# HTA's side, shared with trace_scale.py's in-process table: load, then the four breakdowns
# (those that fail on a trace are named in `failed`).
HTA_ANALYSES = r"""
analysis = TraceAnalysis(trace_dir=trace_dir)
ranks = list(analysis.t.traces)
failed = []
for name, kwargs in (("get_temporal_breakdown", {}), ("get_idle_time_breakdown",
                     {"ranks": ranks}), ("get_comm_comp_overlap", {}),
                     ("get_gpu_kernel_breakdown", {})):
    try:
        getattr(analysis, name)(visualize=False, **kwargs)
    except Exception as exc:
        failed.append(name)
"""
HTA_SCRIPT = r"""
import logging, sys, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
trace_dir = sys.argv[1]
""" + HTA_ANALYSES + r"""
if failed:
    print("failed: " + ", ".join(failed), file=sys.stderr)
"""
FLOORS = r"""
import gzip, json, sys, time
import msgspec, orjson
data = open(sys.argv[1], "rb").read()
t = time.perf_counter()
raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
inflate = time.perf_counter() - t
out = {"mb": len(raw) / 1e6, "zlib": inflate}
for name, parse in (("msgspec", msgspec.json.decode), ("orjson", orjson.loads)):
    t = time.perf_counter()
    parse(raw)
    out[name] = time.perf_counter() - t
from torchtriage.trace import load_trace
t = time.perf_counter()
load_trace(sys.argv[1])
out["load"] = time.perf_counter() - t
print(json.dumps(out))
"""


def checkout_env() -> dict[str, str]:
    """The environment with this checkout's ``src`` first on the path (what is measured)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return env


def _wall(argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
          timeout: float = 600) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
                          env=env, timeout=timeout)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}...: exit {done.returncode}: "
                           f"{done.stderr.decode()[-300:]}")
    return seconds


def _medians(commands: dict[str, tuple[list[str], dict]], repeat: int) -> dict[str, float]:
    """Each command's median wall time over ``repeat`` rounds, the commands interleaved."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, (argv, kwargs) in commands.items():
            times[name].append(_wall(argv, **kwargs))
    return {name: statistics.median(t) for name, t in times.items()}


def _hta_dir(trace: Path, workdir: Path) -> Path:
    folder = workdir / "hta-whole" / trace.name.replace(".", "_")
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / trace.name
    if not link.exists():
        link.symlink_to(trace.resolve())
    return folder


def interpreter_starts(pythons: dict[str, str], repeat: int) -> str:
    """Each interpreter's bare start (``-c pass``), median of ``repeat``, as one line."""
    starts = _medians({name: ([py, "-c", "pass"], {}) for name, py in pythons.items()},
                      repeat)
    return "; ".join(f"{name} `{pythons[name]} -c pass` {s * 1000:.0f} ms"
                     for name, s in starts.items())


def whole_process_table(small: Path, large: list[Path], hta_python: str | None, repeat: int,
                        workdir: Path, raw_mb: dict[Path, float],
                        python: str = sys.executable) -> None:
    """The three rows of the issue: --version and analyze of a small CPU trace against the
    time to import rich's console; analyze --json of large traces against HTA."""
    compileall.compile_dir(str(SRC / "torchtriage"), quiet=1)
    py, env = python, checkout_env()
    ours = [py, "-m", "torchtriage"]
    base = _medians({"rich": ([py, "-c", "import rich.console"], {"env": env}),
                     "version": ([*ours, "--version"], {"env": env}),
                     "analyze": ([*ours, "analyze", str(small)], {"env": env})}, repeat)
    pythons = {"torchtriage": py, **({"HTA": hta_python} if hta_python else {})}
    print(f"Whole processes, median of {repeat} (interleaved), {py} directly; "
          f"{_load()}; interpreter starts: {interpreter_starts(pythons, repeat)}:\n")
    print("| command | s | against | s | ratio | goal | met |")
    print("|---|---|---|---|---|---|---|")
    rich = '`python -c "import rich.console"`'
    for name, label, goal in (("version", "`torchtriage --version`", 1.5),
                              ("analyze", f"`torchtriage analyze {small.name}` "
                                          f"({raw_mb[small]:.1f} MB, CPU only)", 3.0)):
        ratio = base[name] / base["rich"]
        print(f"| {label} | {base[name]:.3f} | {rich} | {base['rich']:.3f} | {ratio:.2f}x "
              f"| <= {goal:g}x | {'yes' if ratio <= goal else 'no'} |", flush=True)
    for trace in large:
        commands = {"ours": ([*ours, "analyze", "--json", str(trace)], {"env": env})}
        if hta_python:
            commands["hta"] = ([hta_python, "-c", HTA_SCRIPT, str(_hta_dir(trace, workdir))],
                               {"cwd": tempfile.gettempdir()})
        t = _medians(commands, repeat)
        label = f"`torchtriage analyze --json {trace.name}` ({raw_mb[trace]:.1f} MB)"
        if "hta" not in t:
            print(f"| {label} | {t['ours']:.2f} | HTA (not run: --hta-python) | - | - | "
                  ">= 10x | - |", flush=True)
            continue
        speedup = t["hta"] / t["ours"]
        print(f"| {label} | {t['ours']:.2f} | HTA 0.5 load + 4 breakdowns | {t['hta']:.2f} | "
              f"{speedup:.1f}x faster | >= 10x | {'yes' if speedup >= 10 else 'no'} |",
              flush=True)


def _load() -> str:
    """The machine's 1-minute load average: other work on the cores slows every row (and a
    busy machine makes torchtriage decode in one process; see trace/parallel.py)."""
    return (f"1-minute load average {os.getloadavg()[0]:.2f} before the rows"
            if hasattr(os, "getloadavg") else "load average unknown")


def throughput_table(traces: list[Path], repeat: int, python: str = sys.executable) -> None:
    """MB/s of uncompressed JSON: the floors against torchtriage's load and whole command."""
    print(f"\nThroughput, MB/s of uncompressed JSON, median of {repeat}; {_load()}:\n")
    print("| trace | raw MB | `gzip -dc > /dev/null` | zlib inflate | msgspec.json.decode | "
          "orjson.loads | torchtriage load_trace | `torchtriage analyze --json` (whole) |")
    print("|---|---|---|---|---|---|---|---|")
    env = checkout_env()
    gzip_dc = shutil.which("gzip")
    for trace in traces:
        runs = []
        whole, gz = [], []
        for _ in range(repeat):
            out = subprocess.run([python, "-c", FLOORS, str(trace)], env=env,
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            whole.append(_wall([python, "-m", "torchtriage", "analyze", "--json",
                                str(trace)], env=env))
            if gzip_dc and trace.suffix == ".gz":
                gz.append(_wall([gzip_dc, "-dc", str(trace)]))
        mb = runs[0]["mb"]
        rates = {key: f"{mb / statistics.median(r[key] for r in runs):.0f}"
                 for key in ("zlib", "msgspec", "orjson", "load")}
        gz_cell = f"{mb / statistics.median(gz):.0f}" if gz else "-"
        print(f"| {trace.name[:40]} | {mb:.1f} | {gz_cell} | {rates['zlib']} | "
              f"{rates['msgspec']} | {rates['orjson']} | {rates['load']} | "
              f"{mb / statistics.median(whole):.0f} |", flush=True)
