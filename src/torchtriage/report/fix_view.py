"""Views of a ``fix`` run: the terminal panel and the Markdown report (``fix.md``)."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table

from torchtriage.report.markdown import code, prose
from torchtriage.report.text import add_row, plain
from torchtriage.results.fix import FixResult, FixStep, Profiled

_STYLE = {"kept": "bold green", "dropped": "yellow", "failed": "red", "skipped": "dim",
          "not_injectable": "dim", "fits": "green", "does_not_fit": "yellow"}


def _tried(step: FixStep) -> str:
    # a knob other than the prescription's own (optimizer.fused's foreach fallback) is named
    named = f"{step.knob}=" if step.knob and step.knob != step.prescription else ""
    return "; ".join(f"{named}{a.value!r}: {a.note}" for a in step.attempts)


def _detail(step: FixStep) -> str:
    """What a step's row says: the values tried with their results, or why nothing was."""
    if not step.attempts:
        return step.why
    head = f"kept {step.kept_value!r}. " if step.result == "kept" else ""
    return head + _tried(step)


def fix_renderable(r: FixResult) -> RenderableType:
    head = plain(r.summary)
    rounds = Table(box=box.SIMPLE_HEAD, title="Profile rounds")
    for col in ("round", "knobs", "bottleneck", "median step ms", "trials ms", "peak memory"):
        rounds.add_column(col)
    for p in r.rounds:
        knobs = " ".join(f"{k}={v}" for k, v in p.knobs.items()) or "as written"
        peak = "-" if p.peak_fraction is None else f"{p.peak_fraction:.0%}"
        add_row(rounds, str(p.round), plain(knobs), f"{p.primary} ({p.confidence})",
                       f"{p.median_step_ms:.1f}", _trials_ms(p), peak)
    steps = Table(box=box.SIMPLE_HEAD, title="What was tried (cost order, per bottleneck)")
    for col in ("round", "layer", "prescription", "result", "why / values tried"):
        steps.add_column(col, overflow="fold")
    for s in r.steps:
        detail = _detail(s)
        add_row(steps, str(s.round), s.layer, s.prescription,
                      plain(s.result, style=_STYLE.get(s.result, "")), plain(detail))
    parts: list[RenderableType] = [Panel(head, title="torchtriage fix", expand=False),
                                   rounds, steps]
    if r.patch_file:
        parts.append(plain(f"patch: {r.patch_file} (git apply / patch -p1; changes "
                          f"{', '.join(r.patch_files)})"))
    for line in r.instructions:
        parts.append(plain(f"by hand: {line}"))
    parts.append(plain(f"{r.trials_run} trials in {r.elapsed_s:.0f} s of a {r.budget_s:.0f} s "
                      f"budget; fix.json, fix.md and every A/B in {r.out}", style="dim"))
    return Group(*parts)


def _setting(kept: dict) -> str:
    return f"{kept['knob']}={kept['value']!r}"


def _trials_ms(p: Profiled) -> str:
    """The round's first baseline trials, and whether its profile window agreed with them."""
    if p.trials_step_ms is None:
        return "-"
    return f"{p.trials_step_ms:.1f}" + ("" if p.window_agrees else " (window disagrees)")


def fix_markdown(r: FixResult, diff: str = "") -> str:
    """The readable report, for a pull request or a notebook."""
    lines = [f"# torchtriage fix: {code(' '.join(r.command))}", "", prose(r.summary), ""]
    if r.speedup is not None:
        lines += [f"- Final configuration vs the original: **{r.speedup:.2f}x** (95% CI "
                  f"{r.ci_low:.2f}-{r.ci_high:.2f}x, {r.verdict}); throughput "
                  f"{r.original_steps_per_s} -> {r.final_steps_per_s} steps/s.", ""]
    lines += ["## Kept", ""]
    lines += [f"1. {code(_setting(k))}" for k in r.kept] or ["Nothing."]
    lines += ["", "## Profile rounds", "",
              "| round | knobs | bottleneck | median step ms | its trials, mean step ms |",
              "|---|---|---|---|---|"]
    for p in r.rounds:
        knobs = ", ".join(code(f"{k}={v}") for k, v in p.knobs.items()) or "as written"
        lines.append(f"| {p.round} | {knobs} | {p.primary} ({p.confidence}) | "
                     f"{p.median_step_ms:.1f} | {_trials_ms(p)} |")
    lines += ["", "## What was tried", "", "| round | layer | prescription | result | why |",
              "|---|---|---|---|---|"]
    for s in r.steps:
        why = _detail(s)
        lines.append(f"| {s.round} | {s.layer} | {code(s.prescription)} | {s.result} | "
                     f"{prose(why)} |")
    if diff:
        lines += ["", "## Patch", "", "```diff", diff.rstrip(), "```"]
    if r.instructions:
        lines += ["", "## By hand", ""] + [f"- {code(x)}" for x in r.instructions]
    lines += ["", f"Stopped because {prose(r.stopped_because)}. {r.trials_run} trials in "
              f"{r.elapsed_s:.0f} s (budget {r.budget_s:.0f} s).", ""]
    return "\n".join(lines)
