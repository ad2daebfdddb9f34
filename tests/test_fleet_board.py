"""The large-fleet API over the store (``edgekit.fleet.board``), on SQLite and on a real PostgreSQL:
births become filterable columns, the newest window's figures sort devices worst first, pages cover
every device once, a fleet's summary is the merge of what compaction rolled up, and alerts are
grouped.  Then the backfill tool (a real PostgreSQL) and the HTTP routes over it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from postgres import PostgresServer
from test_fleet_store import payload

from edgekit.fleet.board import FleetBoard
from edgekit.fleet.dashboard import create_app
from edgekit.fleet.open_store import open_store
from edgekit.fleet.store import FleetStore
from edgekit.fleet.view import FleetView
from edgekit.testing.fleet_backfill import Plan, backfill

T = 1_764_489_600.0  # a whole hour: rollups are per whole minute and hour


def birth(profile: str, model: str, version: str, budget: float, site: str) -> dict[str, Any]:
    return {
        "profile": profile,
        "backend": "onnxruntime",
        "model": {"name": model, "version": version},
        "budget_ms": budget,
        "labels": {"site": site},
    }


# name -> (birth, median latency ms, missed per window)
DEVICES = {
    "cam-a": (birth("x86_64-cpu", "yolov8n", "1.2.0", 33, "lobby"), 10.0, 0),
    "cam-b": (birth("x86_64-cpu", "yolov8n", "1.3.0", 33, "dock"), 40.0, 3),  # over its budget
    "cam-c": (birth("rpi5", "mobilenet", "0.9", 100, "dock"), 60.0, 0),  # slower, but within its own budget
    "cam-d": (birth("rpi5", "mobilenet", "0.9", 100, "yard"), 20.0, 9),
}


@pytest.fixture
def store(store_url: str) -> Iterator[FleetStore]:
    s = open_store(store_url)
    rng = np.random.default_rng(3)
    for name, (b, median, missed) in DEVICES.items():
        s.set_state("lab", name, "online", T, b)
        rows = []
        for seq in range(12):  # two minutes of 10 s windows
            stop = T + 10 * (seq + 1) - 0.5
            p = payload(name, seq, stop, rng.lognormal(np.log(median), 0.1, 300), missed=missed)
            rows.append(("lab", name, p, json.dumps(p), stop))
        s.add_windows(rows)
    s.set_state("lab", "cam-d", "offline", T + 200, None)
    yield s
    s.close()


def names(page: dict[str, Any]) -> list[str]:
    return [r["device"] for r in page["devices"]]


def test_devices_sort_worst_first_against_each_ones_own_budget(store: FleetStore) -> None:
    board = FleetBoard(store, clock=lambda: T + 300)
    worst = board.devices()
    assert worst["total"] == 4
    assert names(worst)[0] == "cam-b"  # 40 ms against 33, while cam-c's 60 ms is within its 100
    ratios = [r["over_budget"] for r in worst["devices"]]
    assert ratios == sorted(ratios, reverse=True)
    b = worst["devices"][0]
    assert (
        b["site"] == "dock" and b["model"] == "yolov8n" and b["version"] == "1.3.0" and b["budget_ms"] == 33
    )
    assert 36 < b["p99"] < 60 and b["p50"] < b["p99"]
    assert b["missed_share"] == pytest.approx(3 / 300)
    assert names(board.devices(sort="missed"))[:2] == ["cam-d", "cam-b"]
    assert names(board.devices(sort="p99"))[0] == "cam-c"


def test_devices_filter_search_and_page(store: FleetStore) -> None:
    board = FleetBoard(store)
    assert names(board.devices(sort="device", profile="rpi5")) == ["cam-c", "cam-d"]
    assert names(board.devices(sort="device", q="DOCK")) == ["cam-b", "cam-c"]  # a site, any case
    assert names(board.devices(sort="device", q="1.3")) == ["cam-b"]  # a version
    assert names(board.devices(sort="device", q="%")) == []  # LIKE's wildcard is a plain character
    assert names(board.devices(state="offline")) == ["cam-d"]
    seen = [n for off in (0, 3) for n in names(board.devices(sort="worst", limit=3, offset=off))]
    assert sorted(seen) == sorted(DEVICES)  # pages cover every device exactly once
    with pytest.raises(ValueError, match="sort is one of"):
        board.devices(sort="nope")


def test_a_device_page_has_its_series_and_a_summary_merges_what_compaction_rolled_up(
    store: FleetStore,
) -> None:
    board = FleetBoard(store, clock=lambda: T + 300)
    page = board.device("lab", "cam-a", "1h")
    assert page is not None and page["birth"]["labels"]["site"] == "lobby"
    assert [s["t"] for s in page["series"]] == [T, T + 60]  # minute steps of the 1h range
    assert sum(s["frames"] for s in page["series"]) == 12 * 300
    assert board.device("lab", "nobody") is None

    # Nothing rolled up yet: the summary covers compacted telemetry only.
    assert board.summary(since=T - 3600, until=T + 3600)["windows"] == 0
    store.compact(T + 7200, raw_keep_s=0, levels=((60, 86400), (3600, 30 * 86400)))
    s = board.summary(since=T - 3600, until=T + 3600)
    merged = store.merged(since=T - 3600, until=T + 3600)
    assert s["windows"] == 4 * 12 and s["frames"] == merged.count == 4 * 12 * 300
    for q in (0.5, 0.95, 0.99):
        assert s[f"p{round(q * 100)}"] == pytest.approx(merged.quantile(q), abs=1e-3)
    assert s["missed_share"] == pytest.approx(12 * (3 + 9) / (4 * 12 * 300))
    assert s["states"] == {"online": 3, "offline": 1} and s["over_budget"] == 1
    # Compacted again later, minutes merge into hours: the same sums, one row a fleet and hour.
    store.compact(T + 3 * 86400, raw_keep_s=0, levels=((60, 86400), (3600, 30 * 86400)))
    again = board.summary(since=T - 3600, until=T + 7200)
    assert (again["frames"], again["p99"]) == (s["frames"], s["p99"])


def test_alerts_are_grouped_by_kind(store: FleetStore) -> None:
    for n in range(12):
        store.set_state("lab", f"gone-{n:02d}", "offline", T + n, birth("rpi5", "m", "1", 50, "yard"))
    alerts = {a["kind"]: a for a in FleetBoard(store).alerts()}
    assert alerts["offline"]["count"] == 13  # twelve gone and cam-d: one alert
    assert len(alerts["offline"]["members"]) == 13
    assert [m["device"] for m in alerts["over_budget"]["members"]] == ["cam-b"]


@pytest.fixture(scope="module")
def backfilled(pg_server: PostgresServer) -> tuple[str, dict[str, Any]]:
    url = pg_server.new_database()
    plan = Plan(devices=300, days=1, minute_hours=2, raw_minutes=10, fleets=2, now=T)
    return url, backfill(url, plan)


def test_backfill_writes_what_compaction_would_have_left(backfilled: tuple[str, dict[str, Any]]) -> None:
    url, done = backfilled
    assert done["devices"] == 300
    assert (done["hour_rollups_per_device"], done["minute_rollups_per_device"]) == (22, 110)
    assert done["raw_windows_per_device"] == 60
    store = open_store(url)
    try:
        board = FleetBoard(store, clock=lambda: T)
        page = board.devices(limit=500)
        assert page["total"] == 300 and len({r["device"] for r in page["devices"]}) == 300
        states = {r["state"] for r in page["devices"]}
        assert states == {"online", "offline"}
        assert any(r["over_budget"] > 1 for r in page["devices"] if r["over_budget"] is not None)
        # Its fleet rollups are the merge of its device rollups (as compaction writes them).
        until = T - 600
        s = board.summary(fleet="fleet-1", since=T - 86400, until=until)
        merged = store.merged(fleet="fleet-1", since=T - 86400, until=until)
        assert s["frames"] == merged.count
        assert s["p99"] == pytest.approx(merged.quantile(0.99), abs=1e-3)
        # A device's day at 15 min steps: an hour rollup each, minutes 15 to a step, the raw windows' step.
        dev = board.device("fleet-0", "cam-00000", "1d")
        assert dev is not None
        ts = [p["t"] for p in dev["series"]]
        assert ts == sorted(set(ts)) and 22 + 110 // 15 <= len(ts) <= 22 + 110 // 15 + 2
        # The windows are real: a replay of a rolled-up seq is still a duplicate.
        assert store.seqs("fleet-0", "cam-00000", above=-1)[0] == 0
    finally:
        store.close()


def test_the_v2_routes_answer_from_the_store(backfilled: tuple[str, dict[str, Any]]) -> None:
    url, _ = backfilled
    store = open_store(url)
    try:
        app = create_app(
            FleetView(None), allowed_hosts=["testserver"], board=FleetBoard(store, clock=lambda: T)
        )
        with TestClient(app) as client:
            page = client.get(
                "/api/v2/devices", params={"sort": "missed", "limit": 10, "profile": "rpi5"}
            ).json()
            assert page["total"] > 0 and {r["profile"] for r in page["devices"]} == {"rpi5"}
            shares = [r["missed_share"] for r in page["devices"]]
            assert shares == sorted(shares, reverse=True)
            assert client.get("/api/v2/devices", params={"sort": "x"}).status_code == 400
            assert client.get("/api/v2/devices", params={"colour": "red"}).status_code == 400
            assert client.get("/api/v2/device/fleet-0/cam-00000", params={"range": "7d"}).status_code == 200
            assert client.get("/api/v2/device/fleet-0/nobody").status_code == 404
            assert client.get("/api/v2/device/fleet-0/cam-00000", params={"range": "2y"}).status_code == 400
            summary = client.get("/api/v2/summary").json()
            assert summary["devices"] == 300 and summary["p99"] is not None
            alerts = client.get("/api/v2/alerts").json()["alerts"]
            assert {a["kind"] for a in alerts} <= {"offline", "over_budget"} and alerts
            assert client.get("/board").status_code == 200
    finally:
        store.close()


def test_groups_count_devices_in_trouble_per_site(store: FleetStore) -> None:
    groups = {g["key"]: g for g in FleetBoard(store).groups("site")}
    assert groups["dock"] == {
        "key": "dock",
        "devices": 2,
        "offline": 0,
        "over_budget": 1,
        "worst": groups["dock"]["worst"],
    }
    assert groups["dock"]["worst"] > 1  # cam-b's p99 over its 33 ms
    assert groups["yard"]["offline"] == 1 and groups["lobby"]["over_budget"] == 0
    assert [g["key"] for g in FleetBoard(store).groups("profile")] == ["x86_64-cpu", "rpi5"]  # worst first
    with pytest.raises(ValueError, match="group by one of"):
        FleetBoard(store).groups("colour")


def test_a_window_s_figures_are_its_sketch_s_quantiles() -> None:
    from edgekit.core.sketch import LatencySketch
    from edgekit.fleet.latest import figures

    rng = np.random.default_rng(5)
    for n, spread in ((1, 0.1), (7, 2.0), (300, 0.3), (300, 1.5)):
        w = payload("a", 0, T, rng.lognormal(3, spread, n))["window"]
        sketch = LatencySketch.from_dict(w["latency_ms"])
        assert figures(w) == tuple(round(sketch.quantile(q), 3) for q in (0.5, 0.95, 0.99))
    zeros = payload("a", 0, T, np.array([0.0, 0.0, 0.0, 5.0]))["window"]
    assert figures(zeros) == (0.0, 0.0, 0.0)  # 3 of 4 are zero: rank 0.99 * 3 falls among them
    some = payload("a", 0, T, np.array([0.0, 5.0, 5.0, 5.0]))["window"]
    assert figures(some)[0] == pytest.approx(5.0, rel=0.01) and figures(some)[2] == 5.0
    # Buckets listed out of key order (not edgekit's to_dict) give the same answer.
    w = payload("a", 0, T, rng.lognormal(3, 1.0, 300))["window"]
    expected = figures(w)
    w["latency_ms"]["buckets"] = dict(reversed(list(w["latency_ms"]["buckets"].items())))
    assert figures(w) == expected
    empty = {"latency_ms": LatencySketch().to_dict()}
    assert figures(empty) == (None, None, None)
