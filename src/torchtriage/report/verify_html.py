"""HTML pages for verification: ``compare`` (category and op deltas), ``ab`` (trials, interval,
loss parity) and ``fix`` (the path taken, each attempt's speedup and interval, the patch).
Built on :class:`torchtriage.report.html.Page`; every name is escaped the same way."""

from __future__ import annotations

from typing import Any

from torchtriage.report.html import Page, esc
from torchtriage.results.ab import ABResult
from torchtriage.results.compare import Comparison
from torchtriage.results.fix import FixResult


def _interval(speedup: float | None, low: float | None, high: float | None) -> str:
    if speedup is None:
        return "-"
    return f"{speedup:.2f}x" + (f" [{low:.2f}-{high:.2f}]" if low is not None else "")


def _verdict(title: str, verdict: str | None, summary: str) -> str:
    colour = {"faster": "#067647", "fits": "#067647", "slower": "#b42318",
              "changes_results": "#b42318", "failed": "#b42318"}.get(verdict or "", "#344054")
    return (f'<section id="verdict"><div class="verdict">{esc(title)}: <span style="color:'
            f'{colour}">{esc(verdict or "-")}</span></div><p>{esc(summary)}</p></section>')


def compare_page(c: Comparison) -> str:
    page = Page("torchtriage compare")
    page.add("<h1>torchtriage compare</h1>")
    page.add(_verdict(f"B against A, {_interval(c.speedup, c.ci_low, c.ci_high)}", c.verdict,
                      c.summary))
    cats = [d for d in c.deltas if d.a_ms or d.b_ms]
    figure = page.figure(
        [{"type": "bar", "name": "A", "x": [esc(d.category) for d in cats],
          "y": [round(d.a_ms, 3) for d in cats]},
         {"type": "bar", "name": "B", "x": [esc(d.category) for d in cats],
          "y": [round(d.b_ms, 3) for d in cats]}],
        {"barmode": "group", "yaxis": {"title": "exposed ms per step"}})
    page.add(f'<section id="deltas"><h2>Where the time changed</h2>{figure}'
             f'{_delta_table(cats)}</section>')
    for title, ops, anchor in (("Host ops", c.ops, "ops"), ("Device ops", c.device_ops,
                                                            "device-ops")):
        if ops:
            rows = "".join(f"<tr><td class=\"name\">{esc(o.name)}</td><td class=\"num\">"
                           f"{o.a_ms:.3f}</td><td class=\"num\">{o.b_ms:.3f}</td><td "
                           f"class=\"num\">{o.delta_ms:+.3f}</td></tr>" for o in ops)
            page.add(f'<section id="{anchor}"><h2>{title}, per step</h2><table><tr><th>op</th>'
                     '<th class="num">A ms</th><th class="num">B ms</th><th class="num">'
                     f'change</th></tr>{rows}</table></section>')
    if c.parity is not None:
        page.add(f'<section id="parity"><h2>Loss parity</h2><p>{esc(c.parity.status)}: '
                 f'{esc(c.parity.detail)}</p></section>')
    return page.render()


def _delta_table(cats: list[Any]) -> str:
    rows = "".join(f"<tr><td>{esc(d.category)}</td><td>{esc(d.layer)}</td><td class=\"num\">"
                   f"{d.a_ms:.2f}</td><td class=\"num\">{d.b_ms:.2f}</td><td class=\"num\">"
                   f"{d.delta_ms:+.2f}</td></tr>" for d in cats)
    return ("<table><tr><th>category</th><th>layer</th><th class=\"num\">A ms</th>"
            "<th class=\"num\">B ms</th><th class=\"num\">change</th></tr>" + rows + "</table>")


