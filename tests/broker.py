"""A real Mosquitto broker on a free loopback port, with its own config file; kill it and start it again."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mosquitto:
    """``mosquitto -c <tmp>/mosquitto.conf`` on 127.0.0.1; persistence on, so sessions survive a kill."""

    def __init__(self, workdir: Path, extra: str = "", listener: str = "") -> None:
        exe = shutil.which("mosquitto") or (
            "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
        )
        if exe is None:
            pytest.skip(
                "mosquitto is not installed (apt-get install mosquitto mosquitto-clients; .ci/run does)"
            )
        self.exe = exe
        self.dir = workdir
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        # As root, mosquitto would drop to the "mosquitto" user, who cannot read pytest's files.
        as_root = "user root\n" if os.geteuid() == 0 else ""
        self.conf.write_text(
            as_root
            + f"listener {self.port} 127.0.0.1\n{listener}"
            + ("allow_anonymous true\n" if "allow_anonymous" not in extra else "")
            + f"persistence true\npersistence_location {workdir}/\nautosave_interval 1\n"
            f"log_dest file {self.log}\nlog_type all\n" + extra
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> Mosquitto:
        self.proc = subprocess.Popen(
            [self.exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mosquitto exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start listening within 10 s")

    def kill(self) -> None:
        """SIGKILL: the broker dies without a word, as a crashed or unplugged one does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def secure_mosquitto(workdir: Path, users: dict[str, str], acl: str) -> tuple[Mosquitto, Path]:
    """Mosquitto with TLS (a CA made here, a certificate for 127.0.0.1), these users and this ACL; started."""
    from certs import TestCA

    ca = TestCA(workdir)
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
