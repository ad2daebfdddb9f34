"""How cameras kept delivering (issue 34), from the pipeline to the fleet: outages, reopens, stalls,
corrupt frames, size changes, seconds without frames and since the last frame.

A real pipeline reads a real MJPEG camera on loopback (taken away, then back at another resolution)
beside a synthetic one and reports to a real Mosquitto; a real collector stores what arrives
(SQLite and PostgreSQL keep each camera's latest health), the view exports it on ``/metrics``
and flags a stalled camera; an RTSP stream paused with its connection open is published as a
stall.  promtool's unit tests of EdgekitCameraStalled and EdgekitCameraFlapping run in
``test_fleet_prometheus``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from mjpeg_server import MjpegCamera
from paho.mqtt.enums import CallbackAPIVersion
from test_fleet_cameras import get, wait_for
from test_telemetry import Subscriber, validator, wait_until

import edgekit
from edgekit.core.tally import SourceHealth
from edgekit.fleet import Collector, prometheus
from edgekit.fleet.open_store import open_store
from edgekit.fleet.view import FleetView, SloPolicy
from edgekit.protocol.messages import Telemetry
from edgekit.telemetry import report
from edgekit.telemetry.window import MetricsWindow
from edgekit.testing.mosquitto import Mosquitto, free_port
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT

FLEET, DEVICE = "lab", "cams"


@pytest.fixture(scope="module")
def model(x86_bundle: tuple[Path, dict[str, Any]]) -> Iterator[Any]:
    with edgekit.load(x86_bundle[0], device="x86_64-cpu") as m:
        yield m


def frames(n: int, size: tuple[int, int]) -> list[np.ndarray]:
    return [np.full((*size, 3), (i * 23) % 256, np.uint8) for i in range(n)]


def jpegs(n: int, size: tuple[int, int]) -> list[bytes]:
    import cv2

    return [cv2.imencode(".jpg", f)[1].tobytes() for f in frames(n, size)]


# -- the device side ---------------------------------------------------------------------------


def test_a_window_says_each_cameras_health_and_the_sources_together() -> None:
    health = {
        "door": SourceHealth(
            outages=2,
            reopens=1,
            stalls=1,
            corrupt=3,
            size_changes=1,
            rate_changes=2,
            down_s=4.5,
            since_frame_s=7.25,
        ),
        "yard": SourceHealth(outages=1, reopens=1, down_s=0.5, since_frame_s=0.02),
    }
    mw = MetricsWindow(cameras=list(health), health=lambda: health)
    body = mw.take().to_dict()
    assert body["cameras"]["door"]["health"] == health["door"].to_dict()
    assert body["cameras"]["yard"]["health"]["since_frame_s"] == 0.02
    # Together: counts and seconds without frames add up, the longest silence is the sources'.
    assert body["health"] == {
        "outages": 3,
        "reopens": 2,
        "stalls": 1,
        "corrupt": 3,
        "size_changes": 1,
        "rate_changes": 2,
        "down_s": 5.0,
        "since_frame_s": 7.25,
    }
    # A single source's window has its health and still no cameras.
    solo = MetricsWindow(health=lambda: {"": health["door"]}).take().to_dict()
    assert "cameras" not in solo and solo["health"] == health["door"].to_dict()
    # A window without health (a pipeline of an earlier release, a device that does not say) reads as before.
    assert "health" not in MetricsWindow().take().to_dict()


def test_an_older_devices_window_without_health_is_still_valid() -> None:
    body = {
        "schema": "edgekit/v1/telemetry",
        "device": DEVICE,
        "seq": 0,
        "window": MetricsWindow().take().to_dict(),
        "counters": {"frames": 0},
    }
    assert Telemetry.model_validate(body).window.health is None
    # A newer device's partial health: what it leaves out reads as 0.
    body["window"]["health"] = {"outages": 1}
    got = Telemetry.model_validate(body).window.health
    assert got is not None and (got.outages, got.reopens, got.since_frame_s) == (1, 0, 0.0)
    body["window"]["health"] = {"outages": -1}
    with pytest.raises(ValueError):
        Telemetry.model_validate(body)


def test_sparkplug_carries_the_health_and_the_collector_reads_it_back() -> None:
    from edgekit.protocol import sparkplug as sp

    door = SourceHealth(
        outages=2, reopens=1, stalls=1, corrupt=4, size_changes=1, down_s=3.5, since_frame_s=9.0
    )
    mw = MetricsWindow(cameras=["door"], health=lambda: {"door": door})
    body = {"seq": 3, "epoch": "e", "window": mw.take().to_dict(), "counters": {"frames": 0}, "gauges": {}}
    metrics = sp.window_metrics(body)
    assert metrics["cameras/door/health/outages"] == 2 and metrics["cameras/door/health/since_frame_s"] == 9.0
    # A birth declares every metric a window sends, the health's too, with the same types.
    birth = sp.window_metrics(body | {"window": mw.blank(0.0).to_dict()})
    assert {k: type(v) for k, v in birth.items() if "health" in k} == {
        k: type(v) for k, v in metrics.items() if "health" in k
    }
    back = sp.telemetry_body(
        sp.read_metrics(sp.encode(metrics, seq=1))[1], fleet=FLEET, device=DEVICE, ts_ms=1
    )
    # The window's health (the sources together) comes back whole and valid; a camera's stays
    # percentile-like, for SCADA tools (the collector rebuilds no cameras from Sparkplug).
    assert back["window"]["health"] == door.to_dict()
    assert Telemetry.model_validate(back).window.health is not None


def test_a_camera_outage_and_size_change_reach_telemetry_the_store_and_metrics(
    model: Any, broker: Mosquitto, tmp_path: Path
) -> None:
    door = MjpegCamera(frames(6, (240, 320)), fps=30)
    door.start()
    store = open_store(str(tmp_path / "fleet.db"))
    view = FleetView(store, slo=SloPolicy(stalled_s=1.0))
    collector = Collector(store, listener=view)
    reader = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="collector")
    subscribed: list[bool] = []
    reader.on_connect = lambda c, u, f, rc, p: (c.subscribe("edgekit/v1/#", qos=1), subscribed.append(True))
    reader.on_message = lambda c, u, msg: collector.handle(msg.topic, msg.payload)
    reader.connect("127.0.0.1", broker.port)
    reader.loop_start()
    sub = Subscriber(broker.port, client_id="health-watch")
    stalled_alerts: list[dict[str, Any]] = []

    def door_health(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [m["window"]["cameras"]["door"]["health"] for m in messages if "cameras" in m["window"]]

    try:
        assert wait_until(lambda: bool(subscribed), 15)
        time.sleep(0.2)  # the SUBACK
        with edgekit.Pipeline(model, sources={"door": door.url, "yard": "synthetic:160x120@15"}) as p:
            report(p, broker.url, device_id=DEVICE, fleet=FLEET, interval_s=0.4)

            def drive() -> None:
                # Each step waits for what it needs to see, not for a number of seconds.
                try:
                    assert wait_until(lambda: p.per_camera["door"].frames >= 10, 60)
                    door.stop()
                    # Away long enough that windows close while no frame comes, and the view flags it.
                    silent = lambda: any(h["since_frame_s"] >= 1.5 for h in door_health(sub.of("telemetry")))  # noqa: E731
                    assert wait_until(silent, 60)

                    def flagged() -> bool:
                        view.tick()
                        stalled_alerts[:] = [a for a in view.snapshot()["alerts"] if a["kind"] == "stalled"]
                        return bool(stalled_alerts)

                    assert wait_until(flagged, 30)
                    door.jpegs = jpegs(6, (120, 160))  # back at another resolution
                    door.start()
                    back = p.per_camera["door"].frames + 10
                    assert wait_until(lambda: p.per_camera["door"].frames >= back, 60)
                    # ...and a window after it, so the size change is published.
                    sized = lambda: any(h["size_changes"] >= 1 for h in door_health(sub.of("telemetry")))  # noqa: E731
                    assert wait_until(sized, 30)
                finally:
                    p.stop()

            driver = threading.Thread(target=drive, daemon=True)
            driver.start()
            p.run()
            driver.join(10)
        assert sub.wait_for(lambda: any(m.get("state") == "offline" for m in sub.of("status")), 10)
        collector.flush()
    finally:
        sub.close()
        reader.disconnect()
        reader.loop_stop()
        door.stop()

    final = p.health()
    telemetry = sub.of("telemetry")
    for m in telemetry:
        validator("telemetry.schema.json").validate(m)
    doors = door_health(telemetry)
    assert doors and max(h["since_frame_s"] for h in doors) >= 1.5  # the silence was published as it went on
    last = max(telemetry, key=lambda m: m["window"]["end"])["window"]
    door_last, yard_last = last["cameras"]["door"]["health"], last["cameras"]["yard"]["health"]
    assert door_last["outages"] >= 1 and door_last["reopens"] >= 1 and door_last["size_changes"] == 1
    # Its time without frames: at least the silence seen, and only ever growing from window to window.
    assert door_last["down_s"] >= 1.5 and yard_last["down_s"] == 0.0
    assert door_last["outages"] == final["door"].outages and door_last["reopens"] == final["door"].reopens
    assert yard_last["outages"] == yard_last["size_changes"] == 0 and yard_last["since_frame_s"] < 1.5
    assert last["health"]["outages"] == door_last["outages"]  # the sources together
    # The counters only went up from window to window.
    for field in (*SourceHealth.COUNTS, "down_s"):
        seq = [h[field] for h in doors]
        assert seq == sorted(seq), field
    assert p.counters.size_changes == 1 and p.counters.source_outages == final["door"].outages
    summary = p.summary().to_dict()
    assert summary["cameras"]["door"]["health"]["reopens"] == final["door"].reopens
    assert summary["health"]["outages"] == final["door"].outages

    # The store keeps each camera's latest, as the last window said.
    stored = store.camera_health(FLEET, DEVICE)[(FLEET, DEVICE)]["cameras"]
    assert set(stored) == {"door", "yard"}
    assert stored["door"].to_dict() == door_last and stored["yard"].to_dict() == yard_last

    # The view flagged the silent camera while it was (1 s here), and exports the counts and the gauge.
    assert [a["camera"] for a in stalled_alerts] == ["door"]
    text = prometheus.render(view.prometheus_state())
    at = f'{{fleet="{FLEET}",device="{DEVICE}",camera="door"}}'
    assert f"edgekit_camera_outages_total{at} {door_last['outages']}" in text
    assert f"edgekit_camera_reopens_total{at} {door_last['reopens']}" in text
    assert f"edgekit_camera_size_changes_total{at} 1" in text
    assert f"edgekit_camera_seconds_since_frame{at} {float(door_last['since_frame_s'])!r}" in text
    page = view.device_page(FLEET, DEVICE)
    # The device stopped (offline): what its cameras last said is not now.
    assert page is not None and {r["name"]: r["state"] for r in page["health"]} == {
        "door": "unknown",
        "yard": "unknown",
    }
    store.close()


# -- the fleet side, on both stores --------------------------------------------------------------


def window_body(seq: int, end: float, health: dict[str, SourceHealth] | None) -> dict[str, Any]:
    """A two-camera device's telemetry message (no frames) whose cameras say ``health``."""
    cameras = list(health or {"door": None, "yard": None})
    w = MetricsWindow(cameras=cameras, health=(lambda: health) if health is not None else None).take()
    w.start, w.end = end - 1, end
    return {
        "schema": "edgekit/v1/telemetry",
        "device": DEVICE,
        "epoch": "e1",
        "seq": seq,
        "window": w.to_dict(),
        "counters": {"frames": 0},
    }


