"""Self-contained HTML reports: one file that opens offline (plotly.js inlined, nothing
fetched), with the verdict and its evidence, the prescriptions with their code, a per-step
stacked breakdown, a timeline overview, top kernels and ops, the memory curve against
capacity, and for jobs a per-rank heatmap.

Every string that comes from a trace (op and kernel names are full of ``<`` and ``>``) is
escaped: HTML text with :func:`html.escape`, figure data as JSON whose ``<``, ``>`` and ``&``
are written as ``\\u003c``... so that nothing in a trace can close a ``<script>`` or open a
tag. ``summary_html`` is the light version (no plots) that notebooks show
(:mod:`torchtriage.report.notebook`).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from torchtriage.analysis.memory import MemoryCurve
from torchtriage.analysis.timeline import Timeline
from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.diagnosis.traces import TraceDetail
from torchtriage.report.text import printable, run_lines

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
#d9dde3;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
section{background:#fff;border:1px solid #e2e5ea;border-radius:8px;padding:14px 18px;
margin:14px 0}.verdict{font-size:18px;font-weight:600}.muted{color:#667085;font-size:13px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:4px 8px;
border-bottom:1px solid #eef0f3;vertical-align:top}td.num,th.num{text-align:right;
font-variant-numeric:tabular-nums}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;
font-size:12px}pre{background:#f3f4f6;padding:8px;border-radius:6px;white-space:pre-wrap;
margin:4px 0}.bar{display:inline-block;height:10px;background:#4f6bed;border-radius:2px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;background:#eef2ff;
font-size:12px;margin-right:6px}.critical{color:#b42318}.warning{color:#b54708}
.name{word-break:break-all}
"""
# The same look for a notebook output, every selector under .torchtriage so that nothing
# restyles the notebook around it.
def _scoped(css: str, scope: str) -> str:
    rules = []
    for rule in css.replace("\n", " ").split("}"):
        selectors, _, body = rule.partition("{")
        names = [x.strip() for x in selectors.split(",") if x.strip()]
        if body and not any(n in ("body", "main") for n in names):
            rules.append(",".join(f"{scope} {n}" for n in names) + "{" + body + "}")
    return "".join(rules)


_NOTEBOOK_CSS = _scoped(_CSS, ".torchtriage")
_LAYER_COLOURS = {"data_loading": "#f59e0b", "host": "#8b5cf6", "kernel": "#3b82f6",
                  "communication": "#10b981", "memory": "#ef4444"}


def esc(value: Any) -> str:
    """HTML text for any value (names from traces included)."""
    return html.escape(printable(value), quote=True)


def script_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element."""
    text = json.dumps(value, separators=(",", ":"), default=_plain)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


class Page:
    """An HTML page under construction: sections of escaped HTML and plotly figures."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figures = 0

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def figure(self, data: list[dict[str, Any]], layout: dict[str, Any], height: int = 320
               ) -> str:
        """A div and the script that draws ``data`` with ``layout`` in it (plotly)."""
        self.figures += 1
        fid = f"fig{self.figures}"
        layout = {"height": height, "margin": {"l": 60, "r": 20, "t": 30, "b": 40},
                  "paper_bgcolor": "#fff", "plot_bgcolor": "#fff", "font": {"size": 12},
                  **layout}
        return (f'<div id="{fid}" class="figure"></div><script>Plotly.newPlot("{fid}",'
                f'{script_json(data)},{script_json(layout)},{{"displaylogo":false,'
                f'"responsive":true}});</script>')

    def render(self) -> str:
        plotly = _plotly_js() if self.figures else ""
        return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<meta name=\"viewport\" content=\"width=device-width\"><title>{esc(self.title)}"
                f"</title><style>{_CSS}</style><script>{plotly}</script></head><body><main>"
                + "".join(self.parts) + "</main></body></html>")


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().replace("</script", "<\\/script")


# --- the diagnosis report ---------------------------------------------------------------------

