"""systemd's notify protocol (edgekit.core.sd_notify) on real unix datagram sockets."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgekit.core.sd_notify import Notifier, watchdog_env


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def test_messages_reach_a_path_socket_as_key_value_lines(receiver: tuple[str, socket.socket]) -> None:
    path, sock = receiver
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled and n.watchdog_s is None and n.pet_every_s is None
    assert n.ready("loading\nmodel")  # a newline in a status would start another KEY=value
    assert sock.recv(4096) == b"READY=1\nSTATUS=loading model"
    assert n.watchdog() and sock.recv(4096) == b"WATCHDOG=1"
    assert n.status("3 frames") and sock.recv(4096) == b"STATUS=3 frames"
    assert n.stopping() and sock.recv(4096) == b"STOPPING=1"
    assert n.sent == 4
    n.close()


def test_an_abstract_socket_and_the_watchdog_interval_for_this_process() -> None:
    name = f"@edgekit-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name[1:].encode())
    sock.settimeout(5)
    try:
        n = Notifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())})
        assert n.watchdog_s == 30.0 and n.pet_every_s == 15.0
        assert n.watchdog("ok") and sock.recv(4096) == b"WATCHDOG=1\nSTATUS=ok"
    finally:
        sock.close()
    # The interval is for another process (a parent's, inherited): not ours to keep.
    assert (
        Notifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_s is None
    )
    assert watchdog_env(2.5, name) == {"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "2500000"}


def test_without_the_variable_or_a_listener_nothing_happens(tmp_path: Path) -> None:
    quiet = Notifier({})
    assert not quiet.enabled and not quiet.ready() and not quiet.watchdog() and quiet.sent == 0
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody.sock"), "WATCHDOG_USEC": "x"})
    assert gone.enabled and gone.watchdog_s is None
    assert not gone.watchdog() and not gone.watchdog()  # refused, logged once, never raised
    assert not Notifier({"NOTIFY_SOCKET": "vsock:2:1"}).enabled
