"""The agent under a unit with WatchdogSec=: its own notify socket takes only the watched child's
messages, the child never gets systemd's, and the supervisor kills a child that falls silent and
starts it again (real sockets and child processes)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgekit.core.sd_notify import watchdog_env
from edgekit.deploy import supervisor as sup
from edgekit.deploy.child_watch import ChildHeartbeats
from edgekit.deploy.supervisor import PipelineSupervisor, child_environment

QUIET_S = 1.0


def until(cond: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_the_agents_socket_counts_only_the_watched_child() -> None:
    beats = ChildHeartbeats()
    try:
        send = [sys.executable, "-c", "from edgekit.core.sd_notify import Notifier; Notifier().ready()"]
        env = {**os.environ, **watchdog_env(1.0, beats.name)}
        stranger = subprocess.run(send, env=env, timeout=60, check=True)  # not the child: ignored
        assert stranger.returncode == 0
        assert until(lambda: beats.ignored >= 1)
        assert beats.state() == (False, 0.0)
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; from edgekit.core.sd_notify import Notifier; "
             "sys.stdin.readline(); Notifier().ready()"],
            env=env, stdin=subprocess.PIPE,
        )  # fmt: skip
        beats.watch(child.pid)
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.close()
        child.wait(60)
        assert until(lambda: beats.state()[0])
        assert beats.messages == 1
    finally:
        beats.close()


def test_the_child_never_gets_systemds_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    env = child_environment(None, None)
    assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(env)


# A pipeline child stand-in: READY=1, pets for a while, then hangs (its loop stuck) without exiting.
CHILD = """
import time
from edgekit.core.sd_notify import Notifier
n = Notifier()
n.ready()
for _ in range(5):
    time.sleep(n.pet_every_s)
    n.watchdog()
time.sleep(3600)
"""


def test_the_supervisor_kills_a_child_that_falls_silent_and_starts_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sup, "CRASH_BACKOFF_FIRST_S", 0.05)
    beats = ChildHeartbeats()
    s = PipelineSupervisor(
        lambda bundle: [sys.executable, "-c", CHILD], lambda: tmp_path, heartbeats=beats, watchdog_s=0.5
    ).start()
    try:
        assert until(lambda: s.wedged >= 2 and s.starts >= 3)
        assert beats.messages >= 6  # READY=1 and five pets from the first child at least
        assert s.state in ("running", "backoff")
    finally:
        s.stop()
        beats.close()


def test_a_child_that_never_says_ready_is_wedged_after_the_start_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sup, "CRASH_BACKOFF_FIRST_S", 0.05)
    monkeypatch.setattr(sup, "CHILD_START_GRACE_S", 0.5)
    beats = ChildHeartbeats()
    hang = [sys.executable, "-c", "import time; time.sleep(3600)"]
    s = PipelineSupervisor(lambda bundle: hang, lambda: tmp_path, heartbeats=beats, watchdog_s=0.2).start()
    try:
        assert until(lambda: s.wedged >= 1 and s.starts >= 2)
    finally:
        s.stop()
        beats.close()
    # Without a watchdog nobody is watched: the same child just runs.
    quiet = PipelineSupervisor(lambda bundle: hang, lambda: tmp_path).start()
    try:
        assert until(lambda: quiet.state == "running")
        time.sleep(QUIET_S)
        assert quiet.wedged == 0 and quiet.starts == 1
    finally:
        quiet.stop()


def test_an_idle_agent_says_ready_and_keeps_petting(broker: Any, tmp_path: Path) -> None:
    """No bundle installed yet: nothing to watch but the agent itself, which pets at half the interval."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(60)
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "1000000"}
    agent = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli", "agent", "run", "--root", str(tmp_path / "root"),
         "--mqtt", broker.url, "--fleet", "lab", "--device-id", "idle-1", "--source", "synthetic:96x96@5"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert sock.recv(4096).startswith(b"READY=1\n")
        pets = [sock.recv(4096) for _ in range(3)]
        assert all(p.startswith(b"WATCHDOG=1\nSTATUS=pipeline none") for p in pets)
        agent.send_signal(signal.SIGTERM)
        assert sock.recv(4096) == b"STOPPING=1"
        assert agent.wait(30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
        sock.close()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_unit_verifies(tmp_path: Path) -> None:
    from importlib.resources import files

    text = files("edgekit.deploy").joinpath("edgekit-agent.service").read_text()
    # Verified as shipped, but for the one path that is not on this machine.
    unit = tmp_path / "edgekit-agent.service"
    unit.write_text(text.replace("/usr/local/bin/edgekit", shutil.which("true") or "/bin/true"))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
