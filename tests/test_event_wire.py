"""Zone and line events on the wire: the message model, the publisher's spool, a real Mosquitto, the fleet's stores.

Events go out at least once; each carries a stable id, so the fleet stores each one once: across a
broker outage (JSON and Sparkplug), when a device that crashed before its acks resends all of them,
and in SQLite as in PostgreSQL.  The dashboard's JSON lists them per device and camera, and adds
up the ``count`` events per zone over time.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from edgekit.events.event import Event, event_id
from edgekit.fleet import Collector
from edgekit.fleet.mqtt import FleetSubscriber
from edgekit.fleet.open_store import open_store
from edgekit.fleet.store import FleetStore
from edgekit.fleet.view import FleetView
from edgekit.protocol import sparkplug as sp
from edgekit.protocol.broker import BrokerConfig
from edgekit.protocol.messages import EventMessage, ValidationError
from edgekit.telemetry.event_queue import EventQueue, event_body
from edgekit.telemetry.publisher import TelemetryPublisher
from edgekit.telemetry.spool import Spool
from edgekit.testing.mosquitto import Mosquitto

T = 1_764_490_000.0


def crossing(n: int, camera: str = "gate", t: float = T) -> Event:
    """The ``n``-th car crossing the line ``stop`` of ``camera`` (track ``n``), at ``t + n``."""
    return Event(
        id=event_id(camera, "cross", "stop", n, t, 1),
        kind="cross",
        camera=camera,
        zone="stop",
        t=t + n,
        frame_index=30 * n,
        track_id=n,
        class_name="car",
        direction="in" if n % 2 else "out",
        box=(10.0, 20.0, 110.0, 90.0),
    )


def count(start: float, camera: str = "gate", enter: int = 2, occupancy: int = 1, cars_in: int = 3) -> Event:
    """A ``count`` event of the minute from ``start``: the zone ``bay`` and the line ``stop``."""
    return Event(
        id=event_id(camera, "count", start),
        kind="count",
        camera=camera,
        zone=None,
        t=start + 60,
        frame_index=int(start),
        since_t=start,
        counts={
            "zones": {
                "bay": {
                    "enter": {"person": enter},
                    "leave": {"person": 1},
                    "occupancy": {"person": occupancy},
                }
            },
            "lines": {"stop": {"in": {"car": cars_in}, "out": {}}},
        },
    )


def body_of(event: Event, seq: int = 0, device: str = "cam-1") -> dict[str, Any]:
    return event_body(event.to_dict(), device=device, fleet="lab", session="s1", epoch="e1", seq=seq)


# -- the message ------------------------------------------------------------------------------


def test_an_event_message_is_checked_and_bounded() -> None:
    body = body_of(crossing(1))
    assert EventMessage.model_validate(body).id == crossing(1).id
    assert body["schema"] == "edgekit/v1/event" and body["box"] == [10.0, 20.0, 110.0, 90.0]
    EventMessage.model_validate(body_of(count(T)))
    bad = {
        "not a uuid": {"id": "42"},
        "an unknown kind": {"kind": "teleport"},
        "a crossing without a direction": {"direction": None},
        "a crossing without a line": {"zone": None},
        "a long class name": {"class_name": "x" * 65},
        "a negative frame": {"frame_index": -1},
        "a three-number box": {"box": [1.0, 2.0, 3.0]},
    }
    for what, change in bad.items():
        with pytest.raises(ValidationError):
            EventMessage.model_validate(body | change)
            pytest.fail(f"{what} was accepted")
    many_zones = {f"z{i}": {"enter": {"person": 1}} for i in range(65)}
    with pytest.raises(ValidationError):
        EventMessage.model_validate(body_of(count(T)) | {"counts": {"zones": many_zones, "lines": {}}})
    with pytest.raises(ValidationError):  # a count event needs its counts
        EventMessage.model_validate(body_of(count(T)) | {"counts": None})


def test_an_event_cannot_speak_for_another_device() -> None:
    forged = crossing(1).to_dict() | {"device": "cam-9", "seq": 10**6, "schema": "edgekit/v1/telemetry"}
    body = event_body(forged, device="cam-1", fleet="lab", session="s1", epoch="e1", seq=3)
    assert (body["device"], body["seq"], body["schema"]) == ("cam-1", 3, "edgekit/v1/event")
    assert next(iter(body)) == "schema"


def test_the_queue_is_bounded_and_counts_what_it_dropped() -> None:
    queue = EventQueue(max_events=3)
    for n in range(5):
        queue.put(crossing(n))
    assert queue.dropped == 2
    assert [e["track_id"] for e in queue.take()] == [2, 3, 4]  # the oldest went
    assert len(queue) == 0


def test_a_sparkplug_event_carries_the_json_message_and_its_key_fields() -> None:
    body = body_of(crossing(3))
    payload = sp.encode(sp.event_metrics(body), 7)
    _, metrics = sp.read_metrics(payload)
    assert sp.is_event(metrics) and sp.event_body(metrics) == body
    assert metrics["event/id"] == body["id"] and metrics["event/zone"] == "stop"
    assert metrics["event/t"] == pytest.approx(T + 3)
    assert set(metrics) == set(sp.EVENT_METRICS)  # what DBIRTH declares, nothing more


# -- the store: SQLite and PostgreSQL ----------------------------------------------------------------


@pytest.fixture
def store(store_url: str) -> Iterator[FleetStore]:
    s = open_store(store_url)
    yield s
    s.close()


def test_the_store_keeps_each_event_once_lists_them_and_counts_zones(store: FleetStore) -> None:
    collector = Collector(store)
    topic = "edgekit/v1/lab/cam-1/events"
    for n in range(1, 6):
        assert collector.handle(topic, json.dumps(body_of(crossing(n), seq=n)).encode(), T + n) == "event"
    # The same events again, as a device that replays its spool sends them (new seqs: same ids).
    for n in range(1, 6):
        again = json.dumps(body_of(crossing(n), seq=10 + n)).encode()
        assert collector.handle(topic, again, T + 20) == "duplicate-event"
    # Another device's event with the same id (the same footage): its own.
    other = json.dumps(body_of(crossing(1), device="cam-2")).encode()
    assert collector.handle("edgekit/v1/lab/cam-2/events", other, T) == "event"
    # Another camera of the same device, and per-minute counts.
    assert collector.handle(topic, json.dumps(body_of(crossing(9, camera="yard"))).encode(), T) == "event"
    B = T // 600 * 600  # a whole ten minutes: the steps below start at B
    for i, start in enumerate((B, B + 60, B + 120)):
        c = json.dumps(body_of(count(start, enter=2 + i, occupancy=i))).encode()
        assert collector.handle(topic, c, start + 60) == "event"

    listed = store.events("lab", "cam-1", camera="gate", kinds=["cross"])
    assert [e["track_id"] for e in listed] == [5, 4, 3, 2, 1]  # newest first, each once
    assert listed[0]["received"] == T + 5 and listed[0]["direction"] == "in"
    assert [e["camera"] for e in store.events("lab", "cam-1", camera="yard")] == ["yard"]
    assert len(store.events("lab", "cam-1", limit=2)) == 2
    assert len(store.events("lab", "cam-2")) == 1

    counts = store.zone_counts("lab", "cam-1", B, B + 300, 120)
    bay = counts["cameras"]["gate"]["zones"]["bay"]
    # Steps of 120 s: the interval ending at B+60 | those ending at B+120 and B+180.
    assert [s["t0"] for s in bay] == [B, B + 120]
    assert [s["enter"] for s in bay] == [2, 3 + 4]
    assert [s["occupancy"] for s in bay] == [0, 2]  # the highest, not a sum
    assert bay[1]["classes"]["person"]["leave"] == 2
    stop = counts["cameras"]["gate"]["lines"]["stop"]
    assert [s["in"] for s in stop] == [3, 6] and [s["out"] for s in stop] == [0, 0]
    assert "yard" not in counts["cameras"]

    # Kept as long as rollups, by the time they report.
    before = store.events("lab", "cam-1", limit=1000)
    keep = [e for e in before if e["t"] >= B + 150]
    assert store.compact(B + 150 + 86400, keep_s=86400)["events_deleted"] == len(before) - len(keep) > 0
    assert store.events("lab", "cam-1", limit=1000) == keep


def test_a_bad_event_is_rejected_and_counted(store: FleetStore) -> None:
    collector = Collector(store)
    good = body_of(crossing(1))
    topic = "edgekit/v1/lab/cam-1/events"
    assert collector.handle(topic, json.dumps(good | {"schema": "edgekit/v1/events"}).encode()) == (
        "rejected:schema-version"
    )
    assert (
        collector.handle(topic, json.dumps(good | {"device": "cam-9"}).encode()) == "rejected:device-mismatch"
    )
    assert collector.handle(topic, json.dumps(good | {"kind": "teleport"}).encode()) == "rejected:bad-field"
    assert store.events("lab", "cam-1") == []


def test_a_sparkplug_event_is_stored_once_and_a_forged_one_refused() -> None:
    store = FleetStore()
    collector = Collector(store)
    ddata = "spBv1.0/lab/DDATA/cam-1/pipeline"
    body = body_of(crossing(2))
    assert collector.handle(ddata, sp.encode(sp.event_metrics(body), 1)) == "event"
    assert collector.handle(ddata, sp.encode(sp.event_metrics(body | {"seq": 5}), 2)) == "duplicate-event"
    other = sp.encode(sp.event_metrics(body_of(crossing(3), device="cam-9")), 3)
    assert collector.handle(ddata, other) == "rejected:sparkplug-parse"
    not_an_object = sp.encode(sp.event_metrics(body) | {"event/json": "[1, 2]"}, 4)
    assert collector.handle(ddata, not_an_object) == "rejected:sparkplug-parse"
    bad_field = sp.encode(sp.event_metrics(body_of(crossing(4)) | {"kind": "teleport"}), 5)
    assert collector.handle(ddata, bad_field) == "rejected:bad-field"
    assert [e["track_id"] for e in store.events("lab", "cam-1")] == [2]


# -- a real broker, a real outage ----------------------------------------------------------------


def wait_until(done: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextmanager
def collecting(broker: Mosquitto, store: FleetStore) -> Iterator[Collector]:
    """A Collector fed by the fleet's own subscriber (a persistent session: the broker queues for it)."""
    collector = Collector(store)
    sub = FleetSubscriber(BrokerConfig.from_url(broker.url), collector.handle, client_id="event-collector")
    sub.start()
    try:
        yield collector
    finally:
        sub.stop()


