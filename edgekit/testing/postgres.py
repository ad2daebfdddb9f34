"""A real PostgreSQL server for tests and benchmarks: ``initdb`` into a temporary directory, ``postgres`` on a
free loopback port.  A host without PostgreSQL raises ``PostgresMissing`` (the test suite skips then).

The server runs as an unprivileged OS user when the tests run as root (PostgreSQL refuses
to run as root), with ``fsync`` off (a test database need not survive a power cut), and
password authentication over TCP so that a wrong password is really refused.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.testing.mosquitto import free_port
from edgekit.testing.process import stop_process

PASSWORD = "s3cret-pw"  # the superuser's password; tests check it never shows in an error
USER = "postgres"


def bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` (Debian's layout), or the directory of ``initdb`` on PATH."""
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()]
    if found:
        return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_server_user(os_user: str | None) -> list[str]:
    """The command prefix that drops root to ``os_user`` (setpriv execs, so our child *is* the server)."""
    if os_user is None:
        return []
    if shutil.which("setpriv"):
        return ["setpriv", f"--reuid={os_user}", f"--regid={os_user}", "--init-groups", "--"]
    return ["runuser", "-u", os_user, "--"]


class PostgresMissing(EdgekitError):
    """PostgreSQL is not installed here, or cannot run (as root, without a ``postgres`` OS user)."""


class PostgresServer:
    """``postgres -D <tmp>/data`` on 127.0.0.1:<free port>; ``url(db)`` names a database on it."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.settings = dict(settings or {})  # more ``-c name=value`` for the server
        bindir = bin_dir()
        if bindir is None:
            raise PostgresMissing("PostgreSQL is not installed", "apt-get install postgresql (.ci/run does)")
        self.bin = bindir
        self.os_user: str | None = None
        if os.geteuid() == 0:
            import pwd

            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresMissing(
                    "running as root and there is no 'postgres' OS user to run PostgreSQL as",
                    "apt-get install postgresql makes one",
                ) from None
            self.os_user = "postgres"
        # Not under pytest's tmp dir: that is private to root, and the server user must reach its files.
        self.dir = Path(tempfile.mkdtemp(prefix="edgekit-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def _chown(self) -> None:
        if self.os_user is None:
            return
        for path in (self.dir, *self.dir.rglob("*")):
            shutil.chown(path, self.os_user, self.os_user)

    def start(self) -> PostgresServer:
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        self._chown()
        init = subprocess.run(
            [
                *_as_server_user(self.os_user),
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            cwd=self.dir,
            timeout=120,
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{init.stdout}\n{init.stderr}")
        pwfile.unlink()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    *_as_server_user(self.os_user),
                    str(self.bin / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"unix_socket_directories={self.dir}",
                    # Speed over durability: nothing here must survive a crash of the machine.
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    *(arg for k, v in self.settings.items() for arg in ("-c", f"{k}={v}")),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited:\n{self.log.read_text(errors='replace')[-3000:]}")
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER],
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not accept connections:\n{self.log.read_text(errors='replace')}")

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database (one per test, so tests do not see each other's rows); its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        # SIGINT is PostgreSQL's "fast" shutdown: ends sessions, no waiting for clients.
        stop_process(self.proc, grace_s=30, sig=signal.SIGINT)
        shutil.rmtree(self.dir, ignore_errors=True)
