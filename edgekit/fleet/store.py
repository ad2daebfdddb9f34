"""Where the collector keeps a fleet: devices, their telemetry windows, and the gaps between them.

SQLite is the embedded default.  The schema is plain SQL with no SQLite-only types, so
a PostgreSQL store can share it.  A window is stored as the JSON the device sent (checked
by the collector; re-encoding it cost a sixth of the ingest time) with its key fields in
columns; sketches are merged when queried: percentiles of many windows or devices come from merged
counts, never from averaged percentiles.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edgekit.sketch import LatencySketch

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS devices (
        fleet TEXT NOT NULL, device TEXT NOT NULL, state TEXT NOT NULL, since REAL NOT NULL,
        last_seen REAL NOT NULL, birth TEXT NOT NULL, last_seq INTEGER NOT NULL, epoch TEXT NOT NULL,
        PRIMARY KEY (fleet, device))""",
    """CREATE TABLE IF NOT EXISTS windows (
        fleet TEXT NOT NULL, device TEXT NOT NULL, epoch TEXT NOT NULL, seq INTEGER NOT NULL,
        session TEXT NOT NULL, start REAL NOT NULL, stop REAL NOT NULL, frames INTEGER NOT NULL,
        missed INTEGER NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (fleet, device, epoch, seq))""",
    "CREATE INDEX IF NOT EXISTS windows_by_time ON windows (fleet, stop)",
    """CREATE TABLE IF NOT EXISTS gaps (
        fleet TEXT NOT NULL, device TEXT NOT NULL, epoch TEXT NOT NULL, first_missing INTEGER NOT NULL,
        last_missing INTEGER NOT NULL, noticed REAL NOT NULL)""",
)


class FleetStore:
    """The fleet in one SQLite file (``:memory:`` for tests and demos)."""

    def __init__(self, path: Path | str = ":memory:") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a crash may lose the last transactions, never corrupt the file.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.Lock()
        for statement in SCHEMA:
            self._db.execute(statement)

    def device(self, fleet: str, device: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT state, since, last_seen, birth, last_seq, epoch FROM devices WHERE fleet = ? AND device = ?",
                (fleet, device),
            ).fetchone()
        if row is None:
            return None
        return {
            "fleet": fleet,
            "device": device,
            "state": row[0],
            "since": row[1],
            "last_seen": row[2],
            "birth": json.loads(row[3]),
            "last_seq": row[4],
            "epoch": row[5],
        }

    def devices(self) -> list[dict[str, Any]]:
        with self._lock:
            keys = self._db.execute("SELECT fleet, device FROM devices ORDER BY fleet, device").fetchall()
        return [d for f, dev in keys if (d := self.device(f, dev)) is not None]

    def set_state(self, fleet: str, device: str, state: str, at: float, birth: dict[str, Any] | None) -> None:
        with self._lock:
            row = self._db.execute(
                "SELECT state, birth FROM devices WHERE fleet = ? AND device = ?", (fleet, device)
            ).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO devices VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (fleet, device, state, at, at, json.dumps(birth or {}), -1, ""),
                )
                return
            since_changed = row[0] != state
            self._db.execute(
                "UPDATE devices SET state = ?, last_seen = ?, birth = ?"
                + (", since = ?" if since_changed else "")
                + " WHERE fleet = ? AND device = ?",
                (
                    state,
                    at,
                    json.dumps(birth) if birth else row[1],
                    *((at,) if since_changed else ()),
                    fleet,
                    device,
                ),
            )

    def set_epoch(self, fleet: str, device: str, epoch: str) -> None:
        """The device's sequence restarted (a new spool): its numbering begins again."""
        with self._lock:
            self._db.execute(
                "UPDATE devices SET epoch = ?, last_seq = -1 WHERE fleet = ? AND device = ?",
                (epoch, fleet, device),
            )

    def add_windows(self, rows: list[tuple[str, str, dict[str, Any], str, float]]) -> int:
        """Store many ``(fleet, device, parsed, raw JSON, received at)`` windows in one transaction.

        Duplicates are ignored; returns how many were new.
        """
        if not rows:
            return 0
        values = [_row(fleet, device, p, raw) for fleet, device, p, raw, _ in rows]
        latest: dict[tuple[str, str], tuple[float, int]] = {}
        for fleet, device, p, _, at in rows:
            at0, seq0 = latest.get((fleet, device), (0.0, -1))
            latest[(fleet, device)] = (max(at0, at), max(seq0, int(p["seq"])))
        with self._lock:
            before = self._db.total_changes
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "INSERT OR IGNORE INTO windows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values
                )
                added = self._db.total_changes - before
                self._db.executemany(
                    "UPDATE devices SET last_seen = MAX(last_seen, ?), last_seq = MAX(last_seq, ?) "
                    "WHERE fleet = ? AND device = ?",
                    [(at, seq, f, d) for (f, d), (at, seq) in latest.items()],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return added

    def add_window(self, fleet: str, device: str, payload: dict[str, Any], at: float) -> bool:
        """Store one window; ``False`` when ``(device, seq)`` is already stored (a duplicate)."""
        return self.add_windows([(fleet, device, payload, json.dumps(payload), at)]) == 1

    def add_gap(self, fleet: str, device: str, first: int, last: int, at: float, epoch: str = "") -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO gaps VALUES (?, ?, ?, ?, ?, ?)", (fleet, device, epoch, first, last, at)
            )

    def gaps(self, fleet: str, device: str) -> list[tuple[int, int]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT first_missing, last_missing FROM gaps WHERE fleet = ? AND device = ? ORDER BY first_missing",
                (fleet, device),
            ).fetchall()
        return [(int(a), int(b)) for a, b in rows]

    def seqs(self, fleet: str, device: str, epoch: str | None = None) -> list[int]:
        sql = "SELECT seq FROM windows WHERE fleet = ? AND device = ?"
        args: tuple[str, ...] = (fleet, device)
        if epoch is not None:
            sql, args = sql + " AND epoch = ?", (*args, epoch)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq", args).fetchall()
        return [int(r[0]) for r in rows]

    def merged(
        self,
        fleet: str | None = None,
        device: str | None = None,
        since: float | None = None,
        until: float | None = None,
        stage: str | None = None,
    ) -> LatencySketch:
        """The latency (or one stage's) sketch of every matching window, merged: exact fleet percentiles."""
        where: list[str] = []
        args: list[str | float] = []
        for column, value in (("fleet", fleet), ("device", device)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("stop >= ?")
            args.append(since)
        if until is not None:
            where.append("stop <= ?")
            args.append(until)
        sql = "SELECT payload FROM windows" + (" WHERE " + " AND ".join(where) if where else "")
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        windows = (json.loads(r[0])["window"] for r in rows)
        picked = (w["latency_ms"] if stage is None else w["stages_ms"].get(stage) for w in windows)
        return merge(s for s in picked if s is not None)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def merge(sketches: Iterable[dict[str, Any]]) -> LatencySketch:
    """Merge sketch dicts (as telemetry carries them) into one."""
    total = LatencySketch()
    for data in sketches:
        total.merge(LatencySketch.from_dict(data))
    return total


def _row(fleet: str, device: str, p: dict[str, Any], raw: str) -> tuple[Any, ...]:
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