def publisher(broker: Mosquitto, spool: Path, format: str) -> TelemetryPublisher:
    return TelemetryPublisher(
        BrokerConfig.from_url(broker.url),
        device_id="cam-1",
        fleet="lab",
        interval_s=0.5,
        spool=Spool(spool),
        format=format,
    )


@pytest.mark.parametrize("format", ["json", "sparkplug"])
def test_events_across_a_broker_outage_are_stored_once_each(tmp_path: Path, format: str) -> None:
    broker = Mosquitto(tmp_path).start()
    store = FleetStore(tmp_path / "fleet.db")
    pub = publisher(broker, tmp_path / "spool.db", format)
    try:
        with collecting(broker, store) as collector:
            subscribed = time.time()
            pub.start()
            stored = lambda: len(store.events("lab", "cam-1", limit=1000))  # noqa: E731
            for n in range(10):
                pub.publish_event(crossing(n))
            assert wait_until(lambda: stored() == 10), collector.stats()
            # The broker keeps the collector's session (and what it queues for it) across the kill only
            # once its autosave (every second or two) wrote the subscription down.
            saved = tmp_path / "mosquitto.db"
            assert wait_until(lambda: saved.exists() and saved.stat().st_mtime > subscribed, 10)
            broker.kill()
            assert wait_until(lambda: not pub.connected, 10)
            for n in range(10, 30):  # during the outage: spooled
                pub.publish_event(crossing(n))
            assert wait_until(lambda: len(pub.spool) >= 20, 10)
            broker.start()
            for n in range(30, 40):
                pub.publish_event(crossing(n))
            assert wait_until(lambda: stored() == 40, 40), (stored(), collector.stats())
            pub.stop()
            time.sleep(0.5)
            events = store.events("lab", "cam-1", limit=1000)
            assert sorted(e["track_id"] for e in events) == list(range(40))  # each once, none lost
            seqs = sorted(e["seq"] for e in events)
            assert seqs == list(range(40))  # numbered in the order they were made
            assert pub.events_spooled == 40 and pub.events.dropped == 0
            assert collector.seen["event"] == 40
            assert collector.seen["telemetry"] >= 1  # windows went on alongside
    finally:
        pub.stop()
        broker.stop()
        store.close()


