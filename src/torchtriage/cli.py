"""The ``torchtriage`` command line.

Every user error ends as one line on stderr, ``torchtriage: error: ...``, and exit status 2;
an unexpected failure is one line too (exit 3), with the traceback only when
``TORCHTRIAGE_DEBUG=1``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import msgspec
import typer
from rich.console import Console

from torchtriage import __version__
from torchtriage.errors import TorchtriageError

app = typer.Typer(
    name="torchtriage",
    help="What makes PyTorch training slow, what to fix first, and proof the fix worked.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

DeviceMemory = Annotated[
    str | None,
    typer.Option("--device-memory", metavar="SIZE",
                 help="Device capacity for the memory rule, e.g. 80GiB (stands in for a GPU's "
                      "memory on CPU-only traces)."),
]
Top = Annotated[int, typer.Option("--top", min=1, help="Rows in the top-ops tables.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON on stdout.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"torchtriage {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """torchtriage: profile, classify the bottleneck layer, prescribe fixes cheapest first."""


@app.command()
def analyze(
    path: Annotated[Path, typer.Argument(help="A trace (.json/.json.gz) or a directory of them.")],
    json_out: AsJson = False,
    device_memory: DeviceMemory = None,
    top: Top = 10,
) -> None:
    """Diagnose a Kineto trace captured elsewhere (torch.profiler, tensorboard_trace_handler)."""
    from torchtriage.api import analyze as analyze_path

    diagnoses = analyze_path(path, device_memory=device_memory, top=top)
    if json_out:
        if len(diagnoses) == 1:
            sys.stdout.write(diagnoses[0].to_json() + "\n")
        else:
            doc = {"schema": "torchtriage.diagnoses/1", "diagnoses": diagnoses}
            sys.stdout.write(msgspec.json.format(msgspec.json.encode(doc)).decode() + "\n")
        return
    console = Console()
    for d in diagnoses:
        console.print(d)


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Run directory for the trace and report.")]
    = Path("torchtriage-demo"),
    json_out: AsJson = False,
) -> None:
    """Profile the bundled data-starved example and print its diagnosis (CPU, ~10 s)."""
    from torchtriage.capture.session import profile
    from torchtriage.demo import DEMO_EXAMPLE, DEMO_STEPS, load_example

    example = load_example(DEMO_EXAMPLE)
    console = Console(stderr=json_out)
    console.print(f"[dim]torchtriage demo: profiling examples/{DEMO_EXAMPLE}.py "
                  f"for {DEMO_STEPS} steps into {out}/ ...[/dim]")
    with profile(out) as prof:
        example.train(DEMO_STEPS, on_step=prof.step)
    d = prof.diagnosis
    if json_out:
        sys.stdout.write(d.to_json() + "\n")
        return
    console.print(d)
    if d.prescriptions:
        p = d.prescriptions[0]
        console.print(f"[bold]First prescription:[/bold] {p.id} - {p.title}\n    {p.code}")
    console.print(f"[dim]trace and diagnosis.json in {out}/[/dim]")


@app.command()
def schema() -> None:
    """Print the JSON Schema of `analyze --json` / diagnosis.json."""
    from torchtriage.diagnosis.result import json_schema

    sys.stdout.write(msgspec.json.format(msgspec.json.encode(json_schema())).decode() + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit status instead of raising."""
    try:
        app(args=argv, prog_name="torchtriage")  # standalone: usage errors exit 2 with a line
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        print("torchtriage: interrupted", file=sys.stderr)
        return 130
    except TorchtriageError as exc:
        print(f"torchtriage: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # never a traceback for the user
        if os.environ.get("TORCHTRIAGE_DEBUG") == "1":
            raise
        print(f"torchtriage: internal error: {type(exc).__name__}: {exc} "
              "(set TORCHTRIAGE_DEBUG=1 for the traceback)", file=sys.stderr)
        return 3
    return 0


def run() -> None:
    """The ``torchtriage`` console script."""
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
