"""The test suite's own set-up (tests/conftest.py): what it does to the processes it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_processes_the_suite_starts_collect_garbage_less_often_and_not_at_exit():
    """tests/site/usercustomize.py is loaded by the Python processes the tests start (the
    suite's time: ~1.5 s of CPU each, see there), where Python reads a user site at all (not
    in a venv without system site-packages), and sets their collector."""
    code = ("import atexit, gc, site, sys\n"
            "module = sys.modules.get('usercustomize')\n"
            "print(site.ENABLE_USER_SITE, getattr(module, '__file__', None), gc.get_threshold())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split(maxsplit=2)
    if out[0] != "True":
        pytest.skip("this interpreter reads no user site (a venv): the suite runs without it")
    assert out[1].endswith("tests/site/usercustomize.py"), out
    assert out[2].strip() == "(50000, 20, 20)", out
