"""Run a function on the main thread part-way through a training step: after ``seconds``, or
once ``due()`` says so.

The profiling session uses it to stop a window part-way through one step, when a whole step
would record more than the profiler may hold in memory (:mod:`torchtriage.capture.cost_guard`),
and to stop the cost probe once the process has grown by that much.

Algorithm: a daemon thread waits ``seconds`` (or polls ``due()`` every ``poll_s``), then asks
the interpreter to run the cut on the main thread at its next bytecode boundary (CPython's
``Py_AddPendingCall``, which any thread may call). The training thread is the main thread
(the session checks), so the cut runs between two Python lines of the training step, never
inside a torch op; a long C++ call (a whole backward pass) delays it until it returns.
:meth:`StepCut.cancel`, called on the main thread when the step ends first, makes a pending
cut do nothing. A cut that raises is logged as one warning, never raised into the training
loop.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
_PENDING_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class StepCut:
    """``cut()`` on the main thread ``seconds`` after :meth:`start`, or once ``due()`` is
    true (polled every ``poll_s``), unless cancelled."""

    def __init__(self, cut: Callable[[], None], *, seconds: float | None = None,
                 due: Callable[[], bool] | None = None, poll_s: float = 0.05) -> None:
        if (seconds is None) == (due is None):
            raise ValueError("StepCut takes seconds or due, one of them")
        self.seconds, self.due, self.poll_s = seconds, due, poll_s
        self._cut = cut
        self._done = threading.Event()  # cancelled, or cut
        self._callback = _PENDING_CALL(self._run)  # referenced here while it may be called

    def start(self) -> None:
        threading.Thread(target=self._wait, name="torchtriage-step-cut", daemon=True).start()

    def cancel(self) -> None:
        """On the main thread: the cut will not run (a pending one does nothing)."""
        self._done.set()

    def _wait(self) -> None:
        if self.due is None:
            if self._done.wait(self.seconds):
                return
        else:
            while not self._done.wait(self.poll_s):
                if self.due():
                    break
            else:  # cancelled
                return
        ctypes.pythonapi.Py_AddPendingCall(self._callback, None)

    def _run(self, _arg: object) -> int:
        if self._done.is_set():
            return 0
        self._done.set()
        try:
            self._cut()
        except Exception as exc:  # never into the training loop
            log.warning("torchtriage: the profiler could not be stopped part-way through the "
                        "step (%s: %s)", type(exc).__name__, exc)
        return 0


def on_main_thread() -> bool:
    """Whether the caller is the main thread (the only one a pending call runs on)."""
    return threading.current_thread() is threading.main_thread()
