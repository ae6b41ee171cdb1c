"""A recurrent cell stepped by hand over a sequence, in the style of pytorch/examples'
time_sequence_prediction: every time step is a few tiny ops, so one training step records
tens of thousands of profiler events in a fraction of a second.

    python cell_loop.py [STEPS [LENGTH]]   optimizer steps (default 12), time steps (400)

Tests import :func:`train` to run the same loop under ``torchtriage.profile``.
"""

import sys

import torch


def train(steps: int, length: int = 400, on_step=lambda: None) -> None:
    torch.manual_seed(0)
    cell, head = torch.nn.LSTMCell(1, 8), torch.nn.Linear(8, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
    series = torch.sin(torch.linspace(0, 20, length + 1)).view(1, -1, 1)
    for _ in range(steps):
        h = c = torch.zeros(1, 8)
        outputs = []
        for t in range(length):
            h, c = cell(series[:, t], (h, c))
            outputs.append(head(h))
        loss = torch.nn.functional.mse_loss(torch.cat(outputs, 1), series[:, 1:, 0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        on_step()


if __name__ == "__main__":
    torch.set_num_threads(1)
    train(*(int(a) for a in sys.argv[1:3]))
    print("done")
