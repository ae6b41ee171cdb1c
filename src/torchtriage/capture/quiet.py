"""Keep the profiler's C++ stderr noise out of the user's terminal.

Kineto prints lines such as ``USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start`` on
every start and stop (``KINETO_LOG_LEVEL`` does not silence them), and the CPU allocator warns
``Memory block of unknown size was allocated before the profiling started`` from inside the
user's own step. Both are written by C++ to file descriptor 2, so ``sys.stderr`` cannot catch
them. :class:`StderrFilter` points fd 2 at a pipe for the whole profiled window; a thread passes
every line through to the real stderr as it arrives, except the known noise.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import threading
import warnings

NOISE = re.compile(
    rb"^(\[rank\d+\]:)?(USDT:.*profiler_(start|stop)|STAGE:.*ActivityProfilerController|"
    rb"\[W.*(CPUAllocator|Memory block of unknown size|collection\.cpp|kineto_shim).*)"
)
_FLUSH_PARTIAL_AFTER_S = 0.05  # a partial line (progress bars use \r) is passed on after this


class StderrFilter:
    """Filter fd 2 between :meth:`start` and :meth:`stop`; a no-op when fd 2 is unusable."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._saved: int | None = None
        self._read_fd: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.enabled or self._saved is not None:
            return
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):
            return
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._saved, self._read_fd = saved, read_fd
        self._thread = threading.Thread(target=self._pump, name="torchtriage-stderr",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._saved is None:
            return
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        os.dup2(self._saved, 2)  # closes the pipe's last write end: the pump sees EOF
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(self._saved)
        self._saved = self._thread = None

    def _pump(self) -> None:
        assert self._read_fd is not None and self._saved is not None
        fd, out = self._read_fd, self._saved
        pending = b""
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], _FLUSH_PARTIAL_AFTER_S)
                if not ready:
                    if pending:
                        _write(out, pending)
                        pending = b""
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                pending += chunk
                lines = re.split(rb"(?<=[\n\r])", pending)
                pending = lines.pop()  # "" or an unterminated tail
                kept = b"".join(line for line in lines if not NOISE.match(line))
                if kept:
                    _write(out, kept)
            if pending and not NOISE.match(pending):
                _write(out, pending)
        finally:
            os.close(fd)


def _write(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, data)


# torch warns about cycles it clears; a session records one cycle only, so it is noise.
_PROFILER_WARNINGS = r"Warning: Profiler clears events at the end of each cycle"


@contextlib.contextmanager
def profiler_call():
    """A call into torch.profiler with its cycle warning silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PROFILER_WARNINGS)
        yield
