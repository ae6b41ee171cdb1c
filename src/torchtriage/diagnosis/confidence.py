"""How sure a verdict is: the distance from the primary layer's decision to its nearest
boundary, in levels.

Algorithm: the margin is the rule's own measure above the threshold that decided it (a
recurring stall: its share of the run above ``run_stall_significant``; an outpaced loader: the
steady-state wait share above its value at ``loader_outpaced``; a time layer: its lead over the
runner-up, or over kernel reaching ``compute_bound`` when that is nearer). A margin of at least
``confidence_high_margin`` is high, of ``confidence_medium_margin`` medium, else low; memory is
high on an out-of-memory error or a peak of 95 % of capacity. Steps that are not the profiler's
own, or fewer than ``min_steps_for_confidence`` of them, each take a level off.
"""

from __future__ import annotations

from torchtriage.diagnosis import result as r
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.vocabulary import CONFIDENCE_LEVELS


def _margin_evidence(metric: str, margin: float, unit: str) -> tuple[int, r.Evidence]:
    level = (2 if margin >= th.CONFIDENCE_HIGH_MARGIN.value else
             1 if margin >= th.CONFIDENCE_MEDIUM_MARGIN.value else 0)
    return level, r.Evidence(metric=metric, value=round(margin, 4), unit=unit,
                             threshold=th.CONFIDENCE_HIGH_MARGIN.value, comparison=">=",
                             fired=margin >= th.CONFIDENCE_HIGH_MARGIN.value,
                             source=th.CONFIDENCE_HIGH_MARGIN.source)


def verdict_confidence(facts, primary: str, runner_up: str | None, memory_verdict,
                       primary_rule: r.PrimaryRule) -> tuple[str, r.Evidence]:
    """The verdict's confidence level and the margin evidence that set it.

    Args:
        facts: the rules' facts (shares, steps, the out-of-memory flag).
        primary: the primary layer; ``runner_up``: the next candidate layer.
        memory_verdict: the memory rule's verdict (its peak-fraction evidence).
        primary_rule: the rule that named the primary layer.

    Returns:
        ``(level, evidence)``: one of CONFIDENCE_LEVELS and the margin it came from.
    """
    if primary_rule.rule in ("recurring_stall", "run_recompiling"):
        share = primary_rule.evidence[0].value
        what = "in stalls" if primary_rule.rule == "recurring_stall" else "compiling"
        level, ev = _margin_evidence(
            "stall_share_over_threshold" if primary_rule.rule == "recurring_stall"
            else "recompile_share_over_threshold", share - th.RUN_STALL_SIGNIFICANT.value,
            f"share of the run's wall time {what} above run_stall_significant")
    elif primary_rule.rule == "loader_outpaced":
        # at steady state a step waits 1 - work/period of its time for data
        ratio = primary_rule.evidence[0].value
        level, ev = _margin_evidence(
            "loader_wait_share_over_boundary",
            (1 - 1 / ratio) - (1 - 1 / th.LOADER_OUTPACED.value),
            "share of a steady-state step waiting for data (1 - step work / loader period) "
            "above its value at loader_outpaced")
    elif primary == "memory":
        level = 2 if facts.oom or any(
            e.fired and e.value >= 0.95 for e in memory_verdict.evidence
            if e.metric.startswith("peak_memory_fraction")) else 1
        ev = r.Evidence(metric="memory_rule", value=1.0, fired=True,
                        source=th.MEMORY_NEAR_CAPACITY.source)
    else:
        margin = facts.share(primary) - facts.share(runner_up)
        metric = f"lead_over_{runner_up}"
        headroom = th.COMPUTE_BOUND.value - facts.share("kernel")
        if primary != "kernel" and headroom < margin:
            margin, metric = headroom, "kernel_below_compute_bound"
        level, ev = _margin_evidence(metric, margin, "share of step time")
    if facts.steps.source != "profiler_step":
        level -= 1
    if len(facts.steps) < th.MIN_STEPS_FOR_CONFIDENCE.value:
        level -= 1
    return CONFIDENCE_LEVELS[max(level, 0)], ev
