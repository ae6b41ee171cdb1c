"""A model built from a ModuleList of repeated blocks (for activation checkpointing)."""

import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(6))
        self.head = torch.nn.Linear(256, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x = torch.randn(64, 256)
for _ in range(10):
    net(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
