"""Profile every example on a GPU in its bottleneck form and its fixed form (issue: GPU analyses).

    python benchmarks/gpu_fixtures.py --out DIR   # on a CUDA machine; DIR/<case>.pt.trace.json.gz

Prints one row per case: expected layer and first fix, the verdict, and the evidence the fix
should remove. The traces are the committed fixtures in tests/fixtures/gpu (see its README).
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

import torchtriage
from torchtriage.demo import load_example

STEPS = 8
# case -> (example, train options, profile options, expected layer, expected first fix or None)
CASES: dict[str, tuple[str, dict, dict, str, str | None]] = {
    "data_starved": ("data_starved", {}, {}, "data_loading", "dataloader.num_workers"),
    "data_starved_fixed": ("data_starved", {"num_workers": 4, "pin_memory": True,
                                            "persistent_workers": True}, {}, "", None),
    "pageable_sync": ("pageable_sync", {}, {}, "data_loading", "dataloader.pin_memory"),
    "pageable_sync_fixed": ("pageable_sync", {"pin_memory": True, "non_blocking": True,
                                              "sync_every_step": False}, {}, "", None),
    "launch_bound": ("launch_bound", {}, {}, "host", "optimizer.fused"),
    "launch_bound_fixed": ("launch_bound", {"compile_mode": "reduce-overhead", "foreach": True},
                           {}, "", None),
    "fp32_compute": ("compute_bound", {"batch_size": 8192}, {}, "kernel", "matmul.tf32"),
    "fp32_compute_fixed": ("compute_bound", {"batch_size": 8192, "amp": True}, {}, "", None),
    "elementwise_chain": ("elementwise_chain", {}, {}, "kernel", "compile.default"),
    "elementwise_chain_fixed": ("elementwise_chain", {"compile_model": True}, {}, "", None),
    "memory_pressure": ("memory_pressure", {}, {}, "memory", "memory.grad_accumulation"),
    "memory_pressure_fixed": ("memory_pressure", {"accumulate": 4}, {}, "", None),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print("| case | expected | verdict | confidence | first fix | median step ms | "
          "GPU util | findings | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    failures = 0
    for case, (example, train_options, profile_options, layer, first) in CASES.items():
        if args.only and case not in args.only:
            continue
        module = load_example(example)
        gc.collect()
        torch.cuda.empty_cache()  # each case starts with an empty caching allocator
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            with torchtriage.profile(tmp, **profile_options) as prof:
                module.train(STEPS, device="cuda", on_step=prof.step, **train_options)
            d = prof.diagnosis
            shutil.copy(prof.trace_path, args.out / f"{case}.pt.trace.json.gz")
        fix = d.prescriptions[0].id if d.prescriptions else "-"
        ok = not layer or (d.primary == layer and (first is None or fix == first))
        failures += not ok
        findings = ", ".join(f.id for f in d.findings if f.severity != "info")
        util = f"{d.gpu.utilization:.0%}" if d.gpu else "-"
        print(f"| {case} | {layer or '(fixed)'} {first or ''} | {d.primary}{'' if ok else ' ✗'} "
              f"| {d.confidence} | {fix} | {d.breakdown.median_step_ms:.1f} | {util} | "
              f"{findings} | {time.perf_counter() - t:.0f} |", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
