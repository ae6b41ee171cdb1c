"""Machine sampling while a script runs: CPU per core, the job's own CPU, DataLoader worker
CPU, memory, GPU; and once, the cores the job may use and the CPU's bf16 instructions.

Evidence for the diagnosis: a data-loading bottleneck whose job already uses every core it may
use needs cheaper preprocessing, not more workers. That is judged from the job's own processes,
not the machine (other processes on a shared machine do not make the job CPU-bound): the job is
the process group of the command ``torchtriage run`` started (its leader when that is an
ancestor of this process: under torchrun the agent and every rank; else this process), with
all its descendants (DataLoader workers), each sample summing their CPU use. The cores it may
use are its CPU affinity, capped by a cgroup CPU quota (v2 ``cpu.max``, v1
``cpu.cfs_quota_us``/``cpu.cfs_period_us``). bf16 autocast on a CPU pays only with native bf16
instructions: the ``/proc/cpuinfo`` flags ``amx_bf16`` and ``avx512_bf16`` (x86) or the
``bf16`` feature (Arm) are recorded, with ``torch.backends.cpu.get_cpu_capability()``.
Sampling runs on a daemon thread (psutil; NVML through ``pynvml`` when it is installed and a
GPU is present) and costs well under 1% of a core.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

INTERVAL_S = 0.2
MIN_WINDOW_SAMPLES = 5  # samples inside the profiled steps needed to judge from them alone
BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX, x86 AVX-512, Arm BF16 extension


class MachineSampler:
    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import psutil

        self._process = psutil.Process(os.getpid())
        self._root = job_root(psutil, self._process)
        psutil.cpu_percent(percpu=True)  # the first call only sets the reference point
        self._nvml = _nvml_handle()
        self.static: dict[str, Any] = static_facts()
        self._thread = threading.Thread(target=self._loop, name="torchtriage-machine",
                                        daemon=True)
        self._thread.start()

    def stop(self, spans: Sequence[tuple[float, float]] = ()) -> dict[str, Any] | None:
        """Stop sampling; the summary (see :func:`summarize`), its CPU means over ``spans``
        (``time.perf_counter()`` spans of steady steps) when they hold enough samples."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 1)
        summary = summarize(self.samples, spans)
        if summary is not None:
            summary.update(self.static)
        return summary

    def _loop(self) -> None:
        import psutil

        children: dict[int, Any] = {}
        job: dict[int, Any] = {self._root.pid: self._root, self._process.pid: self._process}
        for proc in job.values():
            proc.cpu_percent(None)  # reference points
        while not self._stop.wait(self.interval_s):
            try:
                # each reading covers the interval up to now ("t": its end)
                sample = {"t": time.perf_counter(), "cpu": psutil.cpu_percent(percpu=True),
                          "rss": self._process.memory_info().rss}
                workers = 0.0
                mine = self._process.children(recursive=True)
                for child in mine:
                    proc = children.setdefault(child.pid, child)
                    workers += proc.cpu_percent(None)
                sample["children_cpu"] = workers / 100.0
                sample["children"] = len(children)
                tree = mine if self._root is self._process else \
                    self._root.children(recursive=True)
                used = workers + self._process.cpu_percent(None)
                alive = 1 + len(tree)
                for proc in (self._root, *tree):
                    if proc.pid == self._process.pid or proc.pid in children:
                        continue  # counted above
                    used += _cpu(job.setdefault(proc.pid, proc))
                sample["job_cpu"] = used / 100.0
                sample["job_processes"] = alive
                if self._nvml is not None:
                    import pynvml

                    sample["gpu_util"] = pynvml.nvmlDeviceGetUtilizationRates(self._nvml).gpu
                    sample["gpu_mem"] = pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used
                self.samples.append(sample)
            except Exception:  # a process that ended between two calls
                continue


def static_facts() -> dict[str, Any]:
    """What does not change while the job runs: the cores it may use (and where that limit
    comes from), torch's CPU capability and the CPU's native bf16 instructions."""
    cores, source = cores_available()
    return {"cores_available": cores, "cores_available_source": source,
            "cpu_capability": _cpu_capability(), "cpu_bf16": cpu_bf16_flags()}


def cpu_facts(static: dict[str, Any] | None = None) -> dict[str, Any]:
    """This machine's CPU facts without samples (``samples`` 0), for a diagnosis made where the
    training ran but nothing was sampled (``torchtriage.profile``, the early verdict of a long
    ``run``): ``static`` (:func:`static_facts`, a sampler's when it has them, else read now)
    with the sample fields empty."""
    return {"samples": 0, "cores": os.cpu_count() or 1, "cpu_busy_mean": 0.0,
            "cpu_busy_per_core": [], "rss_max_bytes": 0, "child_processes": 0,
            "children_cpu_cores_mean": 0.0, **(static or static_facts())}


