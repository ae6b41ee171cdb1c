"""``torchtriage compare A B``: what changed between two profiles, and whether it is real.

Each side is a trace file, a directory of rank traces, or a run directory. Step times come from
the analysed steps of the traces (for several ranks, the slowest rank at each step, since a
synchronous job moves at its pace); the speedup is A's median step time over B's with a
bootstrap interval over steps. Per-category deltas say where the time went: the mean exposed
time per step of each breakdown category on each side (categories average over ranks).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import numpy as np

from torchtriage.diagnosis.result import Diagnosis
from torchtriage.diagnosis.traces import DiagnoseOptions, diagnose_traces
from torchtriage.diagnosis.vocabulary import CPU_CATEGORY_LAYER, GPU_CATEGORY_LAYER
from torchtriage.errors import TraceError
from torchtriage.results.ab import Parity
from torchtriage.results.compare import CategoryDelta, Comparison, OpDelta, Side
from torchtriage.results.run import RunRecord, decode_record
from torchtriage.verify import policy
from torchtriage.verify.parity import check_parity
from torchtriage.verify.stats import outliers, speedup_interval, verdict

OP_ROWS = 15  # op and kernel delta rows kept in the document


def compare(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    min_effect: float = policy.MIN_EFFECT.value,
    device_memory: int | None = None,
    strict: bool = False,
) -> Comparison:
    """Compare profile ``b`` against baseline ``a`` (see the module docstring). Files of a
    side that cannot be read are listed in its ``skipped`` (an error with ``strict``).

    Raises:
        TraceError: either side has no readable trace, or has no analysed steps.
    """
    options = DiagnoseOptions(device_memory=device_memory, top=1_000_000, strict=strict)
    doc_a, doc_b = diagnose_traces(a, options), diagnose_traces(b, options)
    comparison = compare_diagnoses(doc_a.rank_diagnoses, doc_b.rank_diagnoses, str(a), str(b),
                                   min_effect=min_effect, parity=_parity(Path(a), Path(b)))
    comparison.a.skipped, comparison.b.skipped = doc_a.skipped, doc_b.skipped
    return comparison


def compare_diagnoses(
    a: list[Diagnosis],
    b: list[Diagnosis],
    a_path: str = "A",
    b_path: str = "B",
    *,
    min_effect: float = policy.MIN_EFFECT.value,
    parity: Parity | None = None,
) -> Comparison:
    """Compare two sides given as their (per-rank) diagnoses, made with a large ``top``."""
    for path, side in ((a_path, a), (b_path, b)):
        if not any(d.breakdown.steps for d in side):
            raise TraceError(f"{path}: no analysed training step to compare")
    sa, sb = _side(a, a_path), _side(b, b_path)
    s = speedup_interval([_kept(sa)], [_kept(sb)])
    deltas = _category_deltas(a, b)
    layers: dict[str, float] = {}
    for d in deltas:
        layers[d.layer] = round(layers.get(d.layer, 0.0) + d.delta_ms, 3)
    result = verdict(s, min_effect)
    comparison = Comparison(
        summary="",
        a=sa, b=sb, speedup=round(s.speedup, 4), ci_low=round(s.ci_low, 4),
        ci_high=round(s.ci_high, 4), confidence=s.confidence, min_effect=min_effect,
        verdict=result, deltas=deltas, layer_deltas=layers,
        ops=_op_deltas(a, b, "host"), device_ops=_op_deltas(a, b, "device"), parity=parity,
    )
    comparison.summary = _summary(comparison)
    return comparison


def _side(diagnoses: list[Diagnosis], path: str) -> Side:
    ranks = [d for d in diagnoses if d.breakdown.steps]
    per_rank = [[s.wall_ms for s in d.breakdown.steps] for d in ranks]
    n = min(len(r) for r in per_rank)
    step_ms = np.max(np.array([r[:n] for r in per_rank]), axis=0)
    odd = outliers(step_ms)
    numbers = [s.step for s in ranks[0].breakdown.steps[:n]]
    primaries = [d.primary for d in diagnoses]
    return Side(path=path, traces=len(diagnoses), mode=diagnoses[0].breakdown.mode, steps=n,
                median_step_ms=round(float(np.median(step_ms[~odd])), 3),
                primary=max(set(primaries), key=primaries.count),
                step_ms=[round(float(x), 3) for x in step_ms],
                outlier_steps=[numbers[i] for i in np.flatnonzero(odd)])


def _kept(side: Side) -> list[float]:
    """The side's step times without its outlier steps."""
    odd = outliers(side.step_ms)
    return [t for t, o in zip(side.step_ms, odd, strict=True) if not o]


