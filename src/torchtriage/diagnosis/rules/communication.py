"""The communication rule: collectives (NCCL, gloo) not hidden behind compute."""

from __future__ import annotations

import numpy as np

from torchtriage.analysis.categories import is_communication_kernel, is_host_communication
from torchtriage.analysis.collectives import is_collective
from torchtriage.analysis.sharding import Sharding
from torchtriage.analysis.utilization import union_in_steps
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID
from torchtriage.diagnosis.result import Evidence, Finding
from torchtriage.diagnosis.rules.base import Facts, Verdict, share_evidence
from torchtriage.diagnosis.rules.memory import peak_fraction_evidence
from torchtriage.diagnosis.vocabulary import Layer
from torchtriage.trace.model import HOST_KINDS, EventKind


def _communication_busy_us(f: Facts) -> float:
    """Time in the analysed steps during which any collective runs: NCCL/RCCL kernels on a GPU
    trace, gloo/c10d/nccl host ranges (background threads included) on a CPU trace."""
    ev = f.trace.events
    if f.gpu:
        rows = ev.name_mask(is_communication_kernel) & (ev.kind == EventKind.KERNEL)
    else:
        rows = ev.name_mask(is_host_communication) & np.isin(ev.kind, HOST_KINDS)
    return union_in_steps(f.trace, np.flatnonzero(rows), f.steps)


class CommunicationRule:
    """Collectives not hidden behind compute.

    Evidence: how much of the collectives' busy time is hidden, calls and bus bandwidth of the
    top collectives. Findings: large NCCL collectives (>= 16 MB per call) below
    ``slow_link_busbw`` point at the link; reduce-scatter traffic means a sharded model. At
    ``communication_significant`` of step time, for a DDP job: DDP bucket size (only when the
    gradients span ``ddp_buckets_per_step`` all-reduce calls per step or more: with one bucket
    a larger cap merges nothing; withheld otherwise), accumulation with no_sync, gradient
    compression, static graph. For a sharded job (FSDP hooks in the trace, no DDP), FSDP's own
    levers instead, cheapest first, each behind its evidence (:func:`_sharded`); DDP's are
    withheld with that reason.
    """

    layer: Layer = "communication"
    prescribes = ("ddp.bucket_cap", "ddp.grad_accumulation", "ddp.comm_hook",
                  "ddp.static_graph", "fsdp.reshard_after_forward", "fsdp.mixed_precision",
                  "fsdp.prefetch", "fsdp.wrap_granularity")
    thresholds = (th.COMMUNICATION_SIGNIFICANT, th.SLOW_LINK_BUSBW, th.DDP_BUCKETS_PER_STEP,
                  th.FSDP_REGATHER, th.FSDP_SMALL_ALL_GATHER, th.MEMORY_NEAR_CAPACITY,
                  th.CPU_FAST_BF16)

    def judge(self, f: Facts) -> Verdict:
        return _communication(f)


