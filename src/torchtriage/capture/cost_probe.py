"""The cost guard's probe: one unprofiled training step recorded ops only, to count its events.

Algorithm: :meth:`CostProbe.start` starts a profiler that records ops only (no shapes, stacks
or memory: the count is the same, at a third of the memory per event). On the main thread,
with a memory limit known, a watch (:mod:`torchtriage.capture.step_cut`) polls the process's
resident memory and, once it has grown by what recording costs on the way to the profiler
memory a window may take (``profile_memory_share`` of the limit x
``profile_recording_bytes_per_event`` / ``profile_bytes_per_event``: most of a profiler's peak
comes when it stops), stops the probe part-way through its step, between
two Python lines, and counts what it recorded: a step of millions of ops would otherwise take
the training out of memory while it is probed. :meth:`CostProbe.finish`, at the step's end,
stops it (unless the watch did) and returns the events, the seconds they took and whether
the step was cut, for :func:`~torchtriage.capture.cost_guard.fit_window`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from torchtriage.capture.profiler_results import count_events, memory_limit, resident_bytes
from torchtriage.capture.quiet import profiler_call
from torchtriage.capture.step_cut import StepCut, on_main_thread
from torchtriage.diagnosis import thresholds as th

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeCount:
    """What the probe saw."""

    events: int  # profiler op events (a lower bound when ``cut``)
    seconds: float  # the probed step's wall time, or until the probe was cut
    cut: bool  # stopped part-way through its step by the memory watch


class CostProbe:
    """One probed step (see the module docstring)."""

    def __init__(self, profiler: Any) -> None:
        self._profiler: Any = profiler
        self._started = time.perf_counter()
        self._cut: StepCut | None = None
        self._cut_count: ProbeCount | None = None

    @classmethod
    def start(cls, activities: list[Any]) -> CostProbe | None:
        """A running probe, or None when no profiler could start (one already running)."""
        import torch

        profiler = torch.profiler.profile(activities=activities, record_shapes=False,
                                          profile_memory=False, with_stack=False)
        try:
            with profiler_call():
                profiler.start()
        except Exception as exc:
            log.debug("torchtriage: the cost probe did not start (%s)", exc)
            return None
        probe = cls(profiler)
        probe._watch()
        return probe

    def _watch(self) -> None:
        limit = memory_limit()
        if limit is None or not on_main_thread():
            return
        # the growth while recording at which the stop would bring the peak to the share
        allowed = (limit[0] * th.PROFILE_MEMORY_SHARE.value
                   * th.PROFILE_RECORDING_BYTES_PER_EVENT.value / th.PROFILE_BYTES_PER_EVENT.value)
        start = resident_bytes()
        self._cut = StepCut(self._stop_mid_step, due=lambda: resident_bytes() - start > allowed)
        self._cut.start()

    def _stop_mid_step(self) -> None:
        """On the main thread, part-way through the probed step."""
        seconds = time.perf_counter() - self._started
        try:
            events = self._stop_and_count()
        except Exception as exc:
            log.debug("torchtriage: the cost probe failed (%s)", exc)
            events = 0
        self._cut_count = ProbeCount(events=max(events, 1), seconds=seconds, cut=True)

    def _stop_and_count(self) -> int:
        profiler, self._profiler = self._profiler, None
        with profiler_call():
            profiler.stop()
        return count_events(profiler)

    def finish(self) -> ProbeCount:
        """At the probed step's end (on the training thread).

        Raises:
            Exception: stopping or counting failed (the guard leaves the window as planned).
        """
        if self._cut is not None:
            self._cut.cancel()
        if self._cut_count is not None:  # (no event yet: still a cut, the window a slice)
            return self._cut_count
        seconds = time.perf_counter() - self._started
        return ProbeCount(events=self._stop_and_count(), seconds=seconds, cut=False)

    def abandon(self) -> None:
        """The loop ended inside the probed step: stop, count nothing."""
        if self._cut is not None:
            self._cut.cancel()
        if self._profiler is not None:
            try:
                with profiler_call():
                    self._profiler.stop()
            except Exception as exc:  # (nothing of it is used)
                log.debug("torchtriage: the cost probe did not stop (%s)", exc)
            self._profiler = None
