"""The kernel rule: the compute itself (GPU kernels, or CPU ops on a CPU-only job)."""

from __future__ import annotations

import re

import numpy as np

from torchtriage.analysis.intervals import unique
from torchtriage.analysis.kernels import KERNEL_CLASSES
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID
from torchtriage.diagnosis.result import Evidence, Finding, MachineInfo
from torchtriage.diagnosis.rules.base import Facts, Verdict, share_evidence
from torchtriage.diagnosis.rules.run import gate_compiled
from torchtriage.diagnosis.vocabulary import Layer


class KernelRule:
    """Precision first (when matrix kernels run fp32 without tensor cores), then fusion.

    GPU traces: the share of matrix-kernel time in fp32 without tensor cores
    (``fp32_matmul_share``) and the elementwise/reduction share of kernel time
    (``elementwise_share``, with ``unfused_chain`` pointwise kernels per matrix kernel) are
    findings. Remedies, listed whether or not the layer is significant (the diagnose pass
    takes a layer's remedies only when it is primary or reaches its significance): TF32 on
    Ampere+ when fp32 dominates or is unknown, bf16 autocast unless matrix kernels already run
    16-bit on tensor cores, then torch.compile (default, then max-autotune), then a custom
    kernel. bf16 autocast is withheld for float64 work (``float64_share``) and, on a CPU,
    without native bf16 instructions (``cpu_fast_bf16``); torch.compile's default mode for a run
    that compiles already (dynamo compiled frames over the run).
    """

    layer: Layer = "kernel"
    prescribes = ("matmul.tf32", "amp.bf16", "compile.default", "compile.max_autotune",
                  "kernel.custom")
    thresholds = (th.KERNEL_SIGNIFICANT, th.FP32_MATMUL_SHARE, th.ELEMENTWISE_SHARE,
                  th.UNFUSED_CHAIN, th.FLOAT64_SHARE, th.CPU_FAST_BF16)

    def judge(self, f: Facts) -> Verdict:
        return _kernel(f)


def _kernel(f: Facts) -> Verdict:
    share = f.share("kernel")
    v = Verdict(evidence=[share_evidence("kernel_share", share, th.KERNEL_SIGNIFICANT)])
    devices = f.trace.meta.devices
    major = max((d.compute_major for d in devices), default=0)
    fp32_share, tc_share, elementwise, unfused = None, None, None, False
    if f.device is not None:
        matrix = f.device.classes
        mat_time = sum(c.time_us for c in matrix if c.cls in _MATRIX_CLASSES)
        no_tc = sum(c.no_tensor_core_us for c in matrix)
        tc = sum(c.tensor_core_us for c in matrix)
        if mat_time > 0:
            fp32_share, tc_share = no_tc / mat_time, tc / mat_time
            v.evidence.append(share_evidence("fp32_matmul_share", fp32_share,
                                             th.FP32_MATMUL_SHARE))
            v.evidence.append(Evidence(metric="tensor_core_share", value=round(tc_share, 4),
                                       unit="share of matrix-kernel time"))
        kernel_time = f.device.kernel_time
        if kernel_time > 0:
            elementwise = f.device.class_time("elementwise", "reduction") / kernel_time
            v.evidence.append(share_evidence("elementwise_share", elementwise,
                                             th.ELEMENTWISE_SHARE))
        if fp32_share is not None and fp32_share >= th.FP32_MATMUL_SHARE.value and major >= 7:
            v.findings.append(Finding(
                id="kernel.fp32_matmul", severity="warning", layer="kernel",
                message=f"{fp32_share:.0%} of matrix-kernel time runs fp32 without tensor "
                        f"cores on a GPU that has them (compute capability {major}.x)."))
        chain = _pointwise_per_matrix_kernel(f)
        if chain is not None:
            v.evidence.append(share_evidence("pointwise_kernels_per_matrix_kernel", chain,
                                             th.UNFUSED_CHAIN))
        unfused = (elementwise is not None and elementwise >= th.ELEMENTWISE_SHARE.value
                   and (chain is None or chain >= th.UNFUSED_CHAIN.value))
        if unfused:
            per_step = sum(c.count for c in f.device.classes
                           if c.cls in ("elementwise", "reduction")) / max(len(f.steps), 1)
            v.findings.append(Finding(
                id="kernel.unfused_elementwise", severity="warning", layer="kernel",
                message=f"{elementwise:.0%} of kernel time is elementwise/reduction work "
                        f"({per_step:.0f} kernels per step"
                        + (f", {chain:.0f} per matrix kernel" if chain is not None else "")
                        + "): fusing the chains would cut memory traffic."))
    if not f.gpu:
        v.remedies.append((BY_ID["amp.bf16"], "CPU compute dominates"))
        v.remedies.append((BY_ID["compile.default"], "fuses elementwise work between the big ops"))
    else:
        precision_known = fp32_share is not None
        fp32_heavy = precision_known and fp32_share >= th.FP32_MATMUL_SHARE.value
        if major >= 8 and (fp32_heavy or not precision_known):
            v.remedies.append((BY_ID["matmul.tf32"],
                               f"{fp32_share:.0%} of matrix time is fp32 without tensor cores"
                               if fp32_heavy else
                               "if matmuls run in fp32 (kernel names do not tell)"))
        low_precision = precision_known and tc_share >= 0.5 and _runs_low_precision(f)
        if not low_precision:
            v.remedies.append((BY_ID["amp.bf16"],
                               "matrix kernels run in fp32/TF32" if precision_known else
                               "compute dominates the step" if major >= 8 or not devices else
                               "this GPU predates bf16 tensor cores: use dtype=torch.float16 "
                               "with torch.amp.GradScaler"))
        v.remedies.append((BY_ID["compile.default"],
                           f"{elementwise:.0%} of kernel time is unfused elementwise work"
                           if unfused else "fuses elementwise work between the big ops"))
    v.remedies.append((BY_ID["compile.max_autotune"], "after compile.default, if GEMMs dominate"))
    v.remedies.append((BY_ID["kernel.custom"], "only for an op that dominates the top-ops table"))
    _gate_bf16(f, v)
    gate_compiled(f, v, ("compile.default",))
    return v


