"""Telemetry over MQTT against a real Mosquitto: payloads, the spool through a broker outage, the Will."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from broker import Mosquitto
from paho.mqtt.enums import CallbackAPIVersion

import edgekit
from edgekit.errors import TelemetryError
from edgekit.sketch import LatencySketch
from edgekit.telemetry import BrokerConfig, Spool

from conftest import EDGEKIT, ROOT

SCHEMAS = ROOT / "edgekit" / "telemetry" / "schema"


def validator(name: str) -> Any:
    import jsonschema
    from referencing import Registry, Resource

    docs = {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}
    registry = Registry().with_resources(
        [(d["$id"], Resource.from_contents(d)) for d in docs.values()]
        + [(n, Resource.from_contents(d)) for n, d in docs.items()]
    )
    return jsonschema.Draft202012Validator(docs[name], registry=registry)


class Subscriber:
    """A real MQTT client collecting what arrives (persistent session: survives a broker restart)."""

    def __init__(self, port: int, topic: str = "edgekit/v1/#", client_id: str = "test-subscriber") -> None:
        self.messages: list[tuple[str, dict[str, Any], bool]] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False
        )
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.2, 1)
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.lock:
            self.messages.append((msg.topic, json.loads(msg.payload), bool(msg.retain)))

    def of(self, leaf: str) -> list[dict[str, Any]]:
        with self.lock:
            return [m for t, m, _ in self.messages if t.endswith("/" + leaf)]

    def wait_for(self, cond: Any, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    b = Mosquitto(tmp_path).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def model(x86_bundle: tuple[Path, dict[str, Any]]) -> Any:
    with edgekit.load(x86_bundle[0], device="x86_64-cpu") as m:
        yield m


def test_spool_keeps_order_drops_the_oldest_at_its_bound_and_counts_it(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    spool = Spool(path, max_bytes=1000)
    ids = [spool.push("t", bytes([i]) * 300) for i in range(5)]  # 1500 bytes into 1000
    assert [m.payload[0] for m in spool.pending()] == [2, 3, 4] and spool.dropped == 2
    spool.ack(ids[2])
    assert [m.id for m in spool.pending()] == ids[3:] and spool.bytes == 600
    assert [spool.next_sequence() for _ in range(3)] == [0, 1, 2]
    spool.close()
    again = Spool(path, max_bytes=1000)  # a restarted process keeps the queue, the count and the sequence
    assert [m.id for m in again.pending()] == ids[3:] and again.dropped == 2 and again.next_sequence() == 3
    again.close()
    (tmp_path / "bad.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(TelemetryError, match="not a usable SQLite"):
        Spool(tmp_path / "bad.db")


def test_broker_urls() -> None:
    b = BrokerConfig.from_url("mqtts://cam%2D1:s3cret@broker.local")
    assert (b.host, b.port, b.tls, b.username, b.password) == ("broker.local", 8883, True, "cam-1", "s3cret")
    assert BrokerConfig.from_url("mqtt://10.0.0.2").port == 1883
    for bad in ("http://x", "mqtt://", "mqtt://h:port"):
        with pytest.raises(TelemetryError) as err:
            BrokerConfig.from_url(bad)
        assert err.value.hint


def test_payloads_follow_the_schema_and_mosquitto_sub_sees_them(model: Any, broker: Mosquitto) -> None:
    sub = subprocess.Popen(
        ["mosquitto_sub", "-p", str(broker.port), "-h", "127.0.0.1", "-t", "edgekit/v1/#", "-v", "-q", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    with edgekit.Pipeline(model, "synthetic:160x120@30", duration_s=3.0) as p:
        publisher = p.report(broker.url, device_id="cam-a", fleet="lab", interval_s=0.5)
        p.run()
    assert publisher.acked >= 5
    time.sleep(0.5)
    sub.send_signal(signal.SIGTERM)
    out = sub.communicate(timeout=5)[0]
    lines = [line.split(" ", 1) for line in out.splitlines() if line.startswith("edgekit/v1/lab/cam-a/")]
    telemetry = [json.loads(body) for t, body in lines if t.endswith("/telemetry")]
    status = [json.loads(body) for t, body in lines if t.endswith("/status")]
    assert len(telemetry) >= 5 and [m["seq"] for m in telemetry] == list(range(len(telemetry)))
    for m in telemetry:
        validator("telemetry.schema.json").validate(m)
    for m in status:
        validator("status.schema.json").validate(m)
    assert status[0]["state"] == "online" and status[-1]["state"] == "offline"
    birth = status[0]
    assert birth["model"]["name"] == "efficientnet-lite0" and birth["backend"] == "onnxruntime"
    assert (
        birth["precision"] == "fp32"
        and birth["budget_ms"] == pytest.approx(33.3)
        and birth["profile"] == "x86_64-cpu"
    )
    total = sum(m["window"]["frames"] for m in telemetry)
    assert total == telemetry[-1]["counters"]["frames"] == p.counters.frames  # every frame reported once
    merged = LatencySketch()
    for m in telemetry:
        merged.merge(LatencySketch.from_dict(m["window"]["latency_ms"]))
    assert merged.count == total and merged.quantile(0.5) == pytest.approx(p.stats.latency.quantile(0.5))


def test_a_broker_outage_loses_no_telemetry_and_does_not_slow_frames(
    model: Any, broker: Mosquitto, tmp_path: Path
) -> None:
    sub = Subscriber(broker.port, "edgekit/v1/lab/cam-b/telemetry")
    try:
        records: list[edgekit.FrameRecord] = []
        outage: list[float] = []

        def outage_of(seconds: float) -> None:
            time.sleep(3.0)
            outage.append(time.time())
            broker.kill()
            time.sleep(seconds)
            broker.start()
            outage.append(time.time())

        with edgekit.Pipeline(model, "synthetic:160x120@30", duration_s=30.0) as p:
            p.add_observer(records.append)
            publisher = p.report(
                broker.url, device_id="cam-b", fleet="lab", interval_s=0.5, spool=tmp_path / "s.db"
            )
            killer = threading.Thread(target=outage_of, args=(20.0,))
            killer.start()
            p.run()
            killer.join()
        sent = publisher.last_seq + 1  # the last window is sent when the pipeline closes
        assert sub.wait_for(lambda: {m["seq"] for m in sub.of("telemetry")} >= set(range(sent)), 30)
        seqs = [m["seq"] for m in sub.of("telemetry")]
        unique = list(dict.fromkeys(seqs))  # de-duplicated, first arrival order
        assert unique == list(range(sent)), f"missing or out of order: {unique}"
        assert publisher.disconnects >= 1 and publisher.spool.dropped == 0
        during = sorted(r.latency_ms for r in records if outage[0] <= r.captured_at <= outage[1])
        before = sorted(r.latency_ms for r in records if r.captured_at < outage[0])
        assert len(during) > 300 and len(before) > 30
        # The frame loop never waits on the broker: the same latency with the broker down (loose bound).
        assert during[len(during) // 2] < 2 * before[len(before) // 2] + 5
    finally:
        sub.close()


def test_a_killed_device_goes_offline_through_its_will(
    x86_bundle: tuple[Path, dict[str, Any]], broker: Mosquitto, cache_env: dict[str, str]
) -> None:
    sub = Subscriber(broker.port, "edgekit/v1/lab/cam-c/status", client_id="status-watch")
    device = subprocess.Popen(
        [*EDGEKIT, "run", str(x86_bundle[0]), "--source", "synthetic:160x120@30", "--device", "x86_64-cpu",
         "--mqtt", broker.url, "--fleet", "lab", "--device-id", "cam-c", "--telemetry-interval", "0.5"],
        env=cache_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert sub.wait_for(lambda: any(m["state"] == "online" for m in sub.of("status")), 60)
        device.send_signal(signal.SIGKILL)
        device.wait(10)
        assert sub.wait_for(lambda: sub.of("status")[-1]["state"] == "offline", 20)
        validator("status.schema.json").validate(sub.of("status")[-1])
    finally:
        if device.poll() is None:
            device.kill()
        sub.close()
    # A new subscriber gets the retained status: offline.
    late = Subscriber(broker.port, "edgekit/v1/lab/cam-c/status", client_id="late")
    try:
        assert late.wait_for(lambda: bool(late.of("status")), 10)
        assert late.of("status")[-1]["state"] == "offline"
    finally:
        late.close()


def test_no_broker_at_all_leaves_the_pipeline_running(model: Any, tmp_path: Path) -> None:
    from broker import free_port

    with edgekit.Pipeline(model, "synthetic:160x120@30", frames=40) as p:
        publisher = p.report(f"mqtt://127.0.0.1:{free_port()}", device_id="cam-d", interval_s=0.2)
        summary = p.run()
        pending = len(publisher.spool)
    assert summary.frames == 40 and pending >= 1 and not publisher.connected
