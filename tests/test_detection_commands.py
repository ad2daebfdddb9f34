"""Commands that once took every model for a classifier, with a detector: the health report on the
wire and its display, ``edgekit telemetry tail``, ``edgekit fleet simulate --detectors``."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import jsonschema
import paho.mqtt.client as mqtt
import pytest
from detector_bundle import blazeface_key, build_blazeface
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import ValidationError

from edgekit.commands.common import console
from edgekit.commands.deploy_display import _health_table, agreement_text
from edgekit.deploy.health import HealthReport, check_health
from edgekit.detection.agreement import DetectionAgreement
from edgekit.protocol import messages, schemas
from edgekit.testing.mosquitto import Mosquitto

from conftest import EDGEKIT


def both_accept(kind: str, body: dict[str, Any]) -> None:
    """The receiver's model and the published JSON Schema both take ``body`` (as it crosses the wire)."""
    wire = json.loads(json.dumps(body))
    messages.KINDS[kind].model_validate(wire)
    jsonschema.Draft202012Validator(json.loads(schemas.schema_file(kind).read_text())).validate(wire)


def both_refuse(kind: str, body: dict[str, Any]) -> None:
    wire = json.loads(json.dumps(body))
    with pytest.raises(ValidationError):
        messages.KINDS[kind].model_validate(wire)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(json.loads(schemas.schema_file(kind).read_text())).validate(wire)


def result_with(health: dict[str, Any]) -> dict[str, Any]:
    """A final deploy result as an agent sends it, carrying ``health``."""
    return {
        "schema": "edgekit/v1/cmd-result",
        "id": "d1",
        "device": "cam-1",
        "action": "deploy",
        "step": "done",
        "final": True,
        "ok": True,
        "reason": "",
        "hint": "",
        "health": health,
        "version": "1.0",
        "replayed": False,
        "ts": 1.0,
    }


# An agent from before detection: its health report, exactly as it sent it.
OLD_HEALTH: dict[str, Any] = {
    "ok": True,
    "p50_ms": 3.1,
    "p99_ms": 4.2,
    "budget_ms": 33.3,
    "top1_agreement": 1.0,
    "threshold": 0.98,
    "frames": 8,
    "decisive_frames": 8,
    "runs": 101,
    "flipped": [],
    "backend": "onnxruntime",
    "precision": "fp32",
    "candidate": "onnxruntime-fp32",
    "load_ms": 80.0,
    "reason": None,
}


def agreement(matched: int, decisive: int, extra: int = 0, mean_iou: float = 0.93) -> DetectionAgreement:
    return DetectionAgreement(
        frames=8,
        reference=decisive + 1,
        decisive=decisive,
        matched=matched,
        missed=decisive - matched,
        extra=extra,
        mean_iou=mean_iou,
        min_iou=mean_iou,
        max_score_drift=0.02,
    )


def test_a_detectors_health_report_carries_its_gate_numbers_on_the_wire() -> None:
    report = HealthReport(
        ok=False,
        reason="detections match 5 of 6",
        top1_agreement=5 / 6,
        threshold=0.98,
        frames=8,
        detection=agreement(5, 6, extra=1, mean_iou=0.912345678),
    )
    wire = report.to_dict()
    assert wire["detection"] == {"matched": 5, "decisive": 6, "missed": 1, "extra": 1, "mean_iou": 0.9123}
    both_accept("health", wire)
    both_accept("cmd-result", result_with(wire))
    back = messages.Result.model_validate(json.loads(json.dumps(result_with(wire))))
    assert isinstance(back.health, messages.HealthReport) and back.health.detection is not None
    assert back.health.detection.missed == 1 and back.health.detection.mean_iou == 0.9123

    # A classifier's report reads as it did: no detection field at all, not a null.
    classifier = HealthReport(ok=True, top1_agreement=1.0, threshold=0.98, frames=8).to_dict()
    assert "detection" not in classifier


def test_an_old_agents_health_report_still_validates() -> None:
    both_accept("health", OLD_HEALTH)
    both_accept("cmd-result", result_with(OLD_HEALTH))
    assert messages.HealthReport.model_validate(OLD_HEALTH).detection is None