def diagnosis_page(doc: Diagnosis | JobDiagnosis, details: list[TraceDetail] | None = None,
                   title: str = "torchtriage report") -> str:
    """The report for one trace or a job's ranks (the job summary and rank heatmap first);
    ``details`` (per rank, same order) add the timeline and memory curve."""
    diagnoses = doc.rank_diagnoses
    page = Page(title)
    page.add(f"<h1>{esc(title)}</h1><div class=\"muted\">torchtriage "
             f"{esc(diagnoses[0].tool_version)}</div>")
    if doc.skipped:
        listed = "".join(f"<li>{esc(f.path)}: {esc(f.reason)}</li>" for f in doc.skipped)
        page.add(f'<section id="skipped"><h3>Skipped {len(doc.skipped)} file(s) that could '
                 f'not be read</h3><ul>{listed}</ul></section>')
    if isinstance(doc, JobDiagnosis):
        _job_sections(page, doc, diagnoses)
    traces: list[TraceDetail | None] = list(details) if details else [None] * len(diagnoses)
    ranks = _ranks(doc)
    for d, trace, rank in zip(diagnoses, traces, ranks, strict=True):
        if len(diagnoses) > 1:
            page.add(f"<h2 id=\"rank-{esc(rank)}\">Rank {esc(rank)}</h2>")
        _diagnosis_sections(page, d, trace)
    return page.render()


def _diagnosis_sections(page: Page, d: Diagnosis, trace: TraceDetail | None) -> None:
    t = d.trace
    where = f"{t.mode.upper()} trace, {t.events:,} events, {len(t.steps_analyzed)} step(s)"
    if d.window is not None:
        where += f" (training steps {d.window.first_step}-{d.window.last_step})"
    if t.devices:
        where += f", {t.devices[0]}"
    page.add(f'<section id="verdict"><div class="verdict">Bottleneck: '
             f'<span style="color:{_LAYER_COLOURS.get(d.primary, "#111")}">{esc(d.primary)}'
             f'</span> <span class="badge">confidence {esc(d.confidence)}</span></div>'
             f'<p>{esc(d.summary)}</p><div class="muted">{esc(where)} &middot; '
             f'{esc(t.path)}</div>{_layers_table(d)}{_findings(d)}</section>')
    page.add(f'<section id="prescriptions"><h2>What to fix first</h2>{_prescriptions(d)}'
             '</section>')
    if d.run is not None:
        page.add(_run_section(page, d))
    page.add(f'<section id="breakdown"><h2>Where each step\'s time goes</h2>'
             f'{_breakdown_figure(page, d)}</section>')
    lanes = _timeline_figure(page, trace.timeline) if trace is not None else None
    if lanes:
        page.add(f'<section id="timeline"><h2>Timeline overview</h2><div class="muted">The '
                 'first analysed steps; gaps in the device lanes are device idle time.</div>'
                 f'{lanes}</section>')
    page.add(f'<section id="top"><h2>Top kernels and ops</h2>{_top_tables(d)}</section>')
    memory = _memory_figure(page, d, trace.memory) if trace is not None else None
    page.add(f'<section id="memory"><h2>Memory</h2>{_memory_table(d)}{memory or ""}'
             '</section>')


def _run_section(page: Page, d: Diagnosis) -> str:
    """The whole run: its summary lines and every step's wall time (and memory at its end)
    over the run, the stall steps marked."""
    view = d.run
    items = "".join(f"<li>{esc(line)}</li>" for line in run_lines(view))
    figure = ""
    if view.plot_steps:
        data: list[dict[str, Any]] = [{"type": "scatter", "mode": "lines", "name": "step ms",
                                       "x": view.plot_steps, "y": view.plot_step_ms}]
        stalled = {n for s in view.stalls for n in s.steps}
        marks = [(n, ms) for n, ms in zip(view.plot_steps, view.plot_step_ms, strict=True)
                 if n in stalled]
        if marks:
            data.append({"type": "scatter", "mode": "markers", "name": "recurring stall",
                         "x": [n for n, _ in marks], "y": [ms for _, ms in marks],
                         "marker": {"color": "#ef4444", "size": 7}})
        layout: dict[str, Any] = {"xaxis": {"title": "step"}, "yaxis": {"title": "step ms"},
                                  "legend": {"orientation": "h"}}
        if view.plot_memory_bytes:
            points = [(n, b) for n, b in zip(view.plot_steps, view.plot_memory_bytes,
                                             strict=True) if b >= 0]
            data.append({"type": "scatter", "mode": "lines", "yaxis": "y2",
                         "name": f"memory MiB ({view.memory_source})",
                         "x": [n for n, _ in points], "y": [round(b / 2**20, 2) for _, b in points],
                         "line": {"color": "#8b5cf6"}})
            layout["yaxis2"] = {"title": "MiB", "overlaying": "y", "side": "right"}
        figure = page.figure(data, layout)
    return (f'<section id="run"><h2>The whole run</h2><ul>{items}</ul>{figure}'
            f'{_stall_tables(view)}</section>')


