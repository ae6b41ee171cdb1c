"""The ``torchtriage`` command line.

Every user error ends as one line on stderr, ``torchtriage: error: ...``, and exit status 2;
an unexpected failure is one line too (exit 3), with the traceback only when
``TORCHTRIAGE_DEBUG=1``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import msgspec
import typer
from rich.console import Console

from torchtriage.capture.interrupt import forwarding
from torchtriage.capture.runner import (
    describe_failure,
    python_command,
    run_command,
    write_diagnosis,
)
from torchtriage.capture.session import profile
from torchtriage.demo import DEMO_EXAMPLE, DEMO_STEPS, load_example
from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.knobs import KNOBS, parse_knobs
from torchtriage.diagnosis.result import Diagnosis, WindowCheck
from torchtriage.diagnosis.traces import (
    DiagnoseOptions,
    TraceDetail,
    diagnose_traces,
    diagnose_traces_with_detail,
    trace_details,
)
from torchtriage.errors import TorchtriageError, TraceError
from torchtriage.fix.loop import FixSettings, run_fix
from torchtriage.report.html import diagnosis_page, write_page
from torchtriage.report.markdown import ab_markdown, comparison_markdown, diagnosis_markdown
from torchtriage.report.progress import TrialProgress
from torchtriage.report.render import renderable
from torchtriage.report.verify_html import ab_page, compare_page, fix_page
from torchtriage.report.verify_view import history_table
from torchtriage.results.ab import ABResult
from torchtriage.results.fix import FixResult
from torchtriage.results.registry import REGISTRY, decode_document, json_schema, read_document
from torchtriage.results.run import RunConfig, Schedule
from torchtriage.units import parse_bytes, parse_duration, parse_percent
from torchtriage.verify.ab import run_ab
from torchtriage.verify.compare import compare as compare_paths
from torchtriage.verify.settings import TrialSettings
from torchtriage.verify.store import ENV, RUN_KINDS, RunStore
from torchtriage.version import __version__

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
HtmlOut = Annotated[Path | None, typer.Option(
    "--html", help="Also write a self-contained HTML report (opens offline) to this file.")]
MarkdownOut = Annotated[Path | None, typer.Option(
    "--md", help="Also write a Markdown summary (for a pull-request comment) to this file.")]
StorePath = Annotated[
    Path | None,
    typer.Option("--store", metavar="PATH",
                 help="Run store (SQLite) to record into and read from; default "
                      "$TORCHTRIAGE_STORE, else ~/.local/share/torchtriage/runs.sqlite."),
]
MinEffect = Annotated[
    float,
    typer.Option("--min-effect", min=0.0, max=1.0, metavar="FRACTION",
                 help="Smallest speedup that counts: faster/slower only when the whole "
                      "confidence interval clears 1 +/- this."),
]


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
    html_out: HtmlOut = None,
    md_out: MarkdownOut = None,
) -> None:
    """Diagnose a Kineto trace captured elsewhere (torch.profiler, tensorboard_trace_handler)."""
    options = DiagnoseOptions(device_memory=_capacity(device_memory), top=top)
    if html_out is not None:  # the report draws from the traces: one load for both
        doc, details = diagnose_traces_with_detail(path, options)
        _write_html(html_out, path, doc, details, quiet=json_out)
    else:
        doc = diagnose_traces(path, options)
    if md_out is not None:
        _write_page(md_out, diagnosis_markdown(doc), quiet=json_out)
    if json_out:
        sys.stdout.write(doc.to_json() + "\n")
        return
    Console().print(renderable(doc))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (torchtriage run / profile) "
                                            "or any directory or file of traces.")],
    html_out: HtmlOut = None,
    device_memory: DeviceMemory = None,
) -> None:
    """Write the self-contained HTML report (default RUN_DIR/report.html): of a fix or ab
    directory (fix.json, ab.json), else of the traces in it."""
    for name in ("fix.json", "ab.json"):
        if (run_dir / name).is_file():
            _write_page(html_out or run_dir / "report.html", _result_page(run_dir / name),
                        quiet=False)
            return
    try:
        doc, details = diagnose_traces_with_detail(
            run_dir, DiagnoseOptions(device_memory=_capacity(device_memory)))
    except TraceError:
        saved = run_dir / "diagnosis.json"  # a run that ran out of memory before any trace
        if not saved.is_file():
            raise
        doc, details = _read_diagnosis(saved), None
    target = html_out or (run_dir / "report.html" if run_dir.is_dir() else
                          run_dir.with_suffix("").with_suffix(".html"))
    _write_html(target, run_dir, doc, details, quiet=False)


def _read_diagnosis(path: Path) -> Diagnosis | JobDiagnosis:
    doc = read_document(path.read_bytes(), str(path))
    if not isinstance(doc, (Diagnosis, JobDiagnosis)):
        raise TorchtriageError(f"{path}: a {doc.schema} document, not a diagnosis")
    return doc


def _capacity(device_memory: str | None) -> int | None:
    return parse_bytes(device_memory) if device_memory is not None else None


def _result_page(path: Path) -> str:
    """The HTML page of a stored ``fix.json`` (with its patch) or ``ab.json``."""
    doc = read_document(path.read_bytes(), str(path))
    if isinstance(doc, FixResult):
        patch = path.parent / "fix.patch"
        return fix_page(doc, patch.read_text() if patch.is_file() else "")
    if isinstance(doc, ABResult):
        return ab_page(doc)
    raise TorchtriageError(f"{path}: a {doc.schema} document has no report page")


def _write_html(target: Path, source: Path, doc: Diagnosis | JobDiagnosis,
                details: list[TraceDetail] | None, *, quiet: bool) -> None:
    """The diagnosis report; the timeline and the memory curve come from ``details``."""
    _write_page(target, diagnosis_page(doc, details,
                                       title=f"torchtriage: {source.name or source}"),
                quiet=quiet)


def _write_page(target: Path, page: str, *, quiet: bool) -> None:
    try:
        write_page(target, page)
    except OSError as exc:
        raise TorchtriageError(f"cannot write {target}: {exc.strerror or exc}") from None
    if not quiet:
        kind = "Markdown" if target.suffix.lower() in (".md", ".markdown") else "HTML"
        Console(stderr=True).print(f"[dim]{kind} report: {target}[/dim]")


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Run directory for the trace and report.")]
    = Path("torchtriage-demo"),
    json_out: AsJson = False,
) -> None:
    """Profile the bundled data-starved example and print its diagnosis (CPU, ~10 s)."""
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
    console.print(renderable(d))
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
                                              "cleanly after N training steps in all "
                                              "(skipped ones too).")] = None,
    skip: Annotated[int, typer.Option("--skip", min=0, help="Training steps to run before "
                                      "the profiling window, at least (a DataLoader's queue "
                                      "of prepared batches drains first).")] = 0,
    stop_after_window: Annotated[bool, typer.Option(
        "--stop-after-window", help="Stop the script cleanly once the steady-state window is "
        "profiled and checked (a long job's diagnosis, then exit).")] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", min=1, help="Stop the command "
                                                  "after S seconds, keeping what was "
                                                  "recorded.")] = None,
    knob: Annotated[list[str] | None, typer.Option("--knob", metavar="ID=VALUE", help="Apply "
                                                   "a knob (repeatable); see `torchtriage "
                                                   "knobs`.")] = None,
    json_out: AsJson = False,
    device_memory: DeviceMemory = None,
    top: Top = 10,
    store: StorePath = None,
    html_out: HtmlOut = None,
) -> None:
    """Profile an unmodified script: torchtriage run [OPTIONS] -- python train.py ARGS
    (or -- torchrun --nproc_per_node=N train.py ARGS)."""
    knobs = parse_knobs(knob or [])  # refused before the script starts
    window = Schedule()
    if steps is not None and steps <= skip:
        raise TorchtriageError(
            f"--steps {steps} stops the script before profiling starts after --skip {skip} "
            f"steps (--steps counts every training step, skipped ones too); for a whole "
            f"window use --steps {skip + window.steps} or more")
    capacity = _capacity(device_memory)
    command = python_command(list(ctx.args))
    runs = _open_store(store, required=False)
    run_id = runs.start_run("run", command, knobs=knobs, out_dir=out) if runs else None
    config = RunConfig(out=str(out), knobs=knobs, max_steps=steps, skip=skip,
                       device_memory=capacity, stop_after_window=stop_after_window)
    console = Console(stderr=json_out)
    early: list[Diagnosis | JobDiagnosis] = []

    def window_done(run_dir: Path, checks: list[WindowCheck]) -> None:
        """A long run (no --steps): the window's verdict now, while training goes on."""
        traces = [p for p in run_dir.iterdir() if p.name.startswith("rank0_")
                  and p.name.endswith((".json", ".json.gz"))]
        doc = diagnose_traces(traces, DiagnoseOptions(device_memory=capacity, top=top,
                                                      windows={0: checks}, workers=1))
        (run_dir / "diagnosis.json").write_text(doc.to_json() + "\n")
        early.append(doc)
        console.print(renderable(doc))
        console.print(f"[dim]torchtriage: the profiling window is diagnosed "
                      f"({run_dir / 'diagnosis.json'}); training goes on, the final report "
                      "follows when the script exits (Ctrl-C stops it and keeps it all)[/dim]")

    result = run_command(command, config, timeout=timeout, quiet_output=json_out,
                         on_window=window_done if steps is None and not json_out
                         and not stop_after_window else None)
    write_diagnosis(result, capacity, top)  # an out-of-memory error without a trace too
    doc = result.diagnosis
    if html_out is not None and doc is not None:
        _write_html(html_out, out, doc, trace_details(result.traces), quiet=json_out)
    failure = describe_failure(result, timeout)
    if runs is not None:
        summary = failure or (f"{doc.primary} bottleneck ({doc.confidence} confidence)"
                              if doc else "")
        runs.finish_run(run_id, "failed" if failure else "done", summary,
                        doc.to_dict() if doc else None)
    if json_out and doc is not None:
        sys.stdout.write(doc.to_json() + "\n")
    elif doc is not None and early and doc.primary == early[0].primary:
        console.print(f"[dim]final diagnosis: {doc.primary} (as above), "
                      f"{out / 'diagnosis.json'}[/dim]")
    elif doc is not None:
        console.print(renderable(doc))
    for knob_id, entry in result.knobs.items():
        status = "applied" if entry.applied else "not applied"
        console.print(f"knob {knob_id}={entry.value}: {status} ({entry.detail})")
    if failure:
        print(f"torchtriage: error: {failure}", file=sys.stderr)
        raise typer.Exit(124 if result.timed_out else 1)