@pytest.mark.parametrize(
    "detection",
    [
        {"matched": 6, "decisive": 6, "missed": 0, "extra": 0, "mean_iou": 1.5},  # IoU is at most 1
        {"matched": 6, "decisive": 6, "missed": 0, "extra": -1, "mean_iou": 0.9},
        {"matched": 6, "decisive": 6, "missed": 0, "extra": True, "mean_iou": 0.9},  # a bool is no count
        {"matched": 6, "decisive": 6, "missed": 0, "extra": 2**63, "mean_iou": 0.9},
        {"matched": 6, "decisive": 6, "missed": 0, "mean_iou": 0.9},  # extra left out
    ],
)
def test_detection_numbers_out_of_bounds_are_refused(detection: dict[str, Any]) -> None:
    both_refuse("health", {**OLD_HEALTH, "detection": detection})


def shown(health: dict[str, Any]) -> str:
    with console.capture() as out:
        _health_table(health)
    return out.get()


def detector_health() -> dict[str, Any]:
    """A detector's health report as an agent sends it: 5 of 6 decisive boxes matched."""
    return HealthReport(
        ok=True,
        backend="openvino",
        precision="fp32",
        top1_agreement=5 / 6,
        frames=8,
        detection=agreement(5, 6),
    ).to_dict()


def test_deploy_shows_a_detectors_boxes_and_a_classifiers_top1() -> None:
    text = shown(detector_health())
    assert "boxes" in text and "IoU" in text and " 5/6 " in text and "0.93" in text, text
    assert "top-1" not in text, text
    text = shown(OLD_HEALTH)
    assert "top-1 agreement" in text and "100%" in text and "boxes" not in text, text


def test_the_agents_health_line_says_boxes_for_a_detector_and_top1_for_a_classifier() -> None:
    line = agreement_text(detector_health())
    assert line.startswith("boxes 5/6 matched") and "IoU 0.93" in line and "top-1" not in line, line
    assert agreement_text(OLD_HEALTH) == "top-1 agreement 100%"


