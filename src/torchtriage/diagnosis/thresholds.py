"""Every threshold a rule uses, in one place, each with where its default comes from.

A rule imports its constant from here and reports it in its evidence, so a user can see which
number fired and why that number.
"""

from __future__ import annotations

import msgspec


class Threshold(msgspec.Struct, frozen=True):
    """A named default: its value, unit, meaning and source."""

    name: str
    value: float
    unit: str
    meaning: str
    source: str


MEMORY_NEAR_CAPACITY = Threshold(
    "memory_near_capacity", 0.90, "fraction of device memory",
    "peak allocated memory (live tensors) at or above this makes `memory` the primary layer",
    "Kineto TensorBoard plugin (data.py: peak_mem > total_mem * 0.9); TraceML very_high_at=90",
)
MEMORY_FRAGMENTATION = Threshold(
    "memory_fragmentation", 0.25, "fraction of reserved memory",
    "reserved-but-unallocated memory at the allocated peak that calls for expandable segments",
    "torchtriage default: a quarter of the cache idle at the peak is what expandable_segments "
    "recovers (PyTorch CUDA memory-management notes)",
)
FRAGMENTATION_MIN_RESERVED = Threshold(
    "fragmentation_min_reserved", 0.5, "fraction of device memory",
    "fragmentation is reported only when the reserved cache reaches this share of the device's "
    "known capacity: below it, idle cache cannot cause an OOM",
    "torchtriage default",
)
CPU_SATURATED = Threshold(
    "cpu_saturated", 0.9, "busy fraction of the cores the job may use",
    "CPU used by the job's own processes (the training process, its DataLoader workers and, "
    "under torchrun, the other ranks of its process group) over the cores it may use (CPU "
    "affinity and cgroup quota) at which a data-loading bottleneck needs cheaper "
    "preprocessing, not more workers; other processes' use of the machine does not count",
    "TraceML system policy (CPU high_at=80%) raised to 90% so that 'every core busy' means it; "
    "judged from the job's processes as train-doctor reports the trainer's own CPU use",
)
MACHINE_CONTENDED = Threshold(
    "machine_contended", 0.25, "share of the cores the job may use",
    "other processes' CPU use while the job ran at which the diagnosis warns that its timings "
    "were contended and lowers its confidence one level",
    "torchtriage default: seen on a 2-core machine where another test session held ~1 core: "
    "the same 80-step script took 6 s, 20 s and 47 s",
)
LOADER_CPU_SHARE = Threshold(
    "loader_cpu_share", 0.5, "share of the job's CPU",
    "on a CPU-only job whose own processes saturate its cores (cpu_saturated), DataLoader "
    "workers using at least this share of the job's CPU make its compute time contention: "
    "data loading is primary when significant, whatever the kernel share",
    "torchtriage default: the workers then hold most of the cores the training process "
    "computes on (seen: Linear(1024, 4) steps of 30-90 ms beside 3 CPU-bound workers on 2 cores)",
)
DATA_LOADING_SIGNIFICANT = Threshold(
    "data_loading_significant", 0.05, "share of step time",
    "data loading share at which DataLoader prescriptions are listed",
    "Kineto TensorBoard plugin (data.py: dataloader_ratio > 0.05)",
)
COMMUNICATION_SIGNIFICANT = Threshold(
    "communication_significant", 0.10, "share of step time",
    "exposed communication share at which communication prescriptions are listed",
    "Kineto TensorBoard plugin (data.py: communication_ratio > 0.1)",
)
HOST_SIGNIFICANT = Threshold(
    "host_significant", 0.15, "share of step time",
    "host overhead share at which host prescriptions are listed",
    "TraceML step-time policy (wait_share warn 0.15)",
)
KERNEL_SIGNIFICANT = Threshold(
    "kernel_significant", 0.30, "share of step time",
    "compute share at which kernel prescriptions are listed when kernel is not primary",
    "torchtriage default: below a third of the step, faster kernels cannot pay for their cost",
)
COMPUTE_BOUND = Threshold(
    "compute_bound", 0.85, "share of step time",
    "kernel share at or above which `kernel` is primary whatever else is exposed; below it, the "
    "largest significant non-compute layer (what keeps the compute idle) is primary",
    "TraceML step-time policy (compute_bound_share warn 0.85)",
)
SMALL_OP_US = Threshold(
    "small_op_us", 10.0, "µs",
    "CPU traces: an outermost op in which no nested op runs this long on its own (self time) "
    "does no real work; its time counts toward the `host` layer instead of `kernel`",
    "the ~10 µs cutoff of launch analysis (HTA: queued kernels follow each other within "
    "<10 µs; CPU launch cost 5-20 µs per op), applied to CPU op self time",
)
SHORT_KERNEL_US = Threshold(
    "short_kernel_us", 10.0, "µs",
    "GPU kernels shorter than this finish before the host can launch the next one: their "
    "share of kernels is launch-bound evidence",
    "HTA (CPU launch cost 5-20 µs per kernel; queued kernels follow within <10 µs)",
)
KERNEL_WAIT_US = Threshold(
    "kernel_wait_us", 30.0, "µs",
    "a gap between two kernels on a stream shorter than this, with the second already "
    "launched, is kernel wait (device-side launch overhead); longer gaps are `other` idle",
    "HTA get_idle_time_breakdown (consecutive_kernel_delay=30)",
)
LAUNCH_BOUND_SHORT_SHARE = Threshold(
    "launch_bound_short_share", 0.5, "share of kernels",
    "share of kernels shorter than short_kernel_us at which launch overhead is reported",
    "torchtriage default: when most kernels are shorter than their own launch cost, the "
    "device waits on the host",
)
OPTIMIZER_OPS_PER_STEP = Threshold(
    "optimizer_ops_per_step", 20.0, "ops per step",
    "host ops inside Optimizer.step per step at which a fused optimizer is prescribed",
    "torchtriage default: a fused or foreach optimizer runs a few ops per parameter group, a "
    "per-parameter loop several per parameter",
)
PER_PARAMETER_OPTIMIZER_SHARE = Threshold(
    "per_parameter_optimizer_share", 0.05, "share of step time",
    "the optimizer's own time (Optimizer.step ranges less closures) at which a fused optimizer "
    "is prescribed over one that steps one parameter at a time: fusing saves at most that time",
    "torchtriage default, 2026-12-05: pytorch/examples' reinforce.py on CPU (Adam over 4 "
    "parameters, 104 ops a step) had optimizer.fused as its first fix with the optimizer at "
    "3.6 % of a 10 ms step, where the episode's Python and batch-of-one forwards took the rest",
)
FOREACH_OPTIMIZER_SHARE = Threshold(
    "foreach_optimizer_share", 0.1, "share of step time",
    "the optimizer's own time (Optimizer.step ranges less closures) at which a fused optimizer "
    "is prescribed over one that already runs multi-tensor (foreach) kernels",
    "torchtriage default, after H200 runs of benchmarks/realworld: vit_fp32's AdamW (CUDA's "
    "default foreach path, one 29 ms bf16 step) gained 1.02x [1.01-1.03] from fused=True and "
    "0.998x from foreach=True (2026-12-02), deep_mlp's Adam over 192 small parameters in a "
    "step of a few ms 1.36x [1.19-1.56] from fused (2026-12-01); the optimizer's share in "
    "those traces was not recorded",
)
FP32_MATMUL_SHARE = Threshold(
    "fp32_matmul_share", 0.5, "share of matrix-kernel time",
    "matrix kernels (GEMM, convolution, attention) running fp32 without tensor cores, on a GPU "
    "that has them, at which precision fixes come first",
    "Kineto TensorBoard plugin (recommends AMP when tensor cores are eligible and unused); "
    "torch.profiler pattern matcher (FP32 MatMul on sm_80+)",
)
ELEMENTWISE_SHARE = Threshold(
    "elementwise_share", 0.3, "share of device kernel time",
    "elementwise + reduction kernel time at which unfused chains are reported and "
    "torch.compile fusion is prescribed",
    "torchtriage default: fusion only pays when memory-bound pointwise work is a large part "
    "of the kernel time",
)
UNFUSED_CHAIN = Threshold(
    "unfused_chain", 8.0, "kernels per matrix kernel",
    "elementwise + reduction kernels per GEMM/conv/attention kernel at which the pointwise "
    "work counts as unfused chains (with elementwise_share)",
    "measured on an H200: examples/elementwise_chain.py runs 24.8 pointwise kernels per matrix "
    "kernel in eager mode and 4.1 after torch.compile; 8 sits between",
)
DDP_BUCKETS_PER_STEP = Threshold(
    "ddp_buckets_per_step", 2, "all-reduce calls per step",
    "DDP's bucket size is prescribed only when the gradients span at least this many "
    "all-reduce buckets per step: with one bucket, a larger bucket_cap_mb merges nothing",
    "PyTorch DDP design notes: gradients are grouped into buckets of bucket_cap_mb (25 MB; the "
    "first 1 MB) and each bucket is all-reduced by one call",
)
FSDP_REGATHER = Threshold(
    "fsdp_regather", 1.5, "all-gathers per sharded unit per step",
    "at or above this, units are gathered again for backward (reshard_after_forward=True): "
    "keeping them gathered is prescribed when memory allows",
    "PyTorch FSDP2 fully_shard docs: reshard_after_forward=True frees the unsharded parameters "
    "after forward and all-gathers them again in backward",
)
FSDP_SMALL_ALL_GATHER = Threshold(
    "fsdp_small_all_gather", 4e6, "bytes per all-gather call",
    "below this per call, all-gathers are latency-bound: coarser sharded units are prescribed",
    "nccl-tests all_gather curves: bus bandwidth climbs until tens of MB per call; a few MB "
    "reach a fraction of it",
)
CPU_FAST_BF16 = Threshold(
    "cpu_fast_bf16", 1, "bf16 instruction sets",
    "bf16 autocast is prescribed on a CPU job only when the CPU has at least one native bf16 "
    "instruction set (AMX-BF16, AVX512-BF16; on Arm the BF16 extension), from the CPU flags "
    "that `torchtriage run` records; without, bf16 is converted in software and slower than fp32",
    "PyTorch CPU autocast docs and oneDNN (bf16 GEMMs need AVX512-BF16 or AMX); measured: "
    "nanoGPT under fix on an AVX2 CPU ran 0.04x with bf16 autocast",
)
FLOAT64_SHARE = Threshold(
    "float64_share", 0.5, "share of op self time",
    "share of the analysed steps' op time (CPU ops' self time; GPU kernel time) in float64 at "
    "which bf16 autocast is withheld: autocast leaves float64 tensors in float64",
    "ATen autocast (autocast_mode.h: is_eligible excludes kDouble); the LBFGS example spent "
    "90 % of its step in float64 aten::dot",
)
SLOW_LINK_BUSBW = Threshold(
    "slow_link_busbw", 10.0, "GB/s",
    "NCCL bus bandwidth below which large collectives (>= 16 MB per call) point at the link or "
    "transport rather than at the job",
    "nccl-tests reference points: NVLink all-reduce busbw is hundreds of GB/s, InfiniBand "
    "HDR/NDR 20-50 GB/s per NIC; below 10 GB/s NCCL is likely on TCP sockets or PCIe "
    "through the host",
)
STRAGGLER_COMM_GAP = Threshold(
    "straggler_comm_gap", 0.10, "share of step time",
    "gap between the largest and the smallest exposed-communication share across ranks at "
    "which the rank that waits least is named a straggler",
    "TraceML step-time policy (straggler score warn 0.10)",
)
STEP_TIME_SKEW = Threshold(
    "step_time_skew", 0.06, "fraction of the median step",
    "spread of the ranks' median step times that is reported",
    "TraceML step-time policy (max_skew 0.06)",
)
CONFIDENCE_HIGH_MARGIN = Threshold(
    "confidence_high_margin", 0.25, "share of step time",
    "distance of the verdict from its nearest decision boundary for `high` confidence: the lead "
    "over the next candidate layer and, for a non-compute primary, how far kernel is below "
    "compute_bound; for a loader_outpaced verdict, the share of a steady-state step that waits "
    "for data (1 - step work / loader period) above its value at loader_outpaced",
    "torchtriage default (TraceML's bands use similar 0.10-0.25 gaps between warn and crit)",
)
CONFIDENCE_MEDIUM_MARGIN = Threshold(
    "confidence_medium_margin", 0.10, "share of step time",
    "the same distance for `medium` confidence",
    "torchtriage default (TraceML's bands use similar 0.10-0.25 gaps between warn and crit)",
)
MIN_STEPS_FOR_CONFIDENCE = Threshold(
    "min_steps_for_confidence", 3, "steps",
    "fewer analysed steps than this lower the confidence one level",
    "seed schedule: 5 active steps; TraceML min_steps policies",
)

