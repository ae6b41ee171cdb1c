"""Loaded by Python at start-up in processes started by ``torchtriage run``.

This folder is put first on ``PYTHONPATH``; the real work is in
:mod:`torchtriage.capture.autorun`, installed only when ``TORCHTRIAGE_RUN`` is set. Any other
``sitecustomize`` further down ``sys.path`` still runs.
"""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("TORCHTRIAGE_RUN"):
    try:
        from torchtriage.capture import autorun

        autorun.install()
    except Exception as exc:  # never break the user's script
        print(f"torchtriage: bootstrap failed ({type(exc).__name__}: {exc}); running "
              "without profiling", file=sys.stderr)

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
