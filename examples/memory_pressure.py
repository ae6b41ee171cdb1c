"""Memory-pressure training: peak memory is the bottleneck (layer: memory).

What: a deep, narrow MLP (20 x [Linear(64) + LayerNorm + GELU] + a Linear head, ~84k
parameters) trained with Adam on a huge batch (16384 samples) precomputed in memory.
Params, grads and Adam's two moment buffers are tiny (~1.4 MB); the peak is the
activations autograd keeps for backward: every block saves ~3 tensors of 16384 x 64
floats (4 MiB each), ~250 MiB in all. That is ~94% of ``DEVICE_MEMORY``, a pretend
device capacity that stands in for a GPU's memory when running on CPU: a slightly bigger
batch or a few more layers would run out of memory.

On CUDA the capacity is real: a ballast tensor of ``--fill`` (default 0.80) x the card's
memory stands in for a large model's weights and optimizer state, and the default batch
is sized from the model's per-sample activation footprint (~15.6 kB: 20 blocks x 3 saved
fp32 tensors of 64 + LayerNorm's mean/rstd) so that activations take another ~12% of the
card: ~1.15M samples on an H200 (139.8 GiB), a peak near 93% of its memory (measured:
92.7% of ``torch.cuda.max_memory_reserved()``; 83.4% with ``--fixed``).
``--dry-run`` prints the estimate without training.

Why: activation memory grows linearly with batch size x depth x width, and the batch
was sized without regard for the device's capacity.

Fix: shrink the activations: a smaller batch (``--batch-size 4096``, with gradient
accumulation to keep the effective batch: ``--accumulate 4`` splits each batch into 4
micro-batches, ``--fixed`` for short), activation checkpointing
(``torch.utils.checkpoint``), or mixed precision on GPU.

Run::

    python examples/memory_pressure.py
    python examples/memory_pressure.py --device cuda                 # ~93% of the card
    python examples/memory_pressure.py --device cuda --dry-run       # print the estimate
    python examples/memory_pressure.py --device cuda --fixed         # 4 micro-batches: ~83%
    python examples/memory_pressure.py --batch-size 4096    # first fix
    python examples/memory_pressure.py --profile out/       # diagnose with torchtriage
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

# Pretend device capacity used on CPU (peak Total Allocated is ~94% of it).
DEVICE_MEMORY = "267MiB"

BATCH_SIZE = 16384
IN_FEATURES = 32
WIDTH = 64
DEPTH = 20
NUM_CLASSES = 10
NUM_BATCHES = 2  # distinct in-memory batches, cycled

# CUDA: the ballast (pretend weights + optimizer state) and the activations' target share.
CUDA_FILL = 0.80  # fraction of total device memory held by the ballast tensor
CUDA_ACTIVATION_SHARE = 0.12  # the default CUDA batch's activations, as a fraction of it
BATCH_MULTIPLE = 4096  # CUDA default batch rounded down to this (divisible by --accumulate)
H200_MEMORY = int(139.8 * 2**30)  # assumed by --dry-run when no CUDA device is present


def activation_bytes_per_sample(depth: int = DEPTH, width: int = WIDTH) -> int:
    """Bytes autograd saves per sample (fp32) for backward, i.e. the activation footprint.

    Per block: the Linear output (LayerNorm's input), the LayerNorm output (GELU's input)
    and the GELU output (the next Linear's input): 3 x width floats, plus LayerNorm's
    per-row mean and rstd (2 floats). The loss adds the log-softmax output (NUM_CLASSES
    floats). The input batch itself is counted separately (it persists across steps).
    Checked against the storages autograd saves (saved_tensors_hooks) on CPU.
    """
    return 4 * (depth * (3 * width + 2) + NUM_CLASSES)


def batch_bytes_per_sample() -> int:
    """Bytes per sample of one stored input batch: IN_FEATURES floats + an int64 label."""
    return 4 * IN_FEATURES + 8


def cuda_default_batch(total_memory: int, share: float = CUDA_ACTIVATION_SHARE) -> int:
    """Largest multiple of BATCH_MULTIPLE whose activations fit in `share` of the card."""
    per_sample = activation_bytes_per_sample()
    return max(
        BATCH_MULTIPLE, int(share * total_memory / per_sample) // BATCH_MULTIPLE * BATCH_MULTIPLE
    )


def estimate(
    total_memory: int, fill: float, batch_size: int, accumulate: int = 1
) -> dict[str, float]:
    """Analytic peak: ballast + saved activations of one micro-batch + the stored batches +
    2 activation-sized temporaries (the gradients in flight early in backward)."""
    micro = batch_size // accumulate
    act = micro * activation_bytes_per_sample()
    temps = 2 * micro * 4 * WIDTH
    inputs = NUM_BATCHES * batch_size * batch_bytes_per_sample()
    ballast = int(fill * total_memory)
    peak = ballast + act + temps + inputs
    return {
        "total": total_memory,
        "ballast": ballast,
        "activations": act,
        "temporaries": temps,
        "inputs": inputs,
        "peak": peak,
        "peak_fraction": peak / total_memory,
    }


def build_model(depth: int = DEPTH, width: int = WIDTH) -> nn.Sequential:
    layers: list[nn.Module] = []
    fan_in = IN_FEATURES
    for _ in range(depth):
        layers += [nn.Linear(fan_in, width), nn.LayerNorm(width), nn.GELU()]
        fan_in = width
    layers.append(nn.Linear(fan_in, NUM_CLASSES))
    return nn.Sequential(*layers)


def train(
    steps: int,
    device: str = "cpu",
    on_step: Callable[[], None] | None = None,
    *,
    batch_size: int | None = None,
    fill: float | None = None,
    accumulate: int = 1,
) -> list[float]:
    """Run `steps` optimizer steps; call on_step() after each optimizer step; return losses.

    On CUDA, `fill` (default CUDA_FILL) of the device's memory is taken by a ballast tensor
    for the whole run, and `batch_size` defaults to cuda_default_batch(); elsewhere they
    default to 0 and BATCH_SIZE. `accumulate` splits each batch into that many micro-batches
    (gradient accumulation: same effective batch, 1/accumulate of the activations).
    """
    torch.manual_seed(0)
    dev = torch.device(device)
    ballast = None
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        fill = CUDA_FILL if fill is None else fill
        batch_size = batch_size or cuda_default_batch(total)
        if fill > 0:
            # Pretend weights + optimizer state of a large model: held for the whole run.
            ballast = torch.empty(int(fill * total), dtype=torch.uint8, device=dev)
    batch_size = batch_size or BATCH_SIZE
    if batch_size % accumulate:
        raise ValueError(f"batch_size {batch_size} is not divisible by accumulate {accumulate}")
    model = build_model().to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(batch_size, IN_FEATURES, generator=gen).to(dev),
            torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen).to(dev),
        )
        for _ in range(NUM_BATCHES)
    ]
    losses: list[float] = []
    model.train()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        if accumulate == 1:
            loss = loss_fn(model(x), y)
            loss.backward()
        else:
            loss = torch.zeros((), device=dev)
            for xs, ys in zip(x.chunk(accumulate), y.chunk(accumulate), strict=True):
                micro_loss = loss_fn(model(xs), ys) / accumulate
                micro_loss.backward()  # frees this micro-batch's activations
                loss += micro_loss.detach()
        optimizer.step()
        losses.append(float(loss.item()))
        if on_step is not None:
            on_step()
    del ballast
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"samples per optimizer step (default: {BATCH_SIZE} on cpu; on cuda sized so "
        f"activations take ~{CUDA_ACTIVATION_SHARE:.0%} of the card)",
    )
    parser.add_argument(
        "--fill",
        type=float,
        default=None,
        metavar="FRACTION",
        help=f"cuda: hold this fraction of device memory in a ballast tensor "
        f"(default: {CUDA_FILL} on cuda, 0 on cpu)",
    )
    parser.add_argument(
        "--accumulate",
        type=int,
        default=1,
        metavar="K",
        help="split each batch into K micro-batches (gradient accumulation)",
    )
    parser.add_argument("--fixed", action="store_true", help="the fixed form: --accumulate 4")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the memory estimate (cuda: for this device, or an H200 without one); "
        "do not train",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="profile with torchtriage and write results to DIR",
    )
    args = parser.parse_args(argv)
    accumulate = 4 if args.fixed else args.accumulate
    options = {"batch_size": args.batch_size, "fill": args.fill, "accumulate": accumulate}
    if args.dry_run:
        print_estimate(args.device, args.batch_size, args.fill, accumulate)
        return
    if args.profile:
        import torchtriage

        # On CPU there is no device capacity to measure against: pass the pretend one.
        extra = {"device_memory": DEVICE_MEMORY} if args.device == "cpu" else {}
        with torchtriage.profile(out_dir=args.profile, **extra) as prof:
            losses = train(args.steps, args.device, on_step=prof.step, **options)
        print(torchtriage.render_text(prof.diagnosis))
    else:
        start = time.perf_counter()
        losses = train(args.steps, args.device, **options)
        elapsed = time.perf_counter() - start
        print(f"{len(losses)} steps in {elapsed:.2f}s ({1000 * elapsed / len(losses):.1f} ms/step)")
    if args.device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        peak = torch.cuda.max_memory_reserved()
        print(
            f"peak reserved {peak / 2**30:.2f} GiB = {peak / total:.1%} of {total / 2**30:.1f} GiB"
        )
    print(f"final loss {losses[-1]:.4f}")


def print_estimate(
    device: str, batch_size: int | None, fill: float | None, accumulate: int
) -> None:
    """--dry-run: the analytic memory budget, without allocating anything."""
    if device == "cuda":
        if torch.cuda.is_available():
            total, where = torch.cuda.get_device_properties(0).total_memory, "this device"
        else:
            total, where = H200_MEMORY, "an assumed H200 (no CUDA device here)"
        batch_size = batch_size or cuda_default_batch(total)
        fill = CUDA_FILL if fill is None else fill
    else:
        total, where = int(DEVICE_MEMORY.removesuffix("MiB")) * 2**20, "the pretend DEVICE_MEMORY"
        batch_size = batch_size or BATCH_SIZE
        fill = 0.0
    e = estimate(total, fill, batch_size, accumulate)
    gib = 2**30
    print(f"capacity {total / gib:.2f} GiB ({where})")
    print(f"activations per sample {activation_bytes_per_sample():,} B (fp32, saved for backward)")
    print(f"batch {batch_size:,} in {accumulate} micro-batch(es) of {batch_size // accumulate:,}")
    for key in ("ballast", "activations", "temporaries", "inputs", "peak"):
        print(f"  {key:<12} {e[key] / gib:8.2f} GiB  {e[key] / total:6.1%}")


if __name__ == "__main__":
    main()
