"""Two-rank DDP on CPU (gloo), launched by torchrun in `torchtriage run` tests."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 256)
for _ in range(10):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
