"""The step-time category vocabulary and which events fall in each category.

Categories are listed in priority order: during attribution a category claims only the time no
earlier category has claimed (the TensorBoard profiler plugin's rule, ``ProfileRole`` order
Kernel, Memcpy, Memset, Communication, Runtime, DataLoader, CpuOp, Other). The last category of
each list is the remainder and has no events of its own.
"""

from __future__ import annotations

import re

import numpy as np

from torchtriage.analysis.intervals import merge, subtract
from torchtriage.analysis.steps import OPTIMIZER_STEP_PREFIX
from torchtriage.trace.model import HOST_KINDS, EventKind, Trace

# GPU (any trace with device activity), priority order.
GPU_CATEGORIES: tuple[str, ...] = (
    "kernel",  # device compute kernels, not communication
    "memcpy",  # device copies other than host-to-device (DtoH, DtoD, PtoP)
    "h2d_input",  # host-to-device copies (input batches moving to the device)
    "memset",  # device memsets
    "communication",  # collective kernels: ncclKernel_*, ncclDevKernel_*, rccl*
    "runtime",  # host runtime/driver calls with the device idle: launches, syncs, allocs
    "data_loading",  # DataLoader __next__ with the device idle
    "cpu_exec",  # host-side ops with the device idle (no launch in flight)
    "idle",  # neither host op nor device work: Python glue, untraced waits
)

# CPU-only traces, priority order.
CPU_CATEGORIES: tuple[str, ...] = (
    "data_loading",  # DataLoader __next__ (in-process loading, or waiting on workers)
    # the training thread inside a collective or a sharding hook (FSDP's all-gathers, their
    # waits and copies, reduce-scatters), and gloo:* / c10d::* / nccl:* work on other threads
    # that no op of the training thread hides (see communication_intervals)
    "communication",
    "optimizer",  # Optimizer.step#... and Optimizer.zero_grad#...
    "backward",  # autograd engine: evaluate_function nodes, *Backward ops, AccumulateGrad
    "forward",  # every other op on the training thread
    "other",  # step time covered by no op: Python glue, sleeps, untraced waits
)

DATALOADER_PREFIX = "enumerate(DataLoader)"
OPTIMIZER_ZERO_GRAD_PREFIX = "Optimizer.zero_grad#"
_OPTIMIZER = (OPTIMIZER_STEP_PREFIX, OPTIMIZER_ZERO_GRAD_PREFIX)
# the range torchtriage's capture puts around each call of a closure passed to
# optimizer.step(closure) (LBFGS, Lightning's automatic optimization): "...#<Optimizer class>"
CLOSURE_PREFIX = "torchtriage.closure#"
_BACKWARD = re.compile(
    r"^autograd::engine::evaluate_function|Backward\d*$|^torch::autograd::AccumulateGrad"
)
_COMM_HOST = ("gloo:", "c10d::", "nccl:", "record_param_comms", "ProcessGroup")
_COMM_KERNEL = re.compile(r"nccl|rccl", re.IGNORECASE)
# FSDP's hook ranges on the training thread: FSDP2 (fully_shard) "FSDP::pre_forward (fqn)",
# "FSDP::all_gather", "FSDP::post_backward_reduce", ...; FSDP1 "FullyShardedDataParallel.
# _pre_forward", "..._post_backward_hook", ... All of them gather, wait for, copy out, free or
# reduce-scatter sharded parameters and gradients: the job's communication. Not the ranges
# that only cast or move the inputs.
FSDP2_PREFIX = "FSDP::"
FSDP1_PREFIX = "FullyShardedDataParallel."
_FSDP_NOT_COMM = ("FSDP::cast_forward_inputs", "FSDP::cast_forward_outputs",
                  "FSDP::inputs_to_device", "FSDP::root_pre_forward",
                  "FullyShardedDataParallel._to_kwargs",
                  "FullyShardedDataParallel._root_pre_forward")
_H2D = re.compile(r"HtoD|Host ?to ?Device|H2D", re.IGNORECASE)
_PROFILER_STEP = re.compile(r"^ProfilerStep#")


def is_dataloader(name: str) -> bool:
    return name.startswith(DATALOADER_PREFIX)


def is_communication_kernel(name: str) -> bool:
    return bool(_COMM_KERNEL.search(name))


def is_host_communication(name: str) -> bool:
    return name.startswith(_COMM_HOST)


def on_training_thread(trace: Trace, main_thread: int) -> np.ndarray:
    """Row mask of the training thread's events (every row when it is not known: -1)."""
    ev = trace.events
    return ev.thread_id == main_thread if main_thread >= 0 else np.ones(len(ev), dtype=bool)


def is_fsdp(name: str) -> bool:
    """An FSDP (fully_shard or FullyShardedDataParallel) hook range."""
    return name.startswith((FSDP2_PREFIX, FSDP1_PREFIX))


def is_sharding_communication(name: str) -> bool:
    """An FSDP hook range that gathers, waits for, frees or reduces sharded state."""
    return is_fsdp(name) and not name.startswith(_FSDP_NOT_COMM)


def is_h2d_copy(name: str) -> bool:
    return bool(_H2D.search(name))


def is_closure(name: str) -> bool:
    return name.startswith(CLOSURE_PREFIX)


def is_backward(name: str) -> bool:
    return bool(_BACKWARD.search(name))


