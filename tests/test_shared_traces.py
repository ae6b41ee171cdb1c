"""Real traces from HTA's and Kineto's public test data (../shared/traces; skipped if absent)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_TRACES

from torchtriage.analysis.breakdown import step_breakdown
from torchtriage.analysis.steps import find_steps
from torchtriage.api import analyze, render_text
from torchtriage.errors import TraceError
from torchtriage.trace import load_trace

# Files under shared/traces that are not Kineto traces, and what they are.
NOT_KINETO = {
    "benchmark_simple_add_et.json.gz": "execution trace",
    "memory_timeline.raw.gz": "top level is not a JSON object",
}


def _all_files() -> list[Path]:
    if not SHARED_TRACES.is_dir():
        return []
    return sorted(p for p in SHARED_TRACES.rglob("*") if p.is_file() and p.suffix != ".md")


@pytest.mark.parametrize("path", _all_files(), ids=lambda p: str(p.relative_to(SHARED_TRACES)))
def test_every_shared_trace_loads_and_is_diagnosed(path):
    if path.name in NOT_KINETO:
        with pytest.raises(TraceError, match=NOT_KINETO[path.name]):
            load_trace(path)
        return
    (d,) = analyze(path)
    assert d.primary in d.layers
    # The categories of every step sum to its wall time (exactly, up to float rounding).
    for step in d.breakdown.steps:
        assert sum(step.exposed_ms.values()) == pytest.approx(step.wall_ms, rel=0.01, abs=0.002)
    assert abs(sum(v.share for k, v in d.layers.items() if k != "memory") - 1) < 0.01


def _step_durations_from_json(path: Path) -> dict[int, float]:
    """ProfilerStep#N durations read straight from the JSON (host copies only), µs."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    out = {}
    for e in doc["traceEvents"]:
        name = e.get("name", "")
        if name.startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation":
            out[int(name.split("#")[1])] = float(e["dur"])
    return out


def test_step_wall_matches_profiler_step_annotations(shared_traces):
    path = next((shared_traces / "kineto" / "resnet50_num_workers_0").glob("*.json.gz"))
    trace = load_trace(path)
    b = step_breakdown(trace, find_steps(trace))
    expected = _step_durations_from_json(path)
    for n, wall, row in zip(b.step_numbers, b.wall_us, b.exposed_us, strict=True):
        assert wall == pytest.approx(expected[int(n)])
        assert row.sum() == pytest.approx(wall, rel=0.01)


def test_resnet50_pair_data_loading(shared_traces):
    (w0,) = analyze(shared_traces / "kineto" / "resnet50_num_workers_0")
    (w4,) = analyze(shared_traces / "kineto" / "resnet50_num_workers_4")
    assert w0.primary == "data_loading"
    assert w0.prescriptions[0].id == "dataloader.num_workers"
    assert w0.layers["data_loading"].share > 0.25
    assert w4.layers["data_loading"].share < w0.layers["data_loading"].share / 5
    assert w4.breakdown.median_step_ms < w0.breakdown.median_step_ms
    assert any(f.id == "data_loading.single_process" for f in w0.findings)


def test_nccl_trace_communication_kernels(shared_traces):
    (d,) = analyze(shared_traces / "hta" / "nccl_parser_config" / "nccl_data.json.gz")
    assert d.trace.mode == "gpu" and d.trace.rank == 0 and d.trace.world_size == 2
    assert d.breakdown.exposed_ms["communication"] > 0
    assert d.trace.steps_analyzed == [2, 3, 4] or len(d.trace.steps_analyzed) == 3


def test_trace_without_steps_falls_back_and_says_so(shared_traces):
    (d,) = analyze(shared_traces / "hta" / "critical_path" / "alexnet")
    assert d.trace.step_source == "window"
    assert any(f.id == "steps.no_profiler_steps" for f in d.findings)
    assert d.confidence != "high"


def test_memory_events_and_device_capacity(shared_traces):
    (d,) = analyze(shared_traces / "hta" / "df_index_resolver")
    cuda = [m for m in d.memory if m.device.startswith("cuda")]
    assert cuda and cuda[0].capacity_source == "deviceProperties"
    assert 0 < cuda[0].peak_fraction < 1
    (tight,) = analyze(shared_traces / "hta" / "df_index_resolver",
                       device_memory=cuda[0].peak_allocated_bytes)
    assert tight.primary == "memory"
    # Fragmented cache (reserved >> allocated): the cheapest rung comes first, then the ladder.
    assert [p.id for p in tight.prescriptions[:5]] == [
        "memory.expandable_segments", "memory.grad_accumulation",
        "memory.activation_checkpointing", "memory.bf16", "memory.fsdp"]
    assert {f.id for f in tight.findings} >= {"memory.near_capacity", "memory.fragmentation"}
    cpu = [m for m in tight.memory if m.device == "cpu"]
    assert cpu and cpu[0].capacity_bytes is None  # --device-memory is the GPU's here


def test_legacy_categories_trace(shared_traces):
    trace = load_trace(shared_traces / "hta" / "trace_file_list" / "inference_rank_1.json.gz")
    assert trace.has_device_activity
    assert np.isfinite(trace.events.ts).all()


@pytest.mark.parametrize(("rel", "lacks"), [
    ("hta/mtia_trace_single_rank", "non-GPU accelerator (MTIA)"),
    ("hta/cupti_profiler", "CUPTI counter mode"),
    ("hta/cpu_only", "CPU-only trace"),
    ("hta/rank_non_gpu", "CPU-only trace"),
])
def test_traces_without_gpu_kernels_say_what_they_lack(shared_traces, rel, lacks):
    (d,) = analyze(shared_traces / rel)
    assert d.gpu is None
    assert any(lacks in m for m in d.missing), d.missing
    if "CPU-only" not in lacks:
        assert d.confidence == "low"  # a device job judged from its host side
    assert render_text(d)


def test_amd_trace_gets_gpu_analyses(shared_traces):
    (d,) = analyze(shared_traces / "hta" / "amd_trace")
    assert d.gpu is not None and d.trace.devices
    gemm = next(c for c in d.gpu.kernel_classes if c.cls == "gemm")
    assert gemm.count == 2 and gemm.tensor_core_ms > 0  # Cijk_* ... MI16x16x1: matrix cores
    assert d.gpu.launches.launch_cost_us_median is not None  # hipLaunchKernel linked
