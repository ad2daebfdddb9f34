"""Telemetry over MQTT against a real Mosquitto: payloads, the spool through a broker outage, the Will."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

import edgekit
from edgekit.core.sketch import LatencySketch
from edgekit.errors import TelemetryError
from edgekit.pipeline.sinks import sink
from edgekit.telemetry import BrokerConfig, Spool, TelemetryPublisher, report
from edgekit.testing.mosquitto import Mosquitto, secure_mosquitto

from conftest import EDGEKIT


def validator(name: str) -> Any:
    """The published schema ``name`` (generated from the message models: each file stands alone)."""
    import jsonschema

    from edgekit.protocol.schemas import SCHEMA_DIR

    return jsonschema.Draft202012Validator(json.loads((SCHEMA_DIR / name).read_text()))


class Subscriber:
    """A real MQTT client collecting what arrives (persistent session: survives a broker restart)."""

    def __init__(
        self,
        port: int,
        topic: str = "edgekit/v1/#",
        client_id: str = "test-subscriber",
        user: tuple[str, str] | None = None,
        ca_file: Path | None = None,
    ) -> None:
        self.messages: list[tuple[str, dict[str, Any], bool]] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False
        )
        if user is not None:
            self.client.username_pw_set(*user)
        if ca_file is not None:
            self.client.tls_set(ca_certs=str(ca_file))
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.2, 1)
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        try:
            body = json.loads(msg.payload)
        except ValueError:
            body = {"raw": msg.payload.decode(errors="replace")}
        with self.lock:
            self.messages.append((msg.topic, body, bool(msg.retain)))

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


def stop_when(p: edgekit.Pipeline, done: Callable[[], bool], timeout: float = 120.0) -> threading.Thread:
    """Stop ``p`` once ``done()`` holds (or after ``timeout`` s), checked from a thread of its own.

    A run lasts until what the test must see has happened, however fast or busy this machine
    is, rather than a set number of seconds in which it is hoped to happen.
    """

    def watch() -> None:
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and not done():
                time.sleep(0.05)
        finally:
            p.stop()

    t = threading.Thread(target=watch, name="stop-when", daemon=True)
    t.start()
    return t


def wait_until(done: Callable[[], bool], timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


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
    fresh = Spool(tmp_path / "bad.db")  # set aside (tests/test_telemetry_loss.py), never a reason to stop
    assert len(fresh) == 0 and fresh.set_aside == 1 and list(tmp_path.glob("bad.db.corrupt-*"))
    fresh.close()


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
    deadline = time.monotonic() + 20
    while "SUBSCRIBE" not in broker.log.read_text() and time.monotonic() < deadline:  # mosquitto_sub is in
        time.sleep(0.05)
    with edgekit.Pipeline(model, "synthetic:160x120@30") as p:
        publisher = report(p, broker.url, device_id="cam-a", fleet="lab", interval_s=0.5)
        stop_when(p, lambda: publisher.acked >= 5 and p.counters.frames >= 10)
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
            # The phases are counted in frames and messages, not in seconds this machine may need:
            # 30 frames with the broker up, then the outage, then on until the spooled backlog has
            # reached the subscriber through the restarted broker.
            try:
                wait_until(lambda: len(records) >= 30)
                outage.append(time.time())
                broker.kill()
                time.sleep(seconds)
                broker.start()
                outage.append(time.time())
                backlog = publisher.last_seq
                wait_until(lambda: {m["seq"] for m in sub.of("telemetry")} >= set(range(backlog + 1)))
            finally:
                p.stop()

        # (duration_s is only a safety net: the killer thread stops the run.)
        with edgekit.Pipeline(model, "synthetic:160x120@30", duration_s=600.0) as p:
            p.add_sink(sink("records", lambda r: records.append(r.record)))
            publisher = report(
                p, broker.url, device_id="cam-b", fleet="lab", interval_s=0.5, spool=tmp_path / "s.db"
            )
            killer = threading.Thread(target=outage_of, args=(20.0,))
            killer.start()
            p.run()
            killer.join()
        assert p.ended_by == "stop" and len(outage) == 2
        sent = publisher.last_seq + 1  # the last window is sent when the pipeline closes
        assert sub.wait_for(lambda: {m["seq"] for m in sub.of("telemetry")} >= set(range(sent)), 30)
        seqs = [m["seq"] for m in sub.of("telemetry")]
        unique = list(dict.fromkeys(seqs))  # de-duplicated, first arrival order
        assert unique == list(range(sent)), f"missing or out of order: {unique}"
        assert publisher.disconnects >= 1 and publisher.spool.dropped == 0
        during = sorted(r.latency_ms for r in records if outage[0] <= r.captured_at <= outage[1])
        before = sorted(r.latency_ms for r in records if r.captured_at < outage[0])
        assert len(before) >= 30 and len(during) >= 30
        # The frame loop never waits on the broker: with the broker down, frames come at the rate
        # they came before (whatever that is here) and take the same time (loose bounds).
        before_s = outage[0] - records[0].captured_at
        during_s = outage[1] - outage[0]
        assert len(during) / during_s > 0.5 * len(before) / before_s
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
    from edgekit.testing.mosquitto import free_port

    with edgekit.Pipeline(model, "synthetic:160x120@30", frames=40) as p:
        publisher = report(p, f"mqtt://127.0.0.1:{free_port()}", device_id="cam-d", interval_s=0.2)
        summary = p.run()
        pending = len(publisher.spool)
    assert summary.frames == 40 and pending >= 1 and not publisher.connected


@pytest.fixture
def secure_broker(tmp_path: Path) -> Any:
    """Mosquitto with TLS (a CA made here), a password file and the per-device ACL."""
    b, ca_file = secure_mosquitto(
        tmp_path,
        {"cam-1": "pw-1", "cam-2": "pw-2", "watcher": "pw-w"},
        "user watcher\ntopic read edgekit/v1/#\n\npattern readwrite edgekit/v1/+/%c/#\n",
    )
    yield b, ca_file
    b.stop()


def test_tls_passwords_and_the_acl_keep_each_device_in_its_own_topics(model: Any, secure_broker: Any) -> None:
    broker, ca_file = secure_broker
    url = f"mqtts://{{}}@127.0.0.1:{broker.port}"
    watcher = Subscriber(broker.port, client_id="watcher", user=("watcher", "pw-w"), ca_file=ca_file)
    try:
        with edgekit.Pipeline(model, "synthetic:160x120@30") as p:
            report(
                p, url.format("cam-1:pw-1"), device_id="cam-1", fleet="lab", interval_s=0.5, ca_file=ca_file
            )
            stop_when(p, lambda: len(watcher.of("telemetry")) >= 3)
            p.run()
        assert watcher.wait_for(lambda: len(watcher.of("telemetry")) >= 3, 10)
        assert {m["device"] for m in watcher.of("telemetry")} == {"cam-1"}
        # cam-2 may write under its own id and nowhere else.
        rogue = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="cam-2")
        rogue.username_pw_set("cam-2", "pw-2")
        rogue.tls_set(ca_certs=str(ca_file))
        rogue.connect("127.0.0.1", broker.port)
        rogue.loop_start()
        rogue.publish("edgekit/v1/lab/cam-1/telemetry", b'{"spoofed": true}', qos=1).wait_for_publish(5)
        rogue.publish("edgekit/v1/lab/cam-2/telemetry", b'{"own": true}', qos=1).wait_for_publish(5)
        assert watcher.wait_for(lambda: any(m.get("own") for m in watcher.of("telemetry")), 10)
        time.sleep(0.5)
        assert not any(m.get("spoofed") for m in watcher.of("telemetry"))
        rogue.disconnect()
        rogue.loop_stop()
    finally:
        watcher.close()
    # A wrong password: refused with a clear error, and the frames keep coming.
    with edgekit.Pipeline(model, "synthetic:160x120@30", frames=45) as p:
        publisher = report(
            p, url.format("cam-1:wrong"), device_id="cam-1", fleet="lab", interval_s=0.3, ca_file=ca_file
        )
        summary = p.run()
        error = publisher.last_error
    assert summary.frames == 45 and not publisher.connected
    assert "refused the connection" in error and "cam-1@127.0.0.1" in error
    with pytest.raises(TelemetryError, match="CA file"):
        BrokerConfig.from_url(url.format("cam-1:pw-1"), ca_file=Path("/no/such/ca.pem"))


def test_mqtt_5_works_the_same(model: Any, broker: Mosquitto) -> None:
    sub = Subscriber(broker.port, client_id="v5-watch")
    try:
        with edgekit.Pipeline(model, "synthetic:160x120@30") as p:
            publisher = report(p, broker.url, device_id="cam-v5", interval_s=0.3, protocol="5")
            stop_when(p, lambda: publisher.acked >= 3 and len(sub.of("telemetry")) >= 3)
            p.run()
        assert publisher.acked >= 3
        assert sub.wait_for(lambda: len(sub.of("telemetry")) >= 3, 10)
        assert sub.of("status")[0]["state"] == "online"
    finally:
        sub.close()


def test_telemetry_tail_shows_devices_and_skips_garbage(
    model: Any, broker: Mosquitto, cache_env: dict[str, str]
) -> None:
    tail = subprocess.Popen(
        [*EDGEKIT, "telemetry", "tail", "--mqtt", broker.url, "--fleet", "lab", "--json", "--duration", "8"],
        env=cache_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # The tail is subscribed (however long its start took here) before anything is published.
    assert wait_until(lambda: "SUBSCRIBE" in broker.log.read_text(), 60)
    junk = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2)
    junk.connect("127.0.0.1", broker.port)
    junk.loop_start()
    junk.publish("edgekit/v1/lab/evil/telemetry", b"__import__('os').system('true')", qos=1).wait_for_publish(
        5
    )
    junk.disconnect()
    junk.loop_stop()
    with edgekit.Pipeline(model, "synthetic:160x120@30", duration_s=2.0) as p:
        report(p, broker.url, device_id="cam-t", fleet="lab", interval_s=0.4)
        p.run()
    out, err = tail.communicate(timeout=30)
    assert tail.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    topics = {line["topic"] for line in lines}
    assert {"edgekit/v1/lab/cam-t/status", "edgekit/v1/lab/cam-t/telemetry"} <= topics
    assert "edgekit/v1/lab/evil/telemetry" not in topics and "messages from 1 device" in err
    plain = subprocess.run(
        [*EDGEKIT, "telemetry", "tail", "--mqtt", broker.url, "--duration", "1.5"],
        env=cache_env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    # Piped: one plain line per device; the retained status says the device went offline.
    assert plain.returncode == 0 and "device=lab/cam-t state=offline" in plain.stdout, plain.stdout
    bad = subprocess.run(
        [*EDGEKIT, "telemetry", "tail", "--mqtt", "http://nope"],
        env=cache_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "not an MQTT broker URL" in bad.stderr and "Traceback" not in bad.stderr


class RawSubscriber(Subscriber):
    """Keeps payload bytes (Sparkplug payloads are protobuf)."""

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.lock:
            self.messages.append((msg.topic, {"raw": bytes(msg.payload)}, bool(msg.retain)))

    def sparkplug(self) -> list[tuple[str, dict[str, Any]]]:
        from edgekit.protocol.sparkplug import decode

        with self.lock:
            # What the node published (the commands sent to it are on NCMD).
            return [(t.split("/")[2], decode(m["raw"])) for t, m, _ in self.messages if "/NCMD/" not in t]


def test_sparkplug_births_data_rebirth_and_death(model: Any, broker: Mosquitto) -> None:
    from edgekit.protocol import sparkplug as sp

    sub = RawSubscriber(broker.port, "spBv1.0/#", client_id="scada")
    try:
        with edgekit.Pipeline(model, "synthetic:160x120@30") as p:
            report(p, broker.url, device_id="cam-s", fleet="plant", interval_s=0.4, format="sparkplug")
            assert sub.wait_for(lambda: any(k == "DDATA" for k, _ in sub.sparkplug()), 10)
            # The host application asks for a rebirth.
            cmd = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2)
            cmd.connect("127.0.0.1", broker.port)
            cmd.loop_start()
            cmd.publish(
                "spBv1.0/plant/NCMD/cam-s", sp.encode({sp.REBIRTH: True}, None), qos=0
            ).wait_for_publish(5)
            cmd.publish("spBv1.0/plant/NCMD/cam-s", b"\xff\xff not protobuf", qos=0).wait_for_publish(5)
            cmd.disconnect()
            cmd.loop_stop()

            def seen_enough() -> bool:
                msgs = sub.sparkplug()
                data = [m for k, m in msgs if k == "DDATA" and m["metrics"]["window/frames"] > 0]
                return [k for k, _ in msgs].count("NBIRTH") >= 2 and len(data) >= 5

            # On until the rebirth and five windows with frames were seen, however long that takes here.
            stop_when(p, seen_enough)
            p.run()
        assert sub.wait_for(lambda: sub.sparkplug()[-1][0] == "NDEATH", 10)
    finally:
        sub.close()
    msgs = sub.sparkplug()
    kinds = [k for k, _ in msgs]
    assert kinds[:2] == ["NBIRTH", "DBIRTH"] and kinds.count("NBIRTH") >= 2 and kinds[-1] == "NDEATH"
    births = [m for k, m in msgs if k == "NBIRTH"]
    bdseq = births[0]["metrics"]["bdSeq"]
    assert all(
        b["seq"] == 0 and b["metrics"]["bdSeq"] == bdseq for b in births
    )  # a rebirth keeps the session
    assert births[0]["metrics"][sp.REBIRTH] is False
    assert msgs[-1][1]["metrics"] == {"bdSeq": bdseq} and msgs[-1][1]["seq"] is None
    # seq runs on over every message after each NBIRTH.
    expected = 0
    for kind, m in msgs[:-1]:
        expected = 0 if kind == "NBIRTH" else (expected + 1) % 256
        assert m["seq"] == expected, (kind, m["seq"], expected)
    dbirth = next(m for k, m in msgs if k == "DBIRTH")["metrics"]
    assert (
        dbirth["Properties/model/name"] == "efficientnet-lite0"
        and dbirth["Properties/backend"] == "onnxruntime"
    )
    ddata = [m for k, m in msgs if k == "DDATA"]
    assert len(ddata) >= 5
    for d in ddata:
        assert set(d["metrics"]) <= set(dbirth)  # every DDATA metric was declared at birth
    frames = sum(d["metrics"]["window/frames"] for d in ddata)
    assert frames == ddata[-1]["metrics"]["counters/frames"] > 0
    # A window's percentiles are of its own frames: positive when it had frames, NaN (a Double, as
    # DBIRTH declared) when it had none, e.g. the last one sent at close right after a timed one.
    assert sum(d["metrics"]["window/frames"] > 0 for d in ddata) >= 5
    for d in ddata:
        p50 = d["metrics"]["latency/p50_ms"]
        assert p50 > 0 if d["metrics"]["window/frames"] > 0 else math.isnan(p50), d["metrics"]


def test_a_killed_sparkplug_node_dies_through_its_will(
    x86_bundle: tuple[Path, dict[str, Any]], broker: Mosquitto, cache_env: dict[str, str]
) -> None:
    sub = RawSubscriber(broker.port, "spBv1.0/plant/+/cam-k/#", client_id="scada-k")
    device = subprocess.Popen(
        [*EDGEKIT, "run", str(x86_bundle[0]), "--source", "synthetic:160x120@30", "--device", "x86_64-cpu",
         "--mqtt", broker.url, "--fleet", "plant", "--device-id", "cam-k", "--telemetry-interval", "0.5",
         "--telemetry-format", "sparkplug"],
        env=cache_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert sub.wait_for(lambda: any(k == "DDATA" for k, _ in sub.sparkplug()), 60)
        device.send_signal(signal.SIGKILL)
        device.wait(10)
        assert sub.wait_for(lambda: sub.sparkplug()[-1][0] == "NDEATH", 20)
    finally:
        if device.poll() is None:
            device.kill()
        sub.close()
    msgs = sub.sparkplug()
    birth = next(m for k, m in msgs if k == "NBIRTH")
    assert msgs[-1][1]["metrics"]["bdSeq"] == birth["metrics"]["bdSeq"]  # the Will of the session that died


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_gauges_read_what_raspberry_pi_and_jetson_expose(tmp_path: Path) -> None:
    from edgekit.telemetry.gauges import Gauges

    # The files as a Raspberry Pi 5 and a Jetson Orin expose them (this host has neither).
    pi, jetson, proc = tmp_path / "pi", tmp_path / "jetson", tmp_path / "proc"
    put(proc, "stat", "cpu  100 0 100 800 0 0 0 0 0 0\n")
    put(proc, "meminfo", "MemTotal:        8000000 kB\nMemFree: 1 kB\nMemAvailable:    6000000 kB\n")
    put(pi, "class/thermal/thermal_zone0/type", "cpu-thermal\n")
    put(pi, "class/thermal/thermal_zone0/temp", "61250\n")
    put(pi, "devices/platform/soc/soc:firmware/get_throttled", "0x50005\n")
    put(pi, "devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", "1500000\n")
    put(pi, "devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "2400000\n")
    g = Gauges(sys_root=pi, proc_root=proc)
    put(proc, "stat", "cpu  200 0 200 900 0 0 0 0 0 0\n")  # 200 busy of 300 since the first read
    got = g.read()
    assert got["cpu_percent"] == pytest.approx(66.7, abs=0.1)
    assert got["memory_total_mb"] == 7812 and got["memory_available_mb"] == 5859
    assert got["temperature_c"] == {"cpu-thermal": pytest.approx(61.25, abs=0.05)}
    assert got["throttled"] == {"now": True, "since_boot": True, "under_voltage": True, "raw": 0x50005}
    assert got["cpu_freq_ratio"] == 0.625
    for i, (kind, milli) in enumerate(
        (("CPU-therm", "48500"), ("GPU-therm", "47000"), ("tj-therm", "49000"))
    ):
        put(jetson, f"class/thermal/thermal_zone{i}/type", kind)
        put(jetson, f"class/thermal/thermal_zone{i}/temp", milli)
    put(jetson, "devices/platform/17000000.ga10b/load", "734\n")
    got = Gauges(sys_root=jetson, proc_root=proc).read()
    assert got["temperature_c"] == {"CPU-therm": 48.5, "GPU-therm": 47.0, "tj-therm": 49.0}
    assert got["gpu_percent"] == 73.4 and "throttled" not in got  # absent paths leave their gauge out


def test_names_and_credentials_that_must_not_reach_the_broker() -> None:
    from edgekit.core.redact import redact_source

    for bad in ("cam 1", "a/b", "cam+", ".hidden", "x" * 129, "a..b"):
        with pytest.raises(TelemetryError, match="cannot be part of an MQTT topic"):
            TelemetryPublisher(BrokerConfig.from_url("mqtt://127.0.0.1:1"), device_id=bad, spool=":memory:")
    assert redact_source("rtsp://admin:hunter2@10.0.0.9:554/s1") == "rtsp://admin:***@10.0.0.9:554/s1"
    assert redact_source("synthetic:640x480@30") == "synthetic:640x480@30"


def test_a_classifiers_labels_topic_and_telemetry_are_as_before_through_the_result_sink(
    model: Any, broker: Mosquitto
) -> None:
    sub = subprocess.Popen(
        ["mosquitto_sub", "-p", str(broker.port), "-h", "127.0.0.1", "-t", "edgekit/v1/#", "-v", "-q", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while "SUBSCRIBE" not in broker.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    with edgekit.Pipeline(model, "synthetic:160x120@30") as p:
        publisher = report(
            p, broker.url, device_id="cam-l", fleet="lab", interval_s=0.5, labels_interval_s=0.0
        )
        stop_when(p, lambda: publisher.acked >= 2 and p.counters.frames >= 10)
        p.run()
    time.sleep(0.5)
    sub.send_signal(signal.SIGTERM)
    out = sub.communicate(timeout=5)[0]
    lines = [line.split(" ", 1) for line in out.splitlines() if line.startswith("edgekit/v1/lab/cam-l/")]
    labels = [json.loads(body) for t, body in lines if t.endswith("/labels")]
    telemetry = [json.loads(body) for t, body in lines if t.endswith("/telemetry")]
    assert labels and telemetry
    for m in labels:
        validator("labels.schema.json").validate(m)
        assert set(m) == {"schema", "device", "ts", "labels"} and m["labels"]  # a classifier's top labels
        assert m["labels"][0]["name"] in model.labels
    assert all("detections" not in m["window"] for m in telemetry)
