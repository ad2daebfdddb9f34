"""``Spool``: the on-disk queue every telemetry message passes through (SQLite, bounded, in order).

A message is written here before it is published and deleted only when the broker
acknowledged it (PUBACK), so a dead broker, a dropped link or a crash loses nothing that
fits the bound.  When the bound is hit the oldest messages go first, and each one is
counted: the count travels in the next telemetry message, never silently.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import TelemetryError

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Spooled:
    """One queued message."""

    id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool


class Spool:
    """A bounded FIFO of MQTT messages in one SQLite file (``:memory:`` for none on disk)."""

    def __init__(self, path: Path | str = ":memory:", max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            raise TelemetryError(f"spool size bound must be positive, got {max_bytes}", "e.g. 64 MiB")
        self.path = str(path)
        self.max_bytes = max_bytes
        self.dropped = 0  # only goes up: messages dropped at the bound
        self._lock = threading.Lock()
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            # WAL: a crash mid-write leaves the queue as it was before that write.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS queue (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
                "payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL)"
            )
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            row = self._db.execute("SELECT value FROM meta WHERE key = 'dropped'").fetchone()
            self.dropped = int(row[0]) if row else 0
            self._bytes = int(
                self._db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM queue").fetchone()[0]
            )
        except sqlite3.DatabaseError as err:
            raise TelemetryError(
                f"telemetry spool {self.path} is not a usable SQLite file: {err}",
                "move it away (it is recreated) or give another --spool path",
            ) from err

    def push(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> int:
        """Queue a message; drops the oldest (counted) while the queue is over its bound."""
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO queue (topic, payload, qos, retain) VALUES (?, ?, ?, ?)",
                (topic, payload, qos, int(retain)),
            )
            self._bytes += len(payload)
            dropped = 0
            while self._bytes > self.max_bytes:
                oldest = self._db.execute(
                    "SELECT id, LENGTH(payload) FROM queue ORDER BY id LIMIT 1"
                ).fetchone()
                if oldest is None or oldest[0] == cur.lastrowid:
                    break  # never drop the message just written
                self._db.execute("DELETE FROM queue WHERE id = ?", (oldest[0],))
                self._bytes -= int(oldest[1])
                dropped += 1
            if dropped:
                self.dropped += dropped
                self._db.execute(
                    "INSERT INTO meta (key, value) VALUES ('dropped', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (self.dropped,),
                )
            return int(cur.lastrowid or 0)

    def pending(self, limit: int = 100, after: int = 0) -> list[Spooled]:
        """The oldest queued messages with an id above ``after``, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, topic, payload, qos, retain FROM queue WHERE id > ? ORDER BY id LIMIT ?",
                (after, limit),
            ).fetchall()
        return [Spooled(int(i), str(t), bytes(p), int(q), bool(r)) for i, t, p, q, r in rows]

    def ack(self, message_id: int) -> None:
        """The broker has the message: forget it."""
        with self._lock:
            row = self._db.execute("SELECT LENGTH(payload) FROM queue WHERE id = ?", (message_id,)).fetchone()
            if row is not None:
                self._db.execute("DELETE FROM queue WHERE id = ?", (message_id,))
                self._bytes -= int(row[0])

    def next_sequence(self, key: str = "seq") -> int:
        """The next number of a counter kept in the spool (0 first), so it keeps rising across restarts.

        ``seq`` numbers telemetry messages; the Sparkplug flavour keeps ``bdseq`` here too.  One
        statement, so two processes sharing a spool never get the same number.
        """
        with self._lock:
            row = self._db.execute(
                "INSERT INTO meta (key, value) VALUES (?, 0) ON CONFLICT(key) DO UPDATE SET value = value + 1 "
                "RETURNING value",
                (key,),
            ).fetchone()
            return int(row[0])

    @property
    def epoch(self) -> str:
        """A random id made with the spool: sequence numbers are unique per (device, epoch).

        A recreated spool starts ``seq`` at 0 again; the new epoch tells a collector that this
        is not a replay of what it already has.
        """
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            if row is None:
                value = secrets.randbits(48)
                self._db.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", (value,))
            else:
                value = int(row[0])
        return f"{value:012x}"

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM queue").fetchone()[0])

    @property
    def bytes(self) -> int:
        return self._bytes

    def close(self) -> None:
        with self._lock:
            self._db.close()


def default_spool(fleet: str, device_id: str, format: str = "json") -> Path:
    """``<state root>/telemetry/<fleet>-<device>[-sparkplug].db``: on disk, so a restart replays what was not sent.

    Spools were kept under the cache root before; one left there (and none in the state root
    yet) is used where it is, so an upgrade does not lose telemetry that was not sent.
    """
    from edgekit._core.paths import cache_root, state_root

    name = f"{fleet}-{device_id}{'' if format == 'json' else f'-{format}'}.db"
    path, earlier = state_root() / "telemetry" / name, cache_root() / "telemetry" / name
    return earlier if earlier.exists() and not path.exists() else path
