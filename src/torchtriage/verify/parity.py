"""Numerical parity: does a fix leave the loss curve where it was?

The losses of the first :data:`~torchtriage.verify.policy.PARITY_STEPS` training steps of every
candidate trial are compared with the per-step median of the baseline trials. The deviation is
the largest absolute difference over the mean absolute baseline loss (robust to losses near 0).
The tolerance follows the candidate's precision; when identical baseline runs already differ,
the comparison switches to the root-mean-square difference over the steps (single steps are
then mostly noise) and the tolerance to a multiple of the baseline runs' own RMS difference,
and says so.

A knob that moves the Dataset's random draws into DataLoader workers (``reseeds_workers`` in
the knob registry: ``num_workers`` and the like) changes a seeded script's augmentation, not
its math: each worker draws from its own stream, seeded from a base seed plus its id. Its
candidate trials then run under different worker seeds (``ab`` shifts the base seed per
trial), and the RMS difference between them is the spread that a change of random streams
alone produces. The candidate is judged the same way against that multiple of it, when it
exceeds the tolerance (a Dataset that draws nothing random gives identical trials, and the
plain tolerance stands). ``Parity.reference`` says which reference was used.

torch.compile's generated code (Inductor) draws random numbers from its own stream: a compiled
step's dropout masks are not the eager step's, so a model with dropout deviates by a dropout
draw's worth at the first step whenever one arm runs compiled code the other does not (torch
.compile against eager, ``dynamic=True`` against a static graph whose recompile limit sent
frames back to eager). When a comparison fails and either arm compiled, ``ab`` runs one more
trial per arm for the first steps only with ``torch._inductor.config.fallback_random`` (compiled
code draws through eager's generator, as the eager steps do) and judges those two trials
(:func:`eager_random_parity`): a deviation that this pair does not repeat came from the random
streams, and the comparison passes with ``reference="eager_random"``; one it repeats is the
math, and the failure stands, saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from torchtriage.diagnosis.knobs import Numerics, numerics_of
from torchtriage.diagnosis.thresholds import Threshold
from torchtriage.results.ab import Parity, ParityReference, Precision
from torchtriage.verify import policy


def _largest(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.max(np.abs(x - y)))


def _rms(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x - y) ** 2)))


def precision_of(knobs: Mapping[str, Any]) -> tuple[Precision, Threshold]:
    """The numerics a set of knobs implies (the loosest the registry gives any of them), and
    the parity tolerance for it."""
    return _PRECISION[numerics_of(knobs)]


# registry numerics -> (precision, tolerance)
_PRECISION: dict[Numerics, tuple[Precision, Threshold]] = {
    "exact": ("fp32", policy.PARITY_FP32),
    "compiled": ("compiled", policy.PARITY_COMPILED),
    "tf32": ("tf32", policy.PARITY_TF32),
    "low": ("low", policy.PARITY_LOW_PRECISION),
}


def check_parity(
    baseline: Sequence[Sequence[float]],
    candidate: Sequence[Sequence[float]],
    knobs: Mapping[str, Any],
    *,
    reseeded: bool = False,
    steps: int = int(policy.PARITY_STEPS.value),
) -> Parity:
    """Compare the candidate trials' first losses with the baseline's.

    Args:
        baseline, candidate: per trial, the loss of each training step from the first.
        knobs: the candidate's knobs (they set the precision and so the tolerance).
        reseeded: the candidate trials ran under different DataLoader worker seeds (see the
            module docstring): their own spread is the reference for random-stream changes.
    """
    precision, threshold = precision_of(knobs)
    base = [np.asarray(t[:steps], dtype=np.float64) for t in baseline if len(t)]
    cand = [np.asarray(t[:steps], dtype=np.float64) for t in candidate if len(t)]
    if not base or not cand:
        return Parity(status="unchecked", precision=precision, tolerance=threshold.value,
                      detail="no losses recorded (no scalar loss.backward() seen)")
    k = min(min(t.size for t in base), min(t.size for t in cand))
    base_m = np.stack([t[:k] for t in base])
    reference = np.median(base_m, axis=0)
    scale = float(np.mean(np.abs(reference))) or 1.0
    if not np.all(np.isfinite(base_m)):
        return Parity(status="unchecked", precision=precision, tolerance=threshold.value,
                      steps_compared=k, detail="the baseline's losses are not finite")
    # the largest difference between two identical baseline runs (0 with one run)
    pairs = [(x[:k], y[:k]) for i, x in enumerate(base) for y in base[i + 1:]]
    spread = max((float(np.max(np.abs(x - y))) / scale for x, y in pairs), default=0.0)
    tolerance = threshold.value
    detail = f"{precision} tolerance {tolerance:g} ({threshold.name})"
    deviation = _largest
    judged: ParityReference = "tolerance"
    factor = policy.PARITY_NOISE_FACTOR.value
    if spread * factor > tolerance:
        # Noisy baseline: single steps are mostly noise, so compare the root-mean-square
        # difference over the steps (stable with few runs) instead of the largest one.
        deviation = _rms
        spread = max(_rms(x, y) / scale for x, y in pairs)
        tolerance = spread * factor
        judged = "baseline_runs"
        detail = (f"baseline runs differ by {spread:.2g} (RMS over {k} steps; unseeded, "
                  f"nondeterministic or under different worker seeds): candidate judged by "
                  f"its RMS difference, tolerance widened to {tolerance:.2g}")
    seeds_spread = None
    if reseeded and len(cand) >= 2:
        seed_pairs = [(x[:k], y[:k]) for i, x in enumerate(cand) for y in cand[i + 1:]]
        seeds_spread = max(_rms(x, y) / scale for x, y in seed_pairs)
        if np.isfinite(seeds_spread) and seeds_spread * factor > tolerance:
            deviation = _rms
            tolerance = seeds_spread * factor
            judged = "worker_seeds"
            detail = (f"the candidate moves the Dataset's random draws into DataLoader workers; "
                      f"its trials under different worker seeds differ by {seeds_spread:.2g} "
                      f"(RMS over {k} steps), so it is judged by its RMS difference, tolerance "
                      f"widened to {tolerance:.2g} ({policy.PARITY_NOISE_FACTOR.name} x that "
                      f"spread; {precision} tolerance {threshold.value:g} otherwise)")
    worst = max(deviation(t[:k], reference) / scale for t in cand)
    if not np.isfinite(worst):
        return Parity(status="fail", precision=precision, tolerance=tolerance,
                      baseline_spread=spread, steps_compared=k,
                      detail="the candidate's loss is not finite (diverged)")
    status = "pass" if worst <= tolerance else "fail"
    return Parity(status=status, precision=precision, tolerance=round(tolerance, 6),
                  max_deviation=round(worst, 6), baseline_spread=round(spread, 6),
                  worker_seed_spread=None if seeds_spread is None else round(seeds_spread, 6),
                  reference=judged, steps_compared=k, detail=detail)


def eager_random_parity(first: Parity, baseline: Sequence[float], candidate: Sequence[float],
                        knobs: Mapping[str, Any]) -> Parity:
    """The comparison after a failed ``first``, from one baseline and one candidate trial whose
    compiled code drew random numbers as eager PyTorch does (see the module docstring).

    Args:
        first: the failed comparison of the A/B's own trials.
        baseline, candidate: the aligned trials' losses from the first step.
        knobs: the candidate's knobs (the tolerance).

    Returns:
        A pass judged against the precision's tolerance (``reference="eager_random"``, the
        trials' own deviation kept as ``unaligned_deviation``), or ``first`` with a detail that
        says what the aligned pair showed.
    """
    aligned = check_parity([baseline], [candidate], knobs)
    if aligned.status == "unchecked" or aligned.max_deviation is None:
        return msgspec.structs.replace(first, detail=first.detail + (
            f"; the random-aligned pair could not be compared ({aligned.detail})"))
    if aligned.status == "fail":
        return msgspec.structs.replace(first, detail=first.detail + (
            f"; with compiled code drawing random numbers as eager PyTorch does "
            f"(torch._inductor.config.fallback_random) the losses still deviate "
            f"{aligned.max_deviation:.2g} over {aligned.steps_compared} steps: the math "
            "changed, not the random streams"))
    return Parity(
        status="pass", precision=aligned.precision, tolerance=aligned.tolerance,
        max_deviation=aligned.max_deviation, baseline_spread=first.baseline_spread,
        reference="eager_random", unaligned_deviation=first.max_deviation,
        steps_compared=aligned.steps_compared,
        detail=(f"the trials' losses deviate {first.max_deviation or 0:.2g} because compiled "
                f"code draws its own random numbers (dropout); with "
                f"torch._inductor.config.fallback_random, one trial per arm, they deviate "
                f"{aligned.max_deviation:.2g} over {aligned.steps_compared} steps, within "
                f"{aligned.precision} tolerance {aligned.tolerance:g}"))
