"""What :mod:`torchtriage.capture.knob_apply`'s hooks see of the run: the knobs asked for, where
to note what each did, and the micro-batch state that ``memory.grad_accumulation`` shares with
the signal recorder and DDP's gradient sync."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchtriage.diagnosis.knobs import not_reached
from torchtriage.results.run import KnobOutcome


def _always_sync() -> bool:
    return True


class KnobHost:
    """The knob hooks' view of the run (see the module docstring)."""

    def __init__(self, knobs: dict[str, Any]) -> None:
        self.knobs: dict[str, Any] = dict(knobs)
        # > 1 once memory.grad_accumulation split a DataLoader's batches: a step's loss is
        # then the mean of its micro-batches' losses and its batch size their sum
        self.micro_batches: int = 1
        # whether the coming backward is the last micro-batch of a step (DDP syncs only then);
        # memory.grad_accumulation replaces it
        self.sync_this_backward: Callable[[], bool] = _always_sync
        self.log: dict[str, KnobOutcome] = {}

    def note(self, knob: str, applied: bool, detail: str, where: str | None = None) -> None:
        """Record what a knob did (first outcome per knob wins, later ones are counted).
        ``where`` is the ``file:line`` of the user's call it changed (for the fix patch)."""
        entry = self.log.get(knob)
        if entry is None:
            entry = self.log[knob] = KnobOutcome(value=self.knobs.get(knob), applied=applied,
                                                 detail=detail, count=0, where=[])
        entry.count += 1
        if applied and not entry.applied:
            entry.applied, entry.detail = True, detail
        if applied and where and where not in entry.where:
            entry.where.append(where)

    def outcomes(self) -> dict[str, KnobOutcome]:
        """The knob log, plus an entry for each knob the script never reached."""
        out = dict(self.log)
        for knob, value in self.knobs.items():
            if knob not in out:
                out[knob] = KnobOutcome(value=value, applied=False,
                                        detail=f"not reached: {not_reached(knob)}")
        return out
