"""The process boundary of ``torchtriage run``, typed: what goes into the training process
(:class:`RunConfig`, JSON in the ``TORCHTRIAGE_RUN`` environment variable) and what comes back
(:class:`RunRecord`, ``run.rank<N>.json`` or ``run.json``, schema ``torchtriage.run/1``), with
the knob outcomes it carries and the profiler schedule shared by every profiling path."""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

from torchtriage.diagnosis.result import MachineInfo, OutOfMemory, StepTimeline, WindowCheck
from torchtriage.document import JsonDocument

SCHEMA = "torchtriage.run/1"
CONFIG_SCHEMA = "torchtriage.run-config/1"
RunMode = Literal["profile", "time"]
# written by the bootstrap once a window is profiled and checked (profile mode), so that the
# parent can diagnose it while the script trains on: a WindowMarker, as JSON
WINDOW_MARKER = "window.rank{rank}.json"


class WindowMarker(msgspec.Struct, kw_only=True):
    """What the parent needs to diagnose a window while the script trains on
    (:data:`WINDOW_MARKER`): the window checks, and the training process's CPU facts without
    samples (``capture.machine.cpu_facts``: its cores, torch's CPU capability, native bf16),
    read there because the parent does not import torch."""

    checks: list[WindowCheck]
    machine: MachineInfo | None = None


class Schedule(msgspec.Struct, kw_only=True, frozen=True):
    """The profiler schedule: ``wait`` steps unprofiled, then ``warmup`` + ``active`` steps
    recorded. The one place its default (1/2/5) is written down."""

    wait: int = 1
    warmup: int = 2
    active: int = 5

    @property
    def steps(self) -> int:
        """Steps up to the last recorded one (the schedule's whole length)."""
        return self.wait + self.warmup + self.active


class ProfileCost(msgspec.Struct, kw_only=True):
    """What the profiling cost guard estimated from one probed step before the window
    recorded anything, and what it did (``torchtriage.profile`` and profile mode)."""

    events_per_step: int  # profiler events of the probed (last unprofiled) step
    budget: int  # events a window may record (thresholds.PROFILE_EVENTS_BUDGET)
    planned_steps: int  # warm-up + active steps asked for
    # steps the trace holds after the guard: warm-up + active, less the first warm-up step,
    # which only prepares tracing (it follows the probed step)
    recorded_steps: int
    estimated_events: int  # events_per_step x recorded_steps
    # estimated_events x thresholds.PROFILE_EXPORT_US_PER_EVENT (PER_OP_EVENT: ops only)
    estimated_export_s: float
    # recording options turned off: "record_shapes", "with_stack", "profile_memory"
    dropped: list[str] = []
    # the window's profiler memory (estimated_events x thresholds.PROFILE_BYTES_PER_EVENT) and
    # what it may take (thresholds.PROFILE_MEMORY_SHARE of the memory limit); 0: not assessed
    estimated_bytes: int = 0
    memory_allowed_bytes: int = 0
    # the one active step was stopped this many seconds in (capture/cost_guard.py; 0: whole)
    slice_s: float = 0.0
    # the probe was stopped part-way through its step (the process had grown by the memory
    # share): events_per_step is a lower bound
    probe_cut: bool = False
    action: str  # one line: what the guard did, or "none"


class RunConfig(JsonDocument, msgspec.Struct, kw_only=True):
    """What the parent tells the bootstrap (``TORCHTRIAGE_RUN``)."""

    schema: str = CONFIG_SCHEMA
    out: str  # the run directory (absolute once the runner resolved it)
    knobs: dict[str, Any] = {}
    max_steps: int | None = None  # stop the script cleanly after this many steps
    skip: int = 0  # steps before profiling starts
    device_memory: int | None = None  # capacity for the memory rule, bytes
    mode: RunMode = "profile"  # "time": no profiler, step times only (A/B trials)
    timing_warmup: int = 0  # timing mode: steps before the measured window
    # timing mode: measure past max_steps until the window lasted this long (one process)
    timing_min_s: float = 0.0
    # added to every DataLoader iterator's worker base seed (each worker seeds base + its id):
    # A/B trials of a knob that moves random draws into workers measure the spread this causes
    worker_seed_offset: int = 0
    # A/B parity trials: torch.compile draws random numbers (dropout) as eager PyTorch does
    # (torch._inductor.config.fallback_random), so that compiled and eager losses compare
    eager_random: bool = False
    # timing mode: the measured steps are a whole multiple of this (0: any number)
    timing_period: int = 0
    # profile mode with stop_after_window: run at least this many steps before stopping, so
    # that the step timeline sees the run's memory growth and recurring stalls
    observe_steps: int = 0
    # record the whole run's step timeline (False: only the control arm of
    # benchmarks/whole_run.py's overhead measurement)
    timeline: bool = True
    # profile mode: stop the script once the (final) window is profiled and checked
    stop_after_window: bool = False
    # profile mode: the cost guard's budget of recorded events (None: the default,
    # thresholds.PROFILE_EVENTS_BUDGET; 0: no guard)
    max_events: int | None = None
    schedule: Schedule = msgspec.field(default_factory=Schedule)


