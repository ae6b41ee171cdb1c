"""Speedups with confidence intervals, and the verdict they support.

Two statistics, each with the percentile bootstrap that fits it:

- ``"mean"`` (A/B trials): each trial's mean step time (its measured window over its steps, the
  inverse of its throughput), averaged over trials. The trial is the unit of replication and
  only trials are resampled: steps inside a trial are not independent (with two DataLoader
  workers, fast and slow steps alternate; a CUDA queue smooths steps into each other), so
  resampling them would invent noise the window mean does not have. A handful of trials is
  too few for the plain percentile bootstrap, which is then far too narrow (measured here: a
  no-op knob came out "significant" on 3 trials per arm). Two standard small-sample repairs
  make it honest: each resample draws n - 1 of the n trials (so the spread of resampled means
  estimates the variance without the 1/n bias), and the interval is widened on the log scale
  by the Student-t quantile over the normal one, with Welch's degrees of freedom.
  A trial disturbed from outside is set apart by :func:`outlier_trial` (leave-one-out, against
  its arm's agreeing siblings) before the interval; the caller replaces and reports it.
- ``"median"`` (trace comparisons): the pooled median step time, robust to an odd step. Trials,
  then steps within each resampled trial, are resampled (a two-level bootstrap); with a single
  trace per side that is the ordinary bootstrap over steps. With few steps a bootstrap
  resample is often made mostly of one slow step (with 5 steps, a resample holds the same
  step 3 or more times about 6 % of the time), so the interval of the median is only as robust
  as the steps: :func:`outliers` sets transient steps apart first (a robust z-score on log step
  times, see the ``outlier_*`` thresholds), and the caller reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from torchtriage.verify import policy

VERDICTS = ("faster", "slower", "no_change")


@dataclass(frozen=True)
class Speedup:
    """``a`` over ``b`` in step time: above 1 means B is faster."""

    speedup: float
    ci_low: float
    ci_high: float
    a_ms: float  # the statistic's value on each side
    b_ms: float
    statistic: str  # "median" | "mean"
    confidence: float


def speedup_interval(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    *,
    confidence: float = policy.CONFIDENCE.value,
    resamples: int = int(policy.BOOTSTRAP_RESAMPLES.value),
    seed: int = 0,
    statistic: str = "median",
) -> Speedup:
    """The speedup of B over A (A's step-time statistic over B's) with its bootstrap interval.

    Args:
        a, b: per trial, the measured step times (ms). Empty trials are ignored.
        statistic: ``"median"`` or ``"mean"`` (see the module docstring).
    """
    ta, tb = _trials(a, "A"), _trials(b, "B")
    rng = np.random.default_rng(seed)
    stat_a = _resampled(ta, resamples, rng, statistic)
    stat_b = _resampled(tb, resamples, rng, statistic)
    ratios = stat_a / stat_b
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    a_ms, b_ms = _statistic(ta, statistic), _statistic(tb, statistic)
    if statistic == "mean":
        centre = np.log(a_ms / b_ms)
        widen = _t_over_z(_welch_df(ta, tb), confidence)
        low = float(np.exp(centre - (centre - np.log(low)) * widen))
        high = float(np.exp(centre + (np.log(high) - centre) * widen))
    return Speedup(speedup=a_ms / b_ms, ci_low=float(low), ci_high=float(high),
                   a_ms=a_ms, b_ms=b_ms, statistic=statistic, confidence=confidence)


def outliers(step_ms: Sequence[float]) -> np.ndarray:
    """Mask of outlier steps: ``|log t - median| / scale > OUTLIER_Z`` with ``scale`` =
    1.4826 x the median absolute deviation of log t (at least OUTLIER_SCALE_FLOOR); all False
    when more than OUTLIER_MAX_SHARE of the steps would be outliers."""
    x = np.log(np.asarray(step_ms, dtype=np.float64))
    if x.size < 3 or not np.all(np.isfinite(x)):
        return np.zeros(x.size, dtype=bool)
    centre = np.median(x)
    scale = max(1.4826 * float(np.median(np.abs(x - centre))),
                float(np.log1p(policy.OUTLIER_SCALE_FLOOR.value)))
    mask = np.abs(x - centre) / scale > policy.OUTLIER_Z.value
    if mask.sum() > policy.OUTLIER_MAX_SHARE.value * x.size:
        return np.zeros(x.size, dtype=bool)
    return mask


def outlier_trial(means_ms: Sequence[float]) -> int | None:
    """Index of the one outlier trial among an arm's trial means, or None.

    Leave-one-out: trial i is the outlier when it is *slower* than the median of the others,
    by ``d_i = log(t_i / median(others))`` over ``log(OUTLIER_TRIAL_RATIO)`` and over
    ``OUTLIER_TRIAL_SPREAD`` x the largest ``|d_j|`` of the others against that same median; of
    several such trials, the farthest. Only a slower trial: disturbances (another job, a cold
    cache, swapping) slow a process down, so a trial far *faster* than its siblings means the
    siblings were the disturbed ones, and none is set aside (the interval stays wide). Needs
    at least three trials (two that agree to judge the third by)."""
    t = np.log(np.asarray(means_ms, dtype=float))
    if t.size < 3:
        return None
    best, best_d = None, 0.0
    for i in range(t.size):
        others = np.delete(t, i)
        centre = float(np.median(others))
        d = float(t[i]) - centre  # > 0: slower than the others
        spread = float(np.max(np.abs(others - centre)))
        if (d > np.log(policy.OUTLIER_TRIAL_RATIO.value)
                and d > policy.OUTLIER_TRIAL_SPREAD.value * spread and d > best_d):
            best, best_d = i, d
    return best


def verdict(s: Speedup, min_effect: float = policy.MIN_EFFECT.value) -> str:
    """``faster`` / ``slower`` only when the whole interval clears the minimum effect."""
    if s.ci_low > 1 + min_effect:
        return "faster"
    if s.ci_high < 1 / (1 + min_effect):
        return "slower"
    return "no_change"


def _trials(trials: Sequence[Sequence[float]], arm: str) -> list[np.ndarray]:
    out = [np.asarray(t, dtype=np.float64) for t in trials if len(t)]
    if not out:
        raise ValueError(f"no measured steps for {arm}")
    return out


def _welch_df(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Welch-Satterthwaite degrees of freedom of the difference of the arms' log trial means."""
    la = np.log([t.mean() for t in a])
    lb = np.log([t.mean() for t in b])
    if la.size < 2 or lb.size < 2:
        return 1.0
    va, vb = la.var(ddof=1) / la.size, lb.var(ddof=1) / lb.size
    if va + vb == 0:
        return float(la.size + lb.size - 2)
    return float((va + vb) ** 2 / (va**2 / (la.size - 1) + vb**2 / (lb.size - 1)))


