"""A/B verdicts on this machine: false positives of a no-op knob, and a real fix.

    python benchmarks/ab_noise.py                 # 10 no-op A/B runs + 1 real fix
    python benchmarks/ab_noise.py --repeats 3     # fewer
    python benchmarks/ab_noise.py --quick         # CI smoke test: the real fix, 1 short run

Each row is one complete ``torchtriage ab`` experiment (interleaved trials in separate
processes). The no-op rows A/B ``cudnn.benchmark=true`` on the CPU-only compute-bound example:
the knob sets a CUDA flag and changes nothing, so every verdict should be ``no_change``. The
last row A/Bs ``dataloader.num_workers=2`` on the data-starved example, which must be
``faster`` with ``ci_low > 1``. Prints a Markdown table and the count of ``no_change`` verdicts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from torchtriage.verify.ab import run_ab
from torchtriage.verify.settings import TrialSettings

REPO = Path(__file__).resolve().parents[1]
NO_OP = ("compute_bound", {"cudnn.benchmark": True})
REAL_FIX = ("data_starved", {"dataloader.num_workers": 2})


def experiment(example: str, knobs: dict, out: Path, trials: int, steps: int,
               min_measure_s: float):
    command = [sys.executable, str(REPO / "examples" / f"{example}.py"), "--steps", "1000"]
    start = time.perf_counter()
    result = run_ab(command, out, TrialSettings(trials=trials, warmup=3, steps=steps,
                                                min_measure_s=min_measure_s), knobs=knobs)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:  # the rows of both kinds come from one function: one row shows it prints
        args.repeats, args.trials, args.steps = 0, 2, 3
    cases = [NO_OP] * args.repeats + [REAL_FIX]
    min_measure_s = 0.0 if args.quick else TrialSettings().min_measure_s
    print("| # | example | knob | trials/arm | speedup | 95% CI | verdict | parity | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    no_change = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (example, knobs) in enumerate(cases, 1):
            result, took = experiment(example, knobs, Path(tmp) / str(i), args.trials,
                                      args.steps, min_measure_s)
            knob = ", ".join(f"{k}={v}" for k, v in knobs.items())
            ci = (f"{result.ci_low:.3f}-{result.ci_high:.3f}"
                  if result.ci_low is not None else "-")
            speedup = f"{result.speedup:.3f}" if result.speedup is not None else "-"
            print(f"| {i} | {example} | {knob} | {args.trials} | {speedup} | {ci} | "
                  f"{result.verdict} | {result.parity.status} | {took:.0f} |", flush=True)
            if (example, knobs) == NO_OP and result.verdict == "no_change":
                no_change += 1
    if args.repeats:
        print(f"\nno-op knob: no_change in {no_change}/{args.repeats} runs")


if __name__ == "__main__":
    main()
