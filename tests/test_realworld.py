"""The realistic scripts (benchmarks/realworld/) start, train and print on CPU at tiny sizes.

Each script and its hand fix (``--fixed``) runs 2 steps in this process (runpy, so torch is
imported once; the out-of-memory script's hand fix under the same ``--simulate-capacity``);
the out-of-memory script as written runs as a subprocess and must fail on step 2 with
``torch.OutOfMemoryError`` and a non-zero exit.
"""

from __future__ import annotations

import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import realworld  # noqa: E402

STEPS = 2


def tiny_argv(name: str, fixed: bool, tmp_path: Path) -> list[str]:
    file, _, steps_flag = realworld.SCRIPTS[name]
    argv = [file, "--device", "cpu", steps_flag, str(STEPS),
            *shlex.split(realworld.QUICK_ARGS[name])]
    argv += {"imagenet_resnet": ["-p", "1", "-j", "0"],
             "nanogpt_memmap": ["--data-dir", str(tmp_path)]}.get(name, ["--log-interval", "1"])
    return [*argv, *(["--fixed"] if fixed else [])]


CASES = [(n, fixed) for n in realworld.SCRIPTS for fixed in (False, True)
         if (n, fixed) != ("oom_decoder", False)]  # that one runs out of memory: below


@pytest.mark.parametrize(("name", "fixed"), CASES,
                         ids=[f"{n}-{'fixed' if f else 'as_written'}" for n, f in CASES])
def test_script_trains_and_prints(name, fixed, tmp_path, monkeypatch, capsys):
    argv = tiny_argv(name, fixed, tmp_path)
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(realworld.HERE / argv[0]), run_name="__main__")
    out = capsys.readouterr().out
    assert "loss" in out.lower()


def test_oom_script_fails_on_step_two(tmp_path):
    argv = tiny_argv("oom_decoder", False, tmp_path)
    argv[argv.index("--steps") + 1] = "3"
    cmd = [sys.executable, str(realworld.HERE / argv[0]), *argv[1:]]
    oom = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert oom.returncode != 0
    assert "step 1 |" in oom.stdout and "step 2 |" not in oom.stdout
    assert "torch.OutOfMemoryError" in oom.stderr


def test_benchmark_help():
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "realworld.py"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "--quick" in result.stdout and "--only" in result.stdout
