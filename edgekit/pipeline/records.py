"""What the pipeline says about each frame, and the counters it keeps."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from edgekit.protocol.stages import STAGES

if TYPE_CHECKING:
    import numpy as np

    from edgekit.detection.detector import Detection
    from edgekit.processing.postprocess import Label

# STAGES, in order: the frame waits in the slot (capture_wait), is prepared, run, turned into
# labels, and handed to the sink (your loop body or callback).


@dataclass(frozen=True, slots=True)
class FrameRecord:
    """One frame's account: when it was captured, its deadline, each stage's time, met or missed."""

    index: int  # position in the source (dropped frames included)
    captured_at: float  # wall clock (time.time()) at capture
    captured_ns: int  # time.perf_counter_ns() at capture
    deadline_ns: int  # captured_ns + budget
    capture_wait_ms: float
    preprocess_ms: float
    inference_ms: float
    postprocess_ms: float
    sink_ms: float
    latency_ms: float  # capture -> sink done
    met: bool  # finished by the deadline
    dropped_before: int  # frames the slot dropped since the previous processed frame
    candidate: str  # the artifact that labelled it (changes under the degrade policy)
    # What the model saw: a classifier's top labels, or a detector's detections (frame pixels).
    labels: tuple[Label, ...] = ()
    detections: tuple[Detection, ...] = ()
    camera: str = ""  # the camera it came from, in a pipeline of many ("" for one source)
    # Which frame it is to people: an image's file name (a folder), a video file's name (with
    # ``index``, its position), a live source's URI (redacted).
    source_name: str = ""
    batch: int = 1  # the frames inferred together with it, itself included (``pipeline.batching``)

    def stage_ms(self) -> dict[str, float]:
        return {s: getattr(self, f"{s}_ms") for s in STAGES}

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (``--records``): the timings, then ``labels`` ({id, name, score})
        and ``detections`` ({class_id, name, score, box}), each empty when the task has none."""
        # By hand, not dataclasses.asdict: its deep copy cost more than the rest of the row.
        out = {f: getattr(self, f) for f in _SCALARS}
        if self.camera:
            out["camera"] = self.camera
        if self.source_name:
            out["source_name"] = self.source_name
        if self.batch > 1:
            out["batch"] = self.batch
        out["labels"] = [{"id": lab.id, "name": lab.name, "score": lab.score} for lab in self.labels]
        out["detections"] = [d.to_dict() for d in self.detections]
        return out


_SCALARS = tuple(
    f.name
    for f in fields(FrameRecord)
    if f.name not in ("labels", "detections", "camera", "source_name", "batch")
)


@dataclass(frozen=True, slots=True)
class FrameResult:
    """What the pipeline yields per frame: the labels, the record, and the frame itself (BGR)."""

    labels: tuple[Label, ...]
    record: FrameRecord
    frame: np.ndarray
    detections: tuple[Detection, ...] = ()  # a detector's objects, best first, boxes in frame pixels

    def supervision(self) -> Any:
        """The detections as ``supervision.Detections`` (supervision is an extra: ``edgekit[supervision]``).

        For tracker ids, ``as_supervision(pipeline.event_sink.tracks(camera))``
        (``edgekit.events.sv_detections``).
        """
        from edgekit.events.sv_detections import as_supervision

        return as_supervision(self.detections)

    @property
    def top(self) -> Label | None:
        return self.labels[0] if self.labels else None


@dataclass
class Counters:
    """Totals since the pipeline started.  They only go up (``add`` refuses a negative step)."""

    frames: int = 0  # frames labelled
    met: int = 0
    missed: int = 0
    dropped: int = 0  # frames the slot dropped (drop-oldest / degrade)
    source_outages: int = 0
    source_reopens: int = 0
    source_stalls: int = 0  # outages with the connection open and no frame coming (the watchdog's)
    source_corrupt: int = 0  # frames the decoder reported damaged, skipped
    source_skipped: int = 0  # frames decoded that a late capture thread never took (counted by the source)
    converted: int = 0  # grayscale / BGRA / 16-bit frames converted to BGR
    unreadable: int = 0  # folder images skipped
    size_changes: int = 0  # frame size changed mid-stream (followed, logged)
    degrade_switches: int = 0
    warm_passes: int = 0  # untimed passes that kept the model warm before a frame (pipeline.warm)
    warm_late: int = 0  # frames that arrived while a warm pass ran (and waited for it)

    def add(self, name: str, n: int = 1) -> None:
        if n < 0:
            raise ValueError(f"counter {name} only goes up (asked to add {n})")
        setattr(self, name, getattr(self, name) + n)

    def raise_to(self, name: str, value: int) -> None:
        """Follow a counter kept elsewhere (the slot's drops, the source's reopens)."""
        if value > getattr(self, name):
            setattr(self, name, value)

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
