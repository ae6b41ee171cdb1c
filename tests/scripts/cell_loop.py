"""A recurrent cell stepped by hand over a sequence, in the style of pytorch/examples'
time_sequence_prediction: every time step is a few tiny ops, so one training step records
tens of thousands of profiler events in a fraction of a second.

    --steps N    optimizer steps (default 12)
    --length L   time steps per sequence (default 400)
"""

import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--length", type=int, default=400)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
cell = torch.nn.LSTMCell(1, 8)
head = torch.nn.Linear(8, 1)
params = [*cell.parameters(), *head.parameters()]
opt = torch.optim.SGD(params, lr=0.01)
series = torch.sin(torch.linspace(0, 20, args.length + 1)).view(1, -1, 1)
for _ in range(args.steps):
    h = c = torch.zeros(1, 8)
    outputs = []
    for t in range(args.length):
        h, c = cell(series[:, t], (h, c))
        outputs.append(head(h))
    loss = torch.nn.functional.mse_loss(torch.cat(outputs, 1), series[:, 1:, 0])
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", args.steps)
