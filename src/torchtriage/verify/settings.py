"""How each A/B trial runs and what counts as an effect: one value shared by ``torchtriage ab``
and the fix loop instead of a list of keywords."""

from __future__ import annotations

from dataclasses import dataclass

from torchtriage.verify import policy


@dataclass(frozen=True)
class TrialSettings:
    trials: int = 5  # processes per arm (the most, when the A/B is adaptive)
    warmup: int = 3  # steps before the measured window
    steps: int = 10  # measured steps per trial (at least)
    min_measure_s: float = policy.TRIAL_MIN_MEASURE.value  # and at least this long
    # measured steps are a whole multiple of this (a recurring stall's period: every trial
    # then measures as many stalls as the run has per step); 0: any number
    period_steps: int = 0
    timeout: float | None = None  # seconds per trial; a trial past it is recorded as timeout
    min_effect: float = policy.MIN_EFFECT.value  # the smallest speedup that counts
    # coverage of the speedup's interval (a second look at the same question asks for more)
    confidence: float = policy.CONFIDENCE.value
