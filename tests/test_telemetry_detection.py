"""A detector's telemetry: per-class counts per window, the labels topic's detections, Sparkplug, bounds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from detector_telemetry import offline_publisher, record

from edgekit.detection.detector import Detection
from edgekit.fleet import Collector, FleetStore
from edgekit.pipeline.records import FrameResult
from edgekit.processing.postprocess import Label
from edgekit.protocol import messages, schemas
from edgekit.protocol import sparkplug as sp
from edgekit.telemetry import TelemetryPublisher
from edgekit.telemetry.window import MetricsWindow

FACE, PERSON = (0, "face"), (1, "person")


def det(cls: tuple[int, str], score: float, x: float = 10.0) -> Detection:
    return Detection(cls[0], cls[1], score, (x, 20.0, x + 30.0, 60.0))


class Captured:
    """Stands in for paho's client: keeps what the publisher publishes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        self.sent.append((topic, payload))


def publisher(tmp: Path, window: MetricsWindow, device: str = "cam-d") -> TelemetryPublisher:
    return offline_publisher(tmp, window, device, frames=3, labels_interval_s=0.0)


def both_accept(kind: str, body: dict[str, Any]) -> None:
    wire = json.loads(json.dumps(body))
    messages.KINDS[kind].model_validate(wire)
    jsonschema.Draft202012Validator(json.loads(schemas.schema_file(kind).read_text())).validate(wire)


def test_a_detector_window_counts_frames_objects_and_the_best_score_per_class() -> None:
    window = MetricsWindow(detections=True)
    window.observe(record(det(FACE, 0.9), det(FACE, 0.7, x=50), det(PERSON, 0.4)))
    window.observe(record(det(FACE, 0.95)))
    window.observe(record())  # a frame with nothing in it
    w = window.take().to_dict()
    assert w["frames"] == 3
    assert w["detections"] == {
        "face": {"frames": 2, "objects": 3, "max_score": 0.95},
        "person": {"frames": 1, "objects": 1, "max_score": 0.4},
    }
    # The next window starts empty, and says so (a detector that saw nothing: {}, not absent).
    assert window.take().to_dict()["detections"] == {}


def test_a_classifier_window_is_what_it_was() -> None:
    window = MetricsWindow()
    window.observe(record(det(FACE, 0.9)))  # ignored: a classifier's windows have no detections
    w = window.take().to_dict()
    assert list(w) == ["start", "end", "frames", "missed", "fps", "latency_ms", "stages_ms"]


def test_class_names_and_the_number_of_classes_are_bounded() -> None:
    window = MetricsWindow(detections=True)
    many = [det((i, f"class-{i}"), 0.5) for i in range(200)]
    window.observe(record(*many, det((999, "x" * 5000), float("nan")), det((7, ""), 2.0)))
    counts = window.take().to_dict()["detections"]
    assert len(counts) == messages.MAX_DETECTION_CLASSES
    assert "class-0" in counts and "class-62" in counts and "class-63" not in counts
    # 137 named classes past the first 63, the huge name, and the empty one went to "other".
    assert counts["other"] == {"frames": 1, "objects": 139, "max_score": 1.0}
    assert all(len(name) <= messages.MAX_CLASS_NAME for name in counts)


def test_a_detector_message_passes_its_model_and_schema_and_a_classifier_message_has_no_detections(
    tmp_path: Path,
) -> None:
    window = MetricsWindow(detections=True)
    pub = publisher(tmp_path, window)
    window.observe(record(det(FACE, 0.8), det(PERSON, 0.6)))
    body = pub.telemetry_payload()
    both_accept("telemetry", body)
    assert body["window"]["detections"]["face"] == {"frames": 1, "objects": 1, "max_score": 0.8}
    pub.spool.close()
    plain = publisher(tmp_path, MetricsWindow(), device="cam-c")
    assert "detections" not in json.dumps(plain.telemetry_payload())
    plain.spool.close()


def telemetry_with(detections: Any, frames: int = 10) -> dict[str, Any]:
    sketch = {"accuracy": 0.01, "count": 0, "sum": 0.0, "min": None, "max": None, "zero": 0, "buckets": {}}
    window = {"start": 1.0, "end": 2.0, "frames": frames, "missed": 0, "latency_ms": sketch,
              "stages_ms": dict.fromkeys(sp_stages(), sketch), "detections": detections}  # fmt: skip
    return {"schema": "edgekit/v1/telemetry", "device": "cam-d", "seq": 0, "window": window, "counters": {}}


def sp_stages() -> tuple[str, ...]:
    from edgekit.protocol.stages import STAGES

    return STAGES


