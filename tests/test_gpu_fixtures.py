"""Real H200 traces (tests/fixtures/gpu): each bottleneck class and its fixed form."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchtriage

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"

# case -> (primary layer, first prescription)
BOTTLENECKS = {
    "data_starved": ("data_loading", "dataloader.num_workers"),
    "pageable_sync": ("data_loading", "dataloader.pin_memory"),
    "launch_bound": ("host", "optimizer.fused"),
    "fp32_compute": ("kernel", "matmul.tf32"),
    "elementwise_chain": ("kernel", "compile.default"),
    "memory_pressure": ("memory", "memory.grad_accumulation"),
}
# case -> the finding that is the bottleneck's primary evidence
EVIDENCE = {
    "data_starved": "data_loading.single_process",
    "pageable_sync": "data_loading.pageable_copies",
    "launch_bound": "host.launch_bound",
    "fp32_compute": "kernel.fp32_matmul",
    "elementwise_chain": "kernel.unfused_elementwise",
    "memory_pressure": "memory.near_capacity",
}


def _diagnose(case: str):
    (d,) = torchtriage.analyze(FIXTURES / f"{case}.pt.trace.json.gz")
    return d


@pytest.mark.parametrize("case", sorted(BOTTLENECKS))
def test_bottleneck_is_classified_with_its_prescription_first(case):
    layer, first_fix = BOTTLENECKS[case]
    d = _diagnose(case)
    assert d.trace.mode == "gpu" and d.trace.devices == ["NVIDIA H200"]
    assert d.trace.steps_analyzed == [3, 4, 5, 6, 7]
    assert d.primary == layer, d.summary
    assert d.prescriptions[0].id == first_fix
    assert EVIDENCE[case] in {f.id for f in d.findings}
    for step in d.breakdown.steps:
        assert sum(step.exposed_ms.values()) == pytest.approx(step.wall_ms, rel=0.01)
    assert d.gpu is not None and d.gpu.top_kernels
    text = torchtriage.render_text(d)
    assert f"Bottleneck: {layer}" in text and "Device time by kernel class" in text


@pytest.mark.parametrize("case", sorted(BOTTLENECKS))
def test_fixed_form_no_longer_shows_the_evidence(case):
    before, after = _diagnose(case), _diagnose(f"{case}_fixed")
    assert EVIDENCE[case] not in {f.id for f in after.findings}
    assert not after.prescriptions or after.prescriptions[0].id != before.prescriptions[0].id
    assert after.breakdown.median_step_ms < before.breakdown.median_step_ms or \
        case == "memory_pressure"  # the memory fix trades time for memory


def test_gpu_evidence_on_fixtures():
    launch = _diagnose("launch_bound").gpu
    assert launch.launches.kernels_per_step > 500 and launch.launches.short_kernel_share > 0.9
    assert launch.launches.graph_kernel_share == 0
    graphs = _diagnose("launch_bound_fixed").gpu
    assert graphs.launches.graph_kernel_share > 0.5  # CUDA graphs replaced launches
    fp32 = {c.cls: c for c in _diagnose("fp32_compute").gpu.kernel_classes}
    assert fp32["gemm"].no_tensor_core_ms > 0.9 * fp32["gemm"].time_ms
    bf16 = {c.cls: c for c in _diagnose("fp32_compute_fixed").gpu.kernel_classes}
    assert bf16["gemm"].tensor_core_ms > 0.9 * bf16["gemm"].time_ms
    pageable = _diagnose("pageable_sync").gpu.transfers
    assert pageable.h2d.pageable == pageable.h2d.count > 0
    assert pageable.syncs_per_step["aten::item"] >= 1
    pinned = _diagnose("pageable_sync_fixed")
    assert pinned.gpu.transfers.h2d.pageable == 0 and "aten::item" not in \
        pinned.gpu.transfers.syncs_per_step
    assert "data_loading.exposed_copy" in {f.id for f in pinned.findings}
    mem = next(m for m in _diagnose("memory_pressure").memory if m.device == "cuda:0")
    assert mem.capacity_source == "deviceProperties" and 0.9 <= mem.peak_fraction < 0.95
    top = _diagnose("fp32_compute").gpu.top_kernels[0]
    assert top.cls == "gemm" and top.launched_by in ("aten::mm", "aten::addmm")
