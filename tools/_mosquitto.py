"""A throwaway Mosquitto on a free loopback port, for the benchmark scripts (not the tests: they use tests/broker.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def start_broker(
    folder: Path, extra: str = "", preexec_fn: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """Start mosquitto with its config in ``folder``; returns the process and its port once it accepts."""
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    conf = folder / "mosquitto.conf"
    as_root = "user root\n" if os.geteuid() == 0 else ""  # else mosquitto drops to a user that may not exist
    conf.write_text(f"{as_root}listener {port} 127.0.0.1\nallow_anonymous true\n{extra}")
    proc = subprocess.Popen(
        [exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec_fn
    )
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("mosquitto did not start")