def test_the_store_keeps_each_cameras_latest_health(store_url: str) -> None:
    store = open_store(store_url)
    now = 1_800_000_000.0
    stalled = SourceHealth(outages=3, reopens=2, stalls=1, corrupt=5, down_s=40.5, since_frame_s=35.0)
    fine = SourceHealth(since_frame_s=0.03)
    try:
        for seq, end, health in (
            (0, now, {"door": SourceHealth(outages=1, since_frame_s=0.5), "yard": fine}),
            (1, now + 5, {"door": stalled, "yard": fine}),
            (2, now + 10, None),  # a window without health changes nothing
        ):
            store.add_window(FLEET, DEVICE, window_body(seq, end, health), end)
        # A replayed older window does not overwrite the newer health.
        store.add_window(FLEET, DEVICE, window_body(9, now - 5, {"door": fine, "yard": fine}), now + 11)
        got = store.camera_health(FLEET, DEVICE)[(FLEET, DEVICE)]
        assert got["at"] == now + 5 and got["cameras"] == {"door": stalled, "yard": fine}
        # A camera the device no longer has leaves with its next window.
        store.add_window(FLEET, DEVICE, window_body(3, now + 15, {"door": fine, "gate": fine}), now + 15)
        assert set(store.camera_health()[(FLEET, DEVICE)]["cameras"]) == {"door", "gate"}

        # A restarted server's view shows it at once; a device aged out takes it along.
        store.set_state(FLEET, DEVICE, "online", now, {"budget_ms": 33.3})
        store.add_window(FLEET, DEVICE, window_body(4, now + 20, {"door": stalled, "gate": fine}), now + 20)
        view = FleetView(store, clock=lambda: now + 21)
        view.load()
        page = view.device_page(FLEET, DEVICE)
        assert page is not None
        assert {r["name"]: r["state"] for r in page["health"]} == {"door": "stalled", "gate": "ok"}
        assert page["health"][0]["outages"] == 3 and page["health"][0]["down_s"] == 40.5
        snap = view.snapshot()
        assert snap["devices"][0]["cameras_stalled"] == 1
        assert [(a["kind"], a["camera"]) for a in snap["alerts"]] == [("stalled", "door")]
        store.forget(FLEET, DEVICE)
        assert store.camera_health() == {}
    finally:
        store.close()


