"""``finished_frame``: a pipeline's finished frame made by hand, for a sink fed without a model or a camera."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgekit.detection.detector import Detection
from edgekit.pipeline.records import FrameRecord, FrameResult


def finished_frame(
    index: int,
    image: np.ndarray,
    detections: Sequence[Detection] = (),
    *,
    t: float = 0.0,
    camera: str = "",
    candidate: str = "test",
) -> FrameResult:
    """Frame ``index`` of ``camera``, captured at ``t`` (s), met, every stage 0 ms: what a sink sees."""
    dets = tuple(detections)
    ns = round(t * 1e9)
    record = FrameRecord(
        index=index,
        captured_at=t,
        captured_ns=ns,
        deadline_ns=ns,
        capture_wait_ms=0.0,
        preprocess_ms=0.0,
        inference_ms=0.0,
        postprocess_ms=0.0,
        sink_ms=0.0,
        latency_ms=0.0,
        met=True,
        dropped_before=0,
        candidate=candidate,
        detections=dets,
        camera=camera,
    )
    return FrameResult((), record, image, dets)
