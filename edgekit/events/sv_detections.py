"""Detections and tracks as ``supervision.Detections``, for code already written against supervision.

supervision is an optional extra (``pip install edgekit[supervision]``), not a dependency of the
core: it is imported here, when asked for, and its absence is a clear error with the command
that installs it.  The mapping is supervision's own: ``xyxy`` (frame pixels), ``confidence``,
``class_id``, ``data["class_name"]``, and for tracks ``tracker_id`` (the tracker's stable id).
Predicted tracks (no detection on this frame) are left out unless asked for: supervision's
trackers report matched boxes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.detection.detector import Detection
    from edgekit.events.tracking import Track


def _supervision() -> Any:
    try:
        import supervision
    except ImportError:
        raise EdgekitError(
            "supervision is not installed", "pip install 'edgekit[supervision]' (or pip install supervision)"
        ) from None
    return supervision


def as_supervision(items: Sequence[Detection] | Sequence[Track], *, predicted: bool = False) -> Any:
    """``supervision.Detections`` of a frame's detections, or of a tracker's tracks (with ``tracker_id``).

    ``predicted``: keep the tracks that were not matched on this frame (their box is the
    tracker's prediction).
    """
    from edgekit.events.tracking import Track

    sv = _supervision()
    tracks = [t for t in items if isinstance(t, Track)]
    if tracks:
        kept = [t for t in tracks if predicted or t.missed == 0]
        return sv.Detections(
            xyxy=np.asarray([t.box for t in kept], dtype=np.float32).reshape(-1, 4),
            confidence=np.asarray([t.score for t in kept], dtype=np.float32),
            class_id=np.asarray([t.class_id for t in kept], dtype=np.int64),
            tracker_id=np.asarray([t.id for t in kept], dtype=np.int64),
            data={"class_name": np.asarray([t.name for t in kept], dtype=str)},
        )
    dets: Sequence[Any] = items
    return sv.Detections(
        xyxy=np.asarray([d.box for d in dets], dtype=np.float32).reshape(-1, 4),
        confidence=np.asarray([d.score for d in dets], dtype=np.float32),
        class_id=np.asarray([d.class_id for d in dets], dtype=np.int64),
        data={"class_name": np.asarray([d.name for d in dets], dtype=str)},
    )
