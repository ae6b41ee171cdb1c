"""Step overhead of measuring: nothing, torchtriage's timing mode, and torch.profiler.

Each example's ``train(steps, device, on_step)`` runs in a fresh process, timed by the same
clock (``perf_counter`` at every ``on_step``) in three modes, interleaved trial by trial:

  none      the example alone
  timing    under the torchtriage bootstrap in timing mode, as every A/B trial runs (step
            hooks on optimizer.step, backward and DataLoader, no profiler)
  profiler  inside torch.profiler with the seed schedule (wait=1, warmup=2, active=5,
            record_shapes, profile_memory) started at step 10: steps in the active window,
            and the steps after the window closes

Cells are the median over trials of each trial's median step (ms), and the change against
``none``. Overhead below the trial-to-trial noise (the ``none`` column's spread, shown) cannot
be told from zero on this machine.

    python benchmarks/overhead.py                      # CPU examples, 5 trials
    python benchmarks/overhead.py --quick              # one example, 1 trial (CI smoke test)
    python benchmarks/overhead.py --device cuda        # on a GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = {  # example -> steps per trial on CPU
    "data_starved": 40,
    "compute_bound": 40,
    "launch_bound": 150,
    "elementwise_chain": 60,
}
PROFILE_START = 10  # the profiler's schedule starts at this step (after warm-up)
WARMUP = 5  # steps left out of every median


def child(mode: str, example: str, steps: int, device: str, out: Path) -> None:
    """Run one trial in this process and write its step times (ms) to ``out``."""
    import time

    import torch

    from torchtriage.demo import load_example

    module = load_example(example)
    ends: list[float] = []
    profiler = None
    if mode == "profiler":
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, profile_memory=True,
            schedule=torch.profiler.schedule(wait=1, warmup=2, active=5, repeat=1),
            on_trace_ready=lambda p: None)

    def on_step() -> None:
        if device == "cuda":
            torch.cuda.synchronize()
        ends.append(time.perf_counter())
        if profiler is not None:
            if len(ends) == PROFILE_START:
                profiler.start()
            elif len(ends) > PROFILE_START:
                profiler.step()

    module.train(steps, device, on_step)
    if profiler is not None:
        profiler.stop()
    times = [(b - a) * 1e3 for a, b in itertools.pairwise(ends)]
    out.write_text(json.dumps(times))


def trial(mode: str, example: str, steps: int, device: str, work: Path) -> list[float]:
    out = work / f"{mode}-{example}.json"
    command = [sys.executable, __file__, "--child", mode, example, str(steps), device, str(out)]
    if mode == "timing":
        from torchtriage.capture.runner import run_command

        result = run_command(command, work / "run", mode="time", warmup=WARMUP,
                             log=work / "timing.log")
        if result.returncode != 0:
            sys.exit(f"overhead: timing-mode trial of {example} failed (see {work})")
    else:
        subprocess.run(command, check=True, capture_output=True)
    return json.loads(out.read_text())


def _pct(value: float, base: float) -> str:
    return f"{value:.2f} ({(value / base - 1) * 100:+.1f}%)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=5, metavar=("MODE", "EXAMPLE", "STEPS", "DEVICE",
                                                     "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.child:
        mode, example, steps, device, out = args.child
        child(mode, example, int(steps), device, Path(out))
        return
    examples = {"launch_bound": 40} if args.quick else EXAMPLES
    trials = 1 if args.quick else args.trials
    print("| example | trials | none ms (spread) | timing mode ms | profiler, active window ms "
          "| profiler, after the window ms |")
    print("|---|---|---|---|---|---|")
    window = slice(PROFILE_START, PROFILE_START + 8)  # the wait, warm-up and active steps
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for example, steps in examples.items():
            medians: dict[str, list[float]] = {"none": [], "timing": [], "active": [],
                                               "after": []}
            for _ in range(trials):
                for mode in ("none", "timing", "profiler"):
                    times = trial(mode, example, steps, args.device, work)
                    if mode == "profiler":
                        active = times[window][3:]  # the 5 active steps
                        medians["active"].append(statistics.median(active))
                        medians["after"].append(statistics.median(times[window.stop + 1:]))
                    else:
                        medians[mode].append(statistics.median(times[WARMUP:]))
            base = statistics.median(medians["none"])
            spread = (max(medians["none"]) - min(medians["none"])) / base * 100
            cells = [_pct(statistics.median(medians[k]), base)
                     for k in ("timing", "active", "after")]
            print(f"| {example} | {trials} | {base:.2f} (±{spread / 2:.1f}%) | "
                  f"{' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