def test_a_single_source_is_kept_and_exported_as_camera_blank() -> None:
    view = FleetView(clock=lambda: 1_800_000_010.0)
    health = SourceHealth(outages=1, reopens=1, down_s=2.0, since_frame_s=0.1)
    body = window_body(0, 1_800_000_000.0, None)
    body["window"] = MetricsWindow(health=lambda: {"": health}).take().to_dict()
    view.window(FLEET, "solo", body, 1_800_000_000.0)
    view.tick()
    page = view.device_page(FLEET, "solo")
    assert page is not None and page["cameras"] is None
    assert page["health"] == [{"name": "", "state": "ok"} | health.to_dict()]
    text = prometheus.render(view.prometheus_state())
    assert 'edgekit_camera_reopens_total{fleet="lab",device="solo",camera=""} 1' in text
    assert 'edgekit_camera_down_seconds_total{fleet="lab",device="solo",camera=""} 2.0' in text
    (totals,) = view.prometheus_state()
    assert prometheus.series_of(totals) == sum(
        1 for line in text.splitlines() if line.startswith("edgekit_") and 'device="solo"' in line
    )


def test_health_messages_are_what_the_schema_says() -> None:
    body = window_body(0, 1_800_000_000.0, {"door": SourceHealth(outages=1, since_frame_s=2.5)})
    validator("telemetry.schema.json").validate(json.loads(json.dumps(body)))
    assert Telemetry.model_validate(body).window.cameras["door"].health is not None  # type: ignore[index,union-attr]


