"""FSDP2 as users write it: a model of repeated blocks, each `fully_shard`-ed, then the root;
AdamW over the sharded parameters. Under torchrun (gloo on CPU, NCCL on GPUs).

    torchrun --nproc-per-node 2 tests/scripts/fsdp_blocks.py --steps 20
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(args.width) for _ in range(args.blocks)],
                          nn.Linear(args.width, 10))
    if cuda:
        model = model.to(device)
    for block in model[:-1]:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, args.width, generator=g)
        y = torch.randint(0, 10, (args.batch_size,), generator=g)
        if cuda:
            x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
