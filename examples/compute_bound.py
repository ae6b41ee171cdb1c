"""Compute-bound training: the math kernels are the bottleneck (layer: kernel).

What: an MLP 1024 -> 3072 -> 3072 -> 1024 (~16M parameters) trained with batch 64 on
batches that are generated once and kept in memory, so there is no per-item
preprocessing and no data-loading cost. Each step is ~6 GFLOP of matrix multiplies
(forward + backward), so nearly all step time is spent inside ``aten::addmm`` / ``aten::mm``.

Why: the work itself is large dense math; neither the input pipeline nor Python/dispatch
overhead matter. This is the "healthy" case: the device is busy doing useful work.

Fix: make the kernels cheaper or faster rather than touching the input pipeline: mixed
precision on GPU (``--amp``: fp16 autocast; on CPUs without native bf16 it is slower),
TF32/tensor cores, ``torch.compile``, a smaller model, or a faster device (``--device cuda``).

Run::

    python examples/compute_bound.py                # ~100 ms/step on a 2-core CPU
    python examples/compute_bound.py --device cuda
    python examples/compute_bound.py --device cuda --amp   # first fix: fp16 matmuls
    python examples/compute_bound.py --profile out/ # diagnose with torchtriage
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable

import torch
from torch import nn

BATCH_SIZE = 64
SIZES = (1024, 3072, 3072, 1024)
NUM_BATCHES = 4  # distinct in-memory batches, cycled


def build_model(sizes: tuple[int, ...] = SIZES) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_batches(
    device: torch.device, batch_size: int = BATCH_SIZE, sizes: tuple[int, ...] = SIZES
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Precompute a few regression batches in memory (on the target device)."""
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(NUM_BATCHES):
        x = torch.randn(batch_size, sizes[0], generator=gen)
        y = torch.randn(batch_size, sizes[-1], generator=gen)
        batches.append((x.to(device), y.to(device)))
    return batches


def train(
    steps: int,
    device: str = "cpu",
    on_step: Callable[[], None] | None = None,
    *,
    batch_size: int = BATCH_SIZE,
    amp: bool = False,
) -> list[float]:
    """Run `steps` optimizer steps; call on_step() after each optimizer step; return losses."""
    torch.manual_seed(0)
    dev = torch.device(device)
    model = build_model().to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.MSELoss()
    batches = make_batches(dev, batch_size)
    amp_dtype = torch.float16 if dev.type == "cuda" else torch.bfloat16
    losses: list[float] = []
    model.train()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp):
            loss = loss_fn(model(x).float(), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
        if on_step is not None:
            on_step()
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument(
        "--amp",
        action="store_true",
        help="autocast: fp16 on CUDA, bf16 on CPU (slow without native bf16)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="profile with torchtriage and write results to DIR",
    )
    args = parser.parse_args(argv)
    options = {"batch_size": args.batch_size, "amp": args.amp}
    if args.profile:
        import torchtriage

        with torchtriage.profile(out_dir=args.profile) as prof:
            losses = train(args.steps, args.device, on_step=prof.step, **options)
        print(torchtriage.render_text(prof.diagnosis))
    else:
        start = time.perf_counter()
        losses = train(args.steps, args.device, **options)
        elapsed = time.perf_counter() - start
        print(f"{len(losses)} steps in {elapsed:.2f}s ({1000 * elapsed / len(losses):.1f} ms/step)")
    print(f"final loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
