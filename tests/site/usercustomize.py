"""Loaded at start-up by every Python process the test suite starts (``tests/conftest.py`` puts
this folder on ``PYTHONPATH``; Python imports ``usercustomize`` from there when the user site
is enabled, as on the CI machines). Never part of the package: users' processes keep Python's
defaults.

Two settings of the garbage collector, for speed only (2026-12-03, 2 cores, a process that
imports torch and builds an optimizer: ~3.5 s of CPU with Python's defaults):

- The generation thresholds are raised (700, 10, 10 -> 50,000, 20, 20): importing torch and
  ``torch._dynamo`` allocates millions of objects, and the collections that many allocations
  trigger took ~0.6 s of each process's CPU (median of 6 runs: 3.5 s -> 2.9 s).
- At exit (an ``atexit`` handler) every object left is frozen, moved to the permanent
  generation, which the collections of the interpreter's shutdown do not traverse: ~0.85 s of
  CPU per process before (py-spy: all of it in ``gc_collect_main``). The other ``atexit``
  handlers, torchtriage's among them, run as before, whichever side of it: freezing stops no
  collection of what they create. What it skips is the collection of reference cycles left at
  exit, whose finalizers Python does not promise to run; nothing torchtriage records waits for
  it (its records are written by its ``atexit`` and signal handlers).

Neither changes what a test measures between its arms (both run alike) nor what torchtriage
does; the suite starts a few hundred such processes.
"""

import atexit
import gc

gc.set_threshold(50_000, 20, 20)
atexit.register(gc.freeze)
