"""Per-camera telemetry on the fleet side (issue 20): a many-camera device's windows through a real Mosquitto
into the collector and its store (SQLite and PostgreSQL, raw and rolled up), and through ``edgekit fleet
serve`` onto the device page (JSON, and the table headless Chromium draws) and ``/metrics``.  A single-source
device has no cameras section and no camera series.

The windows are made by hand to the wire contract (``Window.cameras``), their sketches from real samples:
each camera's expected percentiles are those of all its samples together (a merge, never an average).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgekit.core.sketch import LatencySketch
from edgekit.fleet import Collector
from edgekit.fleet.open_store import open_store
from edgekit.fleet.store import FleetStore
from edgekit.protocol.stages import STAGES
from edgekit.testing.mosquitto import Mosquitto, free_port
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT

FLEET = "lab"
# One time step (or rollup) holding every window of the test: about 31 years, so no day or week boundary splits them.
ALL = 1e9
MANY, SOLO = "cams-2", "cam-solo"
BUDGET_MS = 33.3
RNG = np.random.default_rng(20)
# Per window, per camera: (latency samples in ms, frames its slot dropped).  Two windows of two cameras.
WINDOWS: list[dict[str, tuple[np.ndarray, int]]] = [
    {"front": (RNG.gamma(4.0, 5.0, 40), 2), "back": (RNG.gamma(9.0, 4.0, 30), 0)},
    {"front": (RNG.gamma(4.0, 5.0, 35), 1), "back": (RNG.gamma(9.0, 4.0, 25), 3)},
]


def sketch_of(samples: np.ndarray) -> LatencySketch:
    s = LatencySketch()
    s.extend(samples.tolist())
    return s


def expected(camera: str) -> dict[str, Any]:
    """The camera's figures over both windows, its percentiles from all its samples."""
    samples = np.concatenate([w[camera][0] for w in WINDOWS])
    s = sketch_of(samples)
    return {
        "frames": len(samples),
        "missed": int((samples > BUDGET_MS).sum()),
        "dropped": sum(w[camera][1] for w in WINDOWS),
        "p50": s.quantile(0.5),
        "p99": s.quantile(0.99),
    }


def telemetry(device: str, seq: int, stop: float, cameras: dict[str, tuple[np.ndarray, int]] | None) -> bytes:
    """A telemetry body to the wire contract: ``cameras`` only for a many-camera device."""
    parts = cameras or {"": (RNG.gamma(4.0, 5.0, 50), 0)}
    samples = np.concatenate([lat for lat, _ in parts.values()])
    window: dict[str, Any] = {
        "start": stop - 1.0,
        "end": stop,
        "frames": len(samples),
        "missed": int((samples > BUDGET_MS).sum()),
        "fps": float(len(samples)),
        "latency_ms": sketch_of(samples).to_dict(),
        "stages_ms": {name: sketch_of(samples / len(STAGES)).to_dict() for name in STAGES},
    }
    if cameras is not None:
        window["cameras"] = {
            name: {
                "frames": len(lat),
                "missed": int((lat > BUDGET_MS).sum()),
                "dropped": dropped,
                "latency_ms": sketch_of(lat).to_dict(),
            }
            for name, (lat, dropped) in cameras.items()
        }
    body = {
        "schema": "edgekit/v1/telemetry",
        "device": device,
        "fleet": FLEET,
        "session": "s1",
        "epoch": "0123456789ab",
        "seq": seq,
        "sent_at": stop,
        "window": window,
        "counters": {"frames": 0, "missed": 0, "dropped": 0},
    }
    return json.dumps(body).encode()


def status(device: str) -> bytes:
    body = {"schema": "edgekit/v1/status", "device": device, "fleet": FLEET, "state": "online"}
    return json.dumps(body | {"budget_ms": BUDGET_MS, "backend": "onnxruntime"}).encode()


def publish_fleet(port: int, now: float) -> None:
    """The two-camera device's two windows and the single-source device's one, through the broker (QoS 1)."""
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="devices")
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        messages = [
            (f"edgekit/v1/{FLEET}/{MANY}/status", status(MANY)),
            (f"edgekit/v1/{FLEET}/{SOLO}/status", status(SOLO)),
            *(
                (f"edgekit/v1/{FLEET}/{MANY}/telemetry", telemetry(MANY, seq, now - 5 + seq, w))
                for seq, w in enumerate(WINDOWS)
            ),
            (f"edgekit/v1/{FLEET}/{SOLO}/telemetry", telemetry(SOLO, 0, now - 4, None)),
        ]
        for topic, payload in messages:
            client.publish(topic, payload, qos=1).wait_for_publish(timeout=5)
    finally:
        client.disconnect()
        client.loop_stop()


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 15,
    errors: tuple[type[Exception], ...] = (OSError, ValueError, KeyError),
) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except errors as err:  # a server still starting, a page mid-render
            last, value = err, None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def assert_figures(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]) -> None:
    """Counts exactly; percentiles as a merged sketch gives them (the same buckets: equal but for float sums)."""
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert (g["frames"], g["missed"], g["dropped"]) == (w["frames"], w["missed"], w["dropped"]), name
        assert (g["p50"], g["p99"]) == pytest.approx((w["p50"], w["p99"]), rel=1e-9), name


