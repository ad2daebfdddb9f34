"""The fleet collector: de-duplication, gaps, merged fleet percentiles, bad input, and a real broker feed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

import edgekit
from edgekit.fleet import Collector, FleetStore, safe_name
from edgekit.fleet.collector import MAX_PAYLOAD
from edgekit.pipeline.records import FrameRecord
from edgekit.protocol.stages import STAGES
from edgekit.telemetry import BrokerConfig, Spool, TelemetryPublisher, report
from edgekit.telemetry.window import MetricsWindow
from edgekit.testing.mosquitto import Mosquitto


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
            report(p, broker.url, device_id="cam-r", fleet="lab", interval_s=0.4)
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


# -- the listener, lag and stats -------------------------------------------------------------------


class Recorder:
    """A ``CollectorListener`` that keeps what it is told (and can be told to fail)."""

    def __init__(self, fail: bool = False) -> None:
        self.windows: list[tuple[str, str, int]] = []
        self.bodies: list[dict[str, Any]] = []
        self.gaps: list[tuple[str, str]] = []
        self.statuses: list[tuple[str, str, str, dict[str, Any] | None]] = []
        self.fail = fail

    def window(self, fleet: str, device: str, body: dict[str, Any], at: float) -> None:
        self.windows.append((fleet, device, body["seq"]))
        self.bodies.append(body)
        if self.fail:
            raise RuntimeError("the dashboard broke")

    def status(self, fleet: str, device: str, state: str, at: float, birth: dict[str, Any] | None) -> None:
        self.statuses.append((fleet, device, state, birth))
        if self.fail:
            raise RuntimeError("the dashboard broke")

    def gap(self, fleet: str, device: str) -> None:
        self.gaps.append((fleet, device))
        if self.fail:
            raise RuntimeError("the dashboard broke")


def status_body(device: str, state: str, **birth: Any) -> bytes:
    return json.dumps(
        {"schema": "edgekit/v1/status", "device": device, "fleet": "lab", "state": state, **birth}
    ).encode()


def test_the_listener_hears_new_windows_and_status_changes_and_lag_is_measured(tmp_path: Path) -> None:
    rec = Recorder()
    c = Collector(FleetStore(), batch_size=10, listener=rec)
    dev = FakeDevice("cam-l", tmp_path)
    assert c.handle(dev.status, status_body("cam-l", "online", backend="litert")) == "status"
    sent = [dev.window_of(np.full(5, 10.0)) for _ in range(4)]
    del sent[2]  # lost on the way: a gap
    at = json.loads(sent[0])["sent_at"] + 0.25  # each arrives 250 ms after it was sent
    outcomes = [c.handle(dev.topic, p, now=json.loads(p)["sent_at"] + 0.25) for p in (*sent, sent[1])]
    assert outcomes == ["telemetry", "telemetry", "telemetry", "duplicate"]
    assert c.handle(dev.status, status_body("cam-l", "offline"), now=at) == "status"
    assert rec.windows == [("lab", "cam-l", 0), ("lab", "cam-l", 1), ("lab", "cam-l", 3)]  # no duplicate
    assert rec.gaps == [("lab", "cam-l")]
    assert [(s[2], s[3] and s[3]["backend"]) for s in rec.statuses] == [
        ("online", "litert"),
        ("offline", None),
    ]
    stats = c.stats()
    assert (
        stats["seen"] == {"status": 2, "telemetry": 3, "duplicate": 1, "gaps": 1} and stats["rejected"] == {}
    )
    assert stats["lag_ms"]["p50"] == pytest.approx(250, rel=0.02) and c.lag.count == 3
    # Telemetry from a device the collector has not seen (or saw go offline) brings it online.
    assert c.handle(dev.topic, dev.window_of(np.full(5, 10.0))) == "telemetry"
    assert rec.statuses[-1][2:] == ("online", None) and c.store.device("lab", "cam-l")["state"] == "online"
    json.dumps(stats)  # the dashboard serves it as is


def test_a_failing_listener_does_not_stop_collection(tmp_path: Path) -> None:
    c = Collector(FleetStore(), listener=Recorder(fail=True))
    dev = FakeDevice("cam-f", tmp_path)
    assert [c.handle(dev.topic, dev.window_of(np.full(5, 10.0))) for _ in range(3)] == ["telemetry"] * 3
    assert c.store.seqs("lab", "cam-f") == [0, 1, 2]


def test_stats_before_any_window() -> None:
    stats = Collector(FleetStore()).stats()
    assert stats.pop("quotas")["per_credential"] == 4
    assert stats == {
        "seen": {},
        "rejected": {},
        "lag_ms": {"p50": None, "p99": None},
        "stored_lag_ms": {"p50": None, "p99": None},
        "devices": {"tracked": 0, "max": 10_000, "fleets": 0},
    }


def test_the_lag_to_the_row_counts_until_the_commit(tmp_path: Path) -> None:
    c = Collector(FleetStore(), batch_size=10, flush_s=3600)  # nothing is written until flush()
    dev = FakeDevice("cam-s", tmp_path)
    body = json.loads(dev.window_of(np.full(5, 10.0))) | {"sent_at": time.time() - 2.0}
    assert c.handle(dev.topic, json.dumps(body).encode(), now=body["sent_at"] + 0.1) == "telemetry"
    assert c.lag.count == 1 and c.stored_lag.count == 0  # received, not yet in the store
    c.flush()
    stats = c.stats()
    assert stats["lag_ms"]["p50"] == pytest.approx(100, rel=0.02)
    assert 2000 * 0.99 <= stats["stored_lag_ms"]["p50"] < 60_000 and c.stored_lag.count == 1


def sketch(**change: Any) -> dict[str, Any]:
    s = {"accuracy": 0.01, "count": 3, "sum": 36.0, "min": 11.0, "max": 13.0, "zero": 0,
         "buckets": {"120": 1, "124": 1, "129": 1}}  # fmt: skip
    return s | change


@pytest.mark.parametrize(
    "bad",
    [
        sketch(accuracy=0.02),
        sketch(accuracy="0.01"),
        sketch(count=4),
        sketch(count=True),
        sketch(buckets={"120": 1, "124": 1, "129": 1.0}),
        sketch(buckets={"120": 1, "124": 2, "129": -1}),
        sketch(buckets={"120": 1, "124": 1, "129": "1"}),
        sketch(buckets={"120": 1, "124": 1, "0129": 1}),  # reads back as 129: a collision
        sketch(buckets={"120": 1, "124": 1, " 129": 1}),
        sketch(buckets={"120": 1, "124": 1, "99999": 1}),  # exp() of that overflows in quantile()
        sketch(buckets={"120": 1, "124": 1, "x": 1}),
        sketch(buckets=[1, 1, 1]),
        sketch(zero=-1, count=2),
        sketch(sum=float("inf")),
        sketch(min=None),
        [1, 2],
    ],
)
def test_sketches_that_would_break_a_fleet_query_are_refused(bad: Any) -> None:
    from edgekit.fleet.collector import check_sketch

    check_sketch(sketch())
    with pytest.raises((ValueError, TypeError)):
        check_sketch(bad)


def test_every_sketch_a_device_makes_passes_the_check_and_reads_back() -> None:
    from edgekit.core.sketch import LatencySketch
    from edgekit.fleet.collector import check_sketch

    rng = np.random.default_rng(5)
    for values in ([], [0.0], [1e-9, 5.0], rng.lognormal(2.5, 1.5, 2000), [1e9, 3e-5]):
        s = LatencySketch()
        s.extend(values)
        wire = json.loads(json.dumps(s.to_dict()))
        check_sketch(wire)
        assert LatencySketch.from_dict(wire).count == len(values)


# -- Sparkplug B -----------------------------------------------------------------------------------


class Captured:
    """Stands in for paho's client: keeps what the publisher publishes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        self.sent.append((topic, payload))


