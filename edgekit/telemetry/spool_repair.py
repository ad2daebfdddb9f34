"""A damaged spool is set aside, not a reason to stop: ``set_aside(path)`` and ``salvage(aside)``.

A spool is an SQLite file on the device's own storage: an SD card that lost power mid-write,
a truncated copy or stray bytes make it unreadable.  Telemetry is never a reason to stop
labelling frames, so the damaged file (with its WAL) is renamed with a timestamp, kept for a
look later, and a new spool is started.  What can still be read of the old one's counters
carries over: the same ``epoch`` and a ``seq`` that goes on from where it was, so the
windows that were lost in it are a gap the collector records; its unsent rows, where they
can be counted, count as dropped.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from edgekit.errors import TelemetryError

# The counters of the old spool a new one carries on, and the counter totals a restarted
# process goes on from (keys ``TOTAL + name``); any other key is left behind.
CARRIED = ("epoch", "seq", "bdseq", "starts", "dropped", "set_aside")
# The prefix of those totals' keys in ``meta`` (``Spool.keep_totals``).
TOTAL = "total:"


def set_aside(path: Path) -> Path:
    """Rename ``path`` (and its ``-wal`` and ``-shm``) to ``<path>.corrupt-<UTC time>``; that new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.corrupt-{stamp}-{n}"), n + 1
    try:
        for suffix in ("", "-wal", "-shm"):  # the WAL belongs to its database: they go together
            src = Path(f"{path}{suffix}")
            if src.exists():
                os.replace(src, Path(f"{aside}{suffix}"))
    except OSError as err:
        raise TelemetryError(
            f"the telemetry spool {path} is damaged and cannot be moved aside: {err}",
            "move it away by hand (a new one is made) or give another --spool path",
        ) from err
    return aside


def salvage(aside: Path) -> tuple[dict[str, int], int]:
    """The counters still readable in a set-aside spool, and how many unsent rows it held (0 if unknown)."""
    try:
        db = sqlite3.connect(aside, isolation_level=None)
    except sqlite3.Error:
        return {}, 0
    try:
        try:
            # A file shorter than its header says is refused outright, unless the schema is "writable":
            # then SQLite reads what the file has (nothing is written to the set-aside copy).
            db.execute("PRAGMA writable_schema=ON")
            rows = db.execute("SELECT key, value FROM meta").fetchall()
            counters = {
                str(k): int(v)
                for k, v in rows
                if (k in CARRIED or str(k).startswith(TOTAL)) and isinstance(v, int) and v >= 0
            }
        except sqlite3.Error:
            return {}, 0
        try:
            unsent = int(db.execute("SELECT COUNT(*) FROM queue").fetchone()[0])
        except sqlite3.Error:
            unsent = 0  # the seq gap still shows them
        return counters, unsent
    finally:
        db.close()
