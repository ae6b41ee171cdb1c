"""Job-level diagnosis over rank traces: ranks side by side, stragglers (2-rank gloo on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_trace, x

from torchtriage.api import analyze, analyze_job, diagnose

REPO = Path(__file__).resolve().parents[1]


def _rank_trace(tmp_path: Path, rank: int, comm_us: float, loader_us: float) -> None:
    events = []
    for n in range(3, 7):
        base = n * 10_000.0
        events += [
            x(f"ProfilerStep#{n}", base, 10_000, cat="user_annotation"),
            x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, loader_us,
              cat="user_annotation"),
            x("aten::mm", base + loader_us, 2_000),
            x("gloo:all_reduce", base + loader_us + 2_000, comm_us, cat="user_annotation",
              tid=99),
        ]
    write_trace(tmp_path / f"rank{rank}.json", events,
                distributedInfo={"backend": "gloo", "rank": rank, "world_size": 2})


def test_straggler_is_named_with_its_layer(tmp_path):
    _rank_trace(tmp_path, 0, comm_us=7_500, loader_us=300)  # waits for rank 1
    _rank_trace(tmp_path, 1, comm_us=300, loader_us=7_500)  # loads slowly
    job = analyze_job(tmp_path)
    assert job.straggler is not None
    assert (job.straggler.rank, job.straggler.layer) == (1, "data_loading")
    assert job.primary == "data_loading" and job.world_size == 2
    assert [r.rank for r in job.ranks] == [0, 1]
    assert "job.straggler" in {f.id for f in job.findings}


def test_balanced_communication_bound_job_has_no_straggler(tmp_path):
    _rank_trace(tmp_path, 0, comm_us=7_000, loader_us=300)
    _rank_trace(tmp_path, 1, comm_us=5_500, loader_us=300)
    job = analyze_job(tmp_path)
    assert job.straggler is None and job.primary == "communication"
    assert job.confidence == "high"


def test_a_pool_of_two_gives_the_job_of_one_process(tmp_path):
    """Rank traces diagnosed in a pool come back (as msgpack) to the same job document."""
    _rank_trace(tmp_path, 0, comm_us=7_500, loader_us=300)
    _rank_trace(tmp_path, 1, comm_us=300, loader_us=7_500)
    pooled, alone = diagnose(tmp_path, workers=2), diagnose(tmp_path, workers=1)
    assert pooled.to_dict() == alone.to_dict()


def test_the_pool_is_sized_to_the_work(tmp_path):
    from torchtriage.diagnosis.traces import JSON_PER_WORKER, _pool_size

    small = [tmp_path / f"rank{r}.json" for r in range(4)]
    for path in small:
        path.write_text("{}")
    assert _pool_size(small, None) == 1  # a process costs more than these take
    assert _pool_size(small, 3) == 3 and _pool_size(small[:1], None) == 1
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(JSON_PER_WORKER * 3)
    assert _pool_size([big] * 8, None) == min(3, os.cpu_count() or 1)


def test_one_process_asked_for_means_no_decoder_process_either(tmp_path, monkeypatch):
    """workers=1 (the bootstrap's diagnosis inside a training process) never forks, even for
    a single trace large enough for two decoders; the default leaves that to the load."""
    from torchtriage.trace import parallel

    _rank_trace(tmp_path, 0, comm_us=300, loader_us=300)
    asked = []
    monkeypatch.setattr(parallel, "decoders",
                        lambda path, workers: asked.append(workers) or 1)
    diagnose(tmp_path / "rank0.json", workers=1)
    diagnose(tmp_path / "rank0.json")
    assert asked == [1, None]


def _torchtriage_run(tmp_path: Path, example: str) -> dict:
    out = tmp_path / example
    proc = subprocess.run(
        [sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--", "torchrun",
         "--nproc_per_node=2", str(REPO / "examples" / f"{example}.py")],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "torchtriage · job" in proc.stdout
    return json.loads((out / "diagnosis.json").read_text())


def test_ddp_comm_bound_example_is_communication_on_every_rank(tmp_path):
    job = _torchtriage_run(tmp_path, "ddp_comm_bound")
    assert [d["primary"] for d in job["diagnoses"]] == ["communication", "communication"]
    for d in job["diagnoses"]:
        assert d["prescriptions"][0]["layer"] == "communication"
    assert job["primary"] == "communication" and job["straggler"] is None


@pytest.mark.parametrize("example", ["ddp_straggler"])
def test_ddp_straggler_example_names_the_slow_rank_and_its_layer(tmp_path, example):
    job = _torchtriage_run(tmp_path, example)
    assert job["straggler"]["rank"] == 1 and job["straggler"]["layer"] == "data_loading"
    assert job["diagnoses"][0]["primary"] == "communication"  # the fast rank waits


NCCL = Path(__file__).parent / "fixtures" / "nccl"


def test_nccl_comm_bound_fixture_is_communication_on_every_rank():
    job = analyze_job(NCCL / "comm_bound")
    assert [d.primary for d in job.diagnoses] == ["communication", "communication"]
    assert [d.trace.rank for d in job.diagnoses] == [0, 1]
    for d in job.diagnoses:
        assert d.prescriptions[0].id == "ddp.bucket_cap"
        assert d.gpu.comm_compute_overlap_pct is not None
        comm = next(c for c in d.gpu.kernel_classes if c.cls == "communication")
        assert comm.time_ms > 0.3 * sum(c.time_ms for c in d.gpu.kernel_classes)
    assert job.primary == "communication" and job.straggler is None


def test_nccl_fix_moves_the_bottleneck_off_communication():
    before, after = analyze_job(NCCL / "comm_bound"), analyze_job(NCCL / "comm_bound_fixed")
    for b, a in zip(before.diagnoses, after.diagnoses, strict=True):
        assert a.primary != "communication"
        assert a.layers["communication"].share < b.layers["communication"].share / 2


def test_collective_table_from_nccl_kernel_args():
    (d,) = [x for x in analyze_job(NCCL / "comm_bound").diagnoses if x.trace.rank == 0]
    (allreduce,) = [c for c in d.collectives if c.op == "allreduce"]
    assert allreduce.source == "nccl kernel" and allreduce.group_size == 2
    assert allreduce.bytes_per_call == 67117056 * 4  # In msg nelems x fp32
    assert allreduce.per_step > 1 and 10 < allreduce.busbw_gbps < 1000  # NVLink-class
    assert any(e.metric == "allreduce_busbw" for e in d.layers["communication"].evidence)


def test_collective_table_from_gloo_ranges(tmp_path):
    _rank_trace(tmp_path, 0, comm_us=7_000, loader_us=300)
    (d,) = analyze(tmp_path / "rank0.json")
    (row,) = d.collectives
    assert (row.op, row.source, row.count, row.per_step) == ("all_reduce", "gloo", 4, 1.0)
    assert row.time_ms == pytest.approx(28.0)


def test_exposed_and_overlapped_communication():
    for d in analyze_job(NCCL / "comm_bound").diagnoses:
        ev = {e.metric: e.value for e in d.layers["communication"].evidence}
        # NCCL kernel time = exposed (34 %) + hidden behind compute on other streams.
        assert 0.2 < ev["communication_overlapped"] < 0.8
        assert ev["communication_share"] > 0.3


def test_slow_link_and_sharding_findings(shared_traces, tmp_path):
    (d,) = analyze(shared_traces / "hta" / "nccl_parser_config")
    slow = [f for f in d.findings if f.id == "communication.slow_link"]
    assert slow and slow[0].evidence[0].value < 10  # 26 MB all-reduces at ~6.6 GB/s
    (fast,) = analyze(NCCL / "comm_bound" / "rank0.pt.trace.json.gz")
    assert "communication.slow_link" not in {f.id for f in fast.findings}  # NVLink: 245 GB/s
    events = []
    for n in range(1, 4):
        base = n * 1_000.0
        events += [x(f"ProfilerStep#{n}", base, 1_000, cat="user_annotation"),
                   x("aten::mm", base, 300),
                   x("gloo:all_gather", base + 300, 300, cat="user_annotation", tid=9),
                   x("gloo:reduce_scatter", base + 600, 300, cat="user_annotation", tid=9)]
    write_trace(tmp_path / "fsdp.json", events)
    (sharded,) = analyze(tmp_path / "fsdp.json")
    assert "communication.sharded" in {f.id for f in sharded.findings}


def test_rank_from_file_name_when_distributed_info_lacks_it(shared_traces, tmp_path):
    (d,) = analyze(shared_traces / "hta" / "rank_unavailable")  # distributedInfo has no rank
    assert d.trace.rank is None
    events = [x("ProfilerStep#1", 0, 100, cat="user_annotation"), x("aten::mm", 0, 90)]
    write_trace(tmp_path / "rank-3.json", events)
    write_trace(tmp_path / "rank-1.json", events)
    job = analyze_job(tmp_path)
    assert [r.rank for r in job.ranks] == [1, 3]


SCRIPTS = Path(__file__).parent / "scripts"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchtriage", "run", "--out", str(out),
                           *args], capture_output=True, text=True, timeout=600, cwd=REPO)


def test_an_fsdp2_gloo_job_is_communication_with_fsdp_levers_first(tmp_path):
    """16 fully_shard-ed 256-wide blocks, batch 8, 2 gloo ranks: FSDP2 waits for each
    all-gather inside its hooks, within forward and backward. That is communication (it was
    counted as forward and backward, and the verdict was `kernel`), FSDP's own levers come
    first, DDP's are withheld; with reshard_after_forward=False injected, each unit is gathered
    once per step and that lever is withheld for it. (256 wide: communication is 69-73 % of
    the step on 2 cores, 88-89 % at the script's default 512, whose steps take 7x longer:
    28 s against 14 s for the first run.)"""
    command = ["--", "torchrun", "--nproc_per_node=2", str(SCRIPTS / "fsdp_blocks.py")]
    out = tmp_path / "run"
    proc = _run(out, *command, "--steps", "14", "--width", "256")
    assert proc.returncode == 0, proc.stderr
    job = json.loads((out / "diagnosis.json").read_text())
    assert job["primary"] == "communication", job["summary"]
    for d in job["diagnoses"]:
        assert d["primary"] == "communication", d["summary"]
        assert d["prescriptions"][0]["id"] == "fsdp.reshard_after_forward", d["prescriptions"]
        assert (d["sharding"]["kind"], d["sharding"]["units"]) == ("fsdp2", 17)
        assert d["sharding"]["all_gathers_per_step"] >= 1.5 * 17 - 1  # the root stays gathered
        assert {"ddp.bucket_cap", "ddp.comm_hook"} <= {w["id"] for w in d["withheld"]}
    assert "Sharding: FSDP2 (fully_shard), 17 sharded units" in proc.stdout

    out = tmp_path / "knob"
    proc = _run(out, "--knob", "fsdp.reshard_after_forward=false", *command, "--steps", "12",
                "--width", "256")
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads((out / "run.rank0.json").read_text())["knobs"][
        "fsdp.reshard_after_forward"]
    assert outcome["applied"] and outcome["count"] == 17, outcome
    for d in json.loads((out / "diagnosis.json").read_text())["diagnoses"]:
        assert d["sharding"]["all_gathers_per_step"] <= 17, d["sharding"]
        assert "fsdp.reshard_after_forward" in {w["id"] for w in d["withheld"]}


def _rank_aborted_in_gloo(stderr: str) -> bool:
    """A rank of a two-rank CPU gloo job killed by SIGABRT, with nothing on its stderr (not
    Python's faulthandler, not libstdc++'s terminate message), and its peer told "Connection
    closed by peer" in the first steps' backward. Seen in ~1 of 80 runs of this test with
    four jobs at once on 2 cores (2 in 160; 0 in 80 of the same script without the knob, 0
    in 80 with it two at once) and once in CI; never with one job at a time (60 runs). Not
    traced to torchtriage: no signal of ours is SIGABRT and no Python frame is reported."""
    return "(SIGABRT)" in stderr and "Connection closed by peer" in stderr


def test_memory_fsdp_keeps_ddp_where_there_is_no_repeated_block(tmp_path):
    """memory.fsdp on a model without repeated blocks (ddp_gloo.py: Linear, ReLU, Linear)
    keeps DDP and says why (sharding it applied, with DDP's losses, is in
    tests/test_fix.py's ladder test)."""
    args = ("--knob", "memory.fsdp=true", "--", "torchrun", "--nproc_per_node=2",
            str(SCRIPTS / "ddp_gloo.py"))
    out = tmp_path / "plain"
    proc = _run(out, *args)
    if proc.returncode != 0 and _rank_aborted_in_gloo(proc.stderr):
        out = tmp_path / "again"  # see _rank_aborted_in_gloo: once more, never twice
        proc = _run(out, *args)
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads((out / "run.rank0.json").read_text())["knobs"]["memory.fsdp"]
    assert not outcome["applied"] and "no repeated block" in outcome["detail"], outcome
