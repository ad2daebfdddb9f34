"""``PostgresStore``: the fleet store's tables in PostgreSQL, for a fleet that outgrows one box.

Same schema, statements (``edgekit.fleet.sql``) and logic as the SQLite ``FleetStore`` (``edgekit.fleet.store``);
only the connection and the ``Dialect`` differ.  Needs ``psycopg`` 3 (``edgekit[fleet]``).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.conninfo
import psycopg.errors

from edgekit.errors import first_line
from edgekit.fleet.sql import Dialect, StoreError
from edgekit.fleet.store import FleetStore

log = logging.getLogger(__name__)

POSTGRES = Dialect(
    "postgresql",
    "%s",
    "GREATEST",
    "DOUBLE PRECISION",
    "BIGINT",
    # Blocks other compactors (and row writers of rollups), not readers: a rollup is read, merged, written.
    compaction_lock="LOCK TABLE rollups IN SHARE ROW EXCLUSIVE MODE",
)

# libpq waits for ever by default; an unreachable host should fail while someone watches.
CONNECT_TIMEOUT_S = 10

COLUMNS = "fleet, device, epoch, seq, session, start, stop, frames, missed, payload"
STAGING = "CREATE TEMP TABLE IF NOT EXISTS staged_windows (LIKE windows) ON COMMIT DELETE ROWS"
COPY_IN = f"COPY staged_windows ({COLUMNS}) FROM STDIN (FORMAT BINARY)"
# Binary COPY needs each column's type: int8 for every integer (psycopg would pick the smallest).
COPY_TYPES = ["text", "text", "text", "int8", "text", "float8", "float8", "int8", "int8", "text"]
INSERT_STAGED = f"""INSERT INTO windows ({COLUMNS})
    SELECT {COLUMNS} FROM staged_windows s WHERE NOT EXISTS (
        SELECT 1 FROM compacted c
        WHERE c.fleet = s.fleet AND c.device = s.device AND c.epoch = s.epoch
            AND c.first_seq <= s.seq AND c.last_seq >= s.seq)
    ORDER BY fleet, device, epoch, seq
    ON CONFLICT DO NOTHING"""


# -- the windows table's layout -------------------------------------------------------------------
#
# Raw windows are most of the rows (10,000 devices sending a window every 10 s: 86M a day), so in
# PostgreSQL they live in one partition per UTC day of their ``stop``: queries over a time range read
# only that range's days, and a day that compaction has emptied is dropped whole (no dead rows left
# for VACUUM).  With TimescaleDB in the server a hypertable (one chunk a day) does the same.
#
# PostgreSQL wants ``stop`` in the primary key of a table partitioned by it, so the key is
# (fleet, device, epoch, seq, stop).  It still stores each window once: a window is redelivered (a QoS 1
# resend, a spool's replay, a second collector of a shared group) as the very bytes the device sent
# once, so its ``window.end`` parses to the same double, lands in the same day's partition, and meets
# the first copy's key there (ON CONFLICT DO NOTHING).  An (epoch, seq) cannot come back with another
# end: a device numbers each window once per epoch, and a new spool starts a new epoch.  Windows
# already rolled up are still dropped by the ``compacted`` ranges, which do not look at ``stop``.

DAY_S = 86400
LAYOUT_PARTITIONS = "native partitions by day"
LAYOUT_HYPERTABLE = "timescaledb hypertable"
LAYOUT_PLAIN = "plain table (postgresql)"
# pg_advisory_xact_lock's key for changing the windows table's layout (any fixed number; "edgekit").
LAYOUT_LOCK = 0x65646765
# New partitions one batch may make: a device with a wild clock must not make a table per window.
# Windows of further days wait in the DEFAULT partition until their day's partition is made.
NEW_DAYS_PER_BATCH = 4
FIRST_DAY, LAST_DAY = 0, 80_000  # 1970 .. 2189: days a partition's name (windows_pYYYYMMDD) can hold

WINDOWS = """CREATE TABLE windows (
    fleet TEXT NOT NULL, device TEXT NOT NULL, epoch TEXT NOT NULL, seq BIGINT NOT NULL,
    session TEXT NOT NULL, start DOUBLE PRECISION NOT NULL, stop DOUBLE PRECISION NOT NULL,
    frames BIGINT NOT NULL, missed BIGINT NOT NULL, payload TEXT NOT NULL,
    PRIMARY KEY (fleet, device, epoch, seq, stop))"""
WINDOWS_COLUMNS = "fleet, device, epoch, seq, session, start, stop, frames, missed, payload"
# TimescaleDB partitions by time or integer columns; ``stop`` is seconds as a double, so its chunks
# are made from whole microseconds (an IMMUTABLE function of the column).
STOP_US = """CREATE OR REPLACE FUNCTION edgekit_stop_us(double precision) RETURNS bigint
    LANGUAGE SQL IMMUTABLE PARALLEL SAFE AS 'SELECT floor($1 * 1000000)::bigint'"""
HYPERTABLE = """SELECT create_hypertable('windows', 'stop', chunk_time_interval => 86400000000::bigint,
    time_partitioning_func => 'edgekit_stop_us', if_not_exists => TRUE, migrate_data => TRUE)"""


def partition_name(day: int) -> str:
    """The partition of UTC day ``day`` (days since 1970-01-01): ``windows_pYYYYMMDD``."""
    return "windows_p" + (dt.date(1970, 1, 1) + dt.timedelta(days=day)).strftime("%Y%m%d")


def partition_day(name: str) -> int | None:
    """The day a partition's name says, or ``None`` for another table (the DEFAULT partition)."""
    try:
        return (
            dt.datetime.strptime(name.removeprefix("windows_p"), "%Y%m%d").date() - dt.date(1970, 1, 1)
        ).days
    except ValueError:
        return None


