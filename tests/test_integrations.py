"""The trainer callbacks with the real trainers (tiny models, CPU): Lightning's and Hugging Face's
``Trainer`` profile a steady-state window, write the trace, ``diagnosis.json`` and
``report.html`` into the trainer's log directory, log the verdict, and train exactly as without
the callback; gradient accumulation makes one step of its micro-batches; a run too short for the
window says so; DDP gives the job's diagnosis; the frameworks stay optional."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchtriage.diagnosis.job import JobDiagnosis
from torchtriage.diagnosis.result import Diagnosis
from torchtriage.results.registry import read_document
from torchtriage.results.run import decode_record

SCRIPTS = Path(__file__).parent / "scripts"
SRC = Path(__file__).resolve().parents[1] / "src"
# optimizer steps: the window (start 1, wait 1, warm-up 2, active 5), the export step and 5
# checked steps close it after step 15; 8 more save a window profiled again (not steady state)
STEPS = 24


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


@pytest.fixture
def verdicts():
    """The lines logged on a callback's logger (Lightning's and transformers' loggers do not
    propagate to the root logger, so caplog would not see them)."""
    attached: list[logging.Logger] = []
    handler = Lines()

    def on(name: str) -> Lines:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        attached.append(logger)
        return handler

    yield on
    for logger in attached:
        logger.removeHandler(handler)


def _files(out: Path) -> dict[str, list[Path]]:
    return {"trace": sorted(out.glob("rank0_*.pt.trace.json.gz")),
            "diagnosis": [p for p in [out / "diagnosis.json"] if p.is_file()],
            "report": [p for p in [out / "report.html"] if p.is_file()]}


def _check_window(diagnosis: Diagnosis, active: int = 5) -> None:
    """The diagnosis analysed exactly the window's active steps: ProfilerStep#k of the session
    that started after ``skipped_steps`` steps is training step ``skipped_steps + k + 1``. One of
    them may be left out as a short one-off (a stall of a loaded machine inside the window that
    no checked step repeated, diagnosis/windows.py): it is then listed as excluded, with why."""
    window = diagnosis.window
    assert window is not None
    assert window.last_step - window.first_step + 1 == active
    analysed = [window.skipped_steps + k + 1 for k in diagnosis.trace.steps_analyzed]
    one_off = [window.skipped_steps + int(k) + 1
               for k, why in diagnosis.trace.steps_excluded.items() if why.startswith("one-off")]
    assert len(one_off) <= 1, diagnosis.trace.steps_excluded
    assert sorted(analysed + one_off) == list(range(window.first_step, window.last_step + 1))


# --- the trainer-independent window ----------------------------------------------------------

@pytest.mark.parametrize("skip", [0, 70])
def test_a_window_profiled_again_and_cut_short_by_the_end_falls_back_to_the_first(tmp_path,
                                                                                 skip):
    """Steps after the first window run 5x slower (a synthetic host clock, real ops under the
    real profiler): the window was not steady state and is profiled again, but training ends
    in that window's warm-up. The first window is diagnosed, said not steady state; the
    warm-up trace goes aside. Its samples per second come from the trainer's batch sizes, also
    past the run record's first 64 steps (``skip=70``)."""
    from torchtriage.integrations.window import TrainerWindow

    window = TrainerWindow(tmp_path / "out", skip=skip)
    window.begin(tmp_path)
    clock, now = window.clock, [0.0]
    clock.tick = lambda: clock.ends.append(now[0])
    start = max(skip, 1)  # the session starts after this step; steps start+4..+8 profiled
    x = torch.randn(64, 64)
    for step in range(1, start + 17):
        (x @ x).sum()
        now[0] += 0.010 if step <= start + 9 else 0.050
        window.step_ended(batch_size=4)
    result = window.end()

    out = tmp_path / "out"
    traces = list(out.glob("rank0_*.pt.trace.json.gz"))
    assert len(traces) == 1 and len(list((out / "superseded").glob("rank0_*"))) == 1
    # the first session's record went aside with its trace, never into the run directory,
    # where rank 0 of a job would take it for this rank's final record
    assert (out / "superseded" / "run.rank0.json").is_file()
    assert decode_record((out / "run.rank0.json").read_bytes()).trace == traces[0].name
    doc = result.diagnosis
    assert doc.window.first_step == start + 4 and doc.window.representative is False
    _check_window(doc)
    assert f"steps {start + 4}-{start + 8}; not steady state" in result.message
    assert result.metrics["torchtriage/samples_per_s"] == pytest.approx(
        4 / (doc.breakdown.median_step_ms / 1e3), rel=1e-3)


