"""The fleet store, the same tests on SQLite and on a real PostgreSQL server: de-duplication, gaps,
epochs, merged percentiles, time buckets, compaction into rollups, and connection errors."""

from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from postgres import PASSWORD, PostgresServer

from edgekit.core.sketch import LatencySketch
from edgekit.errors import EdgekitError
from edgekit.fleet import Collector
from edgekit.fleet.open_store import open_store
from edgekit.fleet.sql import SCHEMA, StoreError, where_clause, window_row
from edgekit.fleet.store import FleetStore
from edgekit.fleet.sums import Bucket
from edgekit.protocol.stages import STAGES
from edgekit.testing.mosquitto import free_port

T = 1_764_490_000.0  # a real timestamp: a float4 column would round it by minutes
M = T + 20  # the first whole minute after T (rollups are per whole minute)
STAGE_SHARE = {"capture_wait": 0.1, "preprocess": 0.15, "inference": 0.6, "postprocess": 0.1, "sink": 0.05}


@pytest.fixture
def store(store_url: str) -> Iterator[FleetStore]:
    s = open_store(store_url)
    yield s
    s.close()


def payload(
    device: str, seq: int, stop: float, latencies: np.ndarray, epoch: str = "0123456789ab", missed: int = 0
) -> dict[str, Any]:
    """A telemetry body as a device sends it (sketches of real samples; stages a share of the latency)."""
    latency = LatencySketch()
    latency.extend(latencies)
    stages = {}
    for name in STAGES:
        s = LatencySketch()
        s.extend(latencies * STAGE_SHARE[name])
        stages[name] = s.to_dict()
    return {
        "schema": "edgekit/v1/telemetry",
        "device": device,
        "fleet": "lab",
        "session": "s1",
        "epoch": epoch,
        "seq": seq,
        "sent_at": stop,
        "window": {
            "start": stop - 1.0,
            "end": stop,
            "frames": len(latencies),
            "missed": missed,
            "fps": float(len(latencies)),
            "latency_ms": latency.to_dict(),
            "stages_ms": stages,
        },
        "counters": dict.fromkeys(
            (
                "frames",
                "met",
                "missed",
                "dropped",
                "source_reopens",
                "degrade_switches",
                "spool_dropped",
                "mqtt_disconnects",
            ),
            0,
        ),
        "gauges": {},
        "spool": {"pending": 0, "bytes": 0},
    }


def row(
    fleet: str, body: dict[str, Any], at: float | None = None
) -> tuple[str, str, dict[str, Any], str, float]:
    return (fleet, body["device"], body, json.dumps(body), body["window"]["end"] if at is None else at)


def close_to(got: float, want: float, rel: float = 0.01) -> bool:
    return abs(got - want) <= rel * abs(want) + 1e-12


class Feed:
    """Windows of two devices over ``minutes`` minutes, one every ``every_s``; keeps the raw samples."""

    def __init__(self, minutes: int, every_s: float = 20.0, seed: int = 3) -> None:
        rng = np.random.default_rng(seed)
        self.rows: list[tuple[str, str, dict[str, Any], str, float]] = []
        self.samples: list[tuple[str, float, np.ndarray, int]] = []  # device, stop, latencies, missed
        n = int(minutes * 60 / every_s)
        for device, mu, sigma in (("cam-a", 2.6, 0.25), ("cam-b", 3.2, 0.4)):
            for seq in range(n):
                stop = T + (seq + 1) * every_s
                lat = rng.lognormal(mu, sigma, int(rng.integers(20, 60)))
                missed = int((lat > 33).sum())
                self.rows.append(row("lab", payload(device, seq, stop, lat, missed=missed)))
                self.samples.append((device, stop, lat, missed))

    def union(self, device: str | None = None, since: float = -np.inf, until: float = np.inf) -> np.ndarray:
        parts = [lat for d, stop, lat, _ in self.samples if device in (None, d) and since <= stop <= until]
        return np.sort(np.concatenate(parts)) if parts else np.array([])


def test_open_store_opens_sqlite_for_a_path(tmp_path: Path) -> None:
    lite = open_store(tmp_path / "sub" / "fleet.db")
    assert type(lite) is FleetStore and (tmp_path / "sub" / "fleet.db").exists()
    lite.close()
    mem = open_store(":memory:")
    assert type(mem) is FleetStore
    mem.close()


