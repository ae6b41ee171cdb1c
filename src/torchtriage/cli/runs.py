"""``run``, ``ab``, ``fix`` and ``demo``: the commands that run training (and so torch)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from torchtriage.cli.output import (
    capacity,
    console,
    open_store,
    print_document,
    write_html,
    write_json,
    write_page,
)
from torchtriage.errors import TorchtriageError

if TYPE_CHECKING:
    from torchtriage.diagnosis.job import JobDiagnosis
    from torchtriage.diagnosis.result import Diagnosis


def demo(args: argparse.Namespace) -> int:
    """Profile the bundled data-starved example and print its diagnosis."""
    from torchtriage.capture.session import profile
    from torchtriage.demo import DEMO_EXAMPLE, DEMO_STEPS, load_example
    from torchtriage.report.render import renderable

    example = load_example(DEMO_EXAMPLE)
    out = console(stderr=args.json_out)
    out.print(f"[dim]torchtriage demo: profiling examples/{DEMO_EXAMPLE}.py "
              f"for {DEMO_STEPS} steps into {args.out}/ ...[/dim]")
    with profile(args.out) as prof:
        example.train(DEMO_STEPS, on_step=prof.step)
    d = prof.diagnosis
    if args.json_out:
        write_json(d)
        return 0
    out.print(renderable(d))
    if d.prescriptions:
        p = d.prescriptions[0]
        out.print(f"[bold]First prescription:[/bold] {p.id} - {p.title}\n    {p.code}")
    out.print(f"[dim]trace and diagnosis.json in {args.out}/[/dim]")
    return 0


def run(args: argparse.Namespace) -> int:
    """Profile an unmodified script."""
    from torchtriage.capture.runner import (
        describe_failure,
        python_command,
        run_command,
        write_diagnosis,
    )
    from torchtriage.diagnosis.knobs import parse_knobs
    from torchtriage.diagnosis.traces import DiagnoseOptions, diagnose_traces, trace_details
    from torchtriage.report.render import renderable
    from torchtriage.results.run import RunConfig, Schedule, WindowMarker

    knobs = parse_knobs(args.knob or [])  # refused before the script starts
    steps, skip, out_dir = args.steps, args.skip, args.out
    window = Schedule()
    if steps is not None and steps <= skip:
        raise TorchtriageError(
            f"--steps {steps} stops the script before profiling starts after --skip {skip} "
            f"steps (--steps counts every training step, skipped ones too); for a whole "
            f"window use --steps {skip + window.steps} or more")
    device_memory = capacity(args.device_memory)
    command = python_command(list(args.command_line))
    runs = open_store(args.store, required=False)
    run_id = runs.start_run("run", command, knobs=knobs, out_dir=out_dir) if runs else None
    config = RunConfig(out=str(out_dir), knobs=knobs, max_steps=steps, skip=skip,
                       device_memory=device_memory, stop_after_window=args.stop_after_window)
    out = console(stderr=args.json_out)
    early: list[Diagnosis | JobDiagnosis] = []

    def window_done(run_dir: Path, marker: WindowMarker) -> None:
        """A long run (no --steps): the window's verdict now, while training goes on."""
        traces = [p for p in run_dir.iterdir() if p.name.startswith("rank0_")
                  and p.name.endswith((".json", ".json.gz"))]
        # the training process's CPU facts (the bf16 gate reads them); samples come at exit
        doc = diagnose_traces(traces, DiagnoseOptions(
            device_memory=device_memory, top=args.top, windows={0: marker.checks},
            machine={0: marker.machine} if marker.machine else None, workers=1))
        doc.write(run_dir / "diagnosis.json")
        early.append(doc)
        out.print(renderable(doc))
        out.print(f"[dim]torchtriage: the profiling window is diagnosed "
                  f"({run_dir / 'diagnosis.json'}); training goes on, the final report "
                  "follows when the script exits (Ctrl-C stops it and keeps it all)[/dim]")

    try:
        result = run_command(command, config, timeout=args.timeout,
                             stdout_to_stderr=args.json_out,
                             on_window=window_done if steps is None and not args.json_out
                             and not args.stop_after_window else None)
    except TorchtriageError as exc:  # a command not found, --out a file: the row says so
        if runs is not None:
            runs.finish_run(run_id, "failed", str(exc), None)
        raise
    write_diagnosis(result, device_memory, args.top)  # an out-of-memory error without a trace
    doc = result.diagnosis
    if args.html_out is not None and doc is not None:
        write_html(args.html_out, out_dir, doc, trace_details(result.traces),
                   quiet=args.json_out)
    failure = describe_failure(result, args.timeout)
    if runs is not None:
        summary = failure or (f"{doc.primary} bottleneck ({doc.confidence} confidence)"
                              if doc else "")
        runs.finish_run(run_id, "failed" if failure else "done", summary,
                        doc.to_dict() if doc else None)
    if args.json_out and doc is not None:
        write_json(doc)
    elif doc is not None and early and _verdict(doc) == _verdict(early[0]):
        out.print(f"[dim]final diagnosis: {doc.primary} (as above), "
                  f"{out_dir / 'diagnosis.json'}[/dim]")
    elif doc is not None:
        out.print(renderable(doc))
    for knob_id, entry in result.knobs.items():
        status = "applied" if entry.applied else "not applied"
        out.print(f"knob {knob_id}={entry.value}: {status} ({entry.detail})")
    if failure:
        print(f"torchtriage: error: {failure}", file=sys.stderr)
        # an exit, not a return: an interrupt's handler then knows this line was said
        raise SystemExit(124 if result.timed_out else 1)
    return 0


