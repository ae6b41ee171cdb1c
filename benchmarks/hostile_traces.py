"""Hostile trace files of issue 18 (items 3 and 4): time and peak memory of `torchtriage
analyze` on each, in a child process under TORCHTRIAGE_MEMORY_LIMIT.

    python benchmarks/hostile_traces.py                 # the issue's sizes (needs ~3 GB of /tmp)
    python benchmarks/hostile_traces.py --scale 0.125   # the same at an eighth of the size
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 2**20
HEADER = b'{"traceEvents": ['
STRETCH = HEADER + b'{"name": "'  # an unclosed string: no event boundary after it
EVENT = json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                    "ts": 1, "dur": 2}).encode()


def _write(path: Path, head: bytes, filler: bytes, size: int) -> Path:
    with path.open("wb") as f:
        f.write(head)
        chunk = filler * (MB // len(filler))
        for _ in range(size // MB):
            f.write(chunk)
    return path


def _bomb(path: Path, filler: bytes, size: int) -> Path:
    member = gzip.compress(filler * (64 * MB), 1)
    with path.open("wb") as f:
        for _ in range(size // (64 * MB)):
            f.write(member)
    return path


def cases(directory: Path, scale: float) -> list[tuple[str, Path]]:
    def mb(n: float) -> int:
        return int(n * scale) * MB

    prefix = HEADER + b", ".join([EVENT] * int(13 * MB * scale // (len(EVENT) + 2)))
    d = directory
    return [
        (f"unclosed string, {mb(32) // MB} MB", _write(d / "a.json", STRETCH, b"a", mb(32))),
        (f"unclosed string, {mb(128) // MB} MB", _write(d / "b.json", STRETCH, b"a", mb(128))),
        (f"unclosed string, {mb(256) // MB} MB", _write(d / "c.json", STRETCH, b"a", mb(256))),
        (f"valid {len(prefix) // MB} MB + NUL tail, {mb(256) // MB} MB",
         _write(d / "d.json", prefix + b", {", b"\0", mb(256))),
        (f"unclosed string, {mb(1024) // MB} MB",
         _write(d / "e.json", STRETCH, b"a", mb(1024))),
        (f"zeros, {mb(1024) // MB} MB", _write(d / "f.json", b"", b"\0", mb(1024))),
        (f"spaces after the header, {mb(512) // MB} MB",
         _write(d / "g.json", HEADER, b" ", mb(512))),
        (f"gzip of {mb(3072) // MB} MB of zeros", _bomb(d / "h.json.gz", b"\0", mb(3072))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--limit", default="512MiB")
    args = parser.parse_args()
    env = {**os.environ, "TORCHTRIAGE_MEMORY_LIMIT": args.limit}
    print(f"| file (TORCHTRIAGE_MEMORY_LIMIT={args.limit}) | on disk | time | peak RSS | "
          "exit | message |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in cases(Path(tmp), args.scale):
            code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
                    "p = subprocess.run([sys.executable, '-m', 'torchtriage', 'analyze', "
                    "sys.argv[1]], capture_output=True, text=True); print(p.returncode, "
                    "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
                    "time.perf_counter() - t); print(p.stderr.strip()[-150:])")
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", code, str(path)], env=env,
                                  capture_output=True, text=True)
            first, _, message = done.stdout.partition("\n")
            rc, rss_kb, seconds = (first.split() if first
                                   else ("?", 0, time.perf_counter() - start))
            message = message.strip().replace(str(path), "FILE").replace("|", "/")
            print(f"| {name} | {path.stat().st_size / MB:,.1f} MB | {float(seconds):.2f} s | "
                  f"{int(rss_kb) / 1024:.0f} MiB | {rc} | {message} |", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
