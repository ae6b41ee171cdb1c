"""Data-starved training: the input pipeline is the bottleneck (layer: data_loading).

What: a small CNN (2 conv layers, 3x32x32 inputs, 10 classes) is fed by a map-style
``Dataset`` whose ``__getitem__`` models a JPEG decode / storage read with a 2.5 ms
blocking wait per sample, plus a light numpy augmentation (random crop + flip +
normalise), ~3 ms per sample in all. With ``batch_size=32`` and ``num_workers=0`` the
main process spends ~100 ms per step fetching data and ~15 ms in the model, so the model
sits idle most of the time.

Why: ``num_workers=0`` loads every sample serially in the training process, so the
per-item latency adds up (32 x 2.5 ms) and nothing overlaps it with compute.

Fix: load in parallel, ahead of compute: ``--num-workers 4`` (IO-bound latency hides
well even on few cores), optionally ``--prefetch-factor 4 --persistent-workers``, and
``--pin-memory`` when training on a GPU.

Run::

    python examples/data_starved.py                      # bottleneck (workers=0)
    python examples/data_starved.py --num-workers 4 --persistent-workers   # fixed
    python examples/data_starved.py --device cuda --num-workers 4 --pin-memory
    python examples/data_starved.py --profile out/       # diagnose with torchtriage
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

BATCH_SIZE = 32
NUM_CLASSES = 10
ITEM_LATENCY_S = 0.0025  # modelled decode / IO latency per sample


class SlowImageDataset(Dataset[tuple[torch.Tensor, int]]):
    """Synthetic images whose loading costs ~2.5 ms each (IO wait + numpy augmentation)."""

    def __init__(self, size: int = 4096, latency_s: float = ITEM_LATENCY_S) -> None:
        self.size = size
        self.latency_s = latency_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(index)
        # "Decode": blocking latency as for reading/decoding an image file.
        time.sleep(self.latency_s)
        raw = rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
        # Augment: random 32x32 crop, random horizontal flip, normalise, HWC -> CHW.
        top, left = rng.integers(0, 9, size=2)
        img = raw[top : top + 32, left : left + 32].astype(np.float32) / 255.0
        if rng.random() < 0.5:
            img = img[:, ::-1]
        img = (img - 0.5) / 0.25
        label = int(index % NUM_CLASSES)
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), label


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(torch.flatten(self.features(x), 1))
        return logits


def train(
    steps: int,
    device: str = "cpu",
    on_step: Callable[[], None] | None = None,
    *,
    num_workers: int = 0,
    prefetch_factor: int | None = None,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    batch_size: int = BATCH_SIZE,
) -> list[float]:
    """Run `steps` optimizer steps; call on_step() after each optimizer step; return losses."""
    torch.manual_seed(0)
    dev = torch.device(device)
    model = SmallCNN().to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    dataset = SlowImageDataset(size=max(steps * batch_size, batch_size))
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        generator=generator,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and num_workers > 0,
        drop_last=True,
    )
    non_blocking = pin_memory and dev.type == "cuda"
    losses: list[float] = []
    model.train()
    while len(losses) < steps:
        for batch_images, batch_labels in loader:
            images = batch_images.to(dev, non_blocking=non_blocking)
            labels = batch_labels.to(dev, non_blocking=non_blocking)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.item()))
            if on_step is not None:
                on_step()
            if len(losses) >= steps:
                break
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--prefetch-factor", type=int, default=None)
    parser.add_argument("--pin-memory", action="store_true")
    parser.add_argument("--persistent-workers", action="store_true")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="profile with torchtriage and write results to DIR",
    )
    args = parser.parse_args(argv)
    options = {
        "num_workers": args.num_workers,
        "prefetch_factor": args.prefetch_factor,
        "pin_memory": args.pin_memory,
        "persistent_workers": args.persistent_workers,
        "batch_size": args.batch_size,
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
