"""Closures passed to ``optimizer.step(closure)``, seen from inside the training process.

Optimizers such as LBFGS (and Lightning's automatic optimization, for every optimizer) run the
model's forward, the loss and backward inside ``optimizer.step``, by calling the closure, once
or many times. A global optimizer step pre-hook (``register_optimizer_step_pre_hook``, whose
returned ``(args, kwargs)`` replace the step's) swaps the closure, positional or keyword, for a
wrapper; the training code and what the closure returns are unchanged.

- :func:`mark_closures` (the profiling session): each call runs inside a profiler range named
  ``CLOSURE_PREFIX + <optimizer class>``, so that the analysis attributes its ops to forward and
  backward rather than to the optimizer.
- :func:`count_closure_calls` (the run bootstrap): tells a callback the index of each call
  within its optimizer step, so that the losses of LBFGS's re-evaluations are not taken for
  the step's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchtriage.analysis.categories import CLOSURE_PREFIX


def _closure_hook(wrap: Callable[[Any, Callable[[], Any]], Callable[[], Any]]) -> Any:
    """Register a global pre-hook that replaces a step's closure by ``wrap(optimizer,
    closure)``; returns the hook's handle (``.remove()``)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def hook(optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(args) > 1 and callable(args[1]):
            return (args[0], wrap(optimizer, args[1]), *args[2:]), kwargs
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": wrap(optimizer, kwargs["closure"])}
        return None

    return register_optimizer_step_pre_hook(hook)


def mark_closures() -> Any:
    """Each closure call inside ``CLOSURE_PREFIX<optimizer class>`` (a profiler range)."""
    from torch.autograd.profiler import record_function

    def wrap(optimizer: Any, closure: Callable[[], Any]) -> Callable[[], Any]:
        name = CLOSURE_PREFIX + type(optimizer).__name__

        def marked(*args: Any, **kwargs: Any) -> Any:
            with record_function(name):
                return closure(*args, **kwargs)

        return marked

    return _closure_hook(wrap)


def count_closure_calls(on_call: Callable[[int], None]) -> Any:
    """``on_call(i)`` before the i-th call (from 0) of a closure within one optimizer step."""

    def wrap(optimizer: Any, closure: Callable[[], Any]) -> Callable[[], Any]:
        calls = [0]

        def counted(*args: Any, **kwargs: Any) -> Any:
            on_call(calls[0])
            calls[0] += 1
            return closure(*args, **kwargs)

        return counted

    return _closure_hook(wrap)
