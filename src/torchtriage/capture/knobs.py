"""Knobs: governance options applied to an unmodified script by the ``torchtriage run`` bootstrap.

Ids match the prescription ids where a prescription maps onto one setting. Values are parsed
and checked in the parent process, before the script starts; the bootstrap applies them and
records, per knob, whether it took effect and where, or why it did not apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtriage.errors import TorchtriageError


@dataclass(frozen=True)
class Knob:
    id: str
    kind: str  # "int" | "bool" | "choice"
    help: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None


KNOBS: dict[str, Knob] = {k.id: k for k in (
    Knob("dataloader.num_workers", "int", "DataLoader(num_workers=N) for every DataLoader",
         minimum=0),
    Knob("dataloader.pin_memory", "bool", "DataLoader(pin_memory=...)"),
    Knob("dataloader.prefetch_factor", "int", "DataLoader(prefetch_factor=N) (needs workers)",
         minimum=1),
    Knob("dataloader.persistent_workers", "bool",
         "DataLoader(persistent_workers=...) (needs workers)"),
    Knob("h2d.non_blocking", "bool",
         "Tensor.to(cuda) of a pinned CPU tensor becomes non_blocking=True"),
    Knob("matmul.tf32", "bool", "torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32"),
    Knob("cudnn.benchmark", "bool", "torch.backends.cudnn.benchmark"),
    Knob("amp.bf16", "bool", "bf16 autocast around the root module's forward"),
    Knob("compile.mode", "choice", "torch.compile the root module's forward, in place",
         choices=("none", "default", "reduce-overhead", "max-autotune")),
    Knob("optimizer.fused", "bool", "optimizers built with fused=True where supported"),
    Knob("optimizer.foreach", "bool", "optimizers built with foreach=True"),
    Knob("memory.grad_accumulation", "int",
         "split each DataLoader batch into N micro-batches; the optimizer steps every N-th "
         "backward (same effective batch; DDP all-reduces in the last one)", minimum=1),
    Knob("memory.activation_checkpointing", "bool",
         "checkpoint each block of the root module's largest run of repeated blocks"),
    Knob("ddp.bucket_cap_mb", "int", "DistributedDataParallel(bucket_cap_mb=N)", minimum=1),
    Knob("ddp.gradient_as_bucket_view", "bool",
         "DistributedDataParallel(gradient_as_bucket_view=...)"),
    Knob("ddp.static_graph", "bool", "DistributedDataParallel(static_graph=...)"),
    Knob("ddp.comm_hook", "choice", "register a DDP communication hook",
         choices=("none", "bf16", "fp16")),
)}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_knobs(items: list[str]) -> dict[str, Any]:
    """``["id=value", ...]`` -> ``{id: typed value}``; one-line TorchtriageError when invalid."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise TorchtriageError(f"knob {item!r} is not ID=VALUE")
        knob = KNOBS.get(key)
        if knob is None:
            raise TorchtriageError(
                f"unknown knob {key!r}; known knobs: {', '.join(sorted(KNOBS))}")
        out[key] = _value(knob, raw)
    return out


def _value(knob: Knob, raw: str) -> Any:
    if knob.kind == "bool":
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise TorchtriageError(f"knob {knob.id} takes true or false, got {raw!r}")
    if knob.kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise TorchtriageError(f"knob {knob.id} takes an integer, got {raw!r}") from None
        if knob.minimum is not None and value < knob.minimum:
            raise TorchtriageError(f"knob {knob.id} must be >= {knob.minimum}, got {value}")
        return value
    if raw not in knob.choices:
        raise TorchtriageError(f"knob {knob.id} takes one of {', '.join(knob.choices)}, "
                               f"got {raw!r}")
    return raw
