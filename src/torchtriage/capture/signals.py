"""What the training process says about each step besides its time: the loss passed to
``backward()``, the batch size of the first tensor each DataLoader yields, and how many
batches a DataLoader with workers keeps in flight (``num_workers x prefetch_factor``).

Losses are kept detached and read once at the end (no sync per step). When
``memory.grad_accumulation`` split the batches (``micro_batches > 1``), a step's loss is the
mean of its micro-batches' losses and its batch size their sum.
"""

from __future__ import annotations

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


class SignalRecorder:
    """Patches ``Tensor.backward`` and the DataLoader iterator to record losses and batch
    sizes per step (see the module docstring)."""

    def __init__(self, host: KnobHost) -> None:
        self.host = host
        self.losses: list[Any] = []  # detached scalar tensors, one per step
        self.loss_counts: list[int] = []  # backward calls summed into each step's loss
        self.batch_sizes: list[int] = []
        self._loss_this_step = False
        self._batch_this_step = False
        # the most batches a DataLoader had in flight (num_workers x prefetch_factor)
        self.loader_queue = 0
        # batches already waiting in a worker DataLoader's queue after each fetch (recent)
        self.ready: list[int] = []
        self.loader_workers = 0  # the most worker processes a DataLoader used

    def new_step(self) -> None:
        """The next backward / batch belongs to the next step."""
        self._loss_this_step = self._batch_this_step = False

    def install(self, torch: Any) -> None:
        self._patch_backward(torch)
        self._patch_dataloader(torch)

    def _patch_backward(self, torch: Any) -> None:
        original = torch.Tensor.backward
        rec = self

        def backward(tensor, *args, **kwargs):
            if tensor.numel() == 1:
                if not rec._loss_this_step:
                    rec.losses.append(tensor.detach())
                    rec.loss_counts.append(1)
                    rec._loss_this_step = True
                elif rec.host.micro_batches > 1:
                    rec.losses[-1] = rec.losses[-1] + tensor.detach()
                    rec.loss_counts[-1] += 1
            return original(tensor, *args, **kwargs)

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
            if in_flight:
                ready = _ready_batches(it)
                if ready is not None:
                    rec.ready = [*rec.ready[-(READY_KEPT - 1):], ready]
            if not rec._batch_this_step or rec.host.micro_batches > 1:
                size = batch_size_of(batch, torch)
                if size is not None:
                    if rec._batch_this_step:
                        rec.batch_sizes[-1] += size
                    else:
                        rec.batch_sizes.append(size)
                    rec._batch_this_step = True
            return batch

        dataloader._BaseDataLoaderIter.__next__ = __next__

    def loss_points(self) -> list[LossPoint]:
        """Each step's loss (the mean over its micro-batches), read now."""
        points = []
        for step, (loss, count) in enumerate(zip(self.losses, self.loss_counts, strict=True)):
            try:
                points.append(LossPoint(step, float(loss) / count))
            except Exception:  # a tensor on a device that is gone
                continue
        return points


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
