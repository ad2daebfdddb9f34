"""``PostgresStore``: the fleet store's tables in PostgreSQL, for a fleet that outgrows one box.

Same schema, statements (``edgekit.fleet.sql``) and logic as the SQLite ``FleetStore`` (``edgekit.fleet.store``);
only the connection and the ``Dialect`` differ.  Needs ``psycopg`` 3 (``edgekit[fleet]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.conninfo

from edgekit.errors import first_line
from edgekit.fleet.sql import Dialect, StoreError
from edgekit.fleet.store import FleetStore

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
