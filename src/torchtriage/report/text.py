"""Strings from traces and users in the terminal: always text, never markup or control codes.

rich parses a plain ``str`` cell, title or ``print`` argument as console markup, so an op named
``[/bold]`` raised ``MarkupError`` and ``[bold red]x[/bold red]`` lost its brackets. Every view
builds its cells and lines through :func:`plain` (a :class:`rich.text.Text`, which is never
parsed) and :func:`add_row`; control characters (an ESC that would restyle or clear the
user's terminal) are shown as ``\\x1b``.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from torchtriage.diagnosis.run_view import profile_summary

# C0 and C1 control characters but tab and newline
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any) -> str:
    """``value`` as a string whose control characters are written ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def plain(value: Any, style: str | None = "") -> Text:
    """``value`` as text that rich shows exactly as it is (see the module docstring)."""
    return Text(printable(value), style=style or "")


def add_row(table: Table, *cells: RenderableType | Any, style: str | None = None) -> None:
    """``table.add_row`` with every string cell made :func:`plain`."""
    table.add_row(*(plain(c) if isinstance(c, str) else c for c in cells), style=style)


_SOURCE_LABEL = {"cuda_allocator": "CUDA allocated", "process_heap": "process heap (CPU)",
                 "process_rss": "process RSS (CPU)"}


def run_lines(view) -> list[str]:
    """The whole run (a :class:`~torchtriage.diagnosis.result.RunView`) in a few lines: steps
    and time, memory growth, recurring stalls, compilation, gaps."""
    lines = [f"{view.steps} steps in {view.wall_s:.1f} s after the first, median step "
             f"{view.median_step_ms:.1f} ms"
             + (f"; first step ended {view.first_step_s:.1f} s after start"
                if view.first_step_s is not None else "")]
    g = view.growth
    if g is not None:
        label = _SOURCE_LABEL.get(g.source, g.source)
        if g.steady:
            full = (f", full at step {g.full_at_step} ({g.capacity_source})"
                    if g.full_at_step is not None else "")
            lines.append(f"memory ({label}) grows {g.bytes_per_step / 2**20:.2f} MiB/step over "
                         f"steps {g.first_step}-{g.last_step}{full}; cause: "
                         f"{g.cause.replace('_', ' ')}")
        else:
            lines.append(f"memory ({label}) flat over steps {g.first_step}-{g.last_step} "
                         f"({g.bytes_per_step / 2**20:+.3f} MiB/step, not steady growth)")
        if g.reserved_over_allocated and g.reserved_over_allocated > 1.5:
            lines.append(f"reserved is {g.reserved_over_allocated:.1f}x allocated "
                         "(fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
    elif view.growth_not_assessed:
        lines.append(f"memory growth not assessed: {view.growth_not_assessed}")
    for s in view.stalls:
        every = f"every {s.period_steps} steps" if s.period_steps else f"{len(s.steps)} times"
        lines.append(f"stalls {every} ({s.cause.replace('_', ' ')}): {s.stall_ms_median:.0f} ms "
                     f"each, {s.share_of_run:.1%} of the run")
        if s.profile is not None:
            lines.append(f"  step {s.profile.step} profiled: {s.profile.wall_ms:.0f} ms, "
                         f"{profile_summary(s.profile)}")
    c = view.compile
    if c is not None:
        lines.append(f"torch.compile: {c.compilations} compilation(s), {c.recompilations} "
                     f"recompile(s), {c.seconds:.1f} s ({c.share_of_run:.1%} of the run after "
                     f"the first step), {len(c.limit_hits)} frame(s) at the recompile limit, "
                     f"{c.graph_breaks} graph break(s)")
    lines.extend(f"gap: {gap}" for gap in view.gaps)
    return lines
