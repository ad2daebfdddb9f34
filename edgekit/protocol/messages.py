"""Every JSON payload on edgekit's MQTT tree, as a pydantic model: one definition for senders and receivers.

    telemetry   ``Telemetry``    a reporting window (sketches, counters, gauges)
    status      ``Status``       a device online (with its birth facts) or offline
    labels      ``Labels``       what the model said lately
    event       ``EventMessage`` one zone or line event (on the ``events`` topic)
    cmd         ``Command``      a deploy, rollback or proof command for an agent
    cmd-result  ``Result``       an agent's progress and final answer to a command
    agent       ``AgentStatus``  a deploy agent's status
    proof-list  ``ProofList``    the event proofs an agent keeps (on ``cmd/result``)
    proof-chunk ``ProofChunk``   a piece of one proof file an agent sends (on ``cmd/result``)
    health      ``HealthReport`` what an agent's health gate measured (inside a result)
    sketch      ``Sketch``       a latency sketch (inside telemetry)

``KINDS`` maps each kind to its model; ``edgekit.protocol.schemas`` writes the JSON Schema
of each to ``edgekit/protocol/schema/<kind>.schema.json``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from edgekit.protocol.control_messages import (
    ActiveSlot,
    AgentStatus,
    Command,
    DeployId,
    HealthDetection,
    HealthReport,
    NoHealth,
    Result,
)
from edgekit.protocol.event_messages import EVENT_KINDS, EventCounts, EventMessage
from edgekit.protocol.proof_messages import ProofChunk, ProofItem, ProofList
from edgekit.protocol.telemetry_messages import (
    MAX_CAMERA_NAME,
    MAX_CAMERAS,
    MAX_CLASS_NAME,
    MAX_DETECTION_CLASSES,
    MAX_LABEL_DETECTIONS,
    MAX_WINDOW_TRACES,
    OTHER_CAMERA,
    OTHER_CLASS,
    BoxDetection,
    CameraWindow,
    DetectionCount,
    Gauges,
    Health,
    Label,
    Labels,
    ModelFacts,
    Sketch,
    SpoolState,
    Status,
    Telemetry,
    Throttled,
    TraceRef,
    Window,
    WireMessage,
    dump,
)

KINDS: dict[str, type[BaseModel]] = {
    "telemetry": Telemetry,
    "status": Status,
    "labels": Labels,
    "event": EventMessage,
    "cmd": Command,
    "cmd-result": Result,
    "agent": AgentStatus,
    "proof-list": ProofList,
    "proof-chunk": ProofChunk,
    "health": HealthReport,
    "sketch": Sketch,
}


def checked(model: type[BaseModel], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` once ``model`` accepts it (else ``ValidationError``): a sender sends nothing a receiver refuses.

    The dict, not a dump of the model, is what is sent: its bytes stay what they were
    (``1`` is not re-written ``1.0``), and receivers validate the same dict.
    """
    model.model_validate(body)
    return body


def first_error(err: ValidationError) -> str:
    """The first problem of a failed validation in one short line: ``where: what``."""
    e = err.errors(include_url=False)[0]
    where = ".".join(str(p) for p in e["loc"]) or "message"
    return f"{where}: {e['msg']}"


__all__ = [
    "EVENT_KINDS",
    "KINDS",
    "MAX_CAMERAS",
    "MAX_CAMERA_NAME",
    "MAX_CLASS_NAME",
    "MAX_DETECTION_CLASSES",
    "MAX_LABEL_DETECTIONS",
    "MAX_WINDOW_TRACES",
    "OTHER_CAMERA",
    "OTHER_CLASS",
    "ActiveSlot",
    "AgentStatus",
    "BoxDetection",
    "CameraWindow",
    "Command",
    "DeployId",
    "DetectionCount",
    "EventCounts",
    "EventMessage",
    "Gauges",
    "Health",
    "HealthDetection",
    "HealthReport",
    "Label",
    "Labels",
    "ModelFacts",
    "NoHealth",
    "ProofChunk",
    "ProofItem",
    "ProofList",
    "Result",
    "Sketch",
    "SpoolState",
    "Status",
    "Telemetry",
    "Throttled",
    "TraceRef",
    "ValidationError",
    "Window",
    "WireMessage",
    "checked",
    "dump",
    "first_error",
]
