"""Job-level diagnosis over per-rank diagnoses: ranks side by side, stragglers, one verdict.

Works on :class:`Diagnosis` documents only (not traces), so the same code serves a directory
of rank traces and, later, small per-rank summaries gathered over torch.distributed.

Straggler rule: in synchronous data parallelism every rank waits for the slowest at each
collective, so step times match and the slow rank shows up as the one that *waits least*:
its exposed communication share is lowest while the others wait. The rank with the smallest
share is the straggler when the gap to the largest share reaches ``straggler_comm_gap``, its
own share is at most half the largest, and its own primary layer is not communication (ranks of
a communication-bound job also wait unevenly). Its layer is the non-communication layer in
which it spends the most time beyond the other ranks' median.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Literal

import msgspec

from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import Diagnosis, Evidence, Finding, SkippedFile
from torchtriage.diagnosis.vocabulary import Confidence, Layer
from torchtriage.document import JsonDocument
from torchtriage.version import __version__

JOB_SCHEMA = "torchtriage.job/1"
_CAUSE_LAYERS = ("data_loading", "host", "kernel")


class RankRow(msgspec.Struct, kw_only=True):
    rank: int
    primary: Layer
    median_step_ms: float
    shares: dict[str, float]  # time layers
    layer_ms: dict[str, float]


class Straggler(msgspec.Struct, kw_only=True):
    rank: int
    layer: str
    extra_ms: float  # time in `layer` beyond the other ranks' median, over the analysed steps
    evidence: list[Evidence] = []


class JobDiagnosis(JsonDocument, msgspec.Struct, kw_only=True):
    """What holds the whole job back, with every rank's diagnosis."""

    schema: str = JOB_SCHEMA
    tool_version: str = __version__
    summary: str
    primary: Layer
    confidence: Confidence
    world_size: int
    step_time_skew: float  # (slowest - fastest) / median of the ranks' median step times
    ranks: list[RankRow]
    straggler: Straggler | None = None
    findings: list[Finding] = []
    diagnoses: list[Diagnosis] = []
    # How rank 0 got the per-rank diagnoses: "torchrun store" (each rank diagnosed its own
    # trace where it ran) or "run directory" (traces read from a shared directory).
    gathered_via: Literal["torchrun store", "run directory"] = "run directory"
    skipped: list[SkippedFile] = []  # files at the path that could not be diagnosed

    @property
    def rank_diagnoses(self) -> list[Diagnosis]:
        """The per-rank diagnoses, by rank."""
        return list(self.diagnoses)


def _rank(d: Diagnosis, index: int) -> int:
    return d.trace.rank if d.trace.rank is not None else index


def diagnose_job(diagnoses: list[Diagnosis]) -> JobDiagnosis:
    """Combine per-rank diagnoses (sorted by rank) into the job's verdict."""
    ordered = sorted(enumerate(diagnoses), key=lambda p: _rank(p[1], p[0]))
    rows = [
        RankRow(rank=_rank(d, i), primary=d.primary, median_step_ms=d.breakdown.median_step_ms,
                shares={k: v.share for k, v in d.layers.items() if k != "memory"},
                layer_ms={k: v.time_ms for k, v in d.layers.items() if k != "memory"})
        for i, d in ordered
    ]
    medians = [r.median_step_ms for r in rows]
    mid = statistics.median(medians) if medians else 0.0
    skew = (max(medians) - min(medians)) / mid if mid > 0 else 0.0
    straggler = _straggler(rows)
    findings: list[Finding] = []
    if straggler is not None:
        primary = straggler.layer
        waiting = [r.rank for r in rows if r.rank != straggler.rank]
        findings.append(Finding(
            id="job.straggler", severity="critical", layer=straggler.layer,
            message=f"Rank {straggler.rank} is the straggler: it spends "
                    f"{straggler.extra_ms:,.0f} ms more in {straggler.layer} than the other "
                    f"ranks, which wait for it in collectives (ranks "
                    f"{', '.join(map(str, waiting))}).", evidence=straggler.evidence))
        confidence = "high" if straggler.evidence[0].value >= 2 * th.STRAGGLER_COMM_GAP.value \
            else "medium"
    else:
        votes = Counter(r.primary for r in rows)
        primary, count = max(votes.items(),
                             key=lambda kv: (kv[1], sum(r.shares.get(kv[0], 0) for r in rows)))
        confidence = "high" if count == len(rows) else "medium" if count > len(rows) / 2 \
            else "low"
        if count < len(rows):
            findings.append(Finding(
                id="job.ranks_disagree", severity="warning",
                message="Ranks name different bottlenecks: "
                        + ", ".join(f"rank {r.rank} {r.primary}" for r in rows) + "."))
    if skew >= th.STEP_TIME_SKEW.value:
        findings.append(Finding(
            id="job.step_time_skew", severity="warning",
            message=f"Median step times differ by {skew:.0%} across ranks.",
            evidence=[Evidence(metric="step_time_skew", value=round(skew, 4),
                               threshold=th.STEP_TIME_SKEW.value, comparison=">=", fired=True,
                               source=th.STEP_TIME_SKEW.source)]))
    summary = (f"{primary} holds the job back" + (f" on rank {straggler.rank} (straggler)"
                                                   if straggler else
                                                   f" on {sum(r.primary == primary for r in rows)}"
                                                   f" of {len(rows)} ranks")
               + f" (median step {mid:.1f} ms).")
    return JobDiagnosis(summary=summary, primary=primary, confidence=confidence,
                        world_size=len(rows), step_time_skew=round(skew, 4), ranks=rows,
                        straggler=straggler, findings=findings,
                        diagnoses=[d for _, d in ordered])


def _straggler(rows: list[RankRow]) -> Straggler | None:
    if len(rows) < 2:
        return None
    comm = {r.rank: r.shares.get("communication", 0.0) for r in rows}
    slow = min(rows, key=lambda r: comm[r.rank])
    most = max(comm.values())
    gap = most - comm[slow.rank]
    # Ranks of a communication-bound job wait unevenly too (ring positions): a straggler is a
    # rank that hardly waits (at most half the longest wait) and is itself held back by
    # something else than communication.
    if (gap < th.STRAGGLER_COMM_GAP.value or comm[slow.rank] > most / 2
            or slow.primary == "communication"):
        return None
    others = [r for r in rows if r.rank != slow.rank]
    extra = {layer: slow.layer_ms.get(layer, 0.0)
             - statistics.median(r.layer_ms.get(layer, 0.0) for r in others)
             for layer in _CAUSE_LAYERS}
    layer = max(extra, key=extra.get)
    return Straggler(rank=slow.rank, layer=layer, extra_ms=round(extra[layer], 3), evidence=[
        Evidence(metric="communication_share_gap", value=round(gap, 4),
                 unit="share of step time", threshold=th.STRAGGLER_COMM_GAP.value,
                 comparison=">=", fired=True, source=th.STRAGGLER_COMM_GAP.source),
        *[Evidence(metric=f"communication_share[rank {r}]", value=round(v, 4),
                   unit="share of step time") for r, v in sorted(comm.items())],
        Evidence(metric=f"extra_{layer}_ms", value=round(extra[layer], 3), unit="ms"),
    ])
