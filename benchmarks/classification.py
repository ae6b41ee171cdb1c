"""Classification accuracy: each bundled example (profiled for real) and each labelled trace.

    python benchmarks/classification.py           # all examples + labelled shared traces
    python benchmarks/classification.py --quick   # labelled traces only (CI smoke test)
    python benchmarks/classification.py --device cuda --save-traces DIR   # on a GPU

Prints one row per case: expected layer, verdict, confidence, analysed steps, median step,
the first prescription, and the seconds the case took; then the accuracy.
"""

from __future__ import annotations

import argparse
import shutil
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
# committed GPU fixtures (tests/fixtures/gpu/README.md) -> (layer, analyze options)
FIXTURES = REPO / "tests" / "fixtures" / "gpu"
GPU_FIXTURES = {
    f"{case}.pt.trace.json.gz": (layer, {})
    for case, layer in (("data_starved", "data_loading"), ("pageable_sync", "data_loading"),
                        ("launch_bound", "host"), ("fp32_compute", "kernel"),
                        ("elementwise_chain", "kernel"), ("memory_pressure", "memory"))
}
STEPS = 8  # wait + warm-up + active of the default schedule
# On a GPU the CPU sizes are too small to keep it busy: compute_bound needs a bigger batch.
GPU_OPTIONS = {"compute_bound": {"batch_size": 8192}}


def run_example(name: str, out: Path, device: str, save: Path | None):
    module = load_example(name)
    # DEVICE_MEMORY is a pretend capacity: on a GPU it stands in for a smaller card.
    profile_options = ({"device_memory": module.DEVICE_MEMORY}
                       if hasattr(module, "DEVICE_MEMORY") else {})
    train_options = GPU_OPTIONS.get(name, {}) if device == "cuda" else {}
    with torchtriage.profile(out / name, **profile_options) as prof:
        module.train(STEPS, device=device, on_step=prof.step, **train_options)
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        shutil.copy(prof.trace_path, save / f"{name}.{device}.pt.trace.json.gz")
    return prof.diagnosis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="labelled traces only")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--save-traces", type=Path, default=None, metavar="DIR",
                        help="copy each example's trace into DIR")
    args = parser.parse_args()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.quick:
            for name, expected in EXAMPLES.items():
                t = time.perf_counter()
                d = run_example(name, Path(tmp), args.device, args.save_traces)
                cases.append((f"examples/{name}.py ({args.device})", expected, d,
                              time.perf_counter() - t))
        labelled = [(f"shared/traces/{rel}", SHARED / rel, expected, {})
                    for rel, expected in TRACES.items()]
        labelled += [(f"fixtures/gpu/{name}", FIXTURES / name, expected, options)
                     for name, (expected, options) in GPU_FIXTURES.items()]
        for label, path, expected, options in labelled:
            if not path.exists():
                continue
            t = time.perf_counter()
            (d,) = torchtriage.analyze(path, **options)
            cases.append((label, expected, d, time.perf_counter() - t))
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