def camera_figures(store: FleetStore) -> dict[str, dict[str, Any]]:
    """Each camera of the two-camera device as the store's buckets add it up (one step over all time)."""
    buckets = store.buckets(0, time.time() + 60, ALL, FLEET, MANY)
    assert len(buckets) == 1 and buckets[0].cameras is not None
    return {
        name: {
            "frames": t.frames,
            "missed": t.missed,
            "dropped": t.dropped,
            "p50": t.latency.quantile(0.5),
            "p99": t.latency.quantile(0.99),
        }
        for name, t in buckets[0].cameras.items()
    }


def test_a_two_camera_devices_windows_are_stored_per_camera_raw_and_rolled_up(
    tmp_path: Path, store_url: str, broker: Mosquitto
) -> None:
    store = open_store(store_url)
    collector = Collector(store)
    reader = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="collector")
    subscribed: list[bool] = []
    reader.on_connect = lambda c, u, f, rc, p: (c.subscribe("edgekit/v1/#", qos=1), subscribed.append(True))
    reader.on_message = lambda c, u, msg: collector.handle(msg.topic, msg.payload)
    reader.connect("127.0.0.1", broker.port)
    reader.loop_start()
    try:
        wait_for("the collector's subscription", lambda: subscribed)
        time.sleep(0.2)  # the SUBACK: a message published before it would not be delivered
        now = time.time()
        publish_fleet(broker.port, now)
        wait_for("three windows", lambda: collector.seen["telemetry"] == 3)
        collector.flush()
        assert not collector.rejected
        want = {name: expected(name) for name in ("front", "back")}
        assert_figures(camera_figures(store), want)
        solo = store.buckets(0, now + 60, ALL, FLEET, SOLO)
        assert len(solo) == 1 and solo[0].frames == 50 and solo[0].cameras is None

        # Rolled up, a camera's figures are the same: its rollup row holds its merged sketch.
        assert store.compact(now + 7200, raw_keep_s=0, rollup_s=ALL)["windows"] == 3
        assert_figures(camera_figures(store), want)
        assert store.buckets(0, now + 60, ALL, FLEET, SOLO)[0].cameras is None
        # A late window of the same day merges into that rollup's camera rows, not beside them.
        late = {"front": (np.array([5.0, 6.0]), 4), "back": (np.array([90.0]), 0)}
        assert store.add_window(FLEET, MANY, json.loads(telemetry(MANY, 7, now - 2, late)), now)
        store.compact(now + 7200, raw_keep_s=0, rollup_s=ALL)
        figures = camera_figures(store)
        assert figures["front"]["frames"] == want["front"]["frames"] + 2
        assert figures["front"]["dropped"] == want["front"]["dropped"] + 4
        assert figures["back"]["frames"] == want["back"]["frames"] + 1
        # Merged into a coarser level's rollup, each camera's rows merge too (sketches, not percentiles).
        levels = ((ALL, 0.0), (2 * ALL, 30 * 86400.0))
        assert store.compact(now + 7200, raw_keep_s=0, levels=levels)["rollups_merged"] == 2
        assert_figures(camera_figures(store), figures)
    finally:
        reader.disconnect()
        reader.loop_stop()
        store.close()


