"""The wire message models: the published schemas are current, and senders, models, schemas and receivers agree."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from edgekit.deploy.health import HealthReport
from edgekit.fleet import Collector, FleetStore
from edgekit.pipeline.records import FrameRecord
from edgekit.processing.postprocess import Label
from edgekit.protocol import messages, schemas
from edgekit.protocol.control import (
    deploy_message,
    parse_agent_status,
    parse_result,
    result_message,
    rollback_message,
)
from edgekit.protocol.stages import STAGES
from edgekit.telemetry import BrokerConfig, Spool, TelemetryPublisher
from edgekit.telemetry.window import MetricsWindow


def test_every_committed_schema_is_what_its_model_generates() -> None:
    # CI runs this: after changing a model, run `python -m edgekit.protocol.schemas` and commit.
    assert schemas.stale() == [], "run: python -m edgekit.protocol.schemas"
    on_disk = {p.name for p in schemas.SCHEMA_DIR.glob("*.json")}
    assert on_disk == {f"{kind}.schema.json" for kind in messages.KINDS}
    assert schemas.main(["--check"]) == 0


def test_the_check_notices_a_stale_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas, "SCHEMA_DIR", tmp_path)
    assert schemas.main(["--check"]) == 1  # none written yet
    assert schemas.main([]) == 0 and schemas.stale() == []
    path = schemas.schema_file("status")
    path.write_text(path.read_text().replace('"online"', '"on-line"'))
    assert schemas.stale() == ["status"]


@pytest.mark.parametrize("kind", list(messages.KINDS))
def test_each_schema_is_valid_draft_2020_12_and_names_its_message(kind: str) -> None:
    doc = json.loads(schemas.schema_file(kind).read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["$id"].endswith(f"/{kind}.schema.json") and doc["description"]
    if "schema" in doc["properties"]:
        assert doc["properties"]["schema"]["const"] == f"edgekit/v1/{kind}"
        assert "schema" in doc["required"]


def validator(kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(schemas.schema_file(kind).read_text()))


def both_accept(kind: str, body: dict[str, Any]) -> None:
    """The model and the published schema both accept ``body`` (as JSON, the way it travels)."""
    wire = json.loads(json.dumps(body))
    messages.KINDS[kind].model_validate(wire)
    validator(kind).validate(wire)


def both_refuse(kind: str, body: Any) -> None:
    with pytest.raises(messages.ValidationError):
        messages.KINDS[kind].model_validate(body)
    assert not validator(kind).is_valid(body)


class Captured:
    """Stands in for paho's client: keeps what the publisher publishes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        self.sent.append((topic, payload))


BIRTH = {
    "model": {"name": "efficientnet-lite0", "version": "1.1", "sha256": "a" * 64, "artifact": None,
              "artifact_sha256": None},
    "candidate": "onnxruntime-fp32", "backend": "onnxruntime", "precision": "fp32", "budget_ms": 33.3,
    "profile": "x86_64-cpu", "source": "synthetic:160x120@30", "policy": "drop-oldest",
}  # fmt: skip


def device(tmp: Path, **birth: Any) -> tuple[TelemetryPublisher, MetricsWindow]:
    window = MetricsWindow()
    pub = TelemetryPublisher(
        BrokerConfig.from_url("mqtt://127.0.0.1:1"),
        device_id="cam-w",
        fleet="lab",
        window=window,
        spool=Spool(tmp / "cam-w.db"),
        counters=lambda: {"frames": 7, "met": 6, "missed": 1, "dropped": 0},
        birth=BIRTH | birth,
        labels_interval_s=0.0,
    )
    return pub, window


def test_what_a_device_sends_follows_its_model_and_schema(tmp_path: Path) -> None:
    pub, window = device(tmp_path)
    both_accept("status", json.loads(pub._status("online")))
    both_accept("status", json.loads(pub._status("offline")))
    empty = pub.telemetry_payload()  # a window without frames: sketches with null min and max
    both_accept("telemetry", empty)
    for ms in (0.0, 3.0, 12.5, 250.0):
        window.observe(FrameRecord(0, 0.0, 0, 0, 0.1, 1.0, ms, 0.3, 0.1, ms + 1.5, ms < 33, 0, "x"))
    full = pub.telemetry_payload()
    both_accept("telemetry", full)
    both_accept("sketch", full["window"]["latency_ms"])
    pub._client = Captured()
    pub.offer_labels((Label(3, "tabby", 0.91234567), Label(5, "tiger cat", 0.05)))
    pub._send_labels()
    [(topic, payload)] = pub._client.sent
    assert topic.endswith("/labels")
    both_accept("labels", json.loads(payload))
    pub.spool.close()


