"""``FleetStore``: where the collector keeps a fleet in SQLite: devices, their telemetry windows, rollups
of old windows, and gaps.

SQLite is the embedded default; ``PostgresStore`` (``edgekit.fleet.pgstore``) keeps the same
tables in PostgreSQL when a fleet outgrows one box, and ``edgekit.fleet.open_store.open_store``
picks one from a path or a ``postgresql://`` URL.  Both run the SQL (``edgekit.fleet.sql``) and
the logic of ``FleetStore``; only a ``Dialect`` and the connection differ.

A window is stored as the JSON the device sent (checked by the collector; re-encoding it
cost a sixth of the ingest time) with its key fields in columns; sketches are merged when
queried: percentiles of many windows or devices come from merged counts, never from
averaged percentiles.  ``compact`` merges old windows into per-device rollups (the same
merged sketches, at a coarser time step) and remembers which sequence numbers it rolled
up, so a replayed old window is still known as a duplicate.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from edgekit.core.sketch import LatencySketch
from edgekit.core.tally import ClassCount
from edgekit.fleet import camera_health, camera_rollups, zone_events
from edgekit.fleet.camera_totals import add_cameras
from edgekit.fleet.latest import budget_ms, facts, figures
from edgekit.fleet.sql import (
    INSERT_WINDOW,
    SCHEMA,
    UPSERT_FACTS,
    UPSERT_FIGURES,
    UPSERT_FLEET_ROLLUP,
    UPSERT_ROLLUP,
    Dialect,
    StoreError,
    where_clause,
    window_row,
)
from edgekit.fleet.sums import Bucket, SketchSum, WindowSum, add_detections, loads

SQLITE = Dialect("sqlite", "?", "MAX", "REAL", "INTEGER")

# Windows compacted per transaction: bounds memory, and lets the collector write between chunks.
COMPACT_CHUNK = 20_000
# Devices whose old rollups are merged into a coarser level per transaction (a device has a few per run).
LEVEL_CHUNK_DEVICES = 200

#: ``FleetStore.layout()`` of a SQLite store: one plain ``windows`` table.
LAYOUT_SQLITE = "plain table (sqlite)"


def retention_levels(
    rollup_s: float, keep_s: float, levels: Sequence[tuple[float, float]] | None
) -> tuple[tuple[float, float], ...]:
    """``compact``'s rollup levels, finest first: ``levels`` checked, or the one level ``(rollup_s, keep_s)``."""
    plan = tuple((float(s), float(k)) for s, k in levels) if levels is not None else ((rollup_s, keep_s),)
    if not plan:
        raise ValueError("compact needs at least one rollup level (span_s, keep_s)")
    for i, (span, keep) in enumerate(plan):
        if not span > 0 or keep < 0:
            raise ValueError(f"rollup level {i} needs span_s > 0 and keep_s >= 0, not ({span}, {keep})")
        if i:
            finer, finer_keep = plan[i - 1]
            # A coarser step must hold whole finer steps, or a finer rollup would straddle two coarser ones.
            ratio = span / finer
            if span <= finer or abs(ratio - round(ratio)) > 1e-9:
                raise ValueError(f"rollup level {i}'s span {span} s must be a multiple of {finer} s")
            if keep < finer_keep:
                raise ValueError(f"rollup level {i} must be kept at least as long as level {i - 1}")
    return plan


ROLLOUTS = (
    "CREATE TABLE IF NOT EXISTS rollout_state (fleet TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL, "
    "updated DOUBLE PRECISION NOT NULL, PRIMARY KEY (fleet, name))"
)


def _facts_row(fleet: str, device: str, birth: dict[str, Any]) -> tuple[Any, ...]:
    """``UPSERT_FACTS``' arguments for a device's birth."""
    return (fleet, device, *facts(birth), budget_ms(birth))


DEVICE_COLUMNS = "fleet, device, state, since, last_seen, birth, last_seq, epoch"


def _device_row(row: tuple[Any, ...]) -> dict[str, Any]:
    """A ``devices`` row (``DEVICE_COLUMNS``) as the dict ``device`` and ``devices`` return."""
    keys = ("fleet", "device", "state", "since", "last_seen", "birth", "last_seq", "epoch")
    out = dict(zip(keys, row, strict=True))
    out["birth"] = loads(out["birth"])
    return out


