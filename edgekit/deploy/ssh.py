"""The SSH transport to one device: the target, its failures explained, the archive copied there.

``edgekit.deploy.remote`` builds the deploy on it: it installs the copy there with
``edgekit agent install``.

The transport is the system's OpenSSH client (``ssh``), so a deploy uses exactly what the
user's own ``ssh user@device`` uses: their keys, agent, ``~/.ssh/config`` and, above all,
their ``known_hosts``.  Host keys are always checked (``StrictHostKeyChecking=yes``); an
unknown key is trusted only when asked (``accept_new_host_key``: trust on first use, never
a changed key).  ``BatchMode`` makes every prompt a failure instead of a hang.

One deploy is four SSH commands: ``edgekit --version`` on the device (is it there, can we
log in), the archive streamed into a fresh ``mktemp -d`` folder (``cat >``: no SFTP
subsystem needed on the device), ``edgekit agent install ... --json`` (its JSON progress
lines are read as they come), and removing the folder.  Every remote argument is quoted
with ``shlex.quote``; nothing the device prints is evaluated, only parsed as JSON.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from edgekit.errors import DeployError

log = logging.getLogger(__name__)

Progress = Callable[[str, dict[str, Any]], None]
"""``progress(step, info)``: the local steps ``check`` and ``copy``, then the agent's own steps."""

DEFAULT_ROOT = "/var/lib/edgekit"
DEFAULT_CONNECT_TIMEOUT = 10.0
COPY_CHUNK = 256 * 1024
MAX_LINE = 1 << 20  # a progress line longer than this is not one the agent wrote
REMOTE_ARCHIVE = "bundle.tar.gz"

SSH_FAILED = 255  # what ssh itself exits with when the connection or login fails
_HOST = re.compile(r"^(?:[^@\s]+@)?(?:\[[0-9A-Fa-f:.%\w]+\]|[^@\s\[\]]+)$")


class SshError(DeployError):
    """An SSH deploy failed before the device's agent could judge the bundle.

    ``kind`` says which failure it was, for code that reacts to it: ``host-key-unknown``,
    ``host-key-changed``, ``auth``, ``refused``, ``timeout``, ``resolve``, ``unreachable``,
    ``ssh-missing``, ``remote-edgekit``, ``copy``, ``remote`` or ``ssh``.
    """

    def __init__(self, message: str, hint: str = "", kind: str = "ssh") -> None:
        super().__init__(message, hint)
        self.kind = kind


