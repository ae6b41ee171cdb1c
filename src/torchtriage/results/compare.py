"""The comparison document (``compare --json``, schema ``torchtriage.compare/1``): two profiles,
the speedup with its interval, and where the time went. Produced by
:mod:`torchtriage.verify.compare`."""

from __future__ import annotations

from typing import Literal

import msgspec

from torchtriage.diagnosis.result import SkippedFile
from torchtriage.document import JsonDocument
from torchtriage.results.ab import Parity, SpeedVerdict
from torchtriage.version import __version__

SCHEMA = "torchtriage.compare/1"


class Side(msgspec.Struct, kw_only=True):
    path: str
    traces: int
    mode: Literal["gpu", "cpu"]
    steps: int  # analysed steps (per rank)
    median_step_ms: float
    primary: str  # the side's bottleneck layer
    step_ms: list[float]  # every analysed step (the slowest rank at each)
    outlier_steps: list[int] = []  # step numbers set aside from median_step_ms and the interval
    skipped: list[SkippedFile] = []  # files at the path that could not be read


class CategoryDelta(msgspec.Struct, kw_only=True):
    category: str
    layer: str
    a_ms: float  # mean exposed time per step
    b_ms: float
    delta_ms: float  # b - a: negative is time saved


class OpDelta(msgspec.Struct, kw_only=True):
    name: str
    a_count: float  # calls per step
    b_count: float
    a_ms: float  # time per step (host ops: self time; device ops: kernel time)
    b_ms: float
    delta_ms: float


class Comparison(JsonDocument, msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    tool_version: str = __version__
    summary: str
    a: Side
    b: Side
    speedup: float  # A's median step time over B's: above 1, B is faster
    ci_low: float
    ci_high: float
    confidence: float
    min_effect: float
    verdict: SpeedVerdict  # B relative to A
    deltas: list[CategoryDelta]  # sorted by |delta_ms|
    layer_deltas: dict[str, float]  # delta per step by layer, ms
    ops: list[OpDelta] = []  # host ops, by |delta_ms|
    device_ops: list[OpDelta] = []  # kernels, copies, memsets
    parity: Parity | None = None  # when both sides are run directories with recorded losses
    store_id: int | None = None

    def headline(self) -> str:
        """One line for ``torchtriage history``."""
        return (f"{self.verdict} {self.speedup:.2f}x [{self.ci_low:.2f}-{self.ci_high:.2f}]; "
                f"median step {self.a.median_step_ms:.1f} -> {self.b.median_step_ms:.1f} ms")
