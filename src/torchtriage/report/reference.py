"""Reference tables for the docs, rendered from the code so that they cannot drift from it.

The caller passes the thresholds in: the diagnosis defaults
(:data:`torchtriage.diagnosis.thresholds.ALL`) and the verification defaults
(``torchtriage.verify.policy.ALL``), which live above this package and so are never imported
here. ``tests/test_docs.py`` renders ``docs/thresholds.md`` with this module and compares.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchtriage.diagnosis.thresholds import Threshold


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _value(value: float) -> str:
    return f"{value:g}"


def thresholds_markdown(groups: Sequence[tuple[str, Sequence[Threshold]]]) -> str:
    """One Markdown table per group of thresholds, each under a ``##`` heading.

    Args:
        groups: ``(title, thresholds)`` pairs, in the order the tables should appear; the
            title is Markdown (it may name the module the thresholds live in).

    Returns:
        The tables (name in backticks, value, unit, what it means, source), ending with a
        newline.
    """
    parts = []
    for title, thresholds in groups:
        rows = [f"## {title}", "", "| name | value | unit | meaning | source |",
                "|---|---|---|---|---|"]
        rows += [f"| `{t.name}` | {_value(t.value)} | {_cell(t.unit)} | {_cell(t.meaning)} "
                 f"| {_cell(t.source)} |" for t in thresholds]
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)