def _gate_bf16(f: Facts, v: Verdict) -> None:
    """bf16 autocast only where it can pay: not for float64 work (``float64_share``: autocast
    leaves float64 tensors alone) and, on a CPU, only with native bf16 instructions
    (``cpu_fast_bf16``, from the CPU flags the run recorded; unknown counts as none). Each
    gate's evidence goes into the layer's; a closed gate moves the remedy to ``withheld``."""
    found = [(remedy, why) for remedy, why in v.remedies if remedy.id == "amp.bf16"]
    if not found:
        return
    closed: list[tuple[str, Evidence]] = []
    if f.float64_share is not None:
        ev = share_evidence("float64_share", f.float64_share, th.FLOAT64_SHARE)
        ev.unit = ("share of CPU op self time with a float64 input" if not f.gpu else
                   "share of kernel time in double-precision kernels")
        v.evidence.append(ev)
        if ev.fired:
            closed.append((f"{f.float64_share:.0%} of the op time is float64, which autocast "
                           "leaves in float64", ev))
    if not f.gpu:
        ev = cpu_bf16_evidence(f.machine)
        v.evidence.append(ev)
        flags = f.machine.cpu_bf16 if f.machine is not None else None
        if not ev.fired:
            capability = f.machine.cpu_capability if f.machine is not None else None
            closed.append(("the CPU's bf16 support was not recorded (`torchtriage run` reads its "
                           "flags)" if flags is None else
                           f"this CPU has no native bf16 ({capability or 'no AMX/AVX512-BF16'}"
                           "): bf16 is converted in software, slower than fp32", ev))
        elif not closed:
            v.remedies = [(r, f"CPU compute dominates and the CPU has {', '.join(flags)}")
                          if r.id == "amp.bf16" else (r, why) for r, why in v.remedies]
    if closed:
        v.remedies = [(r, why) for r, why in v.remedies if r.id != "amp.bf16"]
        v.withheld.append((found[0][0], "; ".join(why for why, _ in closed),
                           [ev for _, ev in closed]))


def cpu_bf16_evidence(m: MachineInfo | None) -> Evidence:
    """The CPU's native bf16 instruction sets, held against ``cpu_fast_bf16``."""
    t = th.CPU_FAST_BF16
    flags = m.cpu_bf16 if m is not None else None
    return Evidence(metric="cpu_fast_bf16", value=len(flags or ()),
                    unit="native bf16 instruction sets: " + (", ".join(flags) if flags else
                                                             "none" if flags is not None else
                                                             "not recorded"),
                    threshold=t.value, comparison=">=", fired=len(flags or ()) >= t.value,
                    source=t.source)


def _pointwise_per_matrix_kernel(f: Facts) -> float | None:
    """Elementwise + reduction kernels per matrix kernel (None without matrix kernels)."""
    counts = {c.cls: c.count for c in f.device.classes}
    matrix = sum(counts.get(c, 0) for c in _MATRIX_CLASSES)
    if matrix == 0:
        return None
    return (counts.get("elementwise", 0) + counts.get("reduction", 0)) / matrix


# nvjet_* are cuBLASLt's Hopper kernels for 16/8-bit inputs (fp32 and TF32 GEMMs there run
# sm90_xmma_gemm_f32f32_* kernels, measured on an H200).
_LOW_PRECISION = re.compile(r"bf16|f16|fp16|e4m3|e5m2|fp8|h884|h1688|h16816|i8816|nvjet", re.I)
_MATRIX_CLASSES = ("gemm", "convolution", "attention")


def _runs_low_precision(f: Facts) -> bool:
    """Most matrix time is on tensor cores and some matrix kernel is 16-bit or 8-bit."""
    ops = f.device.ops
    ev = f.trace.events
    matrix = np.isin(ops.cls, [KERNEL_CLASSES.index(c) for c in _MATRIX_CLASSES])
    names = (ev.names[i] for i in unique(ev.name_id[ops.rows[matrix]]))
    return any(_LOW_PRECISION.search(n) for n in names)
