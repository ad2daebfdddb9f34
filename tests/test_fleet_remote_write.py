"""The fleet's remote write: a week of windows through the collector lands in a real VictoriaMetrics at the
windows' own times, its fleet p95 agrees with the store's merged sketch, and a database that is away
slows nothing and drops what it must, counted."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.core.sketch import LatencySketch
from edgekit.errors import EdgekitError
from edgekit.fleet import Collector, FleetStore
from edgekit.fleet.prometheus import FRAME_BUCKETS
from edgekit.fleet.remote_write import (
    SERIES_PER_CAMERA,
    SERIES_PER_DEVICE,
    RemoteWriter,
    encode_write_request,
    fleet_series,
    snappy_literals,
    write_url,
)
from edgekit.protocol.stages import STAGES
from edgekit.testing.mosquitto import Mosquitto, free_port
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT

VM = shutil.which("victoria-metrics")
needs_vm = pytest.mark.skipif(
    VM is None,
    reason="victoria-metrics is not installed (apt-get install victoria-metrics; tools/setup.sh does)",
)
DAY = 86_400.0
WINDOW_S = 600.0  # ten-minute windows keep a week's test small: 1,008 per device


@pytest.fixture
def victoria(tmp_path: Path) -> Iterator[str]:
    """VictoriaMetrics on a loopback port with its own storage; its base URL."""
    assert VM is not None
    port = free_port()
    with (tmp_path / "vm.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                VM,
                f"-storageDataPath={tmp_path / 'vm'}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=1y",
                "-search.latencyOffset=0s",  # the newest samples are queried too
                "-search.disableCache",
                "-loggerLevel=ERROR",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.read().strip() == b"OK":
                        break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(
                        f"victoria-metrics did not start: {(tmp_path / 'vm.log').read_text()[-2000:]}"
                    )
                time.sleep(0.1)
        yield url
    finally:
        stop_process(proc)


def query(base: str, expr: str, at: float) -> list[dict[str, Any]]:
    args = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{base}/api/v1/query?{args}", timeout=30) as r:
        data = json.loads(r.read())
    assert data["status"] == "success", data
    return list(data["data"]["result"])


def series_count(base: str, match: str, start: float, end: float) -> int:
    args = urllib.parse.urlencode({"match[]": match, "start": f"{start:.0f}", "end": f"{end:.0f}"})
    with urllib.request.urlopen(f"{base}/api/v1/series?{args}", timeout=30) as r:
        return len(json.loads(r.read())["data"])


def sketch(values: np.ndarray) -> dict[str, Any]:
    s = LatencySketch()
    s.extend(values.tolist())
    return s.to_dict()


def telemetry(device: str, seq: int, start: float, latencies: np.ndarray, cameras: int = 0) -> bytes:
    empty = LatencySketch().to_dict()
    window: dict[str, Any] = {
        "start": start,
        "end": start + WINDOW_S,
        "frames": int(latencies.size),
        "missed": int((latencies > 33.3).sum()),
        "latency_ms": sketch(latencies),
        "stages_ms": dict.fromkeys(STAGES, empty),
    }
    if cameras:
        parts = np.array_split(latencies, cameras)
        window["cameras"] = {
            f"cam{i}": {
                "frames": int(p.size),
                "missed": int((p > 33.3).sum()),
                "dropped": 1,
                "latency_ms": sketch(p),
            }
            for i, p in enumerate(parts)
        }
    body = {
        "schema": "edgekit/v1/telemetry",
        "device": device,
        "fleet": "lab",
        "epoch": "e1",
        "seq": seq,
        "sent_at": start + WINDOW_S,
        "window": window,
        "counters": {},
    }
    return json.dumps(body).encode()


def status(device: str, backend: str) -> bytes:
    body = {
        "schema": "edgekit/v1/status",
        "state": "online",
        "device": device,
        "backend": backend,
        "profile": "pi5",
    }
    return json.dumps(body).encode()


def wait_for(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


@needs_vm
def test_a_week_of_windows_lands_in_victoria_metrics_and_its_fleet_p95_is_the_stores(
    victoria: str, tmp_path: Path
) -> None:
    store = FleetStore(tmp_path / "fleet.db")
    writer = RemoteWriter(victoria, interval_s=0.5)
    collector = Collector(store, batch_size=200, sink=writer.start())
    rng = np.random.default_rng(37)
    end = math.floor(time.time() / WINDOW_S) * WINDOW_S - WINDOW_S
    start = end - 7 * DAY
    devices = {
        "cam-a": (2.6, 0.25, 0),
        "cam-b": (3.2, 0.4, 0),
        "cam-c": (3.0, 0.3, 2),
    }  # lognormal ms; cameras
    for name in devices:
        collector.handle(f"edgekit/v1/lab/{name}/status", status(name, "onnxruntime"), now=start)
    # A backlog of a week, as a broker hands over what it kept: device after device within each slot.
    n = int(7 * DAY / WINDOW_S)
    for i in range(n):
        for name, (mu, sigma, cameras) in devices.items():
            # Day 3 is slow on cam-b: a week's p95 moves while the first days' does not.
            slow = 1.6 if name == "cam-b" and 2 * DAY <= i * WINDOW_S < 3 * DAY else 1.0
            x = rng.lognormal(mu, sigma, 40) * slow
            topic = f"edgekit/v1/lab/{name}/telemetry"
            assert (
                collector.handle(topic, telemetry(name, i, start + i * WINDOW_S, x, cameras), now=end)
                == "telemetry"
            )
    collector.flush()
    assert wait_for(lambda: writer.stats()["queued_windows"] == 0 and writer.flush())
    stats = writer.stats()
    assert stats["windows"] == 3 * n and stats["samples_dropped"] == stats["windows_dropped"] == 0
    assert stats["windows_late"] == 0 and stats["samples_sent"] > 0

    total = store.merged(fleet="lab").count

    def landed() -> bool:  # VictoriaMetrics makes what it took searchable within a second or so
        got = query(victoria, "sum(increase(edgekit_frames_total[7d]))", end)
        return bool(got) and float(got[0]["value"][1]) == total

    assert wait_for(landed)
    week = "edgekit_fleet_frame_latency_seconds_bucket{fleet='lab'}[7d]"
    for q in (0.5, 0.95, 0.99):
        got = wait_for(
            lambda q=q: query(victoria, f"histogram_quantile({q}, sum by (le) (increase({week})))", end)
        )
        want = store.merged(fleet="lab", since=start, until=end).quantile(q)
        vm = float(got[0]["value"][1]) * 1000
        print(f"p{q * 100:g} over 7 days: VictoriaMetrics {vm:.3f} ms, store {want:.3f} ms")
        # Both are within one sketch bucket (2 %) of the true quantile; they sit in the same or the next one.
        assert abs(vm - want) / want <= 2 * 0.0202, (q, vm, want)
    # Only the first two days: the slow day 3 is not in them, and the samples sit at the windows' times.
    two = start + 2 * DAY
    early = query(
        victoria,
        "histogram_quantile(0.95, sum by (le) (increase(edgekit_fleet_frame_latency_seconds_bucket[2d])))",
        two,
    )
    want = store.merged(fleet="lab", since=start, until=two).quantile(0.95)
    assert abs(float(early[0]["value"][1]) * 1000 - want) / want <= 2 * 0.0202
    fleet_count = query(victoria, "sum(increase(edgekit_fleet_frame_latency_seconds_count[7d]))", end)
    assert float(fleet_count[0]["value"][1]) == total
    per_device = query(
        victoria, "sum by (device, backend, profile) (increase(edgekit_frames_total[1d]))", two
    )
    assert {(r["metric"]["device"], r["metric"]["backend"], r["metric"]["profile"]) for r in per_device} == {
        (d, "onnxruntime", "pi5") for d in devices
    }
    # A device's p95 on the dashboard's buckets, from VM, within a bucket of the store's.
    p95 = query(
        victoria,
        "histogram_quantile(0.95, sum by (le) (increase(edgekit_frame_latency_seconds_bucket{device='cam-a'}[7d])))",
        end,
    )
    assert 0.0125 <= float(p95[0]["value"][1]) <= 0.025

    # The series: a fixed number per device and camera, and the fleet's histogram bounded.
    assert (
        series_count(victoria, "{device='cam-a'}", start, end)
        == SERIES_PER_DEVICE
        == 3 + len(FRAME_BUCKETS) + 3
    )
    assert series_count(victoria, "{device='cam-c'}", start, end) == SERIES_PER_DEVICE + 2 * SERIES_PER_CAMERA
    fleet = series_count(victoria, "{__name__=~'edgekit_fleet_.*'}", start, end)
    assert 300 < fleet <= fleet_series()
    writer.stop()
    store.close()


@needs_vm
def test_a_database_that_is_away_drops_samples_counted_and_the_collector_goes_on(
    victoria: str, tmp_path: Path
) -> None:
    store = FleetStore(tmp_path / "fleet.db")
    # A database that hangs: the kernel takes the connection, nothing ever answers.
    hang = socket.create_server(("127.0.0.1", 0), backlog=64)
    away = f"http://127.0.0.1:{hang.getsockname()[1]}"
    writer = RemoteWriter(away, interval_s=0.1, max_pending=2_000, timeout_s=1.5).start()
    collector = Collector(store, batch_size=1, sink=writer)
    rng = np.random.default_rng(5)
    start = math.floor(time.time() / WINDOW_S) * WINDOW_S - DAY
    took = []
    for i in range(120):
        t0 = time.perf_counter()
        x = rng.lognormal(3.0, 0.3, 40)
        collector.handle("edgekit/v1/lab/cam-a/telemetry", telemetry("cam-a", i, start + i * WINDOW_S, x))
        took.append(time.perf_counter() - t0)
    assert store.merged(fleet="lab").count == 120 * 40  # every window stored
    assert wait_for(lambda: writer.stats()["push_failures"] >= 2 and writer.stats()["samples_dropped"] > 0)
    stats = collector.stats()["remote_write"]
    assert stats["samples_sent"] == 0 and stats["pending_samples"] <= 2_000
    # The network never ran on the collector's thread: no window waited out a push's timeout.
    assert max(took) < 1.5
    writer.stop(timeout_s=0.5)
    hang.close()
    assert writer.stats()["pending_samples"] == 0

    # The same windows to a database that is there: the last samples carry every count.
    back = RemoteWriter(victoria, interval_s=0.2).start()
    for i in range(120):
        body = json.loads(telemetry("cam-a", i, start + i * WINDOW_S, rng.lognormal(3.0, 0.3, 40)))
        back.stored([("lab", "cam-a", body, "", 0.0)])
    assert wait_for(back.flush)
    got = wait_for(lambda: query(victoria, "edgekit_frames_total", start + 120 * WINDOW_S))
    assert float(got[0]["value"][1]) == 120 * 40
    back.stop()
    store.close()


def test_the_url_is_checked_and_completed() -> None:
    assert write_url("http://vm:8428") == "http://vm:8428/api/v1/write"
    assert write_url("https://vm.example/insert/0/prometheus/api/v1/write") == (
        "https://vm.example/insert/0/prometheus/api/v1/write"
    )
    for bad in ("vm:8428", "ftp://vm/api/v1/write", "http://", "http://vm:port/"):
        with pytest.raises(EdgekitError) as err:
            write_url(bad)
        assert err.value.hint


def test_the_encoding_is_a_write_request_a_snappy_decoder_reads() -> None:
    pb = pytest.importorskip("google.protobuf.descriptor_pb2")
    from google.protobuf import descriptor_pool, message_factory

    # The remote-write messages, declared here for protobuf's own parser to read ours back.
    file = pb.FileDescriptorProto(name="rw.proto", package="rw", syntax="proto3")
    for name, fields in (
        ("Label", [("name", 1, 9, 1, None), ("value", 2, 9, 1, None)]),
        ("Sample", [("value", 1, 1, 1, None), ("timestamp", 2, 3, 1, None)]),
        ("TimeSeries", [("labels", 1, 11, 3, ".rw.Label"), ("samples", 2, 11, 3, ".rw.Sample")]),
        ("WriteRequest", [("timeseries", 1, 11, 3, ".rw.TimeSeries")]),
    ):
        msg = file.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    request = message_factory.GetMessageClass(pool.FindMessageTypeByName("rw.WriteRequest"))()
    labels = (("__name__", "x"), ("device", "cam-é"))
    request.ParseFromString(encode_write_request([(labels, 1_700_000_000_123, 2.5), (labels, -5, 3.0)]))
    (series,) = request.timeseries
    assert [(lab.name, lab.value) for lab in series.labels] == list(labels)
    assert [(s.timestamp, s.value) for s in series.samples] == [(1_700_000_000_123, 2.5), (-5, 3.0)]
    # Snappy's block format: the length, then literals (of up to 64 KiB each).
    data = bytes(range(256)) * 700
    framed = snappy_literals(data)
    assert len(framed) < len(data) + 16 and framed.endswith(data[-(len(data) % 65536) :])


@needs_vm
@pytest.mark.parametrize("command", ["collect", "serve"])
def test_fleet_collect_and_serve_push_what_they_store(command: str, victoria: str, tmp_path: Path) -> None:
    """``edgekit fleet collect|serve --remote-write``: simulated devices over a real Mosquitto, into SQLite and VM."""
    broker = Mosquitto(tmp_path).start()
    db = tmp_path / "fleet.db"
    log = tmp_path / f"{command}.log"
    port = free_port()
    try:
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [*EDGEKIT, "fleet", command, "--mqtt", broker.url, "--db", str(db),
                 "--remote-write", victoria, "--remote-write-interval", "0.2s",
                 *(["--port", str(port)] if command == "serve" else [])],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        try:
            assert wait_for(lambda: "collecting from" in log.read_text(), 60), log.read_text()[-3000:]
            assert f"pushing to {victoria}/api/v1/write" in log.read_text()
            sim = subprocess.run(
                [*EDGEKIT, "fleet", "simulate", "--mqtt", broker.url, "--fleet", "lab", "--devices", "2",
                 "--interval", "0.5", "--duration", "3"],
                cwd=ROOT, capture_output=True, timeout=120,
            )  # fmt: skip
            assert sim.returncode == 0, sim.stderr[-2000:]

            def frames_in_store() -> int:
                store = FleetStore(db)
                try:
                    return store.merged(fleet="lab").count
                finally:
                    store.close()

            def pushed() -> float:
                got = query(victoria, "sum(max_over_time(edgekit_frames_total[1h]))", time.time())
                return float(got[0]["value"][1]) if got else -1.0

            # Every frame the store has is in VM, once the last push went out.
            assert wait_for(lambda: frames_in_store() > 0 and pushed() == frames_in_store())
            if command == "serve":  # and /metrics says so
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    text = r.read().decode()
                assert 'edgekit_collector_remote_write_total{event="pushes"}' in text
        finally:
            stop_process(proc, grace_s=30)
        # collect logs its counters as it stops (serve logs at WARNING unless -v: /metrics said it above).
        assert "Traceback" not in log.read_text()
        assert command == "serve" or "samples_sent" in log.read_text()
    finally:
        broker.stop()


def test_a_bad_remote_write_url_is_a_plain_mistake(tmp_path: Path) -> None:
    for command in ("collect", "serve"):
        r = subprocess.run(
            [*EDGEKIT, "fleet", command, "--db", str(tmp_path / "f.db"), "--remote-write", "vm.local:8428"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 2 and "is not an http(s) URL" in r.stderr and "hint:" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_series_start_at_zero_late_windows_keep_time_and_a_group_member_labels_its_own() -> None:
    """What the writer folds windows into, read off its samples before any push (no database needed)."""
    writer = RemoteWriter(
        "http://127.0.0.1:1", collector="collector-2", births={("lab", "cam-a"): {"backend": "ort"}}
    )
    rng = np.random.default_rng(3)
    t0 = 1_800_000_000.0

    def window(seq: int, start: float, cameras: int = 0) -> None:
        body = json.loads(telemetry("cam-a", seq, start, rng.lognormal(3.0, 0.3, 40), cameras))
        writer.stored([("lab", "cam-a", body, "", 0.0)])

    window(0, t0, cameras=2)
    window(1, t0 + WINDOW_S)
    window(2, t0 - WINDOW_S)  # a spool's replay, older than what was pushed
    writer.status("lab", "cam-a", {"backend": "tensorrt", "profile": "jetson"})
    window(3, t0 + 2 * WINDOW_S)
    writer._fold(final=True)
    samples = list(writer._pending)
    frames = [
        (dict(labels), ts, v)
        for labels, ts, v in samples
        if dict(labels)["__name__"] == "edgekit_frames_total"
    ]
    ms = int(t0 * 1000)
    step = int(WINDOW_S * 1000)
    assert [(d.get("backend"), ts, v) for d, ts, v in frames] == [
        ("ort", ms, 0.0),  # a new series starts at 0 at its first window's start...
        ("ort", ms + step, 40.0),  # ...then counts at each window's end
        ("ort", ms + 2 * step, 80.0),
        ("ort", ms + 2 * step + 1, 120.0),  # the late window: counted, at the device's latest time
        ("tensorrt", ms + 2 * step, 0.0),  # a new backend is a new series, from 0
        ("tensorrt", ms + 3 * step, 40.0),
    ]
    assert writer.stats()["windows_late"] == 1
    assert all(dict(labels)["collector"] == "collector-2" for labels, _, _ in samples)
    # One window's series: the device's 29, and 3 for each of its cameras.
    first = {labels for labels, ts, _ in samples if ts == ms + step and "device" in dict(labels)}
    assert len(first) == SERIES_PER_DEVICE + 2 * SERIES_PER_CAMERA
    # The fleet's histogram: cumulative on edges 2 % apart, never going down as windows come.
    fleet = sorted(
        (float(dict(labels)["le"]), ts, v)
        for labels, ts, v in samples
        if dict(labels)["__name__"] == "edgekit_fleet_frame_latency_seconds_bucket"
        and dict(labels)["le"] != "+Inf"
    )
    last = max(ts for _, ts, _ in fleet)
    edges = [(le, v) for le, ts, v in fleet if ts == last]
    assert all(b[0] / a[0] == pytest.approx(1.0202, rel=1e-3) for a, b in itertools.pairwise(edges))
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(edges)) and edges[-1][1] == 160
    assert edges[-1][0] == pytest.approx(10.0, rel=0.03) and len(edges) + 3 <= fleet_series()


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (apt-get install prometheus)")
def test_prometheus_takes_the_same_push_and_refuses_a_backlog_older_than_its_head(tmp_path: Path) -> None:
    """Prometheus' remote-write receiver reads the encoding too; samples too old for it are dropped, counted."""
    assert PROMETHEUS is not None
    port = free_port()
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        assert wait_for(ready), (tmp_path / "prometheus.log").read_text()[-2000:]
        rng = np.random.default_rng(9)
        now = time.time()
        writer = RemoteWriter(base, interval_s=0.2)
        for i in range(6):
            body = json.loads(telemetry("cam-a", i, now - 600 - (6 - i) * 60, rng.lognormal(3.0, 0.3, 40)))
            writer.stored([("lab", "cam-a", body, "", 0.0)])
        assert writer.flush() and writer.stats()["samples_sent"] > 0
        sent = writer.stats()["samples_sent"]
        # Three days back, behind what Prometheus' head now holds: refused (400), the batch is dropped and
        # counted, not retried for ever.
        old = json.loads(telemetry("cam-old", 0, now - 3 * DAY, rng.lognormal(3.0, 0.3, 40)))
        writer.stored([("lab", "cam-old", old, "", 0.0)])
        assert writer.flush()
        assert writer.stats()["samples_dropped"] > 0 and writer.stats()["samples_sent"] == sent
        got = wait_for(lambda: query(base, "edgekit_frames_total{device='cam-a'}", now))
        assert float(got[0]["value"][1]) == 6 * 40
        p95 = query(
            base,
            "histogram_quantile(0.95, sum by (le) (increase(edgekit_fleet_frame_latency_seconds_bucket[1h])))",
            now,
        )
        assert 0.02 < float(p95[0]["value"][1]) < 0.05
    finally:
        stop_process(proc)
