"""The knob registry: every fact about a knob, in one declaration.

A knob is a setting that ``torchtriage run --knob ID=VALUE`` (and ``ab`` and ``fix``) applies to
an unmodified training script. Each :class:`Knob` below says

* what it takes (``kind``: bool, int with a ``minimum``, or one of ``choices``) and its ``help``
  (``torchtriage knobs`` lists them; :func:`parse_knobs` checks ``--knob`` values);
* where it applies in the training process (``site``, a :data:`Site`; ``keyword``: the keyword
  argument it sets there, where it is one), which other sites it patches too (``also``), the
  values with which it changes nothing (``inert``: its sites are not patched for them) and what
  is noted for such a value (``inert_note``); :mod:`torchtriage.capture.knob_apply` has one
  installer per site;
* what its outcome says when the script never reached that site (``not_reached``);
* how a kept value becomes permanent (``recipe``: a keyword on named calls, statements after
  the imports, or instructions by hand; :mod:`torchtriage.fix.patch`);
* what it does to numerics (``numerics`` for every value not in ``exact_for``), which sets the
  parity tolerance (:mod:`torchtriage.verify.parity`), and whether it moves the Dataset's random
  draws into differently seeded worker streams (``reseeds_workers``: parity then compares with
  the spread of candidate trials run under different worker seeds);
* the extra warm-up steps A/B trials need with it (``warmup``; :mod:`torchtriage.verify.ab`);
* the prescriptions it serves (``serves``: the values the fix loop tries, in order, or a
  computed rule; what the search needs; knobs that go with every value; a fallback knob;
  :mod:`torchtriage.fix.candidates`) and the memory-ladder rungs it injects (``rungs``;
  :mod:`torchtriage.fix.ladder`).

Adding a knob is one entry in :data:`KNOBS` (plus, for a new site, one installer in
``knob_apply``); ``tests/test_knobs.py`` fails when an entry lacks a fact, names a prescription
the catalog does not have, or leaves a catalog prescription unaccounted for. Prescriptions that
are never injected are listed here too: :data:`NOT_INJECTED` (with why) and
:data:`CODE_CHANGES` (reported with their catalog code).

Consumers read :data:`KNOBS` through :func:`by_id` / :func:`knob` at call time, so a test may
replace the tuple (``monkeypatch.setattr(registry, "KNOBS", registry.with_knob(extra))``).
This module imports nothing above the foundation and never torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from torchtriage.errors import TorchtriageError

# Where a knob applies in the training process (one installer per site in capture/knob_apply).
Site = Literal["backend", "compile_call", "dataloader", "micro_batches", "optimizer",
               "root_module", "h2d_copy", "ddp", "fully_shard"]
SITES: tuple[Site, ...] = get_args(Site)  # also the order in which installers run
Kind = Literal["bool", "int", "choice"]
# What a knob does to numerics, from none to most (parity's tolerance follows the loosest).
Numerics = Literal["exact", "compiled", "tf32", "low"]
NUMERICS_ORDER: tuple[Numerics, ...] = get_args(Numerics)
# What a search needs before it applies (fix loop); why it is skipped otherwise.
Condition = Literal["gpu", "workers", "distributed", "per_parameter_optimizer"]
CONDITION_WHY: dict[Condition, str] = {
    "gpu": "applies to CUDA jobs only",
    "workers": "needs DataLoader workers (the script's own, or dataloader.num_workers kept "
               "first)",
    "distributed": "needs a DistributedDataParallel job",
    "per_parameter_optimizer": "the optimizer already runs multi-tensor (foreach) kernels",
}
# Search values computed from the machine: "workers": 2, 4, 8, ... up to max(4, 2 x cores)
# (I/O-bound loading hides latency beyond the core count); "comm_hook": bf16 with NCCL, else
# fp16.
ValueRule = Literal["workers", "comm_hook"]
RecipeHow = Literal["call", "statements", "by_hand"]
NOT_REACHED_DEFAULT = "nothing it changes was reached"


@dataclass(frozen=True)
class Recipe:
    """How a kept value becomes a change of the user's code."""

    how: RecipeHow
    # call: the callee names whose keyword (the knob's) is set; () = the optimizer class that
    # the knob's outcome names ("SGD(fused=True) at ...")
    callees: tuple[str, ...] = ()
    # statements: lines after the last top-level import ({v}: the value); by_hand: one text
    # ({value}: the value, {mode}: ", mode='...'" unless the value is "default" or True)
    lines: tuple[str, ...] = ()


