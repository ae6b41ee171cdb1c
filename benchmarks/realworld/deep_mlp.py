"""A deep, narrow MLP trained with plain Adam on batches of 16.

Many small layers (``--depth`` x Linear + LayerNorm + ReLU at ``--width``), batch 16, a
regression target from a fixed random teacher: every kernel is tiny, so on a GPU the step
time is launch overhead (hundreds of kernels forward and backward, plus Adam's per-parameter
updates) rather than arithmetic. ``--fixed`` is the hand fix: fused Adam, and on CUDA
``torch.compile(mode="reduce-overhead")`` (CUDA graphs) for the model.

    python deep_mlp.py --steps 500
    python deep_mlp.py --steps 500 --fixed
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def make_model(in_dim: int, width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(in_dim, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--in-dim", type=int, default=32)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=48)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--fixed", action="store_true",
                   help="the hand fix: fused Adam (+ CUDA graphs via torch.compile on CUDA)")
    args = p.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = make_model(args.in_dim, args.width, args.depth).to(device)
    teacher = torch.randn(args.in_dim, 1, device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=args.fixed or None)
    forward = model
    if args.fixed and device.type == "cuda":
        forward = torch.compile(model, mode="reduce-overhead")
    loss_fn = nn.MSELoss()

    t0 = time.time()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, args.in_dim, device=device)
        y = torch.sin(x @ teacher)
        loss = loss_fn(forward(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.log_interval == 0 or step == 1:
            print(f"step {step:5d} | loss {loss.item():.5f} | {time.time() - t0:.1f}s",
                  flush=True)


if __name__ == "__main__":
    main()
