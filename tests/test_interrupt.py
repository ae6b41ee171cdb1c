"""Signals to torchtriage `run`, `ab` and `fix` (issue 18, items 1 and 8): the command's process
group is stopped (its DataLoader workers included: nothing outlives torchtriage), what was
recorded is written, and the exit status is 128 + the signal; a SIGKILLed `fix` leaves every
trial it finished in the run store.

The script is a real training loop fed by a DataLoader with 2 worker processes; each test waits
(with a generous deadline, never a timed assertion) until the work it interrupts is under way.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from torchtriage.verify.store import RunStore

REPO = Path(__file__).resolve().parents[1]
LOADER = str(Path(__file__).parent / "scripts" / "endless_loader.py")
DEADLINE_S = 300


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    """`torchtriage ARGS` in the background, its output in tmp_path/stdout and stderr."""
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        return subprocess.Popen([sys.executable, "-m", "torchtriage", *map(str, args)],
                                cwd=REPO, stdout=stdout, stderr=stderr)


def wait_for(proc: subprocess.Popen, what: Callable[[], bool], tmp_path: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not what():
        assert proc.poll() is None, (tmp_path / "stderr").read_text()
        assert time.monotonic() < deadline, "the work to interrupt never started"
        time.sleep(0.2)


def family(pid: int) -> list[psutil.Process]:
    """The processes torchtriage started (the script, its DataLoader workers), as now."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def after(proc: subprocess.Popen, act: Callable[[], None]) -> tuple[int, list[psutil.Process]]:
    """Do ``act`` (a signal to torchtriage, a kill of one of its processes): torchtriage's
    exit status, and what of its family outlived it."""
    procs = family(proc.pid)
    act()
    try:
        code = proc.wait(timeout=120)
    finally:
        survivors = alive(procs)
        for p in survivors:  # never leave them to the next test
            p.kill()
    return code, survivors


def stop(proc: subprocess.Popen, signum: int) -> tuple[int, list[psutil.Process]]:
    """Send ``signum`` to torchtriage: its exit status, and what of its family outlived it."""
    return after(proc, lambda: proc.send_signal(signum))


def workers_running(pid: int) -> bool:
    """The script and both of its DataLoader workers are up."""
    return sum("endless_loader" in " ".join(p.cmdline()) for p in alive(family(pid))) >= 3


def trial_lines(out: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in out.rglob("trials.jsonl"))


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                              (signal.SIGHUP, 129)])
def test_a_signal_to_run_stops_the_script_and_its_workers_and_keeps_the_record(
        tmp_path, run_store, signum, code):
    out = tmp_path / "run"
    proc = start(tmp_path, "run", "--out", out, "--", "python", LOADER)
    wait_for(proc, lambda: (out / "window.rank0.json").exists() and workers_running(proc.pid),
             tmp_path)
    status, survivors = stop(proc, signum)
    assert status == code, (tmp_path / "stderr").read_text()
    assert not survivors
    name = signal.Signals(signum).name
    assert (tmp_path / "stderr").read_text().strip().splitlines()[-1] == (
        f"torchtriage: error: interrupted by {name}: the command was stopped; recorded 1 "
        f"trace(s), kept in {out}")
    assert list(out.glob("rank0_*.pt.trace.json.gz"))
    assert json.loads((out / "run.rank0.json").read_text())["steps_detected"] > 0
    assert json.loads((out / "diagnosis.json").read_text())["primary"] == "data_loading"
    (row,) = RunStore(run_store).runs()
    assert row.summary.startswith(f"interrupted by {name}") and row.result is not None


def test_sigterm_to_ab_stops_the_trial_in_flight_and_keeps_the_completed_ones(tmp_path,
                                                                              run_store):
    out = tmp_path / "ab"
    proc = start(tmp_path, "ab", "--out", out, "--trials", "3", "--steps", "4", "--json", "--",
                 "python", LOADER, "--steps", "100000")
    wait_for(proc, lambda: trial_lines(out) >= 1 and workers_running(proc.pid), tmp_path)
    status, survivors = stop(proc, signal.SIGTERM)
    assert status == 143 and not survivors
    (row,) = RunStore(run_store).runs()
    trials = RunStore(run_store).trials(row.id)
    on_disk = (out / "trials.jsonl").read_text().splitlines()
    assert row.status == "interrupted" and len(trials) == len(on_disk) >= 1
    assert all(t["status"] == "ok" for t in trials)
    assert (tmp_path / "stderr").read_text().strip().splitlines()[-1] == (
        f"torchtriage: interrupted by SIGTERM: the {len(on_disk)} completed trial(s) are in "
        f"{out / 'trials.jsonl'} and run {row.id} of the run store")


