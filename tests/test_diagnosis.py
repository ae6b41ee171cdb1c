"""Classification rules, prescriptions, vocabulary and the JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from conftest import profiler_steps as _steps
from conftest import write_trace, x

from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import CATALOG, remedies_for
from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.diagnosis.result import decode_diagnosis
from torchtriage.diagnosis.vocabulary import LAYERS
from torchtriage.trace import load_trace

FIXTURES_GPU = Path(__file__).parent / "fixtures" / "gpu"

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
    # DDP's and FSDP's levers interleave by cost; a job gets one family (the other withheld)
    ("communication", ["ddp.bucket_cap", "fsdp.reshard_after_forward", "ddp.grad_accumulation",
                       "ddp.comm_hook", "ddp.static_graph", "fsdp.mixed_precision",
                       "fsdp.prefetch", "fsdp.wrap_granularity"]),
    ("memory", ["memory.expandable_segments", "memory.fix_leak", "memory.grad_accumulation",
                "memory.activation_checkpointing", "memory.bf16", "memory.fsdp"]),
])
def test_remedies_in_the_seeds_cost_order(layer, order):
    assert [r.id for r in remedies_for(layer)] == order


def test_every_threshold_names_its_source():
    for t in th.ALL:
        assert t.source and t.meaning and t.unit


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
    # on CPU, compiling is fusion: no CUDA graphs in its title or code
    (compile_,) = [p for p in d.prescriptions if p.id == "compile.reduce_overhead"]
    assert compile_.code.startswith("model = torch.compile(model)  #")
    assert "CUDA graphs" not in compile_.title
    # Step time is still attributed to the op categories; the layer view moves it.
    assert d.breakdown.share["forward"] == pytest.approx(0.875, abs=0.01)


def test_compute_bound_cpu_trace(tmp_path):
    def body(base):
        return [x("aten::mm", base + 100, 9_000),
                x("autograd::engine::evaluate_function: MmBackward0", base + 9_150, 700)]
    trace = load_trace(write_trace(tmp_path / "t.json", _steps(4, body)))
    d = diagnose(trace, machine={**_MACHINE, "cpu_bf16": ["amx_bf16", "avx512_bf16"]})
    assert d.primary == "kernel" and d.confidence == "high"
    assert [p.id for p in d.prescriptions][:2] == ["amp.bf16", "compile.default"]
    assert "matmul.tf32" not in [p.id for p in d.prescriptions]  # GPU-only fix on a CPU trace
    # the snippet names the trace's device and wraps the forward and the loss together
    assert 'device_type="cpu"' in d.prescriptions[0].code
    assert "loss_fn(model(x), y)" in d.prescriptions[0].code


def test_bf16_on_a_cpu_only_with_native_bf16(tmp_path):
    """nanoGPT on an AVX2 CPU: fix measured bf16 autocast at 0.04x. Without AMX/AVX512-BF16
    (or with the CPU unknown) it is withheld, with the gate's evidence, and compile comes
    first."""
    def body(base):
        return [x("aten::mm", base + 100, 9_000)]
    trace = load_trace(write_trace(tmp_path / "t.json", _steps(4, body)))
    for machine in ({**_MACHINE, "cpu_bf16": [], "cpu_capability": "AVX2"}, None):
        d = diagnose(trace, machine=machine)
        ids = [p.id for p in d.prescriptions]
        assert "amp.bf16" not in ids and ids[0] == "compile.default"
        (held,) = [w for w in d.withheld if w.id == "amp.bf16"]
        assert held.evidence[0].metric == "cpu_fast_bf16"
        assert held.evidence[0].threshold == th.CPU_FAST_BF16.value
        assert held.evidence[0].source == th.CPU_FAST_BF16.source
        assert ("AVX2" in held.reason) if machine else ("not recorded" in held.reason)


def test_bf16_is_withheld_for_float64_work(tmp_path):
    """LBFGS (time_sequence_prediction): 90 % of the step in float64 aten::dot; autocast leaves
    float64 alone, so bf16 is withheld even on a CPU with AMX."""
    def body(base):
        dot = x("aten::dot", base + 100, 9_000)
        dot["args"] = {"Input Dims": [[4096], [4096]], "Input type": ["double", "double"]}
        mm = x("aten::mm", base + 9_200, 700)
        mm["args"] = {"Input Dims": [[8, 8], [8, 8]], "Input type": ["float", "float"]}
        return [dot, mm]
    trace = load_trace(write_trace(tmp_path / "t.json", _steps(4, body)))
    d = diagnose(trace, machine={**_MACHINE, "cpu_bf16": ["amx_bf16"]})
    assert d.primary == "kernel"
    assert "amp.bf16" not in [p.id for p in d.prescriptions]
    (held,) = [w for w in d.withheld if w.id == "amp.bf16"]
    assert "float64" in held.reason
    ev = next(e for e in d.layers["kernel"].evidence if e.metric == "float64_share")
    assert ev.value == pytest.approx(9_000 / 9_700, abs=0.01) and ev.fired
    assert ev.threshold == th.FLOAT64_SHARE.value


def test_a_python_number_is_not_float64_work(tmp_path):
    """`x.mul_(0.5)` records its scalar as a 0-dim "double" input: the op runs in float32
    (Lightning and HF traces showed float64 shares of 22 % and 11 % from such ops)."""
    def body(base):
        mul = x("aten::mul_", base + 100, 9_000)
        mul["args"] = {"Input Dims": [[256, 512], []], "Input type": ["float", "double"]}
        return [mul]
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(4, body))),
                 machine={**_MACHINE, "cpu_bf16": ["amx_bf16"]})
    ev = next(e for e in d.layers["kernel"].evidence if e.metric == "float64_share")
    assert ev.value == 0 and not ev.fired


def test_communication_bound_cpu_trace(tmp_path):
    def body(base):
        return [x("aten::mm", base, 3_000),
                *[x("gloo:all_reduce", base + 3_000 + 1_500 * k, 1_500, cat="user_annotation",
                    tid=7) for k in range(4)]]
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(3, body))))
    assert d.primary == "communication"
    assert d.prescriptions[0].id == "ddp.bucket_cap"
    assert "4 all-reduce buckets per step" in d.prescriptions[0].reason


def test_bucket_size_only_when_gradients_span_several_buckets(tmp_path):
    """The DDP tutorial: one 0.0 MB all-reduce per step. A larger bucket_cap_mb merges
    nothing; accumulation (fewer all-reduces) comes first and the bucket size is withheld."""
    def body(base):
        return [x("aten::mm", base, 3_000),
                x("gloo:all_reduce", base + 3_000, 6_000, cat="user_annotation", tid=7)]
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(3, body))))
    assert d.primary == "communication"
    ids = [p.id for p in d.prescriptions]
    assert "ddp.bucket_cap" not in ids and ids[0] == "ddp.grad_accumulation"
    (held,) = [w for w in d.withheld if w.id == "ddp.bucket_cap"]
    assert "1 all-reduce per step" in held.reason
    assert held.evidence[0].threshold == th.DDP_BUCKETS_PER_STEP.value
    assert held.evidence[0].fired is False


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
    assert 'mode="reduce-overhead"' in d.prescriptions[ids.index("compile.reduce_overhead")].code
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


def _logging_loop(tmp_path, batch_of_step):
    """A Trainer-like loop under torchtriage.profile (the real profiler, record_shapes): the
    loss is a mean over the batch; every fifth step logs the running loss (a mean of a 0-d
    tensor, .item(), a reset), as the Hugging Face Trainer does every logging_steps."""
    import torch

    import torchtriage

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tr_loss = torch.zeros(())
    with torchtriage.profile(tmp_path / f"run{batch_of_step(3)}", wait=0, warmup=1,
                             active=6) as prof:
        for step in range(8):
            n = batch_of_step(step)
            x, y = torch.randn(n, 16), torch.randn(n, 1)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            tr_loss = tr_loss + loss.detach()
            if step % 5 == 4:  # logging_steps=5
                logged = (tr_loss.mean() / 5).item()
                tr_loss -= tr_loss
                assert logged >= 0
            prof.step()
    return prof.diagnosis


def test_a_logging_step_is_not_a_dynamic_shape(tmp_path):
    """HF Trainer, logging_steps=5: every other shape identical, yet the logging step's 0-d
    ops (a mean of the running loss) made aten::mean look dynamic."""
    d = _logging_loop(tmp_path, lambda step: 32)
    assert 5 in d.trace.steps_analyzed and len(d.trace.steps_analyzed) >= 5
    assert d.dynamic_shapes == [] and "shapes.dynamic" not in {f.id for f in d.findings}
    # a batch that does change shape is still reported
    changing = _logging_loop(tmp_path, lambda step: 32 if step != 3 else 7)
    assert "aten::addmm" in [s.op for s in changing.dynamic_shapes]


def test_json_round_trip(tmp_path):
    events = _steps(3, lambda base: [x("aten::mm", base + 10, 9_000)])
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", events)))
    text = d.to_json()
    assert json.loads(text)["schema"] == "torchtriage.diagnosis/1"
    assert decode_diagnosis(text) == d


_MACHINE = {"samples": 20, "cores": 2, "cpu_busy_mean": 0.4, "cpu_busy_per_core": [0.4, 0.4],
            "rss_max_bytes": 1, "child_processes": 2, "children_cpu_cores_mean": 0.5,
            "job_cpu_cores_mean": 0.68, "job_processes": 3, "cores_available": 2.0,
            "cores_available_source": "affinity"}


def _loader_trace(tmp_path):
    def body(base):
        return [x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", base, 8_000,
                  cat="user_annotation"), x("aten::mm", base + 8_100, 1_500)]
    return load_trace(write_trace(tmp_path / "t.json", _steps(4, body)))


def test_saturated_cores_drop_more_workers(tmp_path):
    trace = _loader_trace(tmp_path)
    machine = {**_MACHINE, "cpu_busy_mean": 0.97, "job_cpu_cores_mean": 1.9}
    busy = diagnose(trace, machine=machine)
    assert busy.primary == "data_loading" and busy.machine.job_cpu_cores_mean == 1.9
    assert "data_loading.cpu_saturated" in {f.id for f in busy.findings}
    assert "dataloader.num_workers" not in [p.id for p in busy.prescriptions]
    # the report says why the primary layer's own fix is not there
    (held,) = [w for w in busy.withheld if w.id == "dataloader.num_workers"]
    assert "1.90 of the 2 cores" in held.reason and held.evidence[0].fired
    assert held.evidence[0].threshold == th.CPU_SATURATED.value
    assert "Not prescribed for data_loading: dataloader.num_workers" in busy.summary
    idle = diagnose(trace, machine={**machine, "job_cpu_cores_mean": 0.8})
    assert idle.prescriptions[0].id == "dataloader.num_workers"


def test_other_processes_busy_on_the_machine_do_not_saturate_the_job(tmp_path):
    """Issue 18 item 10: other work kept the machine 97 % busy while the script used 0.68 of
    its 2 cores; fix called it cpu_saturated and said "First fix: amp.bf16" for a
    data-loading bottleneck. The job's own processes decide."""
    d = diagnose(_loader_trace(tmp_path), machine={**_MACHINE, "cpu_busy_mean": 0.97})
    assert d.primary == "data_loading"
    assert "data_loading.cpu_saturated" not in {f.id for f in d.findings}
    assert d.prescriptions[0].id == "dataloader.num_workers" and not d.withheld
    ev = {e.metric: e for e in d.layers["data_loading"].evidence}
    assert ev["job_cpu_busy"].value == 0.34 and ev["job_cpu_busy"].fired is False
    assert ev["machine_cpu_busy_mean"].value == 0.97
    # a quota of 0.75 cores (cgroup) makes the same use saturation
    quota = diagnose(_loader_trace(tmp_path), machine={
        **_MACHINE, "cores_available": 0.75, "cores_available_source": "cgroup cpu.max"})
    assert "data_loading.cpu_saturated" in {f.id for f in quota.findings}


