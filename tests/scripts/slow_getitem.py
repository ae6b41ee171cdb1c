"""A Dataset whose ``__getitem__`` is the slow part of the input pipeline (a decode of
``--getitem-ms`` per sample, busy CPU or sleeping I/O) against a small model.

    --workers N       DataLoader workers (default 0: loading in the training process)
    --getitem-ms M    time per sample in __getitem__ (default 2)
    --sleep           sleep instead of busy-waiting (I/O rather than decode)
    --steps N         steps (default 14)
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=0)
p.add_argument("--getitem-ms", type=float, default=2.0)
p.add_argument("--sleep", action="store_true")
p.add_argument("--steps", type=int, default=14)
args = p.parse_args()
BATCH = 8


class Decoded(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        if args.sleep:
            time.sleep(args.getitem_ms / 1e3)
        else:
            until = time.perf_counter() + args.getitem_ms / 1e3
            while time.perf_counter() < until:
                pass
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randn(1, generator=g)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Decoded(), batch_size=BATCH, num_workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step + 1 == args.steps:
            break