# --- Lightning ---------------------------------------------------------------------------------

def _lightning_fit(root: Path, callbacks: list, max_steps: int = STEPS, accumulate: int = 2):
    import lightning.pytorch as pl

    sys.path.insert(0, str(SCRIPTS))
    try:
        from lightning_ddp import Tiny
    finally:
        sys.path.remove(str(SCRIPTS))
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(1024, 32), torch.randn(1024, 1))
    model = Tiny()
    trainer = pl.Trainer(
        default_root_dir=root, max_steps=max_steps, accelerator="cpu", devices=1,
        logger=pl.loggers.CSVLogger(root), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        accumulate_grad_batches=accumulate, log_every_n_steps=1)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8, shuffle=True))
    return trainer, model


def test_lightning_callback_profiles_a_window_into_the_log_dir_and_leaves_training_alone(
        tmp_path, verdicts):
    from torchtriage.integrations.lightning import LOGGER, TorchtriageCallback

    logged = verdicts(LOGGER)
    callback = TorchtriageCallback()
    trainer, model = _lightning_fit(tmp_path / "with", [callback])
    _, reference = _lightning_fit(tmp_path / "without", [])

    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), f"{name} differs from the run without the callback"

    out = Path(trainer.log_dir) / "torchtriage"
    assert callback.out == out and out.parent == tmp_path / "with" / "lightning_logs" / "version_0"
    files = _files(out)
    assert all(len(v) == 1 for v in files.values()), files
    doc = read_document(files["diagnosis"][0].read_bytes())
    assert isinstance(doc, Diagnosis)
    _check_window(doc)

    record = decode_record((out / "run.rank0.json").read_bytes())
    assert record.windows[-1] == doc.window  # written when the window closed
    assert doc.window.last_step < record.steps_detected <= STEPS
    assert record.batch_sizes[:5] == [16] * 5  # 2 micro-batches of 8: one optimizer step
    assert len(record.losses) == record.steps_detected
    assert record.step_detection == "lightning: trainer.global_step"

    (level, line), = [x for x in logged.lines if x[1].startswith("torchtriage: ")]
    assert level == logging.INFO and doc.summary in line and str(out / "report.html") in line
    assert f"steps {doc.window.first_step}-{doc.window.last_step}" in line
    metrics = (Path(trainer.log_dir) / "metrics.csv").read_text().splitlines()
    header, row = metrics[0].split(","), metrics[-1].split(",")
    step_ms = float(row[header.index("torchtriage/median_step_ms")])
    assert step_ms == pytest.approx(doc.breakdown.median_step_ms, abs=1e-3)
    assert float(row[header.index("torchtriage/samples_per_s")]) == pytest.approx(
        16 / (step_ms / 1e3), rel=1e-3)
    assert callback.result is not None and callback.result.diagnosis == doc