WINDOW_DRIFT = Threshold(
    "window_drift", 0.25, "fraction of step time",
    "after the profiling window, a few unprofiled steps are timed; when their mean host step "
    "time exceeds the window's by more than this, the window was not steady state (a "
    "DataLoader queue still full of batches prepared earlier, a warm-up) and it is profiled "
    "again later; only slower-after counts, since the profiler itself only adds time",
    "torchtriage default: well above step-to-step noise (a few per cent) and the profiler's "
    "usual overhead on the steps after the window; the ImageNet case that prompted it differed "
    "by 90 %",
)

PROFILER_INFLATION = Threshold(
    "profiler_inflation", 0.25, "fraction of step time",
    "on a GPU trace from `torchtriage run`: when the analysed steps' mean wall time in the trace "
    "(steps over overhead_outlier_step x the median left out) exceeds the mean host time of the "
    "unprofiled steps timed after the window by more than this, the difference is time the "
    "profiler added on the host side (recording each op and launch), and it is taken out of the "
    "host layer before the layers are compared; layer shares are then of the unprofiled step",
    "torchtriage default, same band as window_drift; H200, nanoGPT (GPT-2 124M shape, bf16, 4 "
    "micro-batches, 2,795 kernels per step): 142 ms per profiled step against 88 ms unprofiled "
    "with 90 ms of kernels per step, and the uncorrected verdict was host (2026-12-02)",
)