def _open_store(path: Path | None, *, required: bool):
    """The run store; when it was not asked for explicitly and cannot be opened, a one-line
    warning and no store (profiling must not fail for want of a history)."""
    explicit = path is not None or bool(os.environ.get(ENV))
    try:
        return RunStore(path)
    except TorchtriageError as exc:
        if explicit or required:
            raise
        print(f"torchtriage: warning: {exc}; not recording this run", file=sys.stderr)
        return None


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="Baseline: trace file, trace directory or run "
                                      "directory.")],
    b: Annotated[Path, typer.Argument(help="Candidate, the same kinds.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")]
    = False,
    fail_on_regression: Annotated[str | None, typer.Option(
        "--fail-on-regression", metavar="PCT",
        help="Exit 1 when B is significantly slower than A by more than PCT (e.g. 5%).")]
    = None,
    min_effect: MinEffect = 0.02,
    device_memory: DeviceMemory = None,
    store: StorePath = None,
    html_out: HtmlOut = None,
    md_out: MarkdownOut = None,
) -> None:
    """Compare two profiles: speedup with a confidence interval, where the time went, op and
    kernel deltas."""
    limit = parse_percent(fail_on_regression) if fail_on_regression is not None else None
    capacity = _capacity(device_memory)
    runs = _open_store(store, required=False)
    c = compare_paths(a, b, min_effect=min_effect, device_memory=capacity)
    if runs is not None:
        c.store_id = runs.start_run("compare", [str(a), str(b)])
        runs.finish_run(c.store_id, "done", c.headline(), msgspec.to_builtins(c))
    if html_out is not None:
        _write_page(html_out, compare_page(c), quiet=json_out)
    if md_out is not None:
        _write_page(md_out, comparison_markdown(c), quiet=json_out)
    if json_out:
        sys.stdout.write(c.to_json() + "\n")
    else:
        Console().print(renderable(c))
    if limit is not None and c.ci_high < 1 and 1 / c.speedup - 1 > limit:
        print(f"torchtriage: regression: B's median step is {1 / c.speedup - 1:.1%} longer "
              f"than A's (95% CI {1 / c.ci_high - 1:.1%} to {1 / c.ci_low - 1:.1%}), over "
              f"the {limit:.1%} limit", file=sys.stderr)
        raise typer.Exit(1)


