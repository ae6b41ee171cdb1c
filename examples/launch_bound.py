"""Launch-bound training: per-op host overhead is the bottleneck (layer: host).

What: a deep, narrow MLP, 60 x (Linear(64, 64) + ReLU) + a Linear head, trained with
batch 8 on inputs precomputed in memory. Each matmul is only 8x64x64 (~65 kFLOP), so
every aten op finishes in a few microseconds, yet a step issues thousands of them
(forward, autograd backward, and a per-parameter ``for``-loop optimizer over 242 tensors).

Why: the time goes to Python, the dispatcher, autograd bookkeeping and (on a GPU) kernel
launches, not to arithmetic. On CUDA the device sits idle between tiny kernels.

Fix: issue fewer, bigger ops: a multi-tensor optimizer (``--foreach``, or ``fused=True``
on GPU), a larger batch (``--batch-size 512``: 64x the samples for <2x the step time), and
on GPU CUDA graphs or ``torch.compile(mode="reduce-overhead")`` to fuse ops and amortise
launches (``--compile reduce-overhead``). ``--fixed`` is ``--compile reduce-overhead
--foreach``.

Run::

    python examples/launch_bound.py
    python examples/launch_bound.py --device cuda
    python examples/launch_bound.py --foreach       # fewer optimizer ops
    python examples/launch_bound.py --device cuda --fixed   # CUDA graphs + foreach
    python examples/launch_bound.py --profile out/  # diagnose with torchtriage
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

BATCH_SIZE = 8
WIDTH = 64
DEPTH = 60
NUM_CLASSES = 10
NUM_BATCHES = 4  # distinct in-memory batches, cycled


def build_model(depth: int = DEPTH, width: int = WIDTH) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, NUM_CLASSES))
    return nn.Sequential(*layers)


def train(
    steps: int,
    device: str = "cpu",
    on_step: Callable[[], None] | None = None,
    *,
    batch_size: int = BATCH_SIZE,
    foreach: bool = False,
    compile_mode: str | None = None,
) -> list[float]:
    """Run `steps` optimizer steps; call on_step() after each optimizer step; return losses."""
    torch.manual_seed(0)
    dev = torch.device(device)
    model = build_model().to(dev)
    # foreach=False: the classic per-parameter loop (many tiny ops); --foreach batches them.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=foreach)
    if compile_mode is not None:
        # "reduce-overhead": Inductor fuses the ReLUs and, on CUDA, replays each step's
        # forward and backward as CUDA graphs (one launch instead of hundreds).
        model = torch.compile(model, mode=compile_mode)  # type: ignore[assignment]
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(batch_size, WIDTH, generator=gen).to(dev),
            torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen).to(dev),
        )
        for _ in range(NUM_BATCHES)
    ]
    losses: list[float] = []
    model.train()
    # Ops this small gain nothing from intra-op threads; one thread also keeps the per-op cost
    # steady on a busy machine (a 2-thread 8x64x64 matmul can wait milliseconds for a core).
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    try:
        for step in range(steps):
            x, y = batches[step % len(batches)]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
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
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument(
        "--foreach",
        action="store_true",
        help="multi-tensor (foreach) optimizer instead of a per-parameter loop",
    )
    parser.add_argument(
        "--compile",
        choices=["none", "default", "reduce-overhead"],
        default="none",
        help="torch.compile the model with this mode (reduce-overhead: CUDA graphs on GPU)",
    )
    parser.add_argument(
        "--fixed",
        action="store_true",
        help="the fixed form: --compile reduce-overhead --foreach",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="profile with torchtriage and write results to DIR",
    )
    args = parser.parse_args(argv)
    compile_mode = "reduce-overhead" if args.fixed else args.compile
    options = {
        "batch_size": args.batch_size,
        "foreach": args.foreach or args.fixed,
        "compile_mode": None if compile_mode == "none" else compile_mode,
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
