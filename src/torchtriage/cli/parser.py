"""The command line's grammar: every command, option and help text, in argparse (stdlib).

Building the parser imports nothing beyond the standard library, so ``--version``, ``--help``
and a usage error answer in the time Python starts. Each command names its handler as
``"module:function"`` (a module of this package), imported only when that command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from torchtriage.version import __version__

DESCRIPTION = "What makes PyTorch training slow, what to fix first, and proof the fix worked."
# The commands whose trailing arguments (after --) are a command line to run.
COMMAND_RUNNERS = ("run", "ab", "fix")


class UsageError(Exception):
    """A command line argparse refused; the message is one line."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter with the terminal's width read as ``shutil.get_terminal_size``
    reads it (``COLUMNS``, else the terminal, else 80) but without importing shutil, which
    argparse does for every argument added (a formatter checks each one): shutil brings bz2
    and lzma, 3 ms of every command."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         width if width is not None else _columns() - 2)


def _columns() -> int:
    with contextlib.suppress(KeyError, ValueError):
        if (columns := int(os.environ["COLUMNS"])) > 0:
            return columns
    with contextlib.suppress(AttributeError, ValueError, OSError):
        if (columns := os.get_terminal_size(sys.__stdout__.fileno()).columns) > 0:
            return columns
    return 80


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (raised, not printed) and help text computed when
    it is shown (``epilog_factory``: the schema command lists the document types)."""

    def __init__(self, *args, epilog_factory: Callable[[], str] | None = None,
                 **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.epilog_factory = epilog_factory

    def format_help(self) -> str:
        if self.epilog_factory is not None:
            self.epilog = self.epilog_factory()
        return super().format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        required = "the following arguments are required: "
        if message.startswith(required):
            message = "Missing argument: " + message[len(required):].upper()
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def layer_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated layer names (``memory,kernel``)."""
    from torchtriage.diagnosis.vocabulary import LAYERS

    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in LAYERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{(unknown or [text])[0]!r} is not a layer (one of {', '.join(LAYERS)})")
    return names


def prescription_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated prescriptions or knobs that ``fix`` can try
    (``dataloader.num_workers,compile.mode``), as the prescription ids they name."""
    import difflib

    from torchtriage.diagnosis.knobs import tryable, tryable_names

    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names or [text]:
        if not tryable(name):
            close = difflib.get_close_matches(name, tryable_names(), n=1)
            raise argparse.ArgumentTypeError(
                f"{name!r} is not a prescription or knob fix can try"
                + (f" (did you mean {close[0]}?)" if close else
                   " (`torchtriage knobs` lists the knobs)"))
    return tuple(dict.fromkeys(p for name in names for p in tryable(name)))


def report_path(text: str) -> Path:
    """An argparse type: a report file that can be written, checked before any work (``ab``
    and ``fix`` would otherwise find out after minutes of trials). Not a directory; the
    nearest existing folder above it is a writable directory (the rest is created)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: {parent} is not writable")
    return path


