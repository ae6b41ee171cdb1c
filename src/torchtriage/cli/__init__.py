"""The ``torchtriage`` command line.

Every user error ends as one line on stderr, ``torchtriage: error: ...``, and exit status 2;
an unexpected failure is one line too (exit 3), with the traceback only when
``TORCHTRIAGE_DEBUG=1``.

Startup is kept to what a command needs: the grammar (:mod:`torchtriage.cli.parser`) is stdlib
argparse, and each command's module (``traces``: analyze, report, compare; ``documents``:
history, show, knobs, schema; ``runs``: run, ab, fix, demo) is imported only when that command
runs, and imports its implementation inside the handler. Only ``runs`` reaches torch.
"""

from __future__ import annotations

import errno
import gc
import importlib
import os
import re
import sys

from torchtriage.errors import TorchtriageError


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit status instead of raising."""
    from torchtriage.cli.parser import COMMAND_RUNNERS, UsageError, build_parser

    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_in[0] if args_in else "")  # that command's options only
    try:
        if not args_in:
            parser.print_help(sys.stderr)
            return 2
        args = parser.parse_args(_before_command_line(args_in, COMMAND_RUNNERS))
        if args.command in COMMAND_RUNNERS:
            args.command_line = _command_line(args_in, args.command_line)
        module, function = args.handler.split(":")
        if module == "runs":  # long commands (training, trials): the collector as usual
            gc.enable()
        elif module == "traces":  # short commands that decode traces
            keep_freed_memory()
        handler = getattr(importlib.import_module(f"torchtriage.cli.{module}"), function)
        if args.command not in COMMAND_RUNNERS:
            return handler(args) or 0
        from torchtriage.capture.interrupt import forwarding

        with forwarding():  # SIGTERM/SIGINT/SIGHUP: stop the command's group, exit 128 + N
            return handler(args) or 0
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except UsageError as exc:
        print(f"torchtriage: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchtriage: interrupted", file=sys.stderr)
        return 130
    except TorchtriageError as exc:
        print(f"torchtriage: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # never a traceback for the user
        if isinstance(exc, OSError) and exc.errno in MACHINE_ERRNOS:
            # the machine, not torchtriage: a full disk or quota, a read-only file system
            where = f" ({exc.filename})" if exc.filename else ""
            print(f"torchtriage: error: {exc.strerror}{where}; what was written before it is "
                  "kept", file=sys.stderr)
            return 1
        if os.environ.get("TORCHTRIAGE_DEBUG") == "1":
            raise
        print(f"torchtriage: internal error: {type(exc).__name__}: {exc} "
              "(set TORCHTRIAGE_DEBUG=1 for the traceback)", file=sys.stderr)
        return 3


MACHINE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # one line, exit 1, not internal
# glibc's mallopt options, and what a command that decodes traces sets them to
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MALLOC_SETTINGS = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 128 << 20),
                    (_M_TOP_PAD, 16 << 20))


def keep_freed_memory() -> bool:
    """Have glibc's allocator keep the memory a short command frees for its next allocations,
    instead of handing blocks over 128 KB back to the kernel at every free and faulting fresh
    zeroed pages in for the next: a trace load allocates and frees blocks of megabytes per
    piece. Blocks up to 32 MB come from the heap, and up to 128 MB of free heap is kept.
    Measured on 2 cores (analyze --json of the MTIA and df_index_resolver traces): a third of
    the page faults of the load, 9-14 % of the whole command. Only in the CLI's own process
    (and the decoder it forks), never in a library user's; a no-op where the C library is not
    glibc. Returns whether the settings took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # (musl has no mallopt)
        return False
    return all(mallopt(option, value) == 1 for option, value in _MALLOC_SETTINGS)


def _before_command_line(argv: list[str], runners: tuple[str, ...]) -> list[str]:
    """For run/ab/fix, the arguments up to ``--`` (the command after it is not parsed); a
    value that starts with a minus sign is joined to its option (``--budget=-5m``), which
    argparse would take for an option of its own and refuse without saying why."""
    if argv and argv[0] in runners and "--" in argv:
        argv = argv[:argv.index("--")]
    joined: list[str] = []
    for token in argv:
        if (joined and joined[-1].startswith("--") and "=" not in joined[-1]
                and re.match(r"-\.?\d", token)):
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    return joined


def _command_line(argv: list[str], parsed: list[str]) -> list[str]:
    """The command line to run: everything after the first ``--``, or what argparse left."""
    if "--" in argv:
        return argv[argv.index("--") + 1:]
    return parsed


def entry_point() -> None:
    """The ``torchtriage`` console script."""
    # Reading commands are short-lived and make no garbage in cycles worth collecting (decoded
    # JSON, numpy columns and documents are freed by reference counts), while the collections
    # that imports trigger walk numpy's and rich's objects over and over: 10-14 ms of a 0.18 s
    # ``analyze`` (gc.callbacks, 1 MB trace). main() turns the collector back on for run, ab,
    # fix and demo, which run training and trials for minutes.
    gc.disable()
    status = main()
    # The interpreter's last garbage collections at exit walk every object the imports made
    # (numpy, rich...): 50-90 ms of a 0.4 s command. Frozen objects are left to the process's
    # end; atexit handlers, flushes and refcount finalizers run as always.
    gc.freeze()
    sys.exit(status)


__all__ = ["entry_point", "main"]
