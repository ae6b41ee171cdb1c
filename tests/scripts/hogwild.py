"""Hogwild training as pytorch/examples mnist_hogwild does it: one shared model, several
processes started with ``multiprocessing`` (spawn), each training it with its own optimizer.
No launcher gives them ranks.

    python tests/scripts/hogwild.py --procs 2 --steps 40
"""

import argparse

import torch
import torch.multiprocessing as mp
from torch import nn


def train(worker: int, model: nn.Module, steps: int) -> None:
    torch.manual_seed(worker)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 128), torch.randn(256, 1)
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print(f"worker {worker} done")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    mp.set_start_method("spawn", force=True)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 1))
    model.share_memory()
    workers = [mp.Process(target=train, args=(w, model, args.steps)) for w in range(args.procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
