"""How long the Dataset takes per sample, from the processes that call it (the training
process with ``num_workers=0``, each DataLoader worker otherwise).

A DataLoader turns indices into a batch in its fetcher: ``dataset[i]`` (or ``__getitems__``,
or ``next()`` of an iterable dataset) for each sample, then ``collate_fn``. The bootstrap
replaces ``_MapDatasetFetcher.fetch`` and ``_IterableDatasetFetcher.fetch`` (once, in the
training process; forked or spawned workers get the patch too, since the bootstrap runs in
them) by a wrapper that times the whole fetch and the ``collate_fn`` call inside it (the
fetcher's ``collate_fn`` is wrapped on its first fetch): ``__getitem__`` time is the fetch
minus the collate, per sample. Two ``perf_counter`` calls per fetch and one per collate; the
batch is untouched.

Each process keeps running totals (:class:`DatasetTotals`). A worker writes its totals to
``<out>/dataset/rank<R>.<pid>.json`` (atomically, at most every ``WRITE_EVERY_S`` and on its
first fetches); the training process reads them, with its own, in :func:`totals`. The profiling
session takes the totals when its window starts recording and when it is saved, and writes the
difference (the window's fetches) into the trace's ``torchtriage`` metadata as ``dataset``,
where the diagnosis reads it, with the workers that fetched during the window (a DataLoader
without persistent workers starts new ones each epoch: all of them summed would name twice
the workers) and their DataLoader's ``num_workers``. A window shorter than the workers'
writes (5 steps of 10 ms) can see no new totals at all: then the totals up to the window's
end are written instead, marked ``"over": "run"`` (:func:`window_figures`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal

import msgspec

from torchtriage.document import write_whole

WRITE_EVERY_S = 0.05  # a worker rewrites its totals file at most this often (0.2 s missed
# every write in one of four 50 ms windows of a loader-bound test script, 2026-12-03)
FIRST_WRITES = 3  # ... and after each of its first fetches


class DatasetTotals(msgspec.Struct, kw_only=True):
    """Running totals of one process's fetches, or of several processes summed."""

    fetches: int = 0
    samples: int = 0
    getitem_s: float = 0.0  # fetch time minus collate time
    collate_s: float = 0.0
    processes: int = 0  # processes that fetched (workers, or the training process)
    workers: bool = False  # the fetches ran in DataLoader workers
    num_workers: int = 0  # in a worker: its DataLoader's num_workers; summed: the most of those
    # summed: each worker file's (fetches, its DataLoader's num_workers), to tell which workers
    # fetched in a window (a DataLoader without persistent workers starts new ones each epoch)
    by_process: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)

    def minus(self, before: DatasetTotals) -> DatasetTotals:
        """The fetches since ``before``, by the processes that made them."""
        fetched = [(name, loader_workers) for name, (fetches, loader_workers)
                   in self.by_process.items() if fetches > before.by_process.get(name, (0, 0))[0]]
        return DatasetTotals(fetches=self.fetches - before.fetches,
                             samples=self.samples - before.samples,
                             getitem_s=self.getitem_s - before.getitem_s,
                             collate_s=self.collate_s - before.collate_s,
                             processes=len(fetched) if self.by_process else self.processes,
                             workers=self.workers,
                             num_workers=max((n for _, n in fetched), default=self.num_workers))

    def summary(self, over: Literal["window", "run"] = "window") -> dict[str, Any] | None:
        """The trace metadata's ``dataset`` entry (None without fetches); ``over``: the fetches
        it sums, the window's or all those before the window's end."""
        if self.fetches <= 0 or self.samples <= 0:
            return None
        return {"over": over,
                "getitem_ms_per_sample": round(self.getitem_s * 1e3 / self.samples, 4),
                "collate_ms_per_batch": round(self.collate_s * 1e3 / self.fetches, 4),
                "samples_per_batch": round(self.samples / self.fetches, 2),
                "fetches": self.fetches, "processes": self.processes,
                "where": "workers" if self.workers else "training process",
                **({"num_workers": self.num_workers} if self.workers and self.num_workers
                   else {})}


class DatasetTimer:
    """This process's totals and, in a worker, the file they go to."""

    def __init__(self, out: Path, rank: int) -> None:
        self.out, self.rank = out, rank
        self.mine = DatasetTotals(processes=1)
        self._written = 0.0
        self._worker: bool | None = None

    def install(self) -> None:
        from torch.utils.data._utils import fetch

        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            cls.fetch = self._timed(cls.fetch)

    def _timed(self, original: Any) -> Any:
        timer = self

        def fetch(fetcher: Any, index: Any) -> Any:
            if not getattr(fetcher.collate_fn, "_torchtriage_timed", False):
                fetcher.collate_fn = timer._timed_collate(fetcher.collate_fn)
            collate_before = timer.mine.collate_s
            started = time.perf_counter()
            batch = original(fetcher, index)
            spent = time.perf_counter() - started
            mine = timer.mine
            mine.fetches += 1
            mine.samples += len(index) if fetcher.auto_collation and hasattr(
                index, "__len__") else 1
            mine.getitem_s += spent - (mine.collate_s - collate_before)
            timer._maybe_write()
            return batch

        return fetch

    def _timed_collate(self, collate: Any) -> Any:
        timer = self

        def timed(data: Any) -> Any:
            started = time.perf_counter()
            try:
                return collate(data)
            finally:
                timer.mine.collate_s += time.perf_counter() - started

        timed._torchtriage_timed = True  # type: ignore[attr-defined]
        return timed

    def _maybe_write(self) -> None:
        if self._worker is None:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            self._worker = info is not None
            self.mine.workers = self._worker
            self.mine.num_workers = info.num_workers if info is not None else 0
        if not self._worker:
            return
        now = time.monotonic()
        if self.mine.fetches > FIRST_WRITES and now - self._written < WRITE_EVERY_S:
            return
        self._written = now
        folder = self.out / "dataset"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_whole(folder / f"rank{self.rank}.{os.getpid()}.json",
                        msgspec.json.encode(self.mine))
        except OSError:  # a full or read-only disk costs the figure, never the training
            pass

    def totals(self) -> DatasetTotals:
        """This process's totals, or its workers' (summed) when they fetched."""
        workers = DatasetTotals(workers=True)
        for path in (self.out / "dataset").glob(f"rank{self.rank}.*.json"):
            try:
                part = msgspec.json.decode(path.read_bytes(), type=DatasetTotals)
            except (OSError, msgspec.DecodeError, json.JSONDecodeError):
                continue
            workers.fetches += part.fetches
            workers.samples += part.samples
            workers.getitem_s += part.getitem_s
            workers.collate_s += part.collate_s
            workers.processes += 1
            workers.num_workers = max(workers.num_workers, part.num_workers)
            workers.by_process[path.name] = (part.fetches, part.num_workers)
        return workers if workers.fetches > self.mine.fetches else msgspec.structs.replace(
            self.mine)  # a copy: the session keeps the totals at the window's start


def window_figures(at_start: DatasetTotals, at_end: DatasetTotals) -> dict[str, Any] | None:
    """The ``dataset`` entry of a window: its own fetches, or where none were reported during
    it (workers write every :data:`WRITE_EVERY_S`), every fetch reported up to its end."""
    return at_end.minus(at_start).summary() or at_end.summary(over="run")
