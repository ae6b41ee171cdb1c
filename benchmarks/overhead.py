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
be told from zero on this machine, so a second table measures what timing mode adds to a step
directly, in one process: the cost of each of its hooks (the optimizer step post-hook that
closes a step, the ``Tensor.backward`` wrapper that keeps the loss, the DataLoader
``__next__`` wrapper that reads the batch size), hooked against unhooked calls interleaved,
in microseconds per step; timing mode's overhead is that cost over the step time.

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


def hook_cost(repeats: int = 20000) -> list[tuple[str, float]]:
    """(hook, µs added per call) of timing mode's hooks, measured in this process."""
    import time

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from torchtriage.capture.autorun import AutoRun
    from torchtriage.results.run import RunConfig

    loss_leaf = torch.ones(1, requires_grad=True)
    original_backward = torch.Tensor.backward
    loader = DataLoader(TensorDataset(torch.zeros(10**6, 1)), batch_size=1)
    from torch.utils.data import dataloader

    original_next = dataloader._BaseDataLoaderIter.__next__
    with tempfile.TemporaryDirectory() as tmp:
        run = AutoRun(RunConfig(out=tmp, mode="time"))
        run.install()
        optimizer = torch.optim.SGD([loss_leaf], lr=0.0)

        def per_call(hooked, plain) -> float:
            """Fastest hooked block minus fastest plain block (interleaved), per call."""
            times: dict[str, list[float]] = {"hooked": [], "plain": []}
            block = repeats // 10
            for _ in range(10):
                for kind, fn in (("hooked", hooked), ("plain", plain)):
                    t = time.perf_counter()
                    for _ in range(block):
                        fn()
                    times[kind].append(time.perf_counter() - t)
            return max(min(times["hooked"]) - min(times["plain"]), 0.0) / block * 1e6

        it = iter(loader)
        rows = [
            ("optimizer.step post-hook (closes the step)",
             per_call(lambda: run._on_optimizer_step(optimizer, (), {}), lambda: None)),
            # each as the first call of a step, the path that records something
            ("Tensor.backward wrapper (keeps the loss)",
             per_call(lambda: (setattr(run.signals, "_loss_this_step", False),
                               loss_leaf.sum().backward()),
                      lambda: (setattr(run.signals, "_loss_this_step", False),
                               original_backward(loss_leaf.sum())))),
            ("DataLoader __next__ wrapper (batch size)",
             per_call(lambda: (setattr(run.signals, "_batch_this_step", False), next(it)),
                      lambda: (setattr(run.signals, "_batch_this_step", False),
                               original_next(it)))),
        ]
        run.finished = True
    return rows


def trial(mode: str, example: str, steps: int, device: str, work: Path) -> list[float]:
    out = work / f"{mode}-{example}.json"
    command = [sys.executable, __file__, "--child", mode, example, str(steps), device, str(out)]
    if mode == "timing":
        from torchtriage.capture.runner import run_command
        from torchtriage.results.run import RunConfig

        config = RunConfig(out=str(work / "run"), mode="time", timing_warmup=WARMUP)
        result = run_command(command, config, log=work / "timing.log")
        if result.returncode != 0:
            sys.exit(f"overhead: timing-mode trial of {example} failed (see {work})")
    else:
        subprocess.run(command, check=True, capture_output=True)
    return json.loads(out.read_text())


def _pct(value: float, base: float) -> str:
    return f"{value:.2f} ({(value / base - 1) * 100:+.1f}%)"


def process_table(examples: dict[str, int], trials: int, device: str) -> None:
    """The process-level table: each example in the three modes, trials interleaved."""
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
                    times = trial(mode, example, steps, device, work)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=5, metavar=("MODE", "EXAMPLE", "STEPS", "DEVICE",
                                                     "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hooks-only", action="store_true", help="only the hook-cost table")
    args = parser.parse_args()
    if args.child:
        mode, example, steps, device, out = args.child
        child(mode, example, int(steps), device, Path(out))
        return
    examples = {} if args.hooks_only else {"launch_bound": 40} if args.quick else EXAMPLES
    if examples:
        process_table(examples, 1 if args.quick else args.trials, args.device)
    rows = hook_cost(2000 if args.quick else 20000)
    total = sum(us for _, us in rows)
    print("\n| timing-mode hook | µs per step |\n|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")
    print(f"| all three | {total:.2f} |\n\ntiming mode adds {total:.1f} µs per step: at most 1% "
          f"of any step of {total / 10:.1f} ms or more", flush=True)


if __name__ == "__main__":
    main()
