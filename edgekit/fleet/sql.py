"""The fleet store's SQL, shared by the SQLite and the PostgreSQL store: the ``Dialect``, the schema,
the statements, the rows they take, and ``StoreError``.

The statements are written once, SQLite-style; a ``Dialect`` translates them (placeholders,
column types, ``MAX`` vs ``GREATEST``).  Both stores import this module and neither imports
the other's, so the two stay free of import cycles.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from edgekit.errors import EdgekitError


class StoreError(EdgekitError):
    """The fleet store could not be opened (bad path or URL, server unreachable, refused credentials)."""


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL databases the store speaks; the statements are written once, SQLite-style."""

    name: str
    placeholder: str  # replaces each ``?`` in a statement
    greatest: str  # the two-argument maximum: SQLite's scalar MAX(), PostgreSQL's GREATEST()
    real: str  # a timestamp in seconds needs a double; PostgreSQL's REAL is only a float4
    integer: str  # seq reaches 2**63; PostgreSQL's INTEGER is only 32 bits
    # Taken in a compaction's transaction so two compactors cannot merge into one rollup at once
    # (SQLite needs none: BEGIN IMMEDIATE already admits one writer).
    compaction_lock: str | None = None

    def sql(self, statement: str) -> str:
        return _translate(self, statement)


@functools.lru_cache(maxsize=256)
def _translate(dialect: Dialect, statement: str) -> str:
    text = statement.format(greatest=dialect.greatest, real=dialect.real, int=dialect.integer)
    return text.replace("?", dialect.placeholder)


