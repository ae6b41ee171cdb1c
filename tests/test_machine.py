"""Machine samples that judge the job: its own processes' CPU, the cores it may use, and the
CPU's native bf16 instructions (capture/machine.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from torchtriage.capture import machine


def test_bf16_flags_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\n"
                    "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")
    assert machine.cpu_bf16_flags(info) == ["amx_bf16", "avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n")
    assert machine.cpu_bf16_flags(info) == []
    info.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")  # Graviton3
    assert machine.cpu_bf16_flags(info) == ["bf16"]
    assert machine.cpu_bf16_flags(tmp_path / "absent") is None


def test_cgroup_quota_v2_and_v1(tmp_path):
    own = tmp_path / "self_cgroup"
    own.write_text("0::/job/step\n")
    (tmp_path / "job" / "step").mkdir(parents=True)
    (tmp_path / "job" / "step" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "job" / "cpu.max").write_text("150000 100000\n")  # the parent caps it
    assert machine._cgroup_quota(tmp_path, own) == 1.5
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "docker").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu,cpuacct" / "docker" / "cpu.cfs_period_us").write_text("100000\n")
    own.write_text("4:memory:/docker\n3:cpu,cpuacct:/docker\n")
    assert machine._cgroup_quota(v1, own) == 0.5
    own.write_text("3:cpu,cpuacct:/\n")
    assert machine._cgroup_quota(tmp_path / "none", own) is None


_SAMPLED = textwrap.dedent("""
    import json, subprocess, sys, time
    from torchtriage.capture.machine import MachineSampler
    worker = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sampler = MachineSampler(interval_s=0.1)
    sampler.start()
    time.sleep(1.5)
    summary = sampler.stop()
    worker.kill()
    print(json.dumps(summary))
""")


def test_the_job_is_its_own_processes_not_the_machine():
    """Issue 18 item 10: with other processes busy the machine reads saturated; the job (the
    process group that run starts, and its descendants) is what is judged."""
    other = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # not in the job
    try:
        out = subprocess.run([sys.executable, "-c", _SAMPLED], capture_output=True, text=True,
                             timeout=60, start_new_session=True, check=True).stdout
    finally:
        other.kill()
    summary = json.loads(out)
    assert summary["job_processes"] == 2  # the sampled process and its busy child, no other
    assert summary["child_processes"] == 1
    assert summary["job_cpu_cores_mean"] >= summary["children_cpu_cores_mean"] > 0.2
    assert summary["cores_available"] >= 1 and summary["cores_available_source"]
    assert "cpu_bf16" in summary and "cpu_capability" in summary


def _sample(t: float, busy: float, job: float, rss: int = 100) -> dict:
    return {"t": t, "cpu": [busy * 100, busy * 100], "rss": rss, "children_cpu": 0.0,
            "children": 1, "job_cpu": job, "job_processes": 2}


def test_cpu_means_come_from_the_steady_steps_when_they_hold_enough_samples():
    """Start-up and early steps at low CPU dilute a saturation the window shows: the means
    are over the samples inside the window and its checked steps (5 or more), the maxima
    over the whole run."""
    idle = [_sample(0.2 * k, 0.1, 0.2, rss=900 if k == 3 else 100) for k in range(1, 20)]
    busy = [_sample(4.0 + 0.2 * k, 1.0, 2.0) for k in range(1, 8)]
    whole = machine.summarize(idle + busy)
    assert whole["samples_scope"] == "run" and whole["job_cpu_cores_mean"] < 1.0
    inside = machine.summarize(idle + busy, spans=[(4.0, 4.6), (4.8, 5.4)])
    assert inside["samples_scope"] == "window" and inside["samples"] == 7  # both spans
    assert inside["cpu_busy_mean"] == 1.0 and inside["job_cpu_cores_mean"] == 2.0
    assert inside["rss_max_bytes"] == 900  # a maximum over the whole run
    # a window too short for 5 samples: the whole run's means, said so
    short = machine.summarize(idle + busy, spans=[(4.0, 4.5)])
    assert short["samples_scope"] == "run" and short["samples"] == 26