def _cpu(proc) -> float:
    """A process's CPU use since the last call, in percent of one core (0 once it ended)."""
    try:
        return proc.cpu_percent(None)
    except Exception:  # psutil.NoSuchProcess, AccessDenied
        return 0.0


def job_root(psutil, me):
    """The job's root process: the leader of this process's group when it is this process or
    an ancestor of it (the command ``torchtriage run`` started in its own session: under
    torchrun the agent), else this process."""
    try:
        group = os.getpgid(0)
        for proc in (me, *me.parents()):
            if proc.pid == group:
                return proc
    except Exception:
        pass
    return me


def cores_available() -> tuple[float, str]:
    """The cores this process may use and what limits them: CPU affinity, or a cgroup CPU
    quota when that is lower."""
    try:
        cores, source = float(len(os.sched_getaffinity(0))), "CPU affinity"
    except (AttributeError, OSError):
        cores, source = float(os.cpu_count() or 1), "all cores"
    quota = _cgroup_quota()
    if quota is not None and quota < cores:
        return round(quota, 3), "cgroup CPU quota"
    return cores, source


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup"),
                  self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest CPU quota (in cores) of this process's cgroup and its parents, v2 or v1;
    None without one."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = Path(path.lstrip("/"))
        if controllers == "":  # v2: cpu.max is "max 100000" or "QUOTA PERIOD"
            dirs = [root / rel, *(root / p for p in rel.parents)]
            for d in dirs:
                try:
                    quota, period = (d / "cpu.max").read_text().split()[:2]
                except (OSError, ValueError):
                    continue
                if quota != "max" and int(period) > 0:
                    found.append(int(quota) / int(period))
        elif "cpu" in controllers.split(","):
            for mount in (root / "cpu,cpuacct", root / "cpu"):
                for d in (mount / rel, mount):
                    try:
                        quota = int((d / "cpu.cfs_quota_us").read_text())
                        period = int((d / "cpu.cfs_period_us").read_text())
                    except (OSError, ValueError):
                        continue
                    if quota > 0 and period > 0:
                        found.append(quota / period)
    return min(found) if found else None


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str] | None:
    """The native bf16 instruction sets among the CPU's flags (``[]``: none); None when the
    flags cannot be read (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return [f for f in BF16_FLAGS if f in present]
    return None


def _cpu_capability() -> str | None:
    """torch's CPU capability (``AVX512``, ``AVX2``...), read only where torch is loaded: the
    training process. None elsewhere: importing torch for one string cost a CLI process ~1.5 s
    of CPU while the script it watched trained beside it (measured 2026-12-03)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        return None


def _nvml_handle():
    try:
        import pynvml
        import torch

        if not torch.cuda.is_available():
            return None
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:
        return None


def summarize(samples: list[dict[str, Any]], spans: Sequence[tuple[float, float]] = ()
              ) -> dict[str, Any] | None:
    """Means and maxima over the samples (None without samples). The CPU and GPU means are
    over the samples whose interval ends inside one of ``spans`` (the window's profiled steps
    and the unprofiled steps its check timed) when there are at least ``MIN_WINDOW_SAMPLES`` of
    them (``samples_scope`` "window"), else over the whole run ("run"): start-up, imports, the
    trace export and the steps before the window dilute a saturation the steady steps show.
    Maxima (memory, processes) are over the whole run."""
    if not samples:
        return None
    whole = samples
    scope = "run"
    inside = [x for x in samples
              if any(a < x.get("t", 0.0) <= b + INTERVAL_S for a, b in spans)]
    if len(inside) >= MIN_WINDOW_SAMPLES:
        samples, scope = inside, "window"
    cores = len(samples[0]["cpu"])
    per_core = [sum(s["cpu"][i] for s in samples) / len(samples) / 100.0 for i in range(cores)]
    out: dict[str, Any] = {
        "samples": len(samples),
        "interval_s": INTERVAL_S,
        "cores": cores,
        "cpu_busy_per_core": [round(c, 3) for c in per_core],
        "cpu_busy_mean": round(sum(per_core) / cores, 3),
        "samples_scope": scope,
        "rss_max_bytes": max(s["rss"] for s in whole),
        "child_processes": max(s.get("children", 0) for s in whole),
        "children_cpu_cores_mean": round(sum(s["children_cpu"] for s in samples)
                                         / len(samples), 3),
    }
    job = [s for s in samples if "job_cpu" in s]
    if job:
        out["job_cpu_cores_mean"] = round(sum(s["job_cpu"] for s in job) / len(job), 3)
        out["job_processes"] = max(s["job_processes"] for s in whole if "job_processes" in s)
    gpu = [s for s in samples if "gpu_util" in s]
    if gpu:
        out["gpu_util_mean"] = round(sum(s["gpu_util"] for s in gpu) / len(gpu) / 100.0, 3)
        out["gpu_mem_max_bytes"] = max(s["gpu_mem"] for s in whole if "gpu_mem" in s)
    return out
