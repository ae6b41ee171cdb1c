"""The CPU tensor bytes alive now: a census of the Python heap's tensors (``gc``).

The profiler's CPU ``Total Allocated`` starts at zero when recording starts and misses frees
made on threads it does not record; the capture counts what is alive when recording starts
(the baseline) and right after the last recorded step, and analysis/memory.py puts the peak
together from the three. Storages are counted once (by data pointer); tensors on other devices,
fake tensors and tensors without storage are left out.

The tensors are found among the objects the garbage collector tracks (``gc.get_objects()``).
That list leaves out what a script froze (``gc.freeze()``, a known way to shorten collections
once the model is built): a model frozen with its parameters was invisible, and the census
fell by its size (a 2-rank FSDP2 test job's peak read 126 % of its stand-in device instead of
61-63 %, 2026-12-03). Where anything is frozen, the objects reachable from the tracked ones,
from ``sys.modules`` and from every frame on every thread's stack are walked as well
(:func:`_with_frozen`), level by level with ``gc.get_referents``; the script's freeze is left
as it was. A frozen tensor that only C++ holds (nothing Python reaches refers to it) is still
missed there.
"""

from __future__ import annotations

import warnings


def live_cpu_tensor_bytes(*, gradients: bool = False) -> int:
    """Bytes of CPU tensor storage alive now, parameter gradients excluded unless
    ``gradients``.

    On CPU, the profiler's ``Total Allocated`` counts only what is allocated after profiling
    starts, so parameters and optimizer state created earlier are invisible to it. This is
    measured when recording starts (at a step boundary) and added to the CPU peak. Gradients
    are left out there because ``zero_grad()`` (set_to_none=True, the default) frees them and
    backward allocates them again inside the recorded steps, where they are counted. The
    gradients of wrapper-subclass parameters (FSDP2's DTensors) are their inner tensors
    (``__tensor_flatten__``). Measured again, gradients included, right after the last recorded
    step (``cpu_live_end_bytes``): see :func:`torchtriage.analysis.memory.memory_peaks`.
    """
    import gc

    import torch

    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover - very old torch
        FakeTensor = ()  # type: ignore[assignment,misc]

    storages: dict[int, int] = {}
    grads: set[int] = set()
    objects = []
    tracked = gc.get_objects()
    if gc.get_freeze_count():
        tracked = _with_frozen(tracked)
    with warnings.catch_warnings():  # isinstance() on deprecated lazy module attributes warns
        warnings.simplefilter("ignore")
        for o in tracked:
            try:  # dead weakref proxies (left by torch.compile) raise on isinstance()
                if isinstance(o, torch.Tensor) and not isinstance(o, FakeTensor):
                    objects.append(o)
            except ReferenceError:
                continue
    for obj in objects:
        try:
            if obj.device.type != "cpu":
                continue
            if not gradients and isinstance(obj, torch.nn.Parameter) and obj.grad is not None:
                grads.update(_storage_pointers(obj.grad))
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        except Exception:  # never an error in the training loop: this tensor is not counted
            continue  # dead weakref proxies, meta/sparse tensors without storage, subclasses
    storages.pop(0, None)
    return sum(n for ptr, n in storages.items() if ptr not in grads)


def _with_frozen(tracked: list) -> list:
    """``tracked`` and every container object reachable from it, from ``sys.modules`` and
    from the globals and locals of every frame on every thread's stack (breadth first, each
    object once, by id): the frozen objects among them (``gc.freeze()``) are not in
    ``gc.get_objects()``."""
    import gc
    import sys

    roots: list = [sys.modules]
    for frame in sys._current_frames().values():  # every frame of every thread's stack
        while frame is not None:
            roots += [frame.f_globals, frame.f_locals]
            frame = frame.f_back
    seen = {id(o) for o in tracked}
    found = list(tracked)
    frontier = [r for r in roots if id(r) not in seen]
    seen.update(id(r) for r in frontier)
    found += frontier
    frontier += tracked
    while frontier:
        new = []
        for ref in gc.get_referents(*frontier):
            if gc.is_tracked(ref) and id(ref) not in seen:
                seen.add(id(ref))
                new.append(ref)
        found += new
        frontier = new
    return found


def _storage_pointers(tensor) -> list[int]:
    """The storages a tensor holds: its own, or its inner tensors' for a wrapper subclass."""
    import torch

    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return [tensor.untyped_storage().data_ptr()]
    inner = (getattr(tensor, name, None) for name in flatten()[0])
    return [p for t in inner if isinstance(t, torch.Tensor) for p in _storage_pointers(t)]