def test_sigterm_to_fix_writes_what_it_found_so_far(tmp_path, run_store):
    out = tmp_path / "fix"
    proc = start(tmp_path, "fix", "--out", out, "--trials", "2", "--steps", "4", "--json",
                 "--", "python", LOADER, "--steps", "100000")
    wait_for(proc, lambda: trial_lines(out) >= 1 and workers_running(proc.pid), tmp_path)
    status, survivors = stop(proc, signal.SIGTERM)
    assert status == 143 and not survivors
    result = json.loads((out / "fix.json").read_text())
    assert result["stopped_because"] == "interrupted by SIGTERM"
    assert result["rounds"][0]["primary"] == "data_loading"
    (row,) = RunStore(run_store).runs()
    assert row.kind == "fix" and row.status == "interrupted" and row.result is not None
    assert len(RunStore(run_store).trials(row.id)) == trial_lines(out) >= 1


def test_sigkill_mid_fix_leaves_every_finished_trial_in_the_store(tmp_path, run_store):
    out = tmp_path / "fix"
    proc = start(tmp_path, "fix", "--out", out, "--trials", "3", "--steps", "4", "--json",
                 "--", "python", LOADER, "--steps", "100000")
    wait_for(proc, lambda: trial_lines(out) >= 2, tmp_path)
    stop(proc, signal.SIGKILL)  # nothing is forwarded: stop() kills what it left behind
    (row,) = RunStore(run_store).runs()
    assert row.kind == "fix" and row.status == "interrupted"
    trials = RunStore(run_store).trials(row.id)
    assert len(trials) == trial_lines(out) >= 2
    assert all(t["status"] == "ok" and t["ab"] for t in trials)


