"""The terminal report (rich): verdict, layer shares, step breakdown, fixes, top ops."""

from __future__ import annotations

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from torchtriage.diagnosis.data_quality import describe
from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.result import Diagnosis, SkippedFile
from torchtriage.report.text import add_row, plain, run_lines

_MAX_STEP_COLUMNS = 8
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "dim"}


def renderable(d: Diagnosis) -> RenderableType:
    if not d.breakdown.steps and d.out_of_memory is not None:  # no trace: what the error said
        parts: list[RenderableType] = [_header(d), _findings(d), _prescriptions(d)]
        if d.run is not None:
            parts.append(_run(d))
        if d.missing:
            parts.append(_missing(d))
        return Group(*parts)
    parts = [_header(d)]
    if d.data_quality:
        parts.append(_labelled("Data quality: ", describe(d.data_quality), "yellow"))
    if d.skipped:
        parts.append(_skipped(d.skipped))
    parts += [_Layers(d), _breakdown(d)]
    if d.run is not None:
        parts.append(_run(d))
    if d.findings:
        parts.append(_findings(d))
    if d.prescriptions or d.withheld:
        parts.append(_prescriptions(d))
    if d.machine is not None:
        parts.append(_machine(d))
    if d.gpu is not None:
        parts.extend(_gpu(d))
    if d.collectives:
        parts.append(_collectives(d))
    if d.sharding is not None:
        parts.append(_labelled("Sharding: ", d.sharding.describe(), "cyan"))
    parts.extend(_top_ops(d))
    if d.missing:
        parts.append(_missing(d))
    if d.memory:
        parts.append(_memory(d))
    if d.dynamic_shapes:
        parts.append(_dynamic(d))
    return Group(*parts)


def _header(d: Diagnosis) -> Panel:
    t = d.trace
    where = f"{t.mode.upper()} trace, {t.events:,} events, steps {_steps(t.steps_analyzed)}"
    if d.window is not None:  # the trace counts profiler steps; the run, training steps
        where += f" (training steps {d.window.first_step}-{d.window.last_step})"
    if not t.path and d.out_of_memory is not None:
        where = f"no trace: out of memory on step {d.out_of_memory.step}"
    if t.step_source != "profiler_step":
        where += f" (step source: {t.step_source})"
    where += _rank(t.rank, t.world_size)
    if t.devices:
        where += f", {t.devices[0]}"
    body = Text()
    body.append(f"Bottleneck: {d.primary}", style="bold")
    body.append(f"   confidence: {d.confidence}\n")
    body.append(plain(d.summary + "\n"))
    body.append(plain(where, style="dim"))
    title = f"torchtriage · {t.path}" if t.path else "torchtriage"
    return Panel(body, title=plain(title), title_align="left", box=box.ROUNDED)


def _rank(rank: int | None, world_size: int | None) -> str:
    """The header's rank: "rank 3/8" in a multi-process job, "rank 3" when the trace names its
    rank but not the world size, nothing for a single process (world size 1, or rank 0 from a
    file name such as `run`'s rank0_*.pt.trace.json with no world size): never "None"."""
    if rank is None or world_size == 1 or (world_size is None and rank == 0):
        return ""
    return f", rank {rank}" + (f"/{world_size}" if world_size is not None else "")


def _steps(numbers: list[int]) -> str:
    if not numbers:
        return "-"
    if numbers == list(range(numbers[0], numbers[-1] + 1)) and len(numbers) > 1:
        return f"#{numbers[0]}-#{numbers[-1]}"
    return ", ".join(f"#{n}" for n in numbers)


def _bar(share: float, width: int = 20) -> str:
    filled = round(max(0.0, min(share, 1.0)) * width)
    return "█" * filled + "·" * (width - filled)


