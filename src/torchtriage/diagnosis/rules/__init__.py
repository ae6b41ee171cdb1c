"""The rules: objects under one :class:`~torchtriage.diagnosis.rules.base.Rule` protocol,
collected in :data:`RULES`.

Each rule reads :class:`Facts` (every analysis of one trace, computed once) and returns a
:class:`Verdict` for its layer: the evidence it looked at (with the threshold from
:mod:`torchtriage.diagnosis.thresholds` it compared against), the findings it raises and the
catalog remedies that apply, each with the reason it applies here. The diagnose pass runs every
rule in :data:`RULES` order, merges the verdicts of rules that share a layer, and orders their
findings and remedies (primary layer first, cheapest first). Adding a rule is one entry here;
``tests/test_rules.py`` fails when a rule lacks a layer, a docstring, a declared remedy or
threshold, or returns a remedy or threshold it did not declare.
"""

from __future__ import annotations

from torchtriage.diagnosis.rules.base import (
    DeviceEvidence,
    Facts,
    Rule,
    Verdict,
    share_evidence,
    small_op_time,
)
from torchtriage.diagnosis.rules.communication import CommunicationRule
from torchtriage.diagnosis.rules.data_loading import DataLoadingRule
from torchtriage.diagnosis.rules.host import HostRule
from torchtriage.diagnosis.rules.kernel import KernelRule
from torchtriage.diagnosis.rules.memory import (
    MemoryRule,
    ladder_remedies,
    out_of_memory_evidence,
)
from torchtriage.diagnosis.rules.run import LoaderRestartRule, PeriodicWorkRule, RecompileRule

RULES: tuple[Rule, ...] = (
    MemoryRule(),
    DataLoadingRule(),
    HostRule(),
    KernelRule(),
    CommunicationRule(),
    LoaderRestartRule(),
    PeriodicWorkRule(),
    RecompileRule(),
)

__all__ = ["RULES", "DeviceEvidence", "Facts", "Rule", "Verdict", "ladder_remedies",
           "out_of_memory_evidence", "share_evidence", "small_op_time"]
