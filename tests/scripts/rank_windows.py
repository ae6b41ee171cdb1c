"""Two processes of one torchrun job (gloo) whose steps take the same time until one rank
changes: ``--slow-rank R --slow-from S`` makes rank R's steps ``--slow-factor`` times longer
from step S on; ``--pause-rank R --pause-at P`` makes rank R pause ``--pause-ms`` once, in step
P. The ranks meet in a barrier in every step up to ``--barrier-until`` (all of them by
default), so up to there a pause on one rank holds the other too, as a collective would.

    torchrun --nproc-per-node 2 tests/scripts/rank_windows.py --steps 40 --slow-rank 1 \
        --slow-from 13 --barrier-until 6
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--barrier-until", type=int, default=10**9)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-from", type=int, default=10**9)
    p.add_argument("--slow-factor", type=float, default=3.0)
    p.add_argument("--pause-rank", type=int, default=-1)
    p.add_argument("--pause-at", type=int, default=-1)
    p.add_argument("--pause-ms", type=float, default=600.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    dist.barrier()
    for step in range(1, args.steps + 1):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        wait_ms = args.step_ms
        if rank == args.slow_rank and step >= args.slow_from:
            wait_ms *= args.slow_factor
        if rank == args.pause_rank and step == args.pause_at:
            wait_ms += args.pause_ms
        time.sleep(wait_ms / 1000)
        if step <= args.barrier_until:
            dist.barrier()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
