"""Write a synthetic Kineto GPU trace of a given size, shaped like a real training step.

Each step is a ``ProfilerStep#N`` annotation over a data-loading op and a run of
forward/backward ``aten::`` ops, each with a child op that launches a kernel
(``cudaLaunchKernel`` -> a ``kernel`` event on stream 7 joined by ``correlation``), the odd
host-to-device copy, ``[memory]`` allocation events, and one NCCL all-reduce kernel per step on
its own stream (so that HTA's overlap analysis has communication to measure). Fields, units and
args follow torch.profiler's output (``../shared/notes/torch-profiler-anatomy.md``).

    python benchmarks/synthetic_trace.py /tmp/synthetic.json --mb 1000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

_HEADER = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
                          "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
    "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
}
_OPS = ("aten::linear", "aten::relu", "aten::layer_norm", "aten::gelu", "aten::add",
        "aten::mul", "aten::softmax", "aten::matmul")
_KERNELS = ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32",
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl>")
PID, TID = 4242, 4242
OPS_PER_STEP = 200


def _step(step: int, t0: float, ids: list[int]) -> tuple[list[str], float]:
    """The events of one step starting at ``t0`` (µs); returns them and the step's end."""
    out: list[str] = []
    t = t0 + 5.0
    ext, corr = ids
    loader_dur = 800.0
    out.append(_x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                  t, loader_dur, ext))
    ext += 1
    t += loader_dur + 2.0
    gpu_t = t + 20.0
    for i in range(OPS_PER_STEP):
        name = _OPS[i % len(_OPS)]
        dims = "[[64, 1024], [1024, 1024], [1024]]" if i % 8 == 0 else "[[64, 1024]]"
        out.append(_x("cpu_op", name, t, 24.0, ext,
                      f', "Input Dims": {dims}, "Input type": ["float", "float"], '
                      f'"Sequence number": {step * OPS_PER_STEP + i}, "Fwd thread id": 0'))
        out.append(_x("cpu_op", "aten::empty", t + 1.0, 3.0, ext + 1))
        out.append(_runtime("cudaLaunchKernel", t + 14.0, 6.0, ext + 1, corr))
        kernel_dur = 35.0 if i % 8 == 0 else 9.0
        gpu_t = max(gpu_t, t + 20.0)
        out.append(_kernel(_KERNELS[i % len(_KERNELS)], gpu_t, kernel_dur, ext + 1, corr))
        out.append(_memory(t + 1.5, 1_000_000_000 + (i % 50) * 4_194_304, 4_194_304))
        gpu_t += kernel_dur + 1.0
        ext += 2
        corr += 1
        t += 26.0
    # one all-reduce on the communication stream, overlapping the tail of the backward
    out.append(_runtime("cudaLaunchKernel", t, 5.0, ext, corr))
    out.append(_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                       gpu_t - 400.0, 600.0, ext, corr, stream=22,
                       extra=', "Collective name": "allreduce", "In msg nelems": 16777216, '
                             '"Out msg nelems": 16777216, "Group size": 1, "dtype": "Float"'))
    out.append(_runtime("cudaMemcpyAsync", t + 6.0, 8.0, ext + 1, corr + 1))
    out.append(f'{{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", '
               f'"pid": 0, "tid": 7, "ts": {gpu_t + 1:.3f}, "dur": 40.0, "args": {{'
               f'"device": 0, "context": 1, "stream": 7, "correlation": {corr + 1}, '
               f'"bytes": 4194304, "memory bandwidth (GB/s)": 104.8}}}}')
    end = max(t + 20.0, gpu_t + 50.0)
    out.insert(0, _x("user_annotation", f"ProfilerStep#{step}", t0, end - t0, ids[0] - 1))
    ids[0], ids[1] = ext + 2, corr + 2
    return out, end + 10.0


def _x(cat: str, name: str, ts: float, dur: float, ext: int, extra: str = "") -> str:
    return (f'{{"ph": "X", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {PID}, '
            f'"tid": {TID}, "ts": {ts:.3f}, "dur": {dur:.3f}, "args": {{"External id": {ext}, '
            f'"Record function id": 0, "Ev Idx": {ext}{extra}}}}}')


def _runtime(name: str, ts: float, dur: float, ext: int, corr: int) -> str:
    return (f'{{"ph": "X", "cat": "cuda_runtime", "name": "{name}", "pid": {PID}, '
            f'"tid": {TID}, "ts": {ts:.3f}, "dur": {dur:.3f}, "args": {{"External id": {ext}, '
            f'"cbid": 211, "correlation": {corr}}}}}')


def _kernel(name: str, ts: float, dur: float, ext: int, corr: int, stream: int = 7,
            extra: str = "") -> str:
    return (f'{{"ph": "X", "cat": "kernel", "name": {json.dumps(name)}, "pid": 0, '
            f'"tid": {stream}, "ts": {ts:.3f}, "dur": {dur:.3f}, "args": {{"External id": '
            f'{ext}, "queued": 0, "device": 0, "context": 1, "stream": {stream}, '
            f'"correlation": {corr}, "registers per thread": 128, "shared memory": 16384, '
            f'"blocks per SM": 2.5, "warps per SM": 10.0, "grid": [330, 1, 1], '
            f'"block": [128, 1, 1], "est. achieved occupancy %": 25{extra}}}}}')


def _memory(ts: float, allocated: int, nbytes: int) -> str:
    return (f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", '
            f'"pid": {PID}, "tid": {TID}, "ts": {ts:.3f}, "args": {{"Total Reserved": '
            f'2147483648, "Total Allocated": {allocated}, "Bytes": {nbytes}, "Addr": '
            f'140000000000, "Device Id": 0, "Device Type": 1}}}}')


def write_synthetic_trace(path: Path, target_bytes: int) -> int:
    """Write a trace of about ``target_bytes`` to ``path`` (plain JSON); returns its size."""
    ids = [1, 1]
    t = 1_000_000.0
    written = 0
    step = 1
    with path.open("w") as f:
        head = json.dumps(_HEADER)[:-1] + ', "traceEvents": [\n'
        f.write(head)
        written += len(head)
        first = True
        while written < target_bytes:
            events, t = _step(step, t, ids)
            text = ("" if first else ",\n") + ",\n".join(events)
            first = False
            f.write(text)
            written += len(text)
            step += 1
        tail = '\n], "traceName": "synthetic", "displayTimeUnit": "ms", ' \
               '"baseTimeNanoseconds": 1700000000000000000}\n'
        f.write(tail)
        written += len(tail)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--mb", type=float, default=1000.0, help="size in MB (10^6 bytes)")
    args = parser.parse_args()
    size = write_synthetic_trace(args.path, int(args.mb * 1e6))
    print(f"{args.path}: {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
