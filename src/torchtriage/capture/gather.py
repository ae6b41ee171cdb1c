"""Bringing the ranks of a job together at exit: each rank diagnoses its own trace and shares
the (small) result over torchrun's rendezvous store, and rank 0 writes the job's
``diagnosis.json``; without a store, rank 0 waits for every rank's record in the shared run
directory and diagnoses all rank traces there."""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from torchtriage.capture.agreement import torchrun_store
from torchtriage.diagnosis.result import OutOfMemory, WindowCheck

log = logging.getLogger(__name__)
WAIT_FOR_RANKS_S = 60.0  # how long rank 0 waits for the other ranks' results at exit


def share_over_store(out: Path, rank: int, world_size: int, trace: Path | None,
                     device_memory: int | None, machine: dict[str, Any] | None,
                     out_of_memory: OutOfMemory | None = None,
                     windows: list[WindowCheck] | None = None) -> bool:
    """Each rank diagnoses its own trace where it runs and publishes the result in torchrun's
    rendezvous store; rank 0 gathers them into ``diagnosis.json``. No shared filesystem is
    needed and no rank parses another rank's trace. False when there is no store to reach or
    the exchange failed (the caller falls back to the shared run directory)."""
    store = torchrun_store()
    if store is None or trace is None:
        return False
    from torchtriage.diagnosis.diagnose import diagnose
    from torchtriage.trace.ingest import load_trace

    key = f"torchtriage/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{out}/"
    try:
        mine = diagnose(load_trace(trace, workers=1), device_memory=device_memory, machine=machine,
                        oom=out_of_memory is not None, out_of_memory=out_of_memory,
                        windows=windows)
        store.set(key + str(rank), mine.to_json(indent=0))
        if rank != 0:
            return True
        from torchtriage.diagnosis.job import diagnose_job
        from torchtriage.diagnosis.result import decode_diagnosis

        keys = [key + str(r) for r in range(world_size)]
        store.wait(keys, timedelta(seconds=WAIT_FOR_RANKS_S))
        ranks = [decode_diagnosis(store.get(k)) for k in keys]
        job = diagnose_job(ranks)
        job.gathered_via = "torchrun store"
        job.write(out / "diagnosis.json")
        return True
    except Exception as exc:  # a rank that never arrives, a store that went away
        log.warning("torchtriage: gathering rank diagnoses over the store failed (%s); "
                    "using the run directory", exc)
        return False


def write_job_diagnosis(out: Path, world_size: int, device_memory: int | None) -> None:
    """Rank 0: once every rank's record is on disk (or after WAIT_FOR_RANKS_S), diagnose all
    rank traces into ``diagnosis.json``."""
    from torchtriage.capture.runner import diagnose_run_dir, rank_files

    if world_size > 1:  # one process wrote its own record just before (or could not)
        wait_for_records(out, world_size)
    try:
        traces, records = rank_files(out)
        if traces:
            diagnose_run_dir(out, traces, records, device_memory)
    except Exception as exc:  # the parent diagnoses again; the traces are on disk
        log.warning("torchtriage: rank 0 could not write the job diagnosis (%s)", exc)


def wait_for_records(out: Path, world_size: int, seconds: float = WAIT_FOR_RANKS_S) -> bool:
    """Wait until ``out`` holds a run record per rank (``run.rank<N>.json``), at most
    ``seconds``; whether they all arrived."""
    deadline = time.monotonic() + seconds
    while True:
        if len(list(out.glob("run.rank*.json"))) >= world_size:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
