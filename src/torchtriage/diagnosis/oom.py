"""Read the figures an out-of-memory error carries in its message.

PyTorch's CUDA caching allocator writes them in one sentence, e.g.::

    CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB
    of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.85 GiB memory
    in use. Of the allocated memory 65.30 GiB is allocated by PyTorch, and 11.90 GiB is
    reserved by PyTorch but unallocated. ...

When the process's share of the card is capped (``torch.cuda.set_per_process_memory_fraction``)
the sentence also says ``N GiB allowed;``: that cap is the capacity this job had, so it is
read as ``capacity_bytes`` instead of the card's total.

Each figure is matched on its own (older releases word the sentence differently and some
omit parts); a figure that is not there stays None.
"""

from __future__ import annotations

import re

_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(B|KiB|MiB|GiB|TiB|bytes)"
_UNITS = {"b": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_FIGURES = {
    "requested_bytes": re.compile(r"Tried to allocate " + _SIZE, re.I),
    "capacity_bytes": re.compile(r"total capacity of " + _SIZE, re.I),
    "free_bytes": re.compile(r"of which " + _SIZE + r" is free", re.I),
    "allocated_bytes": re.compile(_SIZE + r" is allocated by PyTorch", re.I),
    "reserved_unallocated_bytes": re.compile(_SIZE + r" is reserved by PyTorch but "
                                             r"unallocated", re.I),
}
_ALLOWED = re.compile(_SIZE + r" allowed;", re.I)
_GPU = re.compile(r"GPU (\d+)")


def parse_oom_message(text: str) -> dict[str, int | str]:
    """The figures found in an out-of-memory message, in bytes (``device`` as ``cuda:N``)."""
    out: dict[str, int | str] = {}
    for name, pattern in _FIGURES.items():
        found = pattern.search(text)
        if found:
            out[name] = int(float(found.group(1)) * _UNITS[found.group(2).lower()])
    allowed = _ALLOWED.search(text)
    if allowed:
        out["capacity_bytes"] = int(float(allowed.group(1)) * _UNITS[allowed.group(2).lower()])
    gpu = _GPU.search(text)
    if gpu and "cuda" in text.lower():
        out["device"] = f"cuda:{gpu.group(1)}"
    return out
