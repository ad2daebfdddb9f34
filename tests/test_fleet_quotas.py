"""One device cannot exhaust the fleet: quotas per credential and per device, age-out, no padding stored,
a bounded /metrics; against a real Mosquitto (with the fleet guide's ACL) and the real collector."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_fleet_mqtt import publish

from edgekit.fleet import Collector, FleetStore, FleetView
from edgekit.fleet.mqtt import FleetSubscriber
from edgekit.pipeline.records import FrameRecord
from edgekit.protocol.broker import BrokerConfig
from edgekit.telemetry import Spool, TelemetryPublisher
from edgekit.telemetry.window import MetricsWindow
from edgekit.testing.mosquitto import Mosquitto, secure_mosquitto

# The fleet guide's ACL (docs/guides/fleet.md): each device writes only under its own name (%u), in any fleet.
README_ACL = (
    "user fleet\ntopic read edgekit/v1/#\ntopic read spBv1.0/#\n\n"
    + "".join(f"pattern write edgekit/v1/+/%u/{leaf}\n" for leaf in ("status", "telemetry", "labels"))
    + "pattern write spBv1.0/+/+/%u\npattern write spBv1.0/+/+/%u/#\n"
)
PAD = 250 * 1024


def status(device: str, fleet: str, **extra: Any) -> bytes:
    body = {"schema": "edgekit/v1/status", "state": "online", "device": device, "fleet": fleet, "ts": 1.0}
    return json.dumps(body | extra).encode()


def telemetry(device: str, fleet: str, tmp: Path, n: int) -> list[dict[str, Any]]:
    """``n`` windows a real publisher makes (its window, payload and spool code)."""
    window = MetricsWindow()
    pub = TelemetryPublisher(
        BrokerConfig.from_url("mqtt://127.0.0.1:1"),
        device_id=device,
        fleet=fleet,
        window=window,
        spool=Spool(tmp / f"{fleet}-{device}.db"),
        counters=lambda: {"frames": 0, "missed": 0, "dropped": 0},
    )
    out = []
    for i in range(n):
        for v in np.linspace(8, 40, 50) + i:
            window.observe(FrameRecord(0, 0.0, 0, 0, 0.1, 1.0, v - 1.5, 0.3, 0.1, v, v < 33, 0, "x"))
        out.append(pub.telemetry_payload())
    return out


class Fed:
    """The collector behind a real FleetSubscriber; ``wait`` until the collector has taken ``n`` messages."""

    def __init__(self, collector: Collector, config: BrokerConfig) -> None:
        self.collector, self.count, self.lock = collector, 0, threading.Lock()
        self.sub = FleetSubscriber(config, self._handle, client_id=f"c-{time.monotonic_ns()}").start()

    def _handle(self, topic: str, payload: bytes) -> None:
        self.collector.handle(topic, payload)
        with self.lock:
            self.count += 1

    def wait(self, n: int, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while self.count < n:
            assert time.monotonic() < end, f"{self.count} of {n} messages arrived"
            time.sleep(0.02)
        self.collector.flush()


@pytest.fixture
def feed(tmp_path: Path) -> Iterator[Callable[..., Fed]]:
    started: list[tuple[Fed, Mosquitto]] = []

    def start(collector: Collector, broker: Mosquitto, config: BrokerConfig) -> Fed:
        fed = Fed(collector, config)
        started.append((fed, broker))
        return fed

    yield start
    for fed, broker in started:
        fed.sub.stop()
        broker.stop()


def test_one_credential_flooding_fleet_names_cannot_keep_a_new_device_out(
    tmp_path: Path, feed: Callable[..., Fed], caplog: pytest.LogCaptureFixture
) -> None:
    broker, ca = secure_mosquitto(
        tmp_path, {"fleet": "pw-f", "cam-evil": "pw-e", "cam-new": "pw-n"}, README_ACL
    )
    view = FleetView(FleetStore())
    collector = Collector(FleetStore(tmp_path / "fleet.db"), listener=view, max_devices=50)
    view.stats = collector.stats
    fed = feed(
        collector, broker, BrokerConfig.from_url(f"mqtts://fleet:pw-f@127.0.0.1:{broker.port}", ca_file=ca)
    )
    flood = [(f"edgekit/v1/f{i:03d}/cam-evil/status", status("cam-evil", f"f{i:03d}")) for i in range(80)]
    publish(broker.port, flood, ca=str(ca), user="cam-evil", password="pw-e")
    fed.wait(80)
    # The ACL kept the credential to its own name; the collector kept that name to a few fleets.
    assert collector.stats()["devices"]["tracked"] == 4
    assert collector.rejected == {"credential-quota": 76}
    # Counted in full, logged once: a flood must not become a flood of log lines.
    assert sum("collector: rejected" in r.getMessage() for r in caplog.records) == 1
    publish(
        broker.port,
        [("edgekit/v1/lab/cam-new/status", status("cam-new", "lab"))],
        ca=str(ca),
        user="cam-new",
        password="pw-n",
    )
    fed.wait(81)
    assert collector.store.device("lab", "cam-new") is not None  # a real new device is still let in
    view.tick()
    shown = view.snapshot()
    assert shown["collector"]["rejected"] == {"credential-quota": 76}  # the dashboard's API says so
    assert {d["device"] for d in shown["devices"]} == {"cam-evil", "cam-new"}


def test_a_flood_of_device_names_ages_out_and_a_new_device_gets_in(
    tmp_path: Path, feed: Callable[..., Fed]
) -> None:
    from edgekit.fleet.quotas import Quotas

    broker = Mosquitto(tmp_path).start()  # no ACL: every name is free to take
    view = FleetView()
    quotas = Quotas(max_devices=50, quiet_s=2.0)
    collector = Collector(FleetStore(tmp_path / "fleet.db"), listener=view, quotas=quotas)
    fed = feed(collector, broker, BrokerConfig.from_url(broker.url))
    publish(broker.port, [(f"edgekit/v1/lab/junk-{i}/status", status(f"junk-{i}", "lab")) for i in range(80)])
    fed.wait(80)
    assert collector.rejected == {"too-many-devices": 30}
    time.sleep(2.5)  # the flood goes quiet
    publish(broker.port, [("edgekit/v1/lab/cam-new/status", status("cam-new", "lab"))])
    fed.wait(81)
    assert collector.store.device("lab", "cam-new") is not None
    assert collector.seen["aged-out"] == 50 and len(collector.store.devices()) == 1
    assert [d.device for d in view.prometheus_state()] == ["cam-new"]  # gone from /metrics and the page too
    # A restarted collector counts from the store: the room stays free.
    assert Collector(collector.store, quotas=quotas).stats()["devices"]["tracked"] == 1


def test_padding_a_valid_message_does_not_reach_the_store(tmp_path: Path, feed: Callable[..., Fed]) -> None:
    broker = Mosquitto(tmp_path).start()
    db = tmp_path / "fleet.db"
    collector = Collector(FleetStore(db))
    fed = feed(collector, broker, BrokerConfig.from_url(broker.url))
    windows = telemetry("cam-pad", "lab", tmp_path, 21)
    topic = "edgekit/v1/lab/cam-pad/telemetry"
    publish(broker.port, [(topic, json.dumps(w).encode()) for w in windows[:1]])
    fed.wait(1)
    before = sqlite3.connect(db).execute("SELECT SUM(LENGTH(payload)) FROM windows").fetchone()[0]
    padded = []
    for w in windows[1:]:
        w = w | {"pad": "x" * (PAD // 2)}
        w["window"] = w["window"] | {"more": ["y" * 1024] * (PAD // 2 // 1030)}
        padded.append((topic, json.dumps(w).encode()))
    birth = status("cam-pad", "lab", pad="z" * PAD)
    assert min(len(p) for _, p in padded) > PAD
    publish(broker.port, [*padded, ("edgekit/v1/lab/cam-pad/status", birth)])
    fed.wait(22)
    assert collector.seen["telemetry"] == 21 and not collector.rejected  # valid: accepted...
    rows = sqlite3.connect(db).execute("SELECT SUM(LENGTH(payload)) FROM windows").fetchone()[0]
    assert rows - before < 20 * 2 * before  # ...but stored at a window's size, not 20 x 250 KiB
    text = db.read_bytes() + (tmp_path / "fleet.db-wal").read_bytes()
    assert b"x" * 1000 not in text and b"y" * 1000 not in text and b"z" * 1000 not in text
    assert collector.seen["unknown-fields-dropped"] == 21
    stored = collector.store.device("lab", "cam-pad")
    assert stored is not None and "pad" not in stored["birth"]
    assert collector.store.merged(device="cam-pad").count == 21 * 50  # what the windows said is all there
    # Padding inside the schema's own maps (made-up counters, stages, zones) is refused: they are bounded.
    many = {f"c{i:05d}": 1 for i in range(5000)}
    stuffed = windows[-1] | {"seq": 99, "counters": windows[-1]["counters"] | many}
    publish(broker.port, [(topic, json.dumps(stuffed).encode())])
    fed.wait(23)
    assert collector.rejected == {"bad-field": 1}


def test_a_device_over_its_rate_is_refused_and_counted(tmp_path: Path, feed: Callable[..., Fed]) -> None:
    from edgekit.fleet.quotas import Quotas

    broker = Mosquitto(tmp_path).start()
    quotas = Quotas(messages_per_min=60, message_burst=10, bytes_per_min=600_000, byte_burst=200_000)
    collector = Collector(FleetStore(), quotas=quotas)
    fed = feed(collector, broker, BrokerConfig.from_url(broker.url))
    flood = [("edgekit/v1/lab/cam-loud/status", status("cam-loud", "lab", n=i)) for i in range(101)]
    started = time.monotonic()
    publish(broker.port, flood)
    fed.wait(101)
    elapsed = time.monotonic() - started
    # The first message makes the device known; then a burst of 10, then about one a second.
    assert collector.seen["status"] <= 11 + elapsed + 1
    assert collector.rejected["rate-messages"] == 101 - collector.seen["status"] >= 80
    time.sleep(1.2)  # the bucket refills: the device is heard again
    publish(broker.port, [flood[0]])
    fed.wait(102)
    assert collector.stats()["rejected"]["rate-messages"] == 101 - collector.seen["status"] + 1
    # Bytes too: 100 kB messages, 200 kB of burst.
    big = [("edgekit/v1/lab/cam-fat/status", status("cam-fat", "lab", pad="p" * 100_000)) for _ in range(6)]
    publish(broker.port, big)
    fed.wait(108)
    assert collector.rejected["rate-bytes"] >= 3


def test_metrics_stay_bounded_with_many_devices(tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="pip install -e '.[fleet]'")
    pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx (pip install -e '.[dev]')")
    from fastapi.testclient import TestClient

    from edgekit.fleet import prometheus
    from edgekit.fleet.dashboard import create_app

    store = FleetStore()
    view = FleetView(store)
    collector = Collector(store, listener=view)
    view.stats = collector.stats
    template = telemetry("cam", "lab", tmp_path, 1)[0]
    for i in range(300):
        name = f"cam-{i:03d}"
        assert (
            collector.handle(f"edgekit/v1/lab/{name}/status", status(name, "lab"), now=1000.0 + i) == "status"
        )
        body = template | {"device": name}
        assert (
            collector.handle(f"edgekit/v1/lab/{name}/telemetry", json.dumps(body).encode(), now=1000.0 + i)
            == "telemetry"
        )
    per_device = prometheus.series_of(view.prometheus_state()[0])
    app = create_app(view, metrics_max_series=100 * per_device)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        text = client.get("/metrics").text
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) < 100 * per_device + 100  # the devices' cap plus the collector's few
    assert 'edgekit_metrics_devices{which="omitted"} 200' in text
    # The most recently heard are the ones exported.
    assert 'edgekit_device_up{fleet="lab",device="cam-299"} 1' in text
    assert 'device="cam-000"' not in text


def test_a_credential_at_its_quota_gets_a_new_fleet_once_an_old_one_is_quiet() -> None:
    from edgekit.fleet.quotas import Quotas

    collector = Collector(FleetStore(), quotas=Quotas(per_credential=2, quiet_s=3600))
    for i, fleet in enumerate(("lab", "prod")):
        assert (
            collector.handle(f"edgekit/v1/{fleet}/cam-1/status", status("cam-1", fleet), now=1000 + i)
            == "status"
        )
    # A third fleet while both are live: refused.
    assert collector.handle("edgekit/v1/moved/cam-1/status", status("cam-1", "moved"), now=2000).endswith(
        "credential-quota"
    )
    # "prod" keeps talking; "lab" goes quiet past the hour: the camera moved, and the move is let in.
    assert collector.handle("edgekit/v1/prod/cam-1/status", status("cam-1", "prod"), now=4000) == "status"
    assert collector.handle("edgekit/v1/moved/cam-1/status", status("cam-1", "moved"), now=5000) == "status"
    assert {(d["fleet"], d["device"]) for d in collector.store.devices()} == {
        ("prod", "cam-1"),
        ("moved", "cam-1"),
    }
    assert collector.rejected == {"credential-quota": 1} and collector.seen["aged-out"] == 1
