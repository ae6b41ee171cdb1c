"""The distributed sites' knob installers: DDP's keyword arguments and communication hook, FSDP
in DDP's place (``memory.fsdp``), the last micro-batch's gradient sync, and ``fully_shard``'s
keyword arguments (see :mod:`torchtriage.capture.knob_apply`)."""

from __future__ import annotations

from typing import Any

from torchtriage.capture.knob_host import KnobHost
from torchtriage.capture.knob_site import caller_site, repeated_blocks, site_keywords


def patch_ddp(run: KnobHost, torch) -> None:
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__
    arguments = site_keywords(run, "ddp")
    if run.knobs.get("memory.fsdp") is True:
        _shard_instead_of_ddp(run, DistributedDataParallel)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        where = caller_site()
        for knob, arg in arguments.items():
            kwargs[arg] = run.knobs[knob]
            run.note(knob, True, f"DistributedDataParallel({arg}={run.knobs[knob]!r}) at "
                     f"{where}", where)
        original(self, *args, **kwargs)
        if run.knobs.get("memory.grad_accumulation", 1) > 1:
            _sync_last_micro_batch(run, self)
        hook = run.knobs.get("ddp.comm_hook", "none")
        if hook != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            fn = default_hooks.bf16_compress_hook if hook == "bf16" else \
                default_hooks.fp16_compress_hook
            try:
                self.register_comm_hook(None, fn)
            except (TypeError, RuntimeError, ValueError) as exc:  # e.g. bf16 needs NCCL
                run.note("ddp.comm_hook", False, f"{fn.__name__} refused by DDP: {exc}")
            else:
                run.note("ddp.comm_hook", True, f"{fn.__name__} registered")

    DistributedDataParallel.__init__ = __init__


def patch_fully_shard(run: KnobHost, torch) -> None:
    """fsdp.* knobs: keyword arguments of every FSDP2 ``fully_shard`` call. The function is
    replaced where scripts import it from (``torch.distributed.fsdp`` and its private
    homes) before the script runs; a call that sets ``mp_policy`` itself keeps it."""
    import importlib

    homes = []
    for name in ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                 "torch.distributed._composable.fsdp"):
        try:
            homes.append(importlib.import_module(name))
        except ImportError:
            continue
    fsdp = next((m for m in homes if hasattr(m, "fully_shard")), None)
    if fsdp is None:
        return  # this torch has no FSDP2: every fsdp.* knob is noted "not reached"
    original = fsdp.fully_shard
    arguments = site_keywords(run, "fully_shard")

    def fully_shard(module, *args: Any, **kwargs: Any) -> Any:
        where = caller_site()
        for knob, arg in arguments.items():
            value = run.knobs[knob]
            if arg == "mp_policy":
                if kwargs.get(arg) is not None:
                    run.note(knob, False, f"fully_shard at {where} sets its own mp_policy")
                    continue
                value = fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                  reduce_dtype=torch.float32)
            kwargs[arg] = value
            run.note(knob, True, f"fully_shard({type(module).__name__}, {arg}="
                     f"{run.knobs[knob]!r}) at {where}", where)
        return original(module, *args, **kwargs)

    for home in homes:
        if getattr(home, "fully_shard", None) is original:
            home.fully_shard = fully_shard


def _shard_instead_of_ddp(run: KnobHost, ddp_class) -> None:
    """memory.fsdp: ``DistributedDataParallel(model, ...)`` returns ``model`` sharded with
    FSDP2 instead: ``fully_shard`` on each of its :func:`repeated_blocks`, then on the root
    (as torchtitan and the FSDP docs do), so that parameters, gradients and the optimizer
    state built after it (over ``model.parameters()``) are split across the ranks. The module
    keeps DDP's ``module`` (itself) and ``no_sync()`` (no gradient reduction inside) for
    scripts that use them. Kept as DDP, with the reason noted, without FSDP2, without a
    process group, or without repeated blocks (one shard of the whole model is no ladder rung:
    it gathers everything at once)."""
    from contextlib import contextmanager

    original_new = ddp_class.__new__

    def __new__(cls, module=None, *args: Any, **kwargs: Any):
        where = caller_site()
        blocks = repeated_blocks(module) if module is not None else []
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            fully_shard = None
        import torch.distributed as dist

        why = ("this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)"
               if fully_shard is None else
               "no process group is initialized" if not dist.is_initialized() else
               "the model has no repeated block to shard" if not blocks else None)
        if why:
            run.note("memory.fsdp", False, f"DistributedDataParallel at {where} kept: {why}")
            return original_new(cls)
        name = type(blocks[0]).__name__  # fully_shard renames the class (FSDP<name>)
        for block in blocks:
            fully_shard(block)
        fully_shard(module)

        @contextmanager
        def no_sync():
            module.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                module.set_requires_gradient_sync(True)

        object.__setattr__(module, "no_sync", no_sync)
        object.__setattr__(module, "module", module)
        run.note("memory.fsdp", True, f"DistributedDataParallel at {where} replaced by "
                 f"fully_shard on {len(blocks)} x {name} blocks and the root", where)
        return module  # not a DistributedDataParallel: its __init__ does not run

    ddp_class.__new__ = staticmethod(__new__)


def _sync_last_micro_batch(run: KnobHost, ddp) -> None:
    """With gradient accumulation, DDP all-reduces only in the last micro-batch's backward
    (what ``with model.no_sync():`` does for the others)."""
    forward = ddp.forward

    def forward_with_sync_choice(*args: Any, **kwargs: Any) -> Any:
        if run.micro_batches > 1:
            ddp.require_backward_grad_sync = run.sync_this_backward()
        return forward(*args, **kwargs)

    ddp.forward = forward_with_sync_choice
