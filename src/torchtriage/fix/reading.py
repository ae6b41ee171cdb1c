"""What the fix loop reads from a diagnosis: the one diagnosis of a job to act on, whether a
prescription is a worker-count search, and the whole run's leak and recurring-stall period
(diagnosis/run_view.py) that change how the loop climbs and how long its trials run."""

from __future__ import annotations

from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.knobs import served
from torchtriage.diagnosis.result import Diagnosis, MemoryGrowth
from torchtriage.diagnosis.thresholds import RUN_STALL_SIGNIFICANT

LEAK_FIX = "memory.fix_leak"  # the prescription for memory that grows over the run
# A/B trials measure whole periods of a recurring stall up to this period (steps)
MAX_TRIAL_PERIOD = 200


def searches_workers(prescription: str) -> bool:
    found = served(prescription)
    return found is not None and found[1].rule == "workers"


def stall_period(doc: Diagnosis | None) -> int:
    """The period of the costliest significant recurring stall the first profile saw over its
    run (0: none, or longer than MAX_TRIAL_PERIOD)."""
    run = getattr(doc, "run", None)
    for stall in run.stalls if run is not None else ():
        if stall.period_steps and stall.share_of_run >= RUN_STALL_SIGNIFICANT.value:
            return stall.period_steps if stall.period_steps <= MAX_TRIAL_PERIOD else 0
    return 0


def leak_of(doc: Diagnosis | None) -> MemoryGrowth | None:
    """The run's steady memory growth (a leak), or None."""
    run = getattr(doc, "run", None)
    growth = run.growth if run is not None else None
    return growth if growth is not None and growth.steady else None


def representative(doc: Diagnosis | JobDiagnosis | None) -> Diagnosis | None:
    """One diagnosis to act on: the only one, or for several ranks the job's primary layer
    as seen by a rank that has it (its prescriptions are that layer's)."""
    if not isinstance(doc, JobDiagnosis):
        return doc
    ranks = doc.rank_diagnoses
    if doc.straggler is not None:
        return next(d for d in ranks if (d.trace.rank or 0) == doc.straggler.rank)
    return next((d for d in ranks if d.primary == doc.primary), ranks[0])
