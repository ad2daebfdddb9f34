"""``edgekit fleet collect --share``: two collector processes share a fleet's stream through a real
Mosquitto into one real PostgreSQL, and every window the devices had acknowledged is stored exactly
once, also when one collector is SIGKILLed mid-run and started again."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from postgres import PostgresServer

from edgekit.testing.mosquitto import Mosquitto
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT

# Mosquitto's default queue (1000 a client) would drop QoS 1 messages for a member that is away: the
# docs' setting, so what is tested is the collectors.
QUEUES = "max_queued_messages 100000\n"
DEVICES, RATE, SECONDS = 4, 80, 4.0  # about 320 windows


@pytest.fixture
def queue_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    b = Mosquitto(tmp_path, QUEUES).start()
    try:
        yield b
    finally:
        b.stop()


class Collectors:
    """``edgekit fleet collect --share g`` processes, each with its own client id and log."""

    def __init__(self, folder: Path, mqtt: str, db: str) -> None:
        self.folder, self.mqtt, self.db = folder, mqtt, db
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {}

    def log(self, name: str) -> Path:
        return self.folder / f"{name}-{self.starts[name]}.log"

    def start(self, name: str) -> None:
        self.starts[name] = self.starts.get(name, 0) + 1
        with self.log(name).open("wb") as err:
            self.procs[name] = subprocess.Popen(
                [*EDGEKIT, "fleet", "collect", "--mqtt", self.mqtt, "--share", "g", "--client-id", name],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                env={**os.environ, "EDGEKIT_FLEET_DB": self.db},  # its password off the command line
            )  # fmt: skip
        ready = wait_for(lambda: "collecting from" in self.log(name).read_text(), 60)
        assert ready, self.log(name).read_text()[-3000:]

    def kill(self, name: str) -> None:
        self.procs[name].kill()  # SIGKILL: no flush, no goodbye, unacknowledged messages stay with the broker
        self.procs[name].wait(10)

    def stop(self, name: str) -> dict[str, Any]:
        """SIGTERM; the collector's final counters (from its last log line)."""
        stop_process(self.procs[name], grace_s=30)
        found = re.findall(r"collector stopped: (\{.*\})", self.log(name).read_text())
        assert found, self.log(name).read_text()[-3000:]
        return dict(json.loads(found[-1]))

    def close(self) -> None:
        for proc in self.procs.values():
            stop_process(proc, grace_s=10, sig=signal.SIGKILL)


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.1)
    return False


def simulate(mqtt: str, log: Path) -> subprocess.Popen[bytes]:
    """Devices publishing numbered telemetry at QoS 1 (``edgekit fleet simulate`` in load mode)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [*EDGEKIT, "fleet", "simulate", "--mqtt", mqtt, "--fleet", "lab", "--devices", str(DEVICES),
             "--rate", str(RATE), "--duration", str(SECONDS)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def sent(sim: subprocess.Popen[bytes], log: Path) -> int:
    """How many windows the broker acknowledged to the devices (the simulator's last line)."""
    assert sim.wait(120) == 0, log.read_text()[-3000:]
    return int(json.loads(log.read_text().strip().splitlines()[-1])["sent"])


def stored(db: str) -> list[tuple[str, str, int, int]]:
    """``(device, epoch, seq, copies)`` of every stored window."""
    import psycopg

    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT device, epoch, seq, COUNT(*) FROM windows GROUP BY device, epoch, seq ORDER BY 1, 2, 3"
        ).fetchall()
    return [(str(d), str(e), int(s), int(n)) for d, e, s, n in rows]


def check_each_once(db: str, expected: int) -> None:
    """Every acknowledged window is there, once: each device's seqs are 0..n-1 without a hole or a repeat."""
    assert wait_for(lambda: len(stored(db)) >= expected, 60), f"{len(stored(db))} of {expected} stored"
    time.sleep(0.5)  # a late duplicate would show now
    rows = stored(db)
    assert len(rows) == expected and all(n == 1 for *_, n in rows)
    per_device: dict[str, list[int]] = {}
    for device, _, seq, _ in rows:
        per_device.setdefault(device, []).append(seq)
    assert len(per_device) == DEVICES
    assert all(seqs == list(range(len(seqs))) for seqs in per_device.values()), "a window is missing"
    import psycopg

    with psycopg.connect(db) as conn:
        # Neither collector took the other's share for a loss; the devices' rows follow the windows.
        assert conn.execute("SELECT COUNT(*) FROM gaps").fetchone() == (0,)
        last: dict[str, int] = dict(conn.execute("SELECT device, last_seq FROM devices").fetchall())
    assert last == {d: len(seqs) - 1 for d, seqs in per_device.items()}


def test_two_collectors_share_the_stream_and_store_each_window_once(
    tmp_path: Path, queue_broker: Mosquitto, pg_server: PostgresServer
) -> None:
    db = pg_server.new_database()
    group = Collectors(tmp_path, queue_broker.url, db)
    try:
        group.start("c1")
        group.start("c2")
        # Each says at start how the store keeps raw windows (both opened it at once: one made the table).
        assert all("raw windows: native partitions by day" in group.log(n).read_text() for n in ("c1", "c2"))
        expected = sent(simulate(queue_broker.url, tmp_path / "sim.log"), tmp_path / "sim.log")
        assert expected >= DEVICES * 10
        check_each_once(db, expected)
        took = [group.stop(name)["seen"].get("telemetry", 0) for name in ("c1", "c2")]
    finally:
        group.close()
    assert all(t > 0 for t in took), f"one collector took the whole stream: {took}"
    assert sum(took) == expected  # Mosquitto hands each message to one member


def test_a_collector_killed_mid_run_and_started_again_loses_and_repeats_nothing(
    tmp_path: Path, queue_broker: Mosquitto, pg_server: PostgresServer
) -> None:
    db = pg_server.new_database()
    group = Collectors(tmp_path, queue_broker.url, db)
    try:
        group.start("c1")
        group.start("c2")
        sim = simulate(queue_broker.url, tmp_path / "sim.log")
        assert wait_for(lambda: len(stored(db)) >= 40, 30), "the collectors stored nothing"
        group.kill("c1")  # mid-run: windows in flight to it, some handled but not committed or acked
        time.sleep(1.0)  # the broker queues c1's share meanwhile
        group.start("c1")  # the same client id: its session, and what the broker kept for it
        expected = sent(sim, tmp_path / "sim.log")
        check_each_once(db, expected)
        again = group.stop("c1")
        group.stop("c2")
    finally:
        group.close()
    # The restarted c1 took what was queued for it while it was away, and its share after.
    assert again["seen"].get("telemetry", 0) > 0


def test_collect_mistakes_are_plain_and_say_what_to_do(tmp_path: Path) -> None:
    def collect(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EDGEKIT, "fleet", "collect", "--db", str(tmp_path / "f.db"), *args],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    r = collect("--share", "g")
    assert r.returncode == 2 and "--share needs --client-id" in r.stderr and "hint:" in r.stderr
    r = collect("--share", "a/b", "--client-id", "c1")
    assert r.returncode == 2 and "not a group name" in r.stderr and "--share collectors" in r.stderr
    r = collect("--mqtt", "mqtt://127.0.0.1:1", "--share", "g", "--client-id", "c1")
    assert r.returncode == 2 and "cannot reach" in r.stderr and "Traceback" not in r.stderr
    r = collect("--keep", "30d", "--hour-keep", "7d")
    assert r.returncode == 2 and "--hour-keep 7d is shorter than --keep" in r.stderr and "400d" in r.stderr