@app.command("ab",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ab_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for ab.json, trials.jsonl and "
                                      "the trial logs.")] = Path("torchtriage-ab"),
    knob: Annotated[list[str] | None, typer.Option("--knob", metavar="ID=VALUE",
                                                   help="Knob for the candidate arm "
                                                   "(repeatable). None: an A/A noise "
                                                   "test.")] = None,
    candidate: Annotated[str | None, typer.Option(
        "--candidate", metavar="COMMAND",
        help="The candidate's own command (a hand-written fix), quoted.")] = None,
    trials: Annotated[int, typer.Option("--trials", min=2, help="Processes per arm.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=2, help="Steps before measuring "
                                        "(at least 5 with compile.mode).")] = 3,
    steps: Annotated[int, typer.Option("--steps", min=3, help="Measured steps per trial (at "
                                       "least).")] = 10,
    min_measure: Annotated[float, typer.Option(
        "--min-measure-s", min=0, help="Each trial measures at least this long (one process: "
        "fast steps run on).")] = TrialSettings.min_measure_s,
    timeout: Annotated[float | None, typer.Option("--timeout", min=1, help="Seconds per "
                                                  "trial.")] = None,
    min_effect: MinEffect = 0.02,
    json_out: Annotated[bool, typer.Option("--json", help="Print ab.json on stdout, no "
                                           "progress.")] = False,
    store: StorePath = None,
    html_out: HtmlOut = None,
    md_out: MarkdownOut = None,
) -> None:
    """A/B-test knobs on an unmodified script: torchtriage ab --knob ID=VALUE -- python
    train.py ARGS. Interleaved trials, bootstrap CI, loss parity."""

    knobs = parse_knobs(knob or [])
    command = python_command(list(ctx.args))
    if not command:
        raise TorchtriageError("no command to run: put it after --, e.g. "
                               "torchtriage ab --knob dataloader.num_workers=4 -- python "
                               "train.py")
    cand = python_command(shlex.split(candidate)) if candidate else None
    if candidate is not None and not cand:
        raise TorchtriageError("--candidate is empty")
    runs = _open_store(store, required=False)
    console = Console(stderr=True)
    if not knobs and not cand and not json_out:
        console.print("[dim]no --knob and no --candidate: an A/A run (both arms identical) "
                      "that measures the noise[/dim]")
    with TrialProgress(console, enabled=not json_out) as progress:
        settings = TrialSettings(trials=trials, warmup=warmup, steps=steps, timeout=timeout,
                                 min_effect=min_effect, min_measure_s=min_measure)
        result = run_ab(command, out, settings, knobs=knobs, candidate=cand, store=runs,
                        progress=progress)
    if html_out is not None:
        _write_page(html_out, ab_page(result), quiet=json_out)
    if md_out is not None:
        _write_page(md_out, ab_markdown(result), quiet=json_out)
    if json_out:
        sys.stdout.write(result.to_json() + "\n")
    else:
        Console().print(renderable(result))
    if result.verdict == "failed":
        print(f"torchtriage: error: {result.summary}", file=sys.stderr)
        raise typer.Exit(1)


