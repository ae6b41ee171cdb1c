"""What the diagnosis makes of impossible timings: the ``data_quality`` list, its finding, the
lower confidence, or no verdict at all.

Algorithm: the load dropped or clamped impossible timings and counted them
(``trace/quality.py``: ``TraceMeta.timing``); the step finder left out zero-length steps
(``analysis/steps.py``). Each kind becomes one :class:`DataQualityIssue`. The damaged share
(events whose timing was lost or changed, over the events read; exact duplicates, whose
dropping restores the trace, not counted) is held against two thresholds: at or above
``timing_damage_refuse`` there is no verdict (a one-line :class:`TraceError`), at or above
``timing_damage_lower`` the confidence is one level lower. Steps that all have zero length
leave nothing to measure: no verdict either.
"""

from __future__ import annotations

from torchtriage.analysis.steps import ZERO_LENGTH, StepWindows
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import DataQualityIssue, Evidence, Finding
from torchtriage.diagnosis.vocabulary import CONFIDENCE_LEVELS, Confidence
from torchtriage.errors import TraceError
from torchtriage.trace.model import Trace

_WHAT = {
    "missing_ts": "without a timestamp (ts)",
    "negative_duration": "with a negative duration",
    "duration_past_span": "lasting past the trace's span",
    "duplicate": "exact duplicates",
    "zero_length_step": "zero-length steps",
}


def data_quality(trace: Trace, steps: StepWindows) -> list[DataQualityIssue]:
    """One entry per kind of impossible timing found in ``trace`` and its steps."""
    timing = trace.meta.timing
    out = [DataQualityIssue(kind=i.kind, count=i.count, action=i.action, of=timing.events_read)
           for i in timing.issues]
    zero = sum(1 for reason in steps.excluded.values() if reason == ZERO_LENGTH)
    if zero:
        out.append(DataQualityIssue(kind="zero_length_step", count=zero,
                                    action="left out of the steps", of=zero + len(steps)))
    return out


def describe(issues: list[DataQualityIssue]) -> str:
    """``43,187 events with a negative duration (clamped to 0); ...``"""
    return "; ".join(
        f"{i.count:,} {'' if i.kind == 'zero_length_step' else 'events '}{_WHAT[i.kind]} "
        f"({i.action})" for i in issues)


def check_usable(trace: Trace, steps: StepWindows, issues: list[DataQualityIssue]) -> None:
    """Refuse a trace whose timings cannot bear a verdict.

    Raises:
        TraceError: the damaged share reaches ``timing_damage_refuse``, or no analysed step
            has a positive length.
    """
    timing = trace.meta.timing
    share = timing.damaged_share
    if share >= th.TIMING_DAMAGE_REFUSE.value:
        lost = [i for i in issues if i.kind not in ("duplicate", "zero_length_step")]
        raise TraceError(
            f"{trace.meta.path}: timings unusable: {timing.damaged:,} of "
            f"{timing.events_read:,} events ({share:.0%}) have impossible timings "
            f"({describe(lost)}), at or past the {th.TIMING_DAMAGE_REFUSE.value:.0%} at which "
            "no verdict is given (timing_damage_refuse)")
    if len(steps) and bool((steps.wall <= 0).all()):
        raise TraceError(f"{trace.meta.path}: timings unusable: every step ({len(steps)}, "
                         f"from {steps.source.replace('_', ' ')}) has zero length")


def lowered(confidence: Confidence, trace: Trace) -> Confidence:
    """``confidence`` one level lower when the damaged share reaches ``timing_damage_lower``."""
    if trace.meta.timing.damaged_share < th.TIMING_DAMAGE_LOWER.value:
        return confidence
    return CONFIDENCE_LEVELS[max(CONFIDENCE_LEVELS.index(confidence) - 1, 0)]


def finding(trace: Trace, issues: list[DataQualityIssue]) -> Finding | None:
    """The warning that says what was dropped or clamped (None for a clean trace)."""
    if not issues:
        return None
    share = trace.meta.timing.damaged_share
    damaged = share >= th.TIMING_DAMAGE_LOWER.value
    return Finding(
        id="data.impossible_timings", severity="warning",
        message=f"Impossible timings in the trace: {describe(issues)}."
                + (" The confidence is one level lower." if damaged else ""),
        evidence=[Evidence(metric="damaged_event_share", value=round(share, 6),
                           unit="share of complete events",
                           threshold=th.TIMING_DAMAGE_LOWER.value, comparison=">=",
                           fired=damaged, source=th.TIMING_DAMAGE_LOWER.source)])
