"""Pageable, synchronous input copies: the input transfer is the bottleneck (layer: data_loading).

What: every step moves a large image batch (256 x 3 x 224 x 224 float32, ~147 MiB) from
ordinary pageable host memory to the device with a plain ``.to(device)``, trains a small
CNN on it (4x average-pool, one strided conv, a linear head: well under 1 ms of GPU work),
and logs ``loss.item()`` every step. The batches come from a small preallocated host pool,
so building them costs nothing and the copy is what remains.

Why: a copy from pageable memory cannot be DMA'd directly: the CUDA driver stages it
through a pinned bounce buffer, at a fraction of PCIe bandwidth, and the call blocks the
host until it is done. Nothing overlaps it, and the per-step ``.item()`` adds a host-device
sync, so the GPU idles while the host waits and the host idles while the GPU works. On an
H200 a step takes ~22 ms, ~86% of it the input copy.

Fix: pinned (page-locked) input buffers (``--pin-memory``; ``DataLoader(pin_memory=True)``
in real code), asynchronous copies (``--non-blocking``: ``.to(device, non_blocking=True)``),
and no per-step sync (``--no-sync``: keep ``loss.detach()``, call ``.item()`` once at the
end). ``--fixed`` turns on all three: ~3 ms/step on an H200 (the pinned copy still fills
most of the now much shorter step). On CPU there is no copy, so nothing changes there.

Run::

    python examples/pageable_sync.py --device cuda                # bottleneck
    python examples/pageable_sync.py --device cuda --fixed        # pinned + async + no sync
    python examples/pageable_sync.py --device cuda --pin-memory   # one fix at a time
    python examples/pageable_sync.py --profile out/               # diagnose with torchtriage
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

BATCH_SIZE = 256
IMAGE_SHAPE = (3, 224, 224)  # 150,528 floats: 588 KiB per sample, ~147 MiB per batch
NUM_CLASSES = 10
POOL_SIZE = 2  # preallocated host batches, cycled


class SmallCNN(nn.Module):
    """Cheap on purpose: the input copy, not the model, should fill the step."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.AvgPool2d(4),  # 224 -> 56
            nn.Conv2d(3, 32, kernel_size=4, stride=4),  # 56 -> 14
            nn.ReLU(),
        )
        self.head = nn.Linear(32 * 14 * 14, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(torch.flatten(self.features(x), 1))
        return logits


def make_pool(batch_size: int, pin_memory: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Host batches, in pinned memory when asked (and a CUDA device exists to pin for)."""
    pin = pin_memory and torch.cuda.is_available()
    gen = torch.Generator().manual_seed(1)
    pool = []
    for _ in range(POOL_SIZE):
        images = torch.empty(batch_size, *IMAGE_SHAPE, pin_memory=pin)
        images.normal_(generator=gen)
        labels = torch.empty(batch_size, dtype=torch.long, pin_memory=pin)
        labels.random_(0, NUM_CLASSES, generator=gen)
        pool.append((images, labels))
    return pool


def train(
    steps: int,
    device: str = "cpu",
    on_step: Callable[[], None] | None = None,
    *,
    batch_size: int = BATCH_SIZE,
    pin_memory: bool = False,
    non_blocking: bool = False,
    sync_every_step: bool = True,
) -> list[float]:
    """Run `steps` optimizer steps; call on_step() after each optimizer step; return losses."""
    torch.manual_seed(0)
    dev = torch.device(device)
    model = SmallCNN().to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    loss_fn = nn.CrossEntropyLoss()
    pool = make_pool(batch_size, pin_memory=pin_memory and dev.type == "cuda")
    losses: list[float] = []
    pending: list[torch.Tensor] = []  # device-side losses when not syncing every step
    model.train()
    for step in range(steps):
        host_images, host_labels = pool[step % len(pool)]
        images = host_images.to(dev, non_blocking=non_blocking)
        labels = host_labels.to(dev, non_blocking=non_blocking)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        if sync_every_step:
            losses.append(float(loss.item()))  # host waits for the GPU every step
        else:
            pending.append(loss.detach())
        if on_step is not None:
            on_step()
    if pending:
        losses = [float(v) for v in torch.stack(pending).tolist()]  # one sync, at the end
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument(
        "--pin-memory", action="store_true", help="allocate the host batches in pinned memory"
    )
    parser.add_argument(
        "--non-blocking", action="store_true", help="copy with .to(device, non_blocking=True)"
    )
    parser.add_argument(
        "--no-sync",
        action="store_true",
        help="log loss.detach() and call .item() once at the end, not every step",
    )
    parser.add_argument(
        "--fixed",
        action="store_true",
        help="all three fixes: --pin-memory --non-blocking --no-sync",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="profile with torchtriage and write results to DIR",
    )
    args = parser.parse_args(argv)
    options = {
        "batch_size": args.batch_size,
        "pin_memory": args.pin_memory or args.fixed,
        "non_blocking": args.non_blocking or args.fixed,
        "sync_every_step": not (args.no_sync or args.fixed),
    }
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
