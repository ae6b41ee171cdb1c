"""Classification rules, prescriptions, vocabulary and the JSON document."""

from __future__ import annotations

import json

import pytest
from conftest import write_trace, x

from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import CATALOG, remedies_for
from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.diagnosis.result import decode_diagnosis
from torchtriage.diagnosis.vocabulary import LAYERS
from torchtriage.trace import load_trace

REQUIRED_IDS = {
    "dataloader.num_workers", "dataloader.pin_memory", "dataloader.prefetch_factor",
    "dataloader.persistent_workers", "h2d.non_blocking", "compile.reduce_overhead",
    "optimizer.fused", "sync.remove", "amp.bf16", "matmul.tf32", "compile.default",
    "compile.max_autotune", "kernel.custom", "ddp.grad_accumulation", "ddp.bucket_cap",
    "ddp.comm_hook", "ddp.static_graph", "memory.grad_accumulation",
    "memory.activation_checkpointing", "memory.bf16", "memory.fsdp",
    "memory.expandable_segments",
}


def test_catalog_covers_required_ids_and_layers():
    ids = [r.id for r in CATALOG]
    assert len(ids) == len(set(ids))
    assert set(ids) >= REQUIRED_IDS
    assert {r.layer for r in CATALOG} <= set(LAYERS)


@pytest.mark.parametrize(("layer", "order"), [
    ("data_loading", ["dataloader.num_workers", "dataloader.pin_memory",
                      "dataloader.prefetch_factor", "dataloader.persistent_workers",
                      "h2d.non_blocking"]),
    ("kernel", ["matmul.tf32", "amp.bf16", "compile.default", "compile.max_autotune",
                "kernel.custom"]),
    ("communication", ["ddp.bucket_cap", "ddp.grad_accumulation", "ddp.comm_hook",
                       "ddp.static_graph"]),
    ("memory", ["memory.expandable_segments", "memory.grad_accumulation",
                "memory.activation_checkpointing", "memory.bf16", "memory.fsdp"]),
])
def test_remedies_in_the_seeds_cost_order(layer, order):
    assert [r.id for r in remedies_for(layer)] == order


def test_every_threshold_names_its_source():
    for t in th.ALL:
        assert t.source and t.meaning and t.unit


def _steps(n: int, body) -> list[dict]:
    events = []
    for i in range(n):
        base = i * 10_000.0
        events.append(x(f"ProfilerStep#{i + 1}", base, 10_000, cat="user_annotation"))
        events += body(base)
    return events


def test_small_ops_make_a_cpu_trace_host_bound(tmp_path):
    def tiny_linear(t0):
        # A wrapper in which no nested op runs 10 µs of its own: all dispatch.
        return [x("aten::linear", t0, 45), x("aten::t", t0 + 1, 8),
                x("aten::addmm", t0 + 10, 34),
                *[x("aten::copy_", t0 + 11 + 8 * k, 8) for k in range(4)]]

    def body(base):
        ops = [e for k in range(150) for e in tiny_linear(base + 5 + k * 48)]
        return [*ops, x("aten::mm", base + 7_300, 2_000)]  # one op that does real work

    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(4, body))))
    assert d.primary == "host"
    assert d.layers["host"].share == pytest.approx(0.8, abs=0.01)
    assert d.prescriptions[0].layer == "host"
    assert any(f.id == "host.small_ops" for f in d.findings)
    # Step time is still attributed to the op categories; the layer view moves it.
    assert d.breakdown.share["forward"] == pytest.approx(0.875, abs=0.01)


def test_compute_bound_cpu_trace(tmp_path):
    def body(base):
        return [x("aten::mm", base + 100, 9_000),
                x("autograd::engine::evaluate_function: MmBackward0", base + 9_150, 700)]
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(4, body))))
    assert d.primary == "kernel" and d.confidence == "high"
    assert [p.id for p in d.prescriptions][:2] == ["amp.bf16", "compile.default"]
    assert "matmul.tf32" not in [p.id for p in d.prescriptions]  # GPU-only fix on a CPU trace


def test_communication_bound_cpu_trace(tmp_path):
    def body(base):
        return [x("aten::mm", base, 3_000),
                x("gloo:all_reduce", base + 3_000, 6_000, cat="user_annotation", tid=7)]
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(3, body))))
    assert d.primary == "communication"
    assert d.prescriptions[0].id == "ddp.bucket_cap"


def test_gpu_host_syncs_and_pageable_copies(tmp_path):
    def body(base):
        return [
            x("aten::item", base + 100, 5_000),
            x("cudaStreamSynchronize", base + 200, 4_800, cat="cuda_runtime"),
            x("Memcpy HtoD (Pageable -> Device)", base + 6_000, 500, cat="gpu_memcpy", pid=0,
              tid=7),
            x("sm90_xmma_gemm_f32", base + 7_000, 2_000, cat="kernel", pid=0, tid=7),
        ]
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(3, body),
                                        deviceProperties=[{"id": 0, "name": "H200",
                                                           "computeMajor": 9}])))
    assert d.primary == "host"
    ids = [p.id for p in d.prescriptions]
    assert ids.index("sync.remove") < ids.index("compile.reduce_overhead")
    assert {"host.syncs", "data_loading.pageable_copies"} <= {f.id for f in d.findings}