SCHEMA = (
    """CREATE TABLE IF NOT EXISTS devices (
        fleet TEXT NOT NULL, device TEXT NOT NULL, state TEXT NOT NULL, since {real} NOT NULL,
        last_seen {real} NOT NULL, birth TEXT NOT NULL, last_seq {int} NOT NULL, epoch TEXT NOT NULL,
        PRIMARY KEY (fleet, device))""",
    """CREATE TABLE IF NOT EXISTS windows (
        fleet TEXT NOT NULL, device TEXT NOT NULL, epoch TEXT NOT NULL, seq {int} NOT NULL,
        session TEXT NOT NULL, start {real} NOT NULL, stop {real} NOT NULL, frames {int} NOT NULL,
        missed {int} NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (fleet, device, epoch, seq))""",
    "CREATE INDEX IF NOT EXISTS windows_by_time ON windows (fleet, stop)",
    # A fleet-wide time range (the dashboard's charts read every fleet at once) and compaction's
    # ``stop < cutoff``; a device's range is served by the key's (fleet, device) prefix: a device
    # keeps only ``raw_keep_s`` of raw windows.
    "CREATE INDEX IF NOT EXISTS windows_by_stop ON windows (stop)",
    """CREATE TABLE IF NOT EXISTS gaps (
        fleet TEXT NOT NULL, device TEXT NOT NULL, epoch TEXT NOT NULL, first_missing {int} NOT NULL,
        last_missing {int} NOT NULL, noticed {real} NOT NULL)""",
    # One row per device per ``span`` seconds from ``t0``: the merge of the windows whose stop fell
    # in it.  ``stop`` is the latest of those stops, so time filters read both tables alike.
    """CREATE TABLE IF NOT EXISTS rollups (
        fleet TEXT NOT NULL, device TEXT NOT NULL, span {real} NOT NULL, t0 {real} NOT NULL,
        stop {real} NOT NULL, windows {int} NOT NULL, frames {int} NOT NULL, missed {int} NOT NULL,
        latency TEXT NOT NULL, stages TEXT NOT NULL, PRIMARY KEY (fleet, device, span, t0))""",
    "CREATE INDEX IF NOT EXISTS rollups_by_time ON rollups (fleet, stop)",
    # Rollups are kept for months: a fleet-wide range and one device's range each need their own index
    # (compaction writes rollups, rarely, so the indexes cost ingest nothing).
    "CREATE INDEX IF NOT EXISTS rollups_by_stop ON rollups (stop)",
    "CREATE INDEX IF NOT EXISTS rollups_by_device ON rollups (fleet, device, stop)",
    # A detector's per-class counts of a rollup (a raw window keeps its own in its payload).  A table of
    # its own rather than a column of ``rollups``: a store made before detection gains it as it opens.
    """CREATE TABLE IF NOT EXISTS rollup_detections (
        fleet TEXT NOT NULL, device TEXT NOT NULL, span {real} NOT NULL, t0 {real} NOT NULL,
        stop {real} NOT NULL, name TEXT NOT NULL, frames {int} NOT NULL, objects {int} NOT NULL,
        max_score {real} NOT NULL, PRIMARY KEY (fleet, device, span, t0, name))""",
    "CREATE INDEX IF NOT EXISTS rollup_detections_by_time ON rollup_detections (fleet, stop)",
    "CREATE INDEX IF NOT EXISTS rollup_detections_by_stop ON rollup_detections (stop)",
    # A many-camera device's per-camera figures of a rollup (a raw window keeps its own in its payload).
    # A table of its own, like ``rollup_detections``: a store made before cameras gains it as it opens.
    """CREATE TABLE IF NOT EXISTS rollup_cameras (
        fleet TEXT NOT NULL, device TEXT NOT NULL, span {real} NOT NULL, t0 {real} NOT NULL,
        stop {real} NOT NULL, name TEXT NOT NULL, frames {int} NOT NULL, missed {int} NOT NULL,
        dropped {int} NOT NULL, latency TEXT NOT NULL, PRIMARY KEY (fleet, device, span, t0, name))""",
    "CREATE INDEX IF NOT EXISTS rollup_cameras_by_time ON rollup_cameras (fleet, stop)",
    "CREATE INDEX IF NOT EXISTS rollup_cameras_by_stop ON rollup_cameras (stop)",
    # Each camera's latest health (a single source's under camera ""): counts since the device's pipeline
    # started, seconds without frames, seconds since its last frame, as of ``stop`` (its window's end).
    """CREATE TABLE IF NOT EXISTS camera_health (
        fleet TEXT NOT NULL, device TEXT NOT NULL, camera TEXT NOT NULL, stop {real} NOT NULL,
        outages {int} NOT NULL, reopens {int} NOT NULL, stalls {int} NOT NULL, corrupt {int} NOT NULL,
        size_changes {int} NOT NULL, rate_changes {int} NOT NULL, down_s {real} NOT NULL,
        since_frame_s {real} NOT NULL,
        PRIMARY KEY (fleet, device, camera))""",
    # The sequence numbers rolled up, as ranges: the last seq alone would not do, because a replay
    # may still fill a gap below it, and that late window is new.
    """CREATE TABLE IF NOT EXISTS compacted (
        fleet TEXT NOT NULL, device TEXT NOT NULL, epoch TEXT NOT NULL, first_seq {int} NOT NULL,
        last_seq {int} NOT NULL, stop {real} NOT NULL, PRIMARY KEY (fleet, device, epoch, first_seq))""",
    # Zone and line events (``edgekit.fleet.zone_events``): the event's own id is the key, so a replay is
    # dropped by the insert.  ``t`` is the capture time the event reports, ``received`` when it arrived.
    """CREATE TABLE IF NOT EXISTS events (
        fleet TEXT NOT NULL, device TEXT NOT NULL, id TEXT NOT NULL, camera TEXT NOT NULL,
        kind TEXT NOT NULL, zone TEXT, t {real} NOT NULL, received {real} NOT NULL, payload TEXT NOT NULL,
        PRIMARY KEY (fleet, device, id))""",
    "CREATE INDEX IF NOT EXISTS events_by_camera ON events (fleet, device, camera, t)",
    "CREATE INDEX IF NOT EXISTS events_by_time ON events (t)",
    # The device list of a large fleet (``edgekit.fleet.board``): each device's birth facts as columns
    # and its newest window's figures, one row a device.  Filtering, sorting worst first and paging
    # 10,000 devices is then one statement over 10,000 narrow rows; deriving the same from ``devices``'
    # birth JSON and the windows would read every device's hour of raw windows per page.  The facts are
    # written with a birth, the figures with each batch of windows (one upsert per device, as
    # ``devices.last_seen`` already is); a table of its own, so a store made before it gains it as it opens.
    """CREATE TABLE IF NOT EXISTS device_latest (
        fleet TEXT NOT NULL, device TEXT NOT NULL, site TEXT, profile TEXT, backend TEXT, model TEXT,
        version TEXT, budget_ms {real}, stop {real}, frames {int}, missed {int}, p50 {real}, p95 {real},
        p99 {real}, PRIMARY KEY (fleet, device))""",
    # Each fleet's telemetry merged over all its devices per rollup step, written by ``compact`` with the
    # per-device rollups: a fleet's p99 over a week is then ~1,600 merged sketches, not 10,000 devices'
    # 15 million rollups.  It covers what compaction has rolled up (all but the last ``raw_keep_s``).
    """CREATE TABLE IF NOT EXISTS fleet_rollups (
        fleet TEXT NOT NULL, span {real} NOT NULL, t0 {real} NOT NULL, stop {real} NOT NULL,
        windows {int} NOT NULL, frames {int} NOT NULL, missed {int} NOT NULL, latency TEXT NOT NULL,
        PRIMARY KEY (fleet, span, t0))""",
    "CREATE INDEX IF NOT EXISTS fleet_rollups_by_stop ON fleet_rollups (fleet, stop)",
)

