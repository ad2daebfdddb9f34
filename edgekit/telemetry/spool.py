"""``Spool``: the on-disk queue every telemetry message passes through (SQLite, bounded, in order).

A message is written here before it is published and deleted only when the broker
acknowledged it (PUBACK), so a dead broker, a dropped link or a crash loses nothing that
fits the bound.  When the bound is hit the oldest messages go first, and each one is
counted: the count travels in the next telemetry message, never silently.  A full disk
is not the end either: messages wait in memory (bounded the same way) and go out while
the broker is there, and the spool catches up once the disk has room again.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import TelemetryError
from edgekit.telemetry.spool_repair import TOTAL

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# What a disk that refuses writes (full, read-only) lets the spool hold in memory meanwhile.
DEFAULT_MEMORY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Spooled:
    """One queued message."""

    id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool


class Spool:
    """A bounded FIFO of MQTT messages in one SQLite file (``:memory:`` for none on disk).

    A disk that refuses writes (full, read-only, failing) does not stop it: what cannot be
    written is held in memory, up to ``memory_bytes`` (then the oldest go, counted in
    ``dropped``), and sequence numbers go on rising in memory; all of it is written once the
    disk takes writes again.  ``disk_error`` says why the disk refuses, ``""`` while it does not.
    """

    def __init__(
        self,
        path: Path | str = ":memory:",
        max_bytes: int = DEFAULT_MAX_BYTES,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        if max_bytes <= 0 or memory_bytes <= 0:
            raise TelemetryError(f"spool size bound must be positive, got {max_bytes}", "e.g. 64 MiB")
        self.path = str(path)
        self.max_bytes = max_bytes
        self.memory_bytes = memory_bytes
        self.dropped = 0  # only goes up: messages dropped at a bound
        self.disk_error = ""
        self._lock = threading.Lock()
        self._held: list[Spooled] = []  # rows the disk refused, oldest first; ids above every disk row
        self._held_bytes = 0
        self._forget: dict[int, int] = {}  # disk rows acked whose DELETE the disk refused: id -> size
        self._counters: dict[str, int] = {}  # the last value of each counter handed out
        self._unsaved: set[str] = set()  # counters (and "dropped") the disk does not have yet
        self.set_aside = 0  # only goes up: damaged spool files moved aside and started anew
        self._last_id = 0
        try:
            self._open()
        except sqlite3.DatabaseError as err:
            if self.path == ":memory:" or isinstance(err, sqlite3.OperationalError):
                raise TelemetryError(
                    f"telemetry spool {self.path} cannot be opened: {err}",
                    "check the folder exists and is writable, or give another --spool path",
                ) from err
            self._start_anew(err)

    def _open(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            # WAL: a crash mid-write leaves the queue as it was before that write.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            # The WAL is checkpointed at 1 MiB (not 4): on a nearly full disk its growth is what fails.
            self._db.execute("PRAGMA wal_autocheckpoint=256")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS queue (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
                "payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL)"
            )
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            # A truncated file can open and even answer a few queries: every page is read once here.
            check = str(self._db.execute("PRAGMA quick_check").fetchone()[0])
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            meta = dict(self._db.execute("SELECT key, value FROM meta WHERE key IN ('dropped', 'set_aside')"))
            self.dropped, self.set_aside = int(meta.get("dropped", 0)), int(meta.get("set_aside", 0))
            self._bytes = int(
                self._db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM queue").fetchone()[0]
            )
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'queue'").fetchone()
            self._last_id = int(row[0]) if row else 0
        except BaseException:
            self._db.close()
            raise

    def _start_anew(self, err: sqlite3.DatabaseError) -> None:
        """Set the damaged file aside, start an empty spool, carry on what can be read of the old one."""
        from edgekit.telemetry.spool_repair import salvage, set_aside

        aside = set_aside(Path(self.path))
        counters, unsent = salvage(aside)
        for key, value in self._counters.items():  # found damaged while in use: this process knows best
            counters[key] = value if key == "epoch" else max(counters.get(key, -1), value)
        counters["dropped"] = max(counters.get("dropped", 0), self.dropped) + unsent
        counters["set_aside"] = max(counters.get("set_aside", 0), self.set_aside) + 1
        last_id, self._forget = self._last_id, {}
        try:
            self._open()
            self._last_id = max(last_id, self._last_id)  # a publisher asks for ids above those it sent
            self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", counters.items())
        except sqlite3.DatabaseError as again:
            raise TelemetryError(
                f"telemetry spool {self.path} cannot be made anew: {again}",
                "check the folder is writable, or give another --spool path",
            ) from again
        self.dropped, self.set_aside = counters["dropped"], counters["set_aside"]
        log.warning(
            "telemetry: the spool %s is damaged (%s): set aside as %s and a new one started; %s",
            self.path,
            err,
            aside.name,
            f"{unsent} unsent messages in it are counted as dropped and seq goes on after {counters['seq']}"
            if "seq" in counters
            else "nothing of it could be read: seq starts again under a new epoch",
        )

    def repair(self, err: BaseException) -> bool:
        """If ``err`` (raised by this spool in use) says the file is damaged: set it aside, start anew.

        ``False`` for any other error, or when that fails too (logged: reporting goes on trying).
        """
        if not isinstance(err, sqlite3.DatabaseError) or isinstance(err, sqlite3.OperationalError):
            return False
        if self.path == ":memory:":
            return False
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            try:
                self._start_anew(err)
            except TelemetryError as failed:
                log.error("telemetry: %s (%s)", failed, failed.hint)
                return False
        return True

    # -- a disk that refuses writes ----------------------------------------------------------

    def _refused(self, err: sqlite3.Error) -> None:
        if not self.disk_error:
            log.warning(
                "telemetry: the spool %s cannot be written (%s): holding up to %d KiB in memory, "
                "then dropping the oldest (counted as spool_dropped)",
                self.path,
                err,
                self.memory_bytes // 1024,
            )
        self.disk_error = str(err)

    def _catch_up(self) -> bool:
        """Write what only memory holds (one transaction); ``False`` while the disk still refuses."""
        if not (self._held or self._forget or self._unsaved):
            return True
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for m in self._held:  # with their ids: a publisher may have them in flight
                    self._db.execute(
                        "INSERT INTO queue (id, topic, payload, qos, retain) VALUES (?, ?, ?, ?, ?)",
                        (m.id, m.topic, m.payload, m.qos, int(m.retain)),
                    )
                self._db.executemany("DELETE FROM queue WHERE id = ?", [(i,) for i in self._forget])
                saved = self._counters | {"dropped": self.dropped}
                self._db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)",
                    [(key, saved[key]) for key in self._unsaved if key in saved],
                )
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite may have rolled back on its own (a full disk)
                    self._db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as err:
            self._refused(err)
            return False
        if self.disk_error:
            log.info("telemetry: the spool %s is written again", self.path)
            # Give back the room the WAL took while it could not be checkpointed.
            with contextlib.suppress(sqlite3.OperationalError):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.disk_error = ""
        self._bytes += self._held_bytes
        self._held, self._held_bytes, self._forget, self._unsaved = [], 0, {}, set()
        return True

    def _hold(self, topic: str, payload: bytes, qos: int, retain: bool) -> int:
        self._last_id += 1
        self._held.append(Spooled(self._last_id, topic, payload, qos, retain))
        self._held_bytes += len(payload)
        while self._held_bytes > self.memory_bytes and len(self._held) > 1:
            self._held_bytes -= len(self._held.pop(0).payload)
            self.dropped += 1
            self._unsaved.add("dropped")
        return self._last_id

    # -- the queue -----------------------------------------------------------------------------

    def push(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> int:
        """Queue a message; drops the oldest (counted) while the queue is over its bound."""
        with self._lock:
            if not self._catch_up():
                return self._hold(topic, payload, qos, retain)
            try:
                # Above every id handed out, held rows acked before they reached the disk too: a
                # publisher asks for what is above the last id it sent.
                cur = self._db.execute(
                    "INSERT INTO queue (id, topic, payload, qos, retain) VALUES ((SELECT MAX(?, "
                    "COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'queue'), 0)) + 1), ?, ?, ?, ?)",
                    (self._last_id, topic, payload, qos, int(retain)),
                )
            except sqlite3.OperationalError as err:
                self._refused(err)
                return self._hold(topic, payload, qos, retain)
            self._last_id = int(cur.lastrowid or 0)
            self._bytes += len(payload)
            try:
                self._bound(self._last_id)
            except sqlite3.OperationalError as err:  # the row is in; the drops are redone next time
                self._refused(err)
            return self._last_id

    def _bound(self, newest: int) -> None:
        dropped = 0
        while self._bytes > self.max_bytes:
            oldest = self._db.execute("SELECT id, LENGTH(payload) FROM queue ORDER BY id LIMIT 1").fetchone()
            if oldest is None or oldest[0] == newest:
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

    def pending(self, limit: int = 100, after: int = 0) -> list[Spooled]:
        """The oldest queued messages with an id above ``after``, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, topic, payload, qos, retain FROM queue WHERE id > ? ORDER BY id LIMIT ?",
                (after, limit + len(self._forget)),
            ).fetchall()
            found = [
                Spooled(int(i), str(t), bytes(p), int(q), bool(r))
                for i, t, p, q, r in rows
                if i not in self._forget
            ]
            found += [m for m in self._held if m.id > after]
        return found[:limit]

    def ack(self, message_id: int) -> None:
        """The broker has the message: forget it."""
        with self._lock:
            for i, m in enumerate(self._held):
                if m.id == message_id:
                    del self._held[i]
                    self._held_bytes -= len(m.payload)
                    return
            if message_id in self._forget:
                return
            row = self._db.execute("SELECT LENGTH(payload) FROM queue WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return
            self._bytes -= int(row[0])
            try:
                self._db.execute("DELETE FROM queue WHERE id = ?", (message_id,))
            except sqlite3.OperationalError as err:
                self._refused(err)
                self._forget[message_id] = int(row[0])

    def next_sequence(self, key: str = "seq") -> int:
        """The next number of a counter kept in the spool (0 first), so it keeps rising across restarts.

        ``seq`` numbers telemetry messages; the Sparkplug flavour keeps ``bdseq`` here too.  One
        statement, so two processes sharing a spool never get the same number.  While the disk
        refuses writes the number rises in memory (a window then dropped is a gap in ``seq``).
        """
        with self._lock:
            floor = self._counters.get(key, -1) + 1
            try:
                row = self._db.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = MAX(value + 1, excluded.value) RETURNING value",
                    (key, floor),
                ).fetchone()
                value = int(row[0])
            except sqlite3.OperationalError as err:
                self._refused(err)
                if key not in self._counters:
                    row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
                    floor = int(row[0]) + 1 if row else 0
                value = floor
                self._unsaved.add(key)
            self._counters[key] = value
            return value

    def keep_totals(self, totals: Mapping[str, int]) -> None:
        """Save counter totals so that a process started again on this spool goes on from them.

        Kept beside ``seq`` in ``meta`` (keys ``total:<name>``), one transaction; they only go up
        (a lower value never replaces a higher one).  While the disk refuses writes they wait in
        memory with the sequence numbers.
        """
        rows = {TOTAL + k: int(v) for k, v in totals.items()}
        with self._lock:
            for key, value in rows.items():
                self._counters[key] = max(self._counters.get(key, 0), value)
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)",
                        rows.items(),
                    )
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as err:
                self._refused(err)
                self._unsaved.update(rows)

    def totals(self) -> dict[str, int]:
        """The counter totals ``keep_totals`` saved (by this process or an earlier one)."""
        with self._lock:
            rows = self._db.execute("SELECT key, value FROM meta WHERE key LIKE 'total:%'").fetchall()
            found = {str(k): int(v) for k, v in rows} | {
                k: v for k, v in self._counters.items() if k.startswith(TOTAL)
            }
        return {k.removeprefix(TOTAL): v for k, v in found.items()}

    @property
    def epoch(self) -> str:
        """A random id made with the spool: sequence numbers are unique per (device, epoch).

        A recreated spool starts ``seq`` at 0 again; the new epoch tells a collector that this
        is not a replay of what it already has.
        """
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            if row is not None:
                value = self._counters["epoch"] = int(row[0])
            elif "epoch" in self._counters:  # made while the disk refused writes: saved with the rest
                value = self._counters["epoch"]
            else:
                value = self._counters["epoch"] = secrets.randbits(48)
                try:
                    self._db.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", (value,))
                except sqlite3.OperationalError as err:
                    self._refused(err)
                    self._unsaved.add("epoch")
        return f"{value:012x}"

    def __len__(self) -> int:
        with self._lock:
            on_disk = int(self._db.execute("SELECT COUNT(*) FROM queue").fetchone()[0])
            return on_disk - len(self._forget) + len(self._held)

    @property
    def bytes(self) -> int:
        return self._bytes + self._held_bytes

    def close(self) -> None:
        with self._lock:
            if not self._catch_up() and self._held:
                log.warning(
                    "telemetry: %d messages held in memory are lost: the spool %s still cannot be written",
                    len(self._held),
                    self.path,
                )
            self._db.close()


def default_spool(fleet: str, device_id: str, format: str = "json") -> Path:
    """``<state root>/telemetry/<fleet>-<device>[-sparkplug].db``: on disk, so a restart replays what was not sent.

    Spools were kept under the cache root before; one left there (and none in the state root
    yet) is used where it is, so an upgrade does not lose telemetry that was not sent.
    """
    from edgekit.core.paths import cache_root, state_root

    name = f"{fleet}-{device_id}{'' if format == 'json' else f'-{format}'}.db"
    path, earlier = state_root() / "telemetry" / name, cache_root() / "telemetry" / name
    return earlier if earlier.exists() and not path.exists() else path
