"""The A/B document (``DIR/ab.json``, schema ``torchtriage.ab/1``): trials, arms, the speedup
with its interval, and loss parity. Produced by :mod:`torchtriage.verify.ab`."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from torchtriage.document import JsonDocument
from torchtriage.results.run import KnobOutcome
from torchtriage.version import __version__

__all__ = ["ABResult", "Arm", "KnobOutcome", "Parity", "Startup", "Trial"]
SCHEMA = "torchtriage.ab/1"
# "fits": the baseline ran out of memory in every trial and the candidate completes
ABVerdict = Literal["faster", "slower", "no_change", "changes_results", "fits", "failed"]
SpeedVerdict = Literal["faster", "slower", "no_change"]
TrialStatus = Literal["ok", "failed", "timeout", "oom", "too_few_steps"]
ParityStatus = Literal["pass", "fail", "unchecked"]
ParityReference = Literal["tolerance", "baseline_runs", "worker_seeds", "eager_random"]
Precision = Literal["fp32", "compiled", "tf32", "low"]
ArmName = Literal["A", "B"]
AB_VERDICTS: tuple[str, ...] = ABVerdict.__args__
TRIAL_STATUSES: tuple[str, ...] = TrialStatus.__args__
PARITY_STATUSES: tuple[str, ...] = ParityStatus.__args__


class Parity(msgspec.Struct, kw_only=True):
    """Whether the candidate's losses stay where the baseline's are
    (see :mod:`torchtriage.verify.parity`)."""

    status: ParityStatus
    precision: Precision
    tolerance: float
    max_deviation: float | None = None  # over all candidate trials
    baseline_spread: float | None = None  # largest difference between identical baseline runs
    # RMS difference between candidate trials run under different DataLoader worker seeds
    worker_seed_spread: float | None = None
    # what the deviation was judged against: the precision's tolerance, the baseline runs'
    # own spread, or the spread of the candidate's trials under different worker seeds
    reference: ParityReference = "tolerance"
    # "eager_random": the trials' own deviation, which a pair of trials with compiled code
    # drawing random numbers as eager PyTorch does (verify.parity) did not repeat
    unaligned_deviation: float | None = None
    steps_compared: int = 0
    detail: str = ""


class Trial(msgspec.Struct, kw_only=True):
    arm: ArmName  # "A" (baseline) | "B" (candidate)
    idx: int  # 1-based within the arm
    status: TrialStatus
    returncode: int | None
    wall_s: float  # the whole process, start-up included
    step_ms: list[float] = []  # measured steps (slowest rank per step)
    mean_step_ms: float | None = None  # the measured window's wall time over its steps
    steps_per_s: float | None = None
    losses: list[float] = []  # from the first step
    warmup_end_s: float | None = None  # process start to the end of warm-up
    compile: dict[str, Any] | None = None  # what torch.compile did (seconds, graph breaks, ...)
    batch_size: int | None = None
    warmup_steps: int | None = None  # run before the measured window (a DataLoader queue adds)
    error: str | None = None
    dir: str = ""
    reused: bool = False  # measured earlier for the same configuration (fix loop)
    outlier: bool = False  # set aside from the interval (verify.stats.outlier_trial), replaced
    knobs: dict[str, KnobOutcome] = {}  # what each knob did in this trial's run


class Arm(msgspec.Struct, kw_only=True):
    label: str
    command: list[str]
    knobs: dict[str, Any]
    trials_ok: int
    mean_step_ms: float | None = None  # mean over trials of each trial's mean step time
    steps_per_s: float | None = None  # median over trials of each trial's throughput
    samples_per_s: float | None = None
    warmup_end_s: float | None = None


class Startup(msgspec.Struct, kw_only=True):
    """One-off cost of the candidate (compilation, autotuning, worker start-up)."""

    extra_s: float  # B's median time to the end of warm-up minus A's
    compile_s: float | None = None  # what torch.compile itself reported, when it ran
    break_even_steps: int | None = None  # steps until the per-step saving pays extra_s back


class ABResult(JsonDocument, msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    tool_version: str = __version__
    summary: str
    verdict: ABVerdict  # the answer (a fix that changes results is no win)
    speed_verdict: SpeedVerdict | None  # from the interval alone
    speedup: float | None  # A's mean step time over B's (B's throughput over A's)
    ci_low: float | None
    ci_high: float | None
    confidence: float
    min_effect: float
    parity: Parity
    a: Arm
    b: Arm
    startup: Startup | None
    knobs: dict[str, KnobOutcome]  # what each candidate knob did (from B's trials)
    baseline_knobs: dict[str, Any] = {}  # knobs both arms ran with
    trials_per_arm: int
    warmup: int
    steps: int  # measured steps asked per trial
    # the fewest a completed trial measured: fewer than ``steps`` when the script ends sooner,
    # more when a fast step ran on to trial_min_measure_s
    steps_measured: int | None = None
    trials: list[Trial]
    outlier_trials: list[str] = []  # "A3": set aside from the arms' figures and the interval
    # why the trials measured earlier (``prior``) were set aside (reused_trial_drift), or None
    reused_set_aside: str | None = None
    out: str
    store_id: int | None = None

    def headline(self) -> str:
        """One line for ``torchtriage history``."""
        if self.speedup is None:
            return self.summary
        return (f"{self.verdict} {self.speedup:.2f}x [{self.ci_low:.2f}-{self.ci_high:.2f}], "
                f"parity {self.parity.status}")
