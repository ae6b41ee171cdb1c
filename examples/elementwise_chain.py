"""Unfused elementwise chains: memory-bound pointwise kernels are the bottleneck (layer: kernel).

What: 4 residual blocks, each one GEMM (``nn.Linear(2048, 2048)``) followed by a chain of
~22 pointwise ops written out by hand (SiLU, a quadratic bump, tanh, a manual LayerNorm
from mean / sub / mul / div / sqrt, an affine, a tanh-approximated GELU, a scale and a
residual add), trained with bf16 autocast on CUDA on 16384 rows. Each pointwise op is its
own kernel that reads and writes whole 16384 x 2048 activations (64 MiB in bf16, ~130-200
MiB of traffic per kernel), and backward adds about twice as many. The bf16 GEMMs run on
tensor cores in a fraction of that time, so on an H200 ~88% of the kernel time is ~370
elementwise/reduction kernels per step that do almost no arithmetic (~19 ms/step).

Why: eager PyTorch launches one kernel per op, and each round-trips the full activation
through HBM: the chain is bound by memory bandwidth, not FLOPs. Mixed precision is already
on, so cheaper GEMMs would not help.

Fix: fuse the chain: ``--compile`` wraps the model in ``torch.compile(model)`` (default
mode); Inductor generates a few fused Triton kernels per block that read each activation
once, in forward and in backward (H200: ~8 ms/step, kernel time 17.5 -> 5.4 ms).

Run::

    python examples/elementwise_chain.py --device cuda             # bottleneck (bf16 eager)
    python examples/elementwise_chain.py --device cuda --compile   # fixed (fused by Inductor)
    python examples/elementwise_chain.py                           # CPU: fp32, smaller sizes
    python examples/elementwise_chain.py --profile out/            # diagnose with torchtriage
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

# Defaults per device: big enough on CUDA that each pointwise kernel is memory-bound,
# small enough on CPU that 12 steps take seconds.
BATCH_SIZE = {"cuda": 16384, "cpu": 512}
WIDTH = {"cuda": 2048, "cpu": 512}
DTYPE = {"cuda": "bf16", "cpu": "fp32"}
DEPTH = 4
NUM_CLASSES = 10
NUM_BATCHES = 2  # distinct in-memory batches, cycled
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class ChainBlock(nn.Module):
    """One GEMM, then ~22 separate pointwise ops (plus 2 row reductions)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.gamma = nn.Parameter(torch.ones(width))
        self.beta = nn.Parameter(torch.zeros(width))
        self.scale = nn.Parameter(torch.full((width,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # GEMM (bf16 under autocast)
        dt = h.dtype  # keep the chain in the GEMM's dtype (fp32 params would promote it)
        h = h * torch.sigmoid(h)  # SiLU by hand: 2 kernels
        h = h + 0.1 * h * h  # quadratic bump: 3
        h = torch.tanh(h)  # 1
        mu = h.mean(-1, keepdim=True)  # LayerNorm by hand: 1 reduction
        d = h - mu  # 1
        var = (d * d).mean(-1, keepdim=True)  # 1 + 1 reduction
        h = d / torch.sqrt(var + 1e-5)  # 1 (+2 on the per-row vector)
        h = h * self.gamma.to(dt) + self.beta.to(dt)  # affine: 2
        inner = 0.7978845608 * (h + 0.044715 * h * h * h)  # GELU (tanh form) by hand: 5
        h = 0.5 * h * (1.0 + torch.tanh(inner))  # 4
        h = h * self.scale.to(dt)  # 1
        out: torch.Tensor = x + h  # residual: 1
        return out


class ChainNet(nn.Module):
    def __init__(self, width: int, depth: int = DEPTH, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[ChainBlock(width) for _ in range(depth)])
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.blocks(x))
        return logits


def train(
    steps: int,
    device: str = "cpu",
    on_step: Callable[[], None] | None = None,
    *,
    batch_size: int | None = None,
    width: int | None = None,
    dtype: str | None = None,
    compile_model: bool = False,
) -> list[float]:
    """Run `steps` optimizer steps; call on_step() after each optimizer step; return losses."""
    torch.manual_seed(0)
    dev = torch.device(device)
    kind = "cuda" if dev.type == "cuda" else "cpu"
    batch_size = batch_size or BATCH_SIZE[kind]
    width = width or WIDTH[kind]
    amp_dtype = DTYPES[dtype or DTYPE[kind]]
    model: nn.Module = ChainNet(width).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    if compile_model:
        model = torch.compile(model)  # type: ignore[assignment]
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(batch_size, width, generator=gen).to(dev),
            torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen).to(dev),
        )
        for _ in range(NUM_BATCHES)
    ]
    use_amp = amp_dtype != torch.float32
    losses: list[float] = []
    model.train()
    # Memory-bound pointwise ops gain little from a second intra-op thread on CPU, and one
    # thread keeps step times steady on a busy machine (as in launch_bound.py).
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    try:
        for step in range(steps):
            x, y = batches[step % len(batches)]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=dev.type, dtype=amp_dtype, enabled=use_amp):
                loss = loss_fn(model(x).float(), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.item()))
            if on_step is not None:
                on_step()
    finally:
        torch.set_num_threads(threads)
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows per batch (default: 16384 on cuda, 512 on cpu)",
    )
    parser.add_argument(
        "--width", type=int, default=None, help="block width (default: 2048 on cuda, 512 on cpu)"
    )
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="autocast dtype (default: bf16 on cuda, fp32 on cpu)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile(model) (default mode): Inductor fuses the pointwise chains",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="profile with torchtriage and write results to DIR",
    )
    args = parser.parse_args(argv)
    options = {
        "batch_size": args.batch_size,
        "width": args.width,
        "dtype": args.dtype,
        "compile_model": args.compile,
    }
    if args.profile:
        import torchtriage

        with torchtriage.profile(out_dir=args.profile) as prof:
            losses = train(args.steps, args.device, on_step=prof.step, **options)
        print(torchtriage.render_text(prof.diagnosis))
    else:
        start = time.perf_counter()
        losses = train(args.steps, args.device, **options)
        elapsed = time.perf_counter() - start
        print(f"{len(losses)} steps in {elapsed:.2f}s ({1000 * elapsed / len(losses):.1f} ms/step)")
    print(f"final loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