def test_a_device_that_resends_after_a_crash_adds_no_event(tmp_path: Path, store_url: str) -> None:
    """Sent and received, but the device died before the acks reached its spool: it sends them all again."""
    broker = Mosquitto(tmp_path).start()
    store = open_store(store_url)
    first = publisher(broker, tmp_path / "spool.db", "json")
    try:
        for n in range(15):
            first.publish_event(crossing(n))
        first._spool_events()  # what its thread does first: the events are in the spool, numbered
        # The spool as the crashed device left it: every event still unacknowledged.
        with sqlite3.connect(tmp_path / "spool.db") as db, sqlite3.connect(tmp_path / "crashed.db") as copy:
            db.backup(copy)
        with collecting(broker, store) as collector:
            first.start()
            stored = lambda: len(store.events("lab", "cam-1", limit=1000))  # noqa: E731
            assert wait_until(lambda: stored() == 15), collector.stats()
            first.stop()
            again = publisher(broker, tmp_path / "crashed.db", "json").start()
            try:
                assert wait_until(lambda: collector.seen["duplicate-event"] == 15), collector.stats()
                assert wait_until(lambda: len(again.spool) == 0, 10)
            finally:
                again.stop()
            assert stored() == 15 and collector.seen["event"] == 15
    finally:
        first.stop()
        broker.stop()
        store.close()


