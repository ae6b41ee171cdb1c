"""Terminal views of verification results: comparisons, A/B experiments, the run history."""

from __future__ import annotations

import datetime as dt

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from torchtriage.report.text import add_row, plain
from torchtriage.results.ab import ABResult
from torchtriage.results.compare import Comparison

_VERDICT_STYLE = {"faster": "bold green", "slower": "bold red", "no_change": "bold yellow",
                  "changes_results": "bold red", "fits": "bold green", "failed": "bold red"}


def comparison_renderable(c: Comparison) -> RenderableType:
    head = Text()
    head.append(f"{c.verdict}", style=_VERDICT_STYLE.get(c.verdict, "bold"))
    head.append(plain(f"  {c.summary}"))
    sides = Table(box=box.SIMPLE_HEAD, title="Sides")
    for col in ("", "path", "traces", "steps", "median step ms", "bottleneck"):
        sides.add_column(col)
    for label, s in (("A", c.a), ("B", c.b)):
        add_row(sides, label, plain(s.path), str(s.traces), str(s.steps),
                      f"{s.median_step_ms:.2f}", s.primary)
    deltas = Table(box=box.SIMPLE_HEAD, title="Where the time went (ms per step)")
    for col in ("category", "layer", "A", "B", "delta"):
        deltas.add_column(col, justify="right" if col in ("A", "B", "delta") else "left")
    for d in c.deltas:
        add_row(deltas, d.category, d.layer, f"{d.a_ms:.2f}", f"{d.b_ms:.2f}",
                       plain(f"{d.delta_ms:+.2f}", style=_delta_style(d.delta_ms)))
    parts: list[RenderableType] = [Panel(head, title="torchtriage compare", expand=False),
                                   sides]
    for label, s in (("A", c.a), ("B", c.b)):
        if s.skipped:
            parts.append(plain(f"{label}: skipped {len(s.skipped)} file(s) that could not be "
                               "read: " + "; ".join(f"{f.path} ({f.reason})"
                                                    for f in s.skipped), style="yellow"))
    parts.append(deltas)
    for title, rows in (("Host ops (self time)", c.ops), ("Device ops", c.device_ops)):
        if rows:
            parts.append(_op_table(title, rows))
    if c.parity is not None:
        parts.append(plain(f"Loss parity: {c.parity.status} ({c.parity.detail})"))
    if c.store_id is not None:
        parts.append(plain(f"stored as run {c.store_id}", style="dim"))
    return Group(*parts)


def _op_table(title: str, rows) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title=f"{title}: largest changes, per step")
    t.add_column("op")
    for col in ("calls A", "calls B", "ms A", "ms B", "delta ms"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        add_row(t, plain(_short(r.name, 52)), f"{r.a_count:g}", f"{r.b_count:g}", f"{r.a_ms:.3f}",
                  f"{r.b_ms:.3f}", plain(f"{r.delta_ms:+.3f}", style=_delta_style(r.delta_ms)))
    return t


def _delta_style(delta: float) -> str:
    return "green" if delta < 0 else ("red" if delta > 0 else "")


def ab_renderable(r: ABResult) -> RenderableType:
    head = Text()
    head.append(r.verdict, style=_VERDICT_STYLE.get(r.verdict, "bold"))
    head.append(plain(f"  {r.summary}"))
    arms = Table(box=box.SIMPLE_HEAD, title=plain("Arms of: " + " ".join(r.a.command)[:90]))
    for col in ("arm", "what", "trials ok", "mean step ms", "steps/s", "samples/s",
                "start-up s"):
        arms.add_column(col, overflow="fold")
    for arm, a in (("A", r.a), ("B", r.b)):
        if a.command != r.a.command:
            what = " ".join(a.command)
        else:
            what = " ".join(f"{k}={v}" for k, v in a.knobs.items()) or "as written"
        add_row(arms, arm, plain(what[:60]), f"{a.trials_ok}/{r.trials_per_arm}",
                     _num(a.mean_step_ms), _num(a.steps_per_s), _num(a.samples_per_s),
                     _num(a.warmup_end_s))
    measured = (f"{r.steps} measured steps each" if r.steps_measured in (None, r.steps)
                else f"{r.steps_measured} measured steps of the {r.steps} asked"
                if r.steps_measured < r.steps else f"{r.steps} or more measured steps each")
    trials = Table(box=box.SIMPLE_HEAD, title=f"Trials (ABBA order; {r.warmup} warm-up + "
                                               f"{measured})")
    for col in ("#", "arm", "status", "mean step ms", "wall s", "note"):
        trials.add_column(col)
    for k, t in enumerate(r.trials, 1):
        note = t.error or (f"compile {t.compile['seconds']:.1f}s, "
                           f"{t.compile['graph_breaks']} graph break(s)" if t.compile else "")
        if t.outlier:
            note = "outlier, set aside" + (f"; {note}" if note else "")
        add_row(trials, str(k), f"{t.arm}{t.idx}", t.status, _num(t.mean_step_ms),
                       f"{t.wall_s:.1f}", plain(note[:70]))
    parts: list[RenderableType] = [Panel(head, title="torchtriage ab", expand=False), arms,
                                   trials]
    p = r.parity
    line = f"Loss parity: {p.status} ({p.precision}"
    if p.max_deviation is not None:
        line += f", max deviation {p.max_deviation:.2g} over {p.steps_compared} steps"
    parts.append(plain(line + f"; {p.detail})"))
    for knob, o in r.knobs.items():
        parts.append(plain(f"knob {knob}={o.value}: {'applied' if o.applied else 'NOT applied'}"
                          f" ({o.detail})"))
    if r.startup is not None:
        s = r.startup
        line = f"Start-up: candidate {s.extra_s:+.2f} s to the end of warm-up"
        if s.compile_s is not None:
            line += f" (torch.compile reported {s.compile_s:.1f} s)"
        if s.break_even_steps:
            line += f"; pays back after {s.break_even_steps} steps"
        parts.append(plain(line))
    parts.append(plain(f"ab.json and trial logs in {r.out}"
                      + (f"; stored as run {r.store_id}" if r.store_id is not None else ""),
                      style="dim"))
    return Group(*parts)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def history_table(rows) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title="torchtriage runs")
    for col in ("id", "kind", "when", "status"):
        t.add_column(col, no_wrap=True)
    t.add_column("what", ratio=1)
    t.add_column("result", ratio=1)
    for r in rows:
        when = dt.datetime.fromtimestamp(r.created).strftime("%m-%d %H:%M")
        what = r.command if isinstance(r.command, str) else " ".join(map(str, r.command))
        if r.knobs:
            what = " ".join(f"{k}={v}" for k, v in r.knobs.items()) + " | " + what
        add_row(t, str(r.id), r.kind, when, r.status, plain(_short(what, 60)),
                  plain(_short(r.summary or "", 60)))
    return t