def test_birth_facts_the_fleet_would_refuse_fail_at_once(tmp_path: Path) -> None:
    from edgekit.errors import TelemetryError

    with pytest.raises(TelemetryError, match="budget_ms"):
        device(tmp_path, budget_ms=-1)


def test_what_an_agent_and_a_rollout_send_follows_its_model_and_schema() -> None:
    both_accept(
        "cmd", deploy_message("d-1", "cam-1", "https://h/a.tar.gz", "b" * 64, 5, fleet="lab").to_dict()
    )
    both_accept("cmd", rollback_message("d-1-rb", "cam-1", fleet="lab").to_dict())
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from edgekit.deploy.command_trust import sign_command

    key = Ed25519PrivateKey.generate()
    signed = sign_command(
        deploy_message("d-2", "cam-1", "https://h/a.tar.gz", "b" * 64, 5, ttl_s=60, fleet="lab"), key
    )
    assert signed.signature and signed.nonce and signed.expires_at
    both_accept("cmd", signed.to_dict())
    both_accept(
        "cmd", sign_command(rollback_message("d-2-rb", "cam-1", ttl_s=60, fleet="lab"), key).to_dict()
    )
    health = HealthReport(True, p50_ms=4.2, p99_ms=9.7, budget_ms=33.3, top1_agreement=1.0, threshold=0.98,
                          frames=8, decisive_frames=8, runs=101, backend="onnxruntime", precision="fp32",
                          candidate="onnxruntime-fp32", load_ms=120.4)  # fmt: skip
    both_accept("health", health.to_dict())
    both_accept("health", HealthReport(False, "it does not load", "rebuild").to_dict())
    final = result_message("cam-1", "d-1", "done", final=True, ok=True, action="deploy",
                           health=health.to_dict(), version="1.1")  # fmt: skip
    for body in (
        final,
        result_message("cam-1", None, "command", final=True, ok=False, reason="x", hint="y"),
        result_message("cam-1", "d-1", "download", final=False, action="deploy", info={"bytes": 1}),
    ):
        both_accept("cmd-result", body)
        assert parse_result(json.dumps(body).encode()) == body
    agent = {
        "schema": "edgekit/v1/agent", "state": "online", "device": "cam-1", "fleet": "lab", "group": "lab",
        "profile": "x86_64-cpu", "ts": time.time(), "session": "abc123", "edgekit": "0.1.0",
        "active": {"slot": "a", "model": "efficientnet-lite0", "version": "1.1", "deploy_id": "d-1"},
        "slots": {"a": {"complete": True, "active": True}, "b": {"complete": False, "active": False}},
        "pipeline": "running", "busy": None,
    }  # fmt: skip
    both_accept("agent", agent)  # an older agent's: no "dropped"
    assert parse_agent_status(json.dumps(agent).encode()) == agent
    both_accept("agent", agent | {"dropped": 2})
    offline = {"schema": "edgekit/v1/agent", "state": "offline", "device": "cam-1", "fleet": "lab",
               "group": None, "profile": None}  # fmt: skip
    both_accept("agent", offline)


