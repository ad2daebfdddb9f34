"""The fleet collector: de-duplication, gaps, merged fleet percentiles, bad input, and a real broker feed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from broker import Mosquitto
from paho.mqtt.enums import CallbackAPIVersion

import edgekit
from edgekit.fleet import Collector, FleetStore, safe_name
from edgekit.fleet.collector import MAX_PAYLOAD
from edgekit.pipeline.records import FrameRecord
from edgekit.telemetry import BrokerConfig, Spool, TelemetryPublisher
from edgekit.telemetry.window import MetricsWindow


def record(latency: float, met: bool = True) -> FrameRecord:
    return FrameRecord(0, 0.0, 0, 0, 0.1, 1.0, latency - 1.5, 0.3, 0.1, latency, met, 0, "x")


class FakeDevice:
    """A device's real telemetry code (window, payload, spool) without a network: payloads to hand over."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.window = MetricsWindow()
        self.pub = TelemetryPublisher(
            BrokerConfig.from_url("mqtt://127.0.0.1:1"),
            device_id=name,
            fleet="lab",
            window=self.window,
            spool=Spool(tmp / f"{name}.db"),
            counters=lambda: {"frames": 0, "missed": 0, "dropped": 0},
        )
        self.topic = f"edgekit/v1/lab/{name}/telemetry"
        self.status = f"edgekit/v1/lab/{name}/status"

    def window_of(self, latencies: np.ndarray) -> bytes:
        for v in latencies:
            self.window.observe(record(float(v), met=v < 33))
        return json.dumps(self.pub.telemetry_payload()).encode()


def test_merged_fleet_percentiles_match_the_raw_samples_and_duplicates_and_gaps_are_handled(
    tmp_path: Path,
) -> None:
    store = FleetStore(tmp_path / "fleet.db")
    c = Collector(store)
    rng = np.random.default_rng(11)
    a, b = FakeDevice("cam-a", tmp_path), FakeDevice("cam-b", tmp_path)
    raw_a, raw_b, sent_b = [], [], []
    for _i in range(12):
        xa = rng.lognormal(2.6, 0.25, 300)  # ~14 ms, a fast device
        xb = rng.lognormal(3.2, 0.40, 200)  # ~25 ms with a long tail
        raw_a.append(xa)
        raw_b.append(xb)
        assert c.handle(a.topic, a.window_of(xa)) == "telemetry"
        sent_b.append(b.window_of(xb))
    # cam-b's messages arrive out of order, with two repeated and seq 5 late (after an outage).
    order = [0, 1, 2, 3, 4, 6, 7, 1, 8, 9, 10, 11, 5, 7]
    outcomes = [c.handle(b.topic, sent_b[i]) for i in order]
    assert outcomes.count("duplicate") == 2 and outcomes.count("telemetry") == 12
    assert (
        store.gaps("lab", "cam-b") == [(5, 5)] and c.open_gaps("lab", "cam-b") == []
    )  # noticed, then filled
    assert store.seqs("lab", "cam-b") == list(range(12))
    union = np.sort(np.concatenate(raw_a + raw_b))
    fleet = store.merged(fleet="lab")
    assert fleet.count == union.size
    for q in (0.5, 0.9, 0.99, 0.999):
        true = union[int(q * (union.size - 1))]
        assert abs(fleet.quantile(q) - true) / true <= 0.01 + 1e-9
    # Averaging the two devices' p99 would be wrong; the merged one is not.
    only_a = store.merged(device="cam-a")
    assert only_a.count == sum(x.size for x in raw_a)
    assert store.merged(fleet="lab", stage="inference").count == union.size
    store.close()


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [
        ("edgekit/v1/lab/cam-1/telemetry", b"{not json", "malformed-json"),
        ("edgekit/v1/lab/cam-1/telemetry", b"[1, 2]", "malformed-json"),
        ("edgekit/v1/lab/cam-1/telemetry", b"\xff\xfe\x00", "malformed-json"),
        (
            "edgekit/v1/lab/cam-1/telemetry",
            json.dumps({"schema": "edgekit/v2/telemetry"}).encode(),
            "schema-version",
        ),
        (
            "edgekit/v1/lab/cam-1/status",
            json.dumps({"schema": "edgekit/v1/telemetry"}).encode(),
            "schema-version",
        ),
        ("edgekit/v1/lab/cam-1/telemetry", b" " * (MAX_PAYLOAD + 1), "oversized"),
        ("edgekit/v1/lab/..%2F/telemetry", b"{}", "bad-id"),
        ("edgekit/v1/lab/a..b/telemetry", b"{}", "bad-id"),
        ("edgekit/v1/lab/cam+1/telemetry", b"{}", "bad-id"),
        ("edgekit/v1/lab/cam#1/telemetry", b"{}", "bad-id"),
        ("edgekit/v1/lab/cam/1/telemetry", b"{}", "topic"),
        ("edgekit/v1/lab/cam-1/secrets", b"{}", "topic"),
        (
            "edgekit/v1/lab/cam-1/status",
            json.dumps({"schema": "edgekit/v1/status", "device": "cam-2", "state": "online"}).encode(),
            "device-mismatch",
        ),
        (
            "edgekit/v1/lab/cam-1/status",
            json.dumps({"schema": "edgekit/v1/status", "device": "cam-1", "state": "exploded"}).encode(),
            "bad-field",
        ),
        (
            "edgekit/v1/lab/cam-1/telemetry",
            json.dumps(
                {"schema": "edgekit/v1/telemetry", "device": "cam-1", "seq": "7", "window": {}}
            ).encode(),
            "bad-field",
        ),
        (
            "edgekit/v1/lab/cam-1/telemetry",
            json.dumps(
                {
                    "schema": "edgekit/v1/telemetry",
                    "device": "cam-1",
                    "seq": 0,
                    "counters": {},
                    "window": {
                        "start": 0,
                        "end": 1,
                        "frames": 1,
                        "missed": 0,
                        "stages_ms": {},
                        "latency_ms": {
                            "accuracy": 0.01,
                            "count": 5,
                            "sum": 1,
                            "min": 1,
                            "max": 1,
                            "zero": 0,
                            "buckets": {"1": 1},
                        },
                    },
                }
            ).encode(),
            "bad-field",
        ),
    ],
)
def test_bad_input_is_counted_and_the_collector_stays_up(
    topic: str, payload: bytes, reason: str, tmp_path: Path
) -> None:
    c = Collector(FleetStore())
    assert c.handle(topic, payload) == f"rejected:{reason}"
    assert c.rejected == {reason: 1}
    good = FakeDevice("cam-1", tmp_path)
    assert (
        c.handle(good.topic, good.window_of(np.full(10, 12.0))) == "telemetry"
    )  # still up, still taking data
    assert c.store.devices()[0]["device"] == "cam-1"


