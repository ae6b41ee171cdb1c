"""Steps that get slower after a while (a warm phase, then the real work): the first window
is not steady state, the one after it is."""

import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
fast_until = int(sys.argv[2]) if len(sys.argv) > 2 else 12
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
for step in range(1, steps + 1):
    time.sleep(0.004 if step <= fast_until else 0.04)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
