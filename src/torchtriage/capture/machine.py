"""Machine sampling while a script runs: CPU per core, DataLoader worker CPU, memory, GPU.

Evidence for the diagnosis: a data-loading bottleneck with every core already busy needs
cheaper preprocessing, not more workers. Sampling runs on a daemon thread (psutil; NVML through
``pynvml`` when it is installed and a GPU is present) and costs well under 1% of a core.
"""

from __future__ import annotations

import os
import threading
from typing import Any

INTERVAL_S = 0.2


class MachineSampler:
    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import psutil

        self._process = psutil.Process(os.getpid())
        psutil.cpu_percent(percpu=True)  # the first call only sets the reference point
        self._nvml = _nvml_handle()
        self._thread = threading.Thread(target=self._loop, name="torchtriage-machine",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any] | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 1)
        return summarize(self.samples)

    def _loop(self) -> None:
        import psutil

        children: dict[int, Any] = {}
        while not self._stop.wait(self.interval_s):
            try:
                sample = {"cpu": psutil.cpu_percent(percpu=True),
                          "rss": self._process.memory_info().rss}
                workers = 0.0
                for child in self._process.children(recursive=True):
                    proc = children.setdefault(child.pid, child)
                    workers += proc.cpu_percent(None)
                sample["children_cpu"] = workers / 100.0
                sample["children"] = len(children)
                if self._nvml is not None:
                    import pynvml

                    sample["gpu_util"] = pynvml.nvmlDeviceGetUtilizationRates(self._nvml).gpu
                    sample["gpu_mem"] = pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used
                self.samples.append(sample)
            except Exception:  # a process that ended between two calls
                continue


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


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Means and maxima over the samples (None without samples)."""
    if not samples:
        return None
    cores = len(samples[0]["cpu"])
    per_core = [sum(s["cpu"][i] for s in samples) / len(samples) / 100.0 for i in range(cores)]
    out: dict[str, Any] = {
        "samples": len(samples),
        "interval_s": INTERVAL_S,
        "cores": cores,
        "cpu_busy_per_core": [round(c, 3) for c in per_core],
        "cpu_busy_mean": round(sum(per_core) / cores, 3),
        "rss_max_bytes": max(s["rss"] for s in samples),
        "child_processes": max(s.get("children", 0) for s in samples),
        "children_cpu_cores_mean": round(sum(s["children_cpu"] for s in samples)
                                         / len(samples), 3),
    }
    gpu = [s for s in samples if "gpu_util" in s]
    if gpu:
        out["gpu_util_mean"] = round(sum(s["gpu_util"] for s in gpu) / len(gpu) / 100.0, 3)
        out["gpu_mem_max_bytes"] = max(s["gpu_mem"] for s in gpu)
    return out
