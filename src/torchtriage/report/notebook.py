"""Jupyter display of diagnoses: registered with IPython's HTML formatter, so that a
``Diagnosis`` (or a job's) left at the end of a cell shows its verdict, layers and
prescriptions. The models know nothing of it; ``import torchtriage`` registers it when IPython
is running, and :func:`register` does it by hand.
"""

from __future__ import annotations

import sys

from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.result import Diagnosis


def diagnosis_html(doc: Diagnosis | JobDiagnosis) -> str:
    """The light HTML summary (no plots; styles scoped to the output)."""
    from torchtriage.report.html import summary_html

    return "".join(summary_html(d) for d in doc.rank_diagnoses)


def register() -> bool:
    """Register :func:`diagnosis_html` with the running IPython shell; False without one."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    formatter = shell.display_formatter.formatters["text/html"]
    for kind in (Diagnosis, JobDiagnosis):
        formatter.for_type(kind, diagnosis_html)
    return True