OVERHEAD_OUTLIER_STEP = Threshold(
    "overhead_outlier_step", 2.0, "times the median step",
    "an analysed step longer than this times the window's median is left out of the "
    "profiler-overhead estimate (profiler_inflation) and keeps its time: an epoch boundary, a "
    "checkpoint, a validation pass, not the profiler's per-op cost",
    "torchtriage default, H200 2026-12-02: dcgan's epoch-boundary step (checkpoint + new "
    "DataLoader workers) took 59x its window's median; nanoGPT's slowest profiled step 1.36x",
)

ONE_OFF_STEP = Threshold(
    "one_off_step", 3.0, "times the window's median step",
    "a profiled step longer than this times the window's median, when none of the unprofiled "
    "steps checked after the window comes within this factor of it, is a one-off event (a "
    "checkpoint, an epoch boundary that restarts the DataLoader's workers, an evaluation): the "
    "window is not steady state and is profiled again; a step as slow among the checked steps "
    "is the job's own rhythm (a loader whose workers deliver in turn, a checkpoint every few "
    "steps) and stays",
    "torchtriage default, H200 2026-12-02: dcgan's epoch-boundary step took 1,190 ms among "
    "window steps of 19-21 ms and checked steps of 15-22 ms; a 2-worker loader that cannot keep "
    "up alternates 20 and 185 ms steps, in the window and after it alike",
)