_T95 = {1.0: 12.706, 2.0: 4.303, 3.0: 3.182}  # exact two-sided 95 % t quantiles


def _t_over_z(df: float, confidence: float) -> float:
    """Student-t quantile over the normal quantile: exact 95 % values below 3 degrees of
    freedom (interpolated in 1/df), else the Cornish-Fisher series in 1/df (within 1 %)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    df = max(df, 1.0)
    if df < 3 and abs(confidence - 0.95) < 1e-9:
        lo, hi = (1.0, 2.0) if df < 2 else (2.0, 3.0)
        w = (1 / df - 1 / hi) / (1 / lo - 1 / hi)
        return (w * _T95[lo] + (1 - w) * _T95[hi]) / z
    t = (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
         + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))
    return t / z


def _statistic(trials: list[np.ndarray], statistic: str) -> float:
    if statistic == "mean":
        return float(np.mean([t.mean() for t in trials]))
    return float(np.median(np.concatenate(trials)))


def _resampled(trials: list[np.ndarray], resamples: int, rng: np.random.Generator,
               statistic: str) -> np.ndarray:
    """The statistic over ``resamples`` bootstrap samples (see the module docstring)."""
    n_trials = len(trials)
    picked = rng.integers(0, n_trials, size=(resamples, n_trials))  # trials
    if statistic == "mean":
        means = np.array([t.mean() for t in trials])
        draw = max(n_trials - 1, 1)  # n - 1 of n: the unbiased spread of a mean
        return means[picked[:, :draw]].mean(axis=1)
    lengths = np.array([t.size for t in trials])
    width = int(lengths.max())
    table = np.full((n_trials, width), np.nan)
    for i, t in enumerate(trials):
        table[i, : t.size] = t
    picked_len = lengths[picked]  # [R, T]
    steps = (rng.random((resamples, n_trials, width)) * picked_len[..., None]).astype(np.int64)
    values = table[picked[..., None], steps]  # [R, T, W]
    values[np.arange(width)[None, None, :] >= picked_len[..., None]] = np.nan
    return np.nanmedian(values.reshape(resamples, -1), axis=1)
