"""The terminal report a newcomer reads first (issue 17 item 7): evidence that stays whole at
80 columns, the rule that picked the primary layer beside the layer shares, and no "None" for
the rank of a single process."""

from __future__ import annotations

import re

import msgspec
import pytest
from conftest import profiler_steps as _steps
from conftest import write_trace, x

import torchtriage
from torchtriage.api import analyze
from torchtriage.demo import load_example
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.report.html import summary_html
from torchtriage.report.markdown import diagnosis_markdown
from torchtriage.report.render import render_text
from torchtriage.trace import load_trace

RESNET_NO_WORKERS = "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
WIDTHS = (80, 100, 120, 160)


@pytest.fixture(scope="module")
def demo_diagnosis(tmp_path_factory):
    """What `torchtriage demo` shows: the bundled data-starved example, profiled."""
    module = load_example("data_starved")
    with torchtriage.profile(tmp_path_factory.mktemp("demo")) as prof:
        module.train(8, on_step=prof.step)
    return prof.diagnosis


@pytest.fixture
def resnet(shared_traces):
    """A real trace where the smaller share wins: data_loading 35 % against kernel 55 %."""
    (d,) = analyze(shared_traces / RESNET_NO_WORKERS)
    return d


def _layer_section(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Where the step time goes" in line)
    end = next(i for i, line in enumerate(lines) if line.startswith("Step breakdown"))
    return lines[start:end]


def _assert_evidence_whole(d, width: int) -> None:
    section = _layer_section(render_text(d, width=width))
    assert not any("…" in line for line in section), "\n".join(section)
    assert all(len(line.rstrip()) <= width for line in section)
    for layer in d.layers.values():
        for e in layer.evidence[:3]:
            item = f"{e.metric}={e.value:g}" + (f" ({e.comparison} {e.threshold:g})"
                                                if e.fired and e.threshold is not None else "")
            # whole, on one line: neither cut with an ellipsis nor folded mid-word
            assert any(item in line for line in section), (item, "\n".join(section))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_demo_evidence_is_whole_at_every_width(demo_diagnosis, width):
    _assert_evidence_whole(demo_diagnosis, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_gpu_trace_evidence_is_whole_at_every_width(resnet, width):
    _assert_evidence_whole(resnet, width)


def test_evidence_is_a_column_when_wide_and_under_the_table_at_80(resnet):
    wide = _layer_section(render_text(resnet, width=160))
    assert re.search(r"layer\s+share\s+ms\s+evidence", wide[2])
    narrow = _layer_section(render_text(resnet, width=80))
    assert "evidence" not in narrow[2]
    assert any(line.strip() == "evidence" for line in narrow)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _named(t: th.Threshold) -> str:
    return f"{t.name} {t.value * 100:g}%"


def test_the_rule_line_says_why_a_smaller_share_wins(resnet):
    d = resnet
    assert d.primary == "data_loading"
    assert d.layers["data_loading"].share < d.layers["kernel"].share
    rule = d.primary_rule
    assert rule is not None and rule.rule == "largest_significant"
    bound, significant = rule.evidence
    assert (bound.metric, bound.threshold, bound.source, bound.fired) == (
        "kernel_share", th.COMPUTE_BOUND.value, th.COMPUTE_BOUND.source, False)
    assert (significant.metric, significant.threshold, significant.fired) == (
        "data_loading_share", th.DATA_LOADING_SIGNIFICANT.value, True)
    for width in (80, 120):
        section = _flat("\n".join(_layer_section(render_text(d, width=width))))
        assert f"Why data_loading: {rule.reason}" in section
        assert (f"kernel {d.layers['kernel'].share:.1%} < {_named(th.COMPUTE_BOUND)}"
                in section)
        assert (f"data_loading {d.layers['data_loading'].share:.1%} >= "
                f"{_named(th.DATA_LOADING_SIGNIFICANT)}" in section)
    markdown = diagnosis_markdown(d)
    assert "Why **data_loading**:" in markdown and "compute\\_bound 85%" in markdown
    assert f"{_named(th.COMPUTE_BOUND)}" in summary_html(d)


def test_the_rule_line_follows_the_threshold_not_prose(shared_traces, monkeypatch):
    """The same trace with compute_bound at 50 %: kernel's 55 % now wins, and the line says so
    with the threshold's new value."""
    lower = msgspec.structs.replace(th.COMPUTE_BOUND, value=0.5)
    monkeypatch.setattr(th, "COMPUTE_BOUND", lower)
    (d,) = analyze(shared_traces / RESNET_NO_WORKERS)
    assert d.primary == "kernel" and d.primary_rule.rule == "compute_bound"
    text = _flat(render_text(d, width=80))
    assert f"Why kernel: kernel {d.layers['kernel'].share:.1%} >= compute_bound 50%" in text


def _compute_bound(base):
    return [x("aten::mm", base + 100, 9_000)]  # kernel 90 % of the step


def _none_significant(base):
    # data_loading 4 % (< 5 %), kernel 82 % (< 85 %), host the other 14 % (< 15 %)
    return [x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", base + 100, 400,
              cat="user_annotation"), x("aten::mm", base + 600, 8_200)]


@pytest.mark.parametrize(("body", "branch"), [(_compute_bound, "compute_bound"),
                                              (_none_significant, "none_significant")])
def test_the_rule_names_the_branch_when_kernel_is_primary(tmp_path, body, branch):
    """Kernel at 90 % of the step (compute_bound), and kernel at 82 % with nothing else
    significant (every other time layer named with its threshold)."""
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(4, body))))
    assert d.primary == "kernel" and d.primary_rule.rule == branch, d.primary_rule
    text = _flat(render_text(d, width=80))
    assert f"Why kernel: kernel {d.layers['kernel'].share:.1%}" in text
    if branch == "none_significant":
        for layer, t in (("data_loading", th.DATA_LOADING_SIGNIFICANT),
                         ("host", th.HOST_SIGNIFICANT),
                         ("communication", th.COMMUNICATION_SIGNIFICANT)):
            assert f"{layer} {d.layers[layer].share:.1%} < {_named(t)}" in text