@app.command("fix",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def fix_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for fix.json, fix.md, "
                                      "fix.patch and every profile and A/B.")]
    = Path("torchtriage-fix"),
    budget: Annotated[str, typer.Option("--budget", metavar="DURATION",
                                        help="Wall-clock budget, e.g. 90s, 10m, 1h.")] = "10m",
    trials: Annotated[int, typer.Option("--trials", min=2, help="Most trials per arm of each "
                                        "A/B (they stop earlier when the answer is clear).")]
    = 4,
    warmup: Annotated[int, typer.Option("--warmup", min=2, help="Steps before measuring.")]
    = 3,
    steps: Annotated[int, typer.Option("--steps", min=3, help="Measured steps per trial (at "
                                       "least).")] = 10,
    min_measure: Annotated[float, typer.Option(
        "--min-measure-s", min=0, help="Each trial measures at least this long (one process: "
        "fast steps run on).")] = TrialSettings.min_measure_s,
    timeout: Annotated[float | None, typer.Option("--timeout", min=1, help="Seconds per "
                                                  "trial or profile run.")] = None,
    min_effect: MinEffect = 0.02,
    json_out: Annotated[bool, typer.Option("--json", help="Print fix.json on stdout, no "
                                           "progress.")] = False,
    device_memory: DeviceMemory = None,
    store: StorePath = None,
    html_out: HtmlOut = None,
) -> None:
    """Diagnose, try the bottleneck's fixes cheapest first, keep what an A/B proves:
    torchtriage fix --out DIR -- python train.py ARGS."""
    seconds = parse_duration(budget)
    capacity = _capacity(device_memory)
    command = python_command(list(ctx.args))
    if not command:
        raise TorchtriageError("no command to run: put it after --, e.g. torchtriage fix -- "
                               "python train.py")
    runs = _open_store(store, required=False)
    console = Console(stderr=True)
    with TrialProgress(console, enabled=not json_out) as progress:
        settings = FixSettings(budget_s=seconds, device_memory=capacity, trial=TrialSettings(
            trials=trials, warmup=warmup, steps=steps, timeout=timeout, min_effect=min_effect,
            min_measure_s=min_measure))
        result = run_fix(command, out, settings, store=runs, progress=progress)
    if html_out is not None:
        patch = Path(result.patch_file).read_text() if result.patch_file else ""
        _write_page(html_out, fix_page(result, patch), quiet=json_out)
    if json_out:
        sys.stdout.write(result.to_json() + "\n")
    else:
        Console().print(renderable(result))


