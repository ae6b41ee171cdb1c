"""One entry point for the terminal: any torchtriage document to a rich renderable or text.

Models never render themselves; the CLI, the facade's :func:`torchtriage.render_text` and the
notebook display all come through here.
"""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType

from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.document import JsonDocument
from torchtriage.report import terminal


def renderable(doc: JsonDocument) -> RenderableType:
    """The terminal view of a diagnosis, a job (every rank, then the job), a comparison, an
    A/B result or a fix result."""
    if isinstance(doc, JobDiagnosis):
        return Group(*(terminal.renderable(d) for d in doc.diagnoses),
                     terminal.job_renderable(doc))
    if isinstance(doc, Diagnosis):
        return terminal.renderable(doc)
    # the verification views, only for their documents (a diagnosis does not load them)
    from torchtriage.report import fix_view, verify_view
    from torchtriage.results.ab import ABResult
    from torchtriage.results.compare import Comparison
    from torchtriage.results.fix import FixResult

    if isinstance(doc, Comparison):
        return verify_view.comparison_renderable(doc)
    if isinstance(doc, ABResult):
        return verify_view.ab_renderable(doc)
    if isinstance(doc, FixResult):
        return fix_view.fix_renderable(doc)
    raise TypeError(f"no terminal view for {type(doc).__name__}")


def render_text(doc: JsonDocument, *, width: int = 110) -> str:
    """:func:`renderable` as plain text (no colour codes)."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False,
            emoji=False).print(renderable(doc))  # names as written (see cli.output.console)
    return buf.getvalue()
