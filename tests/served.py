"""``edgekit serve`` as the user runs it, for tests: a subprocess on loopback, its ports read from its ready line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from conftest import EDGEKIT, ROOT

READY = re.compile(r"ready: .* on https?://\S+?:(\d+)/v2 and grpc \S+?:(\d+)")


@dataclass
class Served:
    proc: subprocess.Popen[str]
    http_port: int
    grpc_port: int
    stderr: list[str] = field(default_factory=list)

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def start_serve(
    bundle: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 120
) -> Served:
    """``edgekit serve BUNDLE --http-port 0 --grpc-port 0 ARGS``, once it says it is ready."""
    proc = subprocess.Popen(
        [
            *EDGEKIT,
            "serve",
            str(bundle),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--device",
            "x86_64-cpu",
            *args,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "EDGEKIT_MEASURE": "0", **(env or {})},
    )
    lines: list[str] = []
    ports: list[tuple[int, int]] = []
    ready = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = READY.search(line)
            if m:
                ports.append((int(m[1]), int(m[2])))
                ready.set()
        ready.set()  # ended without a ready line

    threading.Thread(target=drain, daemon=True).start()
    ready.wait(timeout_s)
    if not ports:
        proc.kill()
        proc.wait(10)
        raise AssertionError("edgekit serve did not get ready:\n" + "".join(lines))
    return Served(proc, ports[0][0], ports[0][1], lines)


def stop_serve(served: Served) -> int:
    """SIGTERM, as a service manager stops it; its exit status."""
    served.proc.send_signal(signal.SIGTERM)
    try:
        return served.proc.wait(30)
    finally:
        if served.proc.poll() is None:
            served.proc.kill()


@contextmanager
def serving(bundle: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    served = start_serve(bundle, *args, env=env)
    try:
        yield served
    finally:
        rc = stop_serve(served)
        time.sleep(0)  # the drain thread sees the end
        assert rc == 0, "edgekit serve did not stop cleanly:\n" + "".join(served.stderr)