def ab(args: argparse.Namespace) -> int:
    """A/B-test knobs on an unmodified script."""
    from torchtriage.capture.runner import python_command
    from torchtriage.diagnosis.knobs import parse_knobs
    from torchtriage.report.progress import TrialProgress
    from torchtriage.verify.ab import run_ab
    from torchtriage.verify.settings import TrialSettings

    knobs = parse_knobs(args.knob or [])
    command = python_command(list(args.command_line))
    if not command:
        raise TorchtriageError("no command to run: put it after --, e.g. "
                               "torchtriage ab --knob dataloader.num_workers=4 -- python "
                               "train.py")
    cand = python_command(shlex.split(args.candidate)) if args.candidate else None
    if args.candidate is not None and not cand:
        raise TorchtriageError("--candidate is empty")
    runs = open_store(args.store, required=False)
    err = console(stderr=True)
    if not knobs and not cand and not args.json_out:
        err.print("[dim]no --knob and no --candidate: an A/A run (both arms identical) "
                  "that measures the noise[/dim]")
    with TrialProgress(err, enabled=not args.json_out) as progress:
        settings = TrialSettings(trials=args.trials, warmup=args.warmup, steps=args.steps,
                                 timeout=args.timeout, min_effect=args.min_effect,
                                 **_min_measure(args))
        result = run_ab(command, args.out, settings, knobs=knobs, candidate=cand, store=runs,
                        progress=progress)
    if args.html_out is not None:
        from torchtriage.report.verify_html import ab_page

        write_page(args.html_out, ab_page(result), quiet=args.json_out)
    if args.md_out is not None:
        from torchtriage.report.markdown import ab_markdown

        write_page(args.md_out, ab_markdown(result), quiet=args.json_out)
    (write_json if args.json_out else print_document)(result)
    if result.verdict == "failed":
        print(f"torchtriage: error: {result.summary}", file=sys.stderr)
        return 1
    return 0


def fix(args: argparse.Namespace) -> int:
    """Diagnose, try the bottleneck's fixes cheapest first, keep what an A/B proves."""
    from torchtriage.capture.runner import python_command
    from torchtriage.fix.loop import FixSettings, run_fix
    from torchtriage.report.progress import TrialProgress
    from torchtriage.units import parse_duration
    from torchtriage.verify.settings import TrialSettings

    seconds = parse_duration(args.budget)
    device_memory = capacity(args.device_memory)
    command = python_command(list(args.command_line))
    if not command:
        raise TorchtriageError("no command to run: put it after --, e.g. torchtriage fix -- "
                               "python train.py")
    runs = open_store(args.store, required=False)
    with TrialProgress(console(stderr=True), enabled=not args.json_out) as progress:
        settings = FixSettings(budget_s=seconds, device_memory=device_memory,
                               layers=args.layers, only=args.only,
                               trial=TrialSettings(trials=args.trials, warmup=args.warmup,
                                                   steps=args.steps, timeout=args.timeout,
                                                   min_effect=args.min_effect,
                                                   **_min_measure(args)))
        result = run_fix(command, args.out, settings, store=runs, progress=progress)
    if args.html_out is not None:
        from torchtriage.report.verify_html import fix_page

        patch = Path(result.patch_file).read_text() if result.patch_file else ""
        write_page(args.html_out, fix_page(result, patch), quiet=args.json_out)
    (write_json if args.json_out else print_document)(result)
    return 0


def _min_measure(args: argparse.Namespace) -> dict[str, float]:
    """``--min-measure-s`` when given (else TrialSettings' default)."""
    return {} if args.min_measure_s is None else {"min_measure_s": args.min_measure_s}


def _verdict(doc) -> tuple[str, list[str]]:
    """What the user acts on: the primary layer and the prescriptions, in order (a final
    diagnosis that differs in either is printed again in full, never "as above")."""
    return doc.primary, [p.id for p in getattr(doc, "prescriptions", [])]
