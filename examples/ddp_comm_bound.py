"""Communication-bound data parallelism: gradient all-reduce dominates (layer: communication).

What: DDP over gloo (CPU) or NCCL (``--device cuda``) on a wide MLP, 4 x Linear(2048, 2048)
(16.8M parameters, 67 MB of fp32 gradients per step), with a batch of 1 and one compute thread
per rank on CPU: the compute is a few milliseconds while every step all-reduces all 67 MB (on
CPU in one bucket, after backward, so that the all-reduce does not fight backward for the cores).

Why: the gradient volume is fixed by the model, the compute scales with the batch; with a tiny
batch the ranks spend most of the step in (or waiting for) all-reduce.

Fix: communicate less often or less: gradient accumulation with ``no_sync()``
(``--accumulate 4``), bf16/fp16 compression hooks, bigger buckets, a bigger batch.

Run (2 processes)::

    torchrun --nproc_per_node=2 examples/ddp_comm_bound.py
    torchrun --nproc_per_node=2 examples/ddp_comm_bound.py --accumulate 4   # fixed
    torchrun --nproc_per_node=2 examples/ddp_comm_bound.py --device cuda --width 8192 --depth 8
    torchtriage run -- torchrun --nproc_per_node=2 examples/ddp_comm_bound.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

WIDTH = 2048
DEPTH = 4
BATCH_SIZE = 1


def train(steps: int, device: str = "cpu", *, accumulate: int = 1,
          batch_size: int = BATCH_SIZE, width: int = WIDTH, depth: int = DEPTH) -> list[float]:
    """Run `steps` optimizer steps on this rank (needs torch.distributed set up by torchrun)."""
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if device == "cuda"
                       else "cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)  # ranks share the host's cores with gloo's threads
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    # On CPU one bucket: the all-reduce starts after backward instead of competing with it for
    # the few cores (which makes the split between compute and communication erratic).
    model = DistributedDataParallel(nn.Sequential(*layers).to(dev),
                                    bucket_cap_mb=1024 if dev.type == "cpu" else 25)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    losses: list[float] = []
    for _ in range(steps):
        for micro in range(accumulate):
            x = torch.randn(batch_size, width, generator=gen).to(dev)
            sync = micro == accumulate - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = model(x).pow(2).mean() / accumulate
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()) * accumulate)
    dist.destroy_process_group()
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches per all-reduce (no_sync): the fix")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--width", type=int, default=WIDTH,
                        help="layer width (8192 with --depth 8 makes NCCL over NVLink "
                             "communication-bound on H200s)")
    parser.add_argument("--depth", type=int, default=DEPTH)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    losses = train(args.steps, args.device, accumulate=args.accumulate,
                   batch_size=args.batch_size, width=args.width, depth=args.depth)
    elapsed = time.perf_counter() - start
    print(f"{len(losses)} steps in {elapsed:.2f}s; final loss {losses[-1]:.5f}")


if __name__ == "__main__":
    main()
