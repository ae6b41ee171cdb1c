"""The diagnosis document: typed, versioned, and the same object behind every output.

``Diagnosis`` is what ``torchtriage.profile`` gives back, what ``analyze --json`` prints and what
the reports render. The JSON schema id is :data:`SCHEMA`; fields are only ever added within a
schema version, never renamed or removed.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from torchtriage.diagnosis.gpu_result import GpuReport
from torchtriage.diagnosis.vocabulary import (
    Confidence,
    DataQualityAction,
    DataQualityKind,
    GrowthCause,
    Layer,
    MemorySource,
    PrimaryRuleBranch,
    RunEventKind,
    Severity,
    StallCause,
    TraceMode,
)
from torchtriage.document import JsonDocument

SCHEMA = "torchtriage.diagnosis/1"


class Evidence(msgspec.Struct, kw_only=True):
    """One number behind a verdict, and the threshold it was held against (if any)."""

    metric: str
    value: float
    unit: str = ""
    threshold: float | None = None
    comparison: str | None = None  # ">=", "<", ...: how value was compared with threshold
    fired: bool | None = None  # whether the comparison held
    source: str | None = None  # where the threshold's default comes from


class PrimaryRule(msgspec.Struct, kw_only=True):
    """Why ``primary`` is the primary layer, although another may hold a larger share: the
    branch of the selection rule that decided it (``rule``), the rule as applied to this trace
    in one line (``reason``, naming each threshold with its value) and the comparisons it made
    (``evidence``, each with its threshold and source)."""

    rule: PrimaryRuleBranch
    reason: str
    evidence: list[Evidence] = []


class LayerResult(msgspec.Struct, kw_only=True):
    share: float  # share of analysed step time attributed to the layer (0 for memory)
    time_ms: float
    evidence: list[Evidence] = []


class StepTimes(msgspec.Struct, kw_only=True):
    step: int
    wall_ms: float
    exposed_ms: dict[str, float]


class Breakdown(msgspec.Struct, kw_only=True):
    """Exposed time per category; each step's categories sum to its wall time."""

    mode: TraceMode  # which category list applies
    categories: list[str]  # priority order
    wall_ms: float
    exposed_ms: dict[str, float]
    share: dict[str, float]
    steps: list[StepTimes]
    median_step_ms: float


class Finding(msgspec.Struct, kw_only=True):
    id: str
    severity: Severity
    message: str
    layer: Layer | None = None
    evidence: list[Evidence] = []


class Prescription(msgspec.Struct, kw_only=True):
    id: str
    layer: Layer
    cost: int  # 1 (a flag) .. 5 (engineering); the list is ordered by layer, then cost
    cost_label: str
    title: str
    code: str
    expected_gain: str
    verify: str
    reason: str


class OpRow(msgspec.Struct, kw_only=True):
    name: str
    count: int
    total_ms: float
    self_ms: float
    share: float


class MemoryPeak(msgspec.Struct, kw_only=True):
    device: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    baseline_bytes: int = 0  # CPU: tensors alive when recording began, included in the peak
    # CPU: frees the profiler did not see (other threads'), when over 1 MiB: the peak is then
    # taken step by step at steady state (analysis/memory.py); else 0
    unseen_free_bytes: int = 0
    capacity_bytes: int | None = None
    capacity_source: str | None = None  # "deviceProperties" | "--device-memory"
    peak_fraction: float | None = None

    @property
    def unseen_frees_note(self) -> str | None:
        """What the views say when frees were missed, or None."""
        if not self.unseen_free_bytes:
            return None
        return (f"{self.device}: {self.unseen_free_bytes / 2**20:,.1f} MiB freed where the "
                "profiler does not record (another thread), so the peak is each step's own "
                "rise on what was alive after the window")


class DynamicShape(msgspec.Struct, kw_only=True):
    op: str
    steps_seen: int
    distinct_signatures: int
    examples: list[str]