def test_a_store_made_before_cameras_gains_them_as_it_opens(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = FleetStore(path)
    old._execute("DROP TABLE rollup_cameras")  # what a store of an earlier release has
    old.add_window(FLEET, SOLO, json.loads(telemetry(SOLO, 0, 1_764_490_000.0, None)), 1_764_490_000.0)
    old.close()
    store = FleetStore(path)
    try:
        store.add_window(
            FLEET, MANY, json.loads(telemetry(MANY, 0, 1_764_490_001.0, WINDOWS[0])), 1_764_490_001.0
        )
        store.compact(1_764_500_000.0, raw_keep_s=0, rollup_s=60)
        buckets = {b.device: b for b in store.buckets(0, 1_764_500_000.0, 86400)}
        assert buckets[SOLO].frames == 50 and buckets[SOLO].cameras is None
        cameras = buckets[MANY].cameras
        assert cameras is not None and {n: t.frames for n, t in cameras.items()} == {"front": 40, "back": 30}
    finally:
        store.close()


# -- edgekit fleet serve: the device page and /metrics -----------------------------------------


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``edgekit fleet serve`` fed by a real Mosquitto, after both devices published their windows."""
    tmp = tmp_path_factory.mktemp("serve")
    broker = Mosquitto(tmp).start()
    port = free_port()
    log = tmp / "serve.log"
    proc = subprocess.Popen(
        [*EDGEKIT, "fleet", "serve", "--mqtt", broker.url, "--db", str(tmp / "fleet.db"), "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("the server", lambda: json.loads(get(f"{url}/healthz"))["ok"], 60)
        time.sleep(0.5)  # its collector subscribes once connected
        publish_fleet(broker.port, time.time())
        wait_for(
            "the windows to reach the view",
            lambda: (
                'edgekit_windows_total{fleet="lab",device="cams-2"} 2' in get(f"{url}/metrics")
                and 'edgekit_windows_total{fleet="lab",device="cam-solo"} 1' in get(f"{url}/metrics")
            ),
        )
        yield url
    finally:
        stop_process(proc, grace_s=15, sig=signal.SIGINT)
        broker.stop()


def test_the_device_page_lists_each_camera_and_a_single_source_device_none(served: str) -> None:
    page = json.loads(get(f"{served}/api/device/{FLEET}/{MANY}"))
    rows = {r["name"]: r for r in page["cameras"]}
    assert list(rows) == ["back", "front"]
    for name, row in rows.items():
        want = expected(name)
        assert (row["frames"], row["missed"], row["dropped"]) == (
            want["frames"],
            want["missed"],
            want["dropped"],
        )
        assert row["p50"] == pytest.approx(want["p50"], abs=1e-3)
        assert row["p99"] == pytest.approx(want["p99"], abs=1e-3)
    assert json.loads(get(f"{served}/api/device/{FLEET}/{SOLO}"))["cameras"] is None


def test_metrics_has_camera_labelled_series_and_a_single_source_device_none(served: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(get(f"{served}/metrics")):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    assert types["edgekit_camera_frames"] == "counter"  # the parser names a counter without _total
    assert types["edgekit_camera_latency_seconds"] == "summary"
    for name in ("front", "back"):
        want = expected(name)
        who = {"fleet": FLEET, "device": MANY, "camera": name}

        at = {
            (s, dict(labels).get("quantile")): v
            for (s, labels), v in samples.items()
            if who.items() <= labels
        }

        assert at[("edgekit_camera_frames_total", None)] == want["frames"]
        assert at[("edgekit_camera_missed_total", None)] == want["missed"]
        assert at[("edgekit_camera_dropped_total", None)] == want["dropped"]
        assert at[("edgekit_camera_latency_seconds_count", None)] == want["frames"]
        assert at[("edgekit_camera_latency_seconds", "0.5")] == pytest.approx(want["p50"] / 1000)
        assert at[("edgekit_camera_latency_seconds", "0.99")] == pytest.approx(want["p99"] / 1000)
    cameras = {dict(labels)["device"] for (_, labels) in samples if "camera" in dict(labels)}
    assert cameras == {MANY}
    assert samples[("edgekit_frames_total", frozenset({"fleet": FLEET, "device": SOLO}.items()))] == 50


def test_the_dashboard_draws_the_camera_table_and_none_for_a_single_source_device(
    served: str, tmp_path: Path
) -> None:
    from chromium import open_chromium, require_chromium

    require_chromium()
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    driver = open_chromium(tmp_path)
    try:
        driver.get(f"{served}/#/device/{FLEET}/{MANY}")

        def table() -> dict[str, str] | None:
            rows = driver.find_elements(By.CSS_SELECTOR, "#dev-cameras-table tbody tr")
            if not rows or driver.find_element(By.ID, "dev-cameras").get_attribute("hidden") is not None:
                return None
            return {
                str(r.get_attribute("data-camera")): r.find_element(
                    By.CSS_SELECTOR, "[data-field=frames]"
                ).text
                for r in rows
            }

        drawn = wait_for("the camera table", table, errors=(WebDriverException,))
        assert drawn == {name: str(expected(name)["frames"]) for name in ("back", "front")}
        driver.get(f"{served}/#/device/{FLEET}/{SOLO}")
        wait_for(
            "the single-source device's page",
            lambda: driver.find_element(By.ID, "dev-title").text == f"{FLEET}/{SOLO}",
            errors=(WebDriverException,),
        )
        # Rendered: the subtitle says its backend (from its birth) once its page's JSON arrived.
        rendered = lambda: driver.find_element(By.ID, "dev-sub").text == "onnxruntime"  # noqa: E731
        wait_for("its page", rendered, errors=(WebDriverException,))
        assert driver.find_element(By.ID, "dev-cameras").get_attribute("hidden") is not None
        assert not driver.find_elements(By.CSS_SELECTOR, "#dev-cameras-table")
    finally:
        driver.quit()
