"""Names from a trace are text in every renderer: never rich markup, Markdown, HTML or a
terminal control sequence, and never rewritten (issue 18, item 5).

The trace is a real torch.profiler trace of a CPU loop whose steps run under
``record_function`` scopes with hostile names; its host ops are then renamed to hostile names
too (an op name cannot be chosen from Python), so that they reach the op tables.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOSTILE = ["[/bold]", "[bold red]x[/bold red]", "<script>alert(1)</script>", "a|b`c`",
           "\x1b[31mred", ":smile: **b** _i_ [l](http://x)"]
SHOWN = {"\x1b[31mred": "\\x1b[31mred"}  # a control character is shown, never sent
OPS = ["aten::mm", "aten::normal_", "aten::randn", "aten::empty", "aten::matmul",
       "aten::resolve_conj"]
FILE_NAME = "[red]hostile.json"  # rich would drop the tag and colour the rest


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    folder = tmp_path_factory.mktemp("hostile")
    raw = folder / "raw.json"
    with profile(activities=[ProfilerActivity.CPU], acc_events=True,
                 schedule=schedule(wait=0, warmup=1, active=4, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(5):
            for name in HOSTILE:
                with record_function(name):
                    torch.randn(128, 128) @ torch.randn(128, 128)
            prof.step()
    doc = json.loads(raw.read_text())
    found = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"}
    assert set(OPS) <= found, found
    scopes = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"}
    assert set(HOSTILE) - set(SHOWN) <= scopes  # (Kineto leaves out a scope named with ESC)
    rename = dict(zip(OPS, HOSTILE, strict=True))
    for event in doc["traceEvents"]:
        if event.get("cat") == "cpu_op" and event["name"] in rename:
            event["name"] = rename[event["name"]]
    path = folder / FILE_NAME
    path.write_text(json.dumps(doc))
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "torchtriage", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=env)


def test_terminal_shows_hostile_names_as_text(hostile):
    proc = cli("analyze", str(hostile))
    assert proc.returncode == 0, proc.stderr
    assert f"torchtriage · {hostile}" in proc.stdout  # a file name with markup in it
    for name in HOSTILE:
        assert SHOWN.get(name, name) in proc.stdout, name
    assert "\x1b" not in proc.stdout


def test_json_keeps_hostile_names_exactly(hostile):
    proc = cli("analyze", str(hostile), "--json")
    assert proc.returncode == 0, proc.stderr
    names = {op["name"] for op in json.loads(proc.stdout)["top_ops"]["host"]}
    assert set(HOSTILE) <= names


def test_compare_terminal_and_markdown_show_hostile_names_as_text(hostile, tmp_path):
    other = tmp_path / "other.json"
    other.write_bytes(hostile.read_bytes())
    md = tmp_path / "c.md"
    proc = cli("compare", str(hostile), str(other), "--md", str(md))
    assert proc.returncode == 0, proc.stderr
    for name in HOSTILE:
        assert SHOWN.get(name, name) in proc.stdout, name
    assert "\x1b" not in proc.stdout
    rows = {line.split(" | ")[0][2:] for line in md.read_text().splitlines()
            if line.startswith("| `")}
    # each name in a code span: as many backticks around as it needs, | escaped for the table
    assert {"`[/bold]`", "`[bold red]x[/bold red]`", "`<script>alert(1)</script>`",
            "`` a\\|b`c` ``", "`\\x1b[31mred`", "`:smile: **b** _i_ [l](http://x)`"} <= rows
    assert "\x1b" not in md.read_text()


def test_html_shows_hostile_names_as_text(hostile, tmp_path):
    page = tmp_path / "r.html"
    proc = cli("analyze", str(hostile), "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for name in ("[/bold]", "[bold red]x[/bold red]", "a|b`c`", "\\x1b[31mred"):
        assert name in html, name
    assert "\x1b" not in html


def test_progress_line_shows_a_hostile_trial_error_as_text():
    from rich.console import Console

    from torchtriage.report.progress import TrialProgress
    from torchtriage.results.ab import Trial

    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None, force_terminal=False)
    trial = Trial(arm="B", idx=1, status="failed", returncode=1, wall_s=1.0, dir="d",
                  knobs={}, error="exited with code 1: KeyError: '[/bold]' \x1b[2J")
    with TrialProgress(console, enabled=True) as progress:
        progress("B [red]knob[/]=1", 1, 2, None)
        progress("B [red]knob[/]=1", 1, 2, trial)
        progress("a finding about [/bold]", 0, -1, None)
    text = buf.getvalue()
    assert "KeyError: '[/bold]' \\x1b[2J" in text and "a finding about [/bold]" in text
    assert "\x1b" not in text