# -- edgekit fleet serve: the device page's JSON, the table Chromium draws, /metrics ----------------


def publish(port: int, messages: list[tuple[str, dict[str, Any]]]) -> None:
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="health-devices")
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for topic, body in messages:
            client.publish(topic, json.dumps(body), qos=1).wait_for_publish(timeout=5)
    finally:
        client.disconnect()
        client.loop_stop()


def test_the_served_dashboard_shows_a_stalled_camera(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path).start()
    port = free_port()
    proc = subprocess.Popen(
        [*EDGEKIT, "fleet", "serve", "--mqtt", broker.url, "--db", str(tmp_path / "fleet.db"), "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "serve.log").open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    now = time.time()
    door = SourceHealth(outages=2, reopens=1, stalls=1, corrupt=4, down_s=50.0, since_frame_s=45.0)
    yard = SourceHealth(size_changes=1, since_frame_s=0.05)
    solo = window_body(0, now, None) | {"device": "solo"}
    solo["window"] = MetricsWindow(health=lambda: {"": yard}).take().to_dict()
    online = {"schema": "edgekit/v1/status", "state": "online", "fleet": FLEET, "backend": "onnxruntime"}
    try:
        wait_for("the server", lambda: json.loads(get(f"{url}/healthz"))["ok"], 60)
        time.sleep(0.5)  # its collector subscribes once connected
        publish(
            broker.port,
            [
                (f"edgekit/v1/{FLEET}/{DEVICE}/status", online | {"device": DEVICE}),
                (f"edgekit/v1/{FLEET}/solo/status", online | {"device": "solo"}),
                (f"edgekit/v1/{FLEET}/{DEVICE}/telemetry", window_body(0, now, {"door": door, "yard": yard})),
                (f"edgekit/v1/{FLEET}/solo/telemetry", solo),
            ],
        )
        metric = f'edgekit_camera_outages_total{{fleet="{FLEET}",device="{DEVICE}",camera="door"}} 2'
        wait_for("the health on /metrics", lambda: metric in get(f"{url}/metrics"))
        page = json.loads(get(f"{url}/api/device/{FLEET}/{DEVICE}"))
        assert {r["name"]: r["state"] for r in page["health"]} == {"door": "stalled", "yard": "ok"}
        assert any(a["kind"] == "stalled" and a["camera"] == "door" for a in page["alerts"])

        from chromium import open_chromium, require_chromium

        require_chromium()
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.common.by import By

        driver = open_chromium(tmp_path)
        try:

            def table() -> dict[str, tuple[str, str, str]] | None:
                rows = driver.find_elements(By.CSS_SELECTOR, "#dev-cameras-table tbody tr")
                if not rows or not driver.find_elements(
                    By.CSS_SELECTOR, "#dev-cameras-table [data-field=state]"
                ):
                    return None
                return {
                    str(r.get_attribute("data-camera")): tuple(
                        r.find_element(By.CSS_SELECTOR, f"[data-field={f}]").text
                        for f in ("state", "outages", "since_frame_s")
                    )
                    for r in rows
                }

            driver.get(f"{url}/#/device/{FLEET}/{DEVICE}")
            drawn = wait_for("the camera table", table, errors=(WebDriverException,))
            assert drawn == {"door": ("stalled", "2", "45.0"), "yard": ("ok", "0", "0.1")}
            kpis = {
                box.find_element(By.TAG_NAME, "dt").text.lower(): box.find_element(By.TAG_NAME, "dd").text
                for box in driver.find_elements(By.CSS_SELECTOR, "#dev-kpis > div")
            }
            assert kpis["cameras stalled"] == "1"
            # A single source that reports health: one row, "source".
            driver.get(f"{url}/#/device/{FLEET}/solo")
            one = lambda: (t := table()) is not None and "" in t and t  # noqa: E731
            assert wait_for("the single source's row", one, errors=(WebDriverException,)) == {
                "": ("ok", "0", "0.1")
            }
        finally:
            driver.quit()
    finally:
        stop_process(proc, grace_s=15, sig=signal.SIGINT)
        broker.stop()


def test_an_rtsp_stream_paused_with_its_connection_open_is_published_as_a_stall(
    model: Any, broker: Mosquitto, tmp_path: Path
) -> None:
    from rtsp_server import RtspCamera, rtsp_server_missing

    missing = rtsp_server_missing()
    if missing is not None:
        pytest.skip(f"no RTSP server here: {missing}")
    store = open_store(str(tmp_path / "fleet.db"))
    view = FleetView(store)
    collector = Collector(store, listener=view)
    reader = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="collector-rtsp")
    subscribed: list[bool] = []
    reader.on_connect = lambda c, u, f, rc, p: (c.subscribe("edgekit/v1/#", qos=1), subscribed.append(True))
    reader.on_message = lambda c, u, msg: collector.handle(msg.topic, msg.payload)
    reader.connect("127.0.0.1", broker.port)
    reader.loop_start()
    sub = Subscriber(broker.port, client_id="rtsp-watch")

    def healths() -> list[dict[str, Any]]:
        return [m["window"]["health"] for m in sub.of("telemetry") if "health" in m["window"]]

    try:
        assert wait_until(lambda: bool(subscribed), 15)
        time.sleep(0.2)  # the SUBACK
        with RtspCamera() as cam, edgekit.Pipeline(model, source=cam.url + "#transport=tcp") as p:
            report(p, broker.url, device_id="rtsp-1", fleet=FLEET, interval_s=0.4)

            def drive() -> None:
                try:
                    assert wait_until(lambda: p.counters.frames >= 10, 60)
                    cam.pause()  # the connection stays open; nothing comes
                    assert wait_until(lambda: any(h["stalls"] >= 1 for h in healths()), 60)
                    cam.resume()
                    back = p.counters.frames + 10
                    assert wait_until(lambda: p.counters.frames >= back, 60)
                finally:
                    p.stop()

            driver = threading.Thread(target=drive, daemon=True)
            driver.start()
            p.run()
            driver.join(10)
        assert sub.wait_for(lambda: any(m.get("state") == "offline" for m in sub.of("status")), 10)
        collector.flush()
    finally:
        sub.close()
        reader.disconnect()
        reader.loop_stop()
    last = max(sub.of("telemetry"), key=lambda m: m["window"]["end"])["window"]
    assert "cameras" not in last  # a single source: its health is the window's
    h = last["health"]
    assert h["stalls"] >= 1 and h["outages"] >= h["stalls"] and h["reopens"] >= 1 and h["down_s"] > 0
    assert p.counters.source_stalls == h["stalls"]
    assert store.camera_health()[(FLEET, "rtsp-1")]["cameras"][""].stalls == h["stalls"]
    text = prometheus.render(view.prometheus_state())
    assert f'edgekit_camera_stalls_total{{fleet="{FLEET}",device="rtsp-1",camera=""}} {h["stalls"]}' in text
    store.close()