def test_names_that_cannot_be_topics_or_paths() -> None:
    for ok in ("cam-1", "rpi5.kitchen", "A_b"):
        assert safe_name(ok)
    for bad in ("", "a/b", "+", "#", "..", "a..b", ".hidden", "x" * 200):
        assert not safe_name(bad)


def test_a_real_device_through_mosquitto_to_the_store(
    tmp_path: Path, x86_bundle: tuple[Path, dict[str, Any]]
) -> None:
    broker = Mosquitto(tmp_path).start()
    store = FleetStore(tmp_path / "fleet.db")
    collector = Collector(store)
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="collector")
    client.on_connect = lambda c, u, f, rc, p: c.subscribe("edgekit/v1/#", qos=1)
    client.on_message = lambda c, u, msg: collector.handle(msg.topic, msg.payload)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        time.sleep(0.5)
        with (
            edgekit.load(x86_bundle[0], device="x86_64-cpu") as model,
            edgekit.Pipeline(model, "synthetic:160x120@30", duration_s=2.5) as p,
        ):
            p.report(broker.url, device_id="cam-r", fleet="lab", interval_s=0.4)
            p.run()
        deadline = time.monotonic() + 10
        while (d := store.device("lab", "cam-r")) is None or d["state"] != "offline":
            assert time.monotonic() < deadline, d
            time.sleep(0.05)
        assert d["birth"]["backend"] == "onnxruntime" and d["birth"]["model"]["name"] == "efficientnet-lite0"
        merged = store.merged(device="cam-r")
        assert merged.count == p.counters.frames and not collector.rejected
        assert merged.quantile(0.5) == pytest.approx(p.stats.latency.quantile(0.5))
        assert collector.open_gaps("lab", "cam-r") == []
    finally:
        client.disconnect()
        client.loop_stop()
        broker.stop()
        store.close()


def test_a_device_whose_spool_was_recreated_starts_a_new_epoch(tmp_path: Path) -> None:
    c = Collector(FleetStore())
    old = FakeDevice("cam-e", tmp_path / "old")
    for _ in range(5):
        assert c.handle(old.topic, old.window_of(np.full(10, 12.0))) == "telemetry"
    fresh = FakeDevice("cam-e", tmp_path / "new")  # same device, new spool: seq starts at 0 again
    assert fresh.pub.spool.epoch != old.pub.spool.epoch
    outcomes = [c.handle(fresh.topic, fresh.window_of(np.full(10, 12.0))) for _ in range(3)]
    assert outcomes == ["telemetry"] * 3  # not mistaken for replays of seq 0..2
    assert c.store.merged(device="cam-e").count == 80


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda p: p.replace(b'"frames":10', b'"frames":Infinity'), "malformed-json"),
        (lambda p: p.replace(b'"seq":0', b'"seq":9223372036854775808'), "bad-field"),
        (lambda p: p.replace(b'"accuracy":0.01', b'"accuracy":0.05', 1), "bad-field"),
        (lambda p: p.replace(b'"postprocess":', b'"postprocessing":'), "bad-field"),
        (lambda p: p.replace(b'"epoch":"', b'"epoch":7,"x":"'), "bad-field"),
    ],
)
def test_numbers_and_sketches_that_would_break_storage_or_merging_are_refused(
    change: Any, needle: str, tmp_path: Path
) -> None:
    dev = FakeDevice("cam-n", tmp_path)
    payload = dev.window_of(np.full(10, 12.0)).replace(b", ", b",").replace(b": ", b":")
    bad = change(payload)
    assert bad != payload
    c = Collector(FleetStore())
    assert c.handle(dev.topic, bad) == f"rejected:{needle}"
    assert c.handle(dev.topic, payload) == "telemetry"
