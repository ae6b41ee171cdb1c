"""One bad file does not fail a directory (issue 18, item 6): ``analyze``, ``compare`` and
``report`` diagnose what can be read, list what was skipped and why (terminal, JSON, HTML),
and exit non-zero only when nothing could be read, or with ``--strict``."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from torchtriage.cli import main
from torchtriage.diagnosis.traces import DiagnoseOptions, diagnose_traces
from torchtriage.errors import TraceError

REASONS = {
    "hparams.json": "JSON without 'traceEvents': not a Kineto trace",
    "benchmark_simple_add_et.json.gz": "a PyTorch execution trace (Chakra ET), not a Kineto "
                                       "trace",
    "sampled_rank-2.json": "truncated trace",
}


@pytest.fixture
def job_dir(shared_traces, tmp_path):
    """Two real rank traces, an hparams.json, an execution trace and a truncated rank."""
    d = tmp_path / "job"
    d.mkdir()
    for rank in (0, 1):
        shutil.copy(shared_traces / "hta" / "trace_filter" / f"sampled_rank-{rank}.json.gz", d)
    shutil.copy(shared_traces / "hta" / "execution_trace" / "benchmark_simple_add_et.json.gz", d)
    (d / "hparams.json").write_text(json.dumps({"lr": 0.1, "batch_size": 32}))
    whole = gzip.decompress((d / "sampled_rank-1.json.gz").read_bytes())
    (d / "sampled_rank-2.json").write_bytes(whole[:len(whole) // 2])
    return d


def _skipped(doc_skipped) -> dict[str, str]:
    return {s["path"].rsplit("/", 1)[-1]: s["reason"] for s in doc_skipped}


def test_analyze_diagnoses_the_readable_ranks_and_lists_the_rest(job_dir, capsys):
    assert main(["analyze", str(job_dir), "--json"]) == 0  # main: exit 2, no diagnosis
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchtriage.job/1"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    skipped = _skipped(doc["skipped"])
    assert set(skipped) == set(REASONS)
    for name, reason in REASONS.items():
        assert skipped[name].startswith(reason), skipped[name]


def test_the_terminal_report_lists_the_skipped_files(job_dir, capsys):
    assert main(["analyze", str(job_dir)]) == 0
    out = "".join(capsys.readouterr().out.split())  # rich wraps long lines, inside words too
    assert "Skipped3file(s)thatcouldnotberead:" in out
    assert "hparams.json(JSONwithout'traceEvents'" in out


def test_strict_fails_on_any_unreadable_file(job_dir, capsys):
    assert main(["analyze", str(job_dir), "--strict"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchtriage: error: only 2 of the 5 trace files could be read "
                          "(--strict): ")
    assert "\n" not in err


def test_nothing_readable_is_an_error_naming_each_file(job_dir, capsys):
    for rank in (0, 1):
        (job_dir / f"sampled_rank-{rank}.json.gz").unlink()
    assert main(["analyze", str(job_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchtriage: error: none of the 3 trace files could be read: ")
    assert all(reason in err for reason in REASONS.values())


def test_one_readable_trace_is_its_diagnosis_with_the_skipped_listed(job_dir):
    (job_dir / "sampled_rank-1.json.gz").unlink()
    doc = diagnose_traces(job_dir)
    assert doc.schema == "torchtriage.diagnosis/1"
    assert {s.path.rsplit("/", 1)[-1] for s in doc.skipped} == set(REASONS)


def test_pool_workers_skip_the_same_files(job_dir):
    doc = diagnose_traces(job_dir, DiagnoseOptions(workers=2))
    assert [r.rank for r in doc.ranks] == [0, 1]
    assert {s.path.rsplit("/", 1)[-1] for s in doc.skipped} == set(REASONS)
    with pytest.raises(TraceError, match=r"only 2 of the 5 trace files could be read"):
        diagnose_traces(job_dir, DiagnoseOptions(workers=2, strict=True))


def test_compare_and_report_take_directories_with_a_bad_file(job_dir, shared_traces,
                                                             tmp_path, capsys):
    clean = tmp_path / "clean"
    clean.mkdir()
    for rank in (0, 1):
        shutil.copy(shared_traces / "hta" / "trace_filter" / f"sampled_rank-{rank}.json.gz",
                    clean)
    assert main(["compare", str(clean), str(job_dir), "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["a"]["skipped"] == [] and c["b"]["traces"] == 2
    assert set(_skipped(c["b"]["skipped"])) == set(REASONS)
    assert main(["compare", str(clean), str(job_dir), "--strict"]) == 2
    capsys.readouterr()
    assert main(["report", str(job_dir)]) == 0
    page = (job_dir / "report.html").read_text()
    assert 'id="skipped"' in page and "hparams.json" in page
    assert main(["report", str(job_dir), "--strict"]) == 2
