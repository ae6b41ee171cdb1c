"""An image classifier trained for many short epochs from a dataset preloaded into memory, with
DataLoader workers started by ``spawn``.

The way CUDA users are told to write it: ``multiprocessing.set_start_method("spawn")`` (fork
after CUDA initialisation is unsafe), the whole training set decoded once into a uint8 array
held by the ``Dataset`` (fast ``__getitem__``), augmentation in the workers, and
``num_workers`` set, but ``persistent_workers`` left at its default (False). Every epoch the
DataLoader shuts its workers down and spawns new ones: each imports torch again and unpickles
the Dataset (hundreds of MiB), so the first step of every epoch waits seconds for its batch.
With a small dataset per epoch (``--epoch-steps``) that start is a large share of the run.
``--fixed`` is the hand fix: ``persistent_workers=True``.

    python short_epochs_spawn.py --epochs 20
    python short_epochs_spawn.py --epochs 20 --fixed
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class PreloadedImages(torch.utils.data.Dataset):
    """A decoded image set held in memory (uint8, N x H x W x 3) with labels."""

    def __init__(self, n: int, size: int, classes: int) -> None:
        rng = np.random.default_rng(0)
        self.labels = rng.integers(0, classes, n)
        self.images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.images[np.arange(n), :, :, self.labels % 3] //= 2  # something to learn

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = torch.from_numpy(self.images[i]).permute(2, 0, 1).float().div_(255)
        if torch.rand(()) < 0.5:
            img = img.flip(2)
        top, left = torch.randint(0, 5, (2,)).tolist()
        img = F.pad(img, (2, 2, 2, 2))[:, top:top + img.shape[1], left:left + img.shape[2]]
        return (img - 0.5) / 0.25, int(self.labels[i])


def make_model(classes: int, width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--epoch-steps", type=int, default=10,
                   help="batches per epoch (the training subset is this many batches)")
    p.add_argument("--dataset-size", type=int, default=20000,
                   help="images held by the Dataset (all pickled into every spawned worker)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--fixed", action="store_true", help="the hand fix: persistent_workers=True")
    args = p.parse_args()

    multiprocessing.set_start_method("spawn", force=True)
    torch.manual_seed(0)
    device = torch.device(args.device)
    dataset = PreloadedImages(args.dataset_size, args.image_size, args.classes)
    subset = torch.utils.data.Subset(dataset, range(args.epoch_steps * args.batch_size))
    loader = torch.utils.data.DataLoader(
        subset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
        pin_memory=device.type == "cuda", persistent_workers=args.fixed, drop_last=True)
    model = make_model(args.classes, args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = time.time()
    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / len(loader):.3f} ({time.time() - start:.1f} s)",
              flush=True)


if __name__ == "__main__":
    main()
