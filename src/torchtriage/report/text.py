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