def test_the_terminal_report_shows_the_machine_and_what_was_withheld(tmp_path):
    from torchtriage.report.render import render_text

    machine = {**_MACHINE, "cpu_busy_mean": 0.97, "job_cpu_cores_mean": 1.9,
               "cpu_capability": "AVX2", "cpu_bf16": []}
    text = render_text(diagnose(_loader_trace(tmp_path), machine=machine), width=100)
    flat = " ".join(text.split())
    assert "Machine (sampled while the script ran, 20 samples)" in flat
    assert "used 1.90 of the 2 cores it may use (affinity), 95%" in flat
    assert "all 2 cores of the machine 97% busy" in flat
    assert "native bf16: none" in flat
    assert "Withheld: the evidence says these would not help here" in flat
    assert "dataloader.num_workers [data_loading] the job's processes already use" in flat
    assert "job_cpu_busy=0.95 >= 0.9" in flat


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
    assert "1 in aten::item (a scalar read" in syncs.message and "64" not in syncs.message


def _sync_kinds_body(base: float) -> list[dict]:
    """One step that syncs five ways: an input copy from pageable memory, loss.item(),
    x[mask], torch.cuda.synchronize() and ``if torch.isnan(loss):``."""
    c = int(base // 10)  # correlation ids unique per step
    return [
        x("aten::to", base + 100, 900), x("aten::_to_copy", base + 110, 880),
        x("aten::copy_", base + 120, 860),
        x("cudaMemcpyAsync", base + 130, 20, cat="cuda_runtime", correlation=c + 1),
        x("cudaStreamSynchronize", base + 200, 700, cat="cuda_runtime"),
        x("Memcpy HtoD (Pageable -> Device)", base + 150, 600, cat="gpu_memcpy", pid=0,
          tid=7, correlation=c + 1),
        x("aten::item", base + 3_000, 900), x("aten::_local_scalar_dense", base + 3_010, 880),
        x("cudaMemcpyAsync", base + 3_020, 30, cat="cuda_runtime", correlation=c + 2),
        x("cudaStreamSynchronize", base + 3_060, 800, cat="cuda_runtime"),
        x("Memcpy DtoH (Device -> Pageable)", base + 3_800, 10, cat="gpu_memcpy", pid=0,
          tid=7, correlation=c + 2),
        x("aten::index", base + 5_000, 500), x("aten::nonzero", base + 5_010, 480),
        x("cudaStreamSynchronize", base + 5_100, 300, cat="cuda_runtime"),
        x("cudaDeviceSynchronize", base + 7_000, 500, cat="cuda_runtime"),
        x("aten::is_nonzero", base + 8_000, 400),
        x("aten::_local_scalar_dense", base + 8_010, 380),
        x("cudaStreamSynchronize", base + 8_100, 200, cat="cuda_runtime"),
        x("aten::item", base + 8_500, 300, tid=5),  # a logging thread's: the loop runs on
        x("cudaStreamSynchronize", base + 8_550, 200, cat="cuda_runtime", tid=5),
        x("sm90_xmma_gemm_f32", base + 1_000, 1_500, cat="kernel", pid=0, tid=7),
    ]


_H200 = {"deviceProperties": [{"id": 0, "name": "H200", "computeMajor": 9}]}


def test_syncs_are_named_by_what_the_code_asked_for(tmp_path):
    """Each sync is placed in the op that waited and named by its outermost operator: the
    input copy (from pageable memory: pinned memory and non_blocking remove it), the scalar
    read, the data-dependent shape, the bare synchronize and the tensor in an if are five
    different fixes; a sync on another thread (a logger's) does not stop the loop. The
    exposed input copy makes loading significant: pinned memory and non-blocking copies are
    prescribed there, and sync.remove counts the other four, with the code for the kind found
    most (here each once: the first of SYNC_KINDS, the data-dependent shape)."""
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(3, _sync_kinds_body),
                                        **_H200)))
    sites = {(s.kind, s.op, s.waits_in, s.per_step) for s in d.gpu.transfers.sync_sources}
    assert sites == {("copy_to_device", "aten::to", "aten::copy_", 1.0),
                     ("scalar_read", "aten::item", "aten::_local_scalar_dense", 1.0),
                     ("data_dependent", "aten::index", "aten::nonzero", 1.0),
                     ("outside_ops", "", "", 1.0),
                     ("condition", "aten::is_nonzero", "aten::_local_scalar_dense", 1.0)}
    syncs = next(f for f in d.findings if f.id == "host.syncs")
    assert syncs.message.startswith("5 host-device syncs per step: ")
    assert "1 in aten::is_nonzero (a tensor taken as a Python bool" in syncs.message
    assert "1 in aten::to (a copy to the device that waits for it" in syncs.message
    assert "1 in no op (outside any op: torch.cuda.synchronize()" in syncs.message
    assert d.primary == "host"
    (remedy,) = [p for p in d.prescriptions if p.id == "sync.remove"]
    assert remedy.reason.startswith("4 syncs per step: ") and "aten::to" not in remedy.reason
    (pin,) = [p for p in d.prescriptions if p.id == "dataloader.pin_memory"]
    assert pin.code.startswith("x = x.pin_memory()")  # no DataLoader: the script's batches
    assert remedy.code.startswith("x = torch.where(mask, x, 0)")
    assert "h2d.non_blocking" in [p.id for p in d.prescriptions]


