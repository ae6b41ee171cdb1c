"""A DDP job whose parameters, gradients and Adam state are most of its memory (a small batch,
wide blocks): gradient accumulation, checkpointing and bf16 activations cannot lower its peak;
sharding the state across ranks can. Under torchrun (gloo on CPU).

    torchrun --nproc-per-node 2 tests/scripts/ddp_state_heavy.py --steps 20
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=4)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(args.width) for _ in range(args.blocks)],
                          nn.Linear(args.width, 10))
    model = DDP(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, args.width, generator=g)
        y = torch.randint(0, 10, (args.batch_size,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
