"""Real H200 traces of the examples (tests/fixtures/gpu): GPU categories and verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchtriage

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
EXPECTED = {
    "data_starved": ("data_loading", "dataloader.num_workers", {}),
    "compute_bound": ("kernel", "matmul.tf32", {}),
    "launch_bound": ("host", "optimizer.fused", {}),
    "memory_pressure": ("memory", "memory.expandable_segments", {"device_memory": "267MiB"}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gpu_fixture_verdict(name):
    layer, first_fix, options = EXPECTED[name]
    (d,) = torchtriage.analyze(FIXTURES / f"{name}.cuda.pt.trace.json.gz", **options)
    assert d.trace.mode == "gpu" and d.trace.devices == ["NVIDIA H200"]
    assert d.trace.steps_analyzed == [3, 4, 5, 6, 7]
    assert d.primary == layer and d.prescriptions[0].id == first_fix
    for step in d.breakdown.steps:
        assert sum(step.exposed_ms.values()) == pytest.approx(step.wall_ms, rel=0.01)
    assert d.top_ops["device"], "kernels are listed"
    cuda = [m for m in d.memory if m.device.startswith("cuda")]
    assert cuda and cuda[0].peak_allocated_bytes > 0


def test_gpu_memory_capacity_from_device_properties():
    (d,) = torchtriage.analyze(FIXTURES / "memory_pressure.cuda.pt.trace.json.gz")
    cuda = next(m for m in d.memory if m.device.startswith("cuda"))
    assert cuda.capacity_source == "deviceProperties" and cuda.capacity_bytes > 100 * 2**30
    assert d.primary != "memory"  # a few hundred MiB on a 140 GiB card is no pressure