def test_input_copy_syncs_are_left_to_the_loader_fixes_when_loading_is_significant(tmp_path):
    """With significant loading, the data-loading rule prescribes pinned memory and
    non-blocking copies; sync.remove then counts only the other syncs."""
    def copies_only(base):
        c = int(base // 10)
        return [
            x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base + 6_000,
              2_500, cat="user_annotation"),
            x("aten::to", base + 100, 900), x("aten::copy_", base + 120, 860),
            x("cudaMemcpyAsync", base + 130, 20, cat="cuda_runtime", correlation=c + 1),
            x("cudaStreamSynchronize", base + 200, 700, cat="cuda_runtime"),
            x("Memcpy HtoD (Pageable -> Device)", base + 150, 600, cat="gpu_memcpy", pid=0,
              tid=7, correlation=c + 1),
            x("sm90_xmma_gemm_f32", base + 1_000, 4_000, cat="kernel", pid=0, tid=7),
        ]

    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(3, copies_only), **_H200)))
    assert [(s.kind, s.per_step) for s in d.gpu.transfers.sync_sources] == [
        ("copy_to_device", 1.0)]
    ids = [p.id for p in d.prescriptions]
    assert "h2d.non_blocking" in ids and "sync.remove" not in ids
    (pin,) = [p for p in d.prescriptions if p.id == "dataloader.pin_memory"]
    assert pin.code.startswith("DataLoader(")  # the trace has a DataLoader
    (held,) = [w for w in d.withheld if w.id == "sync.remove"]
    assert "copies to the device" in held.reason and "h2d.non_blocking" in held.reason


