"""The live fleet view and its web app: merged percentiles, alerts, the JSON the dashboard reads."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from edgekit.core.sketch import LatencySketch
from edgekit.fleet.view import FleetView, SloPolicy
from edgekit.protocol.stages import STAGES
from edgekit.telemetry.window import Window


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def body(device: str, seq: int, end: float, latencies: list[float], budget: float = 33.3) -> dict[str, Any]:
    w = Window(start=end - 1.0, end=end)
    for ms in latencies:
        w.latency.add(ms)
        for i, stage in enumerate(STAGES):
            w.stages[stage].add(ms * (0.5 if i == 2 else 0.1))
        w.frames += 1
        w.missed += ms > budget
    return {
        "schema": "edgekit/v1/telemetry",
        "device": device,
        "fleet": "f",
        "seq": seq,
        "window": w.to_dict(),
    }


def birth(backend: str, budget: float, version: str = "1.0") -> dict[str, Any]:
    return {
        "state": "online",
        "model": {"name": "efficientnet-lite0", "version": version},
        "backend": backend,
        "precision": "int8",
        "budget_ms": budget,
        "profile": "rpi5",
    }


def test_fleet_percentiles_come_from_merged_sketches_per_device_backend_and_fleet() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    rng = random.Random(1)
    raw: dict[str, list[float]] = {"a": [], "b": []}
    view.status("f", "a", "online", clock.t, birth("onnxruntime", 33.3))
    view.status("f", "b", "online", clock.t, birth("litert", 33.3, "1.1"))
    for seq in range(30):
        clock.t += 1
        for dev, mu in (("a", 12.0), ("b", 30.0)):
            samples = [rng.lognormvariate(0, 0.3) * mu for _ in range(30)]
            raw[dev] += samples
            view.window("f", dev, body(dev, seq, clock.t, samples), clock.t)
    view.tick()
    snap = view.snapshot(300)
    union = sorted(raw["a"] + raw["b"])

    def p(values: list[float], q: float) -> float:
        s = LatencySketch()
        s.extend(values)
        return s.quantile(q)

    # Exactly what one sketch of every sample says; averaging the two devices' p99 would be far off.
    assert snap["fleet"]["p99"] == pytest.approx(p(union, 0.99), rel=1e-4)
    assert snap["fleet"]["p99"] == pytest.approx(union[int(0.99 * (len(union) - 1))], rel=0.02)
    by_device = {r["device"]: r for r in snap["devices"]}
    assert by_device["a"]["p99"] == pytest.approx(p(raw["a"], 0.99), rel=1e-4)
    assert by_device["b"]["frames"] == 900
    backends = {g["key"]: g for g in snap["groups"]["backend"]}
    assert backends["litert"]["p50"] == pytest.approx(p(raw["b"], 0.5), rel=1e-4)
    models = {g["key"] for g in snap["groups"]["model"]}
    assert models == {"efficientnet-lite0 1.0", "efficientnet-lite0 1.1"}
    assert snap["fleet"]["missed"] == sum(v > 33.3 for v in union)
    assert len(snap["series"]["t"]) == len(snap["series"]["p99"]) >= 3
    assert set(snap["stages"]) >= {"t", "totals", *STAGES}
    assert snap["heatmap"]["devices"] == ["f/a", "f/b"]
    json.dumps(snap, allow_nan=False)  # the wire format has no NaN


def test_a_device_restarted_keeps_its_totals_and_shows_its_restarts() -> None:
    """Totals are the sum of windows, whichever process sent them; the restart count is the counters'."""
    clock = Clock()
    view = FleetView(clock=clock)
    view.status("f", "a", "online", clock.t, birth("onnxruntime", 33.3))
    for seq, restarts in enumerate([0, 0, 1, 1]):  # killed after two windows, started again
        clock.t += 1
        b = body("a", seq, clock.t, [10.0] * 30) | {
            "counters": {"frames": 30 * (seq + 1), "restarts": restarts}
        }
        view.window("f", "a", b, clock.t)
    view.tick()
    row = view.snapshot(300)["devices"][0]
    assert row["frames"] == 120 and row["restarts"] == 1
    page = view.device_page("f", "a")
    assert page is not None and page["device"]["restarts"] == 1


def test_offline_and_slo_alerts_say_since_when() -> None:
    clock = Clock()
    view = FleetView(clock=clock, slo=SloPolicy(quantile=0.95, over_s=30, for_s=60))
    view.status("f", "slow", "online", clock.t, birth("tvm", 20.0))
    view.status("f", "gone", "online", clock.t, birth("tvm", 20.0))
    for seq in range(100):
        clock.t += 1
        view.window("f", "slow", body("slow", seq, clock.t, [25.0] * 10, budget=20.0), clock.t)
        if seq == 10:
            view.status("f", "gone", "offline", clock.t, None)
            went = clock.t
        view.tick()
        if seq == 20:
            pending = view.snapshot(300)["alerts"]
            clock.t += 1  # a new snapshot, not the cached one
    slo = [a for a in pending if a["kind"] == "slo"]
    assert slo and slo[0]["severity"] == "warning" and "over budget 20 ms" in slo[0]["detail"]
    alerts = {a["device"]: a for a in view.snapshot(300)["alerts"]}
    assert alerts["gone"]["kind"] == "offline" and alerts["gone"]["since"] == went
    assert alerts["slow"]["severity"] == "critical" and alerts["slow"]["state"] == "firing"
    assert alerts["slow"]["since"] < clock.t - 60
    # Back within budget: the breach ends.
    for seq in range(100, 140):
        clock.t += 1
        view.window("f", "slow", body("slow", seq, clock.t, [5.0] * 10, budget=20.0), clock.t)
        view.tick()
    clock.t += 1
    assert [a["device"] for a in view.snapshot(300)["alerts"]] == ["gone"]


def test_the_web_app_serves_json_events_and_refuses_bad_names() -> None:
    from fastapi.testclient import TestClient

    from edgekit.fleet.dashboard import create_app

    clock = Clock()
    view = FleetView(clock=clock)
    view.status("f", "cam-1", "online", clock.t, birth("onnxruntime", 33.3))
    view.window("f", "cam-1", body("cam-1", 0, clock.t, [10.0, 12.0, 40.0]), clock.t)
    view.tick()
    with TestClient(create_app(view), base_url="http://127.0.0.1") as client:
        assert "<html" in client.get("/").text.lower()
        assert client.get("/static/vendor/uPlot.iife.min.js").status_code == 200
        snap = client.get("/api/fleet?window=300").json()
        assert snap["devices"][0]["device"] == "cam-1" and snap["fleet"]["frames"] == 3
        page = client.get("/api/device/f/cam-1").json()
        assert page["birth"]["backend"] == "onnxruntime" and page["device"]["miss_rate"] == pytest.approx(
            1 / 3, abs=1e-4
        )
        assert client.get("/api/device/f/nobody").status_code == 404
        assert client.get("/api/device/f/..").status_code in (400, 404)
        assert client.get("/api/device/f/a..b").status_code == 400
        assert client.get("/api/fleet?window=-5").status_code == 422
        with client.stream("GET", "/api/events?window=300") as events:
            lines = []
            for line in events.iter_lines():
                lines.append(line)
                if line.startswith("data:"):
                    break
        assert "event: snapshot" in lines
        data = json.loads(lines[-1][len("data:") :])
        assert data["devices"][0]["device"] == "cam-1"
