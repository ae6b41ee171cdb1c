"""A loss that lives in a buffer the next step overwrites, as a CUDA graph's static output
does under ``torch.compile(mode="reduce-overhead")``: the value backward() saw is printed
each step, then the buffer is filled with the next step's value."""

import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
static = torch.zeros(())  # the graph's output buffer, reused by every replay
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
    x = torch.randn(16, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    print(f"step {step} loss {loss.item():.6f}", flush=True)
    opt.step()
    opt.zero_grad()
    loss.data.fill_(-1.0)  # the next replay writes over the tensor backward() was given