@dataclass(frozen=True)
class SshTarget:
    """One device reached over SSH, and how: every option maps to one ``ssh -o``.

    ``host`` is ``[user@]host`` (an IPv6 address in brackets).  ``known_hosts`` replaces
    the user's ``~/.ssh/known_hosts`` (None keeps it); ``ssh_config`` is passed as ``-F``
    (``"none"`` reads no config file).  ``remote_edgekit`` is the command that runs edgekit on
    the device, split like a shell would (``~/venv/bin/edgekit``, ``python3 -m edgekit.cli``).
    """

    host: str
    port: int | None = None
    key: Path | None = None
    known_hosts: Path | None = None
    accept_new_host_key: bool = False
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    ssh_config: str | None = None
    remote_edgekit: str = "edgekit"
    ssh: str = "ssh"

    def __post_init__(self) -> None:
        # A destination starting with '-' would be read by ssh as an option (-oProxyCommand=...).
        if not _HOST.match(self.host) or self.host.startswith("-"):
            raise DeployError(
                f"--host {self.host!r} is not user@host or host", "for example --host pi@192.168.1.20"
            )
        if self.port is not None and not 0 < self.port < 65536:
            raise DeployError(
                f"--port {self.port} is not a TCP port", "ssh listens on 22 unless told otherwise"
            )
        try:
            words = shlex.split(self.remote_edgekit)
        except ValueError as err:
            raise DeployError(
                f"--remote-edgekit {self.remote_edgekit!r} cannot be split into words ({err})",
                "quote it like a shell command",
            ) from err
        if not words:
            raise DeployError("--remote-edgekit is empty", "pass the path of edgekit on the device")

    @property
    def hostname(self) -> str:
        """The host without the user and without IPv6 brackets."""
        return self.host.rpartition("@")[2].strip("[]")

    @property
    def known_hosts_name(self) -> str:
        """How ``known_hosts`` names this host: ``host``, or ``[host]:port`` off port 22."""
        return f"[{self.hostname}]:{self.port}" if self.port not in (None, 22) else self.hostname

    @property
    def known_hosts_file(self) -> str:
        """The known_hosts file the checks use, as a path to show a person."""
        return str(self.known_hosts) if self.known_hosts else "~/.ssh/known_hosts"

    def ssh_argv(self) -> list[str]:
        """``ssh`` and its options, up to and including the destination."""
        exe = shutil.which(self.ssh)
        if exe is None:
            raise SshError(
                f"the OpenSSH client ({self.ssh}) is not installed on this machine",
                "install it: apt-get install openssh-client (Debian/Ubuntu), or use the fleet mode (--fleet)",
                kind="ssh-missing",
            )
        argv = [exe, "-T"]
        if self.ssh_config is not None:
            argv += ["-F", self.ssh_config]
        options = [
            "BatchMode=yes",  # a prompt (password, unknown host) fails instead of hanging
            f"StrictHostKeyChecking={'accept-new' if self.accept_new_host_key else 'yes'}",
            f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            # A device that vanishes mid-install is noticed in about a minute, not never.
            "ServerAliveInterval=15",
            "ServerAliveCountMax=4",
        ]
        if self.known_hosts is not None:
            options.append(f"UserKnownHostsFile={_ssh_path(self.known_hosts)}")
        for option in options:
            argv += ["-o", option]
        if self.key is not None:
            # Only this key: an agent full of keys would otherwise hit MaxAuthTries first.
            argv += ["-i", str(self.key), "-o", "IdentitiesOnly=yes"]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        return [*argv, self.host]

    def remote_edgekit_words(self) -> str:
        """The remote edgekit command as shell words, each quoted; a leading ``~/`` still means home."""
        words = shlex.split(self.remote_edgekit)
        first = words[0]
        head = f'"$HOME"/{shlex.quote(first[2:])}' if first.startswith("~/") else shlex.quote(first)
        return " ".join([head, *(shlex.quote(w) for w in words[1:])])

    def check_local_files(self) -> None:
        """Fail before connecting when a file the options name is not there."""
        if self.key is not None and not self.key.is_file():
            raise SshError(
                f"--key {self.key}: no such file", "pass the private key file (not the .pub)", "auth"
            )
        if self.known_hosts is not None and not self.accept_new_host_key and not self.known_hosts.is_file():
            raise SshError(
                f"--known-hosts {self.known_hosts}: no such file",
                f"add the device's host key to it first: {_keyscan_hint(self)}",
                "host-key-unknown",
            )


def _ssh_path(path: Path) -> str:
    # ssh_config splits option values on whitespace; a quoted path keeps a space in it.
    text = str(path.absolute())
    return f'"{text}"' if any(c.isspace() for c in text) else text


def _keyscan_hint(target: SshTarget) -> str:
    port = f"-p {target.port} " if target.port not in (None, 22) else ""
    return (
        f"ssh-keyscan {port}{target.hostname} > key.txt; compare `ssh-keygen -lf key.txt` with the "
        f"fingerprint the device shows (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub, run on it), "
        f"then: cat key.txt >> {target.known_hosts_file}. "
        "Or pass --accept-new-host-key to trust the key on first use"
    )


