"""A detector in the fleet: per-class counts stored (SQLite and PostgreSQL, raw and rolled up), shown on the
device page, exported in /metrics; old and classifier telemetry unchanged; hostile counts refused."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from chromium import open_chromium
from detector_telemetry import offline_publisher, record
from postgres import PostgresServer

from edgekit.core.tally import ClassCount
from edgekit.detection.detector import Detection
from edgekit.fleet import Collector, FleetStore
from edgekit.fleet.open_store import open_store
from edgekit.fleet.prometheus import render
from edgekit.fleet.view import FleetView
from edgekit.protocol.stages import STAGES
from edgekit.telemetry import BrokerConfig, Spool, TelemetryPublisher
from edgekit.telemetry.window import MetricsWindow

T = 1_700_000_000.0
FACE, PERSON = (0, "face"), (1, "person")


def det(cls: tuple[int, str], score: float) -> Detection:
    return Detection(cls[0], cls[1], score, (1.0, 2.0, 30.0, 40.0))


def device(tmp: Path, name: str, detector: bool = True) -> tuple[TelemetryPublisher, MetricsWindow]:
    window = MetricsWindow(detections=detector)
    return offline_publisher(tmp, window, name), window


def window_body(
    pub: TelemetryPublisher, window: MetricsWindow, stop: float, *frames: tuple[Detection, ...]
) -> dict[str, Any]:
    for dets in frames:
        window.observe(record(*dets))
    body = pub.telemetry_payload()
    body["window"]["start"], body["window"]["end"] = stop - 1.0, stop
    return json.loads(json.dumps(body))


def test_the_store_keeps_per_class_counts_raw_and_rolled_up(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url)
    pub, window = device(tmp_path, "cam-d")
    face, person = (det(FACE, 0.9), det(FACE, 0.6)), (det(PERSON, 0.7),)
    rows = [
        ("lab", "cam-d", window_body(pub, window, T + 10, face, person, ()), T + 10),
        ("lab", "cam-d", window_body(pub, window, T + 20, (det(FACE, 0.95),)), T + 20),
        ("lab", "cam-d", window_body(pub, window, T + 70, person), T + 70),
    ]
    pub.spool.close()
    store.add_windows([(f, d, body, json.dumps(body), at) for f, d, body, at in rows])
    old, _ = device(tmp_path, "cam-old", detector=False)
    classifier = window_body(old, MetricsWindow(), T + 10, ())
    old.spool.close()
    store.add_windows([("lab", "cam-old", classifier, json.dumps(classifier), T + 10)])

    def by_minute() -> dict[tuple[str, float], dict[str, ClassCount] | None]:
        return {(b.device, b.t0): b.detections for b in store.buckets(T, T + 120, 60)}

    raw = by_minute()
    assert raw[("cam-d", T // 60 * 60)] == {"face": ClassCount(2, 3, 0.95), "person": ClassCount(1, 1, 0.7)}
    assert raw[("cam-old", T // 60 * 60)] is None  # a classifier's step has no detections at all
    # Rolled up in two runs (the second minute's window later): the counts survive and merge.
    assert store.compact(T + 60 + 3600 + 1, raw_keep_s=3600)["windows"] == 3  # cam-d's first two, cam-old's
    assert store.compact(T + 120 + 3600 + 1, raw_keep_s=3600)["windows"] == 1
    assert store.merged(device="cam-d").count == 5  # every frame, from rollups now
    assert by_minute() == raw

    # Minute rollups merged into an hour rollup: the classes of both minutes add up in it.
    def by_hour() -> dict[tuple[str, float], dict[str, ClassCount] | None]:
        return {(b.device, b.t0): b.detections for b in store.buckets(T - 3600, T + 3600, 3600)}

    hours = by_hour()
    levels = ((60, 0.0), (3600, 30 * 86400.0))
    assert store.compact(T + 7200, raw_keep_s=3600, levels=levels)["rollups_merged"] == 3
    assert by_hour() == hours and hours[("cam-d", T // 3600 * 3600)] == {
        "face": ClassCount(2, 3, 0.95),
        "person": ClassCount(2, 2, 0.7),
    }
    store.close()


def hostile(body: dict[str, Any], detections: Any) -> bytes:
    return json.dumps(body | {"window": body["window"] | {"detections": detections}}).encode()


def test_view_metrics_and_collector_take_detections_and_refuse_hostile_counts(tmp_path: Path) -> None:
    store = FleetStore()
    view = FleetView(store, clock=lambda: T + 30)
    collector = Collector(store, listener=view)
    pub, window = device(tmp_path, "cam-d")
    topic = "edgekit/v1/lab/cam-d/telemetry"
    evil = 'a"b\\c\nd'
    bodies = [
        window_body(pub, window, T + 5, (det(FACE, 0.9), det(FACE, 0.5)), (det(FACE, 0.8),), ()),
        window_body(pub, window, T + 15, (det(PERSON, 0.4), det((9, evil), 0.3))),
    ]
    for body in bodies:
        assert collector.handle(topic, json.dumps(body).encode(), now=T + 20) == "telemetry"
    good = bodies[0] | {"seq": 99}
    refused = {
        "a million classes": hostile(
            good, {f"c{i}": {"frames": 1, "objects": 1, "max_score": 0.5} for i in range(10**6)}
        ),
        "65 classes": hostile(
            good, {f"c{i}": {"frames": 1, "objects": 1, "max_score": 0.5} for i in range(65)}
        ),
        "a huge name": hostile(good, {"x" * 100_000: {"frames": 1, "objects": 1, "max_score": 0.5}}),
        "a negative count": hostile(good, {"face": {"frames": -1, "objects": 1, "max_score": 0.5}}),
        "a count past BIGINT": hostile(good, {"face": {"frames": 1, "objects": 2**63, "max_score": 0.5}}),
        "not an object": hostile(good, [1, 2, 3]),
    }
    outcomes = {why: collector.handle(topic, payload, now=T + 20) for why, payload in refused.items()}
    assert outcomes == {
        "a million classes": "rejected:oversized",
        "65 classes": "rejected:bad-field",
        "a huge name": "rejected:bad-field",
        "a negative count": "rejected:bad-field",
        "a count past BIGINT": "rejected:bad-field",
        "not an object": "rejected:bad-field",
    }
    # The collector carries on: the next window of the device is taken.
    later = window_body(pub, window, T + 25, (det(FACE, 0.99),))
    pub.spool.close()
    assert collector.handle(topic, json.dumps(later).encode(), now=T + 26) == "telemetry"
    collector.flush()
    view.tick()  # the server's once-a-second fold of what the collector handed over

    page = view.device_page("lab", "cam-d")
    assert page is not None and page["detections"] is not None
    classes = {c["name"]: c for c in page["detections"]["classes"]}
    assert classes["face"] | {"steps": None} == {"name": "face", "frames": 3, "objects": 4, "max_score": 0.99,
                                                 "steps": None}  # fmt: skip
    assert classes["person"]["objects"] == 1 and classes[evil]["max_score"] == 0.3
    assert page["detections"]["classes"][0]["name"] == "face"  # most objects first
    assert sum(classes["face"]["steps"]) == 4 and len(page["detections"]["t"]) <= 6

    text = render(view.prometheus_state())
    assert 'edgekit_detections_total{fleet="lab",device="cam-d",class="face"} 4' in text
    assert 'edgekit_detection_frames_total{fleet="lab",device="cam-d",class="face"} 3' in text
    assert 'class="a\\"b\\\\c\\nd"} 1' in text  # escaped as the text format wants
    assert '\nd"' not in text


def test_a_classifier_and_an_old_device_show_no_detections(tmp_path: Path) -> None:
    store = FleetStore()
    view = FleetView(store, clock=lambda: T + 30)
    collector = Collector(store, listener=view)
    sketch = {"accuracy": 0.01, "count": 2, "sum": 24.0, "min": 11.0, "max": 13.0, "zero": 0,
              "buckets": {"120": 1, "129": 1}}  # fmt: skip
    old = {"schema": "edgekit/v1/telemetry", "device": "cam-old", "seq": 0,
           "window": {"start": T, "end": T + 1, "frames": 2, "missed": 0, "latency_ms": sketch,
                      "stages_ms": dict.fromkeys(STAGES, sketch)}, "counters": {"frames": 2}}  # fmt: skip
    assert (
        collector.handle("edgekit/v1/lab/cam-old/telemetry", json.dumps(old).encode(), now=T + 2)
        == "telemetry"
    )
    view.tick()
    page = view.device_page("lab", "cam-old")
    assert page is not None and page["detections"] is None and page["device"]["frames"] == 2
    assert "edgekit_detections_total{" not in render(view.prometheus_state())


# -- end to end: a real Mosquitto, PostgreSQL, `edgekit fleet serve` and headless Chromium -------------------


def _wait(what: str, check: Any, timeout: float, errors: tuple[type[Exception], ...] = (OSError,)) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except errors:  # a server still starting, a page mid-render
            value = None
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_a_detector_through_mosquitto_and_postgres_to_metrics_and_the_device_page(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    browser_test = pytest.importorskip("test_fleet_browser", reason="selenium and chromium are needed")
    from edgekit.testing.mosquitto import Mosquitto

    broker = Mosquitto(tmp_path).start()
    procs = browser_test.Processes(tmp_path)
    driver = None
    pub = None
    try:
        url = browser_test._serve(procs, broker.url, pg_server.new_database())
        window = MetricsWindow(detections=True)
        pub = TelemetryPublisher(
            BrokerConfig.from_url(broker.url),
            device_id="door-cam",
            fleet="lab",
            interval_s=0.5,
            window=window,
            spool=Spool(tmp_path / "door-cam.db"),
            counters=lambda: {"frames": 0},
            birth={"model": {"name": "blazeface", "version": "1.0"}, "budget_ms": 33.3},
        ).start()
        sent = {"face": 0, "frames": 0}
        hostile_client = BrokerConfig.from_url(broker.url).client("intruder")
        hostile_client.connect("127.0.0.1", broker.port)
        hostile_client.loop_start()
        (tmp_path / "other").mkdir()
        twin, twin_window = device(tmp_path / "other", "door-cam")
        valid = window_body(twin, twin_window, time.time(), (det(FACE, 0.5),))
        twin.spool.close()
        too_many = {f"c{i}": {"frames": 1, "objects": 1, "max_score": 0.5} for i in range(100)}
        for _ in range(8):
            for _ in range(5):
                window.observe(record(det(FACE, 0.9), det(FACE, 0.7)))
                window.observe(record())
                sent["face"] += 2
            time.sleep(0.3)
        bad = hostile(valid | {"seq": 10**6, "epoch": pub.spool.epoch}, too_many)
        hostile_client.publish("edgekit/v1/lab/door-cam/telemetry", bad, qos=1).wait_for_publish(5)

        def metric(name: str) -> float | None:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
                text = resp.read().decode()
            for line in text.splitlines():
                if line.startswith(f'{name}{{fleet="lab",device="door-cam",class="face"}}'):
                    return float(line.rsplit(" ", 1)[1])
            return None

        _wait("/metrics to count every face", lambda: metric("edgekit_detections_total") == sent["face"], 30)
        assert metric("edgekit_detection_frames_total") == sent["face"] / 2
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            assert 'edgekit_collector_rejected_total{reason="bad-field"} 1' in resp.read().decode()

        # importorskip("test_fleet_browser") above skips this test without selenium or chromium.
        driver = open_chromium(tmp_path)
        driver.get(url + "/#/device/lab/door-cam")

        def face_row() -> list[str] | None:
            rows = driver.find_elements("css selector", "#dev-detections-table tbody tr[data-class='face']")
            return [td.text for td in rows[0].find_elements("tag name", "td")] if rows else None

        cells = _wait(
            "the device page's detections table",
            face_row,
            30,
            (OSError, browser_test.WebDriverException),
        )
        assert cells[0] == "face" and cells[3] == "0.90"
        assert int(cells[2].replace(",", "")) == sent["face"] and int(cells[1]) == sent["face"] // 2
        assert driver.find_element("id", "dev-detections").is_displayed()
    finally:
        if driver is not None:
            driver.quit()
        if pub is not None:
            pub.stop(timeout=1.0)
        procs.stop_all()
        broker.stop()


def test_the_simulator_runs_a_face_detector_as_its_last_devices(tmp_path: Path) -> None:
    from edgekit.telemetry.simulate import SimDevice, SimOptions

    opts = SimOptions(mqtt="mqtt://127.0.0.1:1", devices=3, detectors=1)
    broker = BrokerConfig.from_url(opts.mqtt)
    sims = [SimDevice(i, opts, broker, tmp_path, T) for i in range(opts.devices)]
    try:
        for sim in sims:
            sim.run_frames(4.0, T + 4)
        bodies = [sim.publisher.telemetry_payload() for sim in sims]
    finally:
        for sim in sims:
            sim.publisher.spool.close()
    assert [b["window"].get("detections") is not None for b in bodies] == [False, False, True]
    assert sims[2].publisher.birth["model"]["name"] == "blazeface"
    face = bodies[2]["window"]["detections"]["face"]
    frames = bodies[2]["window"]["frames"]
    assert 0 < face["frames"] < frames and face["frames"] <= face["objects"] <= 3 * face["frames"]
    assert 0.55 <= face["max_score"] <= 0.99
    collector = Collector(FleetStore())
    assert (
        collector.handle(f"edgekit/v1/demo/{sims[2].name}/telemetry", json.dumps(bodies[2]).encode())
        == "telemetry"
    )