class MachineInfo(msgspec.Struct, kw_only=True):
    """Machine samples taken while the script ran (``torchtriage run`` only)."""

    samples: int
    cores: int
    cpu_busy_mean: float  # mean busy fraction over all cores
    cpu_busy_per_core: list[float]
    rss_max_bytes: int
    child_processes: int  # DataLoader workers, compile workers, ...
    children_cpu_cores_mean: float  # cores' worth of CPU used by child processes
    gpu_util_mean: float | None = None
    gpu_mem_max_bytes: int | None = None
    # the job's own CPU use: its process group's processes (the training process, DataLoader
    # workers; under torchrun the agent and every rank), in cores' worth
    job_cpu_cores_mean: float | None = None
    job_processes: int | None = None  # most of them seen at once
    cores_available: float | None = None  # cores the job may use: affinity, cgroup quota
    cores_available_source: str | None = None  # "affinity" | "cgroup cpu.max" | ...
    cpu_capability: str | None = None  # torch.backends.cpu.get_cpu_capability()
    cpu_bf16: list[str] | None = None  # native bf16 instruction sets found (None: unknown)
    # what the CPU and GPU means are over: the profiled steps ("window", when they hold enough
    # samples) or the whole run ("run"); maxima are always the whole run's
    samples_scope: Literal["window", "run"] = "run"

    @property
    def job_cores(self) -> float:
        """The cores the job may use: its affinity or cgroup quota, else every core."""
        return self.cores_available or self.cores


class CollectiveRow(msgspec.Struct, kw_only=True):
    """One collective op in the analysed steps (see analysis/collectives.py)."""

    op: str
    source: str  # "nccl kernel" | "gloo" | "record_param_comms"
    count: int
    per_step: float
    time_ms: float
    mean_ms: float
    bytes_per_call: float | None = None
    group_size: int | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None


class ShardingInfo(msgspec.Struct, kw_only=True):
    """FSDP in the trace (see analysis/sharding.py)."""

    kind: str  # "fsdp2" (fully_shard) | "fsdp1" (FullyShardedDataParallel)
    units: int  # sharded modules
    all_gathers_per_step: float | None = None
    all_gather_ms: float = 0.0  # all-gather work within the analysed steps
    all_gather_hidden: float | None = None  # share of it hidden behind compute

    def describe(self) -> str:
        """One line: which FSDP, its units, its all-gathers and how much of them is hidden."""
        api = "fully_shard" if self.kind == "fsdp2" else "FullyShardedDataParallel"
        parts = [f"{self.kind.upper()} ({api}), {self.units} sharded units"]
        if self.all_gathers_per_step is not None:
            parts.append(f"{self.all_gathers_per_step:g} all-gathers per step "
                         f"({self.all_gathers_per_step / max(self.units, 1):.2g} per unit)")
        if self.all_gather_hidden is not None:
            parts.append(f"{self.all_gather_hidden:.0%} of {self.all_gather_ms:,.1f} ms of "
                         "all-gather time hidden behind compute")
        return "; ".join(parts)


class TraceInfo(msgspec.Struct, kw_only=True):
    path: str
    mode: TraceMode
    events: int
    devices: list[str] = []
    rank: int | None = None
    world_size: int | None = None
    step_source: str = "profiler_step"
    steps_analyzed: list[int] = []
    steps_excluded: dict[str, str] = {}


class OutOfMemory(msgspec.Struct, kw_only=True):
    """An out-of-memory error as the run saw it: the error's own figures (CUDA writes them into
    its message) and the allocator's, and how far training got."""

    message: str  # the error as raised (first 1,000 characters)
    step: int  # the training step it happened in: completed optimizer steps + 1
    device: str | None = None  # "cuda:0"; None when unknown (a CPU job)
    requested_bytes: int | None = None  # "Tried to allocate ..."
    capacity_bytes: int | None = None  # "total capacity of ..."
    free_bytes: int | None = None  # "... of which ... is free"
    allocated_bytes: int | None = None  # "... is allocated by PyTorch"
    reserved_unallocated_bytes: int | None = None  # "... reserved by PyTorch but unallocated"
    # the highest allocated memory so far at the end of each completed optimizer step (CUDA)
    peak_allocated_bytes_by_step: list[int] = []