@app.command()
def history(
    limit: Annotated[int, typer.Option("--limit", min=1, help="Most recent runs to list.")]
    = 20,
    kind: Annotated[str | None, typer.Option("--kind", help="Only runs of this kind: run, ab, "
                                             "compare, fix.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the runs as JSON.")] = False,
    store: StorePath = None,
) -> None:
    """List recorded runs, A/B experiments and comparisons (newest first)."""
    if kind is not None and kind not in RUN_KINDS:
        raise TorchtriageError(f"--kind takes one of {', '.join(RUN_KINDS)}, got {kind!r}")
    rows = _open_store(store, required=True).runs(limit=limit, kind=kind)
    if json_out:
        doc = [{"id": r.id, "kind": r.kind, "created": r.created, "finished": r.finished,
                "status": r.status, "command": r.command, "knobs": r.knobs,
                "out_dir": r.out_dir, "summary": r.summary} for r in rows]
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(doc)).decode() + "\n")
        return
    if not rows:
        typer.echo("no runs recorded yet")
        return
    Console().print(history_table(rows))


@app.command()
def show(
    run_id: Annotated[int, typer.Argument(metavar="ID", help="Run id from `torchtriage "
                                          "history`.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the stored result as "
                                           "JSON.")] = False,
    store: StorePath = None,
) -> None:
    """Show a recorded result again: an A/B verdict, a comparison, a run's diagnosis."""
    runs = _open_store(store, required=True)
    row = runs.run(run_id)
    if row.result is None:
        trials = runs.trials(run_id)
        raise TorchtriageError(f"run {run_id} ({row.kind}) is {row.status} and has no result; "
                               f"{len(trials)} completed trial(s) are stored"
                               + (f", the trials are in {row.out_dir}" if row.out_dir else ""))
    if json_out:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(row.result)).decode() + "\n")
        return
    Console().print(renderable(decode_document(row.result)))


@app.command()
def knobs() -> None:
    """List the knobs `run --knob` accepts."""
    for k in KNOBS:
        values = "|".join(k.choices) if k.choices else k.kind
        typer.echo(f"{k.id}={values}  {k.help}")


@app.command()
def schema(
    document: Annotated[str, typer.Argument(
        metavar="[DOCUMENT]",
        help="; ".join(f"{d.name} ({d.what})" for d in REGISTRY))] = "diagnosis",
) -> None:
    """Print the JSON Schema of one of torchtriage's JSON documents."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(json_schema(document))).decode()
                     + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit status instead of raising."""
    try:
        with forwarding():  # SIGTERM/SIGINT/SIGHUP: stop the command's group, exit 128 + N
            app(args=argv, prog_name="torchtriage")  # usage errors exit 2 with a line
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