def _stall_tables(view) -> str:
    """Each profiled stall step (the second window): where its time went."""
    out = []
    for stall in view.stalls:
        p = stall.profile
        if p is None:
            continue
        rows = "".join(f'<tr><td>{esc(part.label)}</td><td class="num">{part.ms:.1f}</td>'
                       f'<td class="num">{part.share:.1%}</td></tr>' for part in p.parts)
        ops = "".join(f'<tr><td>{esc(op.label)}</td><td class="num">{op.ms:.1f}</td>'
                      f'<td class="num">{op.share:.1%}</td></tr>' for op in p.top_ops)
        device = (f"; the GPU was busy {p.device_busy_ms:.1f} ms of it"
                  if p.device_busy_ms is not None else "")
        out.append(f'<h3>Stall step {p.step}, profiled ({p.wall_ms:.0f} ms{esc(device)}; '
                   f'trace {esc(p.trace)})</h3><table class="stall-profile"><tr><th>part</th>'
                   f'<th class="num">ms</th><th class="num">share</th></tr>{rows}</table>'
                   + (f'<table class="stall-ops"><tr><th>top-level op</th><th class="num">ms'
                      f'</th><th class="num">share</th></tr>{ops}</table>' if ops else ""))
    return "".join(out)


def _layers_table(d: Diagnosis) -> str:
    rows = []
    for layer, result in d.layers.items():
        evidence = "; ".join(f"{e.metric}={e.value:g}" + (f" ({e.comparison} {e.threshold:g})"
                                                        if e.threshold is not None else "")
                             for e in result.evidence)
        width = max(1, round(result.share * 200))
        rows.append(f"<tr><td>{esc(layer)}</td><td class=\"num\">{result.share:.1%}</td>"
                    f"<td><span class=\"bar\" style=\"width:{width}px;background:"
                    f"{_LAYER_COLOURS.get(layer, '#999')}\"></span></td>"
                    f"<td class=\"num\">{result.time_ms:.1f}</td><td>{esc(evidence)}</td></tr>")
    why = (f'<p id="primary-rule">Why <b>{esc(d.primary)}</b>: {esc(d.primary_rule.reason)}'
           "</p>" if d.primary_rule is not None else "")
    return ("<h3>Layers</h3><table id=\"layers\"><tr><th>layer</th><th class=\"num\">share"
            "</th><th></th><th class=\"num\">ms</th><th>evidence</th></tr>" + "".join(rows)
            + "</table>" + why)


def _findings(d: Diagnosis) -> str:
    if not d.findings:
        return ""
    items = "".join(f"<li class=\"{esc(f.severity)}\"><b>{esc(f.id)}</b>: {esc(f.message)}</li>"
                    for f in d.findings)
    return f"<h3>Findings</h3><ul id=\"findings\">{items}</ul>"