class RunEvent(msgspec.Struct, kw_only=True):
    """Something the training process saw happen inside a step (capture/timeline.py): a
    DataLoader starting its worker processes, an evaluation pass (the model switched out of
    training mode and back), a ``torch.save``."""

    kind: RunEventKind
    step: int  # the step in progress when it began, counted from the first step
    start_s: float  # seconds from the bootstrap's start
    duration_s: float  # loader_start: the iterator's start plus its first batch's wait
    detail: str = ""
    workers: int = 0  # loader_start: worker processes started
    persistent: bool | None = None  # loader_start: the DataLoader's persistent_workers
    start_method: str | None = None  # loader_start: multiprocessing start method
    # loader_start under spawn/forkserver: the Dataset's pickled size (each worker unpickles it)
    dataset_bytes: int | None = None


class CompileEvent(msgspec.Struct, kw_only=True):
    """One frame torch.compile (dynamo) compiled, from its compilation metrics."""

    step: int  # the step in progress when it compiled (0: before the first step began)
    frame: str  # the function compiled: ``name (file:line)``
    seconds: float  # dynamo's whole-frame compile time
    reason: str | None = None  # the guard that failed (a recompilation); None: the first
    failed: str | None = None  # the compilation failed (dynamo's fail_type: fail_reason)


class TensorHolder(msgspec.Struct, kw_only=True):
    """A Python container that held live tensors between two steps (a gc census)."""

    name: str  # ``losses (list) in train() at train.py:41``, or the container type
    tensors: int
    with_graph: int  # of them, tensors with a grad_fn: each keeps its step's autograd graph
    bytes: int = 0  # their elements x element size (views count their own extent)


class TensorCensus(msgspec.Struct, kw_only=True):
    """Live tensors at a step boundary, counted by the garbage collector's object list."""

    step: int
    tensors: int  # live torch.Tensor objects (parameters and their gradients included)
    with_graph: int  # of them, with a grad_fn (non-leaf results of the autograd graph)
    holders: list[TensorHolder] = []  # the containers holding most of them


class StallWindow(msgspec.Struct, kw_only=True):
    """The second profiling window, placed on a step where a recurring stall is due
    (capture/stall_window.py): one step, recorded without shapes, memory or stacks."""

    step: int  # the step profiled, counted from the first step
    period_steps: int  # the period the stalls seen so far recur at
    predicted_from: list[int]  # those stall steps (the last few)
    threshold_ms: float  # a step above this stalled (the online scan's)
    step_ms: float | None = None  # the profiled step's wall time, once it ended
    stalled: bool | None = None  # it was a stall (the prediction held)
    trace: str | None = None  # the trace, relative to the run directory
    cut_after_s: float | None = None  # the profiler was stopped this far into the step
    partial: bool = False  # training ended inside the window
    error: str | None = None  # why no trace was kept


class StepTimeline(msgspec.Struct, kw_only=True):
    """Every training step of one process, recorded without the profiler: a clock read and a
    memory counter per step boundary, and what happened inside steps (capture/timeline.py)."""

    end_s: list[float]  # each step's end, seconds from the bootstrap's start
    memory_source: MemorySource | None = None  # None: no counter could be read
    # at each step's end (the next step's start): CUDA allocated bytes, or the process's RSS
    memory_bytes: list[int] = []
    memory_first_step: int | None = None  # the step at whose end memory_bytes[0] was read
    reserved_bytes: list[int] = []  # CUDA: the caching allocator's reserved bytes
    capacity_bytes: int | None = None  # what the memory fills: the device, or the RAM limit
    capacity_source: str | None = None
    profiled: list[list[int]] = []  # [first, last] steps that ran under the profiler
    events: list[RunEvent] = []
    compiles: list[CompileEvent] = []
    recompile_limit_hits: list[str] = []  # dynamo's warnings: frames that fell back to eager
    census: list[TensorCensus] = []  # taken when the memory grew (at most two)
    truncated_at: int | None = None  # recording stopped after this many steps
    stall_windows: list[StallWindow] = []  # second windows placed on stalls (at most two)