# -- the dashboard's JSON ----------------------------------------------------------------------


def test_the_web_app_lists_events_per_camera_and_counts_per_zone() -> None:
    from fastapi.testclient import TestClient

    from edgekit.fleet.dashboard import create_app

    store = FleetStore()
    now = T + 600
    view = FleetView(store, clock=lambda: now)
    collector = Collector(store, listener=view)
    topic = "edgekit/v1/lab/cam-1/events"
    for n in range(1, 4):
        collector.handle(topic, json.dumps(body_of(crossing(n, t=T + 300), seq=n)).encode(), T + 300 + n)
    collector.handle(topic, json.dumps(body_of(crossing(1, camera="yard", t=T + 300))).encode(), T + 301)
    collector.handle(topic, json.dumps(body_of(count(T + 400, enter=5))).encode(), T + 460)
    view.tick()
    with TestClient(create_app(view), base_url="http://127.0.0.1") as client:
        page = client.get("/api/device/lab/cam-1/events?camera=gate&kind=cross").json()
        assert [e["track_id"] for e in page["events"]] == [3, 2, 1]
        assert page["camera"] == "gate" and page["events"][0]["id"] == crossing(3, t=T + 300).id
        every = client.get("/api/device/lab/cam-1/events?limit=2").json()["events"]
        assert len(every) == 2 and every[0]["kind"] == "count"
        yard = client.get("/api/device/lab/cam-1/events?camera=yard").json()["events"]
        assert [e["camera"] for e in yard] == ["yard"]
        zones = client.get("/api/device/lab/cam-1/zones?window=3600").json()
        assert [s["enter"] for s in zones["cameras"]["gate"]["zones"]["bay"]] == [5]
        assert zones["window_s"] == 3600 and zones["step_s"] == 60
        assert client.get("/api/device/lab/cam-1/events?kind=teleport").status_code == 400
        assert client.get("/api/device/lab/a..b/events").status_code == 400
        assert client.get("/api/device/lab/cam-1/events?camera=a..b").status_code == 400
        assert client.get("/api/device/lab/cam-1/events?limit=5000").status_code == 422
        assert client.get("/api/device/lab/nobody/events").json()["events"] == []
        metrics = client.get("/metrics").text
    crossed = 'edgekit_events_total{fleet="lab",device="cam-1",camera="gate",zone="stop",kind="cross"} 3'
    assert crossed in metrics.splitlines()
    assert 'edgekit_events_total{fleet="lab",device="cam-1",camera="gate",zone="",kind="count"} 1' in metrics
    parser = pytest.importorskip("prometheus_client.parser", reason="pip install prometheus-client")
    kinds = {f.name: f.type for f in parser.text_string_to_metric_families(metrics)}
    assert kinds["edgekit_events"] == "counter"
    # A duplicate is not counted again; places a device makes up without end are bounded.
    collector.handle(topic, json.dumps(body_of(crossing(1, t=T + 300), seq=99)).encode(), T + 500)
    for i in range(300):
        view.event("lab", "cam-1", {"camera": "gate", "zone": f"z{i}", "kind": "enter"}, T)
    totals = {(d.fleet, d.device): d for d in view.prometheus_state()}[("lab", "cam-1")].events
    assert totals[("gate", "stop", "cross")] == 3
    # 256 places, then one "other" per kind.
    assert len(totals) == 256 + 1 and totals[("other", "other", "enter")] == 300 - (256 - 3)