def at_least(low: float, kind: type = int) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` not below ``low``."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is below the minimum of {low:g}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its messages
    return convert


def fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    value = at_least(0.0, float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} is above the maximum of 1")
    return value


def _schema_epilog() -> str:
    from torchtriage.results.registry import REGISTRY

    return "documents:\n" + "\n".join(f"  {d.name:10s} {d.what}" for d in REGISTRY)


class CommandSpec(NamedTuple):
    """One command: its name, its handler (``"module:function"``), its help text (the first
    paragraph is its line in ``--help``), what adds its options, and extra parser settings."""

    name: str
    handler: str
    text: str
    options: Callable[[Parser], None]
    parser_kwargs: Mapping[str, Any] = {}


def build_parser(command_name: str | None = None) -> Parser:
    """The ``torchtriage`` parser and its subcommands.

    Args:
        command_name: the command line's first word. When it names a command, only that
            command's parser is built, with its options: what that command line needs (its
            ``--help`` is that command's, its errors name it), and a short command spares most
            of argparse's set-up (a parser costs a help formatter and a dozen translation
            lookups). Any other word (an option, a typo, nothing) lists every command by name
            and help line, for ``--help`` and for refusing an unknown command. None builds
            every command with its options (the reference documentation, the tests).

    Returns:
        The root parser.
    """
    root = Parser(prog="torchtriage", description=DESCRIPTION)
    root.add_argument("--version", action="version", version=f"torchtriage {__version__}",
                      help="Show the version and exit.")
    commands = root.add_subparsers(title="commands", dest="command", metavar="COMMAND",
                                   parser_class=Parser)
    known = any(spec.name == command_name for spec in _COMMANDS)
    for spec in _COMMANDS:
        if known and spec.name != command_name:
            continue
        sub = commands.add_parser(spec.name, help=spec.text.split("\n\n")[0].replace("\n", " "),
                                  description=spec.text, **spec.parser_kwargs)
        sub.set_defaults(handler=spec.handler)
        if command_name is None or command_name == spec.name:
            spec.options(sub)
    return root


# The options every command may share.


def _device_memory(p: Parser) -> None:
    p.add_argument("--device-memory", metavar="SIZE",
                   help="Device capacity for the memory rule, e.g. 80GiB (stands in for a "
                        "GPU's memory on CPU-only traces).")


def _top(p: Parser) -> None:
    p.add_argument("--top", type=at_least(1), default=10, metavar="N",
                   help="Rows in the top-ops tables (default 10).")


def _as_json(p: Parser, text: str = "Print the diagnosis as JSON on stdout.") -> None:
    p.add_argument("--json", dest="json_out", action="store_true", help=text)


def _html(p: Parser) -> None:
    p.add_argument("--html", dest="html_out", type=report_path, metavar="PATH",
                   help="Also write a self-contained HTML report (opens offline) to this "
                        "file.")


def _markdown(p: Parser) -> None:
    p.add_argument("--md", dest="md_out", type=report_path, metavar="PATH",
                   help="Also write a Markdown summary (for a pull-request comment) to "
                        "this file.")


def _strict(p: Parser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="Fail (exit 2) when any file at the path cannot be read as a trace; "
                        "by default such files are listed as skipped and the others are "
                        "diagnosed.")


def _store(p: Parser) -> None:
    p.add_argument("--store", type=Path, metavar="PATH",
                   help="Run store (SQLite) to record into and read from; default "
                        "$TORCHTRIAGE_STORE, else ~/.local/share/torchtriage/runs.sqlite.")


def _min_effect(p: Parser) -> None:
    p.add_argument("--min-effect", type=fraction, default=0.02, metavar="FRACTION",
                   help="Smallest speedup that counts: faster/slower only when the whole "
                        "confidence interval clears 1 +/- this (default 0.02).")


def _out(p: Parser, default: str, text: str) -> None:
    p.add_argument("--out", type=Path, default=Path(default), metavar="DIR",
                   help=f"{text} (default {default}).")


def _timeout(p: Parser, text: str) -> None:
    p.add_argument("--timeout", type=at_least(1, float), metavar="S", help=text)


def _knob(p: Parser, text: str) -> None:
    p.add_argument("--knob", action="append", metavar="ID=VALUE", help=text)


def _trial_counts(p: Parser, trials: int, trials_help: str, warmup_help: str) -> None:
    """--trials, --warmup and --steps of an A/B."""
    p.add_argument("--trials", type=at_least(2), default=trials, metavar="N",
                   help=trials_help)
    p.add_argument("--warmup", type=at_least(2), default=3, metavar="N", help=warmup_help)
    p.add_argument("--steps", type=at_least(3), default=10, metavar="N",
                   help="Measured steps per trial, at least (default 10).")
    p.add_argument("--min-measure-s", dest="min_measure_s", type=at_least(0.0, float),
                   default=None, metavar="S",
                   help="Each trial measures at least this long; one process's fast steps "
                        "run on (default: trial_min_measure_s, 1 s).")


def _trailing(p: Parser, text: str) -> None:
    p.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help=text)


# Each command's options.


def _analyze_options(p: Parser) -> None:
    p.add_argument("path", type=Path, help="A trace (.json/.json.gz) or a directory of them.")
    _as_json(p)
    _device_memory(p)
    _top(p)
    _html(p)
    _markdown(p)
    _strict(p)


def _report_options(p: Parser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                   help="A run directory (torchtriage run / profile) or any directory or file "
                        "of traces.")
    _html(p)
    _device_memory(p)
    _strict(p)


def _demo_options(p: Parser) -> None:
    _out(p, "torchtriage-demo", "Run directory for the trace and report")
    _as_json(p)


def _run_options(p: Parser) -> None:
    _out(p, "torchtriage-run", "Run directory (traces, records, diagnosis.json)")
    p.add_argument("--steps", type=at_least(1), metavar="N",
                   help="Stop the script cleanly after N training steps in all (skipped ones "
                        "too).")
    p.add_argument("--skip", type=at_least(0), default=0, metavar="N",
                   help="Training steps to run before the profiling window, at least (a "
                        "DataLoader's queue of prepared batches drains first).")
    p.add_argument("--stop-after-window", action="store_true",
                   help="Stop the script cleanly once the steady-state window is profiled and "
                        "checked (a long job's diagnosis, then exit).")
    _timeout(p, "Stop the command after S seconds, keeping what was recorded.")
    _knob(p, "Apply a knob (repeatable); see `torchtriage knobs`.")
    _as_json(p, "Print the diagnosis as JSON on stdout (the script's own output goes to "
               "stderr).")
    _device_memory(p)
    _top(p)
    _store(p)
    _html(p)
    _trailing(p, "The training command, after --.")


def _compare_options(p: Parser) -> None:
    p.add_argument("a", type=Path, metavar="A",
                   help="Baseline: trace file, trace directory or run directory.")
    p.add_argument("b", type=Path, metavar="B", help="Candidate, the same kinds.")
    _as_json(p, "Print the comparison as JSON.")
    p.add_argument("--fail-on-regression", metavar="PCT",
                   help="Exit 1 when B is significantly slower than A by more than PCT (e.g. "
                        "5%%).")
    _min_effect(p)
    _device_memory(p)
    _store(p)
    _html(p)
    _markdown(p)
    _strict(p)


def _ab_options(p: Parser) -> None:
    _out(p, "torchtriage-ab", "Directory for ab.json, trials.jsonl and the trial logs")
    _knob(p, "Knob for the candidate arm (repeatable). None: an A/A noise test.")
    p.add_argument("--candidate", metavar="COMMAND",
                   help="The candidate's own command (a hand-written fix), quoted.")
    _trial_counts(p, 5, "Processes per arm (default 5).",
                 "Steps before measuring (at least 5 with compile.mode; default 3).")
    _timeout(p, "Seconds per trial.")
    _min_effect(p)
    _as_json(p, "Print ab.json on stdout, no progress.")
    _store(p)
    _html(p)
    _markdown(p)
    _trailing(p, "The training command, after --.")


def _fix_options(p: Parser) -> None:
    _out(p, "torchtriage-fix", "Directory for fix.json, fix.md, fix.patch (when a kept fix is "
        "a code edit) and every profile and A/B")
    p.add_argument("--budget", default="10m", metavar="DURATION",
                   help="Wall-clock budget, e.g. 90s, 10m, 1h (default 10m).")
    p.add_argument("--layers", type=layer_list, default=None, metavar="LAYER[,LAYER]",
                   help="Try only these layers' fixes, e.g. memory (default: every layer).")
    p.add_argument("--only", type=prescription_list, default=None, metavar="FIX[,FIX]",
                   help="Try only these prescriptions, or a knob's (e.g. "
                        "dataloader.num_workers, compile.mode), where the diagnosis "
                        "prescribes them (default: every one).")
    _trial_counts(p, 4, "Most trials per arm of each A/B (they stop earlier when the answer "
                 "is clear; default 4).", "Steps before measuring (default 3).")
    _timeout(p, "Seconds per trial or profile run.")
    _min_effect(p)
    _as_json(p, "Print fix.json on stdout, no progress.")
    _device_memory(p)
    _store(p)
    _html(p)
    _trailing(p, "The training command, after --.")


def _history_options(p: Parser) -> None:
    p.add_argument("--limit", type=at_least(1), default=20, metavar="N",
                   help="Most recent runs to list (default 20).")
    p.add_argument("--kind", help="Only runs of this kind: run, ab, compare, fix.")
    _as_json(p, "Print the runs as JSON.")
    _store(p)


def _show_options(p: Parser) -> None:
    p.add_argument("run_id", type=int, metavar="ID", help="Run id from `torchtriage history`.")
    _as_json(p, "Print the stored result as JSON.")
    _store(p)


def _knobs_options(p: Parser) -> None:
    """``knobs`` takes no options."""


def _schema_options(p: Parser) -> None:
    p.add_argument("document", nargs="?", default="diagnosis", metavar="DOCUMENT",
                   help="The document (default diagnosis); the list is below.")


_COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("analyze", "traces:analyze",
                "Diagnose a Kineto trace captured elsewhere (torch.profiler, "
                "tensorboard_trace_handler).",
                _analyze_options),
    CommandSpec("report", "traces:report",
                "Write the self-contained HTML report (default RUN_DIR/report.html): of a fix "
                "or ab\ndirectory (fix.json, ab.json), else of the traces in it.",
                _report_options),
    CommandSpec("demo", "runs:demo",
                "Profile the bundled data-starved example and print its diagnosis (CPU, "
                "~10 s).",
                _demo_options),
    CommandSpec("run", "runs:run",
                "Profile an unmodified script: torchtriage run [OPTIONS] -- python train.py "
                "ARGS\n(or -- torchrun --nproc_per_node=N train.py ARGS).",
                _run_options),
    CommandSpec("compare", "traces:compare",
                "Compare two profiles: speedup with a confidence interval, where the time "
                "went, op and\nkernel deltas.",
                _compare_options),
    CommandSpec("ab", "runs:ab",
                "A/B-test knobs on an unmodified script: torchtriage ab --knob ID=VALUE -- "
                "python\ntrain.py ARGS. Interleaved trials, bootstrap CI, loss parity.",
                _ab_options),
    CommandSpec("fix", "runs:fix",
                "Diagnose, try the bottleneck's fixes cheapest first, keep what an A/B "
                "proves:\ntorchtriage fix --out DIR -- python train.py ARGS.",
                _fix_options),
    CommandSpec("history", "documents:history",
                "List recorded runs, A/B experiments and comparisons (newest first).",
                _history_options),
    CommandSpec("show", "documents:show",
                "Show a recorded result again: an A/B verdict, a comparison, a run's "
                "diagnosis.",
                _show_options),
    CommandSpec("knobs", "documents:knobs", "List the knobs `run --knob` accepts.",
                _knobs_options),
    CommandSpec("schema", "documents:schema",
                "Print the JSON Schema of one of torchtriage's JSON documents.",
                _schema_options, {"epilog_factory": _schema_epilog}),
)