class FleetStore:
    """The fleet in one SQLite file (``:memory:`` for tests and demos).  Thread-safe.

    Subclasses keep the SQL and the logic and replace the connection: ``_query``, ``_execute``,
    ``_execute_many``, ``_transaction`` and ``_close`` (see ``PostgresStore``).
    """

    dialect: ClassVar[Dialect] = SQLITE
    # What the database raises on a failed statement; the collector catches these around writes.
    errors: ClassVar[tuple[type[Exception], ...]] = (sqlite3.Error,)
    # Those of them that say the database cannot take writes now (locked, unreachable, a deadlock),
    # not that the row is bad: the collector keeps the message unacknowledged for a later try.
    transient: ClassVar[tuple[type[Exception], ...]] = (sqlite3.OperationalError,)

    def __init__(self, path: Path | str = ":memory:") -> None:
        self.path = str(path)
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
        except (sqlite3.Error, OSError) as err:
            raise StoreError(
                f"cannot open the fleet database {self.path}: {err}",
                "give a writable file path (--db fleet.db) or a postgresql:// URL",
            ) from err
        # WAL + NORMAL: a crash may lose the last transactions, never corrupt the file.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        for statement in SCHEMA:
            self._execute(statement)
        # A store made before the device list's table: its devices' facts come from their births, once.
        missing = self._query(
            "SELECT d.fleet, d.device, d.birth FROM devices d WHERE NOT EXISTS "
            "(SELECT 1 FROM device_latest l WHERE l.fleet = d.fleet AND l.device = d.device)"
        )
        if missing:
            self._execute_many(UPSERT_FACTS, [_facts_row(f, d, loads(b)) for f, d, b in missing])

    # -- the connection: the only methods a dialect's store overrides ---------------------------

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a statement written with ``?`` placeholders (translated for the dialect)."""
        return self._db.execute(self.dialect.sql(sql), tuple(args)).fetchall()

    def _execute(self, sql: str, args: Iterable[Any] = ()) -> int:
        """Run a statement; how many rows it changed."""
        return self._db.execute(self.dialect.sql(sql), tuple(args)).rowcount

    def _execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        """Run a statement once per row; how many rows it changed in all."""
        return self._db.executemany(self.dialect.sql(sql), rows).rowcount

    def _prepare_windows(self, values: list[tuple[Any, ...]]) -> None:
        """Make room for window rows before their transaction (PostgreSQL: their day's partitions)."""

    def _maintain_windows(self, now: float, cutoff: float) -> int:
        """After compaction: make the coming days' stores of raw windows, drop those older than ``cutoff``
        that compaction emptied; how many were dropped (PostgreSQL's day partitions; SQLite has none)."""
        return 0

    def layout(self) -> str:
        """How raw windows are kept: ``"plain table (sqlite)"``, ``"native partitions by day"``,
        ``"timescaledb hypertable"`` or ``"plain table (postgresql)"`` (logged at start, shown by tools)."""
        return LAYOUT_SQLITE

    def _insert_windows(self, values: list[tuple[Any, ...]]) -> int:
        """Insert window rows (``windows``' columns in order) inside the caller's transaction; how many were new."""
        return self._execute_many(INSERT_WINDOW, [(*v, *v[:4], v[3]) for v in values])

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        # IMMEDIATE takes the write lock up front: two processes cannot deadlock upgrading a read lock.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _close(self) -> None:
        self._db.close()

    # -- devices ----------------------------------------------------------------------------------

    def device(self, fleet: str, device: str) -> dict[str, Any] | None:
        """The device's row (state, since, last_seen, birth, last_seq, epoch), or ``None`` if never seen."""
        with self._lock:
            rows = self._query(
                f"SELECT {DEVICE_COLUMNS} FROM devices WHERE fleet = ? AND device = ?", (fleet, device)
            )
        return _device_row(rows[0]) if rows else None

    def device_seen(self) -> dict[tuple[str, str], float]:
        """``(fleet, device)`` of every known device -> when it was last heard from (the collector's quotas)."""
        with self._lock:
            rows = self._query("SELECT fleet, device, last_seen FROM devices")
        return {(str(f), str(d)): float(at) for f, d, at in rows}

    def forget(self, fleet: str, device: str) -> None:
        """The device leaves the devices table (aged out); its windows and rollups stay for history."""
        with self._lock:
            self._execute("DELETE FROM devices WHERE fleet = ? AND device = ?", (fleet, device))
            self._execute("DELETE FROM camera_health WHERE fleet = ? AND device = ?", (fleet, device))
            self._execute("DELETE FROM device_latest WHERE fleet = ? AND device = ?", (fleet, device))

    def camera_health(
        self, fleet: str | None = None, device: str | None = None
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """Each device's cameras' latest health: (fleet, device) -> ``{"at", "cameras": {name: SourceHealth}}``
        (a single source's under ``""``; see ``edgekit.fleet.camera_health``)."""
        with self._lock:
            return camera_health.read(self._query, fleet, device)

    def devices(self) -> list[dict[str, Any]]:
        """Every known device's row, ordered by fleet and name (one query: a fleet may have 10,000)."""
        with self._lock:
            rows = self._query(f"SELECT {DEVICE_COLUMNS} FROM devices ORDER BY fleet, device")
        return [_device_row(row) for row in rows]

    def set_state(self, fleet: str, device: str, state: str, at: float, birth: dict[str, Any] | None) -> None:
        """Record ``online``/``offline`` (``since`` moves only when the state changes; a birth replaces the last)."""
        # One statement, so one round trip and a row lock held only while it runs: when 10,000
        # devices come back at once every collector stores every status, and the transaction of an
        # INSERT, a SELECT and an UPDATE this was kept the other collector waiting on each row.
        # ON CONFLICT: another collector may meet the same new device at the same moment.  The
        # right-hand sides read the row as it was, so ``since`` compares with the old state.
        with self._lock:
            self._execute(
                "INSERT INTO devices (fleet, device, state, since, last_seen, birth, last_seq, epoch) "
                "VALUES (?, ?, ?, ?, ?, ?, -1, '') ON CONFLICT (fleet, device) DO UPDATE SET "
                "since = CASE WHEN devices.state <> excluded.state THEN excluded.since ELSE devices.since END, "
                "state = excluded.state, last_seen = excluded.last_seen, "
                "birth = CASE WHEN ? = 1 THEN excluded.birth ELSE devices.birth END",
                (fleet, device, state, at, at, json.dumps(birth or {}), 1 if birth else 0),
            )
            if birth:  # rare (a device's connect): its facts go to the device list's row too
                self._execute(UPSERT_FACTS, _facts_row(fleet, device, birth))

    def set_epoch(self, fleet: str, device: str, epoch: str) -> None:
        """The device's sequence restarted (a new spool): its numbering begins again.

        Only once per epoch: another collector on this database may have seen the new epoch
        first and stored windows of it already (their ``last_seq`` stays).
        """
        with self._lock:
            self._execute(
                "UPDATE devices SET epoch = ?, last_seq = -1 WHERE fleet = ? AND device = ? AND epoch <> ?",
                (epoch, fleet, device, epoch),
            )

    # -- windows and gaps -------------------------------------------------------------------------

    def add_windows(self, rows: list[tuple[str, str, dict[str, Any], str, float]]) -> int:
        """Store many ``(fleet, device, parsed, raw JSON, received at)`` windows in one transaction.

        Duplicates are ignored, also of windows already rolled up by ``compact``; returns how many were new.
        """
        if not rows:
            return 0
        # Rows are written in key order, and the devices' rows too: two collectors writing one
        # PostgreSQL then take their row locks in the same order and cannot deadlock each other.
        values = sorted(window_row(fleet, device, p, raw) for fleet, device, p, raw, _ in rows)
        latest: dict[tuple[str, str], tuple[float, int]] = {}
        newest: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}  # each device's newest window
        for fleet, device, p, _, at in rows:
            at0, seq0 = latest.get((fleet, device), (0.0, -1))
            latest[(fleet, device)] = (max(at0, at), max(seq0, int(p["seq"])))
            end = float(p["window"]["end"])
            if end >= newest.get((fleet, device), (-math.inf, {}))[0]:
                newest[(fleet, device)] = (end, p["window"])
        with self._lock:
            # Outside the insert's transaction: making a partition takes a table lock of its own.
            self._prepare_windows(values)
            with self._transaction():
                added = self._insert_windows(values)
                camera_health.write(self._execute, self._execute_many, dict(sorted(newest.items())))
                self._execute_many(
                    UPSERT_FIGURES,
                    [
                        (f, d, end, int(w["frames"]), int(w["missed"]), *figures(w))
                        for (f, d), (end, w) in sorted(newest.items())
                    ],
                )
                self._execute_many(
                    "UPDATE devices SET last_seen = {greatest}(last_seen, ?), last_seq = {greatest}(last_seq, ?) "
                    "WHERE fleet = ? AND device = ?",
                    [(at, seq, f, d) for (f, d), (at, seq) in sorted(latest.items())],
                )
        return added

    def add_window(self, fleet: str, device: str, payload: dict[str, Any], at: float) -> bool:
        """Store one window; ``False`` when ``(device, seq)`` is already stored (a duplicate)."""
        return self.add_windows([(fleet, device, payload, json.dumps(payload), at)]) == 1

    def add_gap(self, fleet: str, device: str, first: int, last: int, at: float, epoch: str = "") -> None:
        """Record that seqs ``first..last`` were skipped (noticed at ``at``); a replay may fill them later."""
        with self._lock:
            self._execute(
                "INSERT INTO gaps (fleet, device, epoch, first_missing, last_missing, noticed) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (fleet, device, epoch, first, last, at),
            )

    def gaps(self, fleet: str, device: str) -> list[tuple[int, int]]:
        """The recorded gaps ``(first, last)`` of a device, in seq order."""
        with self._lock:
            rows = self._query(
                "SELECT first_missing, last_missing FROM gaps WHERE fleet = ? AND device = ? ORDER BY first_missing",
                (fleet, device),
            )
        return [(int(a), int(b)) for a, b in rows]

    def seqs(self, fleet: str, device: str, epoch: str | None = None, above: int | None = None) -> list[int]:
        """The stored seqs of a device, sorted: raw windows and those rolled up by ``compact``.

        ``epoch`` limits them to one epoch (else each epoch's are listed); ``above`` to seqs > it
        (what the collector remembers, without listing a month of rolled-up seqs).
        """
        where, args = "fleet = ? AND device = ?", [fleet, device]
        if epoch is not None:
            where, args = where + " AND epoch = ?", [*args, epoch]
        low = -1 if above is None else above
        with self._lock:
            raw = self._query(f"SELECT seq FROM windows WHERE {where} AND seq > ?", (*args, low))
            ranges = self._query(
                f"SELECT first_seq, last_seq FROM compacted WHERE {where} AND last_seq > ?", (*args, low)
            )
        out = [int(r[0]) for r in raw]
        for first, last in ranges:
            out.extend(range(max(int(first), low + 1), int(last) + 1))
        out.sort()
        return out

    # -- zone and line events ---------------------------------------------------------------------

    def add_event(self, fleet: str, device: str, body: dict[str, Any], raw: str, at: float) -> bool:
        """Store one event message (``raw`` its JSON as received at ``at``); ``False`` if its id is already stored."""
        with self._lock:
            return self._execute(zone_events.INSERT, zone_events.event_row(fleet, device, body, raw, at)) == 1

    def events(
        self,
        fleet: str,
        device: str,
        camera: str | None = None,
        kinds: list[str] | None = None,
        since: float | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """A device's newest events, newest first (see ``edgekit.fleet.zone_events.recent``)."""
        with self._lock:
            return zone_events.recent(self._query, fleet, device, camera, kinds, since, limit)

    def zone_counts(
        self, fleet: str, device: str, since: float, until: float, step_s: float, camera: str | None = None
    ) -> dict[str, Any]:
        """Counts per zone and line over time, from ``count`` events (see ``edgekit.fleet.zone_events.zone_counts``)."""
        with self._lock:
            return zone_events.zone_counts(self._query, fleet, device, since, until, step_s, camera)

    # -- reading sketches -------------------------------------------------------------------------

    def merged(
        self,
        fleet: str | None = None,
        device: str | None = None,
        since: float | None = None,
        until: float | None = None,
        stage: str | None = None,
    ) -> LatencySketch:
        """The latency (or one stage's) sketch of every matching window and rollup, merged: exact fleet percentiles.

        ``since``/``until`` bound a window's stop; a rollup counts by its latest window's stop, so
        once compacted, time is resolved to the rollup's span.
        """
        where, args = where_clause(fleet, device, since, until)
        with self._lock:
            raw = self._query("SELECT payload FROM windows" + where, args)
            rolled = self._query("SELECT latency, stages FROM rollups" + where, args)
        picked: list[dict[str, Any] | None] = []
        for (payload,) in raw:
            w = loads(payload)["window"]
            picked.append(w["latency_ms"] if stage is None else w["stages_ms"].get(stage))
        for latency, stages in rolled:
            picked.append(loads(latency) if stage is None else loads(stages).get(stage))
        total = SketchSum()
        for data in picked:
            if data is not None:
                total.add(data)
        return total.sketch()

    def buckets(
        self,
        since: float,
        until: float,
        step_s: float,
        fleet: str | None = None,
        device: str | None = None,
    ) -> list[Bucket]:
        """Per device per ``step_s``: counts and merged sketches of the windows and rollups with stop in [since, until].

        A window counts in the step ``floor(stop / step_s) * step_s``; a rollup in the step of its
        latest window, which is the same step whenever ``step_s`` is a multiple of the rollup's span.
        Sorted by fleet, device, then time.
        """
        if not step_s > 0:
            raise ValueError(f"step_s must be > 0, not {step_s}")
        where, args = where_clause(fleet, device, since, until)
        with self._lock:
            raw = self._query(
                "SELECT fleet, device, stop, frames, missed, payload FROM windows" + where, args
            )
            rolled = self._query(
                "SELECT fleet, device, stop, frames, missed, latency, stages FROM rollups" + where, args
            )
            rolled_detections = self._query(
                "SELECT fleet, device, stop, name, frames, objects, max_score FROM rollup_detections" + where,
                args,
            )
            rolled_cameras = self._query(camera_rollups.SELECT + where, args)
        sums: dict[tuple[str, str, float], WindowSum] = {}

        def at(f: str, d: str, stop: float) -> WindowSum:
            key = (f, d, float(math.floor(stop / step_s) * step_s))
            total = sums.get(key)
            if total is None:
                total = sums[key] = WindowSum()
            return total

        for f, d, stop, frames, missed, payload in raw:
            w = loads(payload)["window"]
            at(f, d, stop).add(
                stop,
                frames,
                missed,
                w["latency_ms"],
                w["stages_ms"],
                detections=w.get("detections"),
                cameras=w.get("cameras"),
            )
        for f, d, stop, frames, missed, latency, stages in rolled:
            at(f, d, stop).add(stop, frames, missed, loads(latency), loads(stages))
        for f, d, stop, name, frames, objects, max_score in rolled_detections:
            total = at(f, d, stop)
            total.detections = add_detections(
                total.detections if total.detections is not None else {},
                {str(name): ClassCount(int(frames), int(objects), float(max_score))},
            )
        camera_rollups.add_rows(at, rolled_cameras)
        return [sums[k].bucket(*k) for k in sorted(sums)]

    # -- retention --------------------------------------------------------------------------------

    def compact(
        self,
        now: float,
        raw_keep_s: float = 3600,
        rollup_s: float = 60,
        keep_s: float = 30 * 86400,
        levels: Sequence[tuple[float, float]] | None = None,
    ) -> dict[str, int]:
        """Roll raw windows older than ``now - raw_keep_s`` into rollups, coarser rollups of old ones, and drop the oldest.

        ``levels`` are ``(span_s, keep_s)`` pairs, finest first, e.g. ``((60, 7 * 86400), (3600, 400 * 86400))``:
        raw windows become rollups of the first span; a level's rollups older than its keep are
        merged into the next level's (sketches merged, counts added: percentiles stay exact to the
        sketch); the last level's are deleted past its keep.  Without ``levels`` there is one level,
        ``(rollup_s, keep_s)``.

        Each device's windows whose stop falls in one step become one rollup row, merged into the
        row already there if an earlier run made it; the raw windows are deleted in the same
        transaction, and their seqs remembered so a replay of one is still a duplicate.  Rolled-up
        seq ranges, gaps and zone and line events (by the time they report) are kept as long as the
        longest level.  Running it again changes nothing.  Returns the counts: ``windows`` rolled
        up, ``rollups`` written, ``rollups_merged`` into a coarser level, ``rollups_deleted``,
        ``gaps_deleted``, ``events_deleted``, and ``partitions_dropped`` (PostgreSQL: days of raw
        windows dropped whole once rolled up).
        """
        plan = retention_levels(rollup_s, keep_s, levels)
        if raw_keep_s < 0:
            raise ValueError("compact needs raw_keep_s >= 0")
        counts = {
            "windows": 0,
            "rollups": 0,
            "rollups_merged": 0,
            "rollups_deleted": 0,
            "gaps_deleted": 0,
            "events_deleted": 0,
            "partitions_dropped": 0,
        }
        cutoff = now - raw_keep_s
        while True:
            with self._lock, self._transaction():
                if self.dialect.compaction_lock:
                    self._execute(self.dialect.compaction_lock)
                done, written = self._compact_chunk(cutoff, plan[0][0])
            counts["windows"] += done
            counts["rollups"] += written
            if done < COMPACT_CHUNK:
                break
        with self._lock:
            counts["partitions_dropped"] = self._maintain_windows(now, cutoff)
        for (span, keep), (coarser, _) in itertools.pairwise(plan):
            while True:
                with self._lock, self._transaction():
                    if self.dialect.compaction_lock:
                        self._execute(self.dialect.compaction_lock)
                    devices, merged, written = self._merge_level_chunk(now - keep, span, coarser)
                counts["rollups_merged"] += merged
                counts["rollups"] += written
                if devices < LEVEL_CHUNK_DEVICES:
                    break
            with self._lock, self._transaction():
                if self.dialect.compaction_lock:
                    self._execute(self.dialect.compaction_lock)
                self._merge_fleet_level(now - keep, span, coarser)
        horizon = now - plan[-1][1]
        with self._lock, self._transaction():
            counts["rollups_deleted"] = self._execute("DELETE FROM rollups WHERE stop < ?", (horizon,))
            self._execute("DELETE FROM rollup_detections WHERE stop < ?", (horizon,))
            self._execute("DELETE FROM rollup_cameras WHERE stop < ?", (horizon,))
            self._execute("DELETE FROM fleet_rollups WHERE stop < ?", (horizon,))
            # A seq range stays while any of its windows is kept; a replay older than that is let in as
            # new raw, and the next compaction rolls it into a rollup that is dropped at once.
            self._execute("DELETE FROM compacted WHERE stop < ?", (horizon,))
            counts["gaps_deleted"] = self._execute("DELETE FROM gaps WHERE noticed < ?", (horizon,))
            counts["events_deleted"] = self._execute("DELETE FROM events WHERE t < ?", (horizon,))
        return counts

    def _compact_chunk(self, cutoff: float, span: float) -> tuple[int, int]:
        """One transaction's worth of raw windows rolled up: (windows rolled up, rollup rows written)."""
        # DELETE ... RETURNING takes each window exactly once, even with another writer at work.  The
        # key names ``stop`` too: a partitioned table finds each row in its own day's partition.
        rows = self._query(
            "DELETE FROM windows WHERE (fleet, device, epoch, seq, stop) IN "
            "(SELECT fleet, device, epoch, seq, stop FROM windows WHERE stop < ? LIMIT ?) "
            "RETURNING fleet, device, epoch, seq, stop, frames, missed, payload",
            (cutoff, COMPACT_CHUNK),
        )
        if not rows:
            return 0, 0
        rollups: dict[tuple[str, str, float], WindowSum] = {}
        seqs: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
        for f, d, epoch, seq, stop, frames, missed, payload in rows:
            t0 = float(math.floor(stop / span) * span)
            r = rollups.get((f, d, t0))
            if r is None:
                r = rollups[(f, d, t0)] = WindowSum()
            w = loads(payload)["window"]
            cameras, detections = w.get("cameras"), w.get("detections")
            r.add(
                stop, frames, missed, w["latency_ms"], w["stages_ms"], detections=detections, cameras=cameras
            )
            seqs.setdefault((f, d, epoch), []).append((int(seq), float(stop)))
        # Before ``_write_rollups``, which merges earlier rows into these: the fleet's rows take only the new windows.
        fleet_sums: dict[tuple[str, float], WindowSum] = {}
        for (f, _, t0), r in rollups.items():
            total = fleet_sums.get((f, t0))
            if total is None:
                total = fleet_sums[(f, t0)] = WindowSum()
            total.add(r.stop, r.frames, r.missed, r.latency.to_dict(), {}, windows=r.windows)
        self._add_fleet_rollups(span, fleet_sums)
        self._write_rollups(span, rollups)
        for key, new in seqs.items():
            self._remember_compacted(key, new)
        return len(rows), len(rollups)

    def _merge_level_chunk(self, cutoff: float, span: float, coarser: float) -> tuple[int, int, int]:
        """Merge some devices' ``span`` rollups whose stop is before ``cutoff`` into ``coarser`` ones.

        Returns (devices taken, rollups merged away, coarser rollups written).  The finer rows are
        deleted in the same transaction, so a query never counts a window twice.
        """
        devices = self._query(
            "SELECT DISTINCT fleet, device FROM rollups WHERE span = ? AND stop < ? ORDER BY fleet, device LIMIT ?",
            (span, cutoff, LEVEL_CHUNK_DEVICES),
        )
        rollups: dict[tuple[str, str, float], WindowSum] = {}
        merged = 0

        def into(f: str, d: str, t0: float) -> WindowSum:
            # t0 of the finer step, not its stop: the finer step lies whole inside this coarser one.
            key = (f, d, float(math.floor(float(t0) / coarser) * coarser))
            r = rollups.get(key)
            if r is None:
                r = rollups[key] = WindowSum()
            return r

        for f, d in devices:
            where = "WHERE fleet = ? AND device = ? AND span = ? AND stop < ?"
            args = (f, d, span, cutoff)
            for t0, stop, windows, frames, missed, latency, stages in self._query(
                f"DELETE FROM rollups {where} RETURNING t0, stop, windows, frames, missed, latency, stages",
                args,
            ):
                into(f, d, t0).add(stop, frames, missed, loads(latency), loads(stages), windows=windows)
                merged += 1
            # A rollup's detections and cameras carry its stop (they are written whole with it).
            for t0, name, frames, objects, max_score in self._query(
                f"DELETE FROM rollup_detections {where} RETURNING t0, name, frames, objects, max_score", args
            ):
                r = into(f, d, t0)
                counted = {str(name): ClassCount(int(frames), int(objects), float(max_score))}
                r.detections = add_detections(r.detections if r.detections is not None else {}, counted)
            for t0, name, frames, missed, dropped, latency in self._query(
                f"DELETE FROM rollup_cameras {where} RETURNING t0, name, frames, missed, dropped, latency",
                args,
            ):
                r = into(f, d, t0)
                camera = camera_rollups.as_window(frames, missed, dropped, latency)
                r.cameras = add_cameras(r.cameras, {str(name): camera})
        self._write_rollups(coarser, rollups)
        return len(devices), merged, len(rollups)

    def _add_fleet_rollups(self, span: float, sums: dict[tuple[str, float], WindowSum]) -> None:
        """Add ``sums`` (fleet, t0 -> the new windows' sum) into the fleet's ``span`` rows (read, merged, written)."""
        if not sums:
            return
        for f in {f for f, _ in sums}:
            t0s = [t0 for g, t0 in sums if g == f]
            for t0, stop, windows, frames, missed, latency in self._query(
                "SELECT t0, stop, windows, frames, missed, latency FROM fleet_rollups "
                "WHERE fleet = ? AND span = ? AND t0 >= ? AND t0 <= ?",
                (f, span, min(t0s), max(t0s)),
            ):
                r = sums.get((f, float(t0)))
                if r is not None:
                    r.add(stop, frames, missed, loads(latency), {}, windows=windows)
        self._execute_many(
            UPSERT_FLEET_ROLLUP,
            [
                (f, span, t0, r.stop, r.windows, r.frames, r.missed, json.dumps(r.latency.to_dict()))
                for (f, t0), r in sorted(sums.items())
            ],
        )

    def _merge_fleet_level(self, cutoff: float, span: float, coarser: float) -> None:
        """The fleets' ``span`` rows whose stop is before ``cutoff`` merged into ``coarser`` ones (as devices' are)."""
        sums: dict[tuple[str, float], WindowSum] = {}
        for f, t0, stop, windows, frames, missed, latency in self._query(
            "DELETE FROM fleet_rollups WHERE span = ? AND stop < ? "
            "RETURNING fleet, t0, stop, windows, frames, missed, latency",
            (span, cutoff),
        ):
            key = (str(f), float(math.floor(float(t0) / coarser) * coarser))
            r = sums.get(key)
            if r is None:
                r = sums[key] = WindowSum()
            r.add(stop, frames, missed, loads(latency), {}, windows=windows)
        self._add_fleet_rollups(coarser, sums)

    def _write_rollups(self, span: float, rollups: dict[tuple[str, str, float], WindowSum]) -> None:
        """Write ``span`` rollups, each merged with the row an earlier run made for its step (if any)."""
        if not rollups:
            return
        by_device: dict[tuple[str, str], list[float]] = {}
        for f, d, t0 in rollups:
            by_device.setdefault((f, d), []).append(t0)
        for (f, d), t0s in by_device.items():
            for _, _, t0, stop, windows, frames, missed, latency, stages in self._query(
                "SELECT fleet, device, t0, stop, windows, frames, missed, latency, stages FROM rollups "
                "WHERE fleet = ? AND device = ? AND span = ? AND t0 >= ? AND t0 <= ?",
                (f, d, span, min(t0s), max(t0s)),
            ):
                r = rollups.get((f, d, float(t0)))
                if r is not None:  # an earlier run's rollup of this step: merge into it, not beside it
                    r.add(stop, frames, missed, loads(latency), loads(stages), windows=windows)
            for t0, name, frames, objects, max_score in self._query(
                "SELECT t0, name, frames, objects, max_score FROM rollup_detections "
                "WHERE fleet = ? AND device = ? AND span = ? AND t0 >= ? AND t0 <= ?",
                (f, d, span, min(t0s), max(t0s)),
            ):
                r = rollups.get((f, d, float(t0)))
                if r is not None:
                    earlier = {str(name): ClassCount(int(frames), int(objects), float(max_score))}
                    r.detections = add_detections(r.detections if r.detections is not None else {}, earlier)
            camera_rollups.merge_earlier(self._query, f, d, span, t0s, rollups)
        self._execute_many(
            UPSERT_ROLLUP,
            [
                (
                    f,
                    d,
                    span,
                    t0,
                    r.stop,
                    r.windows,
                    r.frames,
                    r.missed,
                    json.dumps(r.latency.to_dict()),
                    json.dumps({k: s.to_dict() for k, s in r.stages.items()}),
                )
                for (f, d, t0), r in rollups.items()
            ],
        )
        detected = [(key, r) for key, r in rollups.items() if r.detections]
        # Each rollup's classes are written whole (its earlier rows were merged in above).
        self._execute_many(
            "DELETE FROM rollup_detections WHERE fleet = ? AND device = ? AND span = ? AND t0 = ?",
            [(f, d, span, t0) for (f, d, t0), _ in detected],
        )
        self._execute_many(
            "INSERT INTO rollup_detections (fleet, device, span, t0, stop, name, frames, objects, max_score) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (f, d, span, t0, r.stop, name, c.frames, c.objects, c.max_score)
                for (f, d, t0), r in detected
                for name, c in (r.detections or {}).items()
            ],
        )
        camera_rollups.write(self._execute_many, span, rollups)

    def _remember_compacted(self, key: tuple[str, str, str], new: list[tuple[int, float]]) -> None:
        """Add rolled-up seqs to the device's ranges, joining neighbours so a device keeps a few rows."""
        fleet, device, epoch = key
        old = self._query(
            "SELECT first_seq, last_seq, stop FROM compacted WHERE fleet = ? AND device = ? AND epoch = ?",
            key,
        )
        spans = [(int(a), int(b), float(s)) for a, b, s in old] + [(s, s, stop) for s, stop in new]
        spans.sort()
        joined: list[tuple[int, int, float]] = []
        for first, last, stop in spans:
            if joined and first <= joined[-1][1] + 1:
                a, b, s = joined[-1]
                joined[-1] = (a, max(b, last), max(s, stop))
            else:
                joined.append((first, last, stop))
        self._execute("DELETE FROM compacted WHERE fleet = ? AND device = ? AND epoch = ?", key)
        self._execute_many(
            "INSERT INTO compacted (fleet, device, epoch, first_seq, last_seq, stop) VALUES (?, ?, ?, ?, ?, ?)",
            [(fleet, device, epoch, a, b, s) for a, b, s in joined],
        )

    # -- rollout state (edgekit deploy --waves --state-db) ----------------------------------------

    def save_rollout(self, fleet: str, name: str, body: str, at: float) -> None:
        """Keep a wave rollout's state (JSON) under ``(fleet, name)``, replacing what was there."""
        with self._lock:
            self._execute(ROLLOUTS)  # made on first use: a store that never sees a rollout has no table
            self._execute(
                "INSERT INTO rollout_state (fleet, name, body, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (fleet, name) DO UPDATE SET body = excluded.body, updated = excluded.updated",
                (fleet, name, body, at),
            )

    def rollout(self, fleet: str, name: str) -> tuple[str, float] | None:
        """The state kept under ``(fleet, name)`` and when it was saved, or ``None``."""
        with self._lock:
            self._execute(ROLLOUTS)
            rows = self._query(
                "SELECT body, updated FROM rollout_state WHERE fleet = ? AND name = ?", (fleet, name)
            )
        return (str(rows[0][0]), float(rows[0][1])) if rows else None

    def close(self) -> None:
        """Close the connection; the store cannot be used after."""
        with self._lock:
            self._close()