class KnobOutcome(msgspec.Struct, kw_only=True):
    """What one knob did in a run (merged over ranks and trials by the readers)."""

    value: Any
    applied: bool
    detail: str
    count: int = 0  # times the knob's hook ran
    where: list[str] = []  # the user's ``file:line`` calls it changed (for the fix patch)


class StepTime(msgspec.Struct):
    step: int
    user_ms: float


class ProfilerStepTime(msgspec.Struct):
    step: int
    ms: float


class LossPoint(msgspec.Struct):
    step: int
    loss: float | None  # None: not finite (JSON has no NaN; a diverged run writes null)


class RunRecord(JsonDocument, msgspec.Struct, kw_only=True):
    """One process's run record. The profiling session writes the first block; the zero-code
    bootstrap adds the second (both optional: a record may come from either alone)."""

    schema: str = SCHEMA
    # --- the profiling session (torchtriage.profile and profile mode)
    created: str | None = None
    argv: list[str] = []
    python: str | None = None
    torch: str | None = None
    host: str | None = None
    schedule: Schedule | None = None
    record_shapes: bool | None = None
    profile_memory: bool | None = None
    device_memory: int | None = None
    steps_run: int | None = None
    profile_cost: ProfileCost | None = None  # the cost guard's estimate and action
    step_ms: list[StepTime] = []
    profiler_step_ms: list[ProfilerStepTime] = []
    trace: str | None = None  # the trace file's name, in the same directory
    oom: bool = False
    error: str | None = None
    # --- the bootstrap (torchtriage run, A/B trials)
    rank: int = 0
    world_size: int = 1
    steps_detected: int = 0
    step_detection: str | None = None
    host_step_ms: list[float] = []  # step i+1's end minus step i's, host clock
    losses: list[LossPoint] = []
    batch_sizes: list[int] = []
    knobs: dict[str, KnobOutcome] = {}
    mode: RunMode | None = None
    first_step_s: float | None = None  # bootstrap start to the first step's end
    warmup_end_s: float | None = None  # bootstrap start to the warm-up's end (timing mode)
    compile: dict[str, Any] | None = None  # what torch.compile did
    machine: dict[str, Any] | None = None  # machine samples (CPU, memory) while it ran
    exit_exception: str | None = None  # how the script failed, when it did
    out_of_memory: OutOfMemory | None = None  # the script ran out of memory: what it said
    # profile mode: each profiled window and whether it was steady state (the last is current)
    windows: list[WindowCheck] = []
    # timing mode: the warm-up steps actually run before the measured window (the requested
    # warm-up plus a DataLoader queue to drain)
    warmup_steps: int | None = None
    loader_queue: int = 0  # the most batches a DataLoader had in flight
    loader_workers: int = 0  # the most worker processes a DataLoader used
    loader_batches: int = 0  # batches fetched from any DataLoader
    # every step of the run: its end, memory at its boundary, what happened inside steps
    timeline: StepTimeline | None = None

    @property
    def loss_values(self) -> list[float]:
        """The losses in step order, NaN where the run's loss was not finite."""
        return [math.nan if x.loss is None else x.loss for x in self.losses]


def decode_record(data: bytes | str) -> RunRecord:
    return msgspec.json.decode(data, type=RunRecord)


def decode_config(data: bytes | str) -> RunConfig:
    return msgspec.json.decode(data, type=RunConfig)


def merge_knob_outcomes(logs: list[dict[str, KnobOutcome]]) -> dict[str, KnobOutcome]:
    """Knob outcomes merged over runs (ranks, trials): applied anywhere counts as applied, with
    that outcome's detail; the call sites each changed (``where``) are united."""
    merged: dict[str, KnobOutcome] = {}
    for log in logs:
        for knob, entry in log.items():
            have = merged.get(knob)
            if have is None or (entry.applied and not have.applied):
                have = merged[knob] = msgspec.structs.replace(
                    entry, where=list(have.where) if have else [])
            for site in entry.where:
                if site not in have.where:
                    have.where.append(site)
    return merged
