"""The labels topic's payload: a frame's top labels, and a detector's detections, as JSON (with its camera, of many).

A detector's list is bounded (``MAX_LABEL_DETECTIONS``) and each entry rounded and clamped so
that what the frame loop produced always passes the ``Labels`` schema the fleet checks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edgekit.protocol.messages import (
    MAX_CAMERA_NAME,
    MAX_CLASS_NAME,
    MAX_LABEL_DETECTIONS,
    Labels,
    checked,
)
from edgekit.protocol.topics import SCHEMA_LABELS

if TYPE_CHECKING:
    from edgekit.detection.detector import Detection
    from edgekit.processing.postprocess import Label


def labels_payload(
    device: str,
    at: float,
    labels: Sequence[Label],
    detections: Sequence[Detection] | None,
    camera: str = "",
) -> bytes:
    """The labels message of ``device`` for the frame at ``at``; ``detections`` is ``None`` for a classifier.

    ``camera`` names the frame's camera in a pipeline of many; a single source's (``""``) message has no such field.
    """
    body: dict[str, Any] = {
        "schema": SCHEMA_LABELS,
        "device": device,
        "ts": round(at, 3),
        "labels": [{"id": lab.id, "name": lab.name, "score": round(lab.score, 5)} for lab in labels],
    }
    if detections is not None:
        body["detections"] = [detection_entry(d) for d in detections[:MAX_LABEL_DETECTIONS]]
    if camera:
        body["camera"] = camera[:MAX_CAMERA_NAME]
    return json.dumps(checked(Labels, body), separators=(",", ":")).encode()


def detection_entry(d: Detection) -> dict[str, Any]:
    """One detection as the labels topic carries it: class, score, box in frame pixels (one decimal)."""
    return {
        "class_id": d.class_id,
        "name": d.name[:MAX_CLASS_NAME] or f"class {d.class_id}",
        "score": round(min(max(float(d.score), 0.0), 1.0), 5),
        "box": [round(float(v), 1) for v in d.box],
    }