def test_the_fleet_server_shows_a_device_s_events_on_its_page(tmp_path: Path) -> None:
    """`edgekit fleet serve` collects events from a real broker; its JSON and the device page show them."""
    browser_test = pytest.importorskip("test_fleet_browser", reason="selenium and chromium are needed")
    import urllib.request

    from chromium import open_chromium

    broker = Mosquitto(tmp_path).start()
    procs = browser_test.Processes(tmp_path)
    driver = None
    pub = publisher(broker, tmp_path / "spool.db", "json")
    try:
        url = browser_test._serve(procs, broker.url, tmp_path / "fleet.db")
        pub.start()
        now = time.time()
        for n in range(1, 4):
            pub.publish_event(crossing(n, t=now - 10))
        pub.publish_event(count(now - 70, enter=4, cars_in=7))

        def listed() -> list[dict[str, Any]]:
            with urllib.request.urlopen(url + "/api/device/lab/cam-1/events", timeout=5) as resp:
                events: list[dict[str, Any]] = json.loads(resp.read())["events"]
            return events

        assert wait_until(lambda: len(listed()) == 4), listed()
        assert [e["kind"] for e in listed()] == ["cross", "cross", "cross", "count"]  # newest first

        driver = open_chromium(tmp_path)
        driver.get(url + "/#/device/lab/cam-1")

        def rows(table: str) -> list[list[str]]:
            found = driver.find_elements("css selector", f"#{table} tbody tr")
            return [[td.text for td in tr.find_elements("tag name", "td")] for tr in found]

        assert wait_until(lambda: len(rows("dev-events-table")) == 4, 30), rows("dev-events-table")
        newest = rows("dev-events-table")[0]
        assert newest[1:4] == ["gate", "cross", "stop"] and "car #3" in newest[4]
        zones = {r[1]: r for r in rows("dev-zones-table")}
        assert zones["bay"][2:5] == ["4", "1", "1"] and zones["stop"][5:] == ["7", "0"]
        assert driver.find_element("id", "dev-events").is_displayed()
        assert browser_test._js_errors(driver) == []
        browser_test._save(driver, tmp_path, "events")
    finally:
        if driver is not None:
            driver.quit()
        pub.stop(timeout=1.0)
        procs.stop_all()
        broker.stop()
