"""User-facing errors.

Every problem caused by the user's input (a bad path, a file that is not a trace, a script that
fails) raises a :class:`TorchtriageError` subclass whose message is one plain line. The CLI prints
that line and exits non-zero; it never shows a traceback for these.
"""

from __future__ import annotations


class TorchtriageError(Exception):
    """Base class of errors whose message is meant for the user, as one line."""

    exit_code = 2


class TraceError(TorchtriageError):
    """A trace file or directory cannot be read as a Kineto trace."""


class CaptureError(TorchtriageError):
    """Profiling could not produce a trace (for example, too few steps were run)."""


class MissingDependencyError(TorchtriageError, ImportError):
    """An optional integration was imported without the package it integrates with."""
