"""The live progress line of ``ab`` and ``fix``: the trial being run, k of n, elapsed."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from torchtriage.results.ab import Trial


class TrialProgress:
    """A one-line live display of the trial being run: what, k of n, elapsed."""

    def __init__(self, console: Console, *, enabled: bool) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                 transient=True, disable=not enabled)
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
                self.console.print(label, highlight=False, markup=False)
            return
        if n == 0:  # a phase, not a trial
            self.progress.update(self.task, description=label, total=None, completed=0)
            return
        if trial is None:
            self.progress.update(self.task, description=f"trial {k}/{n}: {label}", total=n)
            return
        self.progress.update(self.task, completed=k)
        if self.enabled:
            what = (f"{trial.mean_step_ms:.1f} ms/step" if trial.status == "ok"
                    else f"{trial.status}: {trial.error}")
            self.console.print(f"[dim]trial {k}/{n} {trial.arm}{trial.idx}: {what}[/dim]",
                               highlight=False, markup=True)