def test_a_killed_dataloader_worker_fails_the_run_and_keeps_what_was_recorded(tmp_path):
    """A DataLoader worker dies (SIGKILL, as the kernel's OOM killer does): the script fails
    with PyTorch's own error (or the reset connection it was reading from), and torchtriage
    says so in one line, exits 1, keeps the trace,
    the record and the diagnosis, and leaves no process behind."""
    out = tmp_path / "run"
    proc = start(tmp_path, "run", "--out", out, "--", "python", LOADER)
    wait_for(proc, lambda: (out / "window.rank0.json").exists() and workers_running(proc.pid),
             tmp_path)
    procs = family(proc.pid)
    script = next(p for p in alive(procs) if p.ppid() == proc.pid)
    worker = next(p for p in alive(procs) if p.ppid() == script.pid)
    status, survivors = after(proc, worker.kill)
    stderr = (tmp_path / "stderr").read_text()
    assert status == 1 and not survivors, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"torchtriage: error: the command exited with code 1; recorded 1 trace(s), kept in "
        f"{out}")
    record = json.loads((out / "run.rank0.json").read_text())
    # PyTorch's "DataLoader worker (pid N) is killed by signal", or, when the kill lands while
    # the script reads a batch from that worker's socket, the reset connection or the end of
    # the stream it was reading (EOFError, seen in CI on 2026-12-03)
    assert any(said in record["exit_exception"] for said in (
        "DataLoader worker", "Connection reset by peer", "EOFError")), record["exit_exception"]
    assert list(out.glob("rank0_*.pt.trace.json.gz"))
    assert json.loads((out / "diagnosis.json").read_text())["primary"]


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs, nearly full: writes past a few KiB fail with ENOSPC."""
    where = tmp_path / "disk"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    with contextlib.suppress(OSError):  # full already
        (where / "filler").write_bytes(b"x" * (1024 * 1024 - 16 * 1024))
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_under_run_out_leaves_training_alone_and_says_so(tmp_path, full_disk):
    """The trace is written inside the training step that ends the window: ENOSPC there must
    not reach the training loop (the script runs to its end, exit 0), and torchtriage says in
    one line, without a traceback, what it could not write."""
    out = full_disk / "run"
    proc = start(tmp_path, "run", "--out", out, "--", "python", LOADER, "--steps", "40",
                 "--sleep-ms", "1")
    status = proc.wait(timeout=300)
    stderr = (tmp_path / "stderr").read_text()
    assert "Traceback" not in stderr, stderr
    assert status != 0, stderr
    assert "the trace could not be written" in stderr and "No space left on device" in stderr
    assert stderr.strip().splitlines()[-1].startswith(
        f"torchtriage: error: nothing could be saved in {out}: its file system has "), stderr
    assert "OSError" not in (tmp_path / "stdout").read_text()


def test_the_guard_stops_at_once_between_commands_and_restores_the_handlers():
    from torchtriage.capture import interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(interrupt.Interrupted) as caught, interrupt.forwarding():
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("the signal did not stop the guarded code")
    assert caught.value.code == 143 and caught.value.name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before and interrupt.pending() is None


def test_a_deferring_guard_stops_where_it_is_safe_and_a_second_signal_at_once():
    from torchtriage.capture import interrupt

    reached = []
    with pytest.raises(interrupt.Interrupted) as caught, interrupt.forwarding(defer=True):
        signal.raise_signal(signal.SIGHUP)
        reached.append(interrupt.pending())  # recorded, not raised: the bookkeeping goes on
        with pytest.raises(interrupt.Interrupted):
            interrupt.check()
        signal.raise_signal(signal.SIGINT)  # a second signal: no more waiting
        reached.append("past the second signal")
    assert reached == [signal.SIGHUP] and caught.value.code == 129  # the first one counts


def test_a_full_disk_under_ab_out_is_one_line_not_an_internal_error(tmp_path, full_disk):
    out = full_disk / "ab"
    proc = start(tmp_path, "ab", "--out", out, "--trials", "2", "--steps", "3", "--",
                 "python", LOADER, "--steps", "1000", "--sleep-ms", "1")
    status = proc.wait(timeout=300)
    stderr = (tmp_path / "stderr").read_text()
    assert status == 1 and "Traceback" not in stderr, stderr
    assert "nothing could be saved in" in stderr  # the trial says why it has no record
    assert stderr.strip().splitlines()[-1].startswith(
        "torchtriage: error: No space left on device"), stderr


def test_a_full_disk_under_fix_out_ends_the_profile_and_says_why(tmp_path, full_disk):
    """fix's profile round stops the script once its window is checked; a window whose trace
    could not be written was never checked, and an endless script ran on until the trial
    timeout (5 minutes with --budget 60s). Now the lost window ends the round, and the one
    line names the full disk, not a missing training step."""
    out = full_disk / "fix"
    proc = start(tmp_path, "fix", "--out", out, "--budget", "60s", "--trials", "2", "--steps",
                 "3", "--", "python", LOADER, "--steps", "100000", "--sleep-ms", "1")
    status = proc.wait(timeout=120)
    stderr = (tmp_path / "stderr").read_text()
    assert status != 0 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1].startswith(
        f"torchtriage: error: nothing could be saved in {out}"), stderr
    assert "its file system has" in stderr and "no training step" not in stderr


def test_a_killed_torchrun_rank_fails_the_job_and_keeps_every_rank_trace(tmp_path):
    """One rank of a torchrun job is SIGKILLed after the window was profiled (as the OOM
    killer does): torchrun stops the other, torchtriage says so in one line, exits 1, keeps
    both ranks' traces and the job diagnosis, and leaves no process behind."""
    out = tmp_path / "run"
    proc = start(tmp_path, "run", "--out", out, "--", "torchrun", "--nproc_per_node=2",
                 Path(__file__).parent / "scripts" / "ddp_state_heavy.py", "--steps", "100000",
                 "--blocks", "2", "--width", "128")

    def ranks() -> list[psutil.Process]:
        return [p for p in alive(family(proc.pid))
                if "ddp_state_heavy" in " ".join(p.cmdline()) and "torchrun" not in
                " ".join(p.cmdline())]

    wait_for(proc, lambda: (out / "window.rank1.json").exists() and len(ranks()) == 2,
             tmp_path)
    status, survivors = after(proc, max(ranks(), key=lambda p: p.pid).kill)
    stderr = (tmp_path / "stderr").read_text()
    assert status == 1 and not survivors, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"torchtriage: error: the command exited with code 1; recorded 2 trace(s), kept in "
        f"{out}")
    assert len(list(out.glob("rank*_*.pt.trace.json.gz"))) == 2
    job = json.loads((out / "diagnosis.json").read_text())
    assert job["schema"] == "torchtriage.job/1"
    assert sorted(d["trace"]["rank"] for d in job["diagnoses"]) == [0, 1]
