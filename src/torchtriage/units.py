"""Parsing of sizes given by users ("16GiB", "512MB", 1073741824)."""

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
