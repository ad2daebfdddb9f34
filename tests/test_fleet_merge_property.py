"""Property: a fleet percentile from merged sketches is the percentile of every raw sample, within 1%.

Hypothesis draws fleets (devices, windows, latency samples spanning four decades); the
samples go through the real path — ``Window`` sketches, the JSON a device publishes,
``Collector.handle``, the store, ``merged()`` and the live ``FleetView`` — and the answer
is compared with the exact quantile of the union of the raw samples.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit.core.sketch import DEFAULT_ACCURACY, LatencySketch
from edgekit.fleet.collector import Collector
from edgekit.fleet.store import FleetStore
from edgekit.fleet.view import FleetView
from edgekit.protocol.stages import STAGES
from edgekit.telemetry.window import Window

NOW = 1_800_000_000.0

latency = st.floats(min_value=0.05, max_value=5_000.0, allow_nan=False, allow_infinity=False)
window_samples = st.lists(latency, min_size=1, max_size=40)
device_windows = st.lists(window_samples, min_size=1, max_size=6)
fleets = st.lists(device_windows, min_size=1, max_size=5)
quantiles = st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999])


def exact(values: list[float], q: float) -> float:
    """The sample at rank q·(n-1), rounded down: the rank the sketch's quantile promises to match."""
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


def payload(device: str, seq: int, samples: list[float]) -> bytes:
    end = NOW - 60 + seq
    w = Window(start=end - 1, end=end)
    for ms in samples:
        w.latency.add(ms)
        for stage in STAGES:
            w.stages[stage].add(ms / len(STAGES))
        w.frames += 1
    body: dict[str, Any] = {
        "schema": "edgekit/v1/telemetry",
        "device": device,
        "fleet": "prop",
        "session": "s",
        "epoch": "e",
        "seq": seq,
        "sent_at": end,
        "window": w.to_dict(),
        "counters": {"frames": w.frames},
        "gauges": {},
        "spool": {"pending": 0, "bytes": 0},
    }
    return json.dumps(body).encode()


def within(estimate: float, truth: float) -> bool:
    return abs(estimate - truth) <= DEFAULT_ACCURACY * truth * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=fleets, q=quantiles)
def test_merged_fleet_quantile_matches_the_union_of_raw_samples(
    fleet: list[list[list[float]]], q: float
) -> None:
    store = FleetStore(":memory:")
    view = FleetView(store, clock=lambda: NOW)
    collector = Collector(store, batch_size=50, listener=view)
    union: list[float] = []
    for d, windows in enumerate(fleet):
        for seq, samples in enumerate(windows):
            outcome = collector.handle(
                f"edgekit/v1/prop/dev{d}/telemetry", payload(f"dev{d}", seq, samples), NOW
            )
            assert outcome == "telemetry"
            union += samples
    collector.flush()

    truth = exact(union, q)
    merged = store.merged(fleet="prop")
    assert merged.count == len(union)
    assert within(merged.quantile(q), truth), (merged.quantile(q), truth)
    # One device alone, too.
    dev0 = [v for w in fleet[0] for v in w]
    assert within(store.merged(fleet="prop", device="dev0").quantile(q), exact(dev0, q))
    # The live view merges the same windows (10 s buckets, then the window): the same answer.
    view.tick()
    snap = view.snapshot(300)
    assert snap["fleet"]["frames"] == len(union)
    if q in (0.5, 0.95, 0.99):  # the dashboard's numbers are rounded to a microsecond
        assert abs(snap["fleet"][f"p{round(q * 100)}"] - merged.quantile(q)) <= 0.0005 + 1e-9
    store.close()


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.lists(latency, min_size=1, max_size=200), min_size=2, max_size=8), q=quantiles)
def test_merging_is_exact_whatever_the_grouping(parts: list[list[float]], q: float) -> None:
    """Merging per-window sketches equals one sketch of all samples: bucket for bucket."""
    merged = LatencySketch()
    for part in parts:
        s = LatencySketch()
        s.extend(part)
        merged.merge(LatencySketch.from_dict(json.loads(json.dumps(s.to_dict()))))
    whole = LatencySketch()
    whole.extend(v for part in parts for v in part)
    assert merged.buckets == whole.buckets and merged.count == whole.count
    assert merged.quantile(q) == whole.quantile(q)
    # The tempting shortcut, averaging per-part percentiles, is not the fleet percentile in general;
    # the merged answer is always within the sketch's error of the truth.
    assert within(merged.quantile(q), exact([v for p in parts for v in p], q))


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.lists(latency, min_size=0, max_size=100), min_size=1, max_size=6))
def test_merge_dict_is_merge_of_from_dict(parts: list[list[float]]) -> None:
    """The view's fast path (no sketch built per window) adds up to exactly the checked path."""
    fast, slow = LatencySketch(), LatencySketch()
    for part in parts:
        s = LatencySketch()
        s.extend(part)
        wire = json.loads(json.dumps(s.to_dict()))
        fast.merge_dict(wire)
        slow.merge(LatencySketch.from_dict(wire))
    assert fast.to_dict() == slow.to_dict()