class _Layers:
    """The layer shares, their evidence and the rule that picked the primary layer.

    The evidence goes in its own column where its longest item fits beside the shares, else
    (80 columns) under the table, a layer a line; either way wrapped between items, never
    inside one, so that no item is cut short."""

    def __init__(self, d: Diagnosis) -> None:
        self.d = d
        self.evidence = {name: [_evidence_item(e) for e in layer.evidence[:3]]
                         for name, layer in d.layers.items()}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shares = self._table()
        longest = max((len(item) for items in self.evidence.values() for item in items),
                      default=0)
        # the evidence column's room: the line less the shares' columns and its own padding
        room = options.max_width - Measurement.get(console, options, shares).maximum - 3
        if longest <= room:
            yield self._table(room)
        else:
            yield shares
            yield self._under(options.max_width)
        rule = self.d.primary_rule
        if rule is not None:
            line = plain(f"Why {self.d.primary}: ", style="bold")
            line.append(plain(rule.reason))
            yield line
        yield plain("")

    def _table(self, room: int | None = None) -> Table:
        """The shares, with the evidence column when ``room`` (its width) is given."""
        d = self.d
        steps = len(d.trace.steps_analyzed)
        table = Table(title=f"Where the step time goes, by layer (ms over {steps} "
                            f"step{'s' if steps != 1 else ''})",
                      box=box.SIMPLE_HEAD, title_justify="left")
        table.add_column("layer")
        table.add_column("share", justify="right")
        table.add_column("")
        table.add_column("ms", justify="right")
        if room is not None:
            table.add_column("evidence", overflow="fold")
        for name, layer in d.layers.items():
            share = f"{layer.share:.1%}" if name != "memory" else "-"
            cells = [name, share, _bar(layer.share), f"{layer.time_ms:,.1f}"]
            if room is not None:
                cells.append(_packed(self.evidence[name], room))
            add_row(table, *cells, style="bold" if name == d.primary else None)
        return table

    def _under(self, width: int) -> Padding:
        """Each layer's evidence under the table, a layer a line."""
        named = [(name, items) for name, items in self.evidence.items() if items]
        label = max((len(name) for name, _ in named), default=0)
        grid = Table.grid(padding=(0, 2))
        grid.add_column()
        grid.add_column(overflow="fold")
        grid.add_row(plain("evidence", style="italic"), "")
        for name, items in named:
            add_row(grid, name, _packed(items, width - label - 4),
                    style="bold" if name == self.d.primary else None)
        return Padding(grid, (0, 0, 1, 2))


def _packed(items: list[str], room: int) -> str:
    """``items`` joined by "; ", a line break instead where the next one would not fit."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= room:
            lines[-1] += "; " + item
        else:
            lines.append(item)
    return "\n".join(lines)


def _evidence_item(e) -> str:
    """One evidence item of the layer table: the value, and the threshold it reached."""
    return f"{e.metric}={e.value:g}" + (f" ({e.comparison} {e.threshold:g})"
                                        if e.fired and e.threshold is not None else "")


def _breakdown(d: Diagnosis) -> Table:
    b = d.breakdown
    steps = b.steps[:_MAX_STEP_COLUMNS]
    table = Table(title=f"Step breakdown ({b.mode} categories, exposed ms, priority order)",
                  box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("category")
    for s in steps:
        table.add_column(f"#{s.step}", justify="right")
    table.add_column("total", justify="right")
    table.add_column("share", justify="right")
    for cat in b.categories:
        add_row(table, cat, *[f"{s.exposed_ms[cat]:.1f}" for s in steps],
                      f"{b.exposed_ms[cat]:.1f}", f"{b.share[cat]:.1%}")
    add_row(table, "step wall", *[f"{s.wall_ms:.1f}" for s in steps], f"{b.wall_ms:.1f}", "100%",
                  style="bold")
    return table


def _findings(d: Diagnosis) -> Table:
    table = Table(title="Findings", box=box.SIMPLE_HEAD, title_justify="left", show_header=False)
    table.add_column("severity")
    table.add_column("message")
    for f in d.findings:
        add_row(table, plain(f.severity, style=_SEVERITY_STYLE.get(f.severity)), f.message)
    return table


def _prescriptions(d: Diagnosis) -> Group:
    lines: list[RenderableType] = [
        plain("What to fix first (primary layer first, cheapest first within a layer)",
             style="italic")
    ]
    for i, p in enumerate(d.prescriptions, 1):
        head = plain(f"{i:>3}. ")
        head.append(p.id, style="bold" if i == 1 else "bold dim" if p.layer != d.primary else "")
        head.append(f"  [{p.layer} · cost {p.cost}: {p.cost_label}]  ", style="dim")
        head.append(plain(p.title))
        lines.append(head)
        for code_line in p.code.splitlines():
            lines.append(plain("       " + code_line, style="cyan"))
        lines.append(plain(f"       why: {p.reason}. gain: {p.expected_gain}. "
                          f"verify: {p.verify}.", style="dim"))
    if d.withheld:
        lines.append(plain("Withheld: the evidence says these would not help here",
                           style="italic"))
    for w in d.withheld:
        head = plain("     - ")
        head.append(w.id, style="bold dim")
        head.append(f"  [{w.layer}]  ", style="dim")
        head.append(plain(w.reason))
        gates = "; ".join(_evidence_text(e) for e in w.evidence)
        if gates:
            head.append(plain(f" ({gates})", style="dim"))
        lines.append(head)
    lines.append(plain(""))
    return Group(*lines)


def _evidence_text(e) -> str:
    text = f"{e.metric}={e.value:g}"
    if e.threshold is not None and e.comparison:
        held = e.fired is not False
        op = e.comparison if held else {">=": "<", "<": ">=", ">": "<=", "<=": ">"}.get(
            e.comparison, "vs")
        text += f" {op} {e.threshold:g}"
    return text


def _run(d: Diagnosis) -> Text:
    """The whole run's step timeline in a few lines."""
    text = plain("Whole run: ", style="bold")
    text.append(plain("\n  ".join(run_lines(d.run)) + "\n"))
    return text


