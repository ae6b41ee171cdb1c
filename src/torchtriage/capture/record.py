"""The bootstrap's part of the run record (``run.rank<N>.json``): step times, losses, batch
sizes, knob outcomes, start-up and compile cost; see :class:`~torchtriage.results.run.RunRecord`.
"""

from __future__ import annotations

import sys
from typing import Any

from torchtriage.capture.agreement import world_size
from torchtriage.capture.knob_host import KnobHost
from torchtriage.capture.signals import MAX_BATCH_SIZES, SignalRecorder
from torchtriage.capture.steps import StepClock, StepDetector
from torchtriage.results.run import RunMode


def record_fields(rank: int, mode: RunMode, clock: StepClock, detector: StepDetector,
                  signals: SignalRecorder, host: KnobHost) -> dict[str, Any]:
    """The RunRecord fields the bootstrap fills, by name (the session adds its own)."""
    return {
        "rank": rank,
        "world_size": world_size(),
        "steps_detected": clock.steps,
        "step_detection": detector.description,
        "host_step_ms": clock.host_step_ms(),
        "losses": signals.loss_points(detector.last_key),
        "batch_sizes": signals.batch_sizes(detector.last_key)[:MAX_BATCH_SIZES],
        "knobs": host.outcomes(),
        "mode": mode,
        "first_step_s": clock.first_step_s(),
        "warmup_end_s": clock.warmup_end_s(),
        "compile": compile_summary(),
        "warmup_steps": clock.warmup if mode == "time" else None,
        "loader_queue": signals.loader_queue,
        "loader_workers": signals.loader_workers,
        "loader_batches": signals.loader_batches,
    }


def compile_summary() -> dict[str, Any] | None:
    """What torch.compile did in this process (None when dynamo never compiled anything)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    try:
        counters = utils.counters
        frames = int(counters["frames"].get("total", 0))
        if not frames:
            return None
        seconds = sum(m.entire_frame_compile_time_s or 0.0
                      for m in utils.get_compilation_metrics())
        seconds += sum(utils.compilation_time_metrics.get(
            "compile_fx.<locals>.bw_compiler", []))
        breaks = counters["graph_break"]
        return {
            "seconds": round(seconds, 3),
            "frames": frames,
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": [str(k)[:200] for k, _ in breaks.most_common(5)],
            "recompiles": int(counters["recompiles"].total())
            if "recompiles" in counters else 0,
        }
    except Exception:  # private API: its shape changes between releases
        return None
