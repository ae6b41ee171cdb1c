"""The ranks of a torchrun job agree on their profiling windows: rank 0 decides, the others
follow, over torchrun's rendezvous store.

Each rank's own rules (a DataLoader queue still draining, a window that was not steady state, a
one-off step) would place its window on its own, and a rank that profiled again alone would
leave the job's traces at different steps, its communication waits judged against steps the
others did not profile in. So in a job with a store, rank 0 (the leader) applies the rules and
publishes each decision as the step count after which window ``k`` starts (key ``start<k>``),
``LEAD_STEPS`` steps ahead of its own count, or ``none`` when there is no window ``k`` (the
last one held) with the step count after which every rank stops, when the script is stopped
after its window (``fix``'s profile rounds: a rank that stopped alone would leave the others
waiting in their next collective). The other ranks (followers) poll that key without blocking,
once per step, while they wait for a decision, and start their window ``k`` (or stop) after
that many steps of their own. The lead: in a job whose ranks meet in a collective every step, a
follower ends step ``n + 1`` only after the leader took part in that step's collective, which
comes after the leader ended step ``n`` and published; the rest of the lead covers a host
running ahead of its device. A follower that sees a decision for a step it has already passed
starts at once and says so. A follower that hears nothing for ``FOLLOW_WAIT_S`` seconds after
its own rules would have acted (a leader that stopped profiling, or runs far behind) decides
alone from then on. Without a store (other launchers) every rank decides alone, and the one-off
rule, which one slow rank would trip alone, is off there.

The leader decides from its own steps only: a window steady on rank 0 but not on another rank
is recorded as such in that rank's check (its ``representative`` is false), not profiled again.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, NamedTuple

log = logging.getLogger(__name__)

LEAD_STEPS = 3  # the leader's decisions take effect this many steps after it makes them
FOLLOW_WAIT_S = 60.0  # a follower waits this long past its own decision point, then decides
NO_WINDOW: Literal["none"] = "none"


class Decision(NamedTuple):
    """Rank 0's decision on one window, as the other ranks read it."""

    after_steps: int  # the window starts, or (``last``) the job stops, after this many steps
    reason: str  # why the window starts there
    last: bool  # there is no such window: the one before was the last


def torchrun_store() -> Any:
    """A client of torchrun's rendezvous store (MASTER_ADDR:MASTER_PORT), or None."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not addr or not port.isdigit() or "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        from torch.distributed import TCPStore

        return TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=30),
                        wait_for_workers=False)
    except Exception:
        return None


def world_size() -> int:
    """The job's processes, as torchrun and other launchers say (1 when none does)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


class WindowAgreement:
    """Publishes (rank 0) or reads (the other ranks) when each window starts."""

    def __init__(self, store: Any, out: Path, rank: int) -> None:
        self.store, self.rank = store, rank
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        # one run of torchrun may restart its workers, and ab/fix run trials into other dirs
        self.prefix = (f"torchtriage/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{attempt}/"
                       f"{Path(out).resolve()}/window/")

    @classmethod
    def for_job(cls, out: Path, rank: int) -> WindowAgreement | None:
        """The agreement of this job's ranks; None for one process, or without a store."""
        if world_size() <= 1:
            return None
        store = torchrun_store()
        return cls(store, out, rank) if store is not None else None

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def publish(self, window: int, after_steps: int, reason: str = "", *,
                last: bool = False) -> bool:
        """Leader: window ``window`` starts after ``after_steps`` steps, for ``reason``; or,
        ``last``, there is no such window and (for a script stopped after its window) the
        job stops after ``after_steps`` steps. False when the store could not be reached."""
        value = f"{NO_WINDOW if last else 'start'}\t{after_steps}\t{reason}"
        key = self.prefix + f"start{window}"
        try:
            self.store.set(key, value)
            # A set is not acknowledged: another client's read may reach torchrun's (libuv)
            # store before it (once in ~20 fresh client pairs, measured on torch 2.13). The
            # store answers one client's commands in order, so once this check is answered
            # every rank can read the decision.
            self.store.check([key])
            return True
        except Exception as exc:  # the agent went away: the followers time out and decide
            log.warning("torchtriage: could not publish the profiling window (%s)", exc)
            return False

    def decision(self, window: int) -> Decision | None:
        """Follower: rank 0's decision on window ``window``; None while there is none (or the
        store is unreachable)."""
        key = self.prefix + f"start{window}"
        try:
            if not self.store.check([key]):
                return None
            kind, after, reason = self.store.get(key).decode().split("\t", 2)
            return Decision(after_steps=int(after), reason=reason, last=kind == NO_WINDOW)
        except Exception as exc:  # unreachable or garbled: as if not decided yet
            log.debug("torchtriage: could not read %s from the store (%s)", key, exc)
            return None
