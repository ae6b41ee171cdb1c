"""The defaults verification decides with, each with where it comes from.

They use the same :class:`~torchtriage.diagnosis.thresholds.Threshold` record as the diagnosis
rules, so docs/thresholds.md lists both from one kind of object.
"""

from __future__ import annotations

from torchtriage.diagnosis.thresholds import Threshold

CONFIDENCE = Threshold(
    "ab_confidence", 0.95, "probability",
    "coverage of the bootstrap confidence interval around a speedup",
    "the conventional 95 % interval (Efron & Tibshirani, An Introduction to the Bootstrap)",
)
BOOTSTRAP_RESAMPLES = Threshold(
    "bootstrap_resamples", 4000, "resamples",
    "resamples of the (hierarchical) percentile bootstrap",
    "Efron & Tibshirani: 1,000-2,000 for percentile intervals; doubled so that repeated "
    "verdicts on the same data do not flicker",
)
MIN_EFFECT = Threshold(
    "min_effect", 0.02, "fraction of step time",
    "a speedup counts as `faster` only when the whole interval lies above 1 + this (`slower` "
    "below 1 / (1 + this)); anything else is `no_change`",
    "torchtriage default: a margin for what the interval cannot see (drift within one ABBA "
    "block); the interval itself carries the trial noise, which is 1-2 % for I/O-bound and "
    "up to 10 % for CPU-bound trials on a shared 2-core machine (benchmarks/ab_noise.py)",
)
TRIAL_MIN_MEASURE = Threshold(
    "trial_min_measure_s", 1.0, "seconds",
    "an A/B trial measures at least `--steps` steps and at least this long: a single-process "
    "trial whose steps are fast runs on for as many more steps as its pace says it needs "
    "(at most 2,000)",
    "torchtriage default: 10 steps of a 12 ms GPU step are 0.12 s, where one 10 ms hiccup is "
    "8 %; on an H200 the no-op optimizer.fused A/B of such a job spanned 0.78-1.55x",
)
PARITY_STEPS = Threshold(
    "parity_steps", 10, "steps",
    "losses of the first this-many training steps are compared for numerical parity",
    "torchtriage default: long enough to see a diverging optimiser, short enough for every "
    "trial to cover it",
)
PARITY_FP32 = Threshold(
    "parity_fp32", 1e-3, "relative deviation",
    "largest allowed loss deviation (over the mean |loss|) for fixes that keep fp32 math: "
    "data loading, optimizer implementation, DDP buckets",
    "fp32 reductions reordered by a different bucket or kernel differ by ~1e-6 relative; "
    "1e-3 leaves room for the compounding of 10 steps",
)
PARITY_COMPILED = Threshold(
    "parity_compiled", 5e-3, "relative deviation",
    "the same for torch.compile, which fuses and reorders fp32 math",
    "PyTorch's own compile accuracy checks compare with rtol 1e-3..1e-2 (torch._dynamo "
    "same_two_models / inductor tolerances)",
)
PARITY_TF32 = Threshold(
    "parity_tf32", 1e-2, "relative deviation",
    "the same for TF32 matmuls (10-bit mantissa inputs)",
    "TF32 keeps ~3 decimal digits per product (NVIDIA A100 TF32 notes); losses drift "
    "~1e-3 relative",
)
PARITY_LOW_PRECISION = Threshold(
    "parity_low_precision", 5e-2, "relative deviation",
    "the same for bf16/fp16 autocast or a bf16/fp16 gradient-compression hook",
    "bf16 keeps ~2-3 decimal digits (8-bit mantissa); mixed-precision training papers report "
    "loss curves within a few per cent of fp32",
)
PARITY_NOISE_FACTOR = Threshold(
    "parity_noise_factor", 3.0, "x baseline spread",
    "when identical baseline runs already differ by more than the tolerance over this (an "
    "unseeded script), candidates are judged by their RMS difference over the steps against "
    "this multiple of the baseline runs' own RMS difference",
    "torchtriage default: three times the observed spread of identical runs",
)
OUTLIER_Z = Threshold(
    "outlier_modified_z", 3.5, "robust z",
    "a step whose log step time lies further than this many robust standard deviations "
    "(1.4826 x the median absolute deviation) from the side's median is an outlier: reported, "
    "and left out of the step-time statistic of `compare`",
    "Iglewicz & Hoaglin (1993), How to Detect and Handle Outliers: modified z-score > 3.5",
)
OUTLIER_SCALE_FLOOR = Threshold(
    "outlier_scale_floor", 0.02, "fraction of step time",
    "the robust standard deviation is taken as at least this fraction of the median step (so "
    "that identical steps do not make a 1 % wobble an outlier)",
    "torchtriage default: below the step-to-step noise of a steady training loop",
)
OUTLIER_MAX_SHARE = Threshold(
    "outlier_max_share", 0.25, "share of steps",
    "at most this share of a side's steps may be set aside as outliers; when more would be, "
    "none is (the steps are bimodal, not contaminated)",
    "torchtriage default: below the 29 % breakdown point of the median of pairwise means, "
    "so what is left still decides",
)
OUTLIER_TRIAL_RATIO = Threshold(
    "outlier_trial_ratio", 1.5, "x step time",
    "an A/B trial whose mean step is slower by more than this factor than the median of its "
    "arm's other trials (at least two), while those others agree among themselves (see "
    "`outlier_trial_spread`), is an outlier trial: reported, left out of the interval, and "
    "replaced by one more trial of its arm; at most one per arm",
    "torchtriage default: trial noise on a shared 2-core machine is up to 10 % "
    "(benchmarks/ab_noise.py); a trial 50 % off its agreeing siblings was disturbed (another "
    "job, a cold cache), as seen when a second test session loaded the CI machine",
)
OUTLIER_TRIAL_SPREAD = Threshold(
    "outlier_trial_spread", 4.0, "x the others' spread",
    "the outlier trial's log distance from the others' median must also exceed this multiple "
    "of the largest log distance among the others (they agree; it does not)",
    "torchtriage default: the leave-one-out form of the modified z-score (Iglewicz & Hoaglin) "
    "for the 3-5 trials an arm has, where a MAD is too coarse",
)

REUSED_DRIFT = Threshold(
    "reused_trial_drift", 0.10, "fraction of step time",
    "an A/B that starts from trials measured earlier (fix's final A/B reuses the original's and "
    "the kept configuration's) sets them all aside when an arm's first fresh trial lies more "
    "than this outside the range of that arm's earlier trials: the machine's load changed "
    "since, and earlier trials of one arm against later ones of the other would measure the "
    "load, not the fix; the A/B then runs fresh trials only, as its deadline allows",
    "torchtriage default: the trial noise of CPU-bound trials on a shared 2-core machine, up "
    "to 10 % (benchmarks/ab_noise.py), so that noise alone rarely trips it",
)

ALL: tuple[Threshold, ...] = (
    CONFIDENCE,
    BOOTSTRAP_RESAMPLES,
    MIN_EFFECT,
    TRIAL_MIN_MEASURE,
    PARITY_STEPS,
    PARITY_FP32,
    PARITY_COMPILED,
    PARITY_TF32,
    PARITY_LOW_PRECISION,
    PARITY_NOISE_FACTOR,
    OUTLIER_Z,
    OUTLIER_SCALE_FLOOR,
    OUTLIER_MAX_SHARE,
    OUTLIER_TRIAL_RATIO,
    OUTLIER_TRIAL_SPREAD,
    REUSED_DRIFT,
)