def test_open_store_opens_postgres_for_a_url(pg_server: PostgresServer) -> None:
    from edgekit.fleet.pgstore import PostgresStore

    url = pg_server.new_database()
    for u in (url, url.replace("postgresql://", "postgres://", 1)):
        pg = open_store(u)
        assert isinstance(pg, PostgresStore) and PASSWORD not in pg.path and "***" in pg.path
        pg.close()


def test_duplicates_are_ignored_and_the_device_row_follows(store: FleetStore) -> None:
    lat = np.full(10, 12.0)
    store.set_state("lab", "cam-a", "online", T, {"model": {"name": "m"}})
    batch = [row("lab", payload("cam-a", s, T + s, lat), at=T + 100 + s) for s in (0, 1, 2, 1)]
    assert store.add_windows(batch) == 3  # seq 1 twice in one batch: stored once
    assert store.add_windows(batch[:2]) == 0
    assert store.add_window("lab", "cam-a", payload("cam-a", 3, T + 3, lat), T + 50) is True
    assert store.add_window("lab", "cam-a", payload("cam-a", 3, T + 3, lat), T + 60) is False
    assert store.seqs("lab", "cam-a") == [0, 1, 2, 3]
    assert store.seqs("lab", "cam-a", above=1) == [2, 3]
    d = store.device("lab", "cam-a")
    assert d is not None
    # last_seen and last_seq only move forward (a late batch does not move them back).
    assert d["last_seq"] == 3 and d["last_seen"] == T + 102
    assert d["birth"] == {"model": {"name": "m"}} and d["state"] == "online"
    assert store.merged(device="cam-a").count == 40
    # A seq beyond 32 bits (the collector accepts up to 2**63) is stored as it came.
    assert store.add_window("lab", "cam-a", payload("cam-a", 2**62, T + 4, lat), T + 4)
    assert store.seqs("lab", "cam-a", above=3) == [2**62]


def test_state_since_and_birth(store: FleetStore) -> None:
    assert store.device("lab", "cam-x") is None
    store.set_state("lab", "cam-x", "online", T, {"backend": "onnxruntime"})
    store.set_state("lab", "cam-x", "online", T + 5, None)  # still online: since stays, birth kept
    d = store.device("lab", "cam-x")
    assert d is not None and d["since"] == T and d["last_seen"] == T + 5
    assert d["birth"] == {"backend": "onnxruntime"}
    store.set_state("lab", "cam-x", "offline", T + 9, None)
    d = store.device("lab", "cam-x")
    assert d is not None and d["state"] == "offline" and d["since"] == T + 9
    store.set_state("lab", "cam-w", "online", T, None)
    assert [(r["fleet"], r["device"]) for r in store.devices()] == [("lab", "cam-w"), ("lab", "cam-x")]


def test_gaps_and_epochs(store: FleetStore) -> None:
    lat = np.full(5, 10.0)
    store.set_state("lab", "cam-e", "online", T, None)
    store.add_windows([row("lab", payload("cam-e", s, T + s, lat, epoch="aaaaaaaaaaaa")) for s in (0, 1, 4)])
    store.add_gap("lab", "cam-e", 2, 3, T + 4, "aaaaaaaaaaaa")
    store.add_gap("lab", "cam-e", 0, 0, T + 5, "bbbbbbbbbbbb")
    assert store.gaps("lab", "cam-e") == [(0, 0), (2, 3)]
    store.set_epoch("lab", "cam-e", "bbbbbbbbbbbb")
    d = store.device("lab", "cam-e")
    assert d is not None and d["epoch"] == "bbbbbbbbbbbb" and d["last_seq"] == -1
    # The new spool numbers from 0 again: the same seqs are new windows in the new epoch.
    assert (
        store.add_windows(
            [row("lab", payload("cam-e", s, T + 10 + s, lat, epoch="bbbbbbbbbbbb")) for s in (0, 1)]
        )
        == 2
    )
    assert store.seqs("lab", "cam-e", "aaaaaaaaaaaa") == [0, 1, 4]
    assert store.seqs("lab", "cam-e", "bbbbbbbbbbbb") == [0, 1]
    assert store.seqs("lab", "cam-e") == [0, 0, 1, 1, 4]