def test_a_real_traces_input_copy_syncs_get_pinned_memory_not_item(shared_traces):
    """Kineto's resnet50 example: two syncs a step, both in ``aten::to`` of a pageable batch.
    The prescription was the catalog's ``.item()`` advice."""
    trace = next((shared_traces / "kineto" / "resnet50_num_workers_4").glob("*.json.gz"))
    d = diagnose(load_trace(trace))
    assert [(s.kind, s.op, s.per_step) for s in d.gpu.transfers.sync_sources] == [
        ("copy_to_device", "aten::to", 2.0)]
    (remedy,) = [p for p in d.prescriptions if p.id == "sync.remove"]
    assert "pin_memory=True" in remedy.code and "non_blocking=True" in remedy.code
    assert ".item()" not in remedy.code and "2 in aten::to" in remedy.reason


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


def test_a_busy_machine_is_said_and_lowers_the_confidence(tmp_path):
    """HF Trainer on a 2-core machine where another session held ~1 core: the run printed
    "used 1.01 of the 2 cores ... 99% busy (other processes included)" and said confidence
    high. The diagnosis now warns and lowers the confidence one level; a quiet machine does
    not."""
    trace = load_trace(write_trace(tmp_path / "t.json", _steps(4, lambda base: [
        x("aten::mm", base + 100, 9_500)])))
    busy = {**_MACHINE, "samples": 20, "cores": 2, "cpu_busy_mean": 0.99,
            "job_cpu_cores_mean": 1.01, "cores_available": 2.0}
    quiet = {**busy, "cpu_busy_mean": 0.52}
    calm, loaded = diagnose(trace, machine=quiet), diagnose(trace, machine=busy)
    assert "machine.contended" not in {f.id for f in calm.findings}
    (finding,) = [f for f in loaded.findings if f.id == "machine.contended"]
    assert "Other processes used 0.97 of the 2 cores" in finding.message
    assert finding.evidence[0].threshold == th.MACHINE_CONTENDED.value
    levels = ["low", "medium", "high"]
    assert levels.index(loaded.confidence) == levels.index(calm.confidence) - 1


