"""Where a knob applies: the keyword arguments a site's knobs set, the user's line that called
into torch (for the run record's notes), and the model's repeated blocks (what activation
checkpointing and FSDP work on)."""

from __future__ import annotations

from typing import Any

from torchtriage.diagnosis import knobs as registry


def site_keywords(run, site: str) -> dict[str, str]:
    """knob id -> keyword argument, for the given knobs of a site that set one."""
    table = registry.by_id()
    return {k: table[k].keyword for k in run.knobs
            if k in table and table[k].site == site and table[k].keyword}


def library_dirs() -> tuple[str, ...]:
    import os

    import torch

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the torchtriage package
    return (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, here + os.sep)


def caller_site() -> str | None:
    """``file:line`` of the user's code that called into torch (None when there is none)."""
    import sys

    libraries = library_dirs()
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith("<") and not path.startswith(libraries):
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def repeated_blocks(root) -> list[Any]:
    """The largest run of same-class children with parameters, at any depth (a ModuleList or
    Sequential of layers): the blocks that activation checkpointing and FSDP work on."""
    best: list[Any] = []
    for container in root.modules():
        children = list(container.children())
        run_start = 0
        for i in range(1, len(children) + 1):
            if i == len(children) or type(children[i]) is not type(children[run_start]):
                group = children[run_start:i]
                has_params = any(True for b in group for _ in b.parameters())
                if len(group) >= 2 and has_params and len(group) > len(best):
                    best = group
                run_start = i
    return best
