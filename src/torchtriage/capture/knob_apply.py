"""Apply knobs inside the profiled process (the knobs are declared in
:mod:`torchtriage.diagnosis.knobs`).

Each installer patches one site of torch (:data:`INSTALLERS`, one per
:data:`~torchtriage.diagnosis.knobs.Site`), records through ``run.note`` whether each knob took
effect (and where), and leaves everything else as the script wrote it. :func:`apply_global`
installs the sites that the knobs given name, in the registry's site order.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

from torchtriage.capture.knob_distributed import patch_ddp, patch_fully_shard
from torchtriage.capture.knob_host import KnobHost
from torchtriage.capture.knob_site import caller_site, repeated_blocks, site_keywords
from torchtriage.diagnosis import knobs as registry


def apply_global(run: KnobHost) -> None:
    import torch

    table = registry.by_id()
    sites: set[str] = set()
    for knob_id, value in run.knobs.items():
        knob = table.get(knob_id)
        if knob is None:
            continue
        if registry.value_in(value, knob.inert):
            if knob.inert_note is not None:
                run.note(knob_id, True, knob.inert_note)
            continue
        sites.add(knob.site)
        sites.update(knob.also)
    for site in registry.SITES:
        if site in sites:
            INSTALLERS[site](run, torch)


def shift_worker_seeds(offset: int) -> None:
    """Add ``offset`` to the base seed every DataLoader iterator draws for its workers (worker
    ``i`` seeds ``torch``, ``random`` and ``numpy`` from base + i), so that the same script
    draws other per-sample random numbers in its workers and nothing else changes: the
    reference spread for a knob with ``reseeds_workers`` (:mod:`torchtriage.verify.parity`)."""
    from torch.utils.data import dataloader

    original = dataloader._BaseDataLoaderIter.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)  # draws _base_seed; workers start after it returns
        self._base_seed += offset

    dataloader._BaseDataLoaderIter.__init__ = __init__


def eager_random() -> None:
    """Make torch.compile's generated code draw random numbers (dropout, ``rand``) through
    eager PyTorch's generator and ops (``torch._inductor.config.fallback_random``), so that a
    compiled step draws what the same eager step draws: Inductor otherwise seeds its own
    stream, and losses of a compiled and an eager run then differ by the dropout masks, not by
    the math (:mod:`torchtriage.verify.parity`'s random-aligned check). Slower; parity trials
    only."""
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True


def _install_backend(run, torch) -> None:
    knobs = run.knobs
    if "matmul.tf32" in knobs:
        torch.backends.cuda.matmul.allow_tf32 = knobs["matmul.tf32"]
        torch.backends.cudnn.allow_tf32 = knobs["matmul.tf32"]
        torch.set_float32_matmul_precision("high" if knobs["matmul.tf32"] else "highest")
        run.note("matmul.tf32", True, "set torch.backends.cuda.matmul.allow_tf32, "
                 "cudnn.allow_tf32 and float32 matmul precision"
                 + ("" if torch.cuda.is_available() else " (no CUDA device: no effect on CPU)"))
    if "dynamo.recompile_limit" in knobs:
        import torch._dynamo

        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, int(knobs["dynamo.recompile_limit"]))
        run.note("dynamo.recompile_limit", True,
                 f"set torch._dynamo.config.{name} = {knobs['dynamo.recompile_limit']}")
    if "cudnn.benchmark" in knobs:
        torch.backends.cudnn.benchmark = knobs["cudnn.benchmark"]
        run.note("cudnn.benchmark", True, "set torch.backends.cudnn.benchmark"
                 + ("" if torch.cuda.is_available() else " (no CUDA device: no effect on CPU)"))


def _patch_compile_call(run: KnobHost, torch) -> None:
    """``compile.dynamic``: every torch.compile call (the script's, Module.compile()'s and
    compile.mode's) gets ``dynamic=`` the knob's value, whatever it passed."""
    original = torch.compile
    value = bool(run.knobs["compile.dynamic"])

    def compile(model=None, *args, **kwargs):
        passed = kwargs.get("dynamic")
        kwargs["dynamic"] = value
        run.note("compile.dynamic", True,
                 f"torch.compile(..., dynamic={value}) (the call passed dynamic={passed})",
                 where=caller_site())
        return original(model, *args, **kwargs)

    compile.__wrapped__ = original
    torch.compile = compile


def _install_micro_batches(run, torch) -> None:
    _patch_accumulation(run, torch)


def _patch_dataloader(run: KnobHost, torch) -> None:
    from torch.utils.data import DataLoader

    original = DataLoader.__init__
    keywords = site_keywords(run, "dataloader")
    wanted = {arg: run.knobs[k] for k, arg in keywords.items()}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(original).bind_partial(self, *args, **kwargs).arguments
        bound.pop("self", None)
        where = caller_site()
        for arg, value in wanted.items():
            bound[arg] = value
        if run.knobs.get("memory.grad_accumulation", 1) > 1:
            _split_batches(run, bound, where)
        workers = bound.get("num_workers", 0) or 0
        for knob, arg in keywords.items():
            if arg in ("prefetch_factor", "persistent_workers") and workers == 0:
                bound[arg] = None if arg == "prefetch_factor" else False
                run.note(knob, False, f"DataLoader at {where} has num_workers=0, where {arg} "
                         "does not apply")
                continue
            if arg == "pin_memory" and value_needs_cuda(torch, bound.get(arg)):
                run.note(knob, False, "no CUDA device: pinned memory brings nothing")
                bound[arg] = False
                continue
            run.note(knob, True, f"DataLoader at {where}: {arg}={bound[arg]!r}", where)
        original(self, **bound)

    DataLoader.__init__ = __init__
    if run.knobs.get("dataloader.persistent_workers"):
        _keep_seed_draws(torch)


def _keep_seed_draws(torch) -> None:
    """Under ``persistent_workers=True`` an epoch after the first draws no worker base seed from
    the main process's generator, as a new iterator would: every later draw of the script
    (the sampler's shuffle, dropout) would shift, and loss parity would compare random streams.
    The persistent iterator draws it anyway (and discards it): the main stream stays the
    script's, and only the workers' own streams differ (``reseeds_workers``)."""
    from torch.utils.data import dataloader

    cls = dataloader._MultiProcessingDataLoaderIter
    original = cls._reset

    def _reset(self, loader, first_iter=False) -> None:
        if not first_iter:
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        original(self, loader, first_iter)

    cls._reset = _reset


def _split_batches(run: KnobHost, bound: dict[str, Any], where: str | None) -> None:
    """memory.grad_accumulation=K: this DataLoader yields batches of batch_size / K (the
    optimizer then steps every K-th call, see _patch_accumulation)."""
    k = run.knobs["memory.grad_accumulation"]
    size = bound.get("batch_size", 1)
    if bound.get("batch_sampler") is not None or size is None:
        how = ("its own batch_sampler" if size is not None else
               "batch_size=None (the dataset yields whole batches)")
        run.note("memory.grad_accumulation", False, f"DataLoader at {where} batches with "
                 f"{how}: its batches cannot be split")
        return
    # A batch size K does not divide takes the next count that does, up to 2K (30 samples
    # in 4 micro-batches become 5 of 6): the same samples per optimizer step either way.
    split = next((n for n in range(k, 2 * k + 1) if size % n == 0), None)
    if split is None:
        run.note("memory.grad_accumulation", False, f"DataLoader at {where} has batch_size="
                 f"{size}, not divisible into {k} to {2 * k} micro-batches")
        return
    bound["batch_size"] = size // split
    run.micro_batches = split
    run.note("memory.grad_accumulation", True, f"DataLoader at {where}: batch_size {size} -> "
             f"{size // split}, {split} micro-batches per optimizer step", where)


def _patch_accumulation(run: KnobHost, torch) -> None:
    """Gradient accumulation without touching the script: once a DataLoader's batches were
    split (``run.micro_batches`` = K > 1), each optimizer's ``step`` runs on every K-th call (the
    gradients summed over K micro-batches are divided by K first, so the update equals the
    full batch's), ``zero_grad`` and LR-scheduler steps only at the start of a cycle, and DDP
    all-reduces only in the last micro-batch's backward."""
    calls: dict[int, int] = {}  # optimizer id -> step() calls so far

    def at_cycle_start() -> bool:
        return all(n % run.micro_batches == 0 for n in calls.values())

    original_init = torch.optim.Optimizer.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        calls[id(self)] = 0
        step, zero_grad = self.step, self.zero_grad

        def accumulating_step(opt, *a: Any, **kw: Any) -> Any:
            if run.micro_batches <= 1:
                return step(*a, **kw)
            calls[id(opt)] += 1
            if calls[id(opt)] % run.micro_batches:
                return None  # not the last micro-batch: keep accumulating
            with torch.no_grad():
                for group in opt.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.div_(run.micro_batches)
            return step(*a, **kw)

        def accumulating_zero_grad(opt, *a: Any, **kw: Any) -> Any:
            if run.micro_batches <= 1 or calls[id(opt)] % run.micro_batches == 0:
                return zero_grad(*a, **kw)
            return None

        # bound methods, as LR schedulers expect when they wrap optimizer.step
        self.step = types.MethodType(accumulating_step, self)
        self.zero_grad = types.MethodType(accumulating_zero_grad, self)

    torch.optim.Optimizer.__init__ = __init__

    module_zero_grad = torch.nn.Module.zero_grad

    def zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        if run.micro_batches <= 1 or at_cycle_start():
            return module_zero_grad(self, *args, **kwargs)
        return None

    torch.nn.Module.zero_grad = zero_grad

    from torch.optim import lr_scheduler

    scheduler_step = lr_scheduler.LRScheduler.step

    def step(self, *args: Any, **kwargs: Any) -> Any:
        optimizer = getattr(self, "optimizer", None)
        if run.micro_batches > 1 and calls.get(id(optimizer), 0) % run.micro_batches:
            return None  # its optimizer did not step this call
        return scheduler_step(self, *args, **kwargs)

    lr_scheduler.LRScheduler.step = step
    run.sync_this_backward = lambda: all(n % run.micro_batches == run.micro_batches - 1
                                         for n in calls.values())


def value_needs_cuda(torch, value: Any) -> bool:
    return bool(value) and not torch.cuda.is_available()


def _patch_optimizer(run: KnobHost, torch) -> None:
    original = torch.optim.Optimizer.__init__
    fused = run.knobs.get("optimizer.fused")
    foreach = run.knobs.get("optimizer.foreach")

    def __init__(self, params, defaults: dict[str, Any]) -> None:
        name = type(self).__name__
        defaults = dict(defaults)
        where = caller_site()
        if fused is not None:
            if "fused" in defaults:
                defaults["fused"] = fused
                if fused:
                    defaults["foreach"] = False
                run.note("optimizer.fused", True, f"{name}(fused={fused}) at {where}", where)
            else:
                run.note("optimizer.fused", False, f"{name} has no fused implementation")
        if foreach is not None and not (fused and "fused" in defaults):
            if "foreach" in defaults:
                defaults["foreach"] = foreach
                run.note("optimizer.foreach", True, f"{name}(foreach={foreach}) at {where}",
                         where)
            else:
                run.note("optimizer.foreach", False, f"{name} has no foreach implementation")
        original(self, params, defaults)

    torch.optim.Optimizer.__init__ = __init__


def _watch_root_module(run: KnobHost, torch) -> None:
    """Find the root module (the first module with parameters called outside any other module)
    and apply in-place torch.compile and/or activation checkpointing to it (from its next
    call); with ``amp.bf16``, open a bf16 autocast region at every top-level call of a module
    with parameters (see :class:`_AutocastRegion`)."""
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    state = {"depth": 0, "root": None}
    region = _AutocastRegion(run, torch) if run.knobs.get("amp.bf16") else None

    def pre(module, args):
        if state["depth"] == 0:
            has_params = any(True for _ in module.parameters())
            if has_params and state["root"] is None:
                state["root"] = module
                _configure_root(run, torch, module)
            if has_params and region is not None:
                region.open(module)
        state["depth"] += 1

    def post(module, args, output):
        state["depth"] = max(state["depth"] - 1, 0)

    register_module_forward_pre_hook(pre)
    register_module_forward_hook(post)


def _configure_root(run: KnobHost, torch, module) -> None:
    name = type(module).__name__
    if run.knobs.get("memory.activation_checkpointing"):
        _checkpoint_repeated_blocks(run, torch, module)
    mode = run.knobs.get("compile.mode", "none")
    if mode != "none":
        # torch.compile of the (possibly autocast-wrapped) bound forward, set on the instance:
        # the module object the script holds is the one that runs compiled. (Module.compile()
        # did not engage the compiled call in torch 2.13 on this path.)
        options = {} if mode == "default" else {"mode": mode}
        module.forward = torch.compile(module.forward, **options)
        run.note("compile.mode", True, f"torch.compile({name}.forward, mode={mode!r}), from "
                 "its second call")


class _AutocastRegion:
    """bf16 autocast over what users wrap: the forward *and* the loss.

    The region opens when a module with parameters is called outside any other module (a
    model's forward: the generator's or the discriminator's of a GAN alike) and closes when
    backward starts (``torch.autograd.backward``, which ``Tensor.backward`` calls), so the
    loss computed between the two runs under autocast too (``BCELoss`` on a bf16 output
    outside autocast fails: "Found dtype Float but expected BFloat16") and backward runs
    outside it, as the autocast docs advise. One region at a time, on the thread that opened
    it (autocast state is per thread)."""

    def __init__(self, run: KnobHost, torch) -> None:
        import threading

        self.run, self.torch = run, torch
        self.context: Any = None
        self.thread = 0
        self.noted = False
        self._ident = threading.get_ident
        original = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            self.close()
            return original(*args, **kwargs)

        torch.autograd.backward = backward

    def open(self, module) -> None:
        if self.context is not None:
            return
        torch = self.torch
        device = next(module.parameters()).device.type
        self.context = torch.autocast(device_type=device, dtype=torch.bfloat16)
        self.context.__enter__()
        self.thread = self._ident()
        if not self.noted:
            self.noted = True
            self.run.note("amp.bf16", True, f"bf16 autocast ({device}) from each top-level "
                          f"model call ({type(module).__name__}, ...) to the next backward: the "
                          "forward and the loss", caller_site())

    def close(self) -> None:
        if self.context is not None and self._ident() == self.thread:
            context, self.context = self.context, None
            context.__exit__(None, None, None)


def _checkpoint_repeated_blocks(run: KnobHost, torch, root) -> None:
    """Wrap each of the root's :func:`repeated_blocks` in torch.utils.checkpoint,
    non-reentrant."""
    from torch.utils.checkpoint import checkpoint

    best = repeated_blocks(root)
    if not best:
        _checkpoint_sequential(run, torch, root)
        return
    for block in best:
        forward = block.forward

        def checkpointed(*args: Any, _forward=forward, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
            return _forward(*args, **kwargs)

        block.forward = checkpointed
    run.note("memory.activation_checkpointing", True,
             f"{len(best)} x {type(best[0]).__name__} blocks checkpointed, from the second call")


def _patch_to(run: KnobHost, torch) -> None:
    if not torch.cuda.is_available():
        run.note("h2d.non_blocking", False, "no CUDA device: no host-to-device copies")
        return
    original = torch.Tensor.to

    def to(tensor, *args: Any, **kwargs: Any):
        if (tensor.device.type == "cpu" and not kwargs.get("non_blocking")
                and tensor.is_pinned()):
            target = args[0] if args else kwargs.get("device")
            if target is not None and "cuda" in str(target):
                kwargs["non_blocking"] = True
                run.note("h2d.non_blocking", True, "pinned tensor copied with non_blocking=True "
                         f"at {caller_site()}")
        return original(tensor, *args, **kwargs)

    torch.Tensor.to = to


def _checkpoint_sequential(run: KnobHost, torch, root) -> None:
    """No repeated blocks: split the largest ``nn.Sequential`` (a flat stack of layers) into
    about sqrt(n) segments with ``checkpoint_sequential``, which keeps only the segment
    boundaries' activations for backward."""
    import math

    from torch.utils.checkpoint import checkpoint_sequential

    stacks = [m for m in root.modules() if isinstance(m, torch.nn.Sequential) and len(m) >= 4]
    if not stacks:
        run.note("memory.activation_checkpointing", False,
                 f"{type(root).__name__} has no repeated blocks and no nn.Sequential stack of "
                 "4 or more layers to checkpoint")
        return
    stack = max(stacks, key=len)
    segments = max(2, round(math.sqrt(len(stack))))
    forward = stack.forward

    def checkpointed(x: Any) -> Any:
        if torch.is_grad_enabled():
            return checkpoint_sequential(stack, segments, x, use_reentrant=False)
        return forward(x)

    stack.forward = checkpointed
    run.note("memory.activation_checkpointing", True,
             f"{type(stack).__name__} of {len(stack)} layers checkpointed in {segments} "
             "segments, from the second call")


# one installer per site, run in the registry's site order
INSTALLERS: dict[str, Callable[[Any, Any], None]] = {
    "backend": _install_backend,
    "compile_call": _patch_compile_call,
    "dataloader": _patch_dataloader,
    "micro_batches": _install_micro_batches,
    "optimizer": _patch_optimizer,
    "root_module": _watch_root_module,
    "h2d_copy": _patch_to,
    "ddp": patch_ddp,
    "fully_shard": patch_fully_shard,
}
