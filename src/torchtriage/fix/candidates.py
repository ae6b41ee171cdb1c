"""Which prescriptions can be tried without touching the user's code, and with which values.

Each injectable prescription maps to a :class:`Search`: one knob and the values to try, in
order. Values are tried one after the other while each beats the best so far (so ``num_workers``
goes 2, 4, 8, ... until more workers stop helping, and ``compile.mode`` goes from the cheapest
compile to the most expensive); a search stops at the first value that is not faster.
Prescriptions that need a code change (``sync.remove``, ``kernel.custom``, ``memory.fsdp``, ...)
are reported with their code, never tried.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Context:
    """What the searches may depend on."""

    gpu: bool
    cores: int
    kept: dict[str, Any]  # knobs kept so far
    distributed: bool = False
    nccl: bool = False


@dataclass(frozen=True)
class Search:
    prescription: str
    knob: str
    values: tuple[Any, ...]
    extra: dict[str, Any] | None = None  # knobs that go with every value (e.g. non_blocking)
    why_not: str | None = None  # set when this search does not apply here
    fallback: Search | None = None  # tried when this one keeps nothing (fused -> foreach)


def _workers(ctx: Context) -> Search:
    top = max(4, 2 * ctx.cores)  # I/O-bound loading hides latency beyond the core count
    values = []
    n = 2
    while n <= top:
        values.append(n)
        n *= 2
    return Search("dataloader.num_workers", "dataloader.num_workers", tuple(values))


def _needs_workers(prescription: str, knob: str, values: tuple[Any, ...]) -> Callable:
    def make(ctx: Context) -> Search:
        why = (None if ctx.kept.get("dataloader.num_workers")
               else "needs DataLoader workers (dataloader.num_workers kept first)")
        return Search(prescription, knob, values, why_not=why)
    return make


def _gpu_only(prescription: str, knob: str, values: tuple[Any, ...],
              extra: dict[str, Any] | None = None) -> Callable:
    def make(ctx: Context) -> Search:
        return Search(prescription, knob, values, extra,
                      why_not=None if ctx.gpu else "applies to CUDA jobs only")
    return make


def _plain(prescription: str, knob: str, values: tuple[Any, ...]) -> Callable:
    return lambda ctx: Search(prescription, knob, values)


def _comm_hook(ctx: Context) -> Search:
    why = None if ctx.distributed else "needs a DistributedDataParallel job"
    return Search("ddp.comm_hook", "ddp.comm_hook", ("bf16",) if ctx.nccl else ("fp16",),
                  why_not=why)


def _ddp(prescription: str, knob: str, values: tuple[Any, ...]) -> Callable:
    def make(ctx: Context) -> Search:
        return Search(prescription, knob, values,
                      why_not=None if ctx.distributed else "needs a DistributedDataParallel job")
    return make


SEARCHES: dict[str, Callable[[Context], Search]] = {
    "dataloader.num_workers": _workers,
    "dataloader.pin_memory": _gpu_only("dataloader.pin_memory", "dataloader.pin_memory",
                                       (True,), {"h2d.non_blocking": True}),
    "dataloader.prefetch_factor": _needs_workers("dataloader.prefetch_factor",
                                                 "dataloader.prefetch_factor", (4, 8)),
    "dataloader.persistent_workers": _needs_workers("dataloader.persistent_workers",
                                                    "dataloader.persistent_workers", (True,)),
    "h2d.non_blocking": _gpu_only("h2d.non_blocking", "h2d.non_blocking", (True,)),
    # fused kernels first; the multi-tensor (foreach) path where fused is not faster
    "optimizer.fused": lambda ctx: Search(
        "optimizer.fused", "optimizer.fused", (True,),
        fallback=Search("optimizer.fused", "optimizer.foreach", (True,))),
    "compile.reduce_overhead": _gpu_only("compile.reduce_overhead", "compile.mode",
                                         ("reduce-overhead",)),
    "matmul.tf32": _gpu_only("matmul.tf32", "matmul.tf32", (True,)),
    "amp.bf16": _plain("amp.bf16", "amp.bf16", (True,)),
    # compile modes in order of compile cost
    "compile.default": _plain("compile.default", "compile.mode",
                              ("default", "reduce-overhead", "max-autotune")),
    "compile.max_autotune": _plain("compile.max_autotune", "compile.mode", ("max-autotune",)),
    "ddp.bucket_cap": _ddp("ddp.bucket_cap", "ddp.bucket_cap_mb", (50, 100, 200)),
    "ddp.static_graph": _ddp("ddp.static_graph", "ddp.static_graph", (True,)),
    "ddp.comm_hook": _comm_hook,
}


# prescriptions the loop never injects, and why (others: "needs a code change" + the code)
NOT_INJECTED: dict[str, str] = {
    "ddp.grad_accumulation": "changes the effective batch (k times the samples per optimizer "
                             "step), a training decision the loop does not make for you: "
                             "`with model.no_sync(): loss.backward()` for k-1 of every k "
                             "micro-batches",
    "sync.remove": "the script reads a device value on the host every step (e.g. "
                   "`loss.item()`); only a code change can defer it: log `loss.detach()` and "
                   "call `.item()` every N steps",
}


def search_for(prescription: str, ctx: Context) -> Search | None:
    """The search for an injectable prescription, or None when it needs a code change."""
    make = SEARCHES.get(prescription)
    return make(ctx) if make is not None else None


def machine_context(kept: dict[str, Any], diagnosis: Any) -> Context:
    """The context from a diagnosis (mode, ranks, collectives) and this machine's cores."""
    nccl = any(c.source == "nccl kernel" for c in getattr(diagnosis, "collectives", []))
    world = getattr(diagnosis.trace, "world_size", None) or 1
    return Context(gpu=diagnosis.trace.mode == "gpu", cores=os.cpu_count() or 1, kept=kept,
                   distributed=world > 1, nccl=nccl)