class MemoryGrowth(msgspec.Struct, kw_only=True):
    """Memory at step boundaries over the run, and whether it grows steadily."""

    source: MemorySource
    fitted_steps: int  # step boundaries in the fit (profiled steps left out on RSS)
    first_step: int
    last_step: int
    bytes_per_step: float  # the fitted slope
    stderr_bytes_per_step: float
    start_bytes: int
    end_bytes: int
    steady: bool  # the slope is above noise, in both halves, and large enough to matter
    capacity_bytes: int | None = None
    capacity_source: str | None = None
    full_at_step: int | None = None  # the step at which the memory is full at that rate
    cause: GrowthCause = "not_assessed"
    cause_detail: str = ""
    holders: list[TensorHolder] = []
    # CUDA: reserved / allocated at the last boundary (fragmentation when far above 1)
    reserved_over_allocated: float | None = None
    evidence: list[Evidence] = []


class StallPart(msgspec.Struct, kw_only=True):
    """Where part of a profiled stall step went."""

    label: str
    ms: float
    share: float  # of the recorded step


class StallProfile(msgspec.Struct, kw_only=True):
    """A stall step as the second profiling window recorded it
    (:mod:`~torchtriage.analysis.step_parts`)."""

    step: int
    wall_ms: float  # the step's wall time (the timeline's)
    recorded_ms: float  # what the trace holds of it (less when the profiler was cut)
    parts: list[StallPart]  # the host's time by what ran, largest first
    top_ops: list[StallPart] = []  # the longest top-level ops, by summed time
    device_busy_ms: float | None = None  # GPU: kernels and copies in the step (union)
    trace: str = ""  # relative to the run directory


class RecurringStall(msgspec.Struct, kw_only=True):
    """Steps far above the run's median step, of one cause."""

    cause: StallCause
    steps: list[int]
    period_steps: int | None  # None: fewer than 3 occurrences, or no regular spacing
    median_step_ms: float  # the run's median step (profiled steps left out)
    stall_ms_median: float  # the median of these steps
    excess_s: float  # their time above the median step, summed
    share_of_run: float  # excess_s over the run's wall time (first step to last)
    detail: str  # what the evidence says about the cause (and about ``also``)
    evidence: list[Evidence] = []
    profile: StallProfile | None = None  # one of these steps, profiled (a second window)
    # other causes seen in these steps, each at stall_second_cause of the cause's time
    also: list[StallCause] = []


class RecompileReason(msgspec.Struct, kw_only=True):
    frame: str
    reason: str
    count: int


class CompileRun(msgspec.Struct, kw_only=True):
    """What torch.compile did over the run (dynamo's counters and compilation metrics)."""

    compilations: int  # frames compiled, first compilations and recompilations
    recompilations: int
    seconds: float  # summed compile time
    after_first_step_s: float  # of it, compile time in steps after the first (stalls)
    share_of_run: float  # after_first_step_s over the run's wall time
    reasons: list[RecompileReason] = []
    graph_breaks: int = 0
    graph_break_reasons: list[str] = []
    limit_hits: list[str] = []  # frames that hit the recompile limit: they run eager now
    changed_shapes: list[str] = []  # ops whose input shapes changed in the window


class RunView(msgspec.Struct, kw_only=True):
    """The whole run, not only the profiled window: its step timeline, memory that grows,
    stalls that recur, compilation (diagnosis/run_view.py)."""

    steps: int  # steps in the timeline
    wall_s: float  # from the first step's end to the last's
    median_step_ms: float  # profiled steps left out
    first_step_s: float | None = None  # the bootstrap's start to the first step's end
    memory_source: MemorySource | None = None
    growth: MemoryGrowth | None = None
    growth_not_assessed: str | None = None  # why not (too few steps, no counter)
    stalls: list[RecurringStall] = []
    compile: CompileRun | None = None
    gaps: list[str] = []  # what the timeline lacks (a rank that stopped early, truncation)
    # the steps' wall times and memory readings, decimated for the report's plot
    plot_steps: list[int] = []
    plot_step_ms: list[float] = []
    plot_memory_bytes: list[int] = []
    plot_reserved_bytes: list[int] = []


