"""Regression with an optimizer that runs a closure, in the style of pytorch/examples
(regression, time_sequence_prediction): ``optimizer.step(closure)`` where the closure zeroes the
gradients, runs forward and the loss, and calls backward.

    --optimizer lbfgs|sgd   LBFGS (several closure calls per step) or SGD (one, as Lightning's
                            automatic optimization does)
    --max-iter N            LBFGS closure evaluations per step at most (default 12)
    --steps N               optimizer steps (default 12)
    --width W               hidden width (more work per closure call)
"""

import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--optimizer", choices=("lbfgs", "sgd"), default="lbfgs")
p.add_argument("--max-iter", type=int, default=12)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--width", type=int, default=256)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(512, 64)
y = torch.sin(x.sum(dim=1, keepdim=True))
model = torch.nn.Sequential(torch.nn.Linear(64, args.width), torch.nn.Tanh(),
                            torch.nn.Linear(args.width, args.width), torch.nn.Tanh(),
                            torch.nn.Linear(args.width, 1))
if args.optimizer == "lbfgs":
    # tolerance_change=0 and a fixed max_iter: every step evaluates the closure max_iter times
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=args.max_iter,
                                  tolerance_grad=0.0, tolerance_change=0.0)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
criterion = torch.nn.MSELoss()

for step in range(args.steps):
    def closure():
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    print(f"step {step} loss {loss.item():.5f}")
