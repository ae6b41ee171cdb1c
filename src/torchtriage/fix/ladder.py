"""The memory ladder: when the job runs out of memory or is near capacity, find the cheapest
rung that fits.

Rungs in cost order (the catalog's memory prescriptions): gradient accumulation, activation
checkpointing, bf16, FSDP/ZeRO. Each injectable rung is profiled on top of the fixes kept so
far; it *fits* when the run does not run out of memory and the diagnosis no longer names
`memory` (its peak is under ``memory_near_capacity``), and its losses pass parity with the
original run. The first rung that fits is kept and the ladder stops there: an expensive rung is
never tried while a cheaper one fits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchtriage.diagnosis.catalog import CATALOG
from torchtriage.fix.result import Attempt, FixStep
from torchtriage.verify.parity import check_parity

# rung -> the knobs that inject it (None: a code change)
RUNGS: tuple[tuple[str, dict[str, Any] | None], ...] = (
    ("memory.grad_accumulation", None),
    ("memory.activation_checkpointing", {"memory.activation_checkpointing": True}),
    ("memory.bf16", {"amp.bf16": True}),
    ("memory.fsdp", None),
)
_CODE = {r.id: r.code for r in CATALOG}


def peak_fraction(diagnosis) -> float | None:
    fractions = [m.peak_fraction for m in diagnosis.memory if m.peak_fraction is not None]
    return max(fractions) if fractions else None


def climb(profile: Callable[[dict[str, Any], str], tuple[Any, list[float], bool]],
          kept: dict[str, Any], round_no: int, before, before_losses: list[float]
          ) -> tuple[list[FixStep], dict[str, Any] | None, Any]:
    """Try the rungs in order; return the steps, the kept rung's knobs (or None) and the
    diagnosis of the configuration with it.

    Args:
        profile: runs the command with knobs, returns (diagnosis or None when nothing was
            recorded, rank 0's losses, whether it ran out of memory); the label names the run
            directory.
        before: the diagnosis of the current configuration (memory-bound).
    """
    steps = []
    peak_before = peak_fraction(before)
    for rung, knobs in RUNGS:
        if knobs is None:
            steps.append(FixStep(round=round_no, layer="memory", prescription=rung, knob=None,
                                 result="not_injectable",
                                 why=f"needs a code change: {_CODE.get(rung, '')}"))
            continue
        if all(kept.get(k) == v for k, v in knobs.items()):
            continue
        diagnosis, losses, oom = profile({**kept, **knobs}, rung)
        knob, value = next(iter(knobs.items()))
        if diagnosis is None:
            attempt = Attempt(value=value, verdict="does_not_fit", note="nothing was recorded")
            steps.append(FixStep(round=round_no, layer="memory", prescription=rung, knob=knob,
                                 result="does_not_fit", why="the run recorded no trace",
                                 attempts=[attempt]))
            continue
        peak = peak_fraction(diagnosis)
        fits = not oom and diagnosis.primary != "memory"
        parity = check_parity([before_losses], [losses], knobs)
        moved = (f"peak {_pct(peak_before)} -> {_pct(peak)} of capacity"
                 + (", out of memory" if oom else ""))
        attempt = Attempt(value=value, verdict="fits" if fits else "does_not_fit",
                          parity=parity.status, peak_fraction=peak, note=moved)
        if fits and parity.status == "fail":
            steps.append(FixStep(round=round_no, layer="memory", prescription=rung, knob=knob,
                                 result="dropped", why=f"fits ({moved}) but changes results "
                                 f"({parity.detail})", attempts=[attempt]))
            continue
        if fits:
            steps.append(FixStep(round=round_no, layer="memory", prescription=rung, knob=knob,
                                 result="kept", kept_value=value,
                                 why=f"the cheapest rung that fits: {moved}; median step "
                                     f"{before.breakdown.median_step_ms:.1f} -> "
                                     f"{diagnosis.breakdown.median_step_ms:.1f} ms",
                                 attempts=[attempt]))
            return steps, knobs, diagnosis
        steps.append(FixStep(round=round_no, layer="memory", prescription=rung, knob=knob,
                             result="does_not_fit", why=f"still memory-bound: {moved}",
                             attempts=[attempt]))
    return steps, None, before


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"
