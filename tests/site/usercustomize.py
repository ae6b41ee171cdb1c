"""Loaded at start-up by every Python process the test suite starts (``tests/conftest.py`` puts
this folder on ``PYTHONPATH``; Python imports ``usercustomize`` from there when the user site
is enabled, as on the CI machines). Never part of the package.

It skips the interpreter's final garbage collection: at exit (an ``atexit`` handler) every
object left is moved to the permanent generation, which the collections of the interpreter's
shutdown do not traverse. The other ``atexit`` handlers, torchtriage's among them, run as
before, whichever side of it: freezing stops no collection of what they create. A process that
imported torch and built an optimizer spent ~0.85 s of CPU there (py-spy, 2026-12-03: all of it
in ``gc_collect_main``), and the suite starts a few hundred of them. What it skips is the
collection of reference cycles left at exit, whose finalizers Python does not promise to run;
nothing torchtriage records waits for it (its records are written by its ``atexit`` and
signal handlers).

Only at exit: raising the collector's thresholds for the whole process was tried (the
collections torch's import triggers cost ~0.6 s of CPU more) and changed what a test measures.
Tensors held in reference cycles (FSDP2's) then lived longer, and the 4-rank FSDP ladder's
sharded rung peaked at 108 % of its stand-in device instead of 53-69 %.
"""

import atexit
import gc

atexit.register(gc.freeze)
