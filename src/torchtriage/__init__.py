"""torchtriage: what makes PyTorch training slow, what to fix first, and proof the fix worked.

Entry points (imported on first use, so ``import torchtriage`` stays light):

- :func:`profile` - a context manager around ``torch.profiler`` that hands back a diagnosis;
- :func:`diagnose` / :func:`analyze` - diagnose a trace file or directory captured elsewhere;
- :func:`compare`, :func:`run_ab` - verify a change;
- :func:`render_text` - the terminal report of any result;
- :class:`Diagnosis` - the result, also printed by ``torchtriage analyze --json``.

In Jupyter, diagnoses display as HTML (:mod:`torchtriage.report.notebook`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from torchtriage.errors import TorchtriageError, TraceError
from torchtriage.version import __version__

# name -> module that defines it
_EXPORTS = {
    "analyze": "torchtriage.api",
    "analyze_job": "torchtriage.api",
    "diagnose": "torchtriage.api",
    "render_text": "torchtriage.api",
    "profile": "torchtriage.capture.session",
    "Diagnosis": "torchtriage.diagnosis.result",
    "JobDiagnosis": "torchtriage.diagnosis.job",
    "run_ab": "torchtriage.verify.ab",
    "compare": "torchtriage.verify.compare",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchtriage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def step() -> None:
    """Mark the end of a training step for ``torchtriage run`` (loops without a torch optimizer).

    A no-op when the script is not running under ``torchtriage run``.
    """
    autorun = sys.modules.get("torchtriage.capture.autorun")
    run = autorun.active() if autorun is not None else None
    if run is not None:
        run.manual_step()


if "IPython" in sys.modules:  # show diagnoses as HTML in notebooks
    from torchtriage.report import notebook as _notebook

    _notebook.register()

__all__ = ["Diagnosis", "JobDiagnosis", "TorchtriageError", "TraceError", "__version__",
           "analyze", "analyze_job", "compare", "diagnose", "profile", "render_text", "run_ab",
           "step"]