ONE_OFF_MIN_MS = Threshold(
    "one_off_min_ms", 100.0, "ms over the window's median step",
    "the least a one-off step (one_off_step) must exceed the window's median by: shorter "
    "stalls are the scheduler's on a busy machine, not a checkpoint or an epoch boundary, and "
    "profiling again for one of them would only move the window; such a shorter one-off is "
    "left out of the window's statistics instead (diagnosis/windows.py), so that one stall "
    "does not decide the shares of a window of short steps",
    "torchtriage default, CI 2026-12-02: a 2-rank gloo job of 5-9 ms steps on a loaded 2-core "
    "machine had one rank profile again for a stall of a few tens of ms; the one-offs seen on "
    "real jobs cost 1,000 ms and more (dcgan's epoch boundary 1,170 ms over its median); "
    "H200 2026-12-03: pytorch/examples' mnist had one 84 ms step among 5-14 ms ones (a 66 ms "
    "pause inside Adadelta.step, the garbage collector's) that made host 80 % of its window",
)


def one_off_step(profiled_ms: list[float], later_ms: list[float],
                 min_over_ms: float = ONE_OFF_MIN_MS.value) -> int | None:
    """Index of the longest profiled step when it is a one-off (``one_off_step``, at least
    ``min_over_ms`` over the median: ``one_off_min_ms`` unless given), else None. Needs 3
    profiled steps (a median to judge by)."""
    if len(profiled_ms) < 3 or not later_ms:
        return None
    factor = ONE_OFF_STEP.value
    longest = max(range(len(profiled_ms)), key=profiled_ms.__getitem__)
    odd, median = profiled_ms[longest], sorted(profiled_ms)[len(profiled_ms) // 2]
    if (odd > median * factor and odd - median >= min_over_ms
            and max(later_ms) < odd / factor):
        return longest
    return None


def window_holds(profiled_ms: float, later_ms: float) -> bool:
    """Whether steps timed later (unprofiled) bear a profiled window out: at most
    ``window_drift`` slower (the profile's own check after the window, and ``fix``'s
    cross-check against its trials)."""
    return later_ms <= profiled_ms * (1 + WINDOW_DRIFT.value)


WINDOW_CHECK_STEPS = Threshold(
    "window_check_steps", 5, "steps",
    "unprofiled steps timed after the window for that check (the step right after the window, "
    "which carries the trace export, is not counted)",
    "torchtriage default: their mean, a throughput figure like the window's (a median would "
    "miss a loader that stalls every few steps); 5 steps keep the check short",
)
LOADER_OUTPACED = Threshold(
    "loader_outpaced", 1.25, "times the step's work besides waiting for data",
    "the DataLoader's loading time per batch over its workers (the shortest step it can feed, "
    "timed in the workers during the window) against the window's median step less its "
    "exposed data loading (the step the loop would run with batches always ready), at which "
    "data loading is named the bottleneck of the steady state, whatever its share inside the "
    "window",
    "torchtriage default (window_drift's margin), H200 2026-12-03: pytorch/examples' mnist, 1 "
    "worker at 9.0 ms per batch against a window median step of 5.7 ms (host 71 % of the "
    "window); fix's trials of it then ran 10.4 ms per step, and 4 workers made it 2.56x "
    "faster. Session 15, three more runs: 1 worker at 11.0-12.7 ms per batch, median steps "
    "of 8.5-10.6 ms that waited for data 0.1-7.7 ms each; against the whole step (1.17-1.29x) "
    "two of the three were called host, against the step's other work (median 6.3-7.2 ms) all "
    "three are 1.58-1.98x",
)

DATASET_GETITEM_SHARE = Threshold(
    "dataset_getitem_share", 0.5, "share of a batch's loading time",
    "share of a batch's loading time (__getitem__ x samples + collate_fn) spent in "
    "Dataset.__getitem__ at which the Dataset, not collate_fn, is named as the slow part",
    "torchtriage default: the larger of the two parts is the one to make cheaper",
)
PROFILE_EVENTS_BUDGET = Threshold(
    "profile_events_budget", 100_000, "events",
    "profiler events a window may record: the op events of a probed unprofiled step (shapes "
    "and memory off) x its warm-up and active steps; above it the window is shortened (active "
    "to 2, warm-up to 1 at least), then record_shapes, with_stack and profile_memory are "
    "turned off, and the estimate is logged",
    "measured 2026-12-01 on a shared 2-core CPU machine: the export costs about 180 µs per "
    "such event (tests/scripts/closure_regression.py, LBFGS with 12 closure calls: 7 steps of "
    "8,938 events exported in 11.2-12.4 s; issue 17's LBFGS, 152,759 ops per step, took 182 s "
    "for 7 steps, 170 µs per op); 100k events keep the export under about 20 s",
)
PROFILE_EXPORT_US_PER_EVENT = Threshold(
    "profile_export_us_per_event", 180.0, "µs per event",
    "export cost per probed op event (memory, shapes and trace writing included) used to say "
    "how long a window's export will take",
    "the two measurements above (170-200 µs per op event with shapes and memory on)",
)
PROFILE_EXPORT_US_PER_OP_EVENT = Threshold(
    "profile_export_us_per_op_event", 10.0, "µs per event",
    "export cost per op event of a window that records ops only (shapes, stacks and memory "
    "off: the windows the event budget still finds too long), stopping, writing and "
    "compressing included",
    "measured 2026-12-05, torch 2.13 CPU, pytorch/examples time_sequence_prediction under "
    "torchtriage run: a window of 3,085,907 op events stopped, written and gzipped in about "
    "26 s (8.4 µs per event; the 180 µs above said 495 s); 310,741 events of its model in "
    "process: stop 0.8 s, kineto save 0.4 s",
)
PROFILE_BYTES_PER_EVENT = Threshold(
    "profile_bytes_per_event", 2_400, "bytes per event",
    "memory the profiler holds at its peak per recorded op event with shapes, stacks and memory "
    "off (while recording, and the results built when it stops): with the window's estimated "
    "events, what the window would take from the training process",
    "measured 2026-12-05, torch 2.13 CPU, under torchtriage run: time_sequence_prediction's "
    "probed step (LBFGS over an LSTMCell loop), 6,436,051 events, took the process from 1.39 "
    "to 11.88 GB resident (1,630 B per event); the same model with 6 closure calls, 1,866,559 "
    "events, from 1.44 to a 5.81 GiB peak (2,350 B per event); in a fresh process 980 B per "
    "event, 2,685 B with record_shapes on",
)
PROFILE_RECORDING_BYTES_PER_EVENT = Threshold(
    "profile_recording_bytes_per_event", 600, "bytes per event",
    "the part of profile_bytes_per_event that accrues while the profiler records (the rest "
    "comes when it stops): the probe is stopped part-way through its step once the process "
    "has grown by the window's memory share x this / profile_bytes_per_event",
    "measured 2026-12-05 under torchtriage run, the 1,866,559-event step above: 1.44 to "
    "2.53 GB resident while recording (585 B per event), its peak only inside the stop",
)
PROFILE_MEMORY_SHARE = Threshold(
    "profile_memory_share", 0.5, "share of the memory limit",
    "share of the memory torchtriage may use (80% of the memory available when the probe "
    "ends, or TORCHTRIAGE_MEMORY_LIMIT) that a window's profiler may take; above it the window "
    "is one active step, and a step that alone passes it is recorded in part (its first "
    "seconds; capture/cost_guard.py)",
    "torchtriage default: the other half is the training's own growth and the trace's "
    "analysis; before this limit time_sequence_prediction (6.4 million events per LBFGS step) "
    "was killed by the kernel's OOM killer at 24 GB while its step was probed with shapes",
)

TIMING_DAMAGE_LOWER = Threshold(
    "timing_damage_lower", 0.001, "share of complete events",
    "events whose timing was impossible and was dropped or clamped (no ts, a negative dur, a "
    "dur past the trace's span; exact duplicates, whose dropping restores the trace, not "
    "counted) at or above which the confidence is one level lower",
    "torchtriage default: one damaged event can hide a whole step's worth of time (a "
    "ProfilerStep, a DataLoader wait), so no share is harmless; 1 in 1,000 is past the stray "
    "event of an exporter, where a verdict should stop claiming its full confidence",
)
TIMING_DAMAGE_REFUSE = Threshold(
    "timing_damage_refuse", 0.10, "share of complete events",
    "the same share at or above which no verdict is given (one-line error, exit 2; in a "
    "directory of traces the file is listed as skipped)",
    "torchtriage default: a layer's share is the time of its events, and the verdict's "
    "confidence bands are 10 and 25 points of step time (confidence_medium_margin, "
    "confidence_high_margin); with a tenth of the events unusable, the time they held can "
    "move the leading layers by more than the medium band, so a verdict would be a guess",
)
GROWTH_MIN_STEPS = Threshold(
    "growth_min_steps", 10, "step boundaries",
    "memory readings a growth slope is fitted over at the least; a shorter run is said to be "
    "too short to tell",
    "torchtriage issue #33: a fitted slope over at least 10 steps",
)
GROWTH_SKIP_STEPS = Threshold(
    "growth_skip_steps", 3, "steps",
    "first step boundaries left out of the growth fit: the optimizer's state, the gradients "
    "and the allocator's first segments are created there",
    "torchtriage default: Adam's state and .grad exist after the first optimizer step; the "
    "second and third steps settle the caching allocator",
)
GROWTH_T = Threshold(
    "growth_t", 5.0, "standard errors",
    "a memory slope counts as growth when it is at least this many standard errors above zero",
    "torchtriage default: a 5-sigma slope is not the allocator's step-to-step noise",
)
GROWTH_HALF_SHARE = Threshold(
    "growth_half_share", 0.3, "fraction of the whole slope",
    "the slope over each half of the readings must reach this fraction of the whole run's: "
    "growth that holds over the run, not one jump (an evaluation's buffers, a cache filled once)",
    "torchtriage default",
)
GROWTH_MIN_BYTES = Threshold(
    "growth_min_bytes", 4 * 2**20, "bytes over the fitted steps",
    "growth smaller than this over the fitted steps is not reported (a few scalars kept)",
    "torchtriage default: 4 MiB, above glibc malloc's RSS granularity (its 128 KiB mmap "
    "threshold, arenas of 64 MiB reserved but touched page by page)",
)
STALL_RATIO = Threshold(
    "stall_ratio", 2.0, "times the median step",
    "a step that takes more than this many times the run's median step (and stall_min_ms more) "
    "stalls",
    "torchtriage default: twice the median is outside any DataLoader jitter seen in the "
    "realistic corpus (benchmarks/realworld)",
)
STALL_MIN_MS = Threshold(
    "stall_min_ms", 20.0, "ms above the median step",
    "a stall takes at least this much more than the median step",
    "torchtriage default: below it a periodic step costs less than 2% at 1 s per epoch",
)
STALL_PERIOD_TOLERANCE = Threshold(
    "stall_period_tolerance", 0.1, "fraction of the period",
    "stalls recur at a period when two thirds of the gaps between them are within one step or "
    "this fraction of their median gap",
    "torchtriage default: epochs of equal length, intervals counted in steps",
)
STALL_WINDOW_MAX_S = Threshold(
    "stall_window_max_s", 10.0, "seconds",
    "the second profiling window, placed on a recurring stall, records at most this much of "
    "the stall step (the profiler is stopped there and the recorded part is analysed)",
    "torchtriage default: about 10 s of ops, kernels and ranges without shapes or memory "
    "stays under the profile_events_budget on the GPU cases of benchmarks/whole_run.py",
)
RUN_STALL_SIGNIFICANT = Threshold(
    "run_stall_significant", 0.10, "share of the run's wall time",
    "recurring stalls of one cause, or torch.compile recompiling after the first step, costing "
    "this share of the whole run make their layer primary, whatever the profiled window's "
    "shares (the window's steps do not contain them, or are themselves compiling)",
    "torchtriage default: as communication_significant; a gain of a tenth of the run beats "
    "most fixes a window between stalls can show",
)
RECOMPILE_SIGNIFICANT = Threshold(
    "recompile_significant", 0.05, "share of the run's wall time",
    "torch.compile time after the first step at which recompilation is a finding with its "
    "prescriptions",
    "torchtriage default: as data_loading_significant",
)
RECOMPILE_MIN_COUNT = Threshold(
    "recompile_min_count", 4, "recompilations",
    "recompilations over the run below which their compile time is a few shapes compiled once "
    "each (a finding, no prescription), unless a frame hit the recompile limit",
    "torchtriage default: padding to a few buckets compiles up to ~3 extra graphs, paid once "
    "per run",
)

GROWTH_HORIZON_STEPS = Threshold(
    "growth_horizon_steps", 100_000, "steps",
    "memory growth that fills memory only after this many steps (and did not run out) is an "
    "info finding without a fix: no job of ordinary length reaches it",
    "torchtriage default: 100k optimizer steps is a long training job; a script growing 90 KiB "
    "a step of process heap (one small tensor a step) on 24 GiB would fill it after 279k",
)
STALL_SECOND_CAUSE = Threshold(
    "stall_second_cause", 0.25, "fraction of the cause's time in the stall steps",
    "another event kind seen in a recurring stall's steps (a DataLoader start beside an "
    "evaluation) for this fraction of the time of the one the stall is attributed to is named "
    "beside it, and its fix prescribed too",
    "torchtriage default: a Lightning fit on CPU restarted two DataLoaders (0.18 s) around each "
    "0.17 s validation; either fix alone leaves half the stall",
)
WINDOW_COMPILING = Threshold(
    "window_compiling", 0.10, "share of the window's step time",
    "torch.compile compiling (dynamo's tracing, guards and backend compile) for this share of "
    "the analysed steps makes the window not steady state: a finding, one level less confidence",
    "torchtriage default: as recompile_significant's order; compiled_varlen.py's CPU window sat "
    "among recompiles at 85%",
)

ALL: tuple[Threshold, ...] = (
    WINDOW_DRIFT,
    WINDOW_CHECK_STEPS,
    PROFILER_INFLATION,
    OVERHEAD_OUTLIER_STEP,
    ONE_OFF_STEP,
    ONE_OFF_MIN_MS,
    PROFILE_EVENTS_BUDGET,
    PROFILE_EXPORT_US_PER_EVENT,
    PROFILE_EXPORT_US_PER_OP_EVENT,
    PROFILE_BYTES_PER_EVENT,
    PROFILE_RECORDING_BYTES_PER_EVENT,
    PROFILE_MEMORY_SHARE,
    MEMORY_NEAR_CAPACITY,
    MEMORY_FRAGMENTATION,
    FRAGMENTATION_MIN_RESERVED,
    CPU_SATURATED,
    MACHINE_CONTENDED,
    LOADER_CPU_SHARE,
    DATA_LOADING_SIGNIFICANT,
    LOADER_OUTPACED,
    DATASET_GETITEM_SHARE,
    COMMUNICATION_SIGNIFICANT,
    HOST_SIGNIFICANT,
    KERNEL_SIGNIFICANT,
    COMPUTE_BOUND,
    SMALL_OP_US,
    SHORT_KERNEL_US,
    KERNEL_WAIT_US,
    LAUNCH_BOUND_SHORT_SHARE,
    OPTIMIZER_OPS_PER_STEP,
    PER_PARAMETER_OPTIMIZER_SHARE,
    FOREACH_OPTIMIZER_SHARE,
    FP32_MATMUL_SHARE,
    ELEMENTWISE_SHARE,
    UNFUSED_CHAIN,
    DDP_BUCKETS_PER_STEP,
    FSDP_REGATHER,
    FSDP_SMALL_ALL_GATHER,
    CPU_FAST_BF16,
    FLOAT64_SHARE,
    SLOW_LINK_BUSBW,
    STRAGGLER_COMM_GAP,
    STEP_TIME_SKEW,
    CONFIDENCE_HIGH_MARGIN,
    CONFIDENCE_MEDIUM_MARGIN,
    MIN_STEPS_FOR_CONFIDENCE,
    TIMING_DAMAGE_LOWER,
    TIMING_DAMAGE_REFUSE,
    GROWTH_MIN_STEPS,
    GROWTH_SKIP_STEPS,
    GROWTH_T,
    GROWTH_HALF_SHARE,
    GROWTH_MIN_BYTES,
    STALL_RATIO,
    STALL_MIN_MS,
    STALL_PERIOD_TOLERANCE,
    STALL_WINDOW_MAX_S,
    RUN_STALL_SIGNIFICANT,
    RECOMPILE_SIGNIFICANT,
    RECOMPILE_MIN_COUNT,
    WINDOW_COMPILING,
    STALL_SECOND_CAUSE,
    GROWTH_HORIZON_STEPS,
)
