"""Where training steps end, seen from inside the training process.

Steps are optimizer steps, seen through ``register_optimizer_step_post_hook``. With several
optimizers, the first repeat of an optimizer closes an iteration; after that the cycle is known
and each iteration closes after its last optimizer. Gradient accumulation is one step per
optimizer step, which is what it is. A script that calls :func:`torchtriage.step` marks its own
steps and the optimizer hooks are ignored from then on.

A script that updates its parameters by hand (``p.data.add_(p.grad, alpha=-lr)``, as
pytorch/examples' word_language_model does by default) never steps an optimizer: once
``BACKWARD_ONLY_AFTER`` calls of ``Tensor.backward()`` (outside any optimizer's closure) came
with no optimizer step before them, each ``backward()`` that returns closes a step from then on
(the steps before are not counted), and optimizers are ignored. Gradient accumulation that
runs more micro-batches than that before its first optimizer step would be taken for it; 64
is above the accumulation of the public recipes seen (nanoGPT: 40).
"""

from __future__ import annotations

import time

MANUAL = "torchtriage.step()"  # what closes a step the script marks itself
BACKWARD = "backward()"  # what closes a step where no optimizer steps
BACKWARD_ONLY_AFTER = 64  # backward() calls with no optimizer step before steps are backward's


class StepDetector:
    """Learns the optimizer cycle and says which optimizer steps close a training step."""

    def __init__(self) -> None:
        self.manual = False  # torchtriage.step() was called: the script marks its steps
        self.by_backward = False  # no optimizer steps: each backward() closes a step
        self._optimizer_seen = False
        self._backwards = 0  # backward() calls while no optimizer has stepped
        self._cycle: list[int] = []  # ids of optimizers in one iteration, once known
        self._seen: list[int] = []  # optimizers stepped in the current iteration

    def optimizer_stepped(self, optimizer: object) -> int:
        """How many training steps this optimizer step closes (0, 1, or 2 when the cycle
        becomes known on it)."""
        if self.manual or self.by_backward:
            return 0
        self._optimizer_seen = True
        key = id(optimizer)
        closed = 0
        if not self._cycle:
            if key not in self._seen:
                self._seen.append(key)
                return 0
            # The first optimizer came round again: the previous iteration ended with the
            # optimizer before this one (closed now, one forward/backward late, in a step that
            # is never analysed), and the cycle is known from here on.
            self._cycle, self._seen = list(self._seen), []
            closed += 1
        if key == self._cycle[-1]:
            closed += 1
        return closed

    def backward_returned(self) -> int:
        """How many training steps a ``backward()`` outside an optimizer's closure closes: 1
        once steps are backward's (see the module docstring), else 0."""
        if self.manual or self._optimizer_seen:
            return 0
        if not self.by_backward:
            self._backwards += 1
            if self._backwards < BACKWARD_ONLY_AFTER:
                return 0
            self.by_backward = True
        return 1

    @property
    def last_key(self) -> object:
        """What closes a training step: the id of the cycle's last optimizer (the optimizers
        seen so far while the cycle is not known), or ``MANUAL`` for torchtriage.step()."""
        if self.manual:
            return MANUAL
        if self.by_backward:
            return BACKWARD
        cycle = self._cycle or self._seen
        return cycle[-1] if cycle else None

    @property
    def description(self) -> str:
        """How steps were detected (the run record's ``step_detection``)."""
        if self.manual:
            return "torchtriage.step()"
        if self.by_backward:
            return (f"backward() (no optimizer.step() in the first {BACKWARD_ONLY_AFTER} "
                    "backward() calls: parameters updated by hand)")
        return f"optimizer.step ({max(len(self._cycle), 1)} optimizer(s) per step)"


class StepClock:
    """Host clock at each step's end, from the bootstrap's start."""

    def __init__(self, timing_warmup: int = 0) -> None:
        self.started = time.perf_counter()
        self.ends: list[float] = []
        self.warmup = timing_warmup  # steps before the measured window (timing mode)

    @property
    def steps(self) -> int:
        return len(self.ends)

    def tick(self) -> None:
        self.ends.append(time.perf_counter())

    def host_step_ms(self) -> list[float]:
        """Step i+1's end minus step i's, in milliseconds: every step's but the first's."""
        return self.step_ms(2, self.steps)

    def span(self, first: int, last: int) -> tuple[float, float] | None:
        """``time.perf_counter()`` span of steps ``first``..``last`` (counted from 1): from the
        end of the step before ``first`` to the end of ``last`` or of the latest step, when
        ``last`` has not ended. None when ``first`` is step 1 (no step ends before it) or has
        not ended."""
        if not 2 <= first <= len(self.ends):
            return None
        return self.ends[first - 2], self.ends[min(last, len(self.ends)) - 1]

    def step_ms(self, first: int, last: int) -> list[float]:
        """Host milliseconds of the steps ``first``..``last`` that have ended (each from the
        end of the step before it to its own; step 1 has none)."""
        ends = self.ends
        return [round((ends[n - 1] - ends[n - 2]) * 1e3, 3)
                for n in range(max(first, 2), min(last, len(ends)) + 1)]

    def first_step_s(self) -> float | None:
        """Seconds from the bootstrap's start (before the script's imports) to the first
        step's end: start-up cost such as compilation."""
        return round(self.ends[0] - self.started, 4) if self.ends else None

    def warmup_end_s(self) -> float | None:
        """Seconds from the bootstrap's start to the end of the warm-up."""
        if 0 < self.warmup <= len(self.ends):
            return round(self.ends[self.warmup - 1] - self.started, 4)
        return None
