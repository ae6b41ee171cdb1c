"""The ingest fuzzer, bounded for CI: mutated real traces (benchmarks/fuzz_cases.py) give a
diagnosis or a one-line error, never a traceback or a hang, and load the same in one block,
in blocks of a few KB and in two processes. ``python benchmarks/fuzz.py --cases 10000`` is the
long run."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import fuzz_cases  # noqa: E402

HANG_S = 60  # one case takes well under a second: this is a hang, not a speed assertion
_SEEDS: list = []


class HypothesisChooser:
    """A case's choices drawn by hypothesis (so that a failing case shrinks)."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def coin(self) -> bool:
        return self.data.draw(st.booleans())


@pytest.fixture
def seeds(shared_traces):
    if not _SEEDS:  # the small shared traces, cut to 150 events around their first steps
        _SEEDS.extend(fuzz_cases.load_seeds(shared_traces, max_events=150, max_mb=0.8))
    return _SEEDS


def _hang(signum, frame):
    raise TimeoutError(f"a case ran past {HANG_S} s")


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_real_traces_give_a_diagnosis_or_one_line(data, seeds, tmp_path_factory):
    case = fuzz_cases.make_case(HypothesisChooser(data), seeds)
    path = fuzz_cases.write_case(case, tmp_path_factory.mktemp("fuzz"))
    previous = signal.signal(signal.SIGALRM, _hang)
    signal.alarm(HANG_S)
    try:
        verdict = fuzz_cases.judge(path, block_bytes=data.draw(st.sampled_from([97, 4096])),
                                   two_processes=data.draw(st.integers(0, 3)) == 0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert verdict.outcome in ("ok", "error"), \
        f"{case.seed} {case.mutations}: {verdict.outcome}\n{verdict.detail}"
