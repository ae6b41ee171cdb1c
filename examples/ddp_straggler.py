"""A straggler rank: one rank's input pipeline is slower, every rank waits (slow rank's layer:
data_loading; the others look communication-bound).

What: DDP over gloo (CPU) or NCCL (``--device cuda``) on a small MLP; each rank loads its
batches through a DataLoader whose items cost ``--item-ms`` to produce, and rank
``--slow-rank`` (default 1) pays ``--slow-factor`` (default 8) times more. In the all-reduce of
every step the fast ranks wait for the slow one, so their traces show long collectives while
the slow rank's trace shows long data loading.

Fix: make the slow rank's loading as fast as the others' (``--slow-factor 1``); in real jobs:
more DataLoader workers or cheaper preprocessing on that host, or balanced shards.

Run (2 processes)::

    torchrun --nproc_per_node=2 examples/ddp_straggler.py
    torchtriage run -- torchrun --nproc_per_node=2 examples/ddp_straggler.py
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

BATCH_SIZE = 16


class Items(Dataset[torch.Tensor]):
    def __init__(self, item_s: float) -> None:
        self.item_s = item_s

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.item_s)  # modelled decode / IO latency
        return torch.randn(256, generator=torch.Generator().manual_seed(index))


def train(steps: int, device: str = "cpu", *, item_ms: float = 0.5, slow_rank: int = 1,
          slow_factor: float = 8.0) -> list[float]:
    """Run `steps` optimizer steps on this rank (needs torch.distributed set up by torchrun)."""
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank = dist.get_rank()
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if device == "cuda"
                       else "cpu")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to(dev))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    item_s = item_ms / 1e3 * (slow_factor if rank == slow_rank else 1.0)
    loader = DataLoader(Items(item_s), batch_size=BATCH_SIZE, shuffle=False)
    losses: list[float] = []
    for x in loader:
        loss = model(x.to(dev)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if len(losses) >= steps:
            break
    dist.destroy_process_group()
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--item-ms", type=float, default=0.5)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--slow-factor", type=float, default=8.0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    losses = train(args.steps, args.device, item_ms=args.item_ms, slow_rank=args.slow_rank,
                   slow_factor=args.slow_factor)
    print(f"{len(losses)} steps in {time.perf_counter() - start:.2f}s; "
          f"final loss {losses[-1]:.5f}")


if __name__ == "__main__":
    main()
