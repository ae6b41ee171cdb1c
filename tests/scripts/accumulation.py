"""Manual gradient accumulation, as Hugging Face's Trainer does with
``gradient_accumulation_steps``: each micro-batch's loss is divided by the accumulation steps
and backpropagated; the optimizer steps (and the gradients are zeroed) every N-th micro-batch.

    --accumulate N   micro-batches per optimizer step (default 2)
    --batch B        micro-batch size (default 16)
    --steps N        optimizer steps (default 12)
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--accumulate", type=int, default=2)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--steps", type=int, default=12)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
n = args.batch * args.accumulate * args.steps
data = TensorDataset(torch.randn(n, 32), torch.randn(n, 1))
loader = DataLoader(data, batch_size=args.batch)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y) / args.accumulate
    loss.backward()
    if (i + 1) % args.accumulate == 0:
        optimizer.step()
        optimizer.zero_grad()
