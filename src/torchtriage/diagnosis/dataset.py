"""Which part of the input pipeline is slow, from the Dataset timing ``torchtriage run`` writes
into the trace's ``torchtriage`` metadata (``dataset``: ``__getitem__`` ms per sample, collate
ms per batch, samples per batch, where they ran, and ``over``: the profiled window's fetches,
or every fetch up to its end where workers reported none during it; see
``capture/dataset.py``).

A batch costs ``getitem_ms_per_sample x samples_per_batch`` in ``__getitem__`` plus
``collate_ms_per_batch``. The figures are always evidence of the data-loading layer; when
loading is significant (``DATA_LOADING_SIGNIFICANT``) and ``__getitem__`` is at least
``DATASET_GETITEM_SHARE`` of a batch's cost, the finding ``data_loading.dataset`` names the
Dataset as the slow part ("Dataset.__getitem__ 3.81 ms/sample"), otherwise
``data_loading.collate`` names ``collate_fn``.
"""

from __future__ import annotations

from typing import Any

from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import Evidence, Finding


def dataset_verdict(meta: dict[str, Any] | None, loading_share: float
                    ) -> tuple[list[Evidence], list[Finding]]:
    """Evidence and findings of the data-loading layer from the trace's ``dataset`` entry."""
    figures = _figures(meta)
    if figures is None:
        return [], []
    getitem, collate, per_batch, batch_ms = figures
    where = str(meta.get("where", ""))  # (a dict: _figures read it)
    processes = _count(meta.get("processes"), 1)
    getitem_share = getitem * per_batch / batch_ms if batch_ms > 0 else 0.0
    fired = getitem_share >= th.DATASET_GETITEM_SHARE.value
    evidence = [
        Evidence(metric="dataset_getitem_ms_per_sample", value=round(getitem, 4), unit="ms"),
        Evidence(metric="collate_ms_per_batch", value=round(collate, 4), unit="ms"),
        Evidence(metric="dataset_getitem_share", value=round(getitem_share, 4),
                 unit="share of a batch's loading time", threshold=th.DATASET_GETITEM_SHARE.value,
                 comparison=">=", fired=fired, source=th.DATASET_GETITEM_SHARE.source),
    ]
    if loading_share < th.DATA_LOADING_SIGNIFICANT.value or batch_ms <= 0:
        return evidence, []
    workers = loader_workers(meta)
    place = ("in the training process (num_workers=0)" if where != "workers"
             else f"in the DataLoader's {workers} workers" if workers
             else f"in {processes} DataLoader worker(s)")
    if meta.get("over") == "run":  # the workers reported no fetch during a short window
        place += ", over the fetches before the window's end"
    cost = (f"{batch_ms:.1f} ms per batch of {per_batch:g} ({getitem_share:.0%} "
            f"__getitem__, collate {collate:.2f} ms), {place}")
    if fired:
        finding = Finding(id="data_loading.dataset", severity="warning", layer="data_loading",
                          message=f"Dataset.__getitem__ {getitem:.2f} ms/sample: {cost}. "
                                  "Make the per-sample work cheaper (decode, resize, augment) "
                                  "or spread it over more workers.",
                          evidence=evidence[:1])
    else:
        finding = Finding(id="data_loading.collate", severity="warning", layer="data_loading",
                          message=f"collate_fn {collate:.2f} ms per batch: {cost}.",
                          evidence=evidence[1:2])
    return evidence, [finding]


def loader_workers(meta: dict[str, Any] | None) -> int:
    """The DataLoader's ``num_workers`` when its workers ran the fetches of the ``dataset``
    entry (0: the training process fetched, or the entry does not say)."""
    if not isinstance(meta, dict) or meta.get("where") != "workers":
        return 0
    return _count(meta.get("num_workers"), 0)


def _count(value: Any, default: int) -> int:
    """A positive count from the metadata, else ``default`` (a trace from elsewhere may hold
    anything there)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else default


def loader_period_ms(meta: dict[str, Any] | None) -> tuple[float, int] | None:
    """The shortest step the DataLoader's workers can feed, from the ``dataset`` entry: their
    loading time per batch (``__getitem__`` of each sample, then collate) over their number,
    with that number; None when the training process fetched, the workers are not counted, or
    the timing is not the window's (``over`` "run": the workers fetched nothing in it)."""
    workers, figures = loader_workers(meta), _figures(meta)
    if not workers or figures is None or meta.get("over") == "run":  # (workers: a dict)
        return None
    batch_ms = figures[3]
    return (batch_ms / workers, workers) if batch_ms > 0 else None


def _figures(meta: dict[str, Any] | None) -> tuple[float, float, float, float] | None:
    """``__getitem__`` ms per sample, collate ms per batch, samples per batch and the loading
    ms per batch they make, from the ``dataset`` entry; None when it lacks one or holds
    something else."""
    if not isinstance(meta, dict):
        return None
    try:
        getitem = float(meta["getitem_ms_per_sample"])
        collate = float(meta["collate_ms_per_batch"])
        per_batch = float(meta["samples_per_batch"])
    except (KeyError, TypeError, ValueError):
        return None
    return getitem, collate, per_batch, getitem * per_batch + collate