def _communication(f: Facts) -> Verdict:
    share = f.share("communication")
    v = Verdict(evidence=[share_evidence("communication_share", share,
                                         th.COMMUNICATION_SIGNIFICANT)])
    busy = _communication_busy_us(f)
    if busy > 0:
        exposed = f.layer_us.get("communication", 0.0)
        v.evidence.append(Evidence(metric="communication_overlapped", value=round(
            max(0.0, 1 - exposed / busy), 4), unit="share of communication time hidden "
            "behind other work"))
    for c in f.collectives[:3]:
        v.evidence.append(Evidence(metric=f"{c.op}_per_step", value=round(c.per_step, 2),
                                   unit="calls"))
        if c.busbw_gbps is not None:
            v.evidence.append(Evidence(metric=f"{c.op}_busbw", value=round(c.busbw_gbps, 2),
                                       unit="GB/s", source="nccl-tests bus bandwidth"))
    slow = [c for c in f.collectives if c.source == "nccl kernel" and c.busbw_gbps is not None
            and (c.bytes_per_call or 0) >= 16e6 and c.busbw_gbps < th.SLOW_LINK_BUSBW.value]
    for c in slow:
        v.findings.append(Finding(
            id="communication.slow_link", severity="warning", layer="communication",
            message=f"{c.op} moves {c.bytes_per_call / 1e6:,.0f} MB per call at "
                    f"{c.busbw_gbps:.1f} GB/s bus bandwidth: far below NVLink or InfiniBand. "
                    "Check NCCL's transport (NCCL_DEBUG=INFO: NVLink/P2P, IB, or sockets).",
            evidence=[Evidence(metric=f"{c.op}_busbw", value=round(c.busbw_gbps, 3),
                               unit="GB/s", threshold=th.SLOW_LINK_BUSBW.value,
                               comparison="<", fired=True,
                               source=th.SLOW_LINK_BUSBW.source)]))
    if f.sharding is not None:
        v.evidence.extend(_sharding_evidence(f.sharding))
    elif any(is_collective(c.op, "reducescatter") for c in f.collectives):
        v.findings.append(Finding(
            id="communication.sharded", severity="info", layer="communication",
            message="All-gather / reduce-scatter traffic: the model is sharded (FSDP / ZeRO). "
                    "Fewer, larger shards (coarser wrapping), reshard_after_forward=False for "
                    "small models, or hybrid sharding within a node cut this traffic; plain DDP "
                    "communicates less when the model fits on one device."))
    if share < th.COMMUNICATION_SIGNIFICANT.value:
        return v
    v.findings.append(Finding(
        id="communication.exposed", severity="warning", layer="communication",
        message=f"{share:.0%} of step time waits on collectives not hidden behind compute."))
    if f.sharding is not None and not f.names_matching(_is_ddp):
        _sharded(f, f.sharding, v)
        return v
    buckets = _bucket_evidence(f)
    if buckets is not None and buckets.fired:
        v.remedies.append((BY_ID["ddp.bucket_cap"],
                           f"{buckets.value:g} all-reduce buckets per step: fewer, larger ones"))
    else:
        why = ("no all-reduce in the analysed steps" if buckets is None else
               f"{buckets.value:g} all-reduce per step: the gradients already fit one bucket")
        v.withheld.append((BY_ID["ddp.bucket_cap"], why, [buckets] if buckets else []))
    v.remedies.append((BY_ID["ddp.grad_accumulation"], "all-reduce once every k micro-batches"))
    v.remedies.append((BY_ID["ddp.comm_hook"], "halve the bytes each all-reduce moves"))
    v.remedies.append((BY_ID["ddp.static_graph"], "better overlap with backward"))
    return v


def _is_ddp(name: str) -> bool:
    return name.startswith("DistributedDataParallel.forward")


def _sharding_evidence(s: Sharding) -> list[Evidence]:
    out = [Evidence(metric="fsdp_units", value=s.units,
                    unit=f"sharded units ({s.kind}: "
                         + ("fully_shard" if s.kind == "fsdp2" else "FullyShardedDataParallel")
                         + ")")]
    if s.all_gathers_per_step is not None:
        out.append(Evidence(metric="fsdp_all_gathers_per_step", value=s.all_gathers_per_step,
                            unit="all-gathers per step"))
    if s.all_gather_hidden is not None:
        out.append(Evidence(metric="fsdp_all_gather_hidden", value=s.all_gather_hidden,
                            unit="share of all-gather time hidden behind compute (prefetch)"))
    return out


