"""The rules as objects: one protocol, one tuple, and every piece a rule needs.

Adding a rule is one entry in ``rules.RULES``; these tests fail when a rule lacks its layer, its
docstring (the algorithm), a declaration of the remedies it may return or the thresholds it
compares against, or when it returns a remedy or a threshold it did not declare.
"""

from __future__ import annotations

import inspect

import pytest
from conftest import profiler_steps as _steps
from conftest import write_trace, x

from torchtriage.diagnosis import rules
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID, CATALOG
from torchtriage.diagnosis.diagnose import build_facts, diagnose
from torchtriage.diagnosis.result import Finding
from torchtriage.diagnosis.vocabulary import LAYERS
from torchtriage.trace import load_trace


def test_every_layer_has_a_rule_and_every_rule_a_layer():
    assert {r.layer for r in rules.RULES} == set(LAYERS)
    for rule in rules.RULES:
        assert isinstance(rule, rules.Rule), f"{rule!r} lacks a piece of the Rule protocol"


def test_every_rule_states_its_algorithm():
    for rule in rules.RULES:
        doc = inspect.getdoc(type(rule)) or ""
        assert len(doc) > 60, f"{type(rule).__name__}: no docstring stating the algorithm"


def test_declared_remedies_are_the_catalog_of_their_layer():
    declared = [p for r in rules.RULES for p in r.prescribes]
    # a remedy may answer two rules' evidence (persistent workers: the window's loader waits and
    # the run's restart stalls), never of two layers
    by_id: dict[str, set[str]] = {}
    for rule in rules.RULES:
        for pid in rule.prescribes:
            by_id.setdefault(pid, set()).add(rule.layer)
    assert all(len(layers) == 1 for layers in by_id.values()), by_id
    for rule in rules.RULES:
        for pid in rule.prescribes:
            assert pid in BY_ID, f"{type(rule).__name__} declares {pid}, not in the catalog"
            assert BY_ID[pid].layer == rule.layer
    # every catalog entry is reachable from some rule
    assert {r.id for r in CATALOG} == set(declared)


def test_declared_thresholds_are_documented_thresholds():
    for rule in rules.RULES:
        assert rule.thresholds, f"{type(rule).__name__} declares no threshold"
        for t in rule.thresholds:
            assert t in th.ALL, f"{type(rule).__name__}: {t.name} is not in thresholds.ALL"


_GPU = {"deviceProperties": [{"id": 0, "name": "H200", "computeMajor": 9,
                              "totalGlobalMem": 2**30}]}
TRACES = {
    "cpu_kernel": (lambda b: [x("aten::mm", b + 100, 9_000)], {}),
    "cpu_loader": (lambda b: [x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                                b, 8_000, cat="user_annotation"),
                              x("aten::mm", b + 8_100, 1_500)], {}),
    "cpu_gloo": (lambda b: [x("aten::mm", b, 3_000),
                            *[x("gloo:all_reduce", b + 3_000 + 1_500 * k, 1_500,
                                cat="user_annotation", tid=7) for k in range(4)]], {}),
    "gpu_host": (lambda b: [x("aten::item", b + 100, 5_000),
                            x("cudaStreamSynchronize", b + 200, 4_800, cat="cuda_runtime"),
                            x("Memcpy HtoD (Pageable -> Device)", b + 6_000, 500,
                              cat="gpu_memcpy", pid=0, tid=7),
                            x("sm90_xmma_gemm_f32", b + 7_000, 2_000, cat="kernel", pid=0,
                              tid=7)], _GPU),
    "gpu_kernel": (lambda b: [x("sm90_xmma_gemm_f32", b + 100, 6_000, cat="kernel", pid=0,
                                tid=7),
                              *[x("elementwise_kernel", b + 6_200 + 30 * k, 25, cat="kernel",
                                  pid=0, tid=7) for k in range(100)]], _GPU),
}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_rules_return_only_what_they_declare(tmp_path, name):
    body, top = TRACES[name]
    trace = load_trace(write_trace(tmp_path / "t.json", _steps(4, body), **top))
    machine = {"samples": 5, "cores": 2, "cpu_busy_mean": 0.97, "cpu_busy_per_core": [1, 0.94],
               "rss_max_bytes": 1, "child_processes": 0, "children_cpu_cores_mean": 0.0}
    for facts in (build_facts(trace), build_facts(trace, machine=machine, oom=True)):
        for rule in rules.RULES:
            verdict = rule.judge(facts)
            returned = {remedy.id for remedy, _ in verdict.remedies}
            returned |= {remedy.id for remedy, _, _ in verdict.withheld}
            for _, why, gates in verdict.withheld:  # every gate carries its threshold
                assert why and all(e.threshold is not None and e.source for e in gates)
            assert returned <= set(rule.prescribes), (type(rule).__name__, returned)
            assert all(reason for _, reason in verdict.remedies)
            sources = {t.source for t in rule.thresholds}
            evidence = [*verdict.evidence, *(e for f in verdict.findings for e in f.evidence)]
            for e in evidence:
                if e.threshold is not None:
                    assert e.source in sources, (type(rule).__name__, e.metric)


class _ExtraRule:
    """A test rule: one host finding whenever any step ran (to show one edit adds a rule)."""

    layer = "host"
    prescribes = ()
    thresholds = (th.HOST_SIGNIFICANT,)

    def judge(self, f: rules.Facts) -> rules.Verdict:
        return rules.Verdict(findings=[Finding(id="test.extra", severity="info", layer="host",
                                               message=f"{len(f.steps)} steps")])