def test_merged_percentiles_are_those_of_the_raw_samples(store: FleetStore) -> None:
    feed = Feed(minutes=10)
    assert store.add_windows(feed.rows) == len(feed.rows)
    for device, since, until in ((None, None, None), ("cam-a", None, None), ("cam-b", T + 100, T + 400)):
        got = store.merged(fleet="lab", device=device, since=since, until=until)
        union = feed.union(device, since or -np.inf, until or np.inf)
        assert got.count == union.size
        for q in (0.5, 0.9, 0.99):
            assert close_to(got.quantile(q), union[int(q * (union.size - 1))])
    inference = store.merged(stage="inference")
    union = feed.union() * STAGE_SHARE["inference"]
    assert inference.count == union.size and close_to(
        inference.quantile(0.99), np.sort(union)[int(0.99 * (union.size - 1))]
    )
    assert store.merged(fleet="elsewhere").count == 0


def test_buckets_merge_each_device_per_step(store: FleetStore) -> None:
    feed = Feed(minutes=10)
    store.add_windows(feed.rows)
    step = 120.0
    buckets = store.buckets(T, T + 600, step)
    assert all(isinstance(b, Bucket) for b in buckets)
    assert [(b.device, b.t0) for b in buckets] == sorted((b.device, b.t0) for b in buckets)
    for b in buckets:
        mine = [
            (lat, m)
            for d, stop, lat, m in feed.samples
            if d == b.device and b.t0 <= stop < b.t0 + step and stop <= T + 600
        ]
        assert mine, b
        assert b.t0 % step == 0 and b.fleet == "lab"
        assert b.frames == sum(len(lat) for lat, _ in mine) == b.latency.count
        assert b.missed == sum(m for _, m in mine)
        union = np.sort(np.concatenate([lat for lat, _ in mine]))
        assert close_to(b.latency.quantile(0.99), union[int(0.99 * (union.size - 1))])
        assert set(b.stages) == set(STAGES) and b.stages["sink"].count == b.frames
    assert {b.device for b in store.buckets(T, T + 600, step, device="cam-b")} == {"cam-b"}
    assert store.buckets(T, T + 600, step, fleet="other") == []
    with pytest.raises(ValueError, match="step_s"):
        store.buckets(T, T + 600, 0)