@pytest.mark.parametrize(
    "detections",
    [
        {f"c{i}": {"frames": 1, "objects": 1, "max_score": 0.5} for i in range(65)},  # too many classes
        {"x" * 65: {"frames": 1, "objects": 1, "max_score": 0.5}},  # a name too long
        {"": {"frames": 1, "objects": 1, "max_score": 0.5}},  # no name
        {"face": {"frames": -1, "objects": 1, "max_score": 0.5}},
        {"face": {"frames": 1, "objects": 1, "max_score": 1.5}},
        {"face": {"frames": 1, "objects": 1}},  # no score
        ["face"],
    ],
)
def test_broken_detection_counts_are_refused_by_model_and_schema(detections: Any) -> None:
    body = telemetry_with(detections)
    with pytest.raises(messages.ValidationError):
        messages.Telemetry.model_validate(body)
    schema = json.loads(schemas.schema_file("telemetry").read_text())
    assert not jsonschema.Draft202012Validator(schema).is_valid(body)


@pytest.mark.parametrize(
    "detections",
    [
        {"face": {"frames": 3, "objects": 2, "max_score": 0.5}},  # fewer objects than frames with one
        {"face": {"frames": 11, "objects": 11, "max_score": 0.5}},  # more frames than the window has
        # JSON Schema calls 1.0 an integer; the model is strict (a count is never a float).
        {"face": {"frames": 1, "objects": 1.0, "max_score": 0.5}},
    ],
)
def test_counts_the_schema_cannot_express_are_refused_by_the_model(detections: Any) -> None:
    with pytest.raises(messages.ValidationError):
        messages.Telemetry.model_validate(telemetry_with(detections))


def test_the_labels_topic_carries_a_detectors_boxes_and_a_classifiers_labels(tmp_path: Path) -> None:
    import numpy as np

    window = MetricsWindow(detections=True)
    pub = publisher(tmp_path, window)
    pub._client = Captured()
    frame = np.zeros((4, 4, 3), np.uint8)
    dets = (det(FACE, 0.912345678), det(PERSON, 0.5, x=100.04))
    pub.offer_result(FrameResult((), record(*dets), frame, detections=dets), detector=True)
    pub._send_labels()
    pub._send_labels()  # woken again (a QoS 0 publish acks at once): the same labels are not sent twice
    [(topic, payload)] = pub._client.sent
    body = json.loads(payload)
    both_accept("labels", body)
    assert topic == "edgekit/v1/lab/cam-d/labels"
    assert body["labels"] == []  # what a collector from before detection requires
    assert body["detections"] == [
        {"class_id": 0, "name": "face", "score": 0.91235, "box": [10.0, 20.0, 40.0, 60.0]},
        {"class_id": 1, "name": "person", "score": 0.5, "box": [100.0, 20.0, 130.0, 60.0]},
    ]
    # An old collector's model (labels only, unknown fields kept) still takes it.
    assert Collector(FleetStore()).handle(topic, payload) == "labels"
    pub.spool.close()

    classifier = publisher(tmp_path, MetricsWindow(), device="cam-c")
    classifier._client = Captured()
    labels = (Label(3, "tabby", 0.91234567),)
    classifier.offer_result(FrameResult(labels, record(), frame))
    classifier._send_labels()
    [(_, payload)] = classifier._client.sent
    assert set(json.loads(payload)) == {"schema", "device", "ts", "labels"}
    assert json.loads(payload)["labels"] == [{"id": 3, "name": "tabby", "score": 0.91235}]
    classifier.spool.close()


def test_labels_carry_at_most_the_bounded_number_of_detections(tmp_path: Path) -> None:
    import numpy as np

    pub = publisher(tmp_path, MetricsWindow(detections=True))
    pub._client = Captured()
    dets = tuple(det(FACE, 0.5, x=float(i)) for i in range(500))
    pub.offer_result(FrameResult((), record(), np.zeros((1, 1, 3), np.uint8), detections=dets), detector=True)
    pub._send_labels()
    body = json.loads(pub._client.sent[0][1])
    assert len(body["detections"]) == messages.MAX_LABEL_DETECTIONS
    both_accept("labels", body)
    pub.spool.close()


def test_sparkplug_carries_the_per_class_counts_both_ways(tmp_path: Path) -> None:
    window = MetricsWindow(detections=True)
    pub = publisher(tmp_path, window)
    window.observe(record(det(FACE, 0.8), det((2, "a/b"), 0.3)))
    payload = pub.telemetry_payload()
    pub.spool.close()
    metrics = sp.window_metrics(payload)
    assert metrics["detections/face/objects"] == 1 and metrics["detections/a/b/max_score"] == 0.3
    _, decoded = sp.read_metrics(sp.encode(metrics, 1, ts_ms=1000))
    body = sp.telemetry_body(decoded, fleet="lab", device="cam-d", ts_ms=1000)
    assert body["window"]["detections"] == payload["window"]["detections"]
    messages.Telemetry.model_validate(body)
    plain = sp.telemetry_body(sp.window_metrics(payload | {"window": {**payload["window"], "detections": {}}}),
                              fleet="lab", device="cam-d", ts_ms=1000)  # fmt: skip
    assert "detections" not in plain["window"]
    with pytest.raises(ValueError, match="detections/<class>"):
        sp.telemetry_body({**metrics, "detections/face/area": 1.0}, fleet="lab", device="cam-d", ts_ms=1)