@pytest.mark.slow
def test_the_health_gate_of_a_real_blazeface_bundle_reports_its_faces(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = tmp_path_factory.mktemp("blazeface")
    bundle = build_blazeface(out)
    _, public = blazeface_key(out)
    report = check_health(bundle, "x86_64-cpu", [public], runs=5, budget_ms=1000)
    assert report.ok, report.reason
    wire = report.to_dict()
    both_accept("health", wire)
    det = wire["detection"]
    assert det["decisive"] >= 4 and det["matched"] == det["decisive"] and det["missed"] == det["extra"] == 0
    assert 0.99 < det["mean_iou"] <= 1.0  # fp32 against its own reference
    assert wire["top1_agreement"] == 1.0


@pytest.mark.slow
def test_the_health_gate_passes_what_the_build_gate_passed_on_an_int8_blazeface(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The build's rule on the device: decisive is the threshold plus the margin, not the threshold.

    ONNX Runtime's int8 BlazeFace scores a few empty spots exactly at the 0.5 threshold where
    fp32 finds nothing: not decisive, so no extra, for the build's gate and the device's alike.
    """
    out = tmp_path_factory.mktemp("blazeface-int8")
    bundle = build_blazeface(out, precisions=("int8",))
    _, public = blazeface_key(out)
    report = check_health(bundle, "x86_64-cpu", [public], runs=5, budget_ms=1000)
    assert report.candidate is not None and report.candidate.startswith("onnxruntime-int8"), report
    assert report.ok, report.reason
    assert report.detection is not None and report.detection.extra == 0 and report.detection.rate == 1.0


# -- edgekit telemetry tail and fleet simulate, through a real Mosquitto ----------------------


def tail(broker: Mosquitto, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*EDGEKIT, "telemetry", "tail", "--mqtt", broker.url, *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def subscribed(broker: Mosquitto, count: int, timeout: float = 60) -> None:
    """Wait until ``count`` clients have subscribed (however long their start takes here)."""
    deadline = time.monotonic() + timeout
    while broker.log.read_text().count("SUBSCRIBE") < count:
        assert time.monotonic() < deadline, broker.log.read_text()[-2000:]
        time.sleep(0.05)


def labels(device: str, **fields: Any) -> bytes:
    return json.dumps({"schema": "edgekit/v1/labels", "device": device, "ts": 1.0, **fields}).encode()


FACES = [
    {"class_id": 0, "name": "face", "score": 0.93412, "box": [181.2, 79.9, 276.4, 187.0]},
    {"class_id": 0, "name": "face", "score": 0.71, "box": [10.0, 20.0, 40.0, 60.0]},
    {"class_id": 0, "name": "[red]face[/]", "score": 0.65, "box": [50.0, 20.0, 90.0, 60.0]},
    {"class_id": 0, "name": "face", "score": 0.61, "box": [100.0, 20.0, 130.0, 60.0]},
]


def test_telemetry_tail_shows_a_detectors_boxes_and_passes_them_through_json(
    broker: Mosquitto, cache_env: dict[str, str]
) -> None:
    as_json = tail(broker, cache_env, "--fleet", "lab", "--json", "--duration", "8")
    plain = tail(broker, cache_env, "--fleet", "lab", "--duration", "8")  # piped: plain lines at the end
    subscribed(broker, 2)
    sent = {
        "cam-d": labels("cam-d", labels=[], detections=FACES),
        "cam-e": labels("cam-e", labels=[], detections=[]),  # a detector's frame without a face
        "cam-c": labels("cam-c", labels=[{"id": 281, "name": "tabby", "score": 0.81}]),
    }
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        for device, payload in sent.items():
            client.publish(f"edgekit/v1/lab/{device}/labels", payload, qos=1).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()
    out, err = as_json.communicate(timeout=60)
    assert as_json.returncode == 0, err
    got = {line["topic"].split("/")[3]: line["payload"] for line in map(json.loads, out.splitlines())}
    assert got["cam-d"]["detections"] == FACES and got["cam-d"]["labels"] == []  # passed through as sent
    assert got["cam-c"]["labels"][0]["name"] == "tabby" and "detections" not in got["cam-c"]

    out, err = plain.communicate(timeout=60)
    assert plain.returncode == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()}
    # Class, score and box of the best three, the rest counted; a class name is shown, not read as markup.
    assert (
        "seen=face 0.93 [181,80,276,187]; face 0.71 [10,20,40,60]; [red]face[/] 0.65 [50,20,90,60] +1"
        in rows["device=lab/cam-d"]
    ), rows
    assert rows["device=lab/cam-e"].endswith("seen=nothing"), rows
    assert rows["device=lab/cam-c"].endswith("seen=tabby 0.81"), rows


def test_fleet_simulate_runs_detectors_as_its_last_devices(
    broker: Mosquitto, cache_env: dict[str, str]
) -> None:
    watch = tail(broker, cache_env, "--fleet", "sim", "--json", "--duration", "10")
    subscribed(broker, 1)
    sim = subprocess.run(
        [*EDGEKIT, "fleet", "simulate", "--mqtt", broker.url, "--fleet", "sim", "--devices", "3",
         "--detectors", "2", "--interval", "0.3", "--duration", "2"],
        env=cache_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    out, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
    windows: dict[str, list[dict[str, Any]]] = {}
    for line in map(json.loads, out.splitlines()):
        if line["topic"].endswith("/telemetry"):
            windows.setdefault(line["topic"].split("/")[3], []).append(line["payload"]["window"])
    assert sorted(windows) == ["sim-01", "sim-02", "sim-03"], sorted(windows)
    assert all("detections" not in w for w in windows["sim-01"])  # the classifier's windows are as before
    for device in ("sim-02", "sim-03"):
        counts = [w["detections"] for w in windows[device]]
        assert counts and all(set(c) <= {"face"} for c in counts), counts
        assert sum(c["face"]["objects"] for c in counts if "face" in c) > 0, counts

    for bad in ("4", "-1"):
        r = subprocess.run(
            [*EDGEKIT, "fleet", "simulate", "--mqtt", broker.url, "--devices", "3", "--detectors", bad],
            env=cache_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 2 and f"--detectors {bad}" in r.stderr and "Traceback" not in r.stderr, (
            r.stderr
        )
    help_text = subprocess.run(
        [*EDGEKIT, "fleet", "simulate", "--help"], env={**cache_env, "COLUMNS": "200"},
        capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert "--detectors" in help_text and "face detector" in help_text
