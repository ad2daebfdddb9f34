"""``Continuity``: a process started again on the same spool goes on counting where the last one stopped.

The pipeline's counters start at zero in every process.  A pipeline that crashed (or was killed
by the watchdog, or restarted after a deploy) and came back would otherwise report totals that
fall back to zero, and a crash would look like a quiet device.  So the totals every telemetry
message reports are also kept in the spool, beside ``seq`` (one SQLite transaction: the file is
already the device's state that outlives a process), and the next process adds its own counts
to them.  ``restarts`` counts the processes started on the spool after the first one, whatever
ended the one before.

What a process counted after its last telemetry message and before it died is lost: it was
never reported, and its frames are in no window either, so totals and windows still agree.
The spool's own counters (``spool_dropped``, ``spool_set_aside``) are kept by the spool and are
not added up again.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgekit.telemetry.spool import Spool

# Counters that are not this process's to add up: the restart count, and those the spool keeps.
NOT_CARRIED = frozenset({"restarts", "spool_dropped", "spool_set_aside"})


class Continuity:
    """Totals across restarts: ``totals(now)`` is what earlier processes reported plus ``now``."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self._base = spool.totals()  # read before anything of this process is kept
        self.restarts = spool.next_sequence("starts")  # 0 for the first process on the spool

    def totals(self, now: Mapping[str, int]) -> dict[str, int]:
        """``now`` (this process's counters) on top of the earlier ones, and ``restarts``."""
        out = dict(self._base)  # a counter only an earlier process had still counts
        for key, value in now.items():
            out[key] = self._base.get(key, 0) + value
        out["restarts"] = self.restarts
        return out

    def keep(self, reported: Mapping[str, int]) -> None:
        """Save a message's counters for the next process (all but ``NOT_CARRIED``)."""
        self._spool.keep_totals({k: v for k, v in reported.items() if k not in NOT_CARRIED})
