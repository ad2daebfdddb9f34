"""systemd's notify protocol without libsystemd: ``READY=1``, ``WATCHDOG=1``, ``STATUS=...``, ``STOPPING=1``.

A service started by systemd with ``Type=notify`` (or ``WatchdogSec=``) finds ``$NOTIFY_SOCKET``
in its environment: a unix datagram socket, a path or, starting with ``@``, an abstract name.
Each message is one datagram of ``KEY=value`` lines.  Without the variable every call is a no-op,
so the same code runs under systemd, under a shell and in tests.

``$WATCHDOG_USEC`` is the unit's ``WatchdogSec=``; ``$WATCHDOG_PID``, when set, names the one
process it is meant for (a child that inherited the environment must not pet in its parent's
name).  systemd's advice, followed here: notify at half the interval.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"


def _address(path: str) -> str | bytes | None:
    if path.startswith("@"):
        return b"\0" + path[1:].encode()  # the abstract namespace: a leading NUL byte
    if path.startswith("/"):
        return path
    return None  # systemd also knows vsock:...; edgekit's units never use it


class Notifier:
    """Sends notify messages to ``$NOTIFY_SOCKET`` (read once, at construction); a no-op without it.

    ``watchdog_s`` is the unit's watchdog interval meant for this process (None: no watchdog),
    ``pet_every_s`` half of it.  A send that fails is logged once and otherwise ignored: a
    notify socket that went away must not end the service it reports on.
    """

    def __init__(self, env: Mapping[str, str] | None = None, pid: int | None = None) -> None:
        env = os.environ if env is None else env
        self.socket_path = env.get(NOTIFY_SOCKET, "")
        self._address = _address(self.socket_path) if self.socket_path else None
        self.watchdog_s = _watchdog_s(env, os.getpid() if pid is None else pid)
        self._sock: socket.socket | None = None
        self._warned = False
        self.sent = 0  # messages the socket took

    @property
    def enabled(self) -> bool:
        """Whether there is a socket to tell anything."""
        return self._address is not None

    @property
    def pet_every_s(self) -> float | None:
        """How often to send ``WATCHDOG=1``: half the interval (None: no watchdog for this process)."""
        return self.watchdog_s / 2 if self.watchdog_s is not None else None

    def notify(self, *lines: str) -> bool:
        """Send ``lines`` as one message; False when there is no socket or it refused."""
        if self._address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode(), self._address)
        except OSError as err:
            if not self._warned:
                self._warned = True
                level = logging.DEBUG if err.errno in (errno.ENOENT, errno.ECONNREFUSED) else logging.WARNING
                log.log(level, "sd_notify to %s failed: %s", self.socket_path, err)
            return False
        self.sent += 1
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *_status(status))

    def watchdog(self, status: str | None = None) -> bool:
        return self.notify("WATCHDOG=1", *_status(status))

    def status(self, status: str) -> bool:
        return self.notify(*_status(status))

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *_status(status))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status(status: str | None) -> tuple[str, ...]:
    # One line: a newline would start another KEY=value of the message.
    return () if status is None else ("STATUS=" + " ".join(status.splitlines()),)


def _watchdog_s(env: Mapping[str, str], pid: int) -> float | None:
    try:
        usec = int(env.get(WATCHDOG_USEC, ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    owner = env.get(WATCHDOG_PID, "")
    if owner:
        try:
            if int(owner) != pid:
                return None  # meant for another process (our parent): not ours to keep
        except ValueError:
            return None
    return usec / 1e6


def watchdog_env(watchdog_s: float, socket_path: str) -> dict[str, str]:
    """The variables that hand a child process a notify socket and a watchdog interval of its own."""
    return {NOTIFY_SOCKET: socket_path, WATCHDOG_USEC: str(round(watchdog_s * 1e6))}
