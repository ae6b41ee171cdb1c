"""Profile mode's window inside the training process: machine sampling from the first training
step, and a :class:`~torchtriage.capture.session.ProfileSession` with the run's schedule that
starts after ``skip`` steps (one trace and one ``run.rank<N>.json`` per rank)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchtriage.results.run import Schedule


class ProfilingWindow:
    def __init__(self, out: Path, rank: int, schedule: Schedule, skip: int,
                 device_memory: int | None) -> None:
        self.out, self.rank, self.schedule = out, rank, schedule
        self.skip, self.device_memory = skip, device_memory
        self.session: Any = None  # the ProfileSession, once started
        self.sampler: Any = None  # the MachineSampler, once started
        self._sampling_tried = False

    def start_sampling(self) -> None:
        """Sample the machine from the first training step on (not during imports); once."""
        if self._sampling_tried:
            return
        from torchtriage.capture.machine import MachineSampler

        self._sampling_tried = True
        self.sampler = MachineSampler()
        try:
            self.sampler.start()
        except Exception:  # psutil missing or refused: the run goes on without samples
            self.sampler = None

    def stop_sampling(self) -> dict[str, Any] | None:
        return self.sampler.stop() if self.sampler is not None else None

    def step_ended(self, steps: int) -> None:
        """``steps`` training steps ran: start the session after ``skip``, else step it."""
        if self.session is None and steps >= self.skip:
            self._start_session()
        elif self.session is not None:
            self.session.step()

    def _start_session(self) -> None:
        from torchtriage.capture.session import ProfileSession

        self.session = ProfileSession(
            self.out, analyze=False, device_memory=self.device_memory,
            worker_name=f"rank{self.rank}_{os.getpid()}", record_name=f"run.rank{self.rank}.json",
            wait=self.schedule.wait, warmup=self.schedule.warmup, active=self.schedule.active,
        )
        self.session.__enter__()