def explain_ssh_failure(target: SshTarget, stderr: str, doing: str) -> SshError:
    """The ``SshError`` for an ``ssh`` that exited 255 while ``doing`` something, from its stderr."""
    text = stderr.strip()
    low = text.lower()
    last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "ssh exited 255")
    where = f"{target.host}" + (f" port {target.port}" if target.port else "")
    if "remote host identification has changed" in low or ("host key for" in low and "has changed" in low):
        return SshError(
            f"the host key of {where} has CHANGED since it was recorded in {target.known_hosts_file}; "
            "edgekit refused to connect (this is what a man-in-the-middle looks like)",
            "if the device was reinstalled or its SSH keys regenerated, check its new fingerprint on the "
            f"device itself, then remove the old entry (ssh-keygen -R '{target.known_hosts_name}'"
            + (f" -f {target.known_hosts}" if target.known_hosts else "")
            + f") and add the new one: {_keyscan_hint(target)}. Never skip this check",
            "host-key-changed",
        )
    if (
        "host key verification failed" in low
        or "no ed25519 host key is known" in low
        or "host key is known" in low
    ):
        return SshError(
            f"the host key of {where} is not in {target.known_hosts_file}; edgekit connects only to known "
            "hosts and copied nothing",
            _keyscan_hint(target),
            "host-key-unknown",
        )
    if "permission denied" in low or "too many authentication failures" in low:
        unprotected = "unprotected private key file" in low
        return SshError(
            f"{where} refused the login ({last.strip()})",
            (
                f"ssh ignored the key because others can read it: chmod 600 {target.key}"
                if unprotected
                else "pass the private key the device accepts with --key, or add your public key to "
                "~/.ssh/authorized_keys of that user on the device (ssh-copy-id "
                + (f"-p {target.port} " if target.port else "")
                + f"{target.host}); check the user name in --host"
            ),
            "auth",
        )
    if "connection refused" in low:
        return SshError(
            f"{where} refused the connection: no SSH server listens there",
            "check that sshd runs on the device (systemctl status ssh) and the port (--port)",
            "refused",
        )
    if "timed out" in low:
        return SshError(
            f"connecting to {where} timed out after {target.connect_timeout:g} s",
            "check that the device is on and reachable (ping it), the address, and any firewall on the way",
            "timeout",
        )
    if "could not resolve hostname" in low or "name or service not known" in low:
        return SshError(
            f"cannot resolve the host name {target.hostname!r}",
            "check the spelling, or use the device's IP address",
            "resolve",
        )
    if "no route to host" in low or "network is unreachable" in low:
        return SshError(
            f"{where} is unreachable ({last.strip()})",
            "check the network between this machine and the device",
            "unreachable",
        )
    return SshError(
        f"ssh to {where} failed while {doing}: {last.strip()}", "run ssh -v with the same options", "ssh"
    )