def test_a_rule_added_to_the_tuple_is_run(tmp_path, monkeypatch):
    trace = load_trace(write_trace(tmp_path / "t.json", _steps(3, TRACES["cpu_kernel"][0])))
    assert "test.extra" not in {f.id for f in diagnose(trace).findings}
    monkeypatch.setattr(rules, "RULES", (*rules.RULES, _ExtraRule()))
    found = [f for f in diagnose(trace).findings if f.id == "test.extra"]
    assert [f.message for f in found] == ["3 steps"]


def _optimizer_trace(out, foreach: bool, forward_ops: int, optimizer: str = "Adam"):
    """A real torch.profiler window: 20 small parameters under ``optimizer`` (a torch.optim
    class name), a forward of ``forward_ops`` tiny element-wise ops (host-bound on any
    CPU). The collector is paused in the window: once, under the full suite, a stall inside
    Optimizer.step tripled the optimizer's share (0.115 against 0.036-0.038 alone), and a full
    collection of a test worker's large heap is the likely one."""
    import gc

    import torch

    import torchtriage

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(20)]
    opt = getattr(torch.optim, optimizer)(params, lr=1e-3, foreach=foreach)
    gc.collect()
    gc.disable()
    try:
        with torchtriage.profile(out, max_events=0, warmup=1, active=3, record_shapes=False,
                                 profile_memory=False) as prof:
            for _ in range(6):
                y = torch.randn(4)
                for _ in range(forward_ops):
                    y = y * 1.0001 + 0.0001
                sum((p * y).sum() for p in params).backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    finally:
        gc.enable()
    d = prof.diagnosis
    return d, {e.metric: e.value for e in d.layers["host"].evidence}


def test_fused_is_withheld_from_a_foreach_optimizer_that_takes_little_of_the_step(tmp_path):
    """An optimizer already on the multi-tensor path (aten::_foreach_* ops) that is a small
    share of a host-bound step: fused=True would gain little and foreach=True nothing, so
    the fused optimizer is withheld with that evidence; a per-parameter loop is still told to
    fuse first (one flag, and on a GPU its foreach fallback applies)."""
    d, ev = _optimizer_trace(tmp_path / "foreach", True, 2500)
    assert d.primary == "host" and ev["optimizer_multi_tensor_ops_per_step"] > 0
    assert ev["optimizer_share"] < th.FOREACH_OPTIMIZER_SHARE.value, ev
    assert "optimizer.fused" not in [p.id for p in d.prescriptions]
    (held,) = [w for w in d.withheld if w.id == "optimizer.fused"]
    assert "multi-tensor" in held.reason
    d, ev = _optimizer_trace(tmp_path / "loop", False, 10)
    assert ev["optimizer_multi_tensor_ops_per_step"] == 0
    assert d.prescriptions[0].id == "optimizer.fused"


def test_fused_is_withheld_from_a_per_parameter_optimizer_that_takes_little_of_the_step(
        tmp_path):
    """pytorch/examples' reinforce.py on CPU: Adam one parameter at a time (104 ops a step)
    at 3.6 % of the step was its first fix; fusing it saves at most that share."""
    d, ev = _optimizer_trace(tmp_path / "loop", False, 10000)  # share ~0.01
    assert d.primary == "host" and ev["optimizer_multi_tensor_ops_per_step"] == 0
    assert ev["optimizer_ops_per_step"] >= th.OPTIMIZER_OPS_PER_STEP.value, ev
    (held,) = [w for w in d.withheld if w.id == "optimizer.fused"]
    assert "one parameter at a time" in held.reason and "saves at most" in held.reason
    share = next(e for e in held.evidence if e.metric == "optimizer_share")
    assert share.value < th.PER_PARAMETER_OPTIMIZER_SHARE.value == share.threshold
    assert "optimizer.fused" not in [p.id for p in d.prescriptions]


def test_fused_is_prescribed_for_a_foreach_optimizer_that_takes_much_of_the_step(tmp_path):
    d, ev = _optimizer_trace(tmp_path / "foreach", True, 10)
    assert ev["optimizer_multi_tensor_ops_per_step"] > 0
    assert ev["optimizer_share"] >= th.FOREACH_OPTIMIZER_SHARE.value, ev
    assert "optimizer.fused" in [p.id for p in d.prescriptions]


def test_fused_is_withheld_from_an_optimizer_torch_cannot_fuse(tmp_path):
    """pytorch/examples' mnist steps Adadelta, which has no fused=True in torch and already
    runs foreach kernels: 'AdamW(..., fused=True)' was its first fix on an H200."""
    d, ev = _optimizer_trace(tmp_path / "adadelta", True, 10, optimizer="Adadelta")
    assert ev["optimizer_multi_tensor_ops_per_step"] > 0
    assert ev["optimizer_share"] >= th.FOREACH_OPTIMIZER_SHARE.value, ev
    assert "optimizer.fused" not in [p.id for p in d.prescriptions]
    (held,) = [w for w in d.withheld if w.id == "optimizer.fused"]
    assert held.reason.startswith("Adadelta has no fused implementation in torch"), held.reason


def test_every_kind_of_sync_has_words_and_a_fix():
    """The analysis's kinds of sync, the document's and the host rule's table are one list."""
    from typing import get_args

    from torchtriage.analysis import transfers
    from torchtriage.diagnosis import vocabulary
    from torchtriage.diagnosis.rules.host import SYNC_KINDS

    kinds = get_args(transfers.SyncKind)
    assert kinds == get_args(vocabulary.SyncKind) and set(kinds) == set(SYNC_KINDS)
