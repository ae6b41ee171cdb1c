"""A seeded job whose Dataset draws random per-sample augmentation (noise, a random flip), the
way image pipelines do. Which random numbers each sample gets depends on which process loads
it: with workers, each worker draws from its own stream (seeded base_seed + worker id), so the
losses of `-j 0` and `-j 2` differ by the augmentation's randomness, not by a bug."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __init__(self, n: int, delay_s: float) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 64, generator=g)
        self.y = (self.x[:, :8].sum(1) > 0).long()
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.delay_s)  # decoding an image, say
        x = self.x[i] + 0.3 * torch.randn(64)  # random per-sample augmentation
        if torch.rand(()) < 0.5:
            x = x.flip(0)
        return x, self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-j", "--workers", type=int, default=0)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--delay-ms", type=float, default=1.0)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Augmented(4096, args.delay_ms / 1e3), batch_size=16, shuffle=True,
                        num_workers=args.workers)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
