"""Other processes on the machine: did they contend with the job while it ran?

``torchtriage run`` samples the whole machine's CPU use and the job's own (its process
group). Their difference, in cores' worth, over the cores the job may use is the share other
processes held. At ``machine_contended`` or more, step times were measured on a shared
machine: the diagnosis says so (finding ``machine.contended``, with the figures) and the
confidence of a time verdict is lowered one level, since the shares may not hold on a quiet
machine (a memory verdict stands: contention slows steps, it does not change a peak). Other
processes are counted over the whole machine, so a job pinned to a few cores of a large
machine may be warned about processes on cores it does not use.
"""

from __future__ import annotations

from torchtriage.diagnosis import thresholds as th
from torchtriage.diagnosis.result import Evidence, Finding, MachineInfo


def contention_finding(m: MachineInfo | None) -> Finding | None:
    """The ``machine.contended`` finding, or None (quiet, or the job's use not recorded)."""
    if m is None or not m.samples or m.job_cpu_cores_mean is None:
        return None
    cores = m.job_cores
    others = max(m.cpu_busy_mean * m.cores - m.job_cpu_cores_mean, 0.0)
    share = others / cores if cores else 0.0
    t = th.MACHINE_CONTENDED
    if share < t.value:
        return None
    return Finding(
        id="machine.contended", severity="warning",
        message=f"Other processes used {others:.2g} of the {cores:g} cores the job may use while "
                "it ran: its step times were measured on a busy machine, so the shares (and "
                "any A/B) may not hold on a quiet one; confidence lowered.",
        evidence=[Evidence(metric="other_processes_cpu", value=round(share, 4),
                           unit="of the cores the job may use", threshold=t.value,
                           comparison=">=", fired=True, source=t.source)])
