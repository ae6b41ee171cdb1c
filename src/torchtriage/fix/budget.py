"""The fix loop's wall-clock budget: what is spent, what the next trials will cost, and what
is kept for the final A/B.

The budget covers all of it: an A/B starts only when its estimated trials (the recent trials'
mean wall time, compilation included) and the final A/B's ``FINAL_FRESH`` fresh trials fit in
what is left, a profile round after a kept fix only when the first profile's time and those
trials do, and the final A/B's trials do not start past the budget's end (or, when the loop
itself ran over, past its own ``FINAL_FRESH`` trials' estimate from now).
"""

from __future__ import annotations

import statistics
import time

from torchtriage.results.run import RunRecord
from torchtriage.verify.settings import TrialSettings

COMPILE_ESTIMATE_S = 45.0  # cold torch.compile, before one has been measured
FINAL_FRESH = 2  # fresh trials the final A/B runs in any case (one per arm): kept in reserve


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()
        self.trial_s: list[float] = []  # wall time of the A/B trials run so far
        self.profile_s = 0.0  # the first profile run's wall time
        # before any trial: the first profile's start-up plus a trial's steps at its pace
        self.trial_estimate_s = 0.0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def per_trial_s(self) -> float:
        recent = self.trial_s[-8:]
        return (sum(recent) / len(recent) if recent
                else self.trial_estimate_s or self.profile_s or 10.0)

    @property
    def reserve_s(self) -> float:
        """Kept for the final A/B's fresh trials."""
        return FINAL_FRESH * self.per_trial_s

    def allows(self, trials: int, compile_s: float = 0.0) -> tuple[bool, float]:
        """Whether ``trials`` more trials fit in what is left beside the final A/B's reserve,
        and their estimate."""
        need = trials * self.per_trial_s + compile_s * trials / 2
        return self.elapsed + need + self.reserve_s <= self.seconds, need

    def allows_profile(self) -> bool:
        """Whether another profile round (as long as the first) fits beside the reserve."""
        return self.elapsed + self.profile_s + self.reserve_s <= self.seconds

    def first_profile_timeout(self, timeout: float | None) -> float:
        """The wall time the first profile run may take: the whole budget, or ``timeout``
        (``--timeout``) when that is shorter. Nothing can be tried after a first profile that
        used the budget up, so a script whose window needs longer is stopped at the budget's
        end (before: a script of 5-second steps ran a minute past ``--budget 15s``). Later
        profile rounds start only when one as long as the first fits (``allows_profile``);
        the memory ladder's rungs are not cut short by the budget."""
        return self.seconds if timeout is None else min(timeout, self.seconds)

    def final_deadline(self) -> float:
        """No trial of the final A/B starts past this (``time.monotonic()``)."""
        return max(self.start + self.seconds, time.monotonic() + self.reserve_s)


def trial_estimate(record: RunRecord | None, trial: TrialSettings) -> float:
    """Seconds an A/B trial takes, from a profile run's record: its start-up (to the first
    step's end) and its median step time over a trial's warm-up and measured steps, at least
    ``min_measure_s`` of them (the profile itself runs more steps, under the profiler: its
    wall time overstates a trial)."""
    if record is None or record.first_step_s is None or not record.host_step_ms:
        return 0.0
    step_s = statistics.median(record.host_step_ms) / 1e3
    measured_s = max(trial.steps * step_s, trial.min_measure_s)
    return record.first_step_s + trial.warmup * step_s + measured_s