class SshProcess:
    """One ``ssh`` process with stderr drained by a thread (so a chatty remote never blocks it)."""

    def __init__(self, target: SshTarget, script: str, stdin: int | IO[bytes] | None) -> None:
        # ssh joins its arguments with spaces for the remote login shell; `sh -c` gives every
        # device the same POSIX shell for the script, whatever the user's login shell is.
        argv = [*target.ssh_argv(), f"sh -c {shlex.quote(script)}"]
        log.debug("ssh: %s", shlex.join(argv))
        self.proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C reaches edgekit, which ends ssh itself
        )
        self._err: list[bytes] = []
        assert self.proc.stderr is not None
        self._thread = threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True)
        self._thread.start()

    def _drain(self, stream: IO[bytes]) -> None:
        for chunk in iter(lambda: stream.read(4096), b""):
            self._err.append(chunk)
            # Keep the last 64 KiB: enough for any error, bounded for a noisy remote.
            while sum(map(len, self._err)) > 65536 and len(self._err) > 1:
                self._err.pop(0)

    def lines(self) -> Iterator[bytes]:
        """Stdout, line by line, as the remote writes it."""
        assert self.proc.stdout is not None
        while line := self.proc.stdout.readline(MAX_LINE):
            yield line

    def finish(self, timeout: float | None = None) -> tuple[int, str, str]:
        """Wait for the end; (exit code, rest of stdout, stderr)."""
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        code = self.proc.wait(timeout)
        self._thread.join(5)
        return code, out.decode(errors="replace"), self.stderr

    @property
    def stderr(self) -> str:
        return b"".join(self._err).decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def remote_error(stderr: str) -> tuple[str, str]:
    """The ``error:`` and ``hint:`` lines edgekit printed on the device (or its last line)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    error = next((ln[6:].strip() for ln in lines if ln.startswith("error:")), lines[-1] if lines else "")
    hint = next((ln[5:].strip() for ln in lines if ln.startswith("hint:")), "")
    return error[:500], hint[:500]


def _run(target: SshTarget, script: str, doing: str) -> tuple[int, str, str]:
    ssh = SshProcess(target, script, subprocess.DEVNULL)
    try:
        code, out, err = ssh.finish()
    finally:
        ssh.kill()
    if code == SSH_FAILED:
        raise explain_ssh_failure(target, err, doing)
    return code, out, err


def check_remote(target: SshTarget) -> str:
    """Log in and run ``<remote edgekit> --version``; its version, or ``SshError`` saying what is wrong."""
    target.check_local_files()
    code, out, err = _run(target, f"{target.remote_edgekit_words()} --version", "checking the remote edgekit")
    if code in (126, 127):
        raise SshError(
            f"edgekit is not installed on {target.host} (`{target.remote_edgekit} --version`: "
            f"{remote_error(err)[0] or 'not found'})",
            "install it on the device (pip install 'edgekit[device]') and pass its path with "
            "--remote-edgekit, e.g. --remote-edgekit ~/edgekit/.venv/bin/edgekit (a command run over SSH "
            "does not see a virtual environment's PATH)",
            "remote-edgekit",
        )
    words = out.split()
    if code != 0 or len(words) < 2 or words[0] != "edgekit":
        raise SshError(
            f"`{target.remote_edgekit} --version` on {target.host} did not answer like edgekit "
            f"(exit {code}: {(out + err).strip()[:200]!r})",
            "pass the path of edgekit on the device with --remote-edgekit",
            "remote-edgekit",
        )
    return words[1]


def copy_archive(target: SshTarget, archive: Path, progress: Progress | None = None) -> str:
    """Stream ``archive`` into a new private temp folder on the device; return the remote file's path."""
    size = archive.stat().st_size
    # The folder is removed by the script itself when the copy fails; printing its path and
    # the size written is the last thing it does, so a path on stdout means a whole file.
    script = (
        "umask 077; "
        'd=$(mktemp -d "${TMPDIR:-/tmp}/edgekit-deploy.XXXXXXXX") || exit 70; '
        "trap 'rm -rf \"$d\"' EXIT; "
        f'cat > "$d/{REMOTE_ARCHIVE}" || exit 71; '
        f'n=$(wc -c < "$d/{REMOTE_ARCHIVE}") || exit 71; '
        "trap - EXIT; "
        'printf \'%s %s\\n\' "$n" "$d"'
    )
    ssh = SshProcess(target, script, subprocess.PIPE)
    assert ssh.proc.stdin is not None
    sent = 0
    try:
        with archive.open("rb") as f:
            while chunk := f.read(COPY_CHUNK):
                try:
                    ssh.proc.stdin.write(chunk)
                except BrokenPipeError:
                    break  # the remote side ended early: its exit code and stderr say why
                sent += len(chunk)
                if progress is not None:
                    progress("copy", {"bytes": sent, "total": size})
        with contextlib.suppress(BrokenPipeError):
            ssh.proc.stdin.close()
        code, out, err = ssh.finish()
    finally:
        ssh.kill()
    if code == SSH_FAILED:
        raise explain_ssh_failure(target, err, "copying the bundle")
    fields = out.split(maxsplit=1)
    if code != 0 or len(fields) != 2 or not fields[0].isdigit():
        reason = remote_error(err)[0] or f"exit {code}"
        raise SshError(
            f"copying the bundle to {target.host} failed ({reason}); nothing was installed",
            "check the free space in the device's temp folder (df -h /tmp, or its TMPDIR)",
            "copy",
        )
    if int(fields[0]) != size:
        raise SshError(
            f"the copy on {target.host} has {fields[0]} bytes, the bundle {size}; nothing was installed",
            "check the device's free space and try again",
            "copy",
        )
    return f"{fields[1].strip()}/{REMOTE_ARCHIVE}"


def remove_remote(target: SshTarget, remote_file: str) -> None:
    """Best effort: remove the temp folder ``copy_archive`` made (a failure here is only logged)."""
    folder = remote_file.rsplit("/", 1)[0]
    if "/edgekit-deploy." not in folder:  # never remove anything this module did not make
        return
    try:
        _run(target, f"rm -rf -- {shlex.quote(folder)}", "removing the copied bundle")
    except DeployError as err:
        log.warning("could not remove %s on %s: %s", folder, target.host, err.message)