def _machine(d: Diagnosis) -> Text:
    """What the run sampled, and what the data-loading and kernel rules judged from it."""
    m = d.machine
    assert m is not None
    text = plain("Machine ", style="bold")
    cores = m.job_cores
    if not m.samples:  # profile(): the CPU's facts, nothing sampled
        bf16 = ("not recorded" if m.cpu_bf16 is None else ", ".join(m.cpu_bf16) or "none")
        limit = m.cores_available_source or "all cores"
        text.append(plain(f"(not sampled): {cores:g} cores ({limit}); "
                          f"CPU {m.cpu_capability or '?'}, native bf16: {bf16}\n"))
        return text
    when = ("during the profiled and checked steps" if m.samples_scope == "window"
            else "while the script ran")
    text.append(plain(f"(sampled {when}, {m.samples} samples): ", style="dim"))
    if m.job_cpu_cores_mean is not None:
        text.append(plain(
            f"the job's {m.job_processes or 1} process(es) used {m.job_cpu_cores_mean:.2f} of "
            f"the {cores:g} cores it may use ({m.cores_available_source or 'all cores'}), "
            f"{m.job_cpu_cores_mean / cores:.0%}; "))
    text.append(plain(f"all {m.cores} cores of the machine {m.cpu_busy_mean:.0%} busy (other "
                      "processes included)"))
    if m.child_processes:
        text.append(plain(f"; child processes (DataLoader workers, ...) {m.child_processes}, "
                          f"{m.children_cpu_cores_mean:.2f} cores"))
    text.append(plain(f"; peak RSS {_gib(m.rss_max_bytes)}"))
    if m.cpu_capability or m.cpu_bf16 is not None:
        bf16 = ("not recorded" if m.cpu_bf16 is None else ", ".join(m.cpu_bf16) or "none")
        text.append(plain(f"; CPU {m.cpu_capability or '?'}, native bf16: {bf16}"))
    if m.gpu_util_mean is not None:
        text.append(plain(f"; GPU {m.gpu_util_mean:.0%} busy"))
    text.append("\n")
    return text


def _top_ops(d: Diagnosis) -> list[Table]:
    out = []
    host = d.top_ops.get("host", [])
    if host:
        t = Table(title="Top host ops by self time", box=box.SIMPLE_HEAD, title_justify="left")
        for col in ("name", "calls", "self ms", "self %", "total ms"):
            t.add_column(col, justify="left" if col == "name" else "right", overflow="fold")
        for r in host:
            add_row(t, r.name, str(r.count), f"{r.self_ms:.2f}", f"{r.share:.1%}",
                      f"{r.total_ms:.2f}")
        out.append(t)
    device = d.top_ops.get("device", []) if d.gpu is None else []
    if device:
        t = Table(title="Top device kernels by time", box=box.SIMPLE_HEAD, title_justify="left")
        for col in ("name", "calls", "ms", "% of device time"):
            t.add_column(col, justify="left" if col == "name" else "right", overflow="fold")
        for r in device:
            add_row(t, r.name[:120], str(r.count), f"{r.total_ms:.2f}", f"{r.share:.1%}")
        out.append(t)
    return out


