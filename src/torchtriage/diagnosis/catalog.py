"""The prescription catalog: every fix torchtriage can recommend, with a stable id.

Within a layer, prescriptions are ordered by cost, cheapest first, as the seed orders them:
DataLoader four-piece; communication buckets -> accumulation with no_sync -> compression ->
overlap (sharded jobs: keep gathered parameters -> bf16 gathers -> prefetch -> coarser units);
kernels precision -> torch.compile fusion -> custom kernels; memory gradient accumulation ->
activation checkpointing -> bf16 -> FSDP/ZeRO.

Cost scale: 1 = a flag or argument, 2 = a few lines of code, 3 = a code change with a compile or
numerics cost to check, 4 = a long compile or tuning run, 5 = engineering work.
"""

from __future__ import annotations

import msgspec

COST_LABELS = {1: "flag", 2: "small code change", 3: "code change + check", 4: "tuning run",
               5: "engineering"}


class Remedy(msgspec.Struct, frozen=True):
    """A catalog entry (the diagnosis turns it into a Prescription with a reason)."""

    id: str
    layer: str
    cost: int
    title: str
    code: str
    expected_gain: str
    verify: str
    gpu_only: bool = False
    # the title and code on a CPU-only trace, where they differ ("": the same)
    cpu_title: str = ""
    cpu_code: str = ""