# A birth's facts (``edgekit.fleet.board.facts``) into the device list's row; its figures stay.
UPSERT_FACTS = """INSERT INTO device_latest (fleet, device, site, profile, backend, model, version, budget_ms)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (fleet, device) DO UPDATE SET site = excluded.site, profile = excluded.profile,
        backend = excluded.backend, model = excluded.model, version = excluded.version,
        budget_ms = excluded.budget_ms"""

# A device's newest window's figures; a replayed (older) window does not overwrite newer ones.
UPSERT_FIGURES = """INSERT INTO device_latest (fleet, device, stop, frames, missed, p50, p95, p99)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (fleet, device) DO UPDATE SET stop = excluded.stop, frames = excluded.frames,
        missed = excluded.missed, p50 = excluded.p50, p95 = excluded.p95, p99 = excluded.p99
    WHERE device_latest.stop IS NULL OR excluded.stop >= device_latest.stop"""

UPSERT_FLEET_ROLLUP = """INSERT INTO fleet_rollups (fleet, span, t0, stop, windows, frames, missed, latency)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (fleet, span, t0) DO UPDATE SET stop = excluded.stop, windows = excluded.windows,
        frames = excluded.frames, missed = excluded.missed, latency = excluded.latency"""

INSERT_WINDOW = """INSERT INTO windows (fleet, device, epoch, seq, session, start, stop, frames, missed, payload)
    SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE NOT EXISTS (
        SELECT 1 FROM compacted c
        WHERE c.fleet = ? AND c.device = ? AND c.epoch = ? AND c.first_seq <= ? AND c.last_seq >= ?)
    ON CONFLICT DO NOTHING"""

UPSERT_ROLLUP = """INSERT INTO rollups (fleet, device, span, t0, stop, windows, frames, missed, latency, stages)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (fleet, device, span, t0) DO UPDATE SET stop = excluded.stop, windows = excluded.windows,
        frames = excluded.frames, missed = excluded.missed, latency = excluded.latency, stages = excluded.stages"""


# A replayed (older) window does not overwrite a camera's newer health.
UPSERT_HEALTH = """INSERT INTO camera_health (fleet, device, camera, stop, outages, reopens, stalls, corrupt,
        size_changes, rate_changes, down_s, since_frame_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (fleet, device, camera) DO UPDATE SET stop = excluded.stop, outages = excluded.outages,
        reopens = excluded.reopens, stalls = excluded.stalls, corrupt = excluded.corrupt,
        size_changes = excluded.size_changes, rate_changes = excluded.rate_changes, down_s = excluded.down_s, since_frame_s = excluded.since_frame_s
    WHERE excluded.stop >= camera_health.stop"""


def where_clause(
    fleet: str | None, device: str | None, since: float | None, until: float | None
) -> tuple[str, list[str | float]]:
    """A WHERE clause on the columns ``windows`` and ``rollups`` share, and its arguments."""
    clauses: list[str] = []
    args: list[str | float] = []
    for column, value in (("fleet", fleet), ("device", device)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if since is not None:
        clauses.append("stop >= ?")
        args.append(since)
    if until is not None:
        clauses.append("stop <= ?")
        args.append(until)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def window_row(fleet: str, device: str, p: dict[str, Any], raw: str) -> tuple[Any, ...]:
    """A telemetry window as a ``windows`` row (its columns in order), ``raw`` its JSON as received."""
    w = p["window"]
    seq, session, epoch = int(p["seq"]), str(p.get("session", "")), str(p.get("epoch", ""))
    return (
        fleet,
        device,
        epoch,
        seq,
        session,
        float(w["start"]),
        float(w["end"]),
        int(w["frames"]),
        int(w["missed"]),
        raw,
    )
