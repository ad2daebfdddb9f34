"""The fleet simulator (``edgekit fleet simulate``) through a real Mosquitto into a Collector: births,
windows, Wills; and the ingest bench."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet import Collector, FleetStore
from edgekit.fleet.mqtt import FleetSubscriber
from edgekit.protocol.broker import BrokerConfig
from edgekit.telemetry.simulate import SimDevice, SimOptions
from edgekit.testing.mosquitto import Mosquitto

from conftest import EDGEKIT, ROOT

SIM = [*EDGEKIT, "fleet", "simulate"]
BENCH = [sys.executable, "-m", "benchmarks.fleet_ingest"]  # run from the repository root
KEEPALIVE = 2
# How long after the broker's keep-alive deadline (1.5x the keep-alive) an offline may take to
# reach the store: the broker's timer, the Will's delivery, the collector.  Generous on purpose.
SLACK_S = 5.0
# Mosquitto 2.0 (before 2.0.21) looks for expired keep-alives only every ~6 s: a silent client is
# noticed 1.5x its keep-alive after its last packet, plus up to that much.
BROKER_CHECK_S = 6.0


@contextmanager
def collecting(broker: Mosquitto) -> Iterator[Collector]:
    """A Collector fed by the fleet's own subscriber to both topic trees."""
    collector = Collector(FleetStore())
    sub = FleetSubscriber(
        BrokerConfig.from_url(broker.url), collector.handle, client_id="test-collector"
    ).start()
    try:
        yield collector
    finally:
        sub.stop()
        collector.store.close()