class _FourBatches(torch.utils.data.IterableDataset):
    """A loader without a length: the trainer cannot know how many steps it will take."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(4):
            yield torch.randn(8, 32, generator=g), torch.randn(8, 1, generator=g)


@pytest.mark.parametrize("length", ["known", "unknown"])
def test_lightning_run_too_short_for_the_window_says_so_and_trains_on(tmp_path, verdicts, length):
    import lightning.pytorch as pl

    from torchtriage.integrations.lightning import LOGGER, TorchtriageCallback

    sys.path.insert(0, str(SCRIPTS))
    try:
        from lightning_ddp import Tiny
    finally:
        sys.path.remove(str(SCRIPTS))
    logged = verdicts(LOGGER)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=4 if length == "known" else 100, max_epochs=1,
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[TorchtriageCallback()])
    data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randn(64, 1))
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8) if length == "known"
                else torch.utils.data.DataLoader(_FourBatches(), batch_size=None))

    assert trainer.global_step == 4
    out = tmp_path / "torchtriage"
    (level, line), = [x for x in logged.lines if x[1].startswith("torchtriage: ")]
    assert level == logging.WARNING
    if length == "known":  # said before training, nothing written
        assert line.startswith("torchtriage: training is 4 optimizer step(s), too short for "
                               "the profiling window (it needs 9")
        assert not out.exists()
    else:  # the warm-up was recorded, the window never came
        assert line.startswith("torchtriage: training ended after 4 optimizer step(s), before "
                               "the profiling window's first profiled step (steps 5-9)")
        assert not (out / "diagnosis.json").exists() and not (out / "report.html").exists()
        record = decode_record((out / "run.rank0.json").read_bytes())
        assert record.steps_detected == 4


def test_lightning_failure_inside_the_window_keeps_the_trace_and_the_exception(tmp_path,
                                                                                verdicts):
    import lightning.pytorch as pl

    from torchtriage.integrations.lightning import LOGGER, TorchtriageCallback

    sys.path.insert(0, str(SCRIPTS))
    try:
        from lightning_ddp import Tiny
    finally:
        sys.path.remove(str(SCRIPTS))

    class Failing(Tiny):
        def training_step(self, batch, batch_idx):
            if batch_idx == 6:  # step 7, the third profiled step
                raise ValueError("the user's own error")
            return super().training_step(batch, batch_idx)

    logged = verdicts(LOGGER)
    callback = TorchtriageCallback()
    trainer = pl.Trainer(default_root_dir=tmp_path, max_steps=STEPS, accelerator="cpu",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback])
    data = torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randn(256, 1))
    with pytest.raises(ValueError, match="the user's own error"):
        trainer.fit(Failing(), torch.utils.data.DataLoader(data, batch_size=8))

    out = tmp_path / "torchtriage"
    files = _files(out)
    assert all(len(v) == 1 for v in files.values()), files
    doc = read_document(files["diagnosis"][0].read_bytes())
    # steps 5 and 6 finished inside the window (ProfilerStep#3, #4); step 7 is partial
    assert doc.trace.steps_analyzed == [3, 4]
    assert doc.trace.steps_excluded["5"].startswith("partial")
    assert any(line.startswith("torchtriage: ") for _, line in logged.lines)


def test_lightning_ddp_ranks_write_their_traces_and_rank0_diagnoses_the_job(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(SCRIPTS / "lightning_ddp.py"), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "torchtriage"
    assert len(list(out.glob("rank0_*.pt.trace.json.gz"))) == 1
    assert len(list(out.glob("rank1_*.pt.trace.json.gz"))) == 1
    doc = read_document((out / "diagnosis.json").read_bytes())
    assert isinstance(doc, JobDiagnosis) and doc.world_size == 2, (
        sorted(p.name for p in out.rglob("*")), proc.stderr[-3000:])
    assert [d.trace.rank for d in doc.diagnoses] == [0, 1]
    for d in doc.diagnoses:
        _check_window(d)
    assert (out / "report.html").is_file()
    line = (tmp_path / "verdict.log").read_text()
    assert line.count("torchtriage: ") == 1 and "2 ranks" in line  # rank 0 only


# --- Hugging Face transformers -----------------------------------------------------------------

class _Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 64, (512, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hf_train(out: Path, callbacks: list, fail_at: int | None = None):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Failing(Trainer):
        def compute_loss(self, *args, **kwargs):
            if self.state.global_step == fail_at:
                raise ValueError("the user's own error")
            return super().compute_loss(*args, **kwargs)

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)  # from a config: nothing is downloaded
    args = TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, logging_steps=4, save_strategy="no", report_to="none",
        use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = Failing(model=model, args=args, train_dataset=_Tokens(), callbacks=callbacks)
    return trainer, trainer.train(), model


def test_transformers_callback_with_gradient_accumulation(tmp_path, verdicts):
    from torchtriage.integrations.transformers import LOGGER, TorchtriageCallback

    logged = verdicts(LOGGER)
    callback = TorchtriageCallback()
    trainer, result, model = _hf_train(tmp_path / "with", [callback])
    _, reference, reference_model = _hf_train(tmp_path / "without", [])

    assert result.training_loss == reference.training_loss
    for (name, a), b in zip(model.state_dict().items(), reference_model.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), f"{name} differs from the run without the callback"

    out = tmp_path / "with" / "torchtriage"
    assert callback.out == out
    files = _files(out)
    assert all(len(v) == 1 for v in files.values()), files
    doc = read_document(files["diagnosis"][0].read_bytes())
    assert isinstance(doc, Diagnosis)
    _check_window(doc)

    record = decode_record((out / "run.rank0.json").read_bytes())
    assert record.windows[-1] == doc.window
    assert record.batch_sizes[:5] == [8] * 5  # a step is an optimizer step: 2 micro-batches of 4
    assert record.step_detection == "transformers: on_step_end"
    logged_losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert [p.loss for p in record.losses] == pytest.approx(logged_losses[:len(record.losses)])
    assert [p.step for p in record.losses] == [4 * k - 1 for k in range(1, len(record.losses) + 1)]
    assert len(record.losses) >= 3

    (level, line), = [x for x in logged.lines if x[1].startswith("torchtriage: ")]
    assert level == logging.WARNING and doc.summary in line
    assert str(out / "report.html") in line
    entry = trainer.state.log_history[-1]
    assert entry["torchtriage/primary"] == doc.primary and entry["step"] == STEPS
    assert entry["torchtriage/median_step_ms"] == pytest.approx(doc.breakdown.median_step_ms,
                                                                abs=1e-3)


def test_transformers_failure_inside_the_window_closes_the_profiler_on_close(tmp_path):
    from torchtriage.integrations.transformers import TorchtriageCallback

    callback = TorchtriageCallback()
    with pytest.raises(ValueError, match="the user's own error"):
        _hf_train(tmp_path, [callback], fail_at=6)  # in step 7, the third profiled step
    assert torch.autograd.profiler._is_profiler_enabled  # no exception event: still open
    callback.close()
    assert not torch.autograd.profiler._is_profiler_enabled
    out = tmp_path / "torchtriage"
    assert len(list(out.glob("rank0_*.pt.trace.json.gz"))) == 1  # saved, not diagnosed
    assert not (out / "diagnosis.json").exists()
    record = decode_record((out / "run.rank0.json").read_bytes())
    assert record.steps_detected == 6


# --- optional --------------------------------------------------------------------------------

def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_torchtriage_never_imports_the_frameworks():
    proc = _python("import sys, torchtriage, torchtriage.integrations, "
                   "torchtriage.integrations.window, torchtriage.capture.session\n"
                   "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                   "('lightning', 'pytorch_lightning', 'transformers', 'accelerate')))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("module,package", [("lightning", "lightning"),
                                            ("transformers", "transformers")])
def test_an_integration_without_its_package_is_a_one_line_error(module, package):
    proc = _python(f"import sys\nsys.modules[{package!r}] = None\n"
                   "from torchtriage.errors import MissingDependencyError\n"
                   "try:\n"
                   f"    import torchtriage.integrations.{module}\n"
                   "except ImportError as exc:\n"
                   "    assert isinstance(exc, MissingDependencyError), type(exc)\n"
                   "    print(exc)\n")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line and f"pip install 'torchtriage[{module}]'" in line
