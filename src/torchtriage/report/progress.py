"""The live progress line of ``ab`` and ``fix``: the trial being run, k of n, elapsed."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from torchtriage.report.text import plain, printable
from torchtriage.results.ab import Trial


class TrialProgress:
    """A one-line live display of the trial being run: what, k of n, elapsed."""

    def __init__(self, console: Console, *, enabled: bool) -> None:
        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                 transient=True,  # a log gets the trial lines, no bar
                                 disable=not (enabled and console.is_terminal))
        self.console = console
        self.enabled = enabled
        self.task = None

    def __enter__(self) -> TrialProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, label: str, k: int, n: int, trial: Trial | None) -> None:
        if self.task is None:
            self.task = self.progress.add_task("", total=n or None)
        if n < 0:  # a finding worth keeping on screen
            if self.enabled:
                self.console.print(plain(label), highlight=False)
            return
        if n == 0:  # a phase, not a trial
            self.progress.update(self.task, description=printable(label), total=None,
                                 completed=0)
            return
        if trial is None:
            self.progress.update(self.task, description=printable(f"trial {k}/{n}: {label}"),
                                 total=n)
            return
        self.progress.update(self.task, completed=k)
        if self.enabled:
            what = (f"{trial.mean_step_ms:.1f} ms/step" if trial.status == "ok"
                    else f"{trial.status}: {trial.error}")
            self.console.print(plain(f"trial {k}/{n} {trial.arm}{trial.idx}: {what}", "dim"),
                               highlight=False)
