"""A training loop fed by a DataLoader with 2 worker processes that runs until it is stopped
(or for --steps N), sleeping most of each step so that it costs little CPU: for signal tests
(no process of it may outlive torchtriage).

    --steps N      optimizer steps (default: no end)
    --sleep-ms M   per batch in the workers (default 20)
"""

import argparse
import itertools
import time

import torch
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=None)
parser.add_argument("--sleep-ms", type=float, default=20.0)
args = parser.parse_args()


class Slow(Dataset):
    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int):
        time.sleep(args.sleep_ms / 1e3 / 8)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randn(1, generator=g)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Slow(), batch_size=8, num_workers=2)
    steps = range(args.steps) if args.steps else itertools.count()
    for _, (x, y) in zip(steps, loader, strict=False):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