CATALOG: tuple[Remedy, ...] = (
    # data_loading: the DataLoader four-piece, then the copy.
    Remedy("dataloader.num_workers", "data_loading", 1,
           "Load batches in worker processes",
           "DataLoader(dataset, batch_size=..., num_workers=4)  # try 2..cores",
           "up to the data-loading share of the step (often 2-5x when loading dominates)",
           "data_loading share of step time falls; median step time falls"),
    Remedy("dataloader.pin_memory", "data_loading", 1,
           "Pin host memory so copies to the GPU are DMA, not staged",
           "DataLoader(..., pin_memory=True)",
           "removes the pageable staging copy: host-to-device time often halves",
           "h2d_input time per step falls; Memcpy HtoD shows Pinned, not Pageable",
           gpu_only=True),
    Remedy("dataloader.prefetch_factor", "data_loading", 1,
           "Keep more batches in flight per worker",
           "DataLoader(..., num_workers=N, prefetch_factor=4)  # default 2",
           "smooths bursty loading; 0-20% when workers are occasionally late",
           "variance of DataLoader __next__ time falls"),
    Remedy("dataloader.persistent_workers", "data_loading", 1,
           "Keep workers alive across epochs",
           "DataLoader(..., num_workers=N, persistent_workers=True)",
           "removes worker start-up at every epoch (seconds per epoch)",
           "first step of each epoch no longer spikes"),
    Remedy("h2d.non_blocking", "data_loading", 2,
           "Copy inputs asynchronously so the copy overlaps compute",
           "x = x.to(device, non_blocking=True)  # with pin_memory=True",
           "hides the input copy behind compute: up to the h2d_input share",
           "h2d_input exposed time falls toward zero",
           gpu_only=True),
    # host: cheapest first.
    Remedy("optimizer.fused", "host", 1,
           "Use the fused (or foreach) optimizer implementation",
           "torch.optim.AdamW(model.parameters(), lr=..., fused=True)",
           "optimizer step becomes a few kernels instead of several per parameter",
           "optimizer time and op count per step fall"),
    Remedy("sync.remove", "host", 2,
           "Remove host-device syncs from the training loop",
           "log loss.detach() and call .item() every N steps, not every step",
           "lets the host run ahead of the device; removes one stall per sync",
           "cudaStreamSynchronize / aten::item count per step falls"),
    Remedy("compile.reduce_overhead", "host", 3,
           "Compile with CUDA graphs to remove per-kernel launch cost",
           'model = torch.compile(model, mode="reduce-overhead")',
           "1.2-3x on launch-bound steps (on CPU: the gain comes from fusion only)",
           "host/launch share and ops per step fall; compile time is paid back",
           cpu_title="Compile the model so that its small ops run as fused generated code",
           cpu_code='model = torch.compile(model)  # "reduce-overhead" adds CUDA graphs: GPU '
                    'only'),
    # host, over the run: recompilation and periodic work between steps.
    Remedy("compile.dynamic", "host", 1,
           "Compile with dynamic shapes so new input sizes do not recompile",
           "model = torch.compile(model, dynamic=True)\n"
           "# or mark the varying dimension: torch._dynamo.mark_dynamic(x, 1)",
           "removes recompilation stalls (and eager fallback past the recompile limit)",
           "recompilations over the run fall to ~1 per frame; steps after the first no longer "
           "stall"),
    Remedy("compile.recompile_limit", "host", 1,
           "Raise the recompile limit so frames past it stay compiled",
           "torch._dynamo.config.recompile_limit = 64  # default 8",
           "frames that fell back to eager run compiled again; more compile time up front",
           "no 'hit config.recompile_limit' warning; recompile-limit hits fall to 0"),
    Remedy("compile.pad_buckets", "host", 2,
           "Pad inputs to a few fixed lengths",
           "length = min(b for b in (64, 128, 256, 512) if b >= x.shape[1])\n"
           "x = torch.nn.functional.pad(x, (0, length - x.shape[1]), value=pad_id)",
           "one compilation per bucket instead of one per length",
           "recompilations over the run stop after one per bucket"),
    Remedy("compile.remove_graph_break", "host", 3,
           "Remove the graph break from the compiled region",
           "move the .item()/print()/data-dependent branch out of the compiled forward "
           "(torch._dynamo.explain(model)(x) lists them)",
           "one graph instead of several: fewer guards, more fusion",
           "graph breaks over the run fall to 0"),
    Remedy("eval.interval", "host", 2,
           "Evaluate less often, or on fewer batches",
           "if step % eval_every == 0: evaluate(model, val_loader, max_batches=50)\n"
           "# Lightning: L.Trainer(check_val_every_n_epoch=5, limit_val_batches=50)\n"
           "# Hugging Face: TrainingArguments(eval_steps=2000)  # or fewer eval samples",
           "up to the evaluation stalls' share of the run",
           "periodic stalls shrink or come less often; their share of the run falls"),
    Remedy("checkpoint.async", "host", 2,
           "Save checkpoints less often, or asynchronously",
           "import torch.distributed.checkpoint as dcp\n"
           "dcp.async_save({'model': model.state_dict()}, checkpoint_id=path)\n"
           "# Lightning: ModelCheckpoint(every_n_epochs=5); Hugging Face: save_steps=2000",
           "up to the checkpoint stalls' share of the run",
           "checkpoint steps no longer stall the loop"),
    # kernel: precision first, then fusion, then custom kernels.
    Remedy("matmul.tf32", "kernel", 1,
           "Let fp32 matmuls use TF32 tensor cores (Ampere or newer)",
           "torch.backends.cuda.matmul.allow_tf32 = True\n"
           'torch.set_float32_matmul_precision("high")  # the same, for every backend',
           "up to ~2-8x on fp32 GEMM time on Ampere+ GPUs",
           "GEMM kernel time falls; kernels switch to tensor-core variants",
           gpu_only=True),
    Remedy("amp.bf16", "kernel", 2,
           "Train in bf16 autocast",
           'with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
           "    loss = loss_fn(model(x), y)  # forward and loss; backward outside",
           "~1.5-3x on GEMM-heavy GPU steps; on CPU only with AVX512-BF16/AMX",
           "kernel time falls; loss curve stays within bf16 tolerance"),
    Remedy("compile.default", "kernel", 3,
           "Fuse elementwise chains with torch.compile",
           "model = torch.compile(model)",
           "1.1-1.5x typical on memory-bound elementwise work; costs compile time",
           "kernel count and kernel time per step fall; compile time is paid back"),
    Remedy("compile.max_autotune", "kernel", 4,
           "Autotune GEMM and fused kernels",
           'model = torch.compile(model, mode="max-autotune")',
           "a further 0-20% over default compile; compile takes minutes",
           "kernel time falls beyond compile.default"),
    Remedy("kernel.custom", "kernel", 5,
           "Write or adopt a custom kernel for the top op",
           "replace the top op with a fused Triton/CUDA kernel (e.g. flash attention)",
           "depends on the op; only worth it for an op that dominates the step",
           "the op's time falls in the top-ops table"),
    # communication: buckets -> accumulation with no_sync -> compression -> overlap.
    Remedy("ddp.bucket_cap", "communication", 1,
           "Tune DDP gradient bucket size",
           "DistributedDataParallel(model, bucket_cap_mb=100)  # default 25",
           "fewer, larger all-reduces: 0-30% of exposed communication",
           "collective count per step falls; exposed communication falls"),
    Remedy("ddp.grad_accumulation", "communication", 2,
           "Accumulate gradients locally and all-reduce every k steps",
           "with model.no_sync(): loss.backward()  # for k-1 of every k micro-batches",
           "communication per sample falls ~k times",
           "communication share of step time falls"),
    Remedy("ddp.comm_hook", "communication", 2,
           "Compress gradients to bf16 for the all-reduce",
           "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
           "model.register_comm_hook(None, default_hooks.bf16_compress_hook)",
           "halves bytes on the wire: up to 2x on bandwidth-bound all-reduce",
           "collective time falls; loss parity holds"),
    Remedy("ddp.static_graph", "communication", 2,
           "Let DDP overlap and reuse buckets (static graph, grads as bucket views)",
           "DistributedDataParallel(model, static_graph=True, gradient_as_bucket_view=True)",
           "better overlap of all-reduce with backward; saves a gradient copy",
           "overlapped share of communication rises"),
    # communication of a sharded (FSDP) job: gather less often, fewer bytes, earlier, in
    # fewer calls.
    Remedy("fsdp.reshard_after_forward", "communication", 1,
           "Keep gathered parameters from forward to backward",
           "fully_shard(block, reshard_after_forward=False)  # the root, the last blocks, or all",
           "removes the backward all-gathers: up to half the all-gather traffic, for the "
           "unsharded parameters' memory",
           "all-gathers per step fall to one per unit; exposed communication falls"),
    Remedy("fsdp.mixed_precision", "communication", 2,
           "Gather parameters in bf16, reduce gradients in fp32",
           "from torch.distributed.fsdp import MixedPrecisionPolicy\n"
           "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n"
           "fully_shard(block, mp_policy=mp)  # every block and the root",
           "halves the all-gather bytes (and the forward/backward math runs in bf16)",
           "all-gather time falls; loss parity holds"),
    Remedy("fsdp.prefetch", "communication", 2,
           "Prefetch the next blocks' all-gathers behind the current block's compute",
           "for i, block in enumerate(blocks):\n"
           "    block.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])\n"
           "    block.set_modules_to_backward_prefetch(blocks[max(i - 2, 0):i][::-1])",
           "hides all-gathers behind compute: up to the exposed all-gather time",
           "hidden share of all-gather time rises", gpu_only=True),
    Remedy("fsdp.wrap_granularity", "communication", 3,
           "Shard coarser units: fewer, larger all-gathers",
           "fully_shard(group)  # over groups of blocks instead of each small module",
           "fewer, larger collectives run closer to link bandwidth; peak memory rises by the "
           "larger unit's parameters",
           "all-gathers per step fall; bytes per all-gather rise"),
    # memory: cheapest rung that fits.
    Remedy("memory.expandable_segments", "memory", 1,
           "Let the caching allocator grow segments instead of fragmenting",
           'PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" python train.py',
           "recovers reserved-but-unused memory (fragmentation)",
           "peak reserved falls toward peak allocated",
           gpu_only=True),
    Remedy("memory.fix_leak", "memory", 2,
           "Stop keeping each step's tensors alive across steps",
           "losses.append(loss.item())  # not loss: it keeps the step's tensors and graph\n"
           "preds.append(logits.detach().cpu())  # for metrics at the end of the epoch",
           "memory stops growing: no out-of-memory error later in the run, and no need for "
           "the memory ladder",
           "allocated memory at step boundaries is flat over the run (torchtriage run's "
           "whole-run view)"),
    Remedy("memory.grad_accumulation", "memory", 2,
           "Halve the micro-batch and accumulate gradients",
           "for i, mb in enumerate(batch.chunk(k)): (loss_fn(model(mb)) / k).backward()",
           "activation memory falls ~k times at the same effective batch",
           "peak allocated falls; throughput within a few percent"),
    Remedy("memory.activation_checkpointing", "memory", 3,
           "Recompute activations of repeated blocks in backward",
           "from torch.utils.checkpoint import checkpoint\n"
           "x = checkpoint(block, x, use_reentrant=False)",
           "activation memory of checkpointed blocks falls to their inputs; ~20-30% more compute",
           "peak allocated falls"),
    Remedy("memory.bf16", "memory", 3,
           "Keep activations in bf16 (autocast)",
           'with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
           "    loss = loss_fn(model(x), y)  # forward and loss; backward outside",
           "activation memory roughly halves",
           "peak allocated falls; loss parity holds"),
    Remedy("memory.fsdp", "memory", 5,
           "Shard parameters, gradients and optimizer state (FSDP / ZeRO)",
           "from torch.distributed.fsdp import fully_shard\nfully_shard(model)",
           "parameter + optimizer memory falls ~N times over N ranks",
           "peak allocated per rank falls"),
)

BY_ID: dict[str, Remedy] = {r.id: r for r in CATALOG}


def remedies_for(layer: str) -> list[Remedy]:
    """The catalog entries of ``layer``, cheapest first (stable within a cost)."""
    return sorted((r for r in CATALOG if r.layer == layer), key=lambda r: r.cost)
