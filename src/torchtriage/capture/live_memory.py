"""The CPU tensor bytes alive now: a census of the Python heap's tensors (``gc``).

The profiler's CPU ``Total Allocated`` starts at zero when recording starts and misses frees
made on threads it does not record; the capture counts what is alive when recording starts
(the baseline) and right after the last recorded step, and analysis/memory.py puts the peak
together from the three. Storages are counted once (by data pointer); tensors on other devices,
fake tensors and tensors without storage are left out.
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
    with warnings.catch_warnings():  # isinstance() on deprecated lazy module attributes warns
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
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


def _storage_pointers(tensor) -> list[int]:
    """The storages a tensor holds: its own, or its inner tensors' for a wrapper subclass."""
    import torch

    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return [tensor.untyped_storage().data_ptr()]
    inner = (getattr(tensor, name, None) for name in flatten()[0])
    return [p for t in inner if isinstance(t, torch.Tensor) for p in _storage_pointers(t)]