def test_dynamic_shapes_are_reported(tmp_path):
    def body_for(i):
        def body(base):
            e = x("aten::addmm", base + 100, 500)
            e["args"] = {"Input Dims": [[64], [8 + i, 32], [32, 64]]}
            f = x("aten::relu", base + 700, 100)
            f["args"] = {"Input Dims": [[8, 64]]}
            return [e, f]
        return body
    events = []
    for i in range(3):
        events += [y for y in _steps(1, body_for(i))]
        for y in events[-3:]:
            y["ts"] += i * 10_000
            if y["name"].startswith("ProfilerStep"):
                y["name"] = f"ProfilerStep#{i + 1}"
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", events)))
    assert [s.op for s in d.dynamic_shapes] == ["aten::addmm"]
    assert d.dynamic_shapes[0].distinct_signatures == 3


def test_json_round_trip(tmp_path):
    events = _steps(3, lambda base: [x("aten::mm", base + 10, 9_000)])
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", events)))
    text = d.to_json()
    assert json.loads(text)["schema"] == "torchtriage.diagnosis/1"
    assert decode_diagnosis(text) == d


def test_saturated_cores_drop_more_workers(tmp_path):
    def body(base):
        return [x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", base, 8_000,
                  cat="user_annotation"), x("aten::mm", base + 8_100, 1_500)]
    trace = load_trace(write_trace(tmp_path / "t.json", _steps(4, body)))
    machine = {"samples": 20, "cores": 2, "cpu_busy_mean": 0.97, "cpu_busy_per_core": [1, 0.94],
               "rss_max_bytes": 1, "child_processes": 2, "children_cpu_cores_mean": 1.8}
    busy = diagnose(trace, machine=machine)
    assert busy.primary == "data_loading" and busy.machine.cpu_busy_mean == 0.97
    assert "data_loading.cpu_saturated" in {f.id for f in busy.findings}
    assert "dataloader.num_workers" not in [p.id for p in busy.prescriptions]
    idle = diagnose(trace, machine={**machine, "cpu_busy_mean": 0.4})
    assert idle.prescriptions[0].id == "dataloader.num_workers"


def test_scalar_reads_of_cpu_tensors_are_host_work_not_syncs(tmp_path):
    """nanoGPT's get_batch: 0-d CPU tensors index a memmap, many aten::item per step, none of
    which waits for the device; one loss.item() per step does (its copy and synchronize run
    inside it)."""
    def body(base):
        reads = [x("aten::item", base + 100 + 40 * i, 30) for i in range(64)]
        return [
            *reads,
            x("aten::item", base + 3_000, 5_000),  # loss.item(): waits for the device
            x("cudaMemcpyAsync", base + 3_100, 50, cat="cuda_runtime"),
            x("cudaStreamSynchronize", base + 3_200, 4_700, cat="cuda_runtime"),
            x("sm90_xmma_gemm_f32", base + 3_000, 4_800, cat="kernel", pid=0, tid=7),
        ]
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(3, body),
                                        deviceProperties=[{"id": 0, "name": "H200",
                                                           "computeMajor": 9}])))
    transfers = d.gpu.transfers
    assert transfers.syncs_per_step == {"cudaStreamSynchronize": 1.0, "aten::item": 1.0}
    assert transfers.cpu_scalar_reads_per_step == 64
    assert "host.cpu_scalar_reads" in {f.id for f in d.findings}
    syncs = next(f for f in d.findings if f.id == "host.syncs")
    assert "aten::item 1" in syncs.message and "64" not in syncs.message


def test_out_of_memory_without_a_trace_reads_the_error():
    from torchtriage.diagnosis.diagnose import diagnose_out_of_memory
    from torchtriage.diagnosis.oom import parse_oom_message
    from torchtriage.diagnosis.result import OutOfMemory

    message = ("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 3 has a total capacity of "
               "79.10 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this "
               "process has 78.80 GiB memory in use. Of the allocated memory 40.00 GiB is "
               "allocated by PyTorch, and 30.00 GiB is reserved by PyTorch but unallocated.")
    figures = parse_oom_message(message)
    assert figures == {"requested_bytes": 512 * 2**20, "capacity_bytes": int(79.10 * 2**30),
                       "free_bytes": 300 * 2**20, "allocated_bytes": 40 * 2**30,
                       "reserved_unallocated_bytes": 30 * 2**30, "device": "cuda:3"}
    # a process capped by set_per_process_memory_fraction had the allowed share, not the card
    capped = message.replace("memory in use. ", "memory in use. 24.00 GiB allowed; ")
    assert parse_oom_message(capped)["capacity_bytes"] == 24 * 2**30
    d = diagnose_out_of_memory(OutOfMemory(message=message, step=2, **figures))
    assert d.primary == "memory" and d.trace.mode == "gpu" and d.trace.events == 0
    # 30 of 70 GiB reserved sat idle: fragmentation, so expandable segments comes first
    assert [p.id for p in d.prescriptions][:2] == ["memory.expandable_segments",
                                                   "memory.grad_accumulation"]
    assert {"memory.oom", "memory.fragmentation"} <= {f.id for f in d.findings}
    assert "on step 2" in d.summary
    # a CPU job's own error carries no figures: still memory, no GPU-only prescription
    cpu = diagnose_out_of_memory(OutOfMemory(message="DefaultCPUAllocator: can't allocate "
                                             "memory", step=1), device_memory=2**30)
    assert cpu.primary == "memory" and cpu.trace.mode == "cpu"
    assert "memory.expandable_segments" not in [p.id for p in cpu.prescriptions]