class SparkplugDevice(FakeDevice):
    """The real Sparkplug publisher code (births, DDATA, death certificate) without a network."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.window = MetricsWindow()
        birth = {"model": {"name": "efficientnet-lite0", "version": "1.1"}, "backend": "tensorrt",
                 "precision": "fp16", "budget_ms": 16.7, "profile": "jetson-orin-nano"}  # fmt: skip
        self.pub = TelemetryPublisher(
            BrokerConfig.from_url("mqtt://127.0.0.1:1"),
            device_id=name,
            fleet="lab",
            window=self.window,
            spool=Spool(tmp / f"{name}-sp.db"),
            counters=lambda: {"frames": 0, "missed": 0, "dropped": 0},
            birth=birth,
            format="sparkplug",
        )
        self.topic = f"spBv1.0/lab/DDATA/{name}/pipeline"

    def births(self) -> list[tuple[str, bytes]]:
        client = Captured()
        self.pub._births(client)
        return client.sent

    def death(self) -> tuple[str, bytes]:
        topic, payload, _ = self.pub._offline()
        return topic, payload

    def window_of(self, latencies: np.ndarray) -> bytes:
        from edgekit.protocol import sparkplug as sp

        for v in latencies:
            self.window.observe(record(float(v), met=v < 33))
        body = self.pub.telemetry_payload()
        return sp.encode(sp.window_metrics(body), self.pub._next_sp_seq(), ts_ms=int(body["sent_at"] * 1000))


def test_sparkplug_births_windows_and_deaths_land_like_json(tmp_path: Path) -> None:
    rec = Recorder()
    c = Collector(FleetStore(tmp_path / "fleet.db"), listener=rec)
    dev = SparkplugDevice("cam-s", tmp_path)
    (nbirth, p1), (dbirth, p2) = dev.births()
    assert nbirth == "spBv1.0/lab/NBIRTH/cam-s" and dbirth == "spBv1.0/lab/DBIRTH/cam-s/pipeline"
    assert c.handle(nbirth, p1) == c.handle(dbirth, p2) == "sparkplug-birth"
    birth = c.store.device("lab", "cam-s")["birth"]
    assert birth["model"] == {"name": "efficientnet-lite0", "version": "1.1"}
    assert (birth["backend"], birth["budget_ms"], birth["profile"]) == ("tensorrt", 16.7, "jetson-orin-nano")
    assert birth["session"] == dev.pub.session and rec.statuses[-1][3] == birth
    rng = np.random.default_rng(3)
    raw, sent = [], []
    for _ in range(4):
        x = rng.lognormal(2.0, 0.3, 50)
        raw.append(x)
        sent.append(dev.window_of(x))
    assert [c.handle(dev.topic, p) for p in (*sent, sent[2])] == ["telemetry"] * 4 + ["duplicate"]
    merged = c.store.merged(device="cam-s")
    union = np.sort(np.concatenate(raw))
    assert merged.count == union.size == c.store.merged(device="cam-s", stage="inference").count
    assert abs(merged.quantile(0.99) - union[int(0.99 * (union.size - 1))]) / union[-1] < 0.02
    assert [w[2] for w in rec.windows] == [0, 1, 2, 3] and c.lag.count == 4
    # The body is the JSON telemetry shape, so the store and the dashboard read both formats alike.
    body = rec.bodies[0]
    assert body["schema"] == "edgekit/v1/telemetry" and body["epoch"] == dev.pub.spool.epoch
    assert set(body["window"]["stages_ms"]) == set(STAGES) and body["counters"]["frames"] == 0
    assert body["window"]["frames"] == 50 and body["sent_at"] > 0
    # A death certificate of an earlier session arrives after the node was born again: not a death.
    stale = dev.death()
    dev.pub._bdseq = (dev.pub._bdseq + 1) % 256  # the next MQTT session
    for topic, payload in dev.births():
        c.handle(topic, payload)
    assert c.handle(*stale) == "sparkplug-stale-death"
    assert c.store.device("lab", "cam-s")["state"] == "online"
    assert c.handle(*dev.death()) == "sparkplug-death"
    assert c.store.device("lab", "cam-s")["state"] == "offline" and rec.statuses[-1][2] == "offline"
    assert not c.rejected


class Boom:
    """Unpickling this would run code: the collector must never unpickle what it receives."""

    ran = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (setattr, (Boom, "ran", True))


def sp_payload(**metrics: Any) -> bytes:
    from edgekit.protocol import sparkplug as sp

    return sp.encode(metrics, 3)


def ddata(tmp_path: Path, **change: Any) -> bytes:
    from edgekit.protocol import sparkplug as sp

    dev = SparkplugDevice("cam-1", tmp_path)
    metrics = sp.decode(dev.window_of(np.full(5, 12.0)))["metrics"]
    return sp.encode({k: v for k, v in (metrics | change).items() if v is not ...}, 4)


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [
        ("spBv1.0/lab/DDATA/cam-1/pipeline", b"\xff\xff not protobuf", "sparkplug-parse"),
        ("spBv1.0/lab/DDATA/cam-1/pipeline", b"", "sparkplug-parse"),  # parses: an empty Payload
        ("spBv1.0/lab/NBIRTH/cam-1", b"", "sparkplug-parse"),  # no bdSeq
        ("spBv1.0/lab/NDEATH/cam-1", "sp:bdSeq=str", "sparkplug-parse"),
        ("spBv1.0/lab/DDATA/cam-1/pipeline", "dd:telemetry/seq=str", "sparkplug-parse"),
        ("spBv1.0/lab/DDATA/cam-1/pipeline", "dd:latency/sketch=drop", "sparkplug-parse"),
        ("spBv1.0/lab/DDATA/cam-1/pipeline", "dd:latency/sketch=notjson", "sparkplug-parse"),
        ("spBv1.0/lab/DDATA/cam-1/pipeline", "dd:window/frames=float", "sparkplug-parse"),
        ("spBv1.0/lab/DDATA/cam-1/pipeline", "dd:inference/sketch=accuracy", "bad-field"),
        ("spBv1.0/lab/DDATA/cam-1/pipeline", "pickle", "sparkplug-parse"),
        ("edgekit/v1/lab/cam-1/telemetry", "pickle", "malformed-json"),
        ("spBv1.0/lab/DDATA/cam-1/other", b"", "topic"),
        ("spBv1.0/lab/NBIRTH/cam-1/pipeline", b"", "topic"),
        ("spBv1.0/lab/DDATA/cam+1/pipeline", b"", "bad-id"),
        ("spBv1.0/l..b/NBIRTH/cam-1", b"", "bad-id"),
        ("spBv1.0/lab/DDATA/cam-1/pipeline", b"\x00" * (MAX_PAYLOAD + 1), "oversized"),
        ("spBv1.0/lab/DBIRTH/cam-1/pipeline", "sp:Properties/budget_ms=nan", "sparkplug-parse"),
        ("spBv1.0/lab/DBIRTH/cam-1/pipeline", "sp:Properties/a/b/c=str", "sparkplug-parse"),
    ],
)
def test_bad_sparkplug_is_counted_and_the_collector_stays_up(
    topic: str, payload: bytes | str, reason: str, tmp_path: Path
) -> None:
    import pickle

    if payload == "pickle":
        payload = pickle.dumps(Boom())
    elif isinstance(payload, str):
        kind, _, spec = payload.partition(":")
        name, _, how = spec.partition("=")
        value: Any = {"str": "7", "float": 5.0, "nan": float("nan"), "drop": ..., "notjson": "{not json"}.get(
            how
        )
        if how == "accuracy":
            value = json.dumps(sketch(accuracy=0.05))
        payload = sp_payload(**{name: value}) if kind == "sp" else ddata(tmp_path, **{name: value})
    c = Collector(FleetStore())
    assert c.handle(topic, payload) == f"rejected:{reason}"
    assert c.rejected == {reason: 1} and not Boom.ran
    good = SparkplugDevice("cam-1", tmp_path / "good")
    for t, p in good.births():
        assert c.handle(t, p) == "sparkplug-birth"
    assert c.handle(good.topic, good.window_of(np.full(10, 12.0))) == "telemetry"  # still up
    assert c.store.device("lab", "cam-1")["state"] == "online"


def test_sparkplug_commands_and_host_state_are_not_the_collectors_business() -> None:
    c = Collector(FleetStore())
    for topic in ("spBv1.0/lab/NCMD/cam-1", "spBv1.0/lab/DCMD/cam-1/pipeline", "spBv1.0/STATE/scada"):
        assert c.handle(topic, b"\x01\x02") == "sparkplug-ignored"
    assert not c.rejected and c.store.devices() == []


def test_the_deploy_channel_is_counted_not_rejected() -> None:
    collector = Collector(FleetStore())
    for topic in ("edgekit/v1/f/cam-1/agent", "edgekit/v1/f/cam-1/cmd", "edgekit/v1/f/cam-1/cmd/result"):
        assert collector.handle(topic, b'{"schema": "edgekit/v1/cmd"}') == "deploy"
    assert collector.handle("edgekit/v1/f/cam-1/cmd/other", b"{}") == "rejected:topic"
    assert collector.handle("edgekit/v1/f/a..b/cmd", b"{}") == "rejected:bad-id"
    assert collector.seen["deploy"] == 3 and sum(collector.rejected.values()) == 2


def test_a_camera_secret_in_a_birth_is_never_stored_or_shown(tmp_path: Path) -> None:
    """An old device (before source redaction) sends its camera URL with a password and token."""
    rec = Recorder()
    c = Collector(FleetStore(), batch_size=10, listener=rec)
    dev = FakeDevice("cam-old", tmp_path)
    source = "rtspsrc location=rtsp://admin:hunter2@10.0.0.5/live user-pw=hunter2 ! appsink"
    assert c.handle(dev.status, status_body("cam-old", "online", source=source)) == "status"
    shown = rec.statuses[0][3]["source"]
    stored = json.dumps(c.store.devices())
    assert "hunter2" not in shown and "hunter2" not in stored and "10.0.0.5" in shown


def test_collectors_sharing_a_stream_record_no_gaps_but_the_store_knows_what_is_missing(
    tmp_path: Path,
) -> None:
    """Two collectors of one shared-subscription group take every other window each: neither mistakes the
    other's share for a loss, and together they store every window once; a window neither got is missing."""
    store = FleetStore(tmp_path / "fleet.db")
    members = [Collector(store, shared=True), Collector(FleetStore(tmp_path / "fleet.db"), shared=True)]
    dev = FakeDevice("cam-s", tmp_path)
    sent = [dev.window_of(np.full(10, 12.0)) for _ in range(12)]
    for i, body in enumerate(sent):
        if i != 9:  # lost before the broker: nobody gets it
            assert members[i % 2].handle(dev.topic, body) == "telemetry"
    assert store.gaps("lab", "cam-s") == [] and all(m.seen["gaps"] == 0 for m in members)
    assert store.seqs("lab", "cam-s") == [s for s in range(12) if s != 9]
    assert members[0].open_gaps("lab", "cam-s") == [(9, 9)]