def _per_step(diagnoses: list[Diagnosis]) -> dict[str, float]:
    """Mean exposed ms per step per category, averaged over ranks."""
    out: dict[str, float] = {}
    ranks = [d for d in diagnoses if d.breakdown.steps]
    for d in ranks:
        n = len(d.breakdown.steps)
        for category, ms in d.breakdown.exposed_ms.items():
            out[category] = out.get(category, 0.0) + ms / n / len(ranks)
    return out


def _category_deltas(a: list[Diagnosis], b: list[Diagnosis]) -> list[CategoryDelta]:
    pa, pb = _per_step(a), _per_step(b)
    gpu = "gpu" in (a[0].breakdown.mode, b[0].breakdown.mode)
    layer_of = {**CPU_CATEGORY_LAYER, **GPU_CATEGORY_LAYER} if gpu else CPU_CATEGORY_LAYER
    rows = [CategoryDelta(category=c, layer=layer_of.get(c, "host"),
                          a_ms=round(pa.get(c, 0.0), 3), b_ms=round(pb.get(c, 0.0), 3),
                          delta_ms=round(pb.get(c, 0.0) - pa.get(c, 0.0), 3))
            for c in dict.fromkeys([*pa, *pb])]
    return sorted(rows, key=lambda r: -abs(r.delta_ms))


def _op_deltas(a: list[Diagnosis], b: list[Diagnosis], table: str) -> list[OpDelta]:
    def per_step(diagnoses: list[Diagnosis]) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        ranks = [d for d in diagnoses if d.breakdown.steps]
        for d in ranks:
            k = len(d.breakdown.steps) * len(ranks)
            for row in d.top_ops.get(table, []):
                ms = row.self_ms if table == "host" else row.total_ms
                count, time_ms = out.get(row.name, (0.0, 0.0))
                out[row.name] = (count + row.count / k, time_ms + ms / k)
        return out

    pa, pb = per_step(a), per_step(b)
    rows = []
    for name in dict.fromkeys([*pa, *pb]):
        (ca, ta), (cb, tb) = pa.get(name, (0.0, 0.0)), pb.get(name, (0.0, 0.0))
        rows.append(OpDelta(name=name, a_count=round(ca, 2), b_count=round(cb, 2),
                            a_ms=round(ta, 3), b_ms=round(tb, 3), delta_ms=round(tb - ta, 3)))
    rows.sort(key=lambda r: -abs(r.delta_ms))
    return rows[:OP_ROWS]


def _summary(c: Comparison) -> str:
    a_ms, b_ms = c.a.median_step_ms, c.b.median_step_ms
    interval = f"{c.confidence:.0%} CI {c.ci_low:.2f}-{c.ci_high:.2f}x"
    if c.verdict == "faster":
        head = f"B is faster: {c.speedup:.2f}x ({interval})"
    elif c.verdict == "slower":
        head = f"B is slower: {1 / c.speedup:.2f}x the step time ({interval})"
    else:
        head = (f"no significant change: {c.speedup:.2f}x ({interval}, within "
                f"{c.min_effect:.0%} or not significant)")
    text = f"{head}; median step {a_ms:.1f} -> {b_ms:.1f} ms."
    for label, side in (("A", c.a), ("B", c.b)):
        if side.outlier_steps:
            slow = ", ".join(f"#{n}" for n in side.outlier_steps)
            text += f" {label}'s step {slow} set aside as outlier(s)."
    total = sum(d.delta_ms for d in c.deltas)  # the change of the mean step time
    top = c.deltas[0] if c.deltas else None
    if top is not None and abs(top.delta_ms) > 0:
        name = top.category if top.category == top.layer else f"{top.category} ({top.layer})"
        rest = total - top.delta_ms
        text += (f" Largest change: {name} {top.delta_ms:+.1f} ms per step (mean step "
                 f"{total:+.1f} ms; everything else {rest:+.1f} ms).")
    if c.parity is not None and c.parity.status == "fail":
        text += f" Losses differ beyond tolerance ({c.parity.detail})."
    return text


def _parity(a: Path, b: Path) -> Parity | None:
    """Loss parity when both sides are run directories whose records hold losses."""
    la, lb = _run_losses(a), _run_losses(b)
    if la is None or lb is None:
        return None
    knobs_b = _run_knobs(b)
    return check_parity([la], [lb], knobs_b)


def _run_losses(path: Path) -> list[float] | None:
    record = _rank0_record(path)
    return (record.loss_values if record else None) or None


def _run_knobs(path: Path) -> dict:
    record = _rank0_record(path)
    return {k: v.value for k, v in record.knobs.items()} if record else {}


def _rank0_record(path: Path) -> RunRecord | None:
    if not path.is_dir():
        return None
    for name in ("run.rank0.json", "run.json"):
        if (path / name).is_file():
            try:
                return decode_record((path / name).read_bytes())
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                return None
    return None
