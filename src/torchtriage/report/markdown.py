"""Markdown for pull-request comments: the diagnosis, a comparison, an A/B (``fix`` writes its
own ``fix.md``, :func:`torchtriage.report.fix_view.fix_markdown`).

Names from traces go into code spans (:func:`code`) and other text through :func:`prose`, so
that a kernel name such as ``void f<float>``, an op named ``[/bold]`` or one with backticks
shows as written and cannot break a table or open an HTML tag.
"""

from __future__ import annotations

import re
from typing import Any

from torchtriage.diagnosis.data_quality import describe
from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.report.text import printable
from torchtriage.results.ab import ABResult
from torchtriage.results.compare import Comparison

_MARKDOWN_PUNCT = re.compile(r"[\\`*_\[\]|#~]")


def code(text: Any) -> str:
    """``text`` as a Markdown code span that is safe in a table cell: delimited by one backtick
    more than its longest run of them (a name with backticks keeps them), ``|`` escaped for
    the table, a newline a space, control characters written ``\\xNN``."""
    body = printable(str(text).replace("\n", " ")).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def prose(text: Any) -> str:
    """``text`` as Markdown that shows as written: emphasis, link, code and table characters
    backslash-escaped, ``<``, ``>`` and ``&`` as entities (no HTML tag can open)."""
    body = printable(str(text)).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_PUNCT.sub(lambda m: "\\" + m.group(), body)


def diagnosis_markdown(doc: Diagnosis | JobDiagnosis) -> str:
    lines = []
    diagnoses = doc.rank_diagnoses
    if isinstance(doc, JobDiagnosis):
        lines += [f"## torchtriage: job bottleneck **{doc.primary}**", "", prose(doc.summary),
                  ""]
    if doc.skipped:
        lines += [f"Skipped {len(doc.skipped)} file(s) that could not be read: "
                  + "; ".join(f"{code(f.path)} ({prose(f.reason)})" for f in doc.skipped), ""]
    for d in diagnoses:
        rank = f" (rank {d.trace.rank})" if d.trace.rank is not None and len(diagnoses) > 1 \
            else ""
        over = f"ms (over {len(d.trace.steps_analyzed)} steps)"
        lines += [f"### Bottleneck{rank}: **{d.primary}** (confidence {d.confidence})", "",
                  prose(d.summary), "", f"| layer | share | {over} |", "|---|---|---|"]
        lines += [f"| {layer} | {r.share:.1%} | {r.time_ms:.1f} |"
                  for layer, r in d.layers.items()]
        if d.primary_rule is not None:
            lines += ["", f"Why **{d.primary}**: {prose(d.primary_rule.reason)}"]
        if d.data_quality:
            lines += ["", f"Data quality: {prose(describe(d.data_quality))}"]
        if d.sharding is not None:
            lines += ["", f"Sharding: {prose(d.sharding.describe())}"]
        if d.prescriptions:
            lines += ["", "**What to fix first**", ""]
            for i, p in enumerate(d.prescriptions[:5], 1):
                lines += [f"{i}. {prose(p.title)} ({code(p.id)}, {prose(p.cost_label)}): "
                          f"{prose(p.reason)}", "",
                          "   ```python", *("   " + x for x in p.code.splitlines()),
                          "   ```"]
        if d.withheld:
            lines += ["", "**Withheld** (the evidence says these would not help here)", ""]
            lines += [f"- {code(w.id)} ({prose(w.layer)}): {prose(w.reason)}"
                      for w in d.withheld]
        if d.gpu is not None and d.gpu.top_kernels:
            lines += ["", "| top kernel | ms | share |", "|---|---|---|"]
            lines += [f"| {code(k.name)} | {k.time_ms:.2f} | {k.share:.1%} |"
                      for k in d.gpu.top_kernels[:5]]
        lines.append("")
    return "\n".join(lines)


def comparison_markdown(c: Comparison) -> str:
    lines = [f"## torchtriage compare: **{c.verdict}**, {c.speedup:.2f}x (95% CI "
             f"{c.ci_low:.2f}-{c.ci_high:.2f}x)", "", prose(c.summary), "",
             "| category | A ms/step | B ms/step | change |", "|---|---|---|---|"]
    lines += [f"| {d.category} | {d.a_ms:.2f} | {d.b_ms:.2f} | {d.delta_ms:+.2f} |"
              for d in c.deltas if d.a_ms or d.b_ms]
    ops = sorted([*c.ops, *c.device_ops], key=lambda o: -abs(o.delta_ms))[:8]
    if ops:
        lines += ["", "| op | A ms/step | B ms/step | change |", "|---|---|---|---|"]
        lines += [f"| {code(o.name)} | {o.a_ms:.3f} | {o.b_ms:.3f} | {o.delta_ms:+.3f} |"
                  for o in ops]
    if c.parity is not None:
        lines += ["", f"Loss parity: {c.parity.status} ({prose(c.parity.detail)})"]
    return "\n".join(lines) + "\n"


def ab_markdown(ab: ABResult) -> str:
    head = f"## torchtriage ab: **{ab.verdict}**"
    if ab.speedup is not None:
        head += f", {ab.speedup:.2f}x (95% CI {ab.ci_low:.2f}-{ab.ci_high:.2f}x)"
    lines = [head, "", prose(ab.summary), "", f"- A: {code(' '.join(ab.a.command))}",
             f"- B: {code(' '.join(ab.b.command))}"
             + (" with " + ", ".join(code(f"{k}={v.value}") for k, v in ab.knobs.items())
                if ab.knobs else ""),
             f"- Loss parity: {ab.parity.status} ({prose(ab.parity.detail)})", "",
             "| trial | status | mean step ms |", "|---|---|---|"]
    lines += [f"| {t.arm}{t.idx} | {t.status} | "
              + (f"{t.mean_step_ms:.2f}" if t.mean_step_ms is not None else "-") + " |"
              for t in ab.trials]
    return "\n".join(lines) + "\n"