def test_while_the_store_cannot_take_writes_nothing_is_acknowledged_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    """Another process holds the SQLite database's write lock past the store's 5 s busy wait (a real
    'database is locked', as a PostgreSQL that went away gives a real connection error): the collector
    stores nothing and acknowledges nothing, and once the lock goes every window is stored, once."""
    import sqlite3
    import threading

    from edgekit.fleet.collector import StoreUnavailable
    from edgekit.fleet.mqtt import FleetSubscriber

    broker = Mosquitto(tmp_path).start()
    db = tmp_path / "fleet.db"
    collector = Collector(FleetStore(db), batch_size=200)
    sub = FleetSubscriber(
        BrokerConfig.from_url(broker.url),
        collector.handle,
        client_id="collector-locked",
        commit=collector.flush,
        retry_on=(StoreUnavailable,),
    ).start()
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    dev = FakeDevice("cam-x", tmp_path)
    pub = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="cam-x")
    pub.connect("127.0.0.1", broker.port)
    pub.loop_start()
    try:
        holder.execute("BEGIN EXCLUSIVE")
        released = threading.Timer(7.0, lambda: holder.execute("COMMIT"))
        released.start()
        infos = [pub.publish(dev.topic, dev.window_of(np.full(10, 12.0)), qos=1) for _ in range(30)]
        for info in infos:
            info.wait_for_publish(10)
        released.join()
        deadline = time.monotonic() + 60
        while len(collector.store.seqs("lab", "cam-x")) < 30 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert collector.store.seqs("lab", "cam-x") == list(range(30))  # every one, each once (the key)
        assert sub.unacknowledged >= 1, "the lock was never met: the test tested nothing"
        assert collector.seen["store-unavailable"] >= 1 and "store-error" not in collector.rejected
    finally:
        pub.loop_stop()
        pub.disconnect()
        sub.stop()
        holder.close()
        collector.store.close()
        broker.stop()
