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
    from torchtriage.api import analyze as analyze_path
    from torchtriage.api import analyze_with_traces
    from torchtriage.diagnosis.job import diagnose_job
    from torchtriage.report.terminal import job_renderable

    traces = None
    if html_out is not None:  # the report draws from the traces: keep them, load once
        diagnoses, traces = analyze_with_traces(path, device_memory=device_memory, top=top)
    else:
        diagnoses = analyze_path(path, device_memory=device_memory, top=top)
    job = diagnose_job(diagnoses) if len(diagnoses) > 1 else None
    if html_out is not None:
        _write_html(html_out, path, diagnoses, job, traces=traces, quiet=json_out)
    if md_out is not None:
        from torchtriage.report.markdown import diagnosis_markdown

        _write_page(md_out, diagnosis_markdown(diagnoses, job), quiet=json_out)
    if json_out:
        sys.stdout.write((job or diagnoses[0]).to_json() + "\n")
        return
    console = Console()
    for d in diagnoses:
        console.print(d)
    if job is not None:
        console.print(job_renderable(job))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (torchtriage run / profile) "
                                            "or any directory or file of traces.")],
    html_out: HtmlOut = None,
    device_memory: DeviceMemory = None,
) -> None:
    """Write the self-contained HTML report (default RUN_DIR/report.html): of a fix or ab
    directory (fix.json, ab.json), else of the traces in it."""
    from torchtriage.api import analyze_with_traces
    from torchtriage.diagnosis.job import diagnose_job

    for name, page_of in (("fix.json", _fix_report), ("ab.json", _ab_report)):
        if (run_dir / name).is_file():
            _write_page(html_out or run_dir / "report.html", page_of(run_dir / name),
                        quiet=False)
            return
    diagnoses, traces = analyze_with_traces(run_dir, device_memory=device_memory)
    job = diagnose_job(diagnoses) if len(diagnoses) > 1 else None
    target = html_out or (run_dir / "report.html" if run_dir.is_dir() else
                          run_dir.with_suffix("").with_suffix(".html"))
    _write_html(target, run_dir, diagnoses, job, traces=traces, quiet=False)


def _read_document(path: Path):
    from torchtriage.documents import decode_document

    try:
        return decode_document(msgspec.json.decode(path.read_bytes()))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TorchtriageError(f"{path}: not a readable torchtriage document ({exc})") from None


def _fix_report(path: Path) -> str:
    from torchtriage.report.verify_html import fix_page

    result = _read_document(path)
    patch = path.parent / "fix.patch"
    return fix_page(result, patch.read_text() if patch.is_file() else "")


def _ab_report(path: Path) -> str:
    from torchtriage.report.verify_html import ab_page

    return ab_page(_read_document(path))


def _write_html(target: Path, source: Path, diagnoses, job, *, traces=None,
                quiet: bool) -> None:
    """The diagnosis report; the timeline and the memory curve come from ``traces``, loaded
    from ``source`` when not given (``run``: its diagnoses were made in the script's
    process)."""
    from torchtriage.report.html import diagnosis_page
    from torchtriage.trace import find_trace_files, load_trace

    if traces is None:
        traces = [load_trace(p) for p in find_trace_files(source)]
    if len(traces) != len(diagnoses):
        traces = None
    _write_page(target, diagnosis_page(diagnoses, traces, job,
                                       title=f"torchtriage: {source.name or source}"),
                quiet=quiet)


