"""torchtriage: what makes PyTorch training slow, what to fix first, and proof the fix worked.

Entry points:

- :func:`profile` - a context manager around ``torch.profiler`` that hands back a diagnosis;
- :func:`analyze` - diagnose a trace file or directory captured elsewhere;
- :class:`Diagnosis` - the result, also printed by ``torchtriage analyze --json``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from torchtriage.api import analyze, analyze_job
from torchtriage.capture.session import profile
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.errors import TorchtriageError, TraceError
from torchtriage.verify.ab import run_ab
from torchtriage.verify.compare import compare


def step() -> None:
    """Mark the end of a training step for ``torchtriage run`` (loops without a torch optimizer).

    A no-op when the script is not running under ``torchtriage run``.
    """
    from torchtriage.capture.autorun import active

    run = active()
    if run is not None:
        run.manual_step()


__all__ = ["Diagnosis", "TorchtriageError", "TraceError", "__version__", "analyze",
           "analyze_job", "compare", "profile", "run_ab", "step"]
