"""A small GPT-style language model whose loop keeps every step's logits for the epoch's metrics.

The loop collects ``loss`` and ``logits`` in lists to report perplexity and token accuracy at
the end of the epoch, the way notebooks and quick scripts often do. Both tensors still carry
their autograd graph, so every step's logits (batch x length x vocabulary floats) stay alive:
memory grows by the same amount each step until the device is full, however small the batch.
On CUDA the default sizes keep about 2 GiB a step (an H200 runs out after some sixty steps);
on CPU ``--memory-limit`` caps the process's data segment (``ulimit -d``, as a container limit
would, but raising instead of being killed). ``--fixed`` is the hand fix: keep
``loss.item()`` and the per-step count of correct tokens, not the tensors.

    python leaky_lm.py --steps 200
    python leaky_lm.py --device cpu --steps 300 --memory-limit 3GiB
    python leaky_lm.py --steps 200 --fixed
"""

from __future__ import annotations

import argparse
import math
import resource
import time

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, length: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, length, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n = idx.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=idx.device), 1)
        x = self.tok(idx) + self.pos[:, :n]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


class Corpus(torch.utils.data.Dataset):
    """Token windows with a learnable pattern (each token predicts the next, mod vocab), made
    from their index on the fly."""

    def __init__(self, samples: int, length: int, vocab: int) -> None:
        self.samples, self.length, self.vocab = samples, length, vocab

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int):
        row = (i * 2654435761 + torch.arange(self.length + 1)) % self.vocab
        return row[:-1], row[1:]


def parse_bytes(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=None, help="default: 32 CUDA, 16 CPU")
    p.add_argument("--seq-len", type=int, default=None, help="default: 512 CUDA, 64 CPU")
    p.add_argument("--vocab", type=int, default=None, help="default: 32000 CUDA, 4096 CPU")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--memory-limit", default=None,
                   help="cap the process's data segment at its current size plus this (CPU)")
    p.add_argument("--fixed", action="store_true",
                   help="the hand fix: keep loss.item() and correct-token counts, not tensors")
    args = p.parse_args()
    on_cuda = args.device.startswith("cuda")
    batch = args.batch_size or (32 if on_cuda else 16)
    length = args.seq_len or (512 if on_cuda else 64)
    vocab = args.vocab or (32000 if on_cuda else 4096)

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = TinyGPT(vocab, args.dim, args.layers, args.heads, length).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = torch.utils.data.DataLoader(Corpus(batch * args.steps, length, vocab),
                                         batch_size=batch, shuffle=True, drop_last=True)
    if args.memory_limit:
        with open("/proc/self/status") as f:
            data = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))
        limit = data + parse_bytes(args.memory_limit)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    epoch_losses: list = []
    epoch_logits: list = []
    epoch_targets: list = []
    correct = 0
    t0 = time.time()
    model.train()
    for step, (x, y) in enumerate(loader, 1):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.fixed:
            epoch_losses.append(loss.item())
            correct += int((logits.argmax(-1) == y).sum())
        else:
            epoch_losses.append(loss)  # for the epoch's perplexity
            epoch_logits.append(logits)  # for the epoch's token accuracy
            epoch_targets.append(y)
        if step % args.log_interval == 0:
            print(f"step {step}: loss {float(epoch_losses[-1]):.3f} "
                  f"({(time.time() - t0) / step * 1e3:.1f} ms/step)", flush=True)
        if step >= args.steps:
            break
    mean_loss = sum(float(v) for v in epoch_losses) / len(epoch_losses)
    if not args.fixed:
        correct = sum(int((lg.argmax(-1) == t).sum())
                      for lg, t in zip(epoch_logits, epoch_targets, strict=True))
    print(f"epoch: perplexity {math.exp(min(mean_loss, 50)):.1f}, "
          f"{correct} tokens predicted right")


if __name__ == "__main__":
    main()
