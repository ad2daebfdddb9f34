"""A real OpenSSH server (Debian's ``/usr/sbin/sshd``) on a free loopback port, with its own config.

Everything it uses lives in one temp folder: its host key, the authorized client key, its
pid file and log, and the ``known_hosts`` file a client trusts it through.  It runs in the
foreground (``-D -e``) as a child of the test run and is stopped at teardown.  Sessions it
starts get ``TMPDIR`` and ``EDGEKIT_CACHE`` inside that folder, so what a deploy leaves on
"the device" can be checked there.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from edgekit.testing.mosquitto import free_port
from edgekit.testing.process import stop_process

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


def find_sshd() -> str:
    """The sshd executable (an absolute path: sshd refuses to re-exec itself otherwise), or skip."""
    for path in (*SSHD_CANDIDATES, shutil.which("sshd")):
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return str(Path(path).absolute())
    pytest.skip("sshd is not installed (apt-get install openssh-server; tools/setup.sh does)")


def keygen(path: Path, comment: str) -> Path:
    """A new passphrase-less Ed25519 key at ``path`` (and ``path.pub``)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    path.chmod(0o600)
    return path


class Sshd:
    """``sshd -D -e -f <tmp>/sshd_config`` on 127.0.0.1, public-key logins only, for the current user."""

    def __init__(self, workdir: Path) -> None:
        self.exe = find_sshd()
        if shutil.which("ssh-keygen") is None or shutil.which("ssh") is None:
            pytest.skip("the OpenSSH client is not installed (apt-get install openssh-client)")
        self.dir = workdir
        self.user = getpass.getuser()
        self.port = free_port()
        self.host_key = keygen(workdir / "ssh_host_ed25519_key", "edgekit-test-host")
        self.client_key = keygen(workdir / "client_key", "edgekit-test-client")
        self.authorized_keys = workdir / "authorized_keys"
        self.authorized_keys.write_text(Path(f"{self.client_key}.pub").read_text())
        # What the deployed-to "device" sees as its temp folder and edgekit cache.
        self.remote_tmp = workdir / "remote-tmp"
        self.remote_tmp.mkdir()
        self.remote_cache = workdir / "remote-cache"
        self.remote_cache.mkdir()
        self.known_hosts = workdir / "known_hosts"
        host_pub = Path(f"{self.host_key}.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        self.log = workdir / "sshd.log"
        self.conf = workdir / "sshd_config"
        self.conf.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {workdir / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            # No PAM (no system login stack in a test) and no owner checks on pytest's tmp folders.
            "UsePAM no\n"
            "StrictModes no\n"
            f"AllowUsers {self.user}\n"
            f"SetEnv TMPDIR={self.remote_tmp} EDGEKIT_CACHE={self.remote_cache} EDGEKIT_STATE={self.remote_cache}/state\n"
            "LogLevel VERBOSE\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def client_args(self, key: Path | None = None, known_hosts: Path | None = None) -> list[str]:
        """The ``edgekit deploy`` options that reach this server (``--ssh-config none``: no user config)."""
        return [
            "--host",
            f"{self.user}@127.0.0.1",
            "--port",
            str(self.port),
            "--key",
            str(key or self.client_key),
            "--known-hosts",
            str(known_hosts or self.known_hosts),
            "--ssh-config",
            "none",
        ]

    def start(self) -> Sshd:
        # Debian's sshd insists on its privilege separation folder, normally made by its service.
        privsep = Path("/run/sshd")
        if not privsep.is_dir():
            if os.geteuid() != 0:
                pytest.skip("sshd needs /run/sshd, which only root can create here")
            privsep.mkdir(mode=0o755, parents=True, exist_ok=True)
        check = subprocess.run([self.exe, "-t", "-f", str(self.conf)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd refused its test config: {check.stderr.strip()}")
        log = self.log.open("ab")
        self.proc = subprocess.Popen([self.exe, "-D", "-e", "-f", str(self.conf)], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    if s.recv(64).startswith(b"SSH-"):  # its banner: listening and answering
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening within 15 s")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