def call(*callees: str) -> Recipe:
    return Recipe("call", callees)


def statements(*lines: str) -> Recipe:
    return Recipe("statements", lines=lines)


def by_hand(text: str) -> Recipe:
    return Recipe("by_hand", lines=(text,))


@dataclass(frozen=True)
class Serves:
    """A prescription the fix loop injects with this knob: the values it tries, in order."""

    prescription: str
    values: tuple[Any, ...] = ()
    rule: ValueRule | None = None  # computed values instead of ``values``
    needs: Condition | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # knobs that go with every value
    fallback: str | None = None  # knob tried with the same values when this one keeps nothing
    fallback_needs: Condition | None = None  # the fallback is tried only where this holds


@dataclass(frozen=True)
class Rung:
    """A memory-ladder rung this knob injects: its settings, tried in order."""

    prescription: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Knob:
    id: str
    kind: Kind
    help: str
    site: Site
    not_reached: str
    recipe: Recipe
    keyword: str | None = None  # the keyword argument it sets at its site, where it is one
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    also: tuple[Site, ...] = ()  # other sites it patches (unless inert)
    inert: tuple[Any, ...] = ()  # values that change nothing: its sites are not patched
    inert_note: str | None = None  # noted (applied) for an inert value; None: nothing noted
    numerics: Numerics = "exact"
    exact_for: tuple[Any, ...] = ()  # values with exact numerics whatever ``numerics`` says
    warmup: int = 0  # extra warm-up steps A/B trials need with it on (not in exact_for/inert)
    # a value not in ``inert`` changes which worker process (seeded base_seed + worker id)
    # draws each sample's random numbers: a seeded script's augmentation changes, not its math
    reseeds_workers: bool = False
    serves: tuple[Serves, ...] = field(default=())
    rungs: tuple[Rung, ...] = field(default=())

    def numerics_for(self, value: Any) -> Numerics:
        return "exact" if value_in(value, self.exact_for) else self.numerics


def value_in(value: Any, values: tuple[Any, ...]) -> bool:
    """``value in values`` without True == 1."""
    return any(type(value) is type(v) and value == v for v in values)


_DATALOADER = "no DataLoader was built"
_OPTIMIZER = "no torch.optim optimizer was built"
_DDP = "no DistributedDataParallel module was built"
_CALLED_TWICE = "no module with parameters was called twice"
_DDP_CALL = ("DistributedDataParallel", "DDP")
_FULLY_SHARD = "no fully_shard call was made (FSDP2)"

