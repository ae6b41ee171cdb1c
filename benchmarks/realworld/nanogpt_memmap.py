"""nanoGPT-style training: a uint16 token file read through np.memmap, a small GPT, AdamW.

On first run a token file (``train.bin``, uint16, from a fixed seed) is written to
``--data-dir`` (default: a cache directory). ``get_batch`` re-opens the memmap each call
(as nanoGPT does, to avoid a memory leak), picks ``torch.randint`` offsets and stacks the
slices; on CUDA the batch is pinned and copied non-blocking. The loss is read with
``loss.item()`` every iteration for logging. ``--fixed`` is the hand fix: bf16 autocast,
fused AdamW and ``torch.compile`` on CUDA (fused AdamW only on CPU).

    python nanogpt_memmap.py --max-iters 200
    python nanogpt_memmap.py --max-iters 200 --fixed
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.dropout = n_head, dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def prepare(data_dir: str, vocab_size: int, num_tokens: int) -> str:
    path = os.path.join(data_dir, f"train_{vocab_size}_{num_tokens}.bin")
    if not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        rng = np.random.default_rng(1337)
        tokens = rng.zipf(1.3, size=num_tokens) % vocab_size
        tmp = f"{path}.{os.getpid()}.tmp"
        tokens.astype(np.uint16).tofile(tmp)
        os.replace(tmp, path)
        print(f"wrote {num_tokens:,} tokens to {path}")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--data-dir", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME", tempfile.gettempdir()), "realworld_nanogpt"))
    p.add_argument("--max-iters", type=int, default=5000)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--vocab-size", type=int, default=50304)
    p.add_argument("--num-tokens", type=int, default=20_000_000)
    p.add_argument("--learning-rate", type=float, default=6e-4)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--fixed", action="store_true",
                   help="the hand fix: bf16 autocast + fused AdamW + torch.compile (CUDA)")
    args = p.parse_args()

    torch.manual_seed(1337)
    device_type = "cuda" if "cuda" in args.device else "cpu"
    path = prepare(args.data_dir, args.vocab_size, args.num_tokens)

    def get_batch():
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
        x = torch.stack([torch.from_numpy(data[i:i + args.block_size].astype(np.int64))
                         for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block_size].astype(np.int64))
                         for i in ix])
        if device_type == "cuda":
            return (x.pin_memory().to(args.device, non_blocking=True),
                    y.pin_memory().to(args.device, non_blocking=True))
        return x.to(args.device), y.to(args.device)

    model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_head,
                args.n_embd).to(args.device)
    print(f"number of parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, betas=(0.9, 0.95),
                                  fused=args.fixed or None)
    ctx = contextlib.nullcontext()
    if args.fixed and device_type == "cuda":
        ctx = torch.autocast(device_type, dtype=torch.bfloat16)
        model = torch.compile(model)

    def get_lr(it, warmup=100, lr_decay_iters=args.max_iters, min_lr=6e-5):
        if it < warmup:
            return args.learning_rate * (it + 1) / (warmup + 1)
        ratio = min(1.0, (it - warmup) / max(1, lr_decay_iters - warmup))
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.learning_rate - min_lr)

    X, Y = get_batch()
    t0 = time.time()
    for iter_num in range(args.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(iter_num)
        with ctx:
            loss = model(X, Y)
        X, Y = get_batch()  # prefetch the next batch while the GPU works
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        lossf = loss.item()
        if iter_num % args.log_interval == 0:
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms", flush=True)


if __name__ == "__main__":
    main()
