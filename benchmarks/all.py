"""Every CPU benchmark in one command: trace scale (ingest, analysis, memory, ranks), step
overhead, classification accuracy and A/B verdicts, each printing its table.

    python benchmarks/all.py --hta-python /tmp/htavenv/bin/python   # docs/benchmarks.md
    python benchmarks/all.py --quick                                 # smoke run

The GPU fixtures' table needs a CUDA machine: ``python benchmarks/gpu_fixtures.py``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hta-python", help="python with holistictraceanalysis==0.5.0")
    args = parser.parse_args()
    quick = ["--quick"] if args.quick else []
    hta = ["--hta-python", args.hta_python] if args.hta_python and not args.quick else []
    import torch

    print(f"{date.today()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}\n")
    for title, script, extra in (
            ("Trace scale", "trace_scale.py", hta),
            ("Step overhead", "overhead.py", []),
            ("Classification accuracy", "classification.py", []),
            ("A/B verdicts", "ab_noise.py", [])):
        print(f"## {title} (benchmarks/{script})\n", flush=True)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(HERE / script), *quick, *extra])
        print(f"\n({time.perf_counter() - started:.0f} s)\n", flush=True)
        if done.returncode != 0:
            sys.exit(f"benchmarks/{script} failed (exit {done.returncode})")


if __name__ == "__main__":
    main()
