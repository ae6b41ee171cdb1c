"""Memory-pressure training: peak memory is the bottleneck (layer: memory).

What: a deep, narrow MLP (20 x [Linear(64) + LayerNorm + GELU] + a Linear head, ~84k
parameters) trained with Adam on a huge batch (16384 samples) precomputed in memory.
Params, grads and Adam's two moment buffers are tiny (~1.4 MB); the peak is the
activations autograd keeps for backward: every block saves ~3 tensors of 16384 x 64
floats (4 MiB each), ~250 MiB in all. That is ~94% of ``DEVICE_MEMORY``, a pretend
device capacity that stands in for a GPU's memory when running on CPU: a slightly bigger
batch or a few more layers would run out of memory.

Why: activation memory grows linearly with batch size x depth x width, and the batch
was sized without regard for the device's capacity.

Fix: shrink the activations: a smaller batch (``--batch-size 4096``, with gradient
accumulation to keep the effective batch), activation checkpointing
(``torch.utils.checkpoint``), or mixed precision on GPU.

Run::

    python examples/memory_pressure.py
    python examples/memory_pressure.py --device cuda
    python examples/memory_pressure.py --batch-size 4096    # first fix
    python examples/memory_pressure.py --profile out/       # diagnose with torchtriage
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

# Pretend device capacity used on CPU (peak Total Allocated is ~94% of it).
DEVICE_MEMORY = "267MiB"

BATCH_SIZE = 16384
IN_FEATURES = 32
WIDTH = 64
DEPTH = 20
NUM_CLASSES = 10
NUM_BATCHES = 2  # distinct in-memory batches, cycled


def build_model(depth: int = DEPTH, width: int = WIDTH) -> nn.Sequential:
    layers: list[nn.Module] = []
    fan_in = IN_FEATURES
    for _ in range(depth):
        layers += [nn.Linear(fan_in, width), nn.LayerNorm(width), nn.GELU()]
        fan_in = width
    layers.append(nn.Linear(fan_in, NUM_CLASSES))
    return nn.Sequential(*layers)


def train(
    steps: int,
    device: str = "cpu",
    on_step: Callable[[], None] | None = None,
    *,
    batch_size: int = BATCH_SIZE,
) -> list[float]:
    """Run `steps` optimizer steps; call on_step() after each optimizer step; return losses."""
    torch.manual_seed(0)
    dev = torch.device(device)
    model = build_model().to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(batch_size, IN_FEATURES, generator=gen).to(dev),
            torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen).to(dev),
        )
        for _ in range(NUM_BATCHES)
    ]
    losses: list[float] = []
    model.train()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
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
        "--profile",
        metavar="DIR",
        default=None,
        help="profile with torchtriage and write results to DIR",
    )
    args = parser.parse_args(argv)
    options = {"batch_size": args.batch_size}
    if args.profile:
        import torchtriage

        # On CPU there is no device capacity to measure against: pass the pretend one.
        extra = {"device_memory": DEVICE_MEMORY} if args.device == "cpu" else {}
        with torchtriage.profile(out_dir=args.profile, **extra) as prof:
            losses = train(args.steps, args.device, on_step=prof.step, **options)
        print(prof.diagnosis.render_text())
    else:
        start = time.perf_counter()
        losses = train(args.steps, args.device, **options)
        elapsed = time.perf_counter() - start
        print(f"{len(losses)} steps in {elapsed:.2f}s ({1000 * elapsed / len(losses):.1f} ms/step)")
    print(f"final loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