def ab_page(ab: ABResult) -> str:
    page = Page("torchtriage ab")
    page.add("<h1>torchtriage ab</h1>")
    page.add(_verdict(f"B against A, {_interval(ab.speedup, ab.ci_low, ab.ci_high)}",
                      ab.verdict, ab.summary))
    data = []
    for arm in ("A", "B"):
        trials = [t for t in ab.trials if t.arm == arm and t.mean_step_ms is not None]
        data.append({"type": "scatter", "mode": "markers", "name": arm,
                     "x": [f"{t.arm}{t.idx}" for t in trials],
                     "y": [round(t.mean_step_ms, 3) for t in trials], "marker": {"size": 10}})
    page.add(f'<section id="trials"><h2>Trials (mean step ms, in the order run)</h2>'
             f'{page.figure(data, {"yaxis": {"title": "mean step ms"}})}'
             f'{_trial_table(ab.trials)}</section>')
    losses = [{"type": "scatter", "mode": "lines", "name": f"{t.arm}{t.idx}",
               "y": t.losses, "line": {"dash": "solid" if t.arm == "A" else "dot"}}
              for t in ab.trials if t.losses]
    page.add(f'<section id="parity"><h2>Loss parity: {esc(ab.parity.status)}</h2><p>'
             f'{esc(ab.parity.detail)}</p>'
             + (page.figure(losses, {"xaxis": {"title": "step"}, "yaxis": {"title": "loss"}})
                if losses else "") + "</section>")
    knobs = "".join(f"<li><code>{esc(k)}={esc(o.value)}</code>: "
                    f"{'applied' if o.applied else 'not applied'} ({esc(o.detail)})</li>"
                    for k, o in ab.knobs.items())
    if knobs:
        page.add(f'<section id="knobs"><h2>Knobs</h2><ul>{knobs}</ul></section>')
    return page.render()


def _trial_table(trials: list[Any]) -> str:
    rows = "".join(f"<tr><td>{esc(t.arm)}{t.idx}</td><td>{esc(t.status)}</td><td class=\"num\">"
                   + (f"{t.mean_step_ms:.2f}" if t.mean_step_ms is not None else "-")
                   + f"</td><td class=\"num\">{t.wall_s:.1f}</td><td>"
                   + ("reused " if t.reused else "") + ("outlier, set aside " if t.outlier else "")
                   + f"{esc(t.error or '')}</td></tr>"
                   for t in trials)
    return ("<table><tr><th>trial</th><th>status</th><th class=\"num\">mean step ms</th>"
            "<th class=\"num\">wall s</th><th></th></tr>" + rows + "</table>")


def fix_page(r: FixResult, patch: str = "") -> str:
    page = Page("torchtriage fix")
    page.add("<h1>torchtriage fix</h1>")
    page.add(_verdict(f"final configuration against the original, "
                      f"{_interval(r.speedup, r.ci_low, r.ci_high)}", r.verdict, r.summary))
    labels, speedups, lows, highs = [], [], [], []
    for s in r.steps:
        for a in s.attempts:
            if a.speedup is None:
                continue
            labels.append(esc(f"{s.round}: {s.knob}={a.value!r}"))
            speedups.append(round(a.speedup, 3))
            lows.append(round(a.speedup - (a.ci_low or a.speedup), 3))
            highs.append(round((a.ci_high or a.speedup) - a.speedup, 3))
    path = ""
    if labels:
        path = page.figure(
            [{"type": "bar", "x": labels, "y": speedups, "name": "speedup",
              "error_y": {"type": "data", "symmetric": False, "array": highs,
                          "arrayminus": lows}}],
            {"yaxis": {"title": "speedup over the configuration before"},
             "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1,
                         "line": {"dash": "dash", "color": "#98a2b3"}}]})
    rows = "".join(
        f"<tr><td>{s.round}</td><td>{esc(s.layer)}</td><td>{esc(s.prescription)}</td>"
        f"<td>{esc(s.result)}</td><td>{esc(s.why)}</td></tr>" for s in r.steps)
    page.add(f'<section id="path"><h2>The path taken</h2>{path}<table><tr><th>round</th>'
             f'<th>layer</th><th>prescription</th><th>result</th><th>why</th></tr>{rows}'
             '</table></section>')
    kept = "".join(f"<li><code>{esc(k['knob'])}={esc(repr(k['value']))}</code></li>"
                   for k in r.kept) or "<li>nothing</li>"
    instructions = "".join(f"<li>{esc(i)}</li>" for i in r.instructions)
    page.add(f'<section id="kept"><h2>Kept</h2><ul>{kept}</ul>'
             + (f"<h3>Patch</h3><pre><code>{esc(patch)}</code></pre>" if patch else "")
             + (f"<h3>Lines to add</h3><ul>{instructions}</ul>" if instructions else "")
             + f'<div class="muted">stopped because {esc(r.stopped_because)}; '
             f'{r.trials_run} trials in {r.elapsed_s:.0f} s</div></section>')
    return page.render()
