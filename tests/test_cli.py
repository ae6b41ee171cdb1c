"""The command line: output, JSON schema and one-line errors (checked in a real subprocess)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
from conftest import write_trace, x

from torchtriage.cli import main

CLI = [sys.executable, "-m", "torchtriage"]


def _run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def _cpu_trace(tmp_path):
    events = []
    for n in range(3, 6):
        base = n * 1000.0
        events += [
            x(f"ProfilerStep#{n}", base, 1000, cat="user_annotation"),
            x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, 800,
              cat="user_annotation"),
            x("aten::mm", base + 820, 150),
        ]
    return write_trace(tmp_path / "t.pt.trace.json.gz", events, gz=True)


def test_analyze_prints_report(tmp_path, capsys):
    assert main(["analyze", str(_cpu_trace(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "Bottleneck: data_loading" in out
    assert "dataloader.num_workers" in out
    assert "Top host ops by self time" in out


def test_analyze_json_schema(tmp_path, capsys):
    assert main(["analyze", str(_cpu_trace(tmp_path)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchtriage.diagnosis/1"
    assert doc["primary"] == "data_loading"
    assert set(doc["layers"]) == {"data_loading", "host", "kernel", "communication", "memory"}
    for layer in doc["layers"].values():
        assert {"share", "time_ms", "evidence"} <= set(layer)
    b = doc["breakdown"]
    assert b["categories"] == ["data_loading", "communication", "optimizer", "backward",
                               "forward", "other"]
    assert [s["step"] for s in b["steps"]] == [3, 4, 5]
    assert b["exposed_ms"]["data_loading"] == pytest.approx(2.4)
    assert doc["prescriptions"][0] == {**doc["prescriptions"][0], "id": "dataloader.num_workers",
                                       "layer": "data_loading", "cost": 1}
    assert isinstance(doc["findings"], list)


def test_analyze_directory_of_several_traces(tmp_path, capsys):
    _cpu_trace(tmp_path)
    write_trace(tmp_path / "other.json", [x("ProfilerStep#1", 0, 100, cat="user_annotation"),
                                          x("aten::mm", 0, 90)])
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchtriage.job/1" and doc["world_size"] == 2
    assert sorted(d["primary"] for d in doc["diagnoses"]) == ["data_loading", "kernel"]
    assert {"ranks", "straggler", "primary", "step_time_skew"} <= set(doc)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.json", "no such file or directory"),
        (lambda p: (p / "a.json").write_text("not json") and p / "a.json", "not valid JSON"),
        (lambda p: (p / "b.json").write_text('{"x": 1}') and p / "b.json",
         "without 'traceEvents'"),
        (lambda p: (p / "c.json").write_text('{"traceEvents": []}') and p / "c.json",
         "empty trace"),
        (lambda p: (p / "d.json.gz").write_bytes(
            gzip.compress(b'{"traceEvents": [' + b'{"ph": "X"}, ' * 99 + b"]}")[:40])
         and p / "d.json.gz", "truncated or corrupt gzip"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "holds no trace files"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(tmp_path, make, message):
    path = make(tmp_path)
    result = _run("analyze", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("torchtriage: error: ") and message in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_bad_device_memory_and_usage_errors(tmp_path):
    result = _run("analyze", str(_cpu_trace(tmp_path)), "--device-memory", "huge")
    assert result.returncode == 2 and "cannot read memory size" in result.stderr
    assert "Traceback" not in result.stderr
    result = _run("analyze")
    assert result.returncode == 2 and "Missing argument" in result.stderr


def test_demo_runs_end_to_end(tmp_path):
    result = _run("demo", "--out", str(tmp_path / "demo"), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Bottleneck: data_loading" in result.stdout
    assert "First prescription: dataloader.num_workers" in result.stdout
    assert (tmp_path / "demo" / "diagnosis.json").exists()
    assert "profiler_start" not in result.stderr


@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"),
                                            ("fifo", "a FIFO (pipe)")])
def test_analyze_refuses_what_is_neither_a_file_nor_a_directory(tmp_path, path, kind):
    if path == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    result = _run("analyze", path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"torchtriage: error: {path}: {kind}, not a trace file or directory (a trace can be "
        "piped in as -: torchtriage analyze - < trace.json.gz)")


def test_analyze_reads_a_trace_from_stdin(tmp_path):
    trace = _cpu_trace(tmp_path).read_bytes()  # gzip
    result = subprocess.run([*CLI, "analyze", "-", "--json"], input=trace, capture_output=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["trace"]["path"] == "-" and doc["primary"] == "data_loading"
    empty = subprocess.run([*CLI, "analyze", "-"], input=b"", capture_output=True, timeout=120)
    assert empty.returncode == 2
    assert empty.stderr.decode().strip() == "torchtriage: error: -: empty file"


def test_version_help_and_no_arguments(capsys):
    from torchtriage import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"torchtriage {__version__}"
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("analyze", "report", "run", "compare", "ab", "fix", "history", "show",
                    "knobs", "schema", "demo"):
        assert f"    {command} " in out, command
    assert main([]) == 2 and "usage: torchtriage" in capsys.readouterr().err


def _options(parser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}


def _subparsers(parser) -> dict:
    (commands,) = (a for a in parser._actions if a.dest == "command")
    return dict(commands.choices)


def test_a_command_line_builds_its_own_command_only():
    """Building every command is most of argparse's set-up (5-10 ms of a short command): the
    parser for ``analyze ...`` has analyze alone, with the full parser's options; any other
    first word lists every command (help, an unknown command's error) without options."""
    from torchtriage.cli.parser import build_parser

    full = _subparsers(build_parser())
    for name, sub in full.items():
        lazy = _subparsers(build_parser(name))
        assert list(lazy) == [name]
        assert _options(lazy[name]) == _options(sub), name
        assert [a.dest for a in lazy[name]._actions] == [a.dest for a in sub._actions], name
    for first in ("--help", "frobnicate", ""):
        listed = _subparsers(build_parser(first))
        assert listed.keys() == full.keys() and not any(map(_options, listed.values()))
    assert _options(full["analyze"]) >= {"--json", "--top", "--html", "--strict"}


def test_reading_commands_run_without_the_collector_and_runners_with_it(shared_traces):
    """The console script turns the collector off (the collections imports trigger cost a
    short command 10-14 ms); run, ab, fix and demo train for minutes and turn it back on."""
    import gc

    trace = shared_traces / "hta" / "rank_non_gpu" / "rank_non_gpu.json.gz"
    # the standard-library modules a site's .pth files load before any script (a bare venv
    # loads none): their imports collect whatever the program, so they are not counted here
    code = ("import gc, sys\n"
            "import collections, contextlib, enum, re, typing\n"
            "runs = []\n"
            "gc.callbacks.append(lambda phase, info: runs.append(phase))\n"
            "from torchtriage.cli import entry_point\n"
            "sys.argv = ['torchtriage', 'analyze', sys.argv[1]]\n"
            "try:\n    entry_point()\n"
            "except SystemExit as exc:\n"
            "    print(exc.code, len(runs), gc.isenabled(), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True,
                          text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "0 0 False", done.stderr
    assert "Bottleneck: kernel" in done.stdout
    gc.disable()
    try:
        assert main(["run"]) == 2  # no command after --: refused after the collector is back
        assert gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_commands_that_decode_traces_keep_freed_memory_in_the_process(tmp_path, monkeypatch):
    """analyze, report and compare set glibc to serve blocks up to 32 MB from the heap and
    keep what is freed (a trace load frees and allocates megabytes per piece); a 4 MB block
    then comes from the heap instead of a fresh mapping. Other commands leave malloc alone."""
    code = ("import ctypes, sys\n"
            "class Info(ctypes.Structure):\n"
            "    _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks',"
            " 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]\n"
            "libc = ctypes.CDLL(None)\n"
            "libc.mallinfo2.restype = Info\n"
            "libc.malloc.restype = ctypes.c_void_p\n"
            "if sys.argv[1] == 'kept':\n"
            "    from torchtriage.cli import keep_freed_memory\n"
            "    assert keep_freed_memory()\n"
            "before = libc.mallinfo2().hblkhd\n"
            "block = libc.malloc(4 << 20)\n"
            "print(libc.mallinfo2().hblkhd - before)\n")
    mapped = {how: int(subprocess.run([sys.executable, "-c", code, how], capture_output=True,
                                      text=True, timeout=60, check=True).stdout)
              for how in ("default", "kept")}
    assert mapped["default"] >= 4 << 20 and mapped["kept"] == 0, mapped
    calls = []
    monkeypatch.setattr("torchtriage.cli.keep_freed_memory", lambda: calls.append(1))
    path = write_trace(tmp_path / "t.json", [x("ProfilerStep#1", 0, 100, cat="user_annotation"),
                                             x("aten::mm", 10, 50)])
    assert main(["analyze", "--json", str(path)]) == 0 and calls == [1]
    assert main(["knobs"]) == 0 and calls == [1]


def test_the_command_after_double_dash_is_not_parsed():
    from torchtriage.cli import _before_command_line, _command_line
    from torchtriage.cli.parser import COMMAND_RUNNERS, build_parser

    argv = ["run", "--steps", "3", "--knob", "amp.bf16=true", "--", "python", "train.py",
            "--steps", "9", "--", "x"]
    args = build_parser().parse_args(_before_command_line(argv, COMMAND_RUNNERS))
    assert args.steps == 3 and args.knob == ["amp.bf16=true"]
    assert _command_line(argv, args.command_line) == ["python", "train.py", "--steps", "9",
                                                      "--", "x"]
    # without --, what follows the options is the command
    argv = ["ab", "--trials", "2", "python", "train.py", "--lr", "0.1"]
    args = build_parser().parse_args(_before_command_line(argv, COMMAND_RUNNERS))
    assert args.trials == 2
    assert _command_line(argv, args.command_line) == ["python", "train.py", "--lr", "0.1"]


@pytest.mark.parametrize(("argv", "message"), [
    (["analyze", "t.json", "--top", "0"], "argument --top: 0 is below the minimum of 1"),
    (["analyze", "t.json", "--top", "-2"], "argument --top: -2 is below the minimum of 1"),
    (["compare", "a", "b", "--min-effect", "1.5"], "1.5 is above the maximum of 1"),
    (["analyze", "t.json", "--nope"], "unrecognized arguments: --nope"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_usage_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torchtriage: error: ") and message in err[0]


@pytest.mark.parametrize("command", ["run", "ab", "fix"])
def test_a_report_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, command):
    """--html under a file (or naming a directory) is refused at once, not after minutes of
    trials."""
    (tmp_path / "afile").write_text("x")
    proc = _run(command, "--out", str(tmp_path / "out"), "--html",
                str(tmp_path / "afile" / "r.html"), "--", "python", "-c", "pass")
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
    assert proc.stderr.strip().splitlines() == [
        f"torchtriage: error: argument --html: {tmp_path / 'afile' / 'r.html'}: "
        f"{tmp_path / 'afile'} is not a directory (see `torchtriage {command} --help`)"]
    proc = _run("analyze", str(tmp_path), "--md", str(tmp_path))
    assert proc.returncode == 2 and "is a directory, not a file" in proc.stderr


@pytest.mark.parametrize("command", ["run", "ab", "fix"])
def test_a_command_that_never_starts_is_stored_as_failed_with_why(tmp_path, command,
                                                                  run_store):
    from torchtriage.verify.store import RunStore

    proc = _run(command, "--out", str(tmp_path / "out"), "--", "no_such_command_xyz")
    assert proc.returncode == 2, proc.stderr
    (row,) = RunStore(run_store).runs()
    assert row.status == "failed" and "command not found: no_such_command_xyz" in row.summary
