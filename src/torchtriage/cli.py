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
    from torchtriage.diagnosis.job import diagnose_job
    from torchtriage.report.terminal import job_renderable

    diagnoses = analyze_path(path, device_memory=device_memory, top=top)
    job = diagnose_job(diagnoses) if len(diagnoses) > 1 else None
    if json_out:
        sys.stdout.write((job or diagnoses[0]).to_json() + "\n")
        return
    console = Console()
    for d in diagnoses:
        console.print(d)
    if job is not None:
        console.print(job_renderable(job))


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


@app.command("run",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_script(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Run directory (traces, records, "
                                      "diagnosis.json).")] = Path("torchtriage-run"),
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Stop the script "
                                              "cleanly after N training steps.")] = None,
    skip: Annotated[int, typer.Option("--skip", min=0, help="Training steps to run before "
                                      "profiling starts.")] = 0,
    timeout: Annotated[float | None, typer.Option("--timeout", min=1, help="Stop the command "
                                                  "after S seconds, keeping what was "
                                                  "recorded.")] = None,
    knob: Annotated[list[str] | None, typer.Option("--knob", metavar="ID=VALUE", help="Apply "
                                                   "a knob (repeatable); see `torchtriage "
                                                   "knobs`.")] = None,
    json_out: AsJson = False,
    device_memory: DeviceMemory = None,
    top: Top = 10,
) -> None:
    """Profile an unmodified script: torchtriage run [OPTIONS] -- python train.py ARGS
    (or -- torchrun --nproc_per_node=N train.py ARGS)."""
    from torchtriage.capture.knobs import parse_knobs
    from torchtriage.capture.runner import (
        describe_failure,
        python_command,
        run_command,
        write_diagnosis,
    )
    from torchtriage.units import parse_bytes

    knobs = parse_knobs(knob or [])  # refused before the script starts
    capacity = parse_bytes(device_memory) if device_memory is not None else None
    command = python_command(list(ctx.args))
    result = run_command(command, out, knobs=knobs, max_steps=steps, skip=skip,
                         timeout=timeout, device_memory=capacity, quiet_output=json_out)
    if result.traces:
        write_diagnosis(result, capacity, top)
    console = Console(stderr=json_out)
    if json_out and result.traces:
        sys.stdout.write((out / "diagnosis.json").read_text())
    elif result.diagnoses:
        for d in result.diagnoses:
            console.print(d)
        if len(result.diagnoses) > 1:
            from torchtriage.diagnosis.job import diagnose_job
            from torchtriage.report.terminal import job_renderable

            console.print(job_renderable(diagnose_job(result.diagnoses)))
    for knob_id, entry in result.knobs.items():
        status = "applied" if entry["applied"] else "not applied"
        console.print(f"knob {knob_id}={entry['value']}: {status} ({entry['detail']})")
    failure = describe_failure(result, timeout)
    if failure:
        print(f"torchtriage: error: {failure}", file=sys.stderr)
        raise typer.Exit(124 if result.timed_out else 1)


@app.command()
def knobs() -> None:
    """List the knobs `run --knob` accepts."""
    from torchtriage.capture.knobs import KNOBS

    for k in KNOBS.values():
        values = "|".join(k.choices) if k.choices else k.kind
        typer.echo(f"{k.id}={values}  {k.help}")


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


def entry_point() -> None:
    """The ``torchtriage`` console script."""
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    entry_point()
