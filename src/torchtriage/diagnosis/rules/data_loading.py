"""The data-loading rule: the input pipeline (DataLoader work or waits, input copies)."""

from __future__ import annotations

import msgspec

from torchtriage.analysis.categories import is_dataloader
from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.catalog import BY_ID, Remedy
from torchtriage.diagnosis.dataset import loader_workers
from torchtriage.diagnosis.result import Evidence, Finding, MachineInfo
from torchtriage.diagnosis.rules.base import Facts, Verdict, share_evidence
from torchtriage.diagnosis.vocabulary import Layer


class DataLoadingRule:
    """DataLoader four-piece when the loader is exposed; pinned, async copies when the copy is.

    At ``data_loading_significant`` of step time: loader fixes (workers, prefetch, persistent
    workers) when the trace has a DataLoader, withheld when the job's own processes (not the
    machine: other processes do not count) already use ``cpu_saturated`` of the cores the job
    may use; pinned memory and non-blocking copies when host-to-device input
    copies are pageable or wait for the device (a sync inside the copy op, at least one per
    step). Pinned memory is ``DataLoader(pin_memory=True)``, or ``x.pin_memory()`` where the
    script makes its batches when the trace has no DataLoader. When exposed copies outweigh
    exposed loading, the copy fixes come first.
    """

    layer: Layer = "data_loading"
    prescribes = ("dataloader.num_workers", "dataloader.prefetch_factor",
                  "dataloader.persistent_workers", "dataloader.pin_memory", "h2d.non_blocking")
    thresholds = (th.DATA_LOADING_SIGNIFICANT, th.CPU_SATURATED)

    def judge(self, f: Facts) -> Verdict:
        return _data_loading(f)


def _data_loading(f: Facts) -> Verdict:
    share = f.share("data_loading")
    v = Verdict(evidence=[share_evidence("data_loading_share", share,
                                         th.DATA_LOADING_SIGNIFICANT)])
    single = f.names_matching(lambda n: "_SingleProcessDataLoaderIter" in n)
    multi = f.names_matching(lambda n: "_MultiProcessingDataLoaderIter" in n)
    has_loader = bool(f.names_matching(is_dataloader))
    if single:
        v.findings.append(Finding(
            id="data_loading.single_process", severity="warning" if share >= 0.05 else "info",
            layer="data_loading",
            message="The DataLoader loads batches in the training process (num_workers=0)."))
    h2d_share = f.breakdown.share("h2d_input") if f.gpu else 0.0
    pageable = f.device.transfers.h2d.pageable if f.device else 0
    if f.device is not None:
        h2d = f.device.transfers.h2d
        v.evidence.append(Evidence(metric="pageable_h2d_copies", value=pageable, unit="copies"))
        v.evidence.append(Evidence(metric="h2d_input_share", value=round(h2d_share, 4),
                                   unit="share of step time"))
        v.evidence.append(Evidence(metric="h2d_bytes_per_step",
                                   value=round(h2d.bytes / max(len(f.steps), 1)), unit="bytes"))
        if pageable:
            v.findings.append(Finding(
                id="data_loading.pageable_copies", severity="warning", layer="data_loading",
                message=f"{pageable} host-to-device copies from pageable memory in the "
                        f"analysed steps ({h2d.bytes / 2**20 / max(len(f.steps), 1):.1f} MiB "
                        "per step): each is staged and synchronous."))
    if share < th.DATA_LOADING_SIGNIFICANT.value:
        return v
    copy_fixes: list[tuple[Remedy, str]] = []
    if f.gpu and pageable:
        pin = BY_ID["dataloader.pin_memory"]
        if not has_loader:  # batches made by the script itself: pin them where they are made
            pin = msgspec.structs.replace(
                pin, code="x = x.pin_memory()  # where the batch is made (no DataLoader here)")
        copy_fixes.append((pin, f"{pageable} pageable host-to-device copies"))
    syncs = (f.device.transfers.sync_count("copy_to_device") / max(len(f.steps), 1)
             if f.device else 0.0)
    if f.gpu and h2d_share > 0 and (pageable or syncs >= 1):
        copy_fixes.append((BY_ID["h2d.non_blocking"],
                           f"{h2d_share:.1%} of step time is exposed input copy, issued "
                           + ("from pageable memory" if pageable else "before a sync")))
    elif f.gpu and h2d_share >= th.DATA_LOADING_SIGNIFICANT.value:
        v.findings.append(Finding(
            id="data_loading.exposed_copy", severity="warning", layer="data_loading",
            message=f"{h2d_share:.0%} of step time is an input copy that is already pinned "
                    "and asynchronous but nothing overlaps it: copy the next batch on a side "
                    "stream while this one computes (prefetch)."))
    job = job_cpu_evidence(f.machine)
    saturated = job is not None and bool(job.fired)
    if job is not None:
        v.evidence.append(job)
    if f.machine is not None and f.machine.samples:
        v.evidence.append(Evidence(metric="machine_cpu_busy_mean",
                                   value=f.machine.cpu_busy_mean,
                                   unit="busy fraction of all the machine's cores, other "
                                        "processes included (not what saturation is judged by)"))
    loader_fixes: list[tuple[Remedy, str]] = []
    if has_loader:
        if multi and not single:
            loader_fixes.append(_more_workers(f))
        else:
            loader_fixes.append((BY_ID["dataloader.num_workers"],
                                 "loading runs in the training process (num_workers=0)"
                                 if single else
                                 f"{share:.0%} of step time is exposed data loading"))
        loader_fixes.append((BY_ID["dataloader.prefetch_factor"],
                             "keeps batches queued once workers run" if single else
                             "workers are sometimes late"))
        loader_fixes.append((BY_ID["dataloader.persistent_workers"],
                             "avoids re-spawning workers every epoch"))
    if saturated:
        m = f.machine
        used = f"{m.job_cpu_cores_mean:.2f} of the {m.job_cores:g} cores it may use"
        v.findings.append(Finding(
            id="data_loading.cpu_saturated", severity="warning", layer="data_loading",
            message=f"The job's own processes already use {used} ({job.value:.0%}): more "
                    "DataLoader workers will not help; make preprocessing cheaper (decode, "
                    "resize, augment on the GPU) or add cores.", evidence=[job]))
        for remedy, _ in loader_fixes:
            v.withheld.append((remedy, f"the job's processes already use {used}", [job]))
        loader_fixes = []
    copy_first = h2d_share > f.breakdown.share("data_loading")
    v.remedies.extend(copy_fixes + loader_fixes if copy_first else loader_fixes + copy_fixes)
    return v


