"""Device kernels: classes from kernel names, tensor-core use, and the op that launched each.

Name patterns cover cuBLAS/cuBLASLt (``*gemm*``, ``nvjet_*``), CUTLASS, cuDNN, flash/SDPA
attention, Triton (``triton_poi_*``, ``triton_red_*``, ``triton_per_*``, ``triton_tem_*``),
NCCL/RCCL and ROCm (``Cijk_*`` Tensile/hipBLASLt GEMMs, MIOpen convolutions).
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchtriage.analysis.categories import is_communication_kernel
from torchtriage.analysis.correlation import runtime_for
from torchtriage.analysis.dense import dense_unique
from torchtriage.analysis.ops import in_steps
from torchtriage.analysis.steps import StepWindows
from torchtriage.trace.model import DEVICE_KINDS, EventKind, Trace

KERNEL_CLASSES: tuple[str, ...] = (
    "gemm",  # matrix multiplies: cuBLAS/cuBLASLt/CUTLASS/Tensile, Triton mm templates
    "convolution",  # cuDNN/MIOpen convolutions (forward, dgrad, wgrad)
    "attention",  # flash / memory-efficient / cuDNN SDPA attention kernels
    "elementwise",  # pointwise kernels: activations, adds, casts, copies, fills, Triton poi
    "reduction",  # reductions and norms: sum/mean/softmax/layer_norm/batch_norm, Triton red
    "communication",  # NCCL / RCCL collectives
    "memcpy",  # device copies (gpu_memcpy events)
    "memset",  # device memsets (gpu_memset events)
    "other",  # anything not matched above
)

_ATTENTION = re.compile(r"flash|fmha|attention|_attn|sdpa|mha_", re.I)
_NORM = re.compile(r"bn_fw|bn_bw|batch_?norm|layer_?norm|rms_?norm|group_?norm|softmax|"
                   r"welford", re.I)
_CONV = re.compile(r"conv|wgrad|dgrad|fprop|winograd|cask_cudnn|scudnn|cudnn::cnn|"
                   r"implicit_gemm|miopen|igemm", re.I)
_GEMM = re.compile(r"gemm|gemv|nvjet|cublas|cutlass|Cijk_|matmul|triton_tem|_mm_|xmma", re.I)
_REDUCTION = re.compile(r"reduce|reduction|triton_red|triton_per|pool|argmax|argmin|"
                        r"cumsum|scan|topk|sort|norm|sum_|mean", re.I)
_ELEMENTWISE = re.compile(r"elementwise|vectorized|pointwise|triton_poi|unrolled|fill|copy|"
                          r"cat|index|gather|scatter|where|clamp|Functor|relu|gelu|silu|"
                          r"sigmoid|tanh|dropout|cast|transpose|permute", re.I)

# Tensor-core evidence in GEMM/conv/attention kernel names.
_TENSOR_CORE = re.compile(r"tensorop|hmma|gmma|wmma|mma_|tf32|bf16|fp16|f16|h884|h1688|"
                          r"s1688|s16816|h16816|i8816|16816|16832|e4m3|e5m2|fp8|nvjet|"
                          r"flash|fmha|_xdl|mfma|_MI\d+x\d+x\d+", re.I)
_NO_TENSOR_CORE = re.compile(r"sgemm|ffma|gemv|f32f32_f32f32_f32|fp32_", re.I)


def kernel_class(name: str, kind: int = EventKind.KERNEL) -> str:
    """The class of one device event (see :data:`KERNEL_CLASSES`)."""
    if kind == EventKind.MEMCPY:
        return "memcpy"
    if kind == EventKind.MEMSET:
        return "memset"
    if is_communication_kernel(name):
        return "communication"
    for cls, pattern in (("attention", _ATTENTION), ("reduction", _NORM),
                         ("convolution", _CONV), ("gemm", _GEMM), ("reduction", _REDUCTION),
                         ("elementwise", _ELEMENTWISE)):
        if pattern.search(name):
            return cls
    return "other"


def uses_tensor_cores(name: str) -> bool | None:
    """True/False for a matrix kernel whose name says it; None when the name does not tell."""
    if _NO_TENSOR_CORE.search(name) and not re.search(r"tf32|tensorop", name, re.I):
        return False
    if _TENSOR_CORE.search(name):
        return True
    return None


class DeviceOps(msgspec.Struct, frozen=True):
    """The device events (kernels, copies, memsets) inside the analysed steps."""

    rows: np.ndarray  # int64 rows into the event table, sorted by start
    cls: np.ndarray  # int8 index into KERNEL_CLASSES
    tensor_core: np.ndarray  # int8: 1 yes, 0 no, -1 unknown / not a matrix kernel
    launcher: np.ndarray  # int64 row of the host op that launched it, -1 when unknown


_MATRIX = {"gemm", "convolution", "attention"}


def device_ops(trace: Trace, steps: StepWindows) -> DeviceOps:
    """Classify every device event in the analysed steps and link it to its launching op."""
    ev = trace.events
    rows = np.flatnonzero(np.isin(ev.kind, DEVICE_KINDS))
    rows = rows[in_steps(ev.ts[rows], steps)]
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    class_index = {c: i for i, c in enumerate(KERNEL_CLASSES)}
    # Classified once per distinct (name, kind), then spread to the rows.
    codes = ev.name_id[rows].astype(np.int64) * 16 + ev.kind[rows]
    distinct, inverse, _ = dense_unique(codes, len(ev.names) * 16)
    pair_cls, pair_tc = [], []
    for code in distinct.tolist():
        name = ev.names[code // 16]
        c = class_index[kernel_class(name, code % 16)]
        verdict = uses_tensor_cores(name) if KERNEL_CLASSES[c] in _MATRIX else None
        pair_cls.append(c)
        pair_tc.append(-1 if verdict is None else int(verdict))
    inverse = inverse.reshape(-1)
    cls = np.asarray(pair_cls, dtype=np.int8)[inverse]
    tc = np.asarray(pair_tc, dtype=np.int8)[inverse]
    return DeviceOps(rows=rows, cls=cls, tensor_core=tc, launcher=_launchers(trace, rows))


def _launchers(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Host op that launched each device event: the innermost op with the same external id.

    Kernels carry the ``External id`` of the op that launched them (or, in older traces, of
    the runtime call, which carries the op's); when absent, the runtime call with the same
    ``correlation`` supplies it.
    """
    ev = trace.events
    ext = ev.external_id[rows].copy()
    missing = ext < 0
    if missing.any():
        launch = runtime_for(trace, rows[missing])
        ext[missing] = np.where(launch >= 0, ev.external_id[np.maximum(launch, 0)], -1)
    ops = np.flatnonzero((ev.kind == EventKind.CPU_OP) & (ev.external_id >= 0))
    # Innermost op per external id: the shortest one.
    ops = ops[np.lexsort((ev.dur[ops], ev.external_id[ops]))]
    op_ext = ev.external_id[ops]
    first = np.ones(ops.size, dtype=bool)
    first[1:] = op_ext[1:] != op_ext[:-1]
    ops, op_ext = ops[first], op_ext[first]
    out = np.full(rows.size, -1, dtype=np.int64)
    if ops.size == 0:
        return out
    pos = np.clip(np.searchsorted(op_ext, ext), 0, ops.size - 1)
    ok = (ext >= 0) & (op_ext[pos] == ext)
    out[ok] = ops[pos[ok]]
    return out