def optimizer_own_intervals(trace: Trace, *, zero_grad: bool = True
                            ) -> tuple[np.ndarray, np.ndarray]:
    """The optimizer's own time: ``Optimizer.step#`` ranges minus what runs inside them on the
    optimizer's behalf but is the model's work, plus ``Optimizer.zero_grad#`` ranges (with
    ``zero_grad``), as sorted, disjoint (starts, ends).

    Subtracted from a step range: the closure calls torchtriage marked (``CLOSURE_PREFIX``:
    forward, loss and backward of an ``optimizer.step(closure)``), and backward ops (an
    optimizer never runs autograd itself: in a trace captured elsewhere, a closure's
    backward is still told apart by its ops' names; its forward is not, see
    :func:`unmarked_closure_steps`)."""
    ev = trace.events
    host = np.isin(ev.kind, HOST_KINDS)
    step = np.flatnonzero(host & ev.name_mask(lambda n: n.startswith(OPTIMIZER_STEP_PREFIX)))
    if step.size == 0 and not zero_grad:
        return np.zeros(0), np.zeros(0)
    cut = np.flatnonzero(host & ev.name_mask(lambda n: is_closure(n) or is_backward(n)))
    s, e = subtract(ev.ts[step], ev.end[step], ev.ts[cut], ev.end[cut])
    if zero_grad:
        zg = np.flatnonzero(host & ev.name_mask(
            lambda n: n.startswith(OPTIMIZER_ZERO_GRAD_PREFIX)))
        s, e = merge(np.concatenate([s, ev.ts[zg]]), np.concatenate([e, ev.end[zg]]))
    return s, e


def unmarked_closure_steps(trace: Trace) -> int:
    """``Optimizer.step#`` ranges that ran backward ops inside without a closure mark: a
    closure torchtriage did not see (a trace captured elsewhere), whose forward is counted as
    optimizer time."""
    ev = trace.events
    host = np.isin(ev.kind, HOST_KINDS)
    step = np.flatnonzero(host & ev.name_mask(lambda n: n.startswith(OPTIMIZER_STEP_PREFIX)))
    if step.size == 0:
        return 0
    marked = np.flatnonzero(host & ev.name_mask(is_closure))
    backward = np.flatnonzero(host & ev.name_mask(is_backward))
    if backward.size == 0:
        return 0
    order = np.argsort(ev.ts[step], kind="stable")
    starts, ends = ev.ts[step][order], ev.end[step][order]

    def inside(rows: np.ndarray) -> set[int]:
        idx = np.searchsorted(starts, ev.ts[rows], side="right") - 1
        ok = idx >= 0
        ok[ok] = ev.ts[rows][ok] < ends[idx[ok]]
        return set(idx[ok].tolist())

    return len(inside(backward) - inside(marked))


def communication_intervals(trace: Trace, masks: dict[str, np.ndarray], main_thread: int
                            ) -> tuple[np.ndarray, np.ndarray]:
    """The CPU communication claim, as sorted disjoint (starts, ends): the training thread's
    own collective time (host collective ops and FSDP's sharding hooks, where it gathers
    parameters, waits for them, copies them out and reduce-scatters gradients), plus
    collective work on other threads (gloo's) that no training-thread op covers.

    Collectives on a background thread while the training thread computes are overlapped,
    not exposed; the training thread blocked in an FSDP hook is exposed communication even
    though the hook runs inside forward or backward (FSDP2 waits for a block's all-gather in
    its pre-forward hook, and for the next one's in a backward node)."""
    ev = trace.events
    host = np.isin(ev.kind, HOST_KINDS)
    on_main = on_training_thread(trace, main_thread)
    own = host & on_main & (masks["communication"] | ev.name_mask(is_sharding_communication))
    other = masks["communication"] & ~on_main
    busy = np.zeros(len(ev), dtype=bool)
    for category in ("data_loading", "optimizer", "backward", "forward"):
        busy |= masks[category]
    s, e = subtract(ev.ts[other], ev.end[other], ev.ts[busy], ev.end[busy])
    return merge(np.concatenate([ev.ts[own], s]), np.concatenate([ev.end[own], e]))


def category_masks(trace: Trace, main_thread: int) -> dict[str, np.ndarray]:
    """Row mask per category (without the remainder category) for the trace's mode."""
    ev = trace.events
    host = np.isin(ev.kind, HOST_KINDS) & ~ev.name_mask(_PROFILER_STEP.match)
    dataloader = host & ev.name_mask(is_dataloader)
    if trace.has_device_activity:
        comm = ev.name_mask(is_communication_kernel)
        memcpy = ev.kind == EventKind.MEMCPY
        h2d = memcpy & ev.name_mask(is_h2d_copy)
        return {
            "kernel": (ev.kind == EventKind.KERNEL) & ~comm,
            "memcpy": memcpy & ~h2d,
            "h2d_input": h2d,
            "memset": ev.kind == EventKind.MEMSET,
            "communication": (ev.kind == EventKind.KERNEL) & comm,
            "runtime": ev.kind == EventKind.RUNTIME,
            "data_loading": dataloader,
            "cpu_exec": host & ~dataloader,
        }
    # (the optimizer's claim is its own time, optimizer_own_intervals; the mask is its lane)
    optimizer = host & ev.name_mask(lambda n: n.startswith(_OPTIMIZER))
    backward = host & ev.name_mask(_BACKWARD.search)
    comm = host & ev.name_mask(is_host_communication)
    on_main = on_training_thread(trace, main_thread)
    return {
        "data_loading": dataloader,
        "optimizer": optimizer,
        "backward": backward,
        "forward": host & on_main,
        "communication": comm,
    }


def categories_for(trace: Trace) -> tuple[str, ...]:
    return GPU_CATEGORIES if trace.has_device_activity else CPU_CATEGORIES
