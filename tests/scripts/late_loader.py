"""A Dataset that gets slow after a while (its first samples are cached, the rest are read
from "disk"), read in the training process: a profile of the first steps sees a job that
loads in a few ms per step; the running job spends most of each step loading.

    python late_loader.py [STEPS] [FAST_STEPS]
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
fast_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 14
BATCH = 8


class Samples(Dataset):
    def __len__(self) -> int:
        return steps * BATCH

    def __getitem__(self, i: int):
        time.sleep(0.0002 if i < fast_steps * BATCH else 0.01)
        g = torch.Generator().manual_seed(i)
        return torch.randn(256, generator=g), torch.randn(1, generator=g)


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Samples(), batch_size=BATCH):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
