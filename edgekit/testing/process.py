"""Stopping the servers a test started (Mosquitto, sshd, the fleet server): politely, then firmly."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any] | None, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if ``proc`` has not gone within ``grace_s``; nothing if it has already ended."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