def test_model_and_schema_refuse_the_same_broken_messages(tmp_path: Path) -> None:
    pub, _ = device(tmp_path)
    good = json.loads(json.dumps(pub.telemetry_payload()))
    pub.spool.close()
    both_refuse("telemetry", good | {"seq": -1})
    both_refuse("telemetry", good | {"seq": True})
    both_refuse("telemetry", good | {"schema": "edgekit/v2/telemetry"})
    both_refuse("telemetry", {k: v for k, v in good.items() if k != "window"})
    window = good["window"]
    stages = {s: v for s, v in window["stages_ms"].items() if s != STAGES[-1]}
    both_refuse("telemetry", good | {"window": window | {"stages_ms": stages}})
    both_refuse("telemetry", good | {"counters": {"frames": 1.5}})
    sketch = window["latency_ms"]
    both_refuse("sketch", sketch | {"accuracy": 0.02})
    both_refuse("sketch", sketch | {"buckets": {"0129": 1}})
    both_refuse("status", {"schema": "edgekit/v1/status", "device": "cam-1", "state": "exploded"})
    both_refuse("cmd-result", {"schema": "edgekit/v1/cmd-result", "device": "cam-1", "final": "yes"})
    both_refuse("cmd-result", {"schema": "edgekit/v1/cmd-result", "device": "cam-1", "final": True,
                               "id": "../x"})  # fmt: skip
    both_refuse("agent", {"schema": "edgekit/v1/agent", "device": "cam-1", "state": "busy"})
    both_refuse(
        "cmd",
        {"schema": "edgekit/v1/cmd", "id": "d-1", "action": "deploy", "fleet": "lab", "device": "cam-1"},
    )
    # A command without its fleet (from a sender older than signed fleets): the model and schema refuse it.
    both_refuse("cmd", {"schema": "edgekit/v1/cmd", "id": "d-1", "action": "rollback", "device": "cam-1"})
    both_refuse("health", {"frames": 3})
    assert parse_result(b'{"schema": "edgekit/v1/cmd-result", "device": "cam-1", "final": 1}') is None


def old_device_window(seq: int) -> bytes:
    """Telemetry as the first JSON publishers sent it: no epoch, sent_at, fps, gauges, spool or session."""
    sketch = {"accuracy": 0.01, "count": 2, "sum": 24.0, "min": 11.0, "max": 13.0, "zero": 0,
              "buckets": {"120": 1, "129": 1}}  # fmt: skip
    window = {"start": 1000.0 + seq, "end": 1001.0 + seq, "frames": 2, "missed": 0, "latency_ms": sketch,
              "stages_ms": dict.fromkeys(STAGES, sketch)}  # fmt: skip
    body = {"schema": "edgekit/v1/telemetry", "device": "cam-old", "seq": seq, "window": window,
            "counters": {"frames": 2 * (seq + 1)}, "from_the_future": {"x": 1}}  # fmt: skip
    return json.dumps(body).encode()


def test_an_old_device_and_unknown_fields_still_ingest() -> None:
    c = Collector(FleetStore())
    topic = "edgekit/v1/lab/cam-old/telemetry"
    assert [c.handle(topic, old_device_window(s)) for s in (0, 1, 1)] == [
        "telemetry",
        "telemetry",
        "duplicate",
    ]
    assert c.store.merged(device="cam-old").count == 4
    status = {"schema": "edgekit/v1/status", "device": "cam-old", "state": "online", "gpu": "none"}
    assert c.handle("edgekit/v1/lab/cam-old/status", json.dumps(status).encode()) == "status"
    labels = {"schema": "edgekit/v1/labels", "device": "cam-old", "ts": 1.0, "labels": [{"id": 1, "name": "x",
              "score": 0.5, "box": [0, 0, 1, 1]}]}  # fmt: skip
    assert c.handle("edgekit/v1/lab/cam-old/labels", json.dumps(labels).encode()) == "labels"
    bad_labels = labels | {"labels": [{"id": "1", "name": "x", "score": 0.5}]}
    assert c.handle("edgekit/v1/lab/cam-old/labels", json.dumps(bad_labels).encode()) == "rejected:bad-field"
    assert c.rejected == {"bad-field": 1}


def test_a_real_window_validates_in_microseconds(tmp_path: Path) -> None:
    # The collector validates every message: a model that got slow would cap the fleet's ingest.
    pub, window = device(tmp_path)
    for v in np.random.default_rng(3).lognormal(2.6, 0.4, 500):
        window.observe(FrameRecord(0, 0.0, 0, 0, 0.1, 1.0, float(v), 0.3, 0.1, float(v) + 1.5, True, 0, "x"))
    body = json.loads(json.dumps(pub.telemetry_payload()))
    pub.spool.close()
    runs = 200
    start = time.perf_counter()
    for _ in range(runs):
        messages.Telemetry.model_validate(body)
    per_message_ms = (time.perf_counter() - start) / runs * 1000
    assert per_message_ms < 2.0, per_message_ms  # ~0.05 ms on a laptop core; generous for a loaded CI box
