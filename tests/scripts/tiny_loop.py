"""A tiny training loop for A/B harness tests: fast, and told how to misbehave.

    --steps N        optimizer steps to run (default 50)
    --sleep-ms M     extra host time per step
    --crash          raise after the first step
    --oom-at K       raise torch.OutOfMemoryError at step K
    --unseeded       draw the data from an unseeded generator (losses differ run to run)
    --scale S        multiply the loss (a "fix" that changes results)
    --dropout P      a dropout layer (its masks are random draws)
    --compile        torch.compile the model (Inductor)
    --slow-first-run MARKER  the first process to run (the one that creates MARKER) sleeps
                     8x --sleep-ms per step: a trial disturbed by another job
"""

import argparse
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--sleep-ms", type=float, default=0.0)
parser.add_argument("--crash", action="store_true")
parser.add_argument("--oom-at", type=int, default=None)
parser.add_argument("--unseeded", action="store_true")
parser.add_argument("--scale", type=float, default=1.0)
parser.add_argument("--slow-first-run", default=None)
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--compile", action="store_true")
args = parser.parse_args()
if args.slow_first_run:
    try:
        os.close(os.open(args.slow_first_run, os.O_CREAT | os.O_EXCL))
        args.sleep_ms *= 8
    except FileExistsError:
        pass

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            *([torch.nn.Dropout(args.dropout)] if args.dropout else []),
                            torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
forward = torch.compile(model) if args.compile else model
gen = torch.Generator().manual_seed(int(time.time_ns()) if args.unseeded else 1)
for step in range(args.steps):
    x = torch.randn(32, 64, generator=gen)
    loss = forward(x).pow(2).mean() * args.scale
    opt.zero_grad()
    loss.backward()
    opt.step()
    if args.sleep_ms:
        time.sleep(args.sleep_ms / 1e3)
    if step == args.oom_at:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if args.crash:
        raise RuntimeError("boom: the candidate crashed")
