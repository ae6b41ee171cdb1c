"""Out of memory, seen from inside the training process: how far training got, and at the
error, what the error and the allocator say (:class:`~torchtriage.diagnosis.result.OutOfMemory`).

At each optimizer step the highest CUDA memory allocated so far is noted (a counter read, no
sync, only once the script has initialised CUDA). At an out-of-memory error the figures in the
error's message come first (they describe the moment of failure); the allocator's current
figures fill in what the message lacks.
"""

from __future__ import annotations

import sys

from torchtriage.diagnosis.oom import parse_oom_message
from torchtriage.diagnosis.result import OutOfMemory

MESSAGE_CHARS = 1000


class MemoryWatch:
    """Completed optimizer steps and the CUDA allocated peak after each."""

    def __init__(self) -> None:
        self.optimizer_steps = 0
        self.peaks: list[int] = []

    def optimizer_stepped(self) -> None:
        self.optimizer_steps += 1
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            self.peaks.append(int(torch.cuda.max_memory_allocated()))

    def report(self, exc: BaseException) -> OutOfMemory:
        """What the out-of-memory error ``exc`` and the allocator say."""
        return out_of_memory_report(exc, self.optimizer_steps, self.peaks)


def out_of_memory_report(exc: BaseException, completed_steps: int,
                         peaks: list[int] | None = None) -> OutOfMemory:
    """What the out-of-memory error ``exc`` and the allocator say, after ``completed_steps``
    training steps."""
    text = str(exc)
    figures: dict = parse_oom_message(text)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        try:
            device = torch.cuda.current_device()
            figures.setdefault("device", f"cuda:{device}")
            figures.setdefault("capacity_bytes", capped_capacity(torch) or
                               int(torch.cuda.get_device_properties(device).total_memory))
            allocated = int(torch.cuda.memory_allocated(device))
            figures.setdefault("allocated_bytes", allocated)
            figures.setdefault("reserved_unallocated_bytes",
                               max(int(torch.cuda.memory_reserved(device)) - allocated, 0))
        except Exception:  # a device in a bad state after the error: the message will do
            pass
    return OutOfMemory(message=f"{type(exc).__name__}: {text}"[:MESSAGE_CHARS],
                       step=completed_steps + 1,
                       peak_allocated_bytes_by_step=list(peaks or []), **figures)


def capped_capacity(torch) -> int | None:
    """The bytes this process may use on its current CUDA device when the script capped it
    (``torch.cuda.set_per_process_memory_fraction``), else None: memory pressure is judged
    against that share, not the whole card."""
    if torch is None:
        return None
    fraction_of = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if fraction_of is None or not torch.cuda.is_initialized():
        return None
    try:
        device = torch.cuda.current_device()
        fraction = float(fraction_of(device))
        total = int(torch.cuda.get_device_properties(device).total_memory)
    except Exception:  # a device in a bad state: the trace's figure will do
        return None
    return int(total * fraction) if 0 < fraction < 1 else None
