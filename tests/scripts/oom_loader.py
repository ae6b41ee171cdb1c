"""A DataLoader-fed model that runs out of memory once the optimizer state exists (from
``--at`` on) with its full batch: like a decoder LM whose Adam moments push step 2 over the
device. Half the batch fits (gradient accumulation is the cure). ``--at 1``: out of memory on
the very first step."""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--at", type=int, default=2)
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--fits", type=int, default=8, help="largest batch that fits from --at on")
args = p.parse_args()
torch.manual_seed(0)
data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
loader = DataLoader(data, batch_size=args.batch_size, shuffle=False)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
step = 0
while step < args.steps:
    for x, y in loader:
        step += 1
        if step >= args.at and x.shape[0] > args.fits:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "79.10 GiB of which 1.23 GiB is free. Of the allocated memory 65.30 GiB is "
                "allocated by PyTorch, and 11.90 GiB is reserved by PyTorch but unallocated.")
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step >= args.steps:
            break