def _contended(base):
    # data_loading 8 %, kernel 88 % (>= compute_bound): the CPU pipeline's own workers
    return [x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", base + 100, 800,
              cat="user_annotation"), x("aten::mm", base + 1_000, 8_800)]


@pytest.mark.parametrize(("job_cores", "worker_cores", "primary", "branch"), [
    (1.95, 1.6, "data_loading", "contended_compute"),  # the job's workers fill the cores
    (1.95, 0.4, "kernel", "compute_bound"),  # the training process itself fills them
    (1.0, 0.9, "kernel", "compute_bound"),  # half the cores idle: no contention of its own
])
def test_compute_slowed_by_the_jobs_own_workers_is_data_loading(tmp_path, job_cores,
                                                                  worker_cores, primary, branch):
    """3 CPU-bound DataLoader workers on 2 cores made a Linear(1024, 4) step run 30-90 ms:
    kernel above compute_bound, verdict `kernel`. When the job's own processes saturate its
    cores and its workers hold most of that CPU, the compute time is contention from its
    loading, and data_loading (significant) is primary, with both figures in the rule."""
    machine = {"samples": 20, "cores": 2, "cpu_busy_mean": 1.0, "cpu_busy_per_core": [1, 1],
               "rss_max_bytes": 1, "child_processes": 3, "children_cpu_cores_mean":
               worker_cores, "job_cpu_cores_mean": job_cores, "job_processes": 4,
               "cores_available": 2.0, "cores_available_source": "affinity"}
    d = diagnose(load_trace(write_trace(tmp_path / "t.json", _steps(4, _contended))),
                 machine=machine)
    assert d.layers["kernel"].share >= th.COMPUTE_BOUND.value
    assert (d.primary, d.primary_rule.rule) == (primary, branch), d.primary_rule
    if branch == "contended_compute":
        assert f"(>= {_named(th.LOADER_CPU_SHARE)})" in d.primary_rule.reason
        assert {e.metric for e in d.primary_rule.evidence} == {
            "job_cpu_busy", "loader_cpu_share", "data_loading_share"}
    # without machine samples (a trace from elsewhere) the rule cannot tell
    assert diagnose(load_trace(tmp_path / "t.json")).primary == "kernel"


def test_a_round_trip_keeps_the_rule(resnet):
    from torchtriage.diagnosis.result import decode_diagnosis

    assert decode_diagnosis(resnet.to_json()).primary_rule == resnet.primary_rule


def _header(d) -> str:
    """The header panel under its title (the title shows the trace's path)."""
    return render_text(d, width=120).split("╰", 1)[0].split("\n", 1)[1]


def _ranked_trace(tmp_path, name: str, **top):
    def body(base):
        return [x("aten::mm", base + 100, 9_000)]
    return load_trace(write_trace(tmp_path / name, _steps(4, body), **top))


@pytest.mark.parametrize("name", ["rank0_1234.5678.pt.trace.json", "plain.pt.trace.json"])
def test_a_single_process_header_names_no_rank(tmp_path, name):
    """`torchtriage run` names a single process's trace rank0_*; nothing gives a world size."""
    header = _header(diagnose(_ranked_trace(tmp_path, name)))
    assert "rank" not in header and "None" not in header, header
    single = diagnose(_ranked_trace(tmp_path, "w.json",
                                    distributedInfo={"rank": 0, "world_size": 1}))
    assert "rank" not in _header(single)


def test_a_rank_without_a_world_size_is_shown_without_none(tmp_path):
    d = diagnose(_ranked_trace(tmp_path, "trainer_rank3.json"))
    assert d.trace.rank == 3 and d.trace.world_size is None
    header = _header(d)
    assert ", rank 3" in header and "None" not in header
    job = diagnose(_ranked_trace(tmp_path, "r.json",
                                 distributedInfo={"backend": "nccl", "rank": 3, "world_size": 8}))
    assert ", rank 3/8" in _header(job)


def test_shared_single_process_traces_never_print_none_as_a_rank(shared_traces):
    for rel in ("hta/rank_non_gpu/rank_non_gpu.json.gz",
                "hta/trace_file_list/inference_rank_1.json.gz", RESNET_NO_WORKERS):
        (d,) = analyze(shared_traces / rel)
        assert d.trace.world_size is None
        text = render_text(d, width=120)
        assert not re.search(r"rank \S*None", text, re.IGNORECASE), rel