def _prescriptions(d: Diagnosis) -> str:
    held = "".join(f"<li><b>{esc(w.id)}</b> ({esc(w.layer)}): {esc(w.reason)}</li>"
                   for w in d.withheld)
    held = (f"<h3>Withheld</h3><p class=\"muted\">the evidence says these would not help "
            f"here</p><ul id=\"withheld\">{held}</ul>" if held else "")
    if not d.prescriptions:
        return "<p>No prescription: nothing stands out.</p>" + held
    out = []
    for i, p in enumerate(d.prescriptions, 1):
        out.append(f"<div class=\"prescription\"><h3>{i}. {esc(p.title)} <span class=\"badge\">"
                   f"{esc(p.id)}</span><span class=\"badge\">{esc(p.layer)} &middot; "
                   f"{esc(p.cost_label)}</span></h3><pre><code>{esc(p.code)}</code></pre>"
                   f"<div class=\"muted\">why: {esc(p.reason)} &middot; expected: "
                   f"{esc(p.expected_gain)} &middot; verify: {esc(p.verify)}</div></div>")
    return "".join(out) + held


def _breakdown_figure(page: Page, d: Diagnosis) -> str:
    b = d.breakdown
    steps = [f"#{s.step}" for s in b.steps]
    data = [{"type": "bar", "name": esc(cat), "x": steps,
             "y": [round(s.exposed_ms.get(cat, 0.0), 3) for s in b.steps]}
            for cat in b.categories if any(s.exposed_ms.get(cat, 0.0) for s in b.steps)]
    return page.figure(data, {"barmode": "stack", "yaxis": {"title": "exposed ms"},
                              "xaxis": {"title": "step"}, "legend": {"orientation": "h"}})


def _timeline_figure(page: Page, line: Timeline | None) -> str | None:
    if line is None or not line.lanes:
        return None
    data = [{"type": "bar", "orientation": "h", "name": esc(lane.name),
             "y": [esc(lane.name)] * len(lane.start_ms), "base": np.round(lane.start_ms, 4),
             "x": np.round(lane.end_ms - lane.start_ms, 4), "showlegend": False,
             "hovertemplate": "%{base:.3f}-%{x:.3f} ms<extra>" + esc(lane.name) + "</extra>"}
            for lane in reversed(line.lanes)]
    shapes = [{"type": "line", "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1,
               "line": {"color": "#98a2b3", "dash": "dot", "width": 1}}
              for x in line.step_start_ms]
    steps = ", ".join(f"#{n}" for n in line.steps)
    return page.figure(data, {"barmode": "overlay", "shapes": shapes, "bargap": 0.25,
                              "xaxis": {"title": f"ms from the start of step(s) {steps}"}},
                       height=80 + 34 * len(data))


def _top_tables(d: Diagnosis) -> str:
    out = []
    if d.gpu is not None and d.gpu.top_kernels:
        rows = "".join(f"<tr><td class=\"name\">{esc(k.name)}</td><td>{esc(k.cls)}</td>"
                       f"<td class=\"num\">{k.count}</td><td class=\"num\">{k.time_ms:.2f}</td>"
                       f"<td class=\"num\">{k.share:.1%}</td><td>{esc(k.launched_by or '')}</td>"
                       "</tr>" for k in d.gpu.top_kernels)
        out.append("<h3>Top kernels</h3><table id=\"top-kernels\"><tr><th>kernel</th>"
                   "<th>class</th><th class=\"num\">count</th><th class=\"num\">ms</th>"
                   "<th class=\"num\">share</th><th>launched by</th></tr>" + rows + "</table>")
    for side, ops in d.top_ops.items():
        rows = "".join(f"<tr><td class=\"name\">{esc(o.name)}</td><td class=\"num\">{o.count}"
                       f"</td><td class=\"num\">{o.total_ms:.2f}</td><td class=\"num\">"
                       f"{o.self_ms:.2f}</td><td class=\"num\">{o.share:.1%}</td></tr>"
                       for o in ops)
        out.append(f"<h3>Top {esc(side)} ops</h3><table class=\"top-ops\"><tr><th>op</th>"
                   "<th class=\"num\">count</th><th class=\"num\">total ms</th>"
                   "<th class=\"num\">self ms</th><th class=\"num\">share</th></tr>" + rows
                   + "</table>")
    return "".join(out) or "<p>No ops recorded.</p>"


