"""Per-camera telemetry (issue 20): a window's ``cameras``, the labels' ``camera``, Sparkplug's ``cameras/...``.

Real pipelines of two synthetic cameras report to a real Mosquitto; a single source's messages
must stay exactly what they were (no ``cameras``, no ``camera``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from detector_telemetry import record
from test_telemetry import RawSubscriber, Subscriber, stop_when, validator

import edgekit
from edgekit.core.sketch import LatencySketch
from edgekit.protocol import messages
from edgekit.protocol import sparkplug as sp
from edgekit.telemetry import report
from edgekit.telemetry.window import MetricsWindow
from edgekit.testing.mosquitto import Mosquitto

CAMERAS = {"door": "synthetic:320x240@30", "yard": "synthetic:160x120@15"}
# What a window and a labels message held before issue 20: a single source's must hold just these.
WINDOW_KEYS = {"start", "end", "frames", "missed", "fps", "latency_ms", "stages_ms"}
LABELS_KEYS = {"schema", "device", "ts", "labels"}


@pytest.fixture(scope="module")
def model(x86_bundle: tuple[Path, dict[str, Any]]) -> Iterator[Any]:
    with edgekit.load(x86_bundle[0], device="x86_64-cpu") as m:
        yield m


def at(camera: str, latency_ms: float = 6.5, met: bool = True, dropped: int = 0) -> Any:
    return dataclasses.replace(record(met=met), camera=camera, latency_ms=latency_ms, dropped_before=dropped)


def test_a_window_counts_each_camera_and_a_single_sources_has_no_cameras() -> None:
    window = MetricsWindow(cameras=["door", "yard", "gate"])
    window.observe(at("door", 5.0))
    window.observe(at("door", 50.0, met=False, dropped=2))
    window.observe(at("yard", 7.0, dropped=1))
    w = window.take().to_dict()
    assert list(w["cameras"]) == ["door", "yard", "gate"]  # named up front: listed with 0 frames too
    door, yard, gate = (w["cameras"][n] for n in ("door", "yard", "gate"))
    assert (door["frames"], door["missed"], door["dropped"]) == (2, 1, 2)
    assert (yard["frames"], yard["missed"], yard["dropped"]) == (1, 0, 1)
    assert (gate["frames"], gate["missed"], gate["dropped"], gate["latency_ms"]["count"]) == (0, 0, 0, 0)
    assert LatencySketch.from_dict(door["latency_ms"]).max == pytest.approx(50.0)
    messages.Window.model_validate(json.loads(json.dumps(w)))
    # A camera seen only later is listed from then on.
    window.observe(at("dock"))
    assert set(window.take().to_dict()["cameras"]) == {"door", "yard", "gate", "dock"}
    assert set(window.take().to_dict()["cameras"]) == {"door", "yard", "gate", "dock"}

    single = MetricsWindow()
    single.observe(record())
    assert set(single.take().to_dict()) == WINDOW_KEYS


def test_cameras_past_the_bound_are_counted_together_as_other_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    window = MetricsWindow()
    names = [f"cam{i}" for i in range(messages.MAX_CAMERAS + 6)]
    with caplog.at_level(logging.WARNING, logger="edgekit.telemetry.window"):
        for name in names:
            window.observe(at(name))
        window.observe(at(names[-1]))
    w = window.take().to_dict()
    assert len(w["cameras"]) == messages.MAX_CAMERAS
    assert list(w["cameras"])[: messages.MAX_CAMERAS - 1] == names[: messages.MAX_CAMERAS - 1]
    assert w["cameras"][messages.OTHER_CAMERA]["frames"] == 8  # 7 cameras past the bound, one twice
    assert sum(c["frames"] for c in w["cameras"].values()) == w["frames"]
    assert len([r for r in caplog.records if "reported together" in r.message]) == 1
    messages.Window.model_validate(json.loads(json.dumps(w)))
    # The receiving side refuses what no sender makes: more cameras, cameras with more frames.
    with pytest.raises(messages.ValidationError, match="more frames than the window"):
        messages.Window.model_validate(json.loads(json.dumps(w | {"frames": 3})))
    too_many = w | {"cameras": w["cameras"] | {"one-more": w["cameras"]["cam0"]}}
    with pytest.raises(messages.ValidationError):
        messages.Window.model_validate(json.loads(json.dumps(too_many)))


@pytest.mark.slow
def test_two_cameras_report_their_frames_and_labels_say_which_camera(model: Any, broker: Mosquitto) -> None:
    sub = Subscriber(broker.port, client_id="cameras-json")
    try:
        with edgekit.Pipeline(model, sources=CAMERAS) as p:
            publisher = report(
                p, broker.url, device_id="cams", fleet="lab", interval_s=0.4, labels_interval_s=0.0
            )

            def seen_enough() -> bool:
                cams = {m.get("camera") for m in sub.of("labels")}
                return publisher.acked >= 3 and cams >= set(CAMERAS) and p.counters.frames >= 20

            stop_when(p, seen_enough, timeout=20)
            p.run()
        assert sub.wait_for(lambda: any(m.get("state") == "offline" for m in sub.of("status")), 10)
    finally:
        sub.close()
    telemetry, labels = sub.of("telemetry"), sub.of("labels")
    assert len(telemetry) >= 3 and labels
    seqs = [m["seq"] for m in telemetry]
    telemetry = [
        m for i, m in enumerate(telemetry) if m["seq"] not in seqs[:i]
    ]  # a replay is not counted twice
    for m in telemetry:
        validator("telemetry.schema.json").validate(m)
        w = m["window"]
        assert list(w["cameras"]) == list(CAMERAS)  # both, every window, even one without their frames
        assert sum(c["frames"] for c in w["cameras"].values()) == w["frames"]
        for c in w["cameras"].values():
            assert c["latency_ms"]["count"] == c["frames"] >= c["missed"]
    for name in CAMERAS:
        frames = sum(m["window"]["cameras"][name]["frames"] for m in telemetry)
        dropped = sum(m["window"]["cameras"][name]["dropped"] for m in telemetry)
        assert frames == p.per_camera[name].frames > 0  # every frame of each camera reported once
        assert sum(m["window"]["cameras"][name]["missed"] for m in telemetry) == p.per_camera[name].missed
        assert dropped <= p.per_camera[name].dropped  # drops after its last frame are in no record
        merged = LatencySketch()
        for m in telemetry:
            merged.merge(LatencySketch.from_dict(m["window"]["cameras"][name]["latency_ms"]))
        assert merged.quantile(0.5) == pytest.approx(p.per_camera[name].latency.quantile(0.5))
    for m in labels:
        validator("labels.schema.json").validate(m)
        assert set(m) == LABELS_KEYS | {"camera"} and m["camera"] in CAMERAS
    assert {m["camera"] for m in labels} == set(CAMERAS)


@pytest.mark.slow
def test_a_single_sources_messages_have_no_cameras_and_no_camera(model: Any, broker: Mosquitto) -> None:
    sub = Subscriber(broker.port, client_id="single-json")
    try:
        with edgekit.Pipeline(model, "synthetic:160x120@30") as p:
            publisher = report(
                p, broker.url, device_id="one", fleet="lab", interval_s=0.4, labels_interval_s=0.0
            )
            stop_when(p, lambda: publisher.acked >= 2 and len(sub.of("labels")) >= 2, timeout=20)
            p.run()
        assert sub.wait_for(lambda: any(m.get("state") == "offline" for m in sub.of("status")), 10)
    finally:
        sub.close()
    telemetry, labels = sub.of("telemetry"), sub.of("labels")
    assert telemetry and labels
    for m in telemetry:
        validator("telemetry.schema.json").validate(m)
        # No cameras; its source's health (issue 34) is the one field added since.
        assert set(m["window"]) == WINDOW_KEYS | {"health"}
        assert m["window"]["health"]["outages"] == 0  # a synthetic source never stops
    for m in labels:
        assert set(m) == LABELS_KEYS


@pytest.mark.slow
def test_sparkplug_declares_and_sends_each_cameras_metrics(model: Any, broker: Mosquitto) -> None:
    sub = RawSubscriber(broker.port, "spBv1.0/#", client_id="scada-cameras")
    per_camera = [f"cameras/{n}/{f}" for n in CAMERAS for f in ("frames", "missed", "dropped")]
    percentiles = [f"cameras/{n}/latency_ms/p{q}" for n in CAMERAS for q in (50, 90, 99)]
    try:
        with edgekit.Pipeline(model, sources=CAMERAS) as p:
            report(p, broker.url, device_id="cams-s", fleet="plant", interval_s=0.4, format="sparkplug")

            def seen_enough() -> bool:
                data = [m for k, m in sub.sparkplug() if k == "DDATA" and m["metrics"]["window/frames"]]
                return len(data) >= 3

            stop_when(p, seen_enough, timeout=20)
            p.run()
        assert sub.wait_for(lambda: sub.sparkplug()[-1][0] == "NDEATH", 10)
    finally:
        sub.close()
    msgs = sub.sparkplug()
    dbirth = next(m for k, m in msgs if k == "DBIRTH")["metrics"]
    assert set(per_camera + percentiles) <= set(dbirth)  # named up front: declared at the first birth
    assert [k for k, _ in msgs].count("NBIRTH") == 1  # so no rebirth was needed for them
    ddata = [m["metrics"] for k, m in msgs if k == "DDATA"]
    assert len(ddata) >= 3
    for d in ddata:
        assert set(d) <= set(dbirth) and set(per_camera + percentiles) <= set(d)
        assert sum(d[f"cameras/{n}/frames"] for n in CAMERAS) == d["window/frames"]
        for n in CAMERAS:
            p50 = d[f"cameras/{n}/latency_ms/p50"]
            assert p50 > 0 if d[f"cameras/{n}/frames"] else math.isnan(p50), d
    for n in CAMERAS:
        assert sum(d[f"cameras/{n}/frames"] for d in ddata) == p.per_camera[n].frames > 0
    # What a fleet collector rebuilds from DDATA is still a valid telemetry body (it leaves cameras out).
    body = sp.telemetry_body(ddata[0], fleet="plant", device="cams-s", ts_ms=1)
    messages.Telemetry.model_validate(json.loads(json.dumps(body)))
