"""A pipeline killed and started again goes on counting where it left off, and counts the restart:
the totals are kept in the telemetry spool beside seq (real SQLite files, a real Mosquitto, real
``edgekit run`` processes killed with SIGKILL)."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_telemetry import Subscriber

from edgekit.telemetry import Spool
from edgekit.telemetry.continuity import Continuity
from edgekit.testing.mosquitto import Mosquitto

from conftest import EDGEKIT


def test_totals_go_on_across_processes_and_restarts_count(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    first = Continuity(Spool(path))
    assert first.restarts == 0
    reported = first.totals({"frames": 40, "met": 38, "mqtt_connects": 1})
    assert reported == {"frames": 40, "met": 38, "mqtt_connects": 1, "restarts": 0}
    first.keep(reported | {"spool_dropped": 5})  # the spool's own counter: never added up again
    second = Continuity(Spool(path))  # the process died; a new one on the same spool
    assert second.restarts == 1
    # Counts of the new process on top; a counter only the old one had is still there.
    assert second.totals({"frames": 2, "warm_passes": 1}) == {
        "frames": 42, "met": 38, "mqtt_connects": 1, "warm_passes": 1, "restarts": 1,
    }  # fmt: skip
    second.keep({"frames": 30})  # lower than kept: totals never go down
    assert Spool(path).totals()["frames"] == 40
    assert Continuity(Spool(path)).restarts == 2


def test_a_damaged_spool_set_aside_keeps_the_totals(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    spool = Spool(path)
    Continuity(spool).keep({"frames": 123})
    for _ in range(40):  # unsent windows: pages of queue rows after the counters
        spool.push("t", b"x" * 2000)
    spool.close()
    path.with_name(path.name + "-wal").unlink(missing_ok=True)  # checkpointed at close
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a copy cut short: what the counters are in is readable
    again = Spool(path)
    assert again.set_aside == 1 and len(list(tmp_path.glob("spool.db.corrupt-*"))) == 1
    assert again.totals() == {"frames": 123}
    assert Continuity(again).restarts == 1  # the start count came over too


def run_device(bundle: Path, broker: Mosquitto, spool: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*EDGEKIT, "run", str(bundle), "--source", "synthetic:160x120@30", "--device", "x86_64-cpu",
         "--mqtt", broker.url, "--fleet", "lab", "--device-id", "cam-r", "--telemetry-interval", "0.5",
         "--spool", str(spool), "--json"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.slow
def test_a_killed_run_restarts_with_its_totals_and_the_restart_counted(
    x86_bundle: tuple[Path, dict[str, Any]], broker: Mosquitto, cache_env: dict[str, str], tmp_path: Path
) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(120)
    env = {**cache_env, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "2000000"}
    sub = Subscriber(broker.port, "edgekit/v1/lab/cam-r/telemetry", client_id="continuity")
    spool = tmp_path / "telemetry.db"
    device = run_device(x86_bundle[0], broker, spool, env)
    try:
        assert notify.recv(4096).startswith(b"READY=1")  # `edgekit run` under Type=notify
        assert notify.recv(4096).startswith(b"WATCHDOG=1")
        assert sub.wait_for(lambda: any(m["counters"]["frames"] >= 30 for m in sub.of("telemetry")), 120)
        device.send_signal(signal.SIGKILL)  # no clean stop: nothing is written on the way out
        device.wait(10)
        before = sub.of("telemetry")
        last = max(before, key=lambda m: m["seq"])
        assert {m["counters"]["restarts"] for m in before} == {0}
        device = run_device(x86_bundle[0], broker, spool, env)
        assert sub.wait_for(lambda: any(m["session"] != last["session"] for m in sub.of("telemetry")), 120)
        after = [m for m in sub.of("telemetry") if m["session"] != last["session"]]
        first = min(after, key=lambda m: m["seq"])
        assert first["epoch"] == last["epoch"] and first["seq"] > last["seq"]  # the same sequence
        assert first["counters"]["restarts"] == 1
        # Going on from the last reported totals, not from zero (the new process's own frames on top).
        assert first["counters"]["frames"] >= last["counters"]["frames"]
        assert first["counters"]["frames"] == last["counters"]["frames"] + sum(
            m["window"]["frames"] for m in after if m["seq"] <= first["seq"]
        )
    finally:
        if device.poll() is None:
            device.kill()
            device.wait(10)
        sub.close()
        notify.close()