def _write_page(target: Path, page: str, *, quiet: bool) -> None:
    from torchtriage.report.html import write_page

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
    store: StorePath = None,
    html_out: HtmlOut = None,
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
    runs = _open_store(store, required=False)
    run_id = runs.start_run("run", command, knobs=knobs, out_dir=out) if runs else None
    result = run_command(command, out, knobs=knobs, max_steps=steps, skip=skip,
                         timeout=timeout, device_memory=capacity, quiet_output=json_out)
    if result.traces:
        write_diagnosis(result, capacity, top)
    if html_out is not None and result.diagnoses:
        from torchtriage.diagnosis.job import diagnose_job

        job = diagnose_job(result.diagnoses) if len(result.diagnoses) > 1 else None
        _write_html(html_out, out, result.diagnoses, job, quiet=json_out)
    failure = describe_failure(result, timeout)
    if runs is not None:
        doc = (msgspec.json.decode((out / "diagnosis.json").read_bytes())
               if result.diagnoses else None)
        summary = failure or (f"{doc['primary']} bottleneck ({doc['confidence']} "
                              "confidence)" if doc else "")
        runs.finish_run(run_id, "failed" if failure else "done", summary, doc)
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
    if failure:
        print(f"torchtriage: error: {failure}", file=sys.stderr)
        raise typer.Exit(124 if result.timed_out else 1)


def _open_store(path: Path | None, *, required: bool):
    """The run store; when it was not asked for explicitly and cannot be opened, a one-line
    warning and no store (profiling must not fail for want of a history)."""
    from torchtriage.verify.store import ENV, RunStore

    explicit = path is not None or bool(os.environ.get(ENV))
    try:
        return RunStore(path)
    except TorchtriageError as exc:
        if explicit or required:
            raise
        print(f"torchtriage: warning: {exc}; not recording this run", file=sys.stderr)
        return None


def _percent(text: str) -> float:
    raw = text.strip().removesuffix("%")
    try:
        value = float(raw)
    except ValueError:
        raise TorchtriageError(f"--fail-on-regression takes a percentage such as 5%, "
                               f"got {text!r}") from None
    if not 0 <= value < 100:
        raise TorchtriageError(f"--fail-on-regression must be between 0% and 100%, got {text}")
    return value / 100


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
    from torchtriage.units import parse_bytes
    from torchtriage.verify.compare import compare as compare_paths

    limit = _percent(fail_on_regression) if fail_on_regression is not None else None
    capacity = parse_bytes(device_memory) if device_memory is not None else None
    runs = _open_store(store, required=False)
    c = compare_paths(a, b, min_effect=min_effect, device_memory=capacity)
    if runs is not None:
        c.store_id = runs.start_run("compare", [str(a), str(b)])
        runs.finish_run(c.store_id, "done", c.headline(), msgspec.to_builtins(c))
    if html_out is not None:
        from torchtriage.report.verify_html import compare_page

        _write_page(html_out, compare_page(c), quiet=json_out)
    if md_out is not None:
        from torchtriage.report.markdown import comparison_markdown

        _write_page(md_out, comparison_markdown(c), quiet=json_out)
    if json_out:
        sys.stdout.write(c.to_json() + "\n")
    else:
        Console().print(c)
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
    steps: Annotated[int, typer.Option("--steps", min=3, help="Measured steps per trial.")]
    = 10,
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
    import shlex

    from torchtriage.capture.knobs import parse_knobs
    from torchtriage.capture.runner import python_command
    from torchtriage.verify.ab import run_ab

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
    with _TrialProgress(console, enabled=not json_out) as progress:
        result = run_ab(command, out, knobs=knobs, candidate=cand, trials=trials,
                        warmup=warmup, steps=steps, timeout=timeout, min_effect=min_effect,
                        store=runs, progress=progress)
    if html_out is not None:
        from torchtriage.report.verify_html import ab_page

        _write_page(html_out, ab_page(result), quiet=json_out)
    if md_out is not None:
        from torchtriage.report.markdown import ab_markdown

        _write_page(md_out, ab_markdown(result), quiet=json_out)
    if json_out:
        sys.stdout.write(result.to_json() + "\n")
    else:
        Console().print(result)
    if result.verdict == "failed":
        print(f"torchtriage: error: {result.summary}", file=sys.stderr)
        raise typer.Exit(1)


