"""Two-rank DDP (gloo) fed by a DataLoader, with an LR schedule, for gradient accumulation
under DDP.

    --steps N   optimizer steps (default 40)
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.set_num_threads(1)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
gen = torch.Generator().manual_seed(dist.get_rank())
data = TensorDataset(torch.randn(1024, 64, generator=gen), torch.randn(1024, 1, generator=gen))
step = 0
while step < args.steps:
    for x, y in DataLoader(data, batch_size=32):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if step >= args.steps:
            break
dist.destroy_process_group()