def test_compaction_keeps_counts_and_percentiles_and_is_idempotent(store: FleetStore) -> None:
    feed = Feed(minutes=180)  # three hours, a window every 20 s per device
    store.add_windows(feed.rows)
    now = T + 180 * 60 + 1
    # A rollup is as fine as time gets once compacted: ranges that cut no minute in two count the same.
    ranges = [(None, None), (T, now), (M + 1200, M + 4800 - 1e-3)]
    before = [store.merged(since=a, until=b) for a, b in ranges]
    inference_before = store.merged(stage="inference")
    buckets_before = [
        (b.device, b.t0, b.frames, b.missed, b.latency.count) for b in store.buckets(T, now, 300)
    ]

    counts = store.compact(now, raw_keep_s=3600, rollup_s=60, keep_s=30 * 86400)
    old = [s for s in feed.samples if s[1] < now - 3600]
    assert counts["windows"] == len(old)
    assert counts["rollups"] == len({(d, int((stop // 60) * 60)) for d, stop, _, _ in old})
    assert counts["rollups_deleted"] == 0

    for (a, b), was in zip(ranges, before, strict=True):
        now_merged = store.merged(since=a, until=b)
        assert now_merged.count == was.count
        for q in (0.5, 0.95, 0.99):
            # Rollups add the same counts: the percentiles do not just stay close, they stay equal.
            assert close_to(now_merged.quantile(q), was.quantile(q), rel=1e-9)
    assert store.merged(stage="inference").quantile(0.99) == pytest.approx(
        inference_before.quantile(0.99), rel=1e-9
    )
    assert [
        (b.device, b.t0, b.frames, b.missed, b.latency.count) for b in store.buckets(T, now, 300)
    ] == buckets_before
    # Every seq is still known, rolled up or raw.
    n = len(feed.rows) // 2
    assert store.seqs("lab", "cam-a") == list(range(n))

    assert store.compact(now, raw_keep_s=3600, rollup_s=60) == {
        "windows": 0,
        "rollups": 0,
        "rollups_merged": 0,
        "rollups_deleted": 0,
        "gaps_deleted": 0,
        "events_deleted": 0,
        "partitions_dropped": 0,
    }
    assert store.merged().count == before[0].count


def test_a_late_window_is_merged_into_its_existing_rollup(store: FleetStore) -> None:
    lat = np.full(10, 20.0)
    # seqs 0..5, one every 10 s in one minute, seq 3 late.
    store.add_windows([row("lab", payload("cam-l", s, M + 10 * s + 1, lat)) for s in (0, 1, 2, 4, 5)])
    now = T + 7200
    assert store.compact(now)["rollups"] == 1
    assert store.add_window("lab", "cam-l", payload("cam-l", 3, M + 31, np.full(4, 50.0)), now) is True
    counts = store.compact(now)
    assert counts["windows"] == 1 and counts["rollups"] == 1
    (bucket,) = store.buckets(T - 60, now, 60)  # one row for the minute, not two
    assert bucket.frames == 54 and bucket.latency.count == 54
    assert store.merged().max == pytest.approx(50.0, rel=0.01)
    assert store.seqs("lab", "cam-l") == [0, 1, 2, 3, 4, 5]


def test_a_replay_of_a_compacted_window_is_a_duplicate(store: FleetStore) -> None:
    lat = np.full(8, 15.0)
    seqs = [0, 1, 2, 4, 5, 6]  # seq 3 never arrived before compaction
    bodies = {s: payload("cam-r", s, T + 5 * s, lat) for s in [*seqs, 3]}
    store.add_windows([row("lab", bodies[s]) for s in seqs])
    now = T + 3 * 3600
    assert store.compact(now)["windows"] == 6
    assert store.add_windows([row("lab", bodies[s]) for s in seqs]) == 0  # replayed: all known
    assert store.merged().count == 6 * 8
    # The window that filled a gap below the highest seq is new, though: the high-water mark alone would lose it.
    assert store.add_window("lab", "cam-r", bodies[3], now) is True
    assert store.seqs("lab", "cam-r") == [0, 1, 2, 3, 4, 5, 6]
    store.compact(now)
    assert store.add_window("lab", "cam-r", bodies[3], now) is False
    assert store.merged().count == 7 * 8


def test_a_restarted_collector_sees_a_replayed_compacted_window_as_a_duplicate(store_url: str) -> None:
    store = open_store(store_url)
    topic = "edgekit/v1/lab/cam-c/telemetry"
    bodies = [payload("cam-c", s, T + 5 * s, np.full(6, 11.0)) for s in range(10)]
    first = Collector(store)
    for b in bodies[:8]:
        assert first.handle(topic, json.dumps(b).encode(), now=T + 100) == "telemetry"
    first.flush()
    assert store.compact(T + 3 * 3600)["windows"] == 8
    again = Collector(store)  # a restart: it knows the devices only from the store
    assert again.handle(topic, json.dumps(bodies[5]).encode(), now=T + 200) == "duplicate"
    assert again.handle(topic, json.dumps(bodies[8]).encode(), now=T + 200) == "telemetry"
    again.flush()
    assert store.merged(device="cam-c").count == 9 * 6
    assert again.open_gaps("lab", "cam-c") == []
    store.close()


def test_retention_drops_rollups_and_gaps_past_keep(store: FleetStore) -> None:
    lat = np.full(3, 9.0)
    store.add_windows([row("lab", payload("cam-k", s, T + 60 * s, lat)) for s in range(5)])
    store.add_gap("lab", "cam-k", 7, 8, T + 10)
    counts = store.compact(T + 10 * 86400, raw_keep_s=3600, rollup_s=60, keep_s=86400)
    assert counts["windows"] == 5 and counts["rollups_deleted"] == 5 and counts["gaps_deleted"] == 1
    assert store.merged().count == 0 and store.buckets(T - 1e6, T + 1e6, 60) == []
    assert store.gaps("lab", "cam-k") == []


def test_a_failed_batch_stores_nothing_and_the_store_stays_usable(store: FleetStore) -> None:
    lat = np.full(4, 10.0)
    good = [row("lab", payload("cam-f", s, T + s, lat)) for s in range(3)]
    bad = payload("cam-f", 2**64, T + 9, lat)  # past any integer column
    with pytest.raises((OverflowError, *store.errors)):
        store.add_windows([*good, row("lab", bad)])
    assert store.seqs("lab", "cam-f") == []  # one transaction: none of the batch
    assert store.add_windows(good) == 3
    assert store.merged(device="cam-f").count == 12


def test_concurrent_writers_and_readers(store: FleetStore) -> None:
    lat = np.full(4, 10.0)
    errors: list[BaseException] = []

    def write(device: str) -> None:
        try:
            for start in range(0, 200, 20):
                store.add_windows(
                    [row("lab", payload(device, s, T + s, lat)) for s in range(start, start + 20)]
                )
                store.merged(device=device)
        except BaseException as err:  # noqa: BLE001 (reported by the main thread)
            errors.append(err)

    threads = [threading.Thread(target=write, args=(f"cam-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.merged().count == 4 * 200 * 4
    assert all(store.seqs("lab", f"cam-{i}") == list(range(200)) for i in range(4))


def test_a_dropped_postgres_connection_is_made_again(pg_server: PostgresServer) -> None:
    import psycopg

    store = open_store(pg_server.new_database())
    store.set_state("lab", "cam-d", "online", T, None)
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        dropped = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (store.url.rsplit("/", 1)[1],),
        ).fetchall()
    assert dropped == [(True,)]
    with pytest.raises(store.errors):
        store.device("lab", "cam-d")  # the call that finds the connection gone fails...
    d = store.device("lab", "cam-d")  # ...and the next one connects again
    assert d is not None and d["since"] == T
    store.close()


def test_connection_errors_say_what_to_do_and_hide_the_password(pg_server: PostgresServer) -> None:
    secret = "hunter2-not-shown"
    cases = {
        # nothing listens there
        f"postgresql://edge:{secret}@127.0.0.1:{free_port()}/fleet": "pg_isready",
        # a real server refusing the password
        pg_server.url(password=secret): "password",
        # a database that is not there
        pg_server.url("no_such_db"): "create the database",
        f"postgresql://127.0.0.1:{pg_server.port}/fleet?user=postgres&password={secret}": "password",
    }
    for url, hint in cases.items():
        with pytest.raises(StoreError) as caught:
            open_store(url)
        err = caught.value
        assert isinstance(err, EdgekitError) and hint in err.hint, (url, str(err))
        shown = str(err) + "".join(traceback.format_exception(err))
        assert secret not in shown and PASSWORD not in shown, shown
        assert (
            "cannot connect to the fleet database postgresql://" in err.message and "127.0.0.1" in err.message
        )


def test_a_bad_sqlite_path_is_an_edgekit_error(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreError, match="cannot open the fleet database") as caught:
        open_store(tmp_path / "dir.db")
    assert "--db" in caught.value.hint


def test_two_collectors_writing_one_database_store_each_message_once(store_url: str) -> None:
    """Two stores on one database (two collector processes, as far as the database can tell) get the
    same new devices, windows and events at once, in different orders: every row is stored once, each
    counted new by exactly one of them, and neither fails (no key clash on a new device, no deadlock)."""
    stores = [open_store(store_url), open_store(store_url)]
    lat = np.full(4, 10.0)
    devices = [f"cam-{i}" for i in range(6)]
    rows = [row("lab", payload(d, s, T + s, lat)) for s in range(60) for d in devices]
    event = {"schema": "edgekit/v1/event", "device": "cam-0", "fleet": "lab", "id": "e-1", "camera": "",
             "kind": "enter", "zone": "door", "t": T, "seq": 0, "frame_index": 7}  # fmt: skip
    added = [0, 0]
    new_events = [0, 0]
    errors: list[str] = []
    start = threading.Barrier(2)

    def collect(i: int) -> None:
        mine = rows if i == 0 else rows[::-1]  # the other one meets everything in the opposite order
        try:
            start.wait()
            for d in devices if i == 0 else devices[::-1]:
                stores[i].set_state("lab", d, "online", T, None)
            for b in range(0, len(mine), 25):
                added[i] += stores[i].add_windows(mine[b : b + 25])
            new_events[i] += stores[i].add_event("lab", "cam-0", event, json.dumps(event), T)
        except BaseException:  # noqa: BLE001 (reported by the main thread)
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=collect, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert added[0] + added[1] == len(rows)
        assert sorted(new_events) == [0, 1]
        assert all(stores[0].seqs("lab", d) == list(range(60)) for d in devices)
        assert stores[0].merged().count == len(rows) * 4
        assert {d["device"]: d["last_seq"] for d in stores[1].devices()} == dict.fromkeys(devices, 59)
        assert len(stores[1].events("lab", "cam-0")) == 1
    finally:
        for s in stores:
            s.close()


# -- retention levels, and PostgreSQL's layout of raw windows -----------------------------------------

DAY = 86400.0


def test_rollup_levels_keep_the_fleet_percentiles_and_merge_sketches(store: FleetStore) -> None:
    """Raw windows -> minute rollups -> hour rollups: the fleet p95 over a range is the same at every
    step (sketches merged, never percentiles averaged), and so are each hour's counts."""
    feed = Feed(minutes=240)  # four hours, a window every 20 s per device
    store.add_windows(feed.rows)
    now = T + 240 * 60 + 1
    hour0 = (T // 3600 + 1) * 3600  # the first whole hour of the feed
    ranges = [(None, None), (T, now), (hour0, hour0 + 2 * 3600 - 1e-3)]
    before = [store.merged(since=a, until=b) for a, b in ranges]
    hours_before = [(b.device, b.t0, b.frames, b.missed) for b in store.buckets(T, now, 3600)]
    levels = ((60, 3600.0), (3600, 400 * DAY))

    counts = store.compact(now, raw_keep_s=1800, levels=levels)
    assert counts["windows"] == sum(1 for s in feed.samples if s[1] < now - 1800)
    # Minute rollups older than an hour became hour rollups; the last hour's minutes stay minutes.
    assert counts["rollups_merged"] > 0 and counts["rollups_deleted"] == 0
    spans = {b.t0 % 3600 == 0 for b in store.buckets(T, now, 60)}
    assert spans == {True, False}
    for (a, b), was in zip(ranges, before, strict=True):
        got = store.merged(since=a, until=b)
        assert got.count == was.count
        for q in (0.5, 0.95, 0.99):
            # Within the sketch's 1 %; merged counts make it equal in fact.
            assert close_to(got.quantile(q), was.quantile(q), rel=0.01)
            assert close_to(got.quantile(q), was.quantile(q), rel=1e-9)
    # And the truth of the raw samples, within the sketch's 1 %.
    assert close_to(store.merged().quantile(0.95), float(np.quantile(feed.union(), 0.95)), rel=0.02)
    assert [(b.device, b.t0, b.frames, b.missed) for b in store.buckets(T, now, 3600)] == hours_before
    assert store.seqs("lab", "cam-b") == list(range(len(feed.rows) // 2))

    again = store.compact(now, raw_keep_s=1800, levels=levels)
    assert again["windows"] == again["rollups"] == again["rollups_merged"] == 0
    assert store.merged().count == before[0].count
    # Past the last level's keep everything goes.
    gone = store.compact(now + 400 * DAY + 3600, raw_keep_s=1800, levels=levels)
    assert gone["rollups_deleted"] > 0 and store.merged().count == 0


def test_rollup_levels_are_checked(store: FleetStore) -> None:
    for bad in ((), ((60, DAY), (90, 2 * DAY)), ((60, DAY), (3600, 3600.0)), ((0, DAY),)):
        with pytest.raises(ValueError, match="level"):
            store.compact(T, levels=bad)


def test_the_store_says_how_it_keeps_raw_windows(store_url: str) -> None:
    store = open_store(store_url)
    want = "plain table (sqlite)" if not store_url.startswith("postgres") else "native partitions by day"
    assert store.layout() == want
    store.close()


def _admin(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _partitions(url: str) -> dict[str, int]:
    """The windows table's partitions -> rows in each."""
    with _admin(url) as conn:
        names = [
            n
            for (n,) in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'windows'::regclass"
            ).fetchall()
        ]
        return {n: conn.execute(f"SELECT count(*) FROM {n}").fetchone()[0] for n in names}


def _plan(url: str, sql: str, args: tuple[Any, ...]) -> str:
    with _admin(url) as conn:
        conn.execute("ANALYZE")
        return "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql.replace("?", "%s"), args).fetchall())


def _ymd(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y%m%d")


def test_postgres_keeps_a_partition_per_day_drops_emptied_ones_and_prunes(pg_server: PostgresServer) -> None:
    url = pg_server.new_database()
    store = open_store(url)
    lat = np.full(5, 12.0)
    day0 = (T // DAY) * DAY
    # Three days, a window every 15 minutes per device.
    bodies = [payload(d, s, day0 + 900 * s + 7, lat) for d in ("cam-a", "cam-b") for s in range(3 * 96)]
    assert store.add_windows([row("lab", b) for b in bodies]) == len(bodies)
    parts = _partitions(url)
    days = sorted(n for n in parts if n != "windows_default")
    assert days == [f"windows_p{_ymd(day0 + i * DAY)}" for i in range(3)] and parts["windows_default"] == 0
    assert [parts[n] for n in days] == [2 * 96] * 3
    # A redelivery is the same bytes: the same stop, the same partition, the same key.
    assert store.add_windows([row("lab", b) for b in bodies[:50]]) == 0

    # A day's range reads that day's partition only.
    where, args = where_clause(None, None, day0 + DAY + 100, day0 + DAY + 5000)
    plan = _plan(url, "SELECT payload FROM windows" + where, tuple(args))
    assert days[1] in plan and days[0] not in plan and days[2] not in plan, plan

    before = store.merged()
    # Raw windows kept 12 h: a day and a half rolled up, the first day's partition emptied and dropped.
    counts = store.compact(day0 + 2 * DAY, raw_keep_s=12 * 3600, rollup_s=60)
    assert counts["partitions_dropped"] == 1 and counts["windows"] == 2 * (96 + 48)
    after = _partitions(url)
    assert days[0] not in after and after[days[1]] == 2 * 48 and after[days[2]] == 2 * 96
    # Tomorrow's (day 3) was made ahead of the writers.
    assert f"windows_p{_ymd(day0 + 3 * DAY)}" in after and len(after) == 4
    got = store.merged()
    assert got.count == before.count and got.quantile(0.95) == pytest.approx(before.quantile(0.95))
    assert store.add_windows([row("lab", b) for b in bodies]) == 0  # rolled up or raw, all known
    store.close()


def test_a_window_of_a_day_without_partition_waits_in_default_and_moves(pg_server: PostgresServer) -> None:
    url = pg_server.new_database()
    store = open_store(url)
    lat = np.full(3, 9.0)
    day0 = (T // DAY) * DAY
    # Six days in one batch: the newest four get partitions, the two oldest wait in DEFAULT.
    bodies = [payload("cam-w", s, day0 + s * DAY + 60, lat) for s in range(6)]
    assert store.add_windows([row("lab", b) for b in bodies]) == 6
    parts = _partitions(url)
    assert parts["windows_default"] == 2 and len(parts) == 5
    # A later window of one of those days makes its partition; the waiting one moves in with it.
    assert store.add_window("lab", "cam-w", payload("cam-w", 6, day0 + 120, lat), T) is True
    parts = _partitions(url)
    assert parts["windows_default"] == 1 and parts[f"windows_p{_ymd(day0)}"] == 2
    assert store.add_windows([row("lab", b) for b in bodies]) == 0  # still each once
    assert store.seqs("lab", "cam-w") == list(range(7)) and store.merged().count == 21
    store.close()


def test_two_writers_make_and_drop_partitions_without_duplicates_or_deadlocks(
    pg_server: PostgresServer,
) -> None:
    """Two collectors meet the same windows of new days at once (in opposite orders), then compact at
    once: each day's partition is made once, each window stored once, nothing fails."""
    url = pg_server.new_database()
    stores = [open_store(url), open_store(url)]
    lat = np.full(4, 10.0)
    day0 = (T // DAY) * DAY
    rows = [row("lab", payload(d, s, day0 + 1800 * s + 1, lat)) for s in range(6 * 48) for d in ("c1", "c2")]
    added = [0, 0]
    errors: list[str] = []
    start = threading.Barrier(2)

    def collect(i: int) -> None:
        mine = rows if i == 0 else rows[::-1]
        try:
            start.wait()
            for b in range(0, len(mine), 40):
                added[i] += stores[i].add_windows(mine[b : b + 40])
            start.wait()
            stores[i].compact(day0 + 5 * DAY, raw_keep_s=0, rollup_s=60)
        except BaseException:  # noqa: BLE001 (reported by the main thread)
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=collect, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert added[0] + added[1] == len(rows)
        assert stores[0].merged().count == len(rows) * 4
        assert stores[1].seqs("lab", "c1") == list(range(6 * 48))
        parts = _partitions(url)
        # Days 0-4 emptied and dropped; day 5 keeps its raw windows; day 6 made ahead.
        day5, day6 = f"windows_p{_ymd(day0 + 5 * DAY)}", f"windows_p{_ymd(day0 + 6 * DAY)}"
        assert sorted(parts) == sorted(["windows_default", day5, day6])
        assert parts[day5] == 2 * 48
    finally:
        for s in stores:
            s.close()


def test_an_old_plain_postgres_windows_table_moves_into_partitions(pg_server: PostgresServer) -> None:
    """A store made before partitions (windows a plain table) is moved into them as it opens: its
    windows are all there, still duplicates when replayed, and the old table is gone."""
    from edgekit.fleet.pgstore import POSTGRES

    url = pg_server.new_database()
    lat = np.full(6, 14.0)
    bodies = [payload("cam-o", s, T + 600 * s, lat) for s in range(300)]  # two days and a bit
    with _admin(url) as conn:
        for statement in SCHEMA:  # the schema as it was: windows keyed without stop, unpartitioned
            conn.execute(POSTGRES.sql(statement))
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'windows'").fetchone() == ("r",)
        with conn.cursor() as cur:
            cur.executemany(
                POSTGRES.sql("INSERT INTO windows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                [window_row("lab", "cam-o", b, json.dumps(b)) for b in bodies],
            )
    store = open_store(url)
    assert store.layout() == "native partitions by day"
    parts = _partitions(url)
    assert sum(parts.values()) == 300 and parts["windows_default"] == 0 and len(parts) == 4
    with _admin(url) as conn:
        assert conn.execute("SELECT to_regclass('windows_unpartitioned')").fetchone() == (None,)
    assert store.add_windows([row("lab", b) for b in bodies]) == 0
    assert store.merged().count == 300 * 6
    store.close()
    again = open_store(url)  # and opening it again changes nothing
    assert again.layout() == "native partitions by day" and again.merged().count == 300 * 6
    again.close()


def test_the_dashboards_queries_use_indexes(pg_server: PostgresServer) -> None:
    """At fleet size: a device's range and a fleet-wide range of rollups are index scans, not Seq Scans;
    a range of raw windows reads by index in its day's partition only."""
    url = pg_server.new_database()
    store = open_store(url)
    day0 = (T // DAY) * DAY
    for d in (day0 - DAY, day0, day0 + DAY):  # the writer makes these days' partitions
        store.add_window("lab", "cam-0", payload("cam-0", int(d), d + 1, np.full(2, 5.0)), d)
    store.close()
    with _admin(url) as conn:
        # 200 devices x 300 minutes of rollups; 200 devices' windows every 1.5 s for a day.
        conn.execute(
            "INSERT INTO rollups SELECT 'lab', 'cam-' || mod(i, 200), 60, %s + 60 * (i / 200), "
            "%s + 60 * (i / 200) + 30, 3, 30, 0, '{}', '{}' FROM generate_series(0, 59999) i",
            (T, T),
        )
        conn.execute(
            "INSERT INTO windows SELECT 'lab', 'cam-' || mod(i, 200), 'e', i, 's', %s + 1.5 * i, "
            "%s + 1.5 * i + 1, 30, 0, '{}' FROM generate_series(0, 57000) i",
            (day0, day0),
        )
    for table in ("rollups", "windows"):
        device_where, device_args = where_clause("lab", "cam-7", T + 3600, T + 7200)
        fleet_where, fleet_args = where_clause(None, None, T + 3600, T + 4000)
        for where, args in ((device_where, device_args), (fleet_where, fleet_args)):
            plan = _plan(url, f"SELECT stop FROM {table}" + where, tuple(args))
            assert "Seq Scan" not in plan and ("Index" in plan or "Bitmap" in plan), plan
            if table == "windows":  # pruned to T's day
                assert f"windows_p{_ymd(day0)}" in plan and "windows_default" not in plan, plan
                assert f"windows_p{_ymd(day0 + DAY)}" not in plan, plan


def test_timescaledb_makes_windows_a_hypertable(pg_server: PostgresServer) -> None:
    url = pg_server.new_database()
    with _admin(url) as conn:
        available = conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb'"
        ).fetchone()
    if available is None:
        pytest.skip(
            "the timescaledb extension is not available in this PostgreSQL (Debian bookworm has no package)"
        )
    store = open_store(url)
    assert store.layout() == "timescaledb hypertable"
    lat = np.full(4, 10.0)
    day0 = (T // DAY) * DAY
    bodies = [payload("cam-t", s, day0 + 3600 * s + 1, lat) for s in range(72)]
    assert store.add_windows([row("lab", b) for b in bodies]) == 72
    assert store.add_windows([row("lab", b) for b in bodies]) == 0
    counts = store.compact(day0 + 2 * DAY, raw_keep_s=0, rollup_s=60)
    assert counts["windows"] == 48 and counts["partitions_dropped"] >= 1
    assert store.merged().count == 72 * 4
    store.close()
