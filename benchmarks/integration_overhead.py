"""What the trainer callbacks cost per optimizer step outside their profiling window.

    python benchmarks/integration_overhead.py [--steps 300] [--skip 100]

A small MLP trained on CPU by ``lightning.Trainer`` (``accumulate_grad_batches=2``) and a tiny
GPT-2 built from a config by ``transformers.Trainer`` (``gradient_accumulation_steps=2``), each
with torchtriage's callback for ``--steps`` optimizer steps, the window after ``--skip``. Every
call of the callback's per-step hooks is timed (``perf_counter_ns`` around it) and counted
before the window started, inside it (the profiling session's life, its start and close
included) or after it closed. The table gives, per optimizer step, the hooks' median and 99th
percentile time before and after the window, the median step time outside it (the callback's
own step clock), and the hooks' median after the window as a share of that step (the part of a
long run after its window). Timing single calls on a busy machine mostly measures the timer
and the scheduler, so the last column times the hooks alone, in the state they keep after the
window, in a loop (the fastest of 5 loops of 100,000 calls), per optimizer step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def _phase(window) -> str:
    if window.window is None or window.window.session is None:
        return "before"
    return "after" if not window.collecting else "window"


class _Timed:
    """Per optimizer step, the nanoseconds spent in the callback's hooks, by phase."""

    def __init__(self) -> None:
        self.ns: dict[str, list[int]] = {"before": [], "window": [], "after": []}
        self._pending = 0

    def call(self, window, hook, *args, ends_step: bool, **kwargs) -> None:
        before = _phase(window)
        t0 = time.perf_counter_ns()
        hook(*args, **kwargs)
        self._pending += time.perf_counter_ns() - t0
        if ends_step:
            after = _phase(window)
            self.ns[before if before == after else "window"].append(self._pending)
            self._pending = 0


def _loop_ns(call) -> float:
    """Nanoseconds per call of ``call()`` (the fastest of 5 loops of 100,000 calls)."""
    best = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(100_000):
            call()
        best.append((time.perf_counter_ns() - t0) / 100_000)
    return min(best)


def _after_window(callback, call) -> float:
    """The hook's cost in a loop, in the state it has for the rest of a run after its window
    (the window closed, training still on)."""
    callback.window.active = True  # end() turned it off; the window stays closed
    try:
        return _loop_ns(call)
    finally:
        callback.window.active = False


def _lightning(steps: int, skip: int, root: Path) -> tuple[_Timed, list[float], float]:
    import lightning.pytorch as pl

    from torchtriage.integrations.lightning import TorchtriageCallback

    timed = _Timed()

    class Timed(TorchtriageCallback):
        seen = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            stepped, self.seen = trainer.global_step != self.seen, trainer.global_step
            timed.call(self.window, super().on_train_batch_end, trainer, pl_module, outputs,
                       batch, batch_idx, ends_step=stepped)

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                           torch.nn.Linear(512, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    callback = Timed(skip=skip)
    trainer = pl.Trainer(default_root_dir=root, max_steps=steps, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accumulate_grad_batches=2,
                         callbacks=[callback])
    model = MLP()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=32, shuffle=True))
    outputs, batch = {"loss": torch.tensor(1.0)}, [torch.zeros(32, 256), torch.zeros(32)]
    loop = _after_window(callback, lambda: TorchtriageCallback.on_train_batch_end(
        callback, trainer, model, outputs, batch, 0))
    return timed, _outside(callback.window), 2 * loop  # two batches per optimizer step


def _transformers(steps: int, skip: int, root: Path) -> tuple[_Timed, list[float], float]:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    from torchtriage.integrations.transformers import TorchtriageCallback

    hf_logging.set_verbosity_error()
    timed = _Timed()

    class Timed(TorchtriageCallback):
        def on_step_end(self, args, state, control, **kwargs):
            timed.call(self.window, super().on_step_end, args, state, control, ends_step=True,
                       **kwargs)

        def on_log(self, args, state, control, logs=None, **kwargs):
            timed.call(self.window, super().on_log, args, state, control, ends_step=False,
                       logs=logs, **kwargs)

    class Tokens(torch.utils.data.Dataset):
        ids = torch.randint(0, 64, (4096, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    callback = Timed(skip=skip)
    args = TrainingArguments(output_dir=str(root), max_steps=steps, per_device_train_batch_size=8,
                             gradient_accumulation_steps=2, logging_steps=10,
                             save_strategy="no", report_to="none", use_cpu=True,
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback])
    trainer.train()
    loop = _after_window(callback, lambda: TorchtriageCallback.on_step_end(
        callback, trainer.args, trainer.state, trainer.control))
    return timed, _outside(callback.window), loop


def _outside(window) -> list[float]:
    """Host step times before the window's session and after its check."""
    times = window.clock.host_step_ms()  # index i: step i + 2
    checks = window.window.checks
    if not checks:
        return times
    first, last = checks[0].skipped_steps + 1, checks[-1].last_step + 1  # + the export
    return [t for i, t in enumerate(times) if not first <= i + 2 <= last]


def _us(values: list[int], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--skip", type=int, default=100)
    args = parser.parse_args()
    print("## Trainer callbacks: cost per optimizer step outside the window\n")
    print(f"{args.steps} optimizer steps, window after {args.skip}; hooks' time per step in µs "
          "(median / p99)\n")
    print("| trainer | steps before | hooks before | steps after | hooks after | "
          "median step ms outside | hooks after / step | hooks after, in a loop |")
    print("|---|---|---|---|---|---|---|---|")
    for name, run in (("lightning", _lightning), ("transformers", _transformers)):
        with tempfile.TemporaryDirectory() as root:
            timed, steps, loop_ns = run(args.steps, args.skip, Path(root))
        step_ms = statistics.median(steps)
        after = timed.ns["after"]
        share = statistics.median(after) / 1e6 / step_ms if after else 0.0
        print(f"| {name} | {len(timed.ns['before'])} | {_us(timed.ns['before'], 0.5)} / "
              f"{_us(timed.ns['before'], 0.99)} | {len(after)} | {_us(after, 0.5)} / "
              f"{_us(after, 0.99)} | {step_ms:.2f} | {share:.3%} | {loop_ns / 1e3:.2f} |")

if __name__ == "__main__":
    main()