def _check(profiled_ms: float, unprofiled_ms: float):
    from torchtriage.diagnosis.result import WindowCheck

    return WindowCheck(first_step=3, last_step=7, skipped_steps=0, skip_reason="the first step",
                       profiled_mean_ms=profiled_ms, after_mean_ms=unprofiled_ms, after_steps=5,
                       representative=True)


def test_the_profilers_own_host_time_is_taken_out_before_the_layers_are_compared():
    """A real H200 trace (launch-bound): the window check's unprofiled steps tell what the
    profiler added; within profiler_inflation nothing changes, past it the host layer loses
    sum(wall) - steps x unprofiled, the shares are of the unprofiled step and sum to 1, and
    the finding carries the ratio against its threshold."""
    trace = load_trace(FIXTURES_GPU / "launch_bound.pt.trace.json.gz")
    plain = diagnose(trace)
    walls = [s.wall_ms for s in plain.breakdown.steps]
    profiled = sum(walls) / len(walls)
    within = diagnose(trace, windows=[_check(profiled, profiled / 1.2)])
    assert within.layers == plain.layers
    assert "steps.profiler_overhead" not in {f.id for f in within.findings}

    d = diagnose(trace, windows=[_check(profiled, profiled / 2)])
    (f,) = [f for f in d.findings if f.id == "steps.profiler_overhead"]
    assert f.evidence[0].value == pytest.approx(2.0, rel=0.01)
    assert f.evidence[0].threshold == 1.25
    removed = plain.layers["host"].time_ms - d.layers["host"].time_ms
    assert removed == pytest.approx(sum(walls) / 2, rel=0.01)
    assert d.layers["kernel"].time_ms == plain.layers["kernel"].time_ms
    assert d.layers["kernel"].share == pytest.approx(2 * plain.layers["kernel"].share, rel=0.02)
    assert sum(v.share for v in d.layers.values()) == pytest.approx(1.0, abs=0.001)
    assert d.primary == "host"  # launch-bound still: the host is slow unwatched too
    assert d.gpu.utilization == plain.gpu.utilization  # the trace's own figures stand

    # a host that is slow only when watched: the unprofiled step is the kernels' time
    kernel_ms = plain.layers["kernel"].time_ms / len(walls)
    watched = diagnose(trace, windows=[_check(profiled, kernel_ms)])
    assert watched.primary == "kernel" and watched.layers["host"].share < 0.05, watched.summary


