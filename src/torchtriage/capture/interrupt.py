"""SIGTERM, SIGINT and SIGHUP to torchtriage: stop the command's process group, keep what was
recorded, exit ``128 + signal``.

The command runs in a session (and process group) of its own, so a signal to torchtriage (a
scheduler's SIGTERM, Ctrl-C in the terminal, a closed SSH session) does not reach it by
itself. While a :func:`forwarding` guard is open, torchtriage's handler for the three signals
records the first one and :func:`~torchtriage.capture.runner.run_command` forwards it to the
group of the command it is waiting on (the bootstrap turns SIGTERM and SIGHUP into a clean
exit that saves the trace; SIGINT is a ``KeyboardInterrupt`` there), waits
``TERM_GRACE_S`` for it, then SIGKILLs whatever is left of the group (DataLoader workers
included). A second signal SIGKILLs the group at once.

A guard that *defers* (``ab``, ``fix``: their trials' bookkeeping must not be cut in half)
only records a signal that comes while no command runs; the orchestrator calls :func:`check`
where stopping is safe. A guard that does not defer (the CLI around a whole command) raises
:class:`Interrupted` at once when no command runs. When the guard closes after a signal, its
exception is :class:`Interrupted` whatever the command ended with, so the exit status is
always ``128 + signal`` (143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP).

Signals that torchtriage itself ignores (SIGHUP under ``nohup``) stay ignored. Outside the
main thread nothing is installed (Python allows handlers only there).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
log = logging.getLogger(__name__)


class Interrupted(SystemExit):
    """torchtriage was told to stop by a signal; ``code`` is ``128 + signal``.

    A ``SystemExit``: code that catches ``Exception`` lets it through, and the CLI turns it
    into the exit status. ``detail`` says what was kept (the orchestrator that stops sets it;
    an outer one overwrites an inner one's); the outermost guard logs it as one line.
    """

    def __init__(self, signum: int, detail: str = "") -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.detail = detail
        self.announced = False

    @property
    def name(self) -> str:
        return signal_name(self.signum)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class _State:
    def __init__(self) -> None:
        self.depth = 0  # open guards
        self.defer = 0  # open guards that defer
        self.received: list[int] = []  # signals since the outermost guard opened
        self.running = 0  # commands being waited on
        self.previous: dict[int, object] = {}

    def reset(self) -> None:
        self.received.clear()


_state = _State()


def pending() -> int | None:
    """The first signal received under the open guards, or None."""
    return _state.received[0] if _state.received else None


def insists() -> bool:
    """Whether a second signal came: stop the command now, without a grace period."""
    return len(_state.received) > 1


def check() -> None:
    """Raise :class:`Interrupted` when a signal was received (a safe place to stop)."""
    signum = pending()
    if signum is not None:
        raise Interrupted(signum)


@contextlib.contextmanager
def waiting_on_command() -> Iterator[None]:
    """While a command runs, a signal is only recorded: the runner forwards it and waits."""
    _state.running += 1
    try:
        yield
    finally:
        _state.running -= 1


def _handle(signum: int, frame: FrameType | None) -> None:
    _state.received.append(signum)
    if _state.running:
        return  # the runner forwards it to the command's group and waits for it
    if _state.defer and len(_state.received) == 1:
        return  # the orchestrator stops where it is safe (check())
    raise Interrupted(_state.received[0])  # the exit status follows the first signal


def forwarding(*, defer: bool = False, convert: bool = True) -> Forwarding:
    """The guard described in the module docstring (see :class:`Forwarding`)."""
    return Forwarding(defer=defer, convert=convert)


class Forwarding(contextlib.AbstractContextManager):
    """The guard described in the module docstring.

    Args:
        defer: between commands, record a signal instead of raising at once.
        convert: on closing after a signal, raise :class:`Interrupted` (the runner's own
            guard does not: it returns what the command recorded).
    """

    def __init__(self, *, defer: bool = False, convert: bool = True) -> None:
        self.defer = defer
        self.convert = convert
        self.installed = False

    def __enter__(self) -> Forwarding:
        if _state.depth == 0 and threading.current_thread() is threading.main_thread():
            _state.reset()
            for signum in FORWARDED:
                previous = signal.getsignal(signum)
                if previous is signal.SIG_IGN:
                    continue  # nohup: torchtriage does not hang up either
                _state.previous[signum] = previous
                signal.signal(signum, _handle)
            self.installed = True
        _state.depth += 1
        _state.defer += self.defer
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _state.depth -= 1
        _state.defer -= self.defer
        signum = pending()
        if self.installed:
            for number, previous in _state.previous.items():
                signal.signal(number, previous)  # type: ignore[arg-type]
            _state.previous.clear()
            _state.reset()
        if signum is None or not self.convert or isinstance(exc, Interrupted):
            if isinstance(exc, Interrupted) and self.installed:
                _announce(exc, None)
            return
        stopped = Interrupted(signum)
        if self.installed:
            _announce(stopped, exc)
        raise stopped from exc


def _announce(stopped: Interrupted, exc: BaseException | None) -> None:
    """The one line that says why torchtriage stops and what it kept; none when the command
    already printed its error line (``run``: the command was stopped, what it recorded)."""
    said = isinstance(exc, SystemExit) and exc.code not in (0, None)
    if not stopped.announced and not said:
        log.warning("torchtriage: interrupted by %s%s", stopped.name,
                    f": {stopped.detail}" if stopped.detail else "")
    stopped.announced = True
