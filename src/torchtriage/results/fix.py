"""The ``fix`` document (``DIR/fix.json``, schema ``torchtriage.fix/1``)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from torchtriage.diagnosis.result import OutOfMemory
from torchtriage.document import JsonDocument
from torchtriage.results.ab import ABVerdict
from torchtriage.version import __version__

SCHEMA = "torchtriage.fix/1"
# What happened to each thing the loop considered.
StepResult = Literal["kept", "dropped", "failed", "skipped", "not_injectable",
                     "not_applicable", "fits", "does_not_fit"]
STEP_RESULTS: tuple[str, ...] = StepResult.__args__


class Attempt(msgspec.Struct, kw_only=True):
    """One knob value tried against the best configuration so far."""

    value: Any
    verdict: ABVerdict | Literal["fits", "does_not_fit"]  # "fits": the memory ladder
    speedup: float | None = None  # over the configuration it was tried against
    ci_low: float | None = None
    ci_high: float | None = None
    parity: str = "unchecked"
    trials: int = 0  # fresh trials run for it
    seconds: float = 0.0
    peak_fraction: float | None = None  # memory ladder: peak memory / capacity
    compile: dict[str, Any] | None = None  # compile time, graph breaks, recompiles
    note: str = ""
    ab_dir: str | None = None


class FixStep(msgspec.Struct, kw_only=True):
    """One prescription of the bottleneck layer: what was tried and why it was kept or not."""

    round: int  # profile round (0: the original configuration)
    layer: str
    prescription: str
    knob: str | None
    result: StepResult
    why: str
    kept_value: Any = None
    attempts: list[Attempt] = []


class Profiled(msgspec.Struct, kw_only=True):
    """A profile round: the diagnosis of the configuration at that point."""

    round: int
    knobs: dict[str, Any]
    primary: str
    confidence: str
    median_step_ms: float
    summary: str
    peak_fraction: float | None = None
    run_dir: str = ""
    # the mean step of this configuration's first baseline trials (unprofiled, measured later
    # in the run), and whether the profile's window agreed with it (see fix.loop's docstring)
    trials_step_ms: float | None = None
    window_agrees: bool | None = None


class FixResult(JsonDocument, msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    tool_version: str = __version__
    summary: str
    command: list[str]
    kept: list[dict[str, Any]]  # [{"knob": id, "value": v}] in the order they were kept
    speedup: float | None  # final configuration over the original (A/B of the two)
    ci_low: float | None
    ci_high: float | None
    verdict: ABVerdict | None  # of that final A/B
    original_steps_per_s: float | None = None
    final_steps_per_s: float | None = None  # an original that ran out: the kept one's profile
    original_out_of_memory: OutOfMemory | None = None  # the original ran out of memory
    steps: list[FixStep]
    rounds: list[Profiled]
    stopped_because: str
    budget_s: float
    elapsed_s: float
    trials_run: int
    patch_file: str | None = None
    patch_files: list[str] = []
    instructions: list[str] = []  # changes the patch cannot express, as lines to add
    out: str = ""
    store_id: int | None = None

    def headline(self) -> str:
        kept = ", ".join(f"{k['knob']}={k['value']}" for k in self.kept) or "nothing kept"
        if self.speedup is None:
            return kept
        return f"{kept}: {self.speedup:.2f}x [{self.ci_low:.2f}-{self.ci_high:.2f}]"
