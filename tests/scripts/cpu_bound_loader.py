"""Data loading that needs CPU, with one worker more than there are cores: every core is busy
preprocessing (one worker per core left a core idle now and then while a worker waited to
hand over its batch)."""

import os
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Heavy(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        a = np.random.default_rng(i).random((160, 160))
        for _ in range(6):  # ~CPU-bound "decode + augment"
            a = np.tanh(a @ a.T / 160.0)
        return torch.from_numpy(a[:32, :32].astype(np.float32).ravel()), i % 4


if __name__ == "__main__":
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Heavy(), batch_size=16, num_workers=(os.cpu_count() or 2) + 1)
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    for step, (x, y) in enumerate(loader):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if step == steps - 1:
            break
