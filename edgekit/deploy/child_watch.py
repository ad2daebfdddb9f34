"""``ChildHeartbeats``: the agent's own notify socket, where its pipeline child says ``READY=1`` and ``WATCHDOG=1``.

systemd watches one process per unit well: the main one (``NotifyAccess=main``).  The agent is
that process, and the pipeline is its child, so the agent relays instead of letting both speak
to systemd (``NotifyAccess=all``): with both, an idle agent's pets would hide a wedged child
and a busy child's would hide a wedged agent.  Here the child gets ``NOTIFY_SOCKET`` pointing
at this socket (and the unit's interval as its ``WATCHDOG_USEC``), the same protocol it would
speak to systemd, so ``edgekit run`` needs no second way to report.

The socket is in the abstract namespace (no file to leave behind, no path length to outgrow)
and takes a datagram only with the sender's credentials (``SO_PASSCRED``): only the child the
supervisor started counts, whoever else finds the name.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
import threading
import time

log = logging.getLogger(__name__)

_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


class ChildHeartbeats:
    """A datagram socket the child's notify messages arrive on, read on a thread of its own."""

    def __init__(self) -> None:
        self.name = f"@edgekit-agent-{os.getpid()}-{secrets.token_hex(6)}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.bind(b"\0" + self.name[1:].encode())
        self._sock.settimeout(0.5)  # so that close() ends the reading thread
        self._lock = threading.Lock()
        self._pid = 0
        self._ready = False
        self._last = 0.0  # time.monotonic() of the child's last READY=1 or WATCHDOG=1
        self._closed = False
        self.messages = 0  # from the child being watched
        self.ignored = 0  # from any other process
        self._thread = threading.Thread(target=self._read, name="edgekit-agent-heartbeats", daemon=True)
        self._thread.start()

    def watch(self, pid: int) -> None:
        """From now on only ``pid`` counts (a new child); it has said nothing yet."""
        with self._lock:
            self._pid, self._ready, self._last = pid, False, 0.0

    def state(self) -> tuple[bool, float]:
        """Whether the watched child said ``READY=1``, and when it last said anything that counts."""
        with self._lock:
            return self._ready, self._last

    def _read(self) -> None:
        space = socket.CMSG_SPACE(_UCRED.size)
        while True:
            try:
                data, ancillary, _flags, _addr = self._sock.recvmsg(4096, space)
            except TimeoutError:
                if self._closed:
                    return
                continue
            except OSError:
                if self._closed:
                    return
                log.exception("agent: reading the pipeline's heartbeats failed")
                time.sleep(1.0)
                continue
            pid = next(
                (
                    _UCRED.unpack(cdata[: _UCRED.size])[0]
                    for level, kind, cdata in ancillary
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
                ),
                0,
            )
            lines = data.decode(errors="replace").splitlines()
            with self._lock:
                if pid == 0 or pid != self._pid:
                    self.ignored += 1
                    continue
                self.messages += 1
                if "READY=1" in lines:
                    self._ready = True
                if "READY=1" in lines or "WATCHDOG=1" in lines:
                    self._last = time.monotonic()

    def close(self) -> None:
        self._closed = True
        self._thread.join(2.0)
        self._sock.close()
