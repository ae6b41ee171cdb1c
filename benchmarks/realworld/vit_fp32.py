"""A Vision Transformer trained in plain fp32: no autocast, unfused AdamW.

Patch embedding (a strided conv), a class token and learned position embeddings, a few
pre-norm transformer encoder blocks (``nn.TransformerEncoderLayer``), a linear head.
Batches come from an in-memory synthetic dataset already on the device, so the step time is
the model's matmuls and attention in fp32. ``--fixed`` is the hand fix: bf16 autocast, fused
AdamW, and ``torch.compile`` on CUDA.

    python vit_fp32.py --steps 100
    python vit_fp32.py --steps 100 --fixed
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch import nn


class ViT(nn.Module):
    def __init__(self, image_size=224, patch=16, dim=768, depth=6, heads=12, num_classes=1000):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        n = (image_size // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(x))[:, 0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--fixed", action="store_true",
                   help="the hand fix: bf16 autocast + fused AdamW (+ torch.compile on CUDA)")
    args = p.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = ViT(args.image_size, args.patch, args.dim, args.depth, args.heads,
                args.num_classes).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05,
                                  fused=args.fixed or None)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    ctx = contextlib.nullcontext()
    if args.fixed:
        ctx = torch.autocast(device.type, dtype=torch.bfloat16)
        if device.type == "cuda":
            model = torch.compile(model)
    # a small synthetic dataset kept on the device, cycled
    images = torch.randn(4 * args.batch_size, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, args.num_classes, (4 * args.batch_size,), device=device)

    model.train()
    t0 = time.time()
    for step in range(1, args.steps + 1):
        i = (step % 4) * args.batch_size
        x, y = images[i:i + args.batch_size], labels[i:i + args.batch_size]
        with ctx:
            loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.log_interval == 0 or step == 1:
            print(f"step {step}/{args.steps} loss {loss.item():.4f} ({time.time() - t0:.1f}s)",
                  flush=True)


if __name__ == "__main__":
    main()