def test_an_outlier_step_is_not_taken_for_the_profilers_overhead(monkeypatch):
    """One step far longer than the window's median (an epoch boundary) is not the
    profiler's cost: it is left out of the estimate and keeps its time."""
    trace = load_trace(FIXTURES_GPU / "launch_bound.pt.trace.json.gz")
    plain = diagnose(trace)
    walls = [s.wall_ms for s in plain.breakdown.steps]
    median = sorted(walls)[len(walls) // 2]
    # the slowest step (29.9 ms) sits above 1.2x the median (23.7): an outlier for this test
    monkeypatch.setattr(th, "OVERHEAD_OUTLIER_STEP",
                        msgspec.structs.replace(th.OVERHEAD_OUTLIER_STEP, value=1.2))
    d = diagnose(trace, windows=[_check(sum(walls) / len(walls), median / 2)])
    (f,) = [f for f in d.findings if f.id == "steps.profiler_overhead"]
    assert "less 1 outlier step(s)" in f.message
    kept = [w for w in walls if w <= 1.2 * median]
    removed = plain.layers["host"].time_ms - d.layers["host"].time_ms
    assert removed == pytest.approx(sum(kept) - len(kept) * median / 2, rel=0.01)


def test_a_cpu_trace_keeps_its_shares_whatever_the_window_check(tmp_path):
    """On a CPU-only trace every op is slowed alike by the profiler: no correction."""
    def body(base):
        return [x("aten::mm", base + 100, 9_000)]
    trace = load_trace(write_trace(tmp_path / "t.json", _steps(4, body)))
    plain = diagnose(trace)
    d = diagnose(trace, windows=[_check(plain.breakdown.median_step_ms, 1.0)])
    assert d.layers == plain.layers
    assert "steps.profiler_overhead" not in {f.id for f in d.findings}


def test_the_header_names_the_training_steps_beside_the_profiler_steps():
    """A trace numbers its steps from the profiler's start (#2-#4); `run` counts training
    steps (the window at 3-7 here): the reports give both."""
    import torchtriage
    from torchtriage.report.html import diagnosis_page

    trace = load_trace(FIXTURES_GPU / "launch_bound.pt.trace.json.gz")
    d = diagnose(trace, windows=[_check(20.0, 20.0)])
    text = " ".join(torchtriage.render_text(d).split())
    assert "steps #3-#7 (training steps 3-7)" in text, text
    assert "(training steps 3-7)" in diagnosis_page(d)
    assert "training steps" not in torchtriage.render_text(diagnose(trace))


def test_a_window_with_a_one_off_step_says_which_step():
    from torchtriage.diagnosis.windows import window_findings

    odd = msgspec.structs.replace(_check(250.0, 20.0), representative=False, one_off_step=6,
                                  one_off_step_ms=1190.0)
    again = window_findings([odd, _check(20.0, 20.0)])
    assert "step 6 took 1190 ms, a one-off" in again[0].message
    (last,) = window_findings([odd])
    assert last.id == "steps.window_not_steady" and "Profiled step 6 took 1190 ms" in last.message
    assert last.evidence[0].metric == "one_off_step_over_after_mean"
    assert last.evidence[0].value == pytest.approx(59.5)


def _loader_steps_with_one_long(tmp_path, long_ms: float):
    """5 steps of a loader-bound CPU loop (6 ms in the DataLoader, 3 ms of compute); step #3
    also spends ``long_ms`` in one op inside the optimizer's step."""
    events, base = [], 0.0
    for n in range(1, 6):
        extra = long_ms * 1e3 if n == 3 else 0.0
        wall = 10_000 + extra
        events.append(x(f"ProfilerStep#{n}", base, wall, cat="user_annotation"))
        events.append(x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                        base + 100, 6_000, cat="user_annotation"))
        events.append(x("aten::mm", base + 6_200, 3_000))
        events.append(x("Optimizer.step#SGD.step", base + 9_300, 500 + extra,
                        cat="user_annotation"))
        if extra:
            events.append(x("aten::_foreach_add_", base + 9_400, extra))
        base += wall
    return load_trace(write_trace(tmp_path / "t.json", events))


