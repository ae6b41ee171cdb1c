"""Training loop with two optimizers and a crash/exit/hang switch, for `torchtriage run` tests."""

import sys
import time

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
torch.manual_seed(0)
encoder, head = torch.nn.Linear(32, 64), torch.nn.Linear(64, 4)
opt_a = torch.optim.SGD(encoder.parameters(), lr=0.1)
opt_b = torch.optim.Adam(head.parameters(), lr=0.01)
x = torch.randn(16, 32)
if mode == "early":
    sys.exit(0)
for i in range(steps):
    if mode == "crash" and i == 6:
        raise RuntimeError("deliberate failure at step 6")
    if mode == "oom" and i == 6:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    if mode == "hang" and i == 6:
        time.sleep(600)
    loss = head(torch.relu(encoder(x))).pow(2).mean()
    loss.backward()
    opt_a.step()
    opt_b.step()
    opt_a.zero_grad()
    opt_b.zero_grad()
print("done")
