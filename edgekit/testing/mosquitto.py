"""A real Mosquitto broker on a free loopback port, with its own config file; kill it and start it again.

The one launcher the tests and the benchmarks share.  ``Mosquitto(folder).start()`` keeps
its config, persistence file and log in ``folder``; ``secure_mosquitto`` adds TLS (a CA made
on the spot), users and an ACL.  A host without ``mosquitto`` raises ``BrokerMissing``
(the test suite turns that into a skip).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

from edgekit.errors import EdgekitError
from edgekit.testing.process import stop_process


class BrokerMissing(EdgekitError):
    """``mosquitto`` is not installed on this host."""


def free_port() -> int:
    """A TCP port nothing listens on at the moment (on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mosquitto_exe() -> str:
    """The ``mosquitto`` executable: on PATH, or where Debian puts it (/usr/sbin is not on every PATH)."""
    exe = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if exe is None:
        raise BrokerMissing(
            "mosquitto is not installed", "apt-get install mosquitto mosquitto-clients (.ci/run does)"
        )
    return exe


class Mosquitto:
    """``mosquitto -c <folder>/mosquitto.conf`` on 127.0.0.1.

    ``extra`` lines go at the end of the config, ``listener`` lines right under the listener
    (its TLS files).  With ``persistence`` (the default) sessions and queued messages survive
    a kill; ``log`` writes every log type to ``mosquitto.log`` (benchmarks turn both off: they
    cost the broker time).  ``cores`` pins the broker to those CPUs.
    """

    def __init__(
        self,
        workdir: Path,
        extra: str = "",
        listener: str = "",
        *,
        persistence: bool = True,
        log: bool = True,
        cores: Collection[int] | None = None,
    ) -> None:
        self.exe = mosquitto_exe()
        self.dir = workdir
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        self.stderr = workdir / "mosquitto.stderr"
        self.cores = set(cores) if cores else None
        # As root, mosquitto would drop to the "mosquitto" user, who cannot read our files (or may not exist).
        lines = ["user root\n"] if os.geteuid() == 0 else []
        lines.append(f"listener {self.port} 127.0.0.1\n{listener}")
        if "allow_anonymous" not in extra:
            lines.append("allow_anonymous true\n")
        if persistence:
            lines.append(f"persistence true\npersistence_location {workdir}/\nautosave_interval 1\n")
        lines.append(f"log_dest file {self.log}\nlog_type all\n" if log else "log_dest none\n")
        self.conf.write_text("".join(lines) + extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def _pin(self) -> None:
        if self.cores:
            os.sched_setaffinity(0, self.cores)

    def start(self) -> Mosquitto:
        """Start (again: same port, same persistence file) and return once it accepts connections."""
        # Its stderr goes to a file, not a pipe: a pipe nobody reads would block a talkative broker.
        with self.stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                [self.exe, "-c", str(self.conf)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=self._pin if self.cores else None,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.stderr.read_text(errors='replace')[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError("mosquitto did not start listening within 10 s")

    def kill(self) -> None:
        """SIGKILL: the broker dies without a word, as a crashed or unplugged one does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not gone within 5 s."""
        stop_process(self.proc)

    def __enter__(self) -> Mosquitto:
        return self if self.proc is not None and self.proc.poll() is None else self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def secure_mosquitto(workdir: Path, users: dict[str, str], acl: str) -> tuple[Mosquitto, Path]:
    """Mosquitto with TLS (a CA made here, a certificate for 127.0.0.1), these users and this ACL; started.

    Returns the broker and the CA's certificate, which clients must trust.
    """
    from edgekit.testing.certs import ThrowawayCA

    ca = ThrowawayCA(workdir)
    cert, key = ca.issue("broker", ip="127.0.0.1")
    passwd = workdir / "passwd"
    for i, (user, pw) in enumerate(users.items()):
        subprocess.run(
            ["mosquitto_passwd", "-b", *(["-c"] if i == 0 else []), str(passwd), user, pw], check=True
        )
    acl_file = workdir / "acl"
    acl_file.write_text(acl)
    broker = Mosquitto(
        workdir,
        extra=f"allow_anonymous false\npassword_file {passwd}\nacl_file {acl_file}\n",
        listener=f"cafile {ca.ca_file}\ncertfile {cert}\nkeyfile {key}\n",
    ).start()
    return broker, ca.ca_file
