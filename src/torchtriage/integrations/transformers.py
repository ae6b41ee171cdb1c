"""``TorchtriageCallback`` for the Hugging Face ``transformers.Trainer``: profile a steady-state
window of optimizer steps, write the trace, ``diagnosis.json`` and ``report.html`` into
``<args.output_dir>/torchtriage/``, and log the verdict through transformers' logger and the
trainer's log history.

Usage::

    from torchtriage.integrations.transformers import TorchtriageCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[TorchtriageCallback()])
    trainer.train()

Steps are optimizer steps (``on_step_end``): with ``gradient_accumulation_steps=k`` one step is
k micro-batches, and its batch size ``per_device_train_batch_size x k`` (per process). Losses
are the trainer's logged ones (every ``logging_steps``). Under ``torchrun`` every process
profiles the same steps and writes its own trace; the main process diagnoses the job once every
rank's record is there. The verdict is logged at WARNING by default, the level transformers
shows without ``log_level="info"``; it is also the last entry of ``trainer.state.log_history``.
The Trainer has no event for an exception: after a run that failed inside the window the
profiler stays open until :meth:`TorchtriageCallback.close` (in a notebook) or the process's
exit, which saves the trace undiagnosed (``torchtriage analyze DIR``); the next ``train()``
closes it too. What the window is and how it is placed:
:mod:`torchtriage.integrations.window`.
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path
from typing import Any

from torchtriage.errors import MissingDependencyError

try:
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
except ImportError:
    raise MissingDependencyError(
        "torchtriage.integrations.transformers needs Hugging Face transformers, which is not "
        "installed: pip install 'torchtriage[transformers]'") from None

from torchtriage.integrations.window import TrainerWindow, WindowResult
from torchtriage.results.run import Schedule

LOGGER = "transformers.trainer.torchtriage"  # under the trainer's logger and its verbosity


class TorchtriageCallback(TrainerCallback):
    """Profile and diagnose a steady-state window inside ``transformers.Trainer.train``.

    Args:
        out_dir: where the files go (default ``<args.output_dir>/torchtriage``).
        skip: steps before profiling may start (default 0; a DataLoader with workers moves
            the start past its ``num_workers x prefetch_factor`` batches in flight).
        wait, warmup, active: the profiler schedule (1, 2, 5).
        device_memory: capacity for the memory rule, e.g. ``"16GiB"``.
        report: write ``report.html`` too.
        log_level: the verdict's level on transformers' logger.
    """

    def __init__(self, out_dir: str | Path | None = None, *, skip: int = 0, wait: int = 1,
                 warmup: int = 2, active: int = 5, device_memory: int | str | None = None,
                 report: bool = True, log_level: int = logging.WARNING) -> None:
        self.window = TrainerWindow(
            out_dir, skip=skip, schedule=Schedule(wait=wait, warmup=warmup, active=active),
            device_memory=device_memory, report=report, logger=hf_logging.get_logger(LOGGER),
            level=log_level, step_detection="transformers: on_step_end")
        self.result: WindowResult | None = None  # on the main process, once training ended
        self._step_samples: int | None = None
        self._first_step = 0  # the trainer's global step when train() started (a resume)
        self._at_exit = False

    @property
    def out(self) -> Path | None:
        """The run directory (known once training started)."""
        return self.window.out

    def close(self) -> None:
        """Close a profiling window that a failed ``train()`` left open, saving its trace."""
        self.window.end_quietly()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._at_exit:  # no exception event: a failed run's window closes at exit
            self._at_exit = True
            atexit.register(self.close)
        self.result = None
        self._step_samples = args.train_batch_size * args.gradient_accumulation_steps
        self._first_step = state.global_step
        loader = kwargs.get("train_dataloader")
        self.window.begin(args.output_dir, rank=args.process_index,
                          world_size=args.world_size,
                          loaders=[loader] if loader is not None else [],
                          max_steps=state.max_steps - state.global_step
                          if state.max_steps and state.max_steps > 0 else None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.window.collecting:  # off, or after the window: nothing at all
            self.window.step_ended(self._step_samples)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs and self.window.collecting and isinstance(logs.get("loss"), (int, float)):
            self.window.loss_at(state.global_step - self._first_step, logs["loss"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.result = self.window.end()
        if self.result is not None and self.result.diagnosis is not None:
            doc = self.result.diagnosis
            state.log_history.append({
                "torchtriage/primary": doc.primary,
                "torchtriage/confidence": doc.confidence,
                **self.result.metrics,
                "torchtriage/out": str(self.result.out),
                "step": state.global_step,
            })
