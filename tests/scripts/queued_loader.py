"""A loader that cannot keep up, hidden at first by its queue: 2 workers, prefetch_factor 8
(16 batches in flight), 200 ms of (sleeping) I/O per batch per worker against ~40 ms of
compute, and a 2.5 s pause before training (a sanity check, say) in which the workers fill the
queue. The first 16 or so steps run at compute speed (kernel-bound); steady state is
loading-bound. ``--pause-at N`` pauses before step N instead (a validation pass mid-run): the
16 steps after it hide the loader again."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 16


class SlowReads(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(0.2 / BATCH)  # a storage read: 200 ms per batch per worker
        return torch.randn(1024), torch.randn(1)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--pause", type=float, default=2.5)
    p.add_argument("--pause-at", type=int, default=0, help="the step the pause comes before")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(SlowReads(), batch_size=BATCH, num_workers=2, prefetch_factor=8)
    layers = [m for _ in range(6) for m in (torch.nn.Linear(1024, 1024), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    batches = iter(loader)
    for step in range(args.steps):
        if step == args.pause_at:
            time.sleep(args.pause)  # the workers fill the queue meanwhile
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
