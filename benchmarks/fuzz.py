"""The ingest fuzzer's long run: mutated real traces through ``torchtriage analyze``'s path.

    python benchmarks/fuzz.py --cases 10000                 # the table at the end
    python benchmarks/fuzz.py --cases 200 --seed 7 --out fuzz-failures

Case ``i`` of seed ``S`` is drawn by ``random.Random(f"{S}:{i}")`` from the shared traces
(:mod:`fuzz_cases` says how), so any case can be made again. A forked worker judges the cases
one by one under ``TORCHTRIAGE_MEMORY_LIMIT`` (``--limit``): a diagnosis or a one-line
``TorchtriageError`` is right; a traceback (any other exception, or an error of several
lines) is a crash; the three loads disagreeing is a mismatch; a case past ``--timeout``
seconds is a hang (the worker is killed and another started); a worker that dies is a crash.
Failing cases are written to ``--out`` with what happened. Peak memory is the most resident
memory of any worker (and of the helper it forks for a large load), against the limit. Every
``--every`` cases the table so far is printed; the last one is the result.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import random
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_cases


def _worker(conn, seeds, seed: str, directory: str) -> None:
    while True:
        index = conn.recv()
        if index is None:
            return
        case = fuzz_cases.make_case(fuzz_cases.RandomChooser(random.Random(f"{seed}:{index}")),
                                    seeds)
        path = fuzz_cases.write_case(case, Path(directory), f"case-{os.getpid()}")
        conn.send(("started", case.seed, case.mutations, str(path)))
        start = time.perf_counter()
        verdict = fuzz_cases.judge(path, two_processes=index % 4 == 0)
        peak_kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        conn.send(("done", verdict.outcome, verdict.detail, time.perf_counter() - start,
                   peak_kb * 1024))


class Worker:
    def __init__(self, context, seeds, seed: str, directory: str) -> None:
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=_worker, args=(theirs, seeds, seed, directory))
        # (not a daemon: a load in two processes forks a helper)
        self.process.start()
        theirs.close()

    def stop(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


def _kind(message: str) -> str:
    """An error line without its path and numbers, to count kinds of errors."""
    return re.sub(r"[0-9][0-9,.]*", "N", message.split(": ", 1)[-1])[:60]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--seed", default="1")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds: a hang")
    parser.add_argument("--limit", default="512MiB", help="TORCHTRIAGE_MEMORY_LIMIT")
    parser.add_argument("--max-events", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"))
    parser.add_argument("--every", type=int, default=500)
    args = parser.parse_args()
    os.environ["TORCHTRIAGE_MEMORY_LIMIT"] = args.limit
    from torchtriage.units import parse_bytes

    limit = parse_bytes(args.limit)
    start = time.perf_counter()
    seeds = fuzz_cases.load_seeds(max_events=args.max_events)
    print(f"{len(seeds)} seed traces from {fuzz_cases.SHARED} in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    context = multiprocessing.get_context("fork")
    scratch = tempfile.TemporaryDirectory(prefix="torchtriage-fuzz-")
    counts: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    peak, slowest, failures = 0, (0.0, -1), []
    worker = Worker(context, seeds, args.seed, scratch.name)
    start = time.perf_counter()
    for index in range(args.cases):
        worker.conn.send(index)
        started = worker.conn.recv()
        outcome, detail, seconds = "hang", f"no answer in {args.timeout:.0f} s", args.timeout
        if worker.conn.poll(args.timeout):
            try:
                _, outcome, detail, seconds, peak_bytes = worker.conn.recv()
                peak = max(peak, peak_bytes)
            except EOFError:
                outcome, detail = "crash", "the worker died"
        if (outcome in ("hang", "crash") and not worker.process.is_alive()) or outcome == "hang":
            worker.stop()
            worker = Worker(context, seeds, args.seed, scratch.name)
        counts[outcome] += 1
        slowest = max(slowest, (seconds, index))
        if outcome == "error":
            errors[_kind(detail)] += 1
        elif outcome != "ok":
            failures.append(index)
            args.out.mkdir(parents=True, exist_ok=True)
            case_path = Path(started[3])
            if case_path.exists():
                (args.out / f"{index}{''.join(case_path.suffixes)}").write_bytes(
                    case_path.read_bytes())
            (args.out / f"{index}.txt").write_text(
                f"seed {args.seed} case {index}: {outcome}\nfrom {started[1]}, "
                f"mutations {started[2]}\n\n{detail}\n")
        if (index + 1) % args.every == 0 or index + 1 == args.cases:
            _table(index + 1, counts, peak, limit, args.limit, slowest,
                   time.perf_counter() - start, errors, failures)
    worker.conn.send(None)
    worker.process.join(timeout=5)
    scratch.cleanup()


def _table(cases, counts, peak, limit, limit_text, slowest, wall, errors, failures) -> None:
    tracebacks = counts["crash"]
    print(f"\n## Ingest fuzz: {cases:,} mutated traces\n")
    print("| cases | diagnoses | one-line errors | tracebacks | hangs | load mismatches "
          "| peak memory | limit | slowest case | wall |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {cases:,} | {counts['ok']:,} | {counts['error']:,} | {tracebacks} | "
          f"{counts['hang']} | {counts['mismatch']} | {peak / 2**20:.0f} MiB | {limit_text} "
          f"({'under' if peak < limit else 'OVER'}) | {slowest[0]:.2f} s (case {slowest[1]}) "
          f"| {wall / 60:.1f} min |")
    print("\nMost frequent errors: " + "; ".join(
        f"{n} x {kind}" for kind, n in errors.most_common(8)))
    if failures:
        print(f"Failing cases: {failures[:50]}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