def redact(url: str) -> str:
    """The URL with any password (in the user part or a ``password=`` parameter) replaced by ``***``."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hosts}"
    query = urlencode(
        [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)],
        safe="*",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _passwords(url: str) -> list[str]:
    """The passwords a URL carries (to scrub from messages that might echo them)."""
    parts = urlsplit(url)
    found = [v for k, v in parse_qsl(parts.query) if k == "password" and v]
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        secret = userinfo.split(":", 1)[1]
        found += [secret, unquote(secret)]  # as written and as libpq reads it
    return [p for p in found if p]


def _hint(message: str, shown: str) -> str:
    """What to do about a failed connection, from what libpq said."""
    if "password authentication failed" in message or "no password supplied" in message:
        return f"check the user name and password in {shown} (or set PGPASSWORD / ~/.pgpass)"
    if "does not exist" in message and "database" in message:
        return (
            "create the database first (createdb, or CREATE DATABASE as a superuser), or name one that exists"
        )
    if "Connection refused" in message or "timeout" in message or "could not translate host" in message:
        return "is PostgreSQL running there and listening on TCP? `pg_isready -h HOST -p PORT` checks; fix host/port in the URL"
    return (
        "check the URL (postgresql://user:password@host:port/database) and that the server accepts this user"
    )


class PostgresStore(FleetStore):
    """The fleet in a PostgreSQL database at ``url``; the same methods and behaviour as ``FleetStore``.

    One connection, used under the store's lock (thread-safe like the SQLite store); when the
    server drops it, the next call connects again.
    """

    dialect: ClassVar[Dialect] = POSTGRES
    errors: ClassVar[tuple[type[Exception], ...]] = (psycopg.Error,)
    # A lost connection, a server shutting down, a deadlock or serialization failure, a timeout.
    transient: ClassVar[tuple[type[Exception], ...]] = (psycopg.OperationalError,)

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = redact(url)  # what logs and errors may show
        self._closed = False
        self._pg = self._connect()
        self._setup()
        self._pg.execute(STAGING)  # outside any transaction: a rolled-back batch must not take it along

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        try:
            options: dict[str, Any] = {}
            if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(self.url):
                options["connect_timeout"] = CONNECT_TIMEOUT_S
            # autocommit: statements outside ``_transaction`` commit at once, like the SQLite store's.
            return psycopg.connect(self.url, autocommit=True, **options)
        except psycopg.Error as err:
            message = first_line(err)
            for secret in _passwords(self.url):
                message = message.replace(secret, "***")
            raise StoreError(
                f"cannot connect to the fleet database {self.path}: {message}", _hint(message, self.path)
            ) from None  # the chained error's text could carry the URL with its password

    def _conn(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._pg.closed and not self._closed:
            self._pg = self._connect()  # the server dropped us (restart, idle timeout): connect again
            self._pg.execute(STAGING)  # a temporary table lives as long as its connection
        return self._pg

    # -- the windows table's layout ------------------------------------------------------------

    def _setup(self) -> None:
        self._days: set[int] = set()  # days known to have a partition (a cache of the catalog)
        self._layout = self._make_windows()
        super()._setup()

    def layout(self) -> str:
        return self._layout

    def _one(self, sql: str, args: Iterable[Any] = ()) -> Any:
        row = self._conn().execute(sql, tuple(args)).fetchone()
        return None if row is None else row[0]

    def _make_windows(self) -> str:
        """Make ``windows`` in the best layout this server offers, or bring an old plain one into it; which."""
        conn = self._pg
        with conn.transaction():
            # One opener at a time: two collectors starting together must not both make (or move) the table.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LAYOUT_LOCK,))
            kind = self._one("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass('windows')")
            if kind == "p":
                return LAYOUT_PARTITIONS
            if kind is not None and self._is_hypertable():
                return LAYOUT_HYPERTABLE
            if self._made_hypertable(kind is not None):
                return LAYOUT_HYPERTABLE
            if kind is None:
                self._create_partitioned()
                return LAYOUT_PARTITIONS
            # A store made before partitions: its raw windows (``raw_keep_s`` of them, an hour by
            # default) move into partitions once, as it opens.  Should that fail (the table is another
            # role's, say) the store keeps working on the plain table and says so.
            try:
                with conn.transaction():
                    moved = self._partition_plain()
            except psycopg.Error as err:
                log.warning(
                    "fleet: the windows table stays a plain table (%s): it works, but old days are deleted "
                    "row by row instead of dropped whole",
                    first_line(err),
                )
                return LAYOUT_PLAIN
            log.info("fleet: moved %d raw windows of the plain windows table into partitions by day", moved)
            return LAYOUT_PARTITIONS

    def _is_hypertable(self) -> bool:
        if self._one("SELECT 1 FROM pg_extension WHERE extname = 'timescaledb'") is None:
            return False
        found = "SELECT 1 FROM timescaledb_information.hypertables WHERE hypertable_name = 'windows'"
        return self._one(found) is not None

    def _made_hypertable(self, exists: bool) -> bool:
        """Make ``windows`` a TimescaleDB hypertable when the server has the extension; ``False`` if not."""
        if self._one("SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb'") is None:
            return False
        conn = self._pg
        try:
            with conn.transaction():  # a savepoint: a refusal leaves the native layout to be made
                conn.execute("CREATE EXTENSION IF NOT EXISTS timescaledb")
                conn.execute(STOP_US)
                if exists:  # an old plain table: a hypertable's key must hold its time column too
                    key = self._one(
                        "SELECT conname FROM pg_constraint WHERE conrelid = 'windows'::regclass AND contype = 'p'"
                    )
                    conn.execute(
                        f'ALTER TABLE windows DROP CONSTRAINT "{key}", '
                        "ADD PRIMARY KEY (fleet, device, epoch, seq, stop)"
                    )
                else:
                    conn.execute(WINDOWS)
                conn.execute(HYPERTABLE)
        except psycopg.Error as err:
            # Installed but not loaded (shared_preload_libraries), or this role may not create it.
            log.warning(
                "fleet: TimescaleDB is available but cannot be used (%s); using partitions", first_line(err)
            )
            return False
        return True

    def _create_partitioned(self) -> None:
        self._pg.execute(WINDOWS + " PARTITION BY RANGE (stop)")
        # Takes what no day's partition does (a clock far off, a day not made yet), so an insert never fails.
        self._pg.execute("CREATE TABLE windows_default PARTITION OF windows DEFAULT")

    def _partition_plain(self) -> int:
        """Replace the plain ``windows`` table by a partitioned one holding its rows; how many moved."""
        conn = self._pg
        conn.execute("ALTER TABLE windows RENAME TO windows_unpartitioned")
        # Free the index names (the key's too) for the new table's; the old table goes below.
        for (name,) in conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'windows_unpartitioned'::regclass"
        ).fetchall():
            conn.execute(f'ALTER INDEX "{name}" RENAME TO "{name[:40]}_unpartitioned"')
        self._create_partitioned()
        days = conn.execute(
            "SELECT DISTINCT floor(stop / %s)::bigint AS day FROM windows_unpartitioned ORDER BY day DESC LIMIT 62",
            (DAY_S,),
        ).fetchall()
        for (day,) in days:
            if FIRST_DAY <= day <= LAST_DAY:
                conn.execute(self._partition_of(int(day)))
        moved = conn.execute(
            f"INSERT INTO windows ({WINDOWS_COLUMNS}) SELECT {WINDOWS_COLUMNS} FROM windows_unpartitioned"
        ).rowcount
        conn.execute("DROP TABLE windows_unpartitioned")
        return moved

    @staticmethod
    def _partition_of(day: int) -> str:
        lo, hi = day * DAY_S, (day + 1) * DAY_S
        return f"CREATE TABLE IF NOT EXISTS {partition_name(day)} PARTITION OF windows FOR VALUES FROM ({lo}) TO ({hi})"

    def _partition_days(self) -> set[int]:
        rows = (
            self._conn()
            .execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'windows'::regclass"
            )
            .fetchall()
        )
        return {day for (name,) in rows if (day := partition_day(str(name))) is not None}

    def _prepare_windows(self, values: list[tuple[Any, ...]]) -> None:
        if self._layout != LAYOUT_PARTITIONS:
            return
        days = {math.floor(v[6] / DAY_S) for v in values if math.isfinite(v[6])}  # others: DEFAULT
        if days <= self._days:
            return
        self._days = self._partition_days()  # another collector may have made them
        missing = sorted(d for d in days - self._days if FIRST_DAY <= d <= LAST_DAY)
        if missing:
            self._add_days(missing[-NEW_DAYS_PER_BATCH:])  # the newest: the past ones are rolled up soon

    def _add_days(self, days: list[int]) -> None:
        """Make the partitions of ``days``, in a transaction of their own (never a batch's: see below)."""
        conn = self._conn()
        with conn.transaction():
            # The advisory lock makes creators queue among themselves rather than in the table's lock
            # queue; the table lock then waits out the writers at work.  Taken first in a fresh
            # transaction, neither can close a cycle with a writer, which holds no advisory lock.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LAYOUT_LOCK,))
            conn.execute("LOCK TABLE windows IN ACCESS EXCLUSIVE MODE")
            have = self._partition_days()
            todo = [d for d in days if d not in have]
            if todo:
                conn.execute("CREATE TEMP TABLE windows_moving (LIKE windows) ON COMMIT DROP")
            for day in todo:
                # Windows of this day that came before its partition wait in DEFAULT; PostgreSQL refuses
                # the new partition while they are there, so they move along into it.
                moved = conn.execute(
                    f"WITH moved AS (DELETE FROM windows_default WHERE stop >= %s AND stop < %s "
                    f"RETURNING {WINDOWS_COLUMNS}) INSERT INTO windows_moving ({WINDOWS_COLUMNS}) "
                    f"SELECT {WINDOWS_COLUMNS} FROM moved",
                    (day * DAY_S, (day + 1) * DAY_S),
                ).rowcount
                conn.execute(self._partition_of(day))
                if moved:
                    conn.execute(
                        f"INSERT INTO windows ({WINDOWS_COLUMNS}) SELECT {WINDOWS_COLUMNS} FROM windows_moving"
                    )
                    conn.execute("DELETE FROM windows_moving")
        self._days = have | set(days)

    def _maintain_windows(self, now: float, cutoff: float) -> int:
        if self._layout == LAYOUT_HYPERTABLE:
            return self._drop_chunks(cutoff)
        if self._layout != LAYOUT_PARTITIONS:
            return 0
        today = math.floor(now / DAY_S)
        have = self._partition_days()
        ahead = [d for d in (today, today + 1) if d not in have and FIRST_DAY <= d <= LAST_DAY]
        if ahead:  # made ahead, so the writers do not stop at midnight to make tomorrow's
            self._add_days(ahead)
        old = sorted(d for d in have if (d + 1) * DAY_S <= cutoff)
        return self._drop_empty(
            [(partition_name(d), d * DAY_S) for d in old], lambda: self._days.difference_update(old)
        )

    def _drop_empty(self, tables: list[tuple[str, float]], forget: Any) -> int:
        """Drop those of ``tables`` (a day's partition or chunk, and its first second) that hold no window."""
        # Compaction has rolled up and deleted every window older than its cutoff, so these are empty
        # unless a late window came since; dropping them whole leaves no dead rows for VACUUM.  Checked
        # by index first without the lock (which also marks the dead entries), then again under it.
        conn = self._conn()
        empty = [(t, lo) for t, lo in tables if self._holds_rows(t, lo) is False]
        if not empty:
            return 0
        dropped = 0
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LAYOUT_LOCK,))
            conn.execute("LOCK TABLE windows IN ACCESS EXCLUSIVE MODE")
            for table, lo in empty:
                # Another compactor may have dropped it since; under the lock that cannot change.
                if self._one("SELECT to_regclass(%s)", (table,)) is None or self._holds_rows(table, lo):
                    continue
                conn.execute(f"DROP TABLE {table}")
                dropped += 1
        forget()
        return dropped

    def _holds_rows(self, table: str, lo: float) -> bool | None:
        """Whether a partition or chunk holds a window; ``None`` when another compactor dropped it."""
        try:
            found = self._conn().execute(
                f"SELECT 1 FROM {table} WHERE stop >= %s ORDER BY stop LIMIT 1", (lo,)
            )
        except (
            psycopg.errors.UndefinedTable
        ):  # only outside the lock, where a failed statement spoils nothing
            return None
        return found.fetchone() is not None

    def _drop_chunks(self, cutoff: float) -> int:
        """TimescaleDB: drop the emptied day chunks older than ``cutoff`` (as native partitions are)."""
        listed = "SELECT c::text FROM show_chunks('windows', older_than => %s::bigint) AS c"
        try:
            chunks = self._conn().execute(listed, (math.floor(cutoff * 1e6),)).fetchall()
        except psycopg.Error as err:
            if isinstance(err, self.transient):
                raise
            # A TimescaleDB release that reads these arguments otherwise: its chunks are emptied by
            # compaction all the same, only not dropped.  Autocommit: nothing else is undone.
            log.warning("fleet: cannot list the windows hypertable's old chunks: %s", first_line(err))
            return 0
        return self._drop_empty([(str(c), -math.inf) for (c,) in chunks], lambda: None)

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn().execute(self.dialect.sql(sql), tuple(args)).fetchall()

    def _execute(self, sql: str, args: Iterable[Any] = ()) -> int:
        return self._conn().execute(self.dialect.sql(sql), tuple(args)).rowcount

    def _execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        # executemany pipelines the statements: one round trip per batch, not per row.
        with self._conn().cursor() as cur:
            cur.executemany(self.dialect.sql(sql), rows)
            return cur.rowcount

    def _insert_windows(self, values: list[tuple[Any, ...]]) -> int:
        # Binary COPY into a session-private staging table, then one INSERT ... SELECT: a few times the
        # rate of row-by-row inserts, even pipelined.  The duplicate checks are INSERT_WINDOW's.
        with self._conn().cursor() as cur:
            with cur.copy(COPY_IN) as copy:
                copy.set_types(COPY_TYPES)
                for v in values:
                    copy.write_row(v)
            cur.execute(INSERT_STAGED)
            return cur.rowcount

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._conn().transaction():
            yield

    def _close(self) -> None:
        self._closed = True
        self._pg.close()
