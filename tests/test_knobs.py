"""The knob registry (diagnosis/knobs.py): every fact of a knob in one declaration, every
consumer reading it, and a knob added in one place applied, searched, patched and checked."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from torchtriage.capture import knob_apply
from torchtriage.diagnosis import knobs as registry
from torchtriage.diagnosis.catalog import BY_ID, CATALOG
from torchtriage.errors import TorchtriageError
from torchtriage.fix import ladder
from torchtriage.fix.candidates import Context, met, search_for
from torchtriage.fix.patch import make_patch
from torchtriage.results.run import KnobOutcome
from torchtriage.verify.parity import precision_of

REPO = Path(__file__).resolve().parents[1]

LOADER_SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data,
                    batch_size=8)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""


# (a) the registry and the catalog agree


def test_every_prescription_and_rung_a_knob_serves_is_in_the_catalog():
    for k in registry.KNOBS:
        for s in k.serves:
            assert s.prescription in BY_ID, (k.id, s.prescription)
        for r in k.rungs:
            assert r.prescription in BY_ID and BY_ID[r.prescription].layer == "memory", r
    for pid in (*registry.NOT_INJECTED, *registry.CODE_CHANGES):
        assert pid in BY_ID, pid


def test_every_catalog_prescription_is_served_or_never_injected():
    served = {s.prescription for k in registry.KNOBS for s in k.serves}
    rungs = set(registry.rungs())
    never = set(registry.NOT_INJECTED) | set(registry.CODE_CHANGES)
    for r in CATALOG:
        covered = (rungs | never) if r.layer == "memory" else (served | never)
        assert r.id in covered, f"{r.id}: no knob serves it and it is not listed as never " \
                                "injected"
        assert not (r.id in served | rungs and r.id in never), r.id
    # one knob per prescription, and every knob a search or a fallback names exists
    ids = [s.prescription for k in registry.KNOBS for s in k.serves]
    assert len(ids) == len(set(ids))
    for k in registry.KNOBS:
        for s in k.serves:
            for other in (*(i for i, _ in s.extra), *([s.fallback] if s.fallback else [])):
                assert registry.knob(other) is not None, (k.id, other)


def test_the_ladder_is_the_memory_prescriptions_in_cost_order():
    assert ladder.rungs() == (
        ("memory.grad_accumulation", ({"memory.grad_accumulation": 2},
                                      {"memory.grad_accumulation": 4})),
        ("memory.activation_checkpointing", ({"memory.activation_checkpointing": True},)),
        ("memory.bf16", ({"amp.bf16": True},)),
        ("memory.fsdp", ({"memory.fsdp": True},)),  # under DDP: shards in its place
    )
    costs = [BY_ID[p].cost for p, _ in ladder.rungs()]
    assert costs == sorted(costs)


def test_a_prescription_naming_a_missing_knob_fails(monkeypatch):
    # drop the knob that serves dataloader.pin_memory: the coverage check must notice
    monkeypatch.setattr(registry, "KNOBS", tuple(k for k in registry.KNOBS
                                                 if k.id != "dataloader.pin_memory"))
    with pytest.raises(AssertionError, match=r"dataloader\.pin_memory"):
        test_every_catalog_prescription_is_served_or_never_injected()


# (b) every knob is complete, every site has an installer


def _check_complete(k: registry.Knob) -> None:
    assert k.id and "." in k.id and k.help, k
    assert k.kind in get_args(registry.Kind), k.id
    assert k.site in registry.SITES, k.id
    assert all(s in registry.SITES for s in k.also), k.id
    assert k.not_reached, k.id
    assert k.numerics in registry.NUMERICS_ORDER, k.id
    assert isinstance(k.recipe, registry.Recipe), k.id
    assert k.recipe.how in get_args(registry.RecipeHow), k.id
    if k.recipe.how == "call":
        assert k.keyword, f"{k.id}: a call recipe needs the keyword it sets"
        assert k.recipe.callees or k.site == "optimizer", k.id
    else:
        assert k.recipe.lines and all(k.recipe.lines), k.id
    if k.kind == "choice":
        assert k.choices, k.id
    else:
        assert not k.choices, k.id
    if k.kind == "int":
        assert k.minimum is not None, k.id
    for s in k.serves:
        assert s.prescription and (s.values or s.rule), (k.id, s)
        assert s.needs is None or s.needs in registry.CONDITION_WHY, (k.id, s)
    for r in k.rungs:
        assert r.prescription and r.values, (k.id, r)


def test_every_knob_has_every_fact():
    ids = [k.id for k in registry.KNOBS]
    assert len(ids) == len(set(ids))
    for k in registry.KNOBS:
        _check_complete(k)


def test_an_incomplete_knob_fails_the_check():
    good = registry.knob("dataloader.num_workers")
    for broken in (dataclasses.replace(good, not_reached=""),
                   dataclasses.replace(good, site="nowhere"),
                   dataclasses.replace(good, numerics="approximate"),
                   dataclasses.replace(good, keyword=None),
                   dataclasses.replace(good, recipe=registry.by_hand(""))):
        with pytest.raises(AssertionError):
            _check_complete(broken)


def test_every_site_has_an_installer_and_every_condition_a_check():
    assert set(knob_apply.INSTALLERS) == set(registry.SITES)
    assert set(registry.CONDITION_WHY) == set(get_args(registry.Condition))
    # each condition reads the context: it differs between a bare CPU job and one that has
    # every fact (a GPU, workers kept, DDP, a multi-tensor optimizer)
    bare = Context(gpu=False, cores=2, kept={})
    full = Context(gpu=True, cores=2, kept={"dataloader.num_workers": 2}, distributed=True,
                   multi_tensor_optimizer=True)
    for condition in get_args(registry.Condition):
        assert met(condition, bare) != met(condition, full), condition
    for rule in get_args(registry.ValueRule):
        assert registry.search_values(registry.Serves("x", rule=rule), cores=2, nccl=False)


def test_today_s_facts_are_kept():
    ctx = Context(gpu=True, cores=4, kept={})
    assert search_for("dataloader.num_workers", ctx).values == (2, 4, 8)
    assert search_for("dataloader.num_workers", Context(False, 1, {})).values == (2, 4)
    pin = search_for("dataloader.pin_memory", ctx)
    assert pin.values == (True,) and pin.extra == {"h2d.non_blocking": True}
    assert search_for("dataloader.pin_memory", Context(False, 1, {})).why_not
    assert "workers" in search_for("dataloader.prefetch_factor", ctx).why_not
    assert search_for("dataloader.prefetch_factor",
                      Context(True, 1, {"dataloader.num_workers": 2})).why_not is None
    assert search_for("compile.default", ctx).values == ("default", "reduce-overhead",
                                                         "max-autotune")
    fused = search_for("optimizer.fused", ctx)
    assert (fused.knob, fused.fallback.knob) == ("optimizer.fused", "optimizer.foreach")
    # an optimizer that already runs foreach kernels: foreach=True would change nothing
    multi = Context(True, 4, {}, multi_tensor_optimizer=True)
    assert search_for("optimizer.fused", multi).fallback is None
    assert search_for("ddp.comm_hook", Context(True, 1, {}, True, True)).values == ("bf16",)
    assert search_for("ddp.comm_hook", Context(True, 1, {}, True, False)).values == ("fp16",)
    assert "DistributedDataParallel" in search_for("ddp.bucket_cap", ctx).why_not
    assert search_for("sync.remove", ctx) is None and search_for("memory.fsdp", ctx) is None
    assert precision_of({"amp.bf16": True, "matmul.tf32": True})[0] == "low"
    assert precision_of({"matmul.tf32": True, "compile.mode": "default"})[0] == "tf32"
    assert precision_of({"compile.mode": "none", "amp.bf16": False})[0] == "fp32"
    assert precision_of({"ddp.comm_hook": "fp16"})[0] == "low"
    assert precision_of({"compile.mode": "max-autotune"})[0] == "compiled"
    assert registry.warmup_for("compile.mode") == 5
    assert registry.not_reached("dataloader.pin_memory") == "no DataLoader was built"
    assert registry.not_reached("matmul.tf32") == "nothing it changes was reached"
    with pytest.raises(TorchtriageError, match="must be >= 1, got 0"):
        registry.parse_knobs(["memory.grad_accumulation=0"])
    with pytest.raises(TorchtriageError, match="takes one of none, bf16, fp16"):
        registry.parse_knobs(["ddp.comm_hook=int8"])


# (c) a knob added in one place


DROP_LAST = registry.Knob(
    "dataloader.drop_last", "bool", "DataLoader(drop_last=...)", "dataloader",
    "no DataLoader was built", registry.call("DataLoader"), keyword="drop_last",
    numerics="low", exact_for=(False,),  # pretend: so that parity shows it was read
    serves=(registry.Serves("dataloader.num_workers", (True,)),))


class FakeRun:
    """What knob_apply's installers use of the bootstrap's run object."""

    def __init__(self, knobs):
        self.knobs = knobs
        self.notes = []
        self.micro_batches = 1

    def note(self, knob, applied, detail, where=None):
        self.notes.append((knob, applied, detail, where))

    def sync_this_backward(self):
        return True


def test_a_knob_declared_once_is_parsed_searched_patched_checked_and_applied(
        monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    # it serves dataloader.num_workers in this registry (one knob per prescription)
    others = tuple(k if k.id != "dataloader.num_workers" else dataclasses.replace(k, serves=())
                   for k in registry.KNOBS)
    monkeypatch.setattr(registry, "KNOBS", (*others, DROP_LAST))
    _check_complete(DROP_LAST)
    # parsed
    assert registry.parse_knobs(["dataloader.drop_last=yes"]) == {"dataloader.drop_last": True}
    # searched
    search = search_for("dataloader.num_workers", Context(gpu=False, cores=2, kept={}))
    assert (search.knob, search.values, search.why_not) == ("dataloader.drop_last", (True,),
                                                            None)
    # patched, at a recorded call site
    script = tmp_path / "train.py"
    script.write_text(LOADER_SCRIPT)
    where = f"{script}:7"  # inside the two-line DataLoader(...) call
    patch = make_patch({"dataloader.drop_last": True},
                       {"dataloader.drop_last": KnobOutcome(value=True, applied=True, count=1,
                                                            detail="...", where=[where])},
                       ["python", "train.py"], tmp_path)
    assert "+                    batch_size=8, drop_last=True)" in patch.diff, patch.diff
    assert patch.files == ["train.py"] and not patch.instructions
    # parity-checked with its numerics
    assert precision_of({"dataloader.drop_last": True})[0] == "low"
    assert precision_of({"dataloader.drop_last": False})[0] == "fp32"
    # applied, in process: the DataLoader installer sets the keyword and notes it
    monkeypatch.setattr(DataLoader, "__init__", DataLoader.__init__)  # restored afterwards
    run = FakeRun({"dataloader.drop_last": True})
    knob_apply.apply_global(run)
    loader = DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=4)
    assert loader.drop_last is True and len(loader) == 2
    ((knob, applied, detail, at),) = run.notes
    assert (knob, applied) == ("dataloader.drop_last", True)
    assert "drop_last=True" in detail and at and at.startswith(__file__)


def test_a_registry_knob_is_applied_in_a_real_process(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LOADER_SCRIPT)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torchtriage", "run", "--out", str(out),
                           "--steps", "8", "--knob", "dataloader.num_workers=1",
                           "--knob", "memory.grad_accumulation=1", "--",
                           "python", str(script)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    knobs = json.loads((out / "run.rank0.json").read_text())["knobs"]
    workers = knobs["dataloader.num_workers"]
    assert workers["applied"] and "num_workers=1" in workers["detail"], workers
    assert workers["where"] in ([f"{script}:6"], [f"{script}:7"])  # the DataLoader call
    assert knobs["memory.grad_accumulation"]["detail"] == \
        "1 micro-batch per step: batches unchanged"


def test_accumulation_takes_the_next_count_that_divides_the_batch(monkeypatch):
    """30 samples do not split into 4 micro-batches: 5 of 6 keep the optimizer step's batch,
    and the optimizer then steps once per 5 calls with the gradient of the whole 30."""
    import torch
    from torch.optim import lr_scheduler
    from torch.utils.data import DataLoader, TensorDataset

    from torchtriage.capture import knob_apply

    for owner, name in ((DataLoader, "__init__"), (torch.optim.Optimizer, "__init__"),
                        (torch.nn.Module, "zero_grad"), (lr_scheduler.LRScheduler, "step")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored afterwards
    run = FakeRun({"memory.grad_accumulation": 4})
    knob_apply.apply_global(run)
    torch.manual_seed(0)
    x, y = torch.randn(30, 3), torch.randn(30, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=30)
    assert loader.batch_size == 6 and run.micro_batches == 5
    assert any(applied and "5 micro-batches" in detail for _, applied, detail, _ in run.notes)
    model = torch.nn.Linear(3, 1)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for calls, (xb, yb) in enumerate(loader, 1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        assert torch.equal(model.weight, reference.weight) == (calls < 5)
    full = torch.nn.functional.mse_loss(reference(x), y)
    full.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    assert torch.allclose(model.weight, reference.weight, atol=1e-6)


def test_fix_only_names_prescriptions_or_knobs_and_reaches_the_ladder():
    """``fix --only`` takes a prescription a knob serves, a memory rung, or a knob's id (all
    that knob serves); anything else names nothing. The ladder passes over the rungs it does
    not allow."""
    assert registry.tryable("dataloader.num_workers") == ("dataloader.num_workers",)
    assert registry.tryable("memory.fsdp") == ("memory.fsdp",)
    assert set(registry.tryable("compile.mode")) == {
        s.prescription for s in registry.knob("compile.mode").serves}
    assert "memory.bf16" in registry.tryable("amp.bf16")
    assert registry.tryable("kernel.custom") == () and registry.tryable("nope") == ()
    names = registry.tryable_names()
    assert all(registry.tryable(n) for n in names) and "compile.default" in names
    assert registry.tryable("optimizer.foreach") == ("optimizer.fused",)  # its fallback
    for knob in registry.KNOBS:  # a knob can be asked for by its id when fix can try it
        reaches = knob.serves or knob.rungs or any(
            s.fallback == knob.id for k in registry.KNOBS for s in k.serves)
        assert bool(registry.tryable(knob.id)) == bool(reaches), knob.id

    from types import SimpleNamespace

    def diagnosis(primary: str, peak: float):
        return SimpleNamespace(primary=primary, memory=[SimpleNamespace(peak_fraction=peak)],
                               breakdown=SimpleNamespace(median_step_ms=10.0))

    tried = []

    def profile(knobs, label, *, seed_offset=0):
        tried.append(label)
        return diagnosis("kernel", 0.6), [1.0, 0.9], False, {}

    steps, kept, _ = ladder.climb(profile, {}, 0, diagnosis("memory", 0.95), [1.0, 0.9],
                                  allows=lambda rung: rung == "memory.activation_checkpointing")
    assert [s.prescription for s in steps] == ["memory.activation_checkpointing"], steps
    assert kept == {"memory.activation_checkpointing": True}
    assert tried == ["memory.activation_checkpointing=True"]
