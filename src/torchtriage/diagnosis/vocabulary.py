"""Stable ids used everywhere: layers, category-to-layer mapping, confidence levels.

These strings appear in JSON output, the README and later issues; never rename one.
"""

from __future__ import annotations

from typing import Literal

Layer = Literal["data_loading", "host", "kernel", "communication", "memory"]
Confidence = Literal["low", "medium", "high"]
Severity = Literal["info", "warning", "critical"]
TraceMode = Literal["gpu", "cpu"]
# Which branch of the primary-layer rule decided the verdict (diagnose.py, docs/reference.md):
# memory by an out-of-memory error or by its peak; data loading by contended cores or by a
# loader slower than the window's steps; kernel at compute_bound; else the largest
# non-compute layer at its significance threshold; kernel when none reaches it. Over the whole
# run, before these: stalls that recur, or torch.compile recompiling, at run_stall_significant.
PrimaryRuleBranch = Literal["out_of_memory", "memory_near_capacity", "contended_compute",
                            "loader_outpaced", "compute_bound", "largest_significant",
                            "none_significant", "recurring_stall", "run_recompiling"]
# The whole run (capture/timeline.py, diagnosis/run_view.py): what the per-step memory
# reading is, what the training process saw happen inside a step, what a recurring stall is
# attributed to, and what retains memory that grows.
MemorySource = Literal["cuda_allocator", "process_heap", "process_rss"]
RunEventKind = Literal["loader_start", "evaluation", "checkpoint"]
StallCause = Literal["dataloader_restart", "evaluation", "checkpoint", "compilation",
                     "unexplained"]
GrowthCause = Literal["autograd_graph_retained", "tensors_retained", "outside_python_tensors",
                      "not_assessed"]
# Impossible timings found in a trace (trace/quality.py; zero-length steps: analysis/steps.py)
# and what was done with them.
DataQualityKind = Literal["missing_ts", "negative_duration", "duration_past_span", "duplicate",
                          "zero_length_step"]
DataQualityAction = Literal["dropped", "clamped to 0", "left out of the steps"]
# What a host-device sync was for (analysis/transfers.py sync_sources, the same list).
SyncKind = Literal["data_dependent", "condition", "scalar_read", "copy_to_device",
                   "copy_to_host", "outside_ops", "other"]

LAYERS: dict[str, str] = {
    "data_loading": "the input pipeline: DataLoader work or waits, host-to-device input copies",
    "host": "CPU-side dispatch and launch overhead, host-device syncs, Python glue",
    "kernel": "the compute itself: GPU kernels, or CPU ops on a CPU-only job",
    "communication": "collectives (NCCL, gloo) not hidden behind compute",
    "memory": "the job OOMs or its peak reaches the memory threshold of the device",
}

# Layers that are ranked by their share of step time; memory is judged by capacity instead.
TIME_LAYERS: tuple[str, ...] = ("data_loading", "host", "kernel", "communication")

# Breakdown category -> layer, per trace mode.
GPU_CATEGORY_LAYER: dict[str, str] = {
    "kernel": "kernel",
    "memcpy": "kernel",
    "memset": "kernel",
    "h2d_input": "data_loading",
    "communication": "communication",
    "runtime": "host",
    "data_loading": "data_loading",
    "cpu_exec": "host",
    "idle": "host",
}
CPU_CATEGORY_LAYER: dict[str, str] = {
    "data_loading": "data_loading",
    "optimizer": "kernel",
    "backward": "kernel",
    "forward": "kernel",
    "communication": "communication",
    "other": "host",
}

CONFIDENCE_LEVELS: tuple[str, ...] = Confidence.__args__
SEVERITIES: tuple[str, ...] = Severity.__args__