def test_the_collector_takes_a_sparkplug_detectors_counts_and_refuses_a_stray_metric(tmp_path: Path) -> None:
    window = MetricsWindow(detections=True)
    pub = publisher(tmp_path, window)
    window.observe(record(det(FACE, 0.8), det(FACE, 0.6)))
    payload = pub.telemetry_payload()
    pub.spool.close()
    store = FleetStore()
    collector = Collector(store)
    ddata = sp.topic("lab", "DDATA", "cam-d", sp.DEVICE)
    metrics = sp.window_metrics(payload)
    assert collector.handle(ddata, sp.encode(metrics, 1, ts_ms=1000)) == "telemetry"
    collector.flush()
    [bucket] = store.buckets(0, 2**40, 60)
    assert bucket.detections is not None and bucket.detections["face"].to_dict() == {
        "frames": 1,
        "objects": 2,
        "max_score": 0.8,
    }
    stray = metrics | {"telemetry/seq": payload["seq"] + 1, "detections/face/area": 3.0}
    assert collector.handle(ddata, sp.encode(stray, 2, ts_ms=2000)) == "rejected:sparkplug-parse"
    negative = metrics | {"telemetry/seq": payload["seq"] + 2, "detections/face/objects": -5}
    assert collector.handle(ddata, sp.encode(negative, 3, ts_ms=3000)) == "rejected:bad-field"


def test_a_real_blazeface_pipeline_reports_its_faces_through_mosquitto_to_the_fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import subprocess
    import time

    import cv2
    import numpy as np
    from detector_bundle import build_blazeface
    from skimage import data

    import edgekit
    from edgekit.fleet.prometheus import render
    from edgekit.fleet.view import FleetView
    from edgekit.telemetry import report
    from edgekit.testing.mosquitto import Mosquitto

    bundle = build_blazeface(tmp_path_factory.mktemp("blazeface"))
    folder = tmp_path_factory.mktemp("photos")
    # A photograph without a face first, the astronaut (one face) twice after it: the newest labels hold her.
    cv2.imwrite(str(folder / "1-coffee.png"), np.ascontiguousarray(data.coffee()[..., ::-1]))
    for name in ("2-astronaut.png", "3-astronaut.png"):
        cv2.imwrite(str(folder / name), np.ascontiguousarray(data.astronaut()[..., ::-1]))
    broker = Mosquitto(tmp_path_factory.mktemp("mqtt")).start()
    sub = subprocess.Popen(
        ["mosquitto_sub", "-p", str(broker.port), "-h", "127.0.0.1", "-t", "edgekit/v1/#", "-v", "-q", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while "SUBSCRIBE" not in broker.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        with edgekit.load(bundle, device="x86_64-cpu") as model, edgekit.Pipeline(model, str(folder)) as p:
            publisher = report(
                p, broker.url, device_id="door", fleet="lab", interval_s=0.3, labels_interval_s=0.0,
                spool=tmp_path_factory.mktemp("spool") / "door.db",
            )  # fmt: skip
            while not publisher.connected and time.monotonic() < deadline:
                time.sleep(0.05)
            for _ in p:
                time.sleep(0.5)  # the publisher's thread sends the newest labels in between
        time.sleep(0.5)
    finally:
        sub.terminate()
        out = sub.communicate(timeout=5)[0]
        broker.stop()
    lines = [line.split(" ", 1) for line in out.splitlines() if line.startswith("edgekit/v1/lab/door/")]
    labels = [json.loads(body) for topic, body in lines if topic.endswith("/labels")]
    faces = [m["detections"] for m in labels if m.get("detections")]
    assert faces and all(m["labels"] == [] and "detections" in m for m in labels)
    x0, y0, x1, y1 = faces[-1][0]["box"]  # her face, as the pipeline test finds it
    assert faces[-1][0]["name"] == "face" and 150 < x0 < 200 and 60 < y0 < 110 and 250 < x1 < 300
    assert 160 < y1 < 210

    store = FleetStore()
    view = FleetView(store)
    collector = Collector(store, listener=view)
    for topic, body in lines:
        outcome = collector.handle(topic, body.encode())
        assert not outcome.startswith("rejected"), (topic, outcome)
    text = render(view.prometheus_state())
    assert 'edgekit_detections_total{fleet="lab",device="door",class="face"} 2' in text
    assert 'edgekit_detection_frames_total{fleet="lab",device="door",class="face"} 2' in text
    assert 'edgekit_frames_total{fleet="lab",device="door"} 3' in text