def _memory_table(d: Diagnosis) -> str:
    if not d.memory:
        return "<p>No memory events in the trace (profile with profile_memory=True).</p>"
    rows = "".join(
        f"<tr><td>{esc(m.device)}</td><td class=\"num\">{m.peak_allocated_bytes / 2**20:,.1f}"
        f"</td><td class=\"num\">{m.peak_reserved_bytes / 2**20:,.1f}</td><td class=\"num\">"
        + (f"{m.capacity_bytes / 2**30:,.1f} GiB ({m.peak_fraction:.0%})"
           if m.capacity_bytes and m.peak_fraction is not None else "unknown")
        + "</td></tr>" for m in d.memory)
    return ("<table id=\"memory-peaks\"><tr><th>device</th><th class=\"num\">peak allocated "
            "MiB</th><th class=\"num\">peak reserved MiB</th><th class=\"num\">capacity (peak)"
            "</th></tr>" + rows + "</table>"
            + "".join(f"<p class=\"muted\">{esc(note)}</p>" for m in d.memory
                      if (note := m.unseen_frees_note)))


def _memory_figure(page: Page, d: Diagnosis, curves: list[MemoryCurve]) -> str | None:
    if not curves:
        return None
    capacity = {m.device: m.capacity_bytes for m in d.memory if m.capacity_bytes}
    data, shapes = [], []
    for curve in curves:
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv"},
                     "name": esc(curve.device), "x": np.round(curve.time_ms, 3),
                     "y": np.round(curve.allocated_bytes / 2**20, 2)})
        if capacity.get(curve.device):
            mib = capacity[curve.device] / 2**20
            shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1,
                           "y0": mib, "y1": mib, "line": {"color": "#ef4444", "dash": "dash"}})
    return page.figure(data, {"shapes": shapes, "yaxis": {"title": "allocated MiB"},
                              "xaxis": {"title": "ms"}, "legend": {"orientation": "h"}})


def _ranks(doc: Diagnosis | JobDiagnosis) -> list[int | None]:
    """The rank of each of ``doc.rank_diagnoses``: a job's rows number the traces that do not
    say their rank (never "None")."""
    if isinstance(doc, JobDiagnosis) and len(doc.ranks) == len(doc.diagnoses):
        return [r.rank for r in doc.ranks]
    return [d.trace.rank for d in doc.rank_diagnoses]


def _job_sections(page: Page, job: JobDiagnosis, diagnoses: list[Diagnosis]) -> None:
    page.add(f'<section id="job"><div class="verdict">Job bottleneck: {esc(job.primary)}'
             f'</div><p>{esc(job.summary)}</p></section>')
    categories = diagnoses[0].breakdown.categories
    z = [[round(d.breakdown.share.get(c, 0.0), 4) for c in categories] for d in diagnoses]
    ranks = [f"rank {rank}" for rank in _ranks(job)]
    figure = page.figure([{"type": "heatmap", "z": z, "x": [esc(c) for c in categories],
                           "y": ranks, "colorscale": "Blues", "zmin": 0, "zmax": 1,
                           "hovertemplate": "%{y} %{x}: %{z:.1%}<extra></extra>"}],
                         {"yaxis": {"autorange": "reversed"}}, height=120 + 28 * len(ranks))
    page.add(f'<section id="ranks"><h2>Ranks side by side (share of step time)</h2>{figure}'
             '</section>')


# --- light summary (Jupyter) ------------------------------------------------------------------

def summary_html(d: Diagnosis) -> str:
    """Verdict, layers and prescriptions without plots (for notebooks; the styles are scoped
    to the output, not the notebook)."""
    return (f'<div class="torchtriage"><style>{_NOTEBOOK_CSS}</style><section><div '
            'class="verdict">Bottleneck: '
            f'{esc(d.primary)} <span class="badge">confidence {esc(d.confidence)}</span></div>'
            f'<p>{esc(d.summary)}</p>{_layers_table(d)}{_findings(d)}<h3>What to fix first'
            f'</h3>{_prescriptions(d)}</section></div>')


def write_page(path: Path, page: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path