def _sharded(f: Facts, s: Sharding, v: Verdict) -> None:
    """FSDP's levers, cheapest first:

    * ``fsdp.reshard_after_forward`` when units are gathered again for backward (all-gathers
      per unit and step at ``fsdp_regather``), unless a device's peak is at
      ``memory_near_capacity`` (keeping parameters gathered costs their memory);
    * ``fsdp.mixed_precision`` (bf16 gathers) on a GPU, or a CPU with native bf16
      (``cpu_fast_bf16``);
    * ``fsdp.prefetch`` on a GPU when less than half of the all-gather time is hidden (on a CPU,
      gloo all-gathers are synchronous: nothing to prefetch behind);
    * ``fsdp.wrap_granularity`` when all-gathers move less than ``fsdp_small_all_gather``.

    DDP's remedies are withheld: the job has no DDP buckets to tune."""
    units = max(s.units, 1)
    if s.all_gathers_per_step is not None:
        t = th.FSDP_REGATHER
        per_unit = round(s.all_gathers_per_step / units, 2)
        regather = Evidence(metric="fsdp_all_gathers_per_unit", value=per_unit,
                            unit="all-gathers per sharded unit per step", threshold=t.value,
                            comparison=">=", fired=per_unit >= t.value, source=t.source)
        peaks = [e for peak, cap, src in f.memory if cap
                 for e in (peak_fraction_evidence(peak, cap, src),) if e.fired]
        if regather.fired and not peaks:
            v.remedies.append((BY_ID["fsdp.reshard_after_forward"],
                               f"{per_unit:g} all-gathers per unit per step: each unit is "
                               "gathered again for backward"))
        else:
            why = ("a device's peak memory is near capacity" if regather.fired else
                   f"{per_unit:g} all-gathers per unit per step: units are not gathered twice")
            v.withheld.append((BY_ID["fsdp.reshard_after_forward"], why, [regather, *peaks]))
    if f.gpu:
        v.remedies.append((BY_ID["fsdp.mixed_precision"], "halve the bytes each all-gather "
                                                          "moves"))
    else:
        from torchtriage.diagnosis.rules.kernel import cpu_bf16_evidence

        bf16 = cpu_bf16_evidence(f.machine)
        if bf16.fired:
            v.remedies.append((BY_ID["fsdp.mixed_precision"], "halve the bytes each all-gather "
                                                              "moves; this CPU has native bf16"))
        else:
            v.withheld.append((BY_ID["fsdp.mixed_precision"], "bf16 math without native bf16 "
                               "instructions costs more than the halved gathers save", [bf16]))
    if f.gpu and s.all_gather_hidden is not None and s.all_gather_hidden < 0.5:
        v.remedies.append((BY_ID["fsdp.prefetch"], f"only {s.all_gather_hidden:.0%} of the "
                                                   "all-gather time is hidden behind compute"))
    gathers = [c for c in f.collectives if is_collective(c.op, "allgather") and c.bytes_per_call]
    if gathers:
        t = th.FSDP_SMALL_ALL_GATHER
        mean = sum(c.bytes_per_call * c.count for c in gathers) / sum(c.count for c in gathers)
        small = Evidence(metric="fsdp_all_gather_bytes", value=round(mean),
                         unit="bytes per all-gather call", threshold=t.value, comparison="<",
                         fired=mean < t.value, source=t.source)
        v.evidence.append(small)
        if small.fired:
            v.remedies.append((BY_ID["fsdp.wrap_granularity"],
                               f"{mean / 1e6:.1f} MB per all-gather: latency-bound calls"))
    for remedy in ("ddp.bucket_cap", "ddp.grad_accumulation", "ddp.comm_hook",
                   "ddp.static_graph"):  # last: FSDP's own withheld levers come first
        v.withheld.append((BY_ID[remedy], f"the job shards with {s.kind.upper()}, not DDP", []))


def _bucket_evidence(f: Facts) -> Evidence | None:
    """All-reduce calls per analysed step (one per DDP bucket) against
    ``ddp_buckets_per_step``, with the bytes they move per step (None without an all-reduce)."""
    rows = [c for c in f.collectives if is_collective(c.op, "allreduce")]
    if not rows:
        return None
    per_step = round(sum(c.per_step for c in rows), 2)
    moved = [c.per_step * c.bytes_per_call for c in rows if c.bytes_per_call is not None]
    unit = "all-reduce calls per step"
    if len(moved) == len(rows):
        unit += f" ({sum(moved) / 1e6:,.1f} MB of gradients per step)"
    t = th.DDP_BUCKETS_PER_STEP
    return Evidence(metric="allreduce_buckets_per_step", value=per_step, unit=unit,
                    threshold=t.value, comparison=">=", fired=per_step >= t.value,
                    source=t.source)
