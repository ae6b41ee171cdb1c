"""The GPU part of the diagnosis document (``Diagnosis.gpu``; built by diagnosis/gpu_report.py):
device utilisation per stream, idle time by cause, kernel classes and the top kernels,
launches, transfers and the syncs behind them."""

from __future__ import annotations

import msgspec

from torchtriage.diagnosis.vocabulary import SyncKind


class StreamUse(msgspec.Struct, kw_only=True):
    device: int
    stream: int
    busy_ms: float
    utilization: float  # busy time over the analysed steps' wall time
    events: int


class StreamIdle(msgspec.Struct, kw_only=True):
    device: int
    stream: int
    host_wait_ms: float  # the next kernel was launched after the previous one finished
    kernel_wait_ms: float  # short gaps between queued kernels (launch overhead on the device)
    other_ms: float  # the rest: syncs, dependencies, waits on other streams


class IdleTime(msgspec.Struct, kw_only=True):
    """Gaps between consecutive device events per stream, split as HTA splits them."""

    host_wait_ms: float  # summed over streams
    kernel_wait_ms: float
    other_ms: float
    kernel_wait_threshold_us: float
    streams: list[StreamIdle] = []


class TemporalBreakdown(msgspec.Struct, kw_only=True):
    """HTA's temporal breakdown over the device span (first kernel start to last kernel end)."""

    span_ms: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float  # communication and memory (copy/memset) kernels not under compute


class KernelClassTime(msgspec.Struct, kw_only=True):
    cls: str
    count: int
    time_ms: float
    share: float  # of the summed device-event time
    tensor_core_ms: float
    no_tensor_core_ms: float


class KernelRow(msgspec.Struct, kw_only=True):
    name: str
    cls: str
    count: int
    time_ms: float
    share: float
    tensor_cores: bool | None
    launched_by: str | None


class Launches(msgspec.Struct, kw_only=True):
    kernels_per_step: float
    launch_cost_us_median: float | None
    launch_cost_us_p90: float | None
    launch_delay_us_median: float | None
    launch_delay_us_p90: float | None
    short_kernel_share: float  # of kernels shorter than short_kernel_us
    short_kernel_time_share: float
    short_kernel_us: float
    launch_calls_per_step: float  # kernels launched one by one
    graph_kernel_share: float  # kernels launched inside CUDA/HIP graphs


class Copies(msgspec.Struct, kw_only=True):
    count: int
    pageable: int
    bytes: int
    time_ms: float


class SyncSite(msgspec.Struct, kw_only=True):
    """Host-device syncs of one kind at one site, per analysed step."""

    kind: SyncKind
    op: str  # the outermost operator they run inside (the code's call); "" outside any op
    waits_in: str  # the innermost op that waited; "" outside any op
    per_step: float


class TransfersInfo(msgspec.Struct, kw_only=True):
    h2d: Copies
    d2h: Copies
    d2d: Copies
    sync_copy_calls: int
    syncs_per_step: dict[str, float]  # calls that waited for the device, per step
    cpu_scalar_reads_per_step: float = 0.0  # .item() of CPU tensors: host work, not syncs
    cpu_scalar_read_ms_per_step: float = 0.0
    sync_sources: list[SyncSite] = msgspec.field(default_factory=list)  # most first


class GpuReport(msgspec.Struct, kw_only=True):
    """Device-side evidence (GPU traces only)."""

    utilization: float  # union of device events over the analysed steps' wall time
    busy_ms: float
    streams: list[StreamUse]
    idle: IdleTime
    temporal: TemporalBreakdown | None  # None when no device event carries a stream id
    comm_compute_overlap_pct: float | None  # None when there is no communication kernel
    kernel_classes: list[KernelClassTime]
    top_kernels: list[KernelRow]
    launches: Launches
    transfers: TransfersInfo
