"""The test suite's own set-up (tests/conftest.py): what it does to the processes it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_processes_the_suite_starts_skip_the_final_garbage_collection():
    """tests/site/usercustomize.py is loaded by the Python processes the tests start (the
    suite's time: ~0.85 s of CPU each at exit), where Python reads a user site at all (not in
    a venv without system site-packages)."""
    out = subprocess.run([sys.executable, "-c", "import site, sys; print(site.ENABLE_USER_SITE, "
                          "getattr(sys.modules.get('usercustomize'), '__file__', None))"],
                         capture_output=True, text=True, check=True).stdout.split()
    if out[0] != "True":
        pytest.skip("this interpreter reads no user site (a venv): the suite runs without it")
    assert out[1].endswith("tests/site/usercustomize.py"), out


def test_processes_the_suite_starts_let_idle_openmp_threads_sleep():
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get("
                          "'OMP_WAIT_POLICY'))"], capture_output=True, text=True, check=True)
    assert out.stdout.strip().upper() == "PASSIVE"


def test_processes_the_suite_starts_import_torch_without_collections_and_collect_after():
    """usercustomize pauses the collector while torch and torch._dynamo import (~0.25 s of
    CPU of every torch process the suite starts) and resumes it afterwards. Without the pause
    the two imports ran ~60 collections of the older generations (2026-12-03); with it, none
    (the first allocation after them collects the youngest once)."""
    code = ("import gc, sys\n"
            "if 'usercustomize' not in sys.modules: print('no-user-site'); raise SystemExit\n"
            "before = [s['collections'] for s in gc.get_stats()]\n"
            "import torch\n"
            "import torch._dynamo\n"
            "after = [s['collections'] for s in gc.get_stats()]\n"
            "print(before[1:] == after[1:], gc.isenabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    if out == ["no-user-site"]:
        pytest.skip("this interpreter reads no user site (a venv): the suite runs without it")
    assert out == ["True", "True"], out
