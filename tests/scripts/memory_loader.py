"""A DataLoader-fed loop whose peak memory is its activations (for the memory ladder's
gradient-accumulation rung): 12 x [Linear(256) + GELU] on batches of 2048 samples.

    --steps N   optimizer steps (default 200)
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
args = parser.parse_args()

torch.manual_seed(0)
layers = []
for _ in range(12):
    layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(8192, 256), torch.randn(8192, 1))
loader = DataLoader(data, batch_size=2048, shuffle=False)
step = 0
while step < args.steps:
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step >= args.steps:
            break
