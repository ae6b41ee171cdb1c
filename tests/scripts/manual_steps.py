"""A loop without a torch optimizer that marks its steps with torchtriage.step()."""

import torch

import torchtriage

w = torch.randn(64, 64, requires_grad=True)
for _ in range(10):
    loss = (torch.randn(8, 64) @ w).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad = None
    torchtriage.step()
