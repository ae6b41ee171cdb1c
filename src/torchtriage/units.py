"""Parsing of what users type: sizes ("16GiB", 1073741824), durations ("10m"), percentages;
and sizes written back for them (:func:`format_bytes`)."""

from __future__ import annotations

import re

from torchtriage.errors import TorchtriageError

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str) -> int:
    """Bytes from an int or a size string with a unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise TorchtriageError(f"memory size must be positive, got {value}")
        return value
    m = _SIZE.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise TorchtriageError(
            f"cannot read memory size {value!r}: use a number with a unit, e.g. 16GiB or 512MB"
        )
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise TorchtriageError(f"memory size must be positive, got {value!r}")
    return size


def parse_duration(text: str, option: str = "--budget") -> float:
    """Seconds from ``90s``, ``10m``, ``1h`` or plain seconds."""
    raw = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(raw[-1:])
    number = raw[:-1] if scale else raw
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise TorchtriageError(f"{option} takes a duration such as 90s, 10m or 1h, got "
                               f"{text!r}") from None
    if seconds <= 0:
        raise TorchtriageError(f"{option} must be positive, got {text!r}")
    return seconds


def parse_percent(text: str, option: str = "--fail-on-regression") -> float:
    """A fraction from ``5%`` or ``5`` (0 <= x < 100 percent)."""
    raw = text.strip().removesuffix("%")
    try:
        value = float(raw)
    except ValueError:
        raise TorchtriageError(f"{option} takes a percentage such as 5%, got {text!r}") \
            from None
    if not 0 <= value < 100:
        raise TorchtriageError(f"{option} must be between 0% and 100%, got {text}")
    return value / 100


def format_bytes(n: int | float) -> str:
    """``n`` bytes in the largest binary unit it reaches, one decimal: "1.5 GiB", "862 B"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