def _more_workers(f: Facts) -> tuple[Remedy, str]:
    """``dataloader.num_workers`` for a loader whose workers do not keep up: with the workers
    it has (the Dataset timing names them) and the cores the job may use, the recipe says how
    many it has now and suggests twice as many, at most one per core (a recipe of 4 workers
    for a loader with 4 already said nothing)."""
    remedy = BY_ID["dataloader.num_workers"]
    workers = loader_workers(f.trace.meta.torchtriage.get("dataset"))
    if not workers:
        return remedy, "the workers do not keep up with the training loop"
    m = f.machine if f.machine is not None and f.machine.samples else None
    cores = int(m.job_cores) if m is not None else None
    more = min(2 * workers, cores) if cores else 2 * workers
    used = (f" (the job's processes use {m.job_cpu_cores_mean:.1f} of the {cores} cores it "
            "may use)") if m is not None and m.job_cpu_cores_mean is not None else ""
    why = f"its {workers} workers do not keep up with the training loop{used}"
    if more <= workers:
        return remedy, why
    limit = f", at most one per core: {cores}" if cores else ""
    code = f"DataLoader(dataset, batch_size=..., num_workers={more})  # now {workers}{limit}"
    return msgspec.structs.replace(remedy, code=code), why


def job_cpu_evidence(m: MachineInfo | None) -> Evidence | None:
    """The job's own CPU use over the cores it may use, held against ``cpu_saturated`` (None
    when the run did not record the job's processes)."""
    if m is None or not m.samples or m.job_cpu_cores_mean is None or m.job_cores <= 0:
        return None
    ev = share_evidence("job_cpu_busy", m.job_cpu_cores_mean / m.job_cores, th.CPU_SATURATED)
    ev.unit = (f"of the {m.job_cores:g} cores the job may use "
               f"({m.cores_available_source or 'all cores'}), by its own processes")
    return ev
