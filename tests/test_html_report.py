"""The HTML report: self-contained, every section present, names from traces escaped, and it
renders in a real browser (headless Chromium, installed by .ci/run) without console errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
GPU_TRACE = FIXTURES / "gpu" / "launch_bound.pt.trace.json.gz"
TWO_RANKS = FIXTURES / "nccl" / "comm_bound"
HOSTILE = "<script>alert('pwned')</script>"
HOSTILE_TD = "aten::mm</td><img src=x onerror=alert(1)>"
SECTIONS = ("verdict", "prescriptions", "breakdown", "timeline", "top", "memory")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchtriage", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO)


def hostile_trace(path: Path) -> Path:
    events = []
    for step in range(1, 7):
        t = step * 1100.0
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
             "tid": 1, "ts": t, "dur": 1000},
            {"ph": "X", "cat": "cpu_op", "name": HOSTILE, "pid": 1, "tid": 1, "ts": t + 10,
             "dur": 500},
            {"ph": "X", "cat": "cpu_op", "name": HOSTILE_TD, "pid": 1, "tid": 1, "ts": t + 600,
             "dur": 300},
            {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
             "tid": 1, "ts": t + 20, "args": {"Total Allocated": 1_000_000 * step,
                                              "Bytes": 1000, "Device Type": 0}},
        ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory) -> tuple[Path, Path]:
    """`analyze --html --md` of the hostile trace, run once: the escaping test reads the files
    and the browser test renders the page."""
    tmp = tmp_path_factory.mktemp("hostile")
    out, md = tmp / "r.html", tmp / "r.md"
    with pytest.MonkeyPatch.context() as mp:  # a store of its own, never the user's
        mp.setenv("TORCHTRIAGE_STORE", str(tmp / "runs.sqlite"))
        proc = cli("analyze", str(hostile_trace(tmp / "t.json")), "--html", str(out),
                   "--md", str(md))
    assert proc.returncode == 0, proc.stderr
    return out, md


def test_analyze_html_escapes_names_from_the_trace(hostile_report):
    out, md = hostile_report
    assert "### Bottleneck: **" in md.read_text()
    page = out.read_text()
    assert HOSTILE not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
    # self-contained: plotly inlined, no script, style or image loaded from anywhere
    assert "Plotly.newPlot" in page and not re.search(r"<(script|link|img)[^>]+(src|href)=",
                                                      page)
    ours = page[page.index("</head>"):]
    assert not re.search(r"https?://", ours)
    for section in SECTIONS:
        assert f'id="{section}"' in page


def test_report_of_a_two_rank_job_has_the_rank_heatmap(tmp_path):
    run = tmp_path / "job"
    shutil.copytree(TWO_RANKS, run)
    proc = cli("report", str(run))
    assert proc.returncode == 0, proc.stderr
    page = (run / "report.html").read_text()
    assert 'id="ranks"' in page and 'id="rank-0"' in page and 'id="rank-1"' in page
    assert page.count('id="timeline"') == 2 and '"type":"heatmap"' in page


def test_compare_html_shows_where_the_time_changed(tmp_path):
    page = tmp_path / "c.html"
    fixed = FIXTURES / "gpu" / "launch_bound_fixed.pt.trace.json.gz"
    md = tmp_path / "c.md"
    proc = cli("compare", str(GPU_TRACE), str(fixed), "--html", str(page), "--md", str(md))
    assert proc.returncode == 0, proc.stderr
    comment = md.read_text()  # names from the trace in code spans, pipes escaped
    assert comment.startswith("## torchtriage compare: **faster**")
    ops = comment.split("| op | A ms/step |")[1].splitlines()[2:]
    assert ops and all(row.startswith("| `") for row in ops if row.startswith("|"))
    html = page.read_text()
    assert 'id="verdict"' in html and 'id="deltas"' in html and 'id="device-ops"' in html
    assert "faster" in html


def test_report_bad_inputs(tmp_path):
    proc = cli("report", str(tmp_path / "missing"))
    assert proc.returncode != 0 and "no such file" in proc.stderr
    assert "Traceback" not in proc.stderr
    broken = tmp_path / "fixdir"
    broken.mkdir()
    (broken / "fix.json").write_text('{"schema": "torchtriage.fix/1", "kept": 3}')
    proc = cli("report", str(broken))
    assert proc.returncode != 0 and "not a readable torchtriage document" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli("analyze", str(GPU_TRACE), "--html", str(tmp_path))  # a directory: refused
    assert proc.returncode == 2 and "is a directory, not a file" in proc.stderr  # up front
    assert "Traceback" not in proc.stderr


def test_jupyter_display_of_a_diagnosis():
    from IPython.core.interactiveshell import InteractiveShell

    import torchtriage
    from torchtriage.report import notebook

    shell = InteractiveShell.instance()  # what a notebook kernel runs
    assert notebook.register()
    d = torchtriage.diagnose(GPU_TRACE)
    markup = shell.display_formatter.format(d)[0]["text/html"]
    assert "Bottleneck" in markup and d.primary in markup and "<script" not in markup
    # its styles apply to the output only, not to the notebook around it
    css = markup.split("<style>")[1].split("</style>")[0]
    selectors = [x for rule in re.findall(r"([^{}]+)\{", css) for x in rule.split(",")]
    assert selectors and all(x.strip().startswith(".torchtriage ") for x in selectors)


def _chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                        "google-chrome")) if p), None)


@pytest.mark.parametrize("case", ["gpu", "two_ranks", "hostile"])
def test_report_renders_in_headless_chromium(tmp_path, case, request):
    browser = _chromium()
    if browser is None:
        if os.environ.get("TORCHTRIAGE_REQUIRE_BROWSER"):
            pytest.fail("TORCHTRIAGE_REQUIRE_BROWSER is set and no chromium was found")
        pytest.skip("no chromium on this machine (.ci/run installs Debian's)")
    if case == "hostile":  # the page the escaping test above checked as text
        out = request.getfixturevalue("hostile_report")[0]
    else:
        out = tmp_path / f"{case}.html"
        proc = cli("analyze", str({"gpu": GPU_TRACE, "two_ranks": TWO_RANKS}[case]), "--html",
                   str(out))
        assert proc.returncode == 0, proc.stderr
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--disable-dev-shm-usage", "--allow-file-access-from-files",
             "--virtual-time-budget=10000", "--enable-logging=stderr", "--v=0",
             f"--user-data-dir={tmp_path / 'profile'}"]
    # one browser start: the DOM once the page has run, and a screenshot of the same load
    shot = tmp_path / f"{case}.png"
    dom = subprocess.run([*flags, "--window-size=1280,2400", f"--screenshot={shot}",
                          "--dump-dom", out.as_uri()], capture_output=True, text=True,
                         timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
    html = dom.stdout
    for section in SECTIONS:
        assert f'id="{section}"' in html
    figures = html.count('class="figure')
    assert figures >= 3 and html.count('class="main-svg"') >= figures  # plotly drew them
    if case == "hostile":
        assert "<img" not in html and "&lt;script&gt;alert('pwned')&lt;/script&gt;" in html
    if case == "two_ranks":
        assert 'id="ranks"' in html
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("TORCHTRIAGE_ARTIFACTS"):  # CI keeps the screenshots
        artifacts = Path(os.environ["TORCHTRIAGE_ARTIFACTS"])
        artifacts.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, artifacts / f"report-{case}.png")
