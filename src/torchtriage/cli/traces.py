"""``analyze``, ``report`` and ``compare``: traces captured elsewhere. Never imports torch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from torchtriage.cli.output import (
    capacity,
    open_store,
    print_document,
    write_html,
    write_json,
    write_page,
)
from torchtriage.errors import TorchtriageError, TraceError

if TYPE_CHECKING:
    from torchtriage.diagnosis.job import JobDiagnosis
    from torchtriage.diagnosis.result import Diagnosis


def analyze(args: argparse.Namespace) -> int:
    from torchtriage.diagnosis.traces import (
        DiagnoseOptions,
        diagnose_traces,
        diagnose_traces_with_detail,
    )

    options = DiagnoseOptions(device_memory=capacity(args.device_memory), top=args.top,
                              strict=args.strict)
    if args.html_out is not None:  # the report draws from the traces: one load for both
        doc, details = diagnose_traces_with_detail(args.path, options)
        write_html(args.html_out, args.path, doc, details, quiet=args.json_out)
    else:
        doc = diagnose_traces(args.path, options)
    if args.md_out is not None:
        from torchtriage.report.markdown import diagnosis_markdown

        write_page(args.md_out, diagnosis_markdown(doc), quiet=args.json_out)
    (write_json if args.json_out else print_document)(doc)
    return 0


def report(args: argparse.Namespace) -> int:
    from torchtriage.diagnosis.traces import DiagnoseOptions, diagnose_traces_with_detail

    run_dir: Path = args.run_dir
    for name in ("fix.json", "ab.json"):
        if (run_dir / name).is_file():
            write_page(args.html_out or run_dir / "report.html", _result_page(run_dir / name),
                       quiet=False)
            return 0
    options = DiagnoseOptions(device_memory=capacity(args.device_memory), strict=args.strict)
    if run_dir.is_dir():  # a run directory: its records' windows, machine and whole run too
        from torchtriage.capture.runner import rank_files, run_dir_options

        _, records = rank_files(run_dir)
        if records:
            options = msgspec.structs.replace(
                run_dir_options(records, options.device_memory, out=run_dir), strict=args.strict,
                workers=None)
    try:
        doc, details = diagnose_traces_with_detail(run_dir, options)
    except TraceError:
        saved = run_dir / "diagnosis.json"  # a run that ran out of memory before any trace
        if not saved.is_file():
            raise
        doc, details = _read_diagnosis(saved), None
    target = args.html_out or (run_dir / "report.html" if run_dir.is_dir() else
                               run_dir.with_suffix("").with_suffix(".html"))
    write_html(target, run_dir, doc, details, quiet=False)
    return 0


def _read_diagnosis(path: Path) -> Diagnosis | JobDiagnosis:
    from torchtriage.diagnosis.job import JobDiagnosis
    from torchtriage.diagnosis.result import Diagnosis
    from torchtriage.results.registry import read_document

    doc = read_document(path.read_bytes(), str(path))
    if not isinstance(doc, (Diagnosis, JobDiagnosis)):
        raise TorchtriageError(f"{path}: a {doc.schema} document, not a diagnosis")
    return doc


def _result_page(path: Path) -> str:
    """The HTML page of a stored ``fix.json`` (with its patch) or ``ab.json``."""
    from torchtriage.report.verify_html import ab_page, fix_page
    from torchtriage.results.ab import ABResult
    from torchtriage.results.fix import FixResult
    from torchtriage.results.registry import read_document

    doc = read_document(path.read_bytes(), str(path))
    if isinstance(doc, FixResult):
        patch = path.parent / "fix.patch"
        return fix_page(doc, patch.read_text() if patch.is_file() else "")
    if isinstance(doc, ABResult):
        return ab_page(doc)
    raise TorchtriageError(f"{path}: a {doc.schema} document has no report page")


def compare(args: argparse.Namespace) -> int:
    import msgspec

    from torchtriage.units import parse_percent
    from torchtriage.verify.compare import compare as compare_paths

    limit = (parse_percent(args.fail_on_regression) if args.fail_on_regression is not None
             else None)
    runs = open_store(args.store, required=False)
    c = compare_paths(args.a, args.b, min_effect=args.min_effect,
                      device_memory=capacity(args.device_memory), strict=args.strict)
    if runs is not None:
        c.store_id = runs.start_run("compare", [str(args.a), str(args.b)])
        runs.finish_run(c.store_id, "done", c.headline(), msgspec.to_builtins(c))
    if args.html_out is not None:
        from torchtriage.report.verify_html import compare_page

        write_page(args.html_out, compare_page(c), quiet=args.json_out)
    if args.md_out is not None:
        from torchtriage.report.markdown import comparison_markdown

        write_page(args.md_out, comparison_markdown(c), quiet=args.json_out)
    (write_json if args.json_out else print_document)(c)
    if limit is not None and c.ci_high < 1 and 1 / c.speedup - 1 > limit:
        print(f"torchtriage: regression: B's median step is {1 / c.speedup - 1:.1%} longer "
              f"than A's (95% CI {1 / c.ci_high - 1:.1%} to {1 / c.ci_low - 1:.1%}), over "
              f"the {limit:.1%} limit", file=sys.stderr)
        return 1
    return 0