def _gpu(d: Diagnosis) -> list[RenderableType]:
    g = d.gpu
    assert g is not None
    lines = Text()
    lines.append("GPU utilization ", style="bold")
    lines.append(f"{g.utilization:.1%} of step time busy ({g.busy_ms:,.1f} ms)")
    for s in g.streams[:4]:
        lines.append(plain(f"; stream {s.stream}: {s.utilization:.1%}"))
    lines.append("\n")
    t = g.temporal
    if t is not None:
        lines.append(f"Temporal (HTA): idle {t.idle_pct:.1f}%, compute {t.compute_pct:.1f}%, "
                     f"non-compute {t.non_compute_pct:.1f}% of {t.span_ms:,.1f} ms")
    if g.comm_compute_overlap_pct is not None:
        lines.append(f"; comm-compute overlap {g.comm_compute_overlap_pct:.1f}%")
    lines.append("\n")
    i = g.idle
    lines.append(f"Idle between kernels (summed over streams): host wait {i.host_wait_ms:,.1f} ms, "
                 f"kernel wait {i.kernel_wait_ms:,.1f} ms, other {i.other_ms:,.1f} ms\n")
    la = g.launches
    lines.append(f"Launches: {la.kernels_per_step:,.0f} kernels/step, "
                 f"{la.short_kernel_share:.0%} shorter than {la.short_kernel_us:.0f} µs")
    if la.launch_cost_us_median is not None:
        lines.append(f", launch cost median {la.launch_cost_us_median:.1f} µs, launch-to-start "
                     f"median {la.launch_delay_us_median:.1f} µs")
    lines.append("\n")
    tr = g.transfers
    lines.append(f"Copies: H2D {tr.h2d.count} ({tr.h2d.pageable} pageable, "
                 f"{tr.h2d.bytes / 2**20:,.1f} MiB), D2H {tr.d2h.count} ({tr.d2h.pageable} "
                 f"pageable), D2D {tr.d2d.count}; syncs/step: "
                 + (", ".join(f"{src.per_step:g} in {src.op or 'no op'} ({src.kind})"
                              for src in tr.sync_sources) or "none"))
    classes = Table(title="Device time by kernel class", box=box.SIMPLE_HEAD,
                    title_justify="left")
    for col in ("class", "count", "ms", "share", "tensor-core ms", "no tensor core ms"):
        classes.add_column(col, justify="left" if col == "class" else "right")
    for c in g.kernel_classes:
        add_row(classes, c.cls, str(c.count), f"{c.time_ms:,.2f}", f"{c.share:.1%}",
                        f"{c.tensor_core_ms:,.2f}", f"{c.no_tensor_core_ms:,.2f}")
    kernels = Table(title="Top kernels by time", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("kernel", "class", "TC", "calls", "ms", "share", "launched by"):
        kernels.add_column(col, justify="right" if col in ("calls", "ms", "share") else "left",
                           overflow="fold")
    for k in g.top_kernels:
        tc = "-" if k.tensor_cores is None else ("yes" if k.tensor_cores else "no")
        add_row(kernels, k.name[:100], k.cls, tc, str(k.count), f"{k.time_ms:,.2f}",
                        f"{k.share:.1%}", k.launched_by or "-")
    return [Panel(lines, title="GPU", title_align="left", box=box.ROUNDED), classes, kernels]


def _collectives(d: Diagnosis) -> Table:
    t = Table(title=f"Collectives ({d.collectives[0].source}; bandwidths in GB/s)",
              box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("op", "calls", "per step", "ms", "mean ms", "MB/call", "algbw", "busbw"):
        t.add_column(col, justify="left" if col == "op" else "right",
                     min_width=max(len(c.op) for c in d.collectives) if col == "op" else None)
    for c in d.collectives:
        add_row(t, c.op, str(c.count), f"{c.per_step:g}", f"{c.time_ms:,.2f}", f"{c.mean_ms:.3f}",
                  f"{c.bytes_per_call / 1e6:,.1f}" if c.bytes_per_call else "-",
                  f"{c.algbw_gbps:,.2f}" if c.algbw_gbps is not None else "-",
                  f"{c.busbw_gbps:,.2f}" if c.busbw_gbps is not None else "-")
    return t


def _missing(d: Diagnosis) -> Text:
    text = plain("Not in this trace: ", style="bold")
    text.append(plain("; ".join(d.missing) + "\n", style="dim"))
    return text


def _labelled(label: str, body: str, style: str) -> Text:
    text = plain(label, style=f"bold {style}")
    text.append(plain(body + "\n", style=style))
    return text


def _skipped(files: list[SkippedFile]) -> Text:
    """The files at the path that could not be diagnosed, each with why."""
    return _labelled(f"Skipped {len(files)} file(s) that could not be read: ",
                     "; ".join(f"{f.path} ({f.reason})" for f in files), "yellow")


def _memory(d: Diagnosis) -> Table:
    unseen = "; ".join(note for m in d.memory if (note := m.unseen_frees_note))
    t = Table(title="Memory peaks", box=box.SIMPLE_HEAD, title_justify="left",
              caption=unseen or None, caption_justify="left")
    for col in ("device", "peak allocated", "peak reserved", "capacity", "peak / capacity"):
        t.add_column(col, justify="left" if col == "device" else "right")
    for m in d.memory:
        add_row(t,
            m.device, _gib(m.peak_allocated_bytes), _gib(m.peak_reserved_bytes),
            f"{_gib(m.capacity_bytes)} ({m.capacity_source})" if m.capacity_bytes else "unknown",
            f"{m.peak_fraction:.0%}" if m.peak_fraction is not None else "-",
        )
    return t


def _gib(n: int | None) -> str:
    if not n:
        return "0"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _dynamic(d: Diagnosis) -> Table:
    t = Table(title="Ops with input shapes that change between steps", box=box.SIMPLE_HEAD,
              title_justify="left")
    for col in ("op", "steps", "distinct per-step shape sets", "examples"):
        t.add_column(col, overflow="fold")
    for s in d.dynamic_shapes:
        add_row(t, s.op, str(s.steps_seen), str(s.distinct_signatures), " | ".join(s.examples))
    return t


def job_renderable(job: JobDiagnosis) -> RenderableType:
    """The job view: one verdict, ranks side by side, the straggler."""
    head = Text()
    head.append(f"Job bottleneck: {job.primary}", style="bold")
    head.append(f"   confidence: {job.confidence}   ranks: {job.world_size}\n")
    head.append(plain(job.summary))
    table = Table(title="Ranks side by side (share of step time)", box=box.SIMPLE_HEAD,
                  title_justify="left")
    layers = list(job.ranks[0].shares) if job.ranks else []
    for col in ("rank", "primary", "median step ms", *layers):
        table.add_column(col, justify="left" if col in ("rank", "primary") else "right")
    straggler = job.straggler.rank if job.straggler else None
    for r in job.ranks:
        add_row(table, str(r.rank), r.primary, f"{r.median_step_ms:.1f}",
                      *[f"{r.shares[x]:.1%}" for x in layers],
                      style="bold red" if r.rank == straggler else None)
    parts: list[RenderableType] = [Panel(head, title="torchtriage · job", title_align="left",
                                         box=box.ROUNDED)]
    if job.skipped:
        parts.append(_skipped(job.skipped))
    parts.append(table)
    for row, d in zip(job.ranks, job.diagnoses, strict=False):  # rows number unranked traces
        if d.data_quality:
            parts.append(_labelled(f"Data quality, rank {row.rank}: ",
                                   describe(d.data_quality), "yellow"))
    for f in job.findings:
        parts.append(plain(f"{f.severity}: {f.message}", style=_SEVERITY_STYLE.get(f.severity)))
    return Group(*parts)
