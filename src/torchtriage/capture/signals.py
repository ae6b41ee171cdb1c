"""What the training process says about each step besides its time: the loss passed to
``backward()``, the batch size of the tensors DataLoaders yield, and how many batches a
DataLoader with workers keeps in flight (``num_workers x prefetch_factor``).

Both are recorded per *segment* (what happened up to each optimizer step, or up to each
:func:`torchtriage.step`) and grouped into training steps at the end, when the optimizer
cycle is known (:class:`~torchtriage.capture.steps.StepDetector`): one loss and one batch size
per training step, however many optimizers, backward calls and batches it took.

- **Loss**: the sum of the scalars passed to ``backward()`` in the step's first segment that
  has any (a GAN: the discriminator's real and fake losses, as dcgan's ``errD``; gradient
  accumulation: each micro-batch's scaled loss, summed to the step's mean), divided by
  ``memory.grad_accumulation``'s micro-batches when that knob split the batches (its
  micro-batch losses are unscaled). Inside ``optimizer.step(closure)`` only the closure's first
  call counts: LBFGS evaluates it again at each line-search point, and returns the first.
- **Batch size**: the sum of the first tensor's leading dimension over the batches the step
  fetched from the first dataset it read (accumulation: its micro-batches; a GAN's generator
  step fetches nothing).

Losses are kept as detached copies and read once at the end (no sync per step; a copy, since
a CUDA graph's static output buffer is overwritten by its next replay).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchtriage.capture.knob_host import KnobHost
from torchtriage.results.run import LossPoint

MAX_BATCH_SIZES = 64  # batch sizes kept in the run record
READY_KEPT = 8  # recent ready-queue readings kept


def batches_in_flight(loader: Any) -> int:
    """How many batches a DataLoader with workers prepares ahead (``num_workers x
    prefetch_factor``), read from the DataLoader or from its iterator; 0 without workers."""
    workers = getattr(loader, "_num_workers", None)
    if workers is None:
        workers = getattr(loader, "num_workers", 0)
    factor = getattr(loader, "_prefetch_factor", None)
    if factor is None:
        factor = getattr(loader, "prefetch_factor", 0)
    try:
        return int(workers or 0) * int(factor or 0)
    except (TypeError, ValueError):  # a DataLoader-like object with other attributes
        return 0


def _ready_batches(it: Any) -> int | None:
    """Batches a worker DataLoader iterator has received and not yet handed out (None when
    the platform cannot tell)."""
    try:
        return int(it._data_queue.qsize())
    except Exception:  # qsize is not implemented everywhere (macOS)
        return None


class Segment:
    """What happened up to one optimizer step (or one torchtriage.step())."""

    __slots__ = ("batches", "key", "losses")

    def __init__(self) -> None:
        self.key: object = None  # id of the optimizer that closed it, or MANUAL
        self.losses: list[Any] = []  # copies of the scalar tensors passed to backward()
        self.batches: list[tuple[int, int]] = []  # (id of the dataset, batch size)


class SignalRecorder:
    """Patches ``Tensor.backward`` and the DataLoader iterator to record losses and batch
    sizes per segment (see the module docstring)."""

    def __init__(self, host: KnobHost) -> None:
        self.host = host
        self.segments: list[Segment] = []  # closed segments, in order
        self._open = Segment()
        self._closure_call: int | None = None  # index of the running closure call, if any
        # the most batches a DataLoader had in flight (num_workers x prefetch_factor)
        self.loader_queue = 0
        # batches already waiting in a worker DataLoader's queue after each fetch (recent)
        self.ready: list[int] = []
        self.loader_workers = 0  # the most worker processes a DataLoader used
        self.loader_batches = 0  # batches fetched from any DataLoader
        # called after each backward() outside an optimizer's closure (steps by backward())
        self.after_backward: Callable[[], None] | None = None

    def close_segment(self, key: object) -> None:
        """An optimizer step (``key``: its id) or torchtriage.step() (MANUAL) ended."""
        self._open.key = key
        self.segments.append(self._open)
        self._open = Segment()
        self._closure_call = None

    def discard_open(self) -> None:
        """Forget what the open segment holds (the many iterations before steps were known to
        be backward()'s: no one step's loss or batch size)."""
        self._open = Segment()

    def install(self, torch: Any) -> None:
        from torchtriage.capture.closures import count_closure_calls

        self._patch_backward(torch)
        self._patch_dataloader(torch)
        count_closure_calls(self._closure_called)

    def _closure_called(self, index: int) -> None:
        self._closure_call = index

    def _patch_backward(self, torch: Any) -> None:
        original = torch.Tensor.backward
        rec = self

        def backward(tensor, *args, **kwargs):
            if tensor.numel() == 1 and not rec._closure_call:
                # a copy, not an alias: a CUDA graph (compile mode reduce-overhead) returns the
                # loss in a static buffer that its next replay overwrites; the copy is one
                # asynchronous device op, no sync
                rec._open.losses.append(tensor.detach().clone())
            result = original(tensor, *args, **kwargs)
            if rec.after_backward is not None and rec._closure_call is None:
                rec.after_backward()
            return result

        torch.Tensor.backward = backward

    def _patch_dataloader(self, torch: Any) -> None:
        from torch.utils.data import dataloader

        original_next = dataloader._BaseDataLoaderIter.__next__
        rec = self

        def __next__(it):
            in_flight = batches_in_flight(it)
            if in_flight > rec.loader_queue:
                rec.loader_queue = in_flight
                rec.loader_workers = max(rec.loader_workers, it._num_workers)
            batch = original_next(it)
            rec.loader_batches += 1
            if in_flight:
                ready = _ready_batches(it)
                if ready is not None:
                    rec.ready = [*rec.ready[-(READY_KEPT - 1):], ready]
            size = batch_size_of(batch, torch)
            if size is not None:
                rec._open.batches.append((id(getattr(it, "_dataset", it)), size))
            return batch

        dataloader._BaseDataLoaderIter.__next__ = __next__

    def steps(self, last_key: object) -> list[tuple[list[Any], int | None]]:
        """The closed segments grouped into training steps, each ending with a segment whose
        key is ``last_key`` (the cycle's last optimizer, or MANUAL): per step, the losses of
        its first segment that has any, and its batch size (None: no batch). Segments after
        the last step's end belong to no finished step and are left out."""
        out: list[tuple[list[Any], int | None]] = []
        losses: list[Any] = []
        batches: list[tuple[int, int]] = []
        for segment in self.segments:
            if not losses:
                losses = segment.losses
            batches.extend(segment.batches)
            if segment.key == last_key:
                first = batches[0][0] if batches else None
                size = sum(n for d, n in batches if d == first) if batches else None
                out.append((losses, size))
                losses, batches = [], []
        return out

    def loss_points(self, last_key: object) -> list[LossPoint]:
        """Each step's loss (see the module docstring), read now."""
        points = []
        split = max(self.host.micro_batches, 1)
        for step, (losses, _) in enumerate(self.steps(last_key)):
            if not losses:
                continue
            try:
                points.append(LossPoint(step, sum(float(x) for x in losses) / split))
            except Exception:  # a tensor on a device that is gone
                continue
        return points

    def batch_sizes(self, last_key: object) -> list[int]:
        """Each step's batch size (steps that fetched none left out)."""
        return [size for _, size in self.steps(last_key) if size is not None]


def batch_size_of(batch: Any, torch: Any) -> int | None:
    """The batch size of a batch: the first dimension of its first tensor (in a tuple, list or
    dict, depth first); None when it holds no tensor with a dimension."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = batch_size_of(item, torch)
            if size is not None:
                return size
    if isinstance(batch, dict):
        for item in batch.values():
            size = batch_size_of(item, torch)
            if size is not None:
                return size
    return None
