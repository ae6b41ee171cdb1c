"""A decoder-only LM whose batch fits the first step but not the second: out of memory.

Step 1's forward and backward fit; then Adam allocates its two moment buffers (2x the
parameters) in ``optimizer.step()``, and step 2's activations on top of parameters, gradients
and optimizer state exceed the device. On CUDA the model and batch are sized from
``torch.cuda.get_device_properties(0).total_memory`` so that this happens on any card;
``--capacity-gib N`` stands in for a smaller card (the process is capped at N GiB with
``torch.cuda.set_per_process_memory_fraction`` and sized to it), so that a 141 GiB H200 can
play a 24 GiB card with a model that loads in seconds. On CPU,
``--simulate-capacity BYTES`` stands in for a device: a counter of parameter, gradient,
optimizer-state and saved-activation bytes (the tensors autograd keeps for backward, seen
through ``saved_tensors_hooks``) raises ``torch.OutOfMemoryError`` when it passes the capacity.

``--fixed`` is the hand fix: gradient accumulation over 4 micro-batches (same effective batch,
a quarter of the activations) plus activation checkpointing of each block.

    python oom_decoder.py --device cpu --simulate-capacity 200000000   # OOM on step 2
    python oom_decoder.py --device cpu --simulate-capacity 200000000 --fixed
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset


class MemoryMeter:
    """Counts the bytes a device would hold; raises OutOfMemoryError past ``capacity``."""

    def __init__(self, model: nn.Module, optimizer, capacity: int | None) -> None:
        self.model, self.optimizer, self.capacity = model, optimizer, capacity
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.saved: dict[int, int] = {}
        self.peak = 0

    def pack(self, t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.param_ptrs and ptr not in self.saved:
            self.saved[ptr] = t.untyped_storage().nbytes()
            self.check("saving activations for backward")
        return t

    def allocated(self) -> int:
        params = sum(p.nbytes for p in self.model.parameters())
        grads = sum(p.grad.nbytes for p in self.model.parameters() if p.grad is not None)
        state = sum(v.nbytes for s in self.optimizer.state.values() for v in s.values()
                    if torch.is_tensor(v))
        return params + grads + state + sum(self.saved.values())

    def check(self, what: str) -> None:
        if self.capacity is None:
            return
        now = self.allocated()
        self.peak = max(self.peak, now)
        if now > self.capacity:
            raise torch.OutOfMemoryError(
                f"out of memory (simulated) while {what}: {now / 2**20:.1f} MiB allocated, "
                f"capacity {self.capacity / 2**20:.1f} MiB")

    def hooks(self):
        if self.capacity is None:
            return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class DecoderLM(nn.Module):
    def __init__(self, vocab, dim, layers, heads, seq_len, checkpointing=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.checkpointing = checkpointing

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.size(1)]
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.ln(x))


class RandomTokens(Dataset):
    def __init__(self, n, seq_len, vocab):
        self.n, self.seq_len, self.vocab = n, seq_len, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)


def cuda_sizes(total: int, seq_len: int, vocab: int) -> tuple[int, int, int]:
    """(dim, layers, batch) for this card: parameters ~11% of it, activations the rest.

    Measured on an H200 (4.3 B parameters, P = 16 GiB in fp32; 2.83 GiB of saved activations
    per 512-token sample, i.e. ~18 x dim floats per token per block with SDPA): step 1 peaks
    at P + A (the gradients grow as activations are freed; Adam's moments come after), step 2
    at ~3P + A (Adam's two moments stay). A batch whose activations fill the card less 2P lies
    between the two: step 1 fits, step 2 runs out of memory."""
    dim, layers = 4096, 1
    while 4 * 12 * dim * dim * (layers + 1) < 0.11 * total:
        layers += 1
    param_bytes = 4 * (layers * 12 * dim * dim + 2 * vocab * dim)
    per_sample = 4 * seq_len * (layers * 18 * dim + 2 * vocab)
    return dim, layers, max(1, int(0.97 * total - 2 * param_bytes) // per_sample)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=None, help="default: sized to the device")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--dim", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--capacity-gib", type=float, default=None,
                   help="CUDA: cap this process at N GiB and size the model to it")
    p.add_argument("--simulate-capacity", type=int, default=None, metavar="BYTES",
                   help="CPU: raise OutOfMemoryError when the counted bytes exceed BYTES")
    p.add_argument("--fixed", action="store_true",
                   help="the hand fix: 4 accumulation micro-batches + activation checkpointing")
    args = p.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    dim, layers, batch = args.dim or 256, args.layers or 4, args.batch_size or 32
    if device.type == "cuda" and args.dim is None:
        total = torch.cuda.get_device_properties(device).total_memory
        if args.capacity_gib:
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.capacity_gib * 2**30 / total),
                                                       index)
            total = int(args.capacity_gib * 2**30)
        dim, layers, batch = cuda_sizes(total, args.seq_len, args.vocab)
        batch = args.batch_size or batch
    accumulate = 4 if args.fixed else 1
    model = DecoderLM(args.vocab, dim, layers, args.heads, args.seq_len,
                      checkpointing=args.fixed).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    meter = MemoryMeter(model, optimizer, args.simulate_capacity)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.1f}M parameters, batch {batch}, seq {args.seq_len}, "
          f"micro-batches {accumulate}", flush=True)
    loader = DataLoader(RandomTokens(100_000, args.seq_len, args.vocab), batch_size=batch,
                        shuffle=True, drop_last=True)

    model.train()
    t0 = time.time()
    for step, tokens in enumerate(loader, 1):
        tokens = tokens.to(device)
        optimizer.zero_grad(set_to_none=True)
        for micro in tokens.chunk(accumulate):
            with meter.hooks():
                logits = model(micro[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                       micro[:, 1:].reshape(-1)) / accumulate
            loss.backward()
            meter.check("backward")
            meter.saved.clear()
        optimizer.step()
        meter.check("optimizer.step")
        if step % args.log_interval == 0 or step == 1:
            mem = (torch.cuda.max_memory_allocated() if device.type == "cuda" else meter.peak)
            print(f"step {step} | loss {loss.item() * accumulate:.4f} | peak {mem / 2**20:.1f}MiB"
                  f" | {time.time() - t0:.1f}s", flush=True)
        if step >= args.steps:
            break


if __name__ == "__main__":
    main()
