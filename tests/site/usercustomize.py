"""Loaded at start-up by every Python process the test suite starts (``tests/conftest.py`` puts
this folder on ``PYTHONPATH``; Python imports ``usercustomize`` from there when the user site
is enabled, as on the CI machines). Never part of the package.

It does two things to the collector, both for the suite's time: it pauses it while torch
imports (:class:`_ImportWithoutCollections`), and it skips the interpreter's final collection:
at exit (an ``atexit`` handler) every object left is moved to the permanent generation, which
the collections of the interpreter's shutdown do not traverse. The other ``atexit`` handlers,
torchtriage's among them, run as before, whichever side of it: freezing stops no collection of
what they create. A process that imported torch and built an optimizer spent ~0.85 s of CPU
there (py-spy, 2026-12-03: all of it in ``gc_collect_main``), and the suite starts a few
hundred of them. What it skips is the collection of reference cycles left at exit, whose
finalizers Python does not promise to run; nothing torchtriage records waits for it (its
records are written by its ``atexit`` and signal handlers).

Nothing is frozen earlier (after ``import torch``, say, which saved ~0.3 s of a process): the
CPU memory census reads the objects the collector tracks, and a test process would then take
the path of a script that froze its model (``capture/live_memory.py``), not the usual one.

Only at exit: raising the collector's thresholds for the whole process was tried (the
collections torch's import triggers cost ~0.6 s of CPU more) and changed what a test measures.
Tensors held in reference cycles (FSDP2's) then lived longer, and the 4-rank FSDP ladder's
sharded rung peaked at 108 % of its stand-in device instead of 53-69 %.
"""

import atexit
import gc
import sys

atexit.register(gc.freeze)


class _ImportWithoutCollections:
    """A meta path finder for the modules in :data:`NAMES`: their import (the module and all
    it imports) runs with the garbage collector paused, then collection resumes as before.

    ``import torch`` creates a few hundred thousand objects that live as long as the process,
    and the collections they trigger on the way scan them again and again (~330 collections,
    ~60 of the older generations, for ``import torch`` and ``torch._dynamo``, which the first
    optimizer's ``add_param_group`` imports). Paused: 2.45-2.6 s of CPU instead of 2.8-3.1 s
    for a process that imports torch and builds an optimizer (2026-12-03). Nothing is
    collected less afterwards: what the imports left is collected by the first collections
    after them, and everything the script creates is collected as usual (thresholds untouched;
    see above for why).
    """

    NAMES = frozenset(("torch", "torch._dynamo"))

    def find_spec(self, name, path, target=None):
        if name not in self.NAMES:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path, target)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_paused(module):
            paused = gc.isenabled()
            gc.disable()
            try:
                exec_module(module)
            finally:
                if paused:
                    gc.enable()

        loader.exec_module = exec_paused
        return spec


sys.meta_path.insert(0, _ImportWithoutCollections())


def _log_this_process(path: str) -> None:
    """One JSON line per process at exit, appended to ``path``: its command line, CPU and wall
    seconds, whether it imported torch, and the test that started it (pytest's
    ``PYTEST_CURRENT_TEST``, inherited). Where the suite's CPU goes: see docs/development.md."""
    import json
    import os
    import resource
    import time

    started = time.time()

    def log() -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        line = json.dumps({"argv": sys.argv[:4], "cpu_s": usage.ru_utime + usage.ru_stime,
                           "wall_s": time.time() - started, "torch": "torch" in sys.modules,
                           "test": os.environ.get("PYTEST_CURRENT_TEST", "")}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    atexit.register(log)


def _process_log_path() -> str | None:
    import os

    return os.environ.get("TORCHTRIAGE_TEST_PROCESS_LOG") or None


if _process_log_path():
    _log_this_process(_process_log_path())
