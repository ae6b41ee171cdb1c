"""A plain loop that writes a checkpoint every ``--every`` steps (a 1 s stall, as a large
``torch.save`` to a network file system takes): a step far longer than the others, which a
profiling window may happen to hold."""

import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--every", type=int, default=7)
args = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(1, args.steps + 1):
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % args.every == 0:
        time.sleep(1.0)  # torch.save(model.state_dict(), ...) to slow storage
