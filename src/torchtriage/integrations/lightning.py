"""``TorchtriageCallback`` for ``lightning.Trainer``: profile a steady-state window of optimizer
steps, write the trace, ``diagnosis.json`` and ``report.html`` into
``<trainer.log_dir>/torchtriage/``, and log the verdict through Lightning's logger and the
trainer's loggers.

Usage::

    from torchtriage.integrations.lightning import TorchtriageCallback

    trainer = lightning.Trainer(max_steps=1000, callbacks=[TorchtriageCallback()])
    trainer.fit(model, loader)

Steps are optimizer steps: a batch ends one when ``trainer.global_step`` moved, so
``accumulate_grad_batches=k`` makes k batches one step (their losses averaged, their batch
sizes summed) and manual optimization with several optimizers makes each batch one step. Under
DDP every rank profiles the same steps and writes its own trace; rank 0 diagnoses the job once
every rank's record is there. What the window is and how it is placed:
:mod:`torchtriage.integrations.window`. Lightning's own ``profiler="pytorch"`` cannot run
beside it (one torch.profiler at a time): the callback then stays off and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torchtriage.errors import MissingDependencyError

try:
    import lightning.pytorch as pl
    import torch
except ImportError:
    raise MissingDependencyError(
        "torchtriage.integrations.lightning needs Lightning, which is not installed: "
        "pip install 'torchtriage[lightning]'") from None

from torchtriage.capture.signals import batch_size_of
from torchtriage.integrations.window import TrainerWindow, WindowResult
from torchtriage.results.run import Schedule

LOGGER = "lightning.pytorch.callbacks.torchtriage"  # shown by Lightning's handler (INFO)


class TorchtriageCallback(pl.Callback):
    """Profile and diagnose a steady-state window inside ``lightning.Trainer.fit``.

    Args:
        out_dir: where the files go (default ``<trainer.log_dir>/torchtriage``).
        skip: steps before profiling may start (default 0; a DataLoader with workers moves
            the start past its ``num_workers x prefetch_factor`` batches in flight).
        wait, warmup, active: the profiler schedule (1, 2, 5).
        device_memory: capacity for the memory rule, e.g. ``"16GiB"``.
        report: write ``report.html`` too.
        log_level: the verdict's level on the ``lightning.pytorch`` logger.
    """

    def __init__(self, out_dir: str | Path | None = None, *, skip: int = 0, wait: int = 1,
                 warmup: int = 2, active: int = 5, device_memory: int | str | None = None,
                 report: bool = True, log_level: int = logging.INFO) -> None:
        super().__init__()
        self.window = TrainerWindow(
            out_dir, skip=skip, schedule=Schedule(wait=wait, warmup=warmup, active=active),
            device_memory=device_memory, report=report, logger=logging.getLogger(LOGGER),
            level=log_level, step_detection="lightning: trainer.global_step")
        self.result: WindowResult | None = None  # on rank 0, once training ended
        self._global_step = 0

    @property
    def out(self) -> Path | None:
        """The run directory (known once training started)."""
        return self.window.out

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_dir = trainer.log_dir or trainer.default_root_dir  # every rank: a broadcast
        self.result = None
        self._global_step = trainer.global_step
        if _torch_profiler_in_use(trainer):
            self.window.log.warning("torchtriage: the trainer runs Lightning's PyTorchProfiler "
                                    "and torch.profiler runs one at a time; not profiling")
            return
        self.window.begin(log_dir, rank=trainer.global_rank, world_size=trainer.world_size,
                          loaders=list(_loaders(trainer.train_dataloader)),
                          max_steps=_total_steps(trainer))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        window = self.window
        if not window.collecting:  # off, or after the window: nothing at all
            return
        window.micro_batch(_loss(outputs), batch_size_of(batch, torch))
        if trainer.global_step != self._global_step:
            self._global_step = trainer.global_step
            window.step_ended()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.result = self.window.end()
        if self.result is not None and self.result.metrics:
            for logger in trainer.loggers:
                try:
                    logger.log_metrics(self.result.metrics, step=trainer.global_step)
                    logger.save()
                except Exception as exc:  # a logger's own failure is not training's
                    self.window.log.warning("torchtriage: %s did not take the metrics (%s)",
                                            type(logger).__name__, exc)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self.result = self.window.end(exception)


def _loss(outputs: Any) -> Any:
    """The loss in what ``training_step`` returned (a tensor, or a mapping's ``"loss"``)."""
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    return outputs if getattr(outputs, "ndim", None) == 0 else None


def _loaders(loaders: Any) -> Iterator[Any]:
    """The DataLoaders in ``trainer.train_dataloader`` (one, or a collection of them)."""
    if isinstance(loaders, Mapping):
        for item in loaders.values():
            yield from _loaders(item)
    elif isinstance(loaders, (list, tuple)):
        for item in loaders:
            yield from _loaders(item)
    elif loaders is not None:
        yield loaders


def _total_steps(trainer: pl.Trainer) -> int | None:
    """The optimizer steps this fit will take (Lightning's estimate, from ``max_steps``,
    ``max_epochs`` and the loader's length); None when unknown."""
    try:
        steps = trainer.estimated_stepping_batches
    except Exception:  # no length to estimate from
        steps = float("inf")
    if steps == float("inf") or steps <= 0:
        return trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
    return int(steps)


def _torch_profiler_in_use(trainer: pl.Trainer) -> bool:
    from lightning.pytorch.profilers import PyTorchProfiler

    return isinstance(getattr(trainer, "profiler", None), PyTorchProfiler)
