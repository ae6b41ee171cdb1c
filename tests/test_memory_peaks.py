"""CPU peaks when the profiler misses frees (analysis/memory.py) and the live-tensor census the
capture writes beside them (capture/session.py)."""

from __future__ import annotations

import pytest
from conftest import write_trace, x

from torchtriage.analysis.memory import memory_peaks
from torchtriage.analysis.steps import find_steps
from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.report.html import diagnosis_page
from torchtriage.report.render import render_text
from torchtriage.trace import load_trace

MiB = 2**20


def _memory(ts: float, total: int) -> dict:
    return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
            "tid": 1, "ts": ts, "args": {"Total Allocated": total, "Total Reserved": 0,
                                         "Bytes": 1, "Device Type": 0, "Device Id": -1}}


def _climbing_trace(tmp_path, live_end: int | None):
    """5 steps of 10 ms: each allocates 20 MiB and frees it, but 8 MiB of each step's frees are
    made where the profiler does not see them, so the total climbs 8 MiB a step."""
    events, unseen = [], 0
    for step in range(5):
        base = step * 10_000.0
        events.append(x(f"ProfilerStep#{step + 3}", base, 10_000, cat="user_annotation"))
        events += [_memory(base + 1_000, unseen + 20 * MiB), _memory(base + 5_000, unseen)]
        unseen += 8 * MiB
        events.append(_memory(base + 9_000, unseen))
    meta = {"cpu_baseline_bytes": 50 * MiB, "warmup_steps": []}
    if live_end is not None:
        meta["cpu_live_end_bytes"] = live_end
    return load_trace(write_trace(tmp_path / "t.json", events, torchtriage=meta))


def test_frees_the_profiler_missed_are_not_a_climbing_peak(tmp_path):
    """The census after the window finds 50 MiB alive: the 40 MiB the total climbed were freed
    unseen. Each step's own rise (20 MiB) on what is alive gives the peak, 70 MiB, not the
    recorded 50 + 52 = 102 MiB."""
    trace = _climbing_trace(tmp_path, live_end=50 * MiB)
    (peak,) = memory_peaks(trace, find_steps(trace).start)
    assert peak.unseen_free_bytes == 40 * MiB
    assert peak.peak_allocated == 70 * MiB
    diagnosis = diagnose(trace, device_memory=100 * MiB)
    (shown,) = diagnosis.memory
    assert (shown.unseen_free_bytes, shown.peak_fraction) == (40 * MiB, 0.7)
    said = " ".join(render_text(diagnosis, width=200).split())
    assert "cpu: 40.0 MiB freed where the profiler does not record" in said
    assert "cpu: 40.0 MiB freed where the profiler does not record" in diagnosis_page(diagnosis)


@pytest.mark.parametrize("live_end", [None, 90 * MiB, 89 * MiB + MiB // 2, -5, True, "50"])
def test_a_real_climb_or_no_census_keeps_the_recorded_peak(tmp_path, live_end):
    """Without the census (traces captured elsewhere), when what is alive at the end did
    climb (a real leak: 50 + 40 MiB alive), or when less than 1 MiB was missed, the peak is
    the recorded one (and nothing is said about missed frees). So too for a census that is not
    a byte count (an edited trace): a negative one lowered the peak to 70 MiB."""
    trace = _climbing_trace(tmp_path, live_end=live_end)
    (peak,) = memory_peaks(trace, find_steps(trace).start)
    assert peak.unseen_free_bytes == 0
    assert peak.peak_allocated == 50 * MiB + 32 * MiB + 20 * MiB


def test_a_baseline_that_is_not_a_byte_count_is_left_out(tmp_path):
    """An edited trace's baseline ("abc") was an internal error (exit 3) of `analyze`."""
    trace = load_trace(write_trace(tmp_path / "t.json", [
        x("ProfilerStep#3", 0, 10_000, cat="user_annotation"), _memory(10, MiB)],
        torchtriage={"cpu_baseline_bytes": "abc", "cpu_live_end_bytes": [1]}))
    (peak,) = memory_peaks(trace, find_steps(trace).start)
    assert (peak.peak_allocated, peak.baseline, peak.unseen_free_bytes) == (MiB, 0, 0)


def test_the_census_leaves_out_fsdp2_gradients_and_counts_them_at_the_end(tmp_path):
    """FSDP2's parameters and gradients are DTensors: the gradients' local shards are left out
    of the baseline (backward allocates them again inside the window) and counted at the end
    (they were counted twice, the baseline and the window, for 16 MiB of a 2-rank job)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from torchtriage.capture.live_memory import live_cpu_tensor_bytes

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))
        for layer in model:
            fully_shard(layer)
        model(torch.randn(2, 256)).sum().backward()
        storages = {s.data_ptr(): s.nbytes() for s in
                    (p.grad.to_local().untyped_storage() for p in model.parameters())}
        grads = sum(storages.values())  # (one unit's gradients may share a storage)
        assert grads >= 4 * (256 * 512 * 2 + 512 + 256)
        without, with_grads = live_cpu_tensor_bytes(), live_cpu_tensor_bytes(gradients=True)
        assert with_grads - without == grads
    finally:
        dist.destroy_process_group()


def test_the_census_sees_tensors_a_script_froze():
    """``gc.freeze()`` after building the model (a way to shorten collections) hid the
    parameters from ``gc.get_objects()``: the census fell by the model's size. The objects
    reachable from the tracked ones are walked too, and the script's freeze stays as it was."""
    import gc

    import torch

    from torchtriage.capture.live_memory import live_cpu_tensor_bytes

    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    gc.collect()  # earlier tests' garbage: counted while tracked, unreachable once frozen
    before = live_cpu_tensor_bytes()
    assert before >= params
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        # (a tensor that only C++ holds is out of reach once frozen: earlier tests' scalars)
        assert before - 1024 <= live_cpu_tensor_bytes() <= before
        # nothing frozen or unfrozen by the census (reading frames' locals may free a few)
        assert frozen - 100 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