KNOBS: tuple[Knob, ...] = (
    Knob("dataloader.num_workers", "int", "DataLoader(num_workers=N) for every DataLoader",
         "dataloader", _DATALOADER, call("DataLoader"), keyword="num_workers", minimum=0,
         reseeds_workers=True, serves=(Serves("dataloader.num_workers", rule="workers"),)),
    Knob("dataloader.pin_memory", "bool", "DataLoader(pin_memory=...)",
         "dataloader", _DATALOADER, call("DataLoader"), keyword="pin_memory",
         serves=(Serves("dataloader.pin_memory", (True,), needs="gpu",
                        extra=(("h2d.non_blocking", True),)),)),
    Knob("dataloader.prefetch_factor", "int", "DataLoader(prefetch_factor=N) (needs workers)",
         "dataloader", _DATALOADER, call("DataLoader"), keyword="prefetch_factor", minimum=1,
         serves=(Serves("dataloader.prefetch_factor", (4, 8), needs="workers"),)),
    Knob("dataloader.persistent_workers", "bool",
         "DataLoader(persistent_workers=...) (needs workers)",
         "dataloader", _DATALOADER, call("DataLoader"), keyword="persistent_workers",
         reseeds_workers=True,  # from the second epoch on: workers keep their streams
         serves=(Serves("dataloader.persistent_workers", (True,), needs="workers"),)),
    Knob("h2d.non_blocking", "bool",
         "Tensor.to(cuda) of a pinned CPU tensor becomes non_blocking=True",
         "h2d_copy", "no pinned CPU tensor was copied to the GPU",
         by_hand("copy pinned batches with `.to(device, non_blocking=True)`"),
         keyword="non_blocking", inert=(False,),
         serves=(Serves("h2d.non_blocking", (True,), needs="gpu"),)),
    Knob("matmul.tf32", "bool", "torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32",
         "backend", NOT_REACHED_DEFAULT,
         statements("torch.backends.cuda.matmul.allow_tf32 = {v}",
                    "torch.backends.cudnn.allow_tf32 = {v}"),
         numerics="tf32", exact_for=(False,),
         serves=(Serves("matmul.tf32", (True,), needs="gpu"),)),
    Knob("cudnn.benchmark", "bool", "torch.backends.cudnn.benchmark",
         "backend", NOT_REACHED_DEFAULT,
         statements("torch.backends.cudnn.benchmark = {v}")),
    Knob("amp.bf16", "bool",
         "bf16 autocast from each top-level model call to the next backward (forward and loss)",
         "root_module", _CALLED_TWICE,
         by_hand("run the forward pass and the loss under bf16 autocast: "
                 "`with torch.autocast(device_type=device.type, dtype=torch.bfloat16): "
                 "loss = loss_fn(model(x), y)`"),
         numerics="low", exact_for=(False,),
         serves=(Serves("amp.bf16", (True,)),),
         rungs=(Rung("memory.bf16", (True,)),)),
    Knob("compile.mode", "choice", "torch.compile the root module's forward, in place",
         "root_module", _CALLED_TWICE,
         by_hand("compile the model once it is built: `model = torch.compile(model{mode})`"),
         choices=("none", "default", "reduce-overhead", "max-autotune"), inert=("none",),
         numerics="compiled", exact_for=("none",),
         # compiles on the root module's 2nd call; CUDA graphs record later
         warmup=5,
         serves=(Serves("compile.reduce_overhead", ("reduce-overhead",), needs="gpu"),
                 # compile modes in order of compile cost
                 Serves("compile.default", ("default", "reduce-overhead", "max-autotune")),
                 Serves("compile.max_autotune", ("max-autotune",)))),
    Knob("compile.dynamic", "bool",
         "torch.compile(..., dynamic=True) for the script's torch.compile calls (and "
         "Module.compile(), and compile.mode's)",
         "compile_call", "torch.compile was never called", call("compile"), keyword="dynamic",
         inert=(False,), numerics="compiled", exact_for=(False,), warmup=5,
         serves=(Serves("compile.dynamic", (True,)),)),
    Knob("dynamo.recompile_limit", "int",
         "torch._dynamo.config.recompile_limit (frames recompiled more often run eager)",
         "backend", NOT_REACHED_DEFAULT,
         statements("torch._dynamo.config.recompile_limit = {v}"), minimum=1, warmup=5,
         # frames past the limit run eager: a higher one compiles steps that ran eager
         numerics="compiled",
         serves=(Serves("compile.recompile_limit", (64,)),)),
    Knob("optimizer.fused", "bool", "optimizers built with fused=True where supported",
         "optimizer", _OPTIMIZER, call(), keyword="fused",
         # fused kernels first; the multi-tensor (foreach) path where fused is not faster
         serves=(Serves("optimizer.fused", (True,), fallback="optimizer.foreach",
                        fallback_needs="per_parameter_optimizer"),)),
    Knob("optimizer.foreach", "bool", "optimizers built with foreach=True",
         "optimizer", _OPTIMIZER, call(), keyword="foreach"),
    Knob("memory.grad_accumulation", "int",
         "split each DataLoader batch into N micro-batches; the optimizer steps every N-th "
         "backward (same effective batch; DDP all-reduces in the last one)",
         "micro_batches", "no DataLoader was built (its batches are what it splits)",
         by_hand("divide the DataLoader's batch_size by {value} and accumulate: "
                 "call `(loss / {value}).backward()` every micro-batch, "
                 "`optimizer.step()` and `optimizer.zero_grad()` every {value}-th "
                 "(under DDP, backward in `with model.no_sync():` for the others)"),
         minimum=1, also=("dataloader", "ddp"), inert=(1,),
         inert_note="1 micro-batch per step: batches unchanged",
         reseeds_workers=True,  # with workers, each micro-batch goes to another worker
         rungs=(Rung("memory.grad_accumulation", (2, 4)),)),
    Knob("memory.activation_checkpointing", "bool",
         "checkpoint each block of the root module's largest run of repeated blocks",
         "root_module", "no module with parameters was called",
         by_hand("run each repeated block under `torch.utils.checkpoint.checkpoint(block, x, "
                 "use_reentrant=False)`"),
         inert=(False,),
         rungs=(Rung("memory.activation_checkpointing", (True,)),)),
    Knob("ddp.bucket_cap_mb", "int", "DistributedDataParallel(bucket_cap_mb=N)",
         "ddp", _DDP, call(*_DDP_CALL), keyword="bucket_cap_mb", minimum=1,
         serves=(Serves("ddp.bucket_cap", (50, 100, 200), needs="distributed"),)),
    Knob("ddp.gradient_as_bucket_view", "bool",
         "DistributedDataParallel(gradient_as_bucket_view=...)",
         "ddp", _DDP, call(*_DDP_CALL), keyword="gradient_as_bucket_view"),
    Knob("ddp.static_graph", "bool", "DistributedDataParallel(static_graph=...)",
         "ddp", _DDP, call(*_DDP_CALL), keyword="static_graph",
         serves=(Serves("ddp.static_graph", (True,), needs="distributed"),)),
    Knob("ddp.comm_hook", "choice", "register a DDP communication hook",
         "ddp", _DDP,
         by_hand("after wrapping in DDP: `from torch.distributed.algorithms.ddp_comm_hooks "
                 "import default_hooks; ddp_model.register_comm_hook(None, "
                 "default_hooks.{value}_compress_hook)`"),
         choices=("none", "bf16", "fp16"), numerics="low", exact_for=("none",),
         serves=(Serves("ddp.comm_hook", rule="comm_hook", needs="distributed"),)),
    Knob("memory.fsdp", "bool",
         "DistributedDataParallel(model) becomes FSDP2: fully_shard on each of the model's "
         "repeated blocks, then on the root",
         "ddp", _DDP,
         by_hand("shard instead of DDP: replace `DistributedDataParallel(model)` by "
                 "`for block in <the model's repeated blocks>: fully_shard(block)` and "
                 "`fully_shard(model)` (from torch.distributed.fsdp), and build the optimizer "
                 "after it, over `model.parameters()`"),
         inert=(False,),
         rungs=(Rung("memory.fsdp", (True,)),)),
    Knob("fsdp.reshard_after_forward", "bool",
         "fully_shard(reshard_after_forward=...) for every fully_shard call (FSDP2)",
         "fully_shard", _FULLY_SHARD, call("fully_shard"), keyword="reshard_after_forward",
         serves=(Serves("fsdp.reshard_after_forward", (False,)),)),
    Knob("fsdp.mixed_precision", "choice",
         "fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)) "
         "where the call sets none (FSDP2)",
         "fully_shard", _FULLY_SHARD,
         by_hand("pass `mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                 "reduce_dtype=torch.float32)` to every fully_shard call"),
         keyword="mp_policy", choices=("none", "bf16"), inert=("none",), numerics="low",
         exact_for=("none",), serves=(Serves("fsdp.mixed_precision", ("bf16",)),)),
)

# prescriptions the fix loop never injects, and why
NOT_INJECTED: dict[str, str] = {
    "ddp.grad_accumulation": "changes the effective batch (k times the samples per optimizer "
                             "step), a training decision the loop does not make for you: "
                             "`with model.no_sync(): loss.backward()` for k-1 of every k "
                             "micro-batches",
    "memory.expandable_segments": "an allocator setting the process reads before CUDA starts, "
                                  "which the loop does not set for you: run the job with "
                                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
}
# prescriptions that need a code change: reported with their catalog code (memory ones as
# rungs of the memory ladder)
# (sync.remove's code is the diagnosis's, for the kind of sync it found: a scalar read, a copy,
# a data-dependent shape, torch.cuda.synchronize())
CODE_CHANGES: tuple[str, ...] = ("sync.remove", "kernel.custom", "fsdp.prefetch",
                                 "fsdp.wrap_granularity", "memory.fix_leak",
                                 "compile.pad_buckets", "compile.remove_graph_break",
                                 "eval.interval", "checkpoint.async")


def reseeds_workers(knobs: Mapping[str, Any]) -> bool:
    """Whether any of these knobs (at these values) moves the Dataset's random draws into
    differently seeded DataLoader worker streams (:attr:`Knob.reseeds_workers`)."""
    table = by_id()
    return any(k in table and table[k].reseeds_workers and not value_in(v, table[k].inert)
               for k, v in knobs.items())


def with_knob(extra: Knob) -> tuple[Knob, ...]:
    """The registry with one more knob (for tests: replace :data:`KNOBS` with it)."""
    return (*KNOBS, extra)


def by_id() -> dict[str, Knob]:
    return {k.id: k for k in KNOBS}


def knob(knob_id: str) -> Knob | None:
    return next((k for k in KNOBS if k.id == knob_id), None)


def served(prescription: str) -> tuple[Knob, Serves] | None:
    """The knob that serves an injectable prescription and how (None: not injectable)."""
    for k in KNOBS:
        for s in k.serves:
            if s.prescription == prescription:
                return k, s
    return None


def rungs() -> dict[str, tuple[Knob, Rung]]:
    """Memory-ladder rung (prescription id) -> the knob that injects it."""
    return {r.prescription: (k, r) for k in KNOBS for r in k.rungs}


def tryable(name: str) -> tuple[str, ...]:
    """The prescriptions ``fix`` can try that ``name`` names (``fix --only``): the name itself
    when a knob serves it or injects it as a memory rung, and every prescription and rung of
    the knob of that id (``compile.mode`` -> compile.default, compile.max_autotune, ...;
    ``amp.bf16`` -> amp.bf16, memory.bf16), or that it is the fallback of
    (``optimizer.foreach`` -> optimizer.fused); empty when it names none (a knob that only
    ``ab`` and ``run --knob`` set, such as ``cudnn.benchmark``)."""
    own = [name] if served(name) is not None or name in rungs() else []
    found = knob(name)
    if found is not None:
        own += [s.prescription for s in found.serves] + [r.prescription for r in found.rungs]
        own += [s.prescription for k in KNOBS for s in k.serves if s.fallback == name]
    return tuple(dict.fromkeys(own))


def tryable_names() -> tuple[str, ...]:
    """Every name :func:`tryable` knows: the prescriptions a knob serves or injects, and the
    ids of the knobs that serve or inject one."""
    return tuple(n for n in dict.fromkeys([s.prescription for k in KNOBS for s in k.serves]
                                          + list(rungs()) + [k.id for k in KNOBS])
                 if tryable(n))


def search_values(serves: Serves, *, cores: int, nccl: bool,
                  workers_hint: int | None = None) -> tuple[Any, ...]:
    """The values to try for a prescription, in order (rules computed from the machine).

    ``workers``: the number of workers the trace says hides loading (``workers_hint``, see
    :func:`workers_to_hide_loading`) first, at most one per core but one (CPU-bound loading,
    a Python tokenizer say, only loses to more workers than cores), then doubling; without a
    hint 2, 4, 8, ...; never beyond twice the cores (I/O-bound loading hides latency beyond
    the core count, which the doubling finds)."""
    if serves.rule == "workers":
        top = max(4, 2 * cores)
        n = min(max(workers_hint or 2, 2), max(cores - 1, 2))
        values = []
        while n <= top:
            values.append(n)
            n *= 2
        if values[-1] < top and values[0] != 2:  # the hint's doubling stops short of the top
            values.append(top)
        return tuple(values)
    if serves.rule == "comm_hook":
        return ("bf16",) if nccl else ("fp16",)
    return serves.values


def workers_to_hide_loading(loading_ms: float, step_ms: float, workers: int) -> int | None:
    """How many DataLoader workers hide loading, from one profiled window.

    With ``workers`` = 0 the training process loads each batch itself: a batch takes
    ``loading_ms`` to make and the rest of the step, ``step_ms - loading_ms``, is compute; w
    workers hide loading when one batch per compute time comes out of them: w = loading /
    compute. With ``workers`` > 0 and loading still exposed, the step is paced by the workers:
    each makes a batch in ``workers x step_ms``, so w = workers x step / compute. Rounded up
    and one more (the workers' own start and jitter). None without exposed loading."""
    compute = step_ms - loading_ms
    if loading_ms <= 0 or step_ms <= 0:
        return None
    compute = max(compute, 0.05 * step_ms)  # a step that is all loading: 20 workers at most
    per_batch = loading_ms if workers == 0 else workers * step_ms
    return int(-(-per_batch // compute)) + 1


def not_reached(knob_id: str) -> str:
    """What a knob's outcome says when the script never reached its site."""
    k = knob(knob_id)
    return k.not_reached if k is not None else NOT_REACHED_DEFAULT


def numerics_of(knobs: Mapping[str, Any]) -> Numerics:
    """The loosest numerics of a set of knobs (unknown ids count as exact)."""
    table = by_id()
    found = [table[i].numerics_for(v) for i, v in knobs.items() if i in table]
    return max(found, key=NUMERICS_ORDER.index, default="exact")


def warmup_for(knob_id: str) -> int:
    k = knob(knob_id)
    return k.warmup if k is not None else 0


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_knobs(items: list[str]) -> dict[str, Any]:
    """``["id=value", ...]`` -> ``{id: typed value}``; one-line TorchtriageError when invalid."""
    table = by_id()
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise TorchtriageError(f"knob {item!r} is not ID=VALUE")
        k = table.get(key)
        if k is None:
            raise TorchtriageError(
                f"unknown knob {key!r}; known knobs: {', '.join(sorted(table))}")
        out[key] = _value(k, raw)
    return out


def _value(k: Knob, raw: str) -> Any:
    if k.kind == "bool":
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise TorchtriageError(f"knob {k.id} takes true or false, got {raw!r}")
    if k.kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise TorchtriageError(f"knob {k.id} takes an integer, got {raw!r}") from None
        if k.minimum is not None and value < k.minimum:
            raise TorchtriageError(f"knob {k.id} must be >= {k.minimum}, got {value}")
        return value
    if raw not in k.choices:
        raise TorchtriageError(f"knob {k.id} takes one of {', '.join(k.choices)}, "
                               f"got {raw!r}")
    return raw
