"""Stopping the servers a test started (Mosquitto, sshd, the fleet server): politely, then firmly."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def stop_process(
    proc: subprocess.Popen[Any] | None, grace_s: float = 5.0, sig: signal.Signals = signal.SIGTERM
) -> None:
    """``sig`` (SIGTERM), then SIGKILL if ``proc`` has not gone within ``grace_s``; nothing if it has ended.

    SIGINT stops a server the way Ctrl-C does (``edgekit fleet serve`` shuts down cleanly on it).
    """
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