class WindowCheck(msgspec.Struct, kw_only=True):
    """Was the profiled window steady state? Its host step times against a few unprofiled
    steps after it (``torchtriage run``)."""

    first_step: int  # the window's first and last active step, counted from the first step
    last_step: int
    skipped_steps: int  # steps run before the window started
    skip_reason: str  # why the window started there (--skip, a DataLoader queue to drain)
    profiled_mean_ms: float  # host time per step inside the window
    after_mean_ms: float | None = None  # the unprofiled steps after it (None: not reached)
    after_steps: int = 0
    after_max_ms: float | None = None  # the longest of them
    # the first of those steps: later than the window's queue when a refilled queue drained
    after_first_step: int | None = None
    representative: bool | None = None  # None: the script ended before the check
    # a profiled step far longer than the others that no checked step matched (one_off_step):
    # a checkpoint, an epoch boundary; the window is then not representative
    one_off_step: int | None = None
    one_off_step_ms: float | None = None
    threshold: float = 0.25  # window_drift


class DataQualityIssue(msgspec.Struct, kw_only=True):
    """One kind of impossible timing in the trace, how many, and what was done with them
    (``trace/quality.py``; zero-length steps: ``analysis/steps.py``)."""

    kind: DataQualityKind
    count: int
    action: DataQualityAction
    of: int  # the complete events read (for zero_length_step: the steps found)


class SkippedFile(msgspec.Struct, kw_only=True):
    """A file at the analysed path that could not be diagnosed, and why."""

    path: str
    reason: str  # the one-line error it gave, without its path


class CaptureInfo(msgspec.Struct, kw_only=True):
    """How ``torchtriage.profile`` ran (absent for traces captured elsewhere)."""

    run_dir: str
    trace_file: str
    steps_run: int
    host_step_ms_median: float | None = None  # unprofiled + profiled steps, export step excluded
    excluded_host_steps: dict[str, str] = {}
    oom: bool = False


class Withheld(msgspec.Struct, kw_only=True):
    """A prescription its layer's rule would list that the evidence held back, and why."""

    id: str
    layer: Layer
    reason: str
    evidence: list[Evidence] = []


class Diagnosis(JsonDocument, msgspec.Struct, kw_only=True):
    """What is slow, with evidence, and what to fix first."""

    schema: str = SCHEMA
    tool_version: str
    summary: str
    primary: Layer
    confidence: Confidence
    # why `primary` won (None in documents written before the field existed)
    primary_rule: PrimaryRule | None = None
    trace: TraceInfo
    layers: dict[str, LayerResult]
    breakdown: Breakdown
    findings: list[Finding] = []
    prescriptions: list[Prescription] = []
    withheld: list[Withheld] = []  # prescriptions held back by a gate of their rule
    top_ops: dict[str, list[OpRow]] = {}
    memory: list[MemoryPeak] = []
    dynamic_shapes: list[DynamicShape] = []
    gpu: GpuReport | None = None
    missing: list[str] = []  # what the trace lacks, so analyses that need it were skipped
    machine: MachineInfo | None = None
    collectives: list[CollectiveRow] = []
    sharding: ShardingInfo | None = None  # FSDP, when the job shards
    capture: CaptureInfo | None = None
    out_of_memory: OutOfMemory | None = None  # the run ran out of memory: what it said
    window: WindowCheck | None = None  # torchtriage run: whether the window was steady state
    superseded_windows: list[WindowCheck] = []  # earlier windows that were not, profiled again
    data_quality: list[DataQualityIssue] = []  # impossible timings dropped or clamped
    skipped: list[SkippedFile] = []  # other files at the path that could not be diagnosed
    run: RunView | None = None  # the whole run (torchtriage run's step timeline)

    @property
    def rank_diagnoses(self) -> list[Diagnosis]:
        """The per-rank diagnoses: this one (see ``JobDiagnosis.rank_diagnoses``)."""
        return [self]


def decode_diagnosis(data: bytes | str) -> Diagnosis:
    """Read a diagnosis back from its JSON."""
    return msgspec.json.decode(data, type=Diagnosis)
