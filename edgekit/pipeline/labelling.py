"""A frame's model outputs turned into its result: labels (top-k) or detections, and its record."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from edgekit.pipeline.records import FrameRecord, FrameResult

if TYPE_CHECKING:
    from edgekit.detection.detector import Detection
    from edgekit.model import Model
    from edgekit.pipeline.capture import Frame
    from edgekit.pipeline.levels import Level
    from edgekit.processing.postprocess import Label


def result_of(
    model: Model,
    level: Level,
    top: int,
    frame: Frame,
    ys: list[Any],
    times: tuple[int, int, int],
    budget_ns: int,
    batch: int = 1,
) -> FrameResult:
    """Postprocess ``frame``'s outputs ``ys`` (its rows of a batch's) and account for it.

    ``times`` are when its preprocessing began, its inference began and ended (ns; a batched
    frame's are its batch's): with the postprocessing's end they make the record's stages,
    which add up to its latency so far (the sink stage is added when it is handed over).
    """
    from edgekit.processing.tensors import from_output

    t0, t1, t2 = times
    detector = model.detector
    labels: tuple[Label, ...] = ()
    detections: tuple[Detection, ...] = ()
    if detector is None:
        labels = level.top_k(model, top)(ys[0])
    else:
        # Decode and NMS are the frame's cost like top-k is: timed as postprocess.
        shape = frame.image.shape
        detections = detector(
            [from_output(y, spec) for y, spec in zip(ys, level.outputs, strict=True)],
            (shape[0], shape[1]),
            level.output_names,
        )
    t3 = time.perf_counter_ns()
    record = FrameRecord(
        index=frame.index,
        captured_at=frame.captured_at,
        captured_ns=frame.captured_ns,
        deadline_ns=frame.captured_ns + budget_ns,
        capture_wait_ms=(t0 - frame.captured_ns) / 1e6,
        preprocess_ms=(t1 - t0) / 1e6,
        inference_ms=(t2 - t1) / 1e6,
        postprocess_ms=(t3 - t2) / 1e6,
        sink_ms=0.0,
        latency_ms=(t3 - frame.captured_ns) / 1e6,
        met=t3 <= frame.captured_ns + budget_ns,
        dropped_before=frame.dropped_before,
        candidate=level.name,
        camera=frame.camera,
        source_name=frame.name,
        batch=batch,
        # The same tuples as the result's (immutable): a record costs two references, not a copy.
        labels=labels,
        detections=detections,
    )
    return FrameResult(labels, record, frame.image, detections)