class _TrialProgress:
    """A one-line live display of the trial being run: what, k of n, elapsed."""

    def __init__(self, console: Console, *, enabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                 transient=True, disable=not enabled)
        self.console = console
        self.enabled = enabled
        self.task = None

    def __enter__(self) -> _TrialProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, label: str, k: int, n: int, trial) -> None:
        if self.task is None:
            self.task = self.progress.add_task("", total=n or None)
        if n == 0:  # a phase, not a trial
            self.progress.update(self.task, description=label, total=None, completed=0)
            return
        if trial is None:
            self.progress.update(self.task, description=f"trial {k}/{n}: {label}", total=n)
            return
        self.progress.update(self.task, completed=k)
        if self.enabled:
            what = (f"{trial.mean_step_ms:.1f} ms/step" if trial.status == "ok"
                    else f"{trial.status}: {trial.error}")
            self.console.print(f"[dim]trial {k}/{n} {trial.arm}{trial.idx}: {what}[/dim]",
                               highlight=False, markup=True)


def _duration(text: str) -> float:
    """``90s``, ``10m``, ``1h`` or plain seconds."""
    raw = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(raw[-1:])
    number = raw[:-1] if scale else raw
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise TorchtriageError(f"--budget takes a duration such as 90s, 10m or 1h, got "
                               f"{text!r}") from None
    if seconds <= 0:
        raise TorchtriageError(f"--budget must be positive, got {text!r}")
    return seconds


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
    steps: Annotated[int, typer.Option("--steps", min=3, help="Measured steps per trial.")]
    = 10,
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
    from torchtriage.capture.runner import python_command
    from torchtriage.fix.loop import run_fix
    from torchtriage.units import parse_bytes

    seconds = _duration(budget)
    capacity = parse_bytes(device_memory) if device_memory is not None else None
    command = python_command(list(ctx.args))
    if not command:
        raise TorchtriageError("no command to run: put it after --, e.g. torchtriage fix -- "
                               "python train.py")
    runs = _open_store(store, required=False)
    console = Console(stderr=True)
    with _TrialProgress(console, enabled=not json_out) as progress:
        result = run_fix(command, out, budget_s=seconds, trials=trials, warmup=warmup,
                         steps=steps, timeout=timeout, device_memory=capacity,
                         min_effect=min_effect, store=runs, progress=progress)
    if html_out is not None:
        from torchtriage.report.verify_html import fix_page

        patch = Path(result.patch_file).read_text() if result.patch_file else ""
        _write_page(html_out, fix_page(result, patch), quiet=json_out)
    if json_out:
        sys.stdout.write(result.to_json() + "\n")
    else:
        Console().print(result)


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
    from torchtriage.report.verify_view import history_table
    from torchtriage.verify.store import RUN_KINDS

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
    Console().print(_stored_renderable(row.result))


def _stored_renderable(doc: dict):
    from torchtriage.diagnosis.job import JobDiagnosis
    from torchtriage.documents import decode_document
    from torchtriage.report.terminal import job_renderable

    result = decode_document(doc)
    if isinstance(result, JobDiagnosis):
        from rich.console import Group

        return Group(*result.diagnoses, job_renderable(result))
    return result


@app.command()
def knobs() -> None:
    """List the knobs `run --knob` accepts."""
    from torchtriage.capture.knobs import KNOBS

    for k in KNOBS.values():
        values = "|".join(k.choices) if k.choices else k.kind
        typer.echo(f"{k.id}={values}  {k.help}")


@app.command()
def schema(
    document: Annotated[str, typer.Argument(
        metavar="[DOCUMENT]",
        help="diagnosis (analyze --json, diagnosis.json), job (several ranks), compare "
             "(compare --json) or ab (ab.json).")] = "diagnosis",
) -> None:
    """Print the JSON Schema of one of torchtriage's JSON documents."""
    from torchtriage.documents import json_schema

    sys.stdout.write(msgspec.json.format(msgspec.json.encode(json_schema(document))).decode()
                     + "\n")


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