def simulator(broker: Mosquitto, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SIM, "--mqtt", broker.url, "--fleet", "demo", "--interval", "0.5",
         "--keepalive", str(KEEPALIVE), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(what: Callable[[], Any], timeout: float, describe: Callable[[], Any] = lambda: None) -> float:
    """Seconds until ``what()`` is true; fails (saying ``describe()``) after ``timeout``."""
    start = time.monotonic()
    while not what():
        assert time.monotonic() - start < timeout, describe()
        time.sleep(0.05)
    return time.monotonic() - start


def states(c: Collector) -> dict[str, str]:
    return {d["device"]: d["state"] for d in c.store.devices()}


def windows(c: Collector, device: str) -> int:
    c.flush()
    return len(c.store.seqs("demo", device))


def test_simulated_devices_are_born_report_windows_and_die_by_their_will(broker: Mosquitto) -> None:
    with collecting(broker) as c:
        sim = simulator(broker, "--devices", "5", "--offline", "sim-03@4")
        try:
            names = [f"sim-{i:02d}" for i in range(1, 6)]
            wait_for(lambda: all(windows(c, n) >= 3 for n in names if n != "sim-03"), 30, lambda: states(c))
            devices = {d["device"]: d for d in c.store.devices()}
            assert sorted(devices) == names
            births = [d["birth"] for d in devices.values()]
            assert {b["profile"] for b in births} == {
                "rpi5",
                "jetson-orin-nano",
                "coral-devboard",
                "x86_64-cpu",
            }
            assert {b["backend"] for b in births} == {"litert", "tensorrt", "onnxruntime", "openvino"}
            assert {b["budget_ms"] for b in births} == {33.3, 16.7, 50.0}
            assert all(b["model"]["name"] == "efficientnet-lite0" for b in births)
            # sim-03 dropped its connection without a word: its Will said offline; the others carry on.
            wait_for(lambda: states(c)["sim-03"] == "offline", 10, lambda: states(c))
            assert [s for n, s in states(c).items() if n != "sim-03"] == ["online"] * 4
            merged = c.store.merged(fleet="demo")
            assert merged.count > 100 and 5 < merged.quantile(0.5) < 50
            assert not c.rejected and c.lag.count > 0
            sim.send_signal(signal.SIGKILL)  # no clean stop: the broker publishes every Will
            sim.wait(10)
            took = wait_for(
                lambda: set(states(c).values()) == {"offline"}, 1.5 * KEEPALIVE + SLACK_S, lambda: states(c)
            )
            # Every window has a sketch per stage: compared once no more windows come (the
            # collector stores them as they arrive, so two queries while they come may differ).
            c.flush()
            assert c.store.merged(fleet="demo", stage="inference").count == c.store.merged(fleet="demo").count
        finally:
            if sim.poll() is None:
                sim.kill()
    assert took < 1.5 * KEEPALIVE + SLACK_S


def test_a_silent_sparkplug_fleet_dies_at_its_keepalive(broker: Mosquitto) -> None:
    with collecting(broker) as c:
        sim = simulator(broker, "--devices", "3", "--format", "sparkplug")
        try:
            names = ["sim-01", "sim-02", "sim-03"]
            wait_for(lambda: all(windows(c, n) >= 3 for n in names), 30, lambda: (states(c), c.stats()))
            devices = {d["device"]: d for d in c.store.devices()}
            assert devices["sim-02"]["birth"]["backend"] == "tensorrt"
            assert devices["sim-01"]["birth"]["model"]["name"] == "efficientnet-lite0"
            assert devices["sim-03"]["birth"]["format"] == "sparkplug"
            assert set(states(c).values()) == {"online"} and not c.rejected
            assert c.store.merged(device="sim-02").count > 0
            # Frozen: the sockets stay open but nothing is sent, as when a device hangs or its
            # network goes away.  The broker gives up after 1.5x the keep-alive (see BROKER_CHECK_S): NDEATH.
            sim.send_signal(signal.SIGSTOP)
            took = wait_for(
                lambda: set(states(c).values()) == {"offline"},
                1.5 * KEEPALIVE + BROKER_CHECK_S + SLACK_S,
                lambda: (states(c), c.stats()),
            )
            assert c.seen["sparkplug-death"] == 3 and took >= 1.0  # not before the keep-alive ran out
        finally:
            sim.kill()
            sim.wait(10)


def test_sigterm_stops_the_simulator_cleanly(broker: Mosquitto) -> None:
    with collecting(broker) as c:
        sim = simulator(broker, "--devices", "2")
        try:
            wait_for(
                lambda: len(states(c)) == 2 and set(states(c).values()) == {"online"}, 30, lambda: states(c)
            )
            sim.send_signal(signal.SIGTERM)
            out, err = sim.communicate(timeout=20)
        finally:
            if sim.poll() is None:
                sim.kill()
        assert sim.returncode == 0 and "Traceback" not in err and "stopped" in out
        wait_for(lambda: set(states(c).values()) == {"offline"}, 5, lambda: states(c))


def test_the_creeping_device_goes_over_budget_and_the_others_stay_within(tmp_path: Path) -> None:
    options = SimOptions(mqtt="mqtt://127.0.0.1:1", prefix="sim", fleet="demo", interval=1.0)
    broker = BrokerConfig.from_url(options.mqtt)
    devices = [SimDevice(i, options, broker, tmp_path, 0.0) for i in range(5)]
    for d in devices:
        budget = d.kind.budget_ms
        over = [d.median_ms(t) > budget for t in range(0, 600, 5)]
        assert any(over) == (d.name == "sim-02"), d.name
        window = d.window_of(1.0, 300.0).to_dict()
        assert window["frames"] == d.fps and window["latency_ms"]["count"] == d.fps
        d.publisher.spool.close()


@pytest.mark.parametrize(("fmt", "mode"), [("json", "live"), ("sparkplug", "live"), ("json", "backlog")])
def test_the_ingest_bench_runs_and_drops_nothing(fmt: str, mode: str) -> None:
    backlog = ["--backlog"] if mode == "backlog" else []
    run = subprocess.run(
        [*BENCH, "--rate", "300", "--duration", "2", "--devices", "4", "--format", fmt, "--json",
         *backlog],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert (
        r["mode"] == mode
        and r["sent"] > 300
        and r["stored"] == r["sent"]
        and r["dropped"] == 0
        and not r["rejected"]
    )
    assert r["ingest_rate"] > 0 and r["lag_ms"]["p50"] is not None and r["cpu_s_per_1000"] > 0
