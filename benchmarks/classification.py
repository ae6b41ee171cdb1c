"""Classification accuracy: each bundled example (profiled for real) and each labelled trace.

    python benchmarks/classification.py           # all examples + labelled shared traces
    python benchmarks/classification.py --quick   # labelled shared traces only (CI smoke test)

Prints one row per case: expected layer, verdict, confidence, analysed steps, median step,
the first prescription, and the seconds the case took; then the accuracy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torchtriage
from torchtriage.demo import load_example

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"

# example script -> the layer it injects
EXAMPLES = {
    "data_starved": "data_loading",
    "compute_bound": "kernel",
    "launch_bound": "host",
    "memory_pressure": "memory",
}
# shared trace -> the layer a correct tool names (labels from the traces' READMEs)
TRACES = {
    "kineto/resnet50_num_workers_0": "data_loading",
}
STEPS = 8  # wait + warm-up + active of the default schedule


def run_example(name: str, out: Path):
    module = load_example(name)
    options = {"device_memory": module.DEVICE_MEMORY} if hasattr(module, "DEVICE_MEMORY") else {}
    with torchtriage.profile(out / name, **options) as prof:
        module.train(STEPS, on_step=prof.step)
    return prof.diagnosis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="labelled shared traces only")
    args = parser.parse_args()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.quick:
            for name, expected in EXAMPLES.items():
                t = time.perf_counter()
                cases.append((f"examples/{name}.py", expected, run_example(name, Path(tmp)),
                              time.perf_counter() - t))
        for rel, expected in TRACES.items():
            if not (SHARED / rel).exists():
                continue
            t = time.perf_counter()
            (d,) = torchtriage.analyze(SHARED / rel)
            cases.append((rel, expected, d, time.perf_counter() - t))
    if not cases:
        sys.exit("benchmarks/classification.py: nothing to run")
    print("| case | expected | verdict | confidence | steps | median step ms | first fix | s |")
    print("|---|---|---|---|---|---|---|---|")
    right = 0
    for name, expected, d, seconds in cases:
        ok = d.primary == expected
        right += ok
        first = d.prescriptions[0].id if d.prescriptions else "-"
        print(f"| {name} | {expected} | {d.primary}{'' if ok else ' ✗'} | {d.confidence} | "
              f"{len(d.trace.steps_analyzed)} | {d.breakdown.median_step_ms:.1f} | {first} | "
              f"{seconds:.1f} |")
    print(f"\naccuracy: {right}/{len(cases)}")
    if right != len(cases):
        sys.exit(1)


if __name__ == "__main__":
    main()
