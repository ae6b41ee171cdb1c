"""Each CPU example, profiled with the real torch.profiler, gets its injected layer."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest

import torchtriage
from torchtriage.capture.machine import cpu_bf16_flags
from torchtriage.demo import load_example

EXPECTED = {
    "data_starved": ("data_loading", "dataloader.num_workers"),
    # bf16 autocast first only on a CPU with native bf16 (AMX, AVX512-BF16)
    "compute_bound": ("kernel", "amp.bf16" if cpu_bf16_flags() else "compile.default"),
    "launch_bound": ("host", "optimizer.fused"),
    "memory_pressure": ("memory", "memory.grad_accumulation"),
}
STEPS = 8  # wait 1 + warm-up 2 + active 5; the 8th step() saves the trace


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def profiled(request, tmp_path_factory):
    name = request.param
    module = load_example(name)
    options = {"device_memory": module.DEVICE_MEMORY} if hasattr(module, "DEVICE_MEMORY") else {}
    with torchtriage.profile(tmp_path_factory.mktemp(name), **options) as prof:
        losses = module.train(STEPS, on_step=prof.step)
    return name, prof, losses


def test_example_is_classified_with_its_injected_layer(profiled):
    name, prof, losses = profiled
    layer, first_fix = EXPECTED[name]
    d = prof.diagnosis
    assert len(losses) == STEPS
    assert d.primary == layer, d.summary
    assert d.prescriptions[0].id == first_fix
    assert d.confidence in ("medium", "high")
    assert d.trace.steps_analyzed == [3, 4, 5, 6, 7]
    assert f"Bottleneck: {layer}" in torchtriage.render_text(d)


def test_breakdown_sums_to_step_wall_time(profiled):
    _, prof, _ = profiled
    d = prof.diagnosis
    doc = json.loads(gzip.decompress(prof.trace_path.read_bytes()))
    marker = {int(e["name"].split("#")[1]): e["dur"] / 1e3 for e in doc["traceEvents"]
              if e.get("name", "").startswith("ProfilerStep#")}
    for step in d.breakdown.steps:
        assert step.wall_ms == pytest.approx(marker[step.step], rel=1e-3)
        assert sum(step.exposed_ms.values()) == pytest.approx(step.wall_ms, rel=0.01)
    total = sum(v.time_ms for k, v in d.layers.items() if k != "memory")
    assert total == pytest.approx(d.breakdown.wall_ms, rel=0.01)


def test_top_ops_table_like_key_averages(profiled):
    name, prof, _ = profiled
    host = prof.diagnosis.top_ops["host"]
    assert host and all(a.self_ms >= b.self_ms for a, b in itertools.pairwise(host))
    assert all(r.self_ms <= r.total_ms + 1e-6 for r in host)
    if name == "compute_bound":
        assert host[0].name in ("aten::addmm", "aten::mm")


@pytest.mark.parametrize("name", ["pageable_sync", "elementwise_chain"])
def test_gpu_examples_also_run_on_cpu(name):
    """Their bottlenecks need a GPU (tests/fixtures/gpu); on CPU they must still train."""
    losses = load_example(name).train(2)
    assert len(losses) == 2 and all(loss == loss for loss in losses)  # no NaN
