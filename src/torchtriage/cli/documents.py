"""``history``, ``show``, ``knobs`` and ``schema``: the run store and the vocabularies."""

from __future__ import annotations

import argparse
import sys

from torchtriage.cli.output import console, open_store, print_document
from torchtriage.errors import TorchtriageError


def _json_dump(value: object) -> None:
    import msgspec

    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value)).decode() + "\n")


def history(args: argparse.Namespace) -> int:
    from torchtriage.verify.store import RUN_KINDS

    if args.kind is not None and args.kind not in RUN_KINDS:
        raise TorchtriageError(f"--kind takes one of {', '.join(RUN_KINDS)}, got {args.kind!r}")
    store = open_store(args.store, required=True)
    assert store is not None
    rows = store.runs(limit=args.limit, kind=args.kind)
    if args.json_out:
        _json_dump([{"id": r.id, "kind": r.kind, "created": r.created, "finished": r.finished,
                     "status": r.status, "command": r.command, "knobs": r.knobs,
                     "out_dir": r.out_dir, "summary": r.summary} for r in rows])
        return 0
    if not rows:
        print("no runs recorded yet")
        return 0
    from torchtriage.report.verify_view import history_table

    console().print(history_table(rows))
    return 0


def show(args: argparse.Namespace) -> int:
    runs = open_store(args.store, required=True)
    assert runs is not None
    row = runs.run(args.run_id)
    if row.result is None:
        trials = runs.trials(args.run_id)
        raise TorchtriageError(f"run {args.run_id} ({row.kind}) is {row.status} and has no "
                               f"result; {len(trials)} completed trial(s) are stored"
                               + (f", the trials are in {row.out_dir}" if row.out_dir else ""))
    if args.json_out:
        _json_dump(row.result)
        return 0
    from torchtriage.results.registry import decode_document

    print_document(decode_document(row.result))
    return 0


def knobs(args: argparse.Namespace) -> int:
    from torchtriage.diagnosis.knobs import KNOBS

    for k in KNOBS:
        values = "|".join(k.choices) if k.choices else k.kind
        print(f"{k.id}={values}  {k.help}")
    return 0


def schema(args: argparse.Namespace) -> int:
    from torchtriage.results.registry import json_schema

    _json_dump(json_schema(args.document))
    return 0
