"""Which prescriptions can be tried without touching the user's code, and with which values.

Each injectable prescription maps to a :class:`Search`: one knob and the values to try, in
order, as the knob registry (:mod:`torchtriage.diagnosis.knobs`, a knob's ``serves``) declares
them. Values are tried one after the other while each beats the best so far (so
``num_workers`` goes 2, 4, 8, ... until more workers stop helping, and ``compile.mode`` goes
from the cheapest compile to the most expensive); a search stops at the first value that is not
faster. Prescriptions that need a code change (``sync.remove``, ``kernel.custom``,
``memory.fsdp``, ...) are reported with their code, never tried.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from torchtriage.diagnosis.knobs import (
    CONDITION_WHY,
    NOT_INJECTED,
    Condition,
    search_values,
    served,
    workers_to_hide_loading,
)
from torchtriage.diagnosis.rules.host import MULTI_TENSOR_OPS

__all__ = ["NOT_INJECTED", "Context", "Search", "machine_context", "search_for"]


@dataclass(frozen=True)
class Context:
    """What the searches may depend on."""

    gpu: bool
    cores: int
    kept: dict[str, Any]  # knobs kept so far
    distributed: bool = False
    nccl: bool = False
    workers_hint: int | None = None  # DataLoader workers the trace says hide loading
    multi_tensor_optimizer: bool = False  # the trace's optimizer runs aten::_foreach_* ops
    script_workers: int = 0  # DataLoader workers the script itself used (its run record)


@dataclass(frozen=True)
class Search:
    prescription: str
    knob: str
    values: tuple[Any, ...]
    extra: dict[str, Any] | None = None  # knobs that go with every value (e.g. non_blocking)
    why_not: str | None = None  # set when this search does not apply here
    fallback: Search | None = None  # tried when this one keeps nothing (fused -> foreach)


def met(needs: Condition, ctx: Context) -> bool:
    """Whether a search's condition holds (one entry per registry Condition)."""
    return {"gpu": ctx.gpu, "workers": bool(ctx.kept.get("dataloader.num_workers")
                                                  or ctx.script_workers),
            "distributed": ctx.distributed,
            "per_parameter_optimizer": not ctx.multi_tensor_optimizer}[needs]


def _why_not(needs: Condition | None, ctx: Context) -> str | None:
    return None if needs is None or met(needs, ctx) else CONDITION_WHY[needs]


def search_for(prescription: str, ctx: Context) -> Search | None:
    """The search for an injectable prescription (from the knob registry), or None when it
    needs a code change."""
    found = served(prescription)
    if found is None:
        return None
    knob, serves = found
    values = search_values(serves, cores=ctx.cores, nccl=ctx.nccl,
                           workers_hint=ctx.workers_hint)
    fallback = (Search(prescription, serves.fallback, values)
                if serves.fallback is not None and (serves.fallback_needs is None
                                                    or met(serves.fallback_needs, ctx))
                else None)
    return Search(prescription, knob.id, values, dict(serves.extra) or None,
                  why_not=_why_not(serves.needs, ctx), fallback=fallback)


def machine_context(kept: dict[str, Any], diagnosis: Any, loader_workers: int = 0) -> Context:
    """The context from a diagnosis (mode, ranks, collectives, the loading share of its steps),
    the workers its DataLoader used (``loader_workers``, from the run record) and the cores the
    job may use (its CPU affinity or cgroup quota as the run recorded them, else this
    machine's cores)."""
    nccl = any(c.source == "nccl kernel" for c in getattr(diagnosis, "collectives", []))
    world = getattr(diagnosis.trace, "world_size", None) or 1
    steps = len(diagnosis.breakdown.steps)
    hint = None
    if steps and "data_loading" in diagnosis.layers:
        hint = workers_to_hide_loading(diagnosis.layers["data_loading"].time_ms / steps,
                                       diagnosis.breakdown.median_step_ms, loader_workers)
    machine = getattr(diagnosis, "machine", None)
    available = getattr(machine, "cores_available", None)
    cores = max(int(available), 1) if available else os.cpu_count() or 1
    host = diagnosis.layers.get("host")
    multi = any(e.metric == MULTI_TENSOR_OPS and e.value for e in (host.evidence if host else ()))
    return Context(gpu=diagnosis.trace.mode == "gpu", cores=cores, kept=kept,
                   distributed=world > 1, nccl=nccl, workers_hint=hint,
                   multi_tensor_optimizer=multi, script_workers=loader_workers)