def test_a_one_off_step_the_check_never_saw_again_is_left_out(tmp_path):
    """One long step decides the shares of a window of short ones: pytorch/examples' mnist on
    an H200 had one 84 ms step among 5-14 ms ones (66 ms of it a collector pause inside
    Adadelta.step) and was called host-bound at 80 %, its loader and optimizer fixes misjudged.
    Under one_off_min_ms nothing is profiled again; when the steps checked after the window
    never came within one_off_step of it, it is left out of the statistics and said so (here a
    CPU trace, whose one long op would make it compute-bound). A step as long among the
    checked steps stays: the job's rhythm."""
    trace = _loader_steps_with_one_long(tmp_path, 300.0)
    assert diagnose(trace).primary == "kernel"  # no check: the long step decides

    def check(after_max_ms: float):
        return msgspec.structs.replace(_check(70.0, 11.0), after_max_ms=after_max_ms)

    d = diagnose(trace, windows=[check(12.5)])
    assert d.primary == "data_loading", d.summary
    assert [s.wall_ms for s in d.breakdown.steps] == [10.0, 10.0, 10.0, 10.0]
    (left,) = [f for f in d.findings if f.id == "steps.excluded"]
    assert "#3 (one-off: 310.0 ms, 31.0x the window's median 10.0 ms; none of the 5 steps " \
           "checked after the window took more than 12.5 ms)" in left.message, left.message
    assert diagnose(trace, windows=[check(200.0)]).primary == "kernel"  # it came back: kept
    assert diagnose(trace, windows=[_check(70.0, 11.0)]).primary == "kernel"  # (no longest)
    # a step under one_off_step times the median is ordinary variation
    assert diagnose(_loader_steps_with_one_long(tmp_path, 15.0),
                    windows=[check(10.5)]).breakdown.steps[2].wall_ms == 25.0
