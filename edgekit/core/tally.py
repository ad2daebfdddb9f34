"""What edgekit counts of frames, in one shape from the pipeline to the fleet.

``FrameTally``
    Frames, the ones that missed their deadline, the ones dropped before them, and the
    merged end-to-end latency sketch (ms).  The pipeline keeps one per camera of a run; a
    telemetry window carries one per camera (``cameras/<name>``); the fleet adds them up
    per camera, per device and per time step, and the canary window judges one per device.
    ``to_dict`` is the wire form, ``{frames, missed, dropped, latency_ms}``: what a window's
    camera entry and a stored camera rollup hold, and what ``add`` reads back.

``ClassCount``
    One detection class over some frames: the frames with at least one detection of it,
    its detections (``objects``) and the best score; ``count_detections`` adds a frame.  ``{frames, objects, max_score}`` is
    its wire form, in a telemetry window's ``detections``, in the fleet's rollups and in
    ``edgekit run --json``'s ``seen``.  ``from_dict`` also reads the spelling ``seen`` had
    before (``frames_with_detections``, ``detections``), so documents saved then still read.

Percentiles are never averaged: a tally's latency is a sketch, merged by adding counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekit.core.sketch import LatencySketch


@dataclass
class FrameTally:
    """Frames, misses, drops and the merged latency sketch (ms) of some frames; only goes up."""

    frames: int = 0
    missed: int = 0  # frames that finished after their deadline
    dropped: int = 0  # frames dropped (by the slot) before these were taken
    latency: LatencySketch = field(default_factory=LatencySketch)

    def count(self, latency_ms: float, met: bool, dropped_before: int = 0) -> None:
        """One frame: its latency, whether it met its deadline, the frames dropped before it."""
        self.frames += 1
        self.missed += not met
        self.dropped += dropped_before
        self.latency.add(latency_ms)

    def add(self, data: Mapping[str, Any]) -> None:
        """Fold in a wire form (a window's camera entry, a stored rollup), checked already."""
        self.frames += int(data["frames"])
        self.missed += int(data["missed"])
        self.dropped += int(data.get("dropped", 0))  # a window's own figures carry none
        self.latency.merge_dict(data["latency_ms"])

    def merge(self, other: FrameTally) -> None:
        self.frames += other.frames
        self.missed += other.missed
        self.dropped += other.dropped
        self.latency.merge(other.latency)

    def copy(self) -> FrameTally:
        """The tally alone (a subclass's own fields are not copied)."""
        out = FrameTally(self.frames, self.missed, self.dropped)
        out.latency.merge(self.latency)
        return out

    @property
    def met(self) -> int:
        return self.frames - self.missed

    @property
    def miss_rate(self) -> float:
        """Missed frames over frames; 0 for no frames."""
        return self.missed / self.frames if self.frames else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{frames, missed, dropped, latency_ms}`` (the sketch as telemetry carries it)."""
        return {
            "frames": self.frames,
            "missed": self.missed,
            "dropped": self.dropped,
            "latency_ms": self.latency.to_dict(),
        }


#: ``edgekit run --json``'s ``seen`` before it used the wire's names: old name -> the name now.
_OLD_CLASS_FIELDS = {"frames_with_detections": "frames", "detections": "objects"}


@dataclass(slots=True)
class ClassCount:
    """One detection class over some frames: frames with at least one detection of it, detections, best score."""

    frames: int = 0
    objects: int = 0
    max_score: float = 0.0

    def add(self, frames: int, objects: int, max_score: float) -> None:
        self.frames += int(frames)
        self.objects += int(objects)
        self.max_score = max(self.max_score, float(max_score))

    def merge(self, other: ClassCount | Mapping[str, Any]) -> None:
        """Add another count, or its wire form (checked already)."""
        if isinstance(other, ClassCount):
            self.add(other.frames, other.objects, other.max_score)
        else:
            self.add(other["frames"], other["objects"], other["max_score"])

    def copy(self) -> ClassCount:
        return ClassCount(self.frames, self.objects, self.max_score)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{frames, objects, max_score}`` (the score to 5 places)."""
        return {"frames": self.frames, "objects": self.objects, "max_score": round(self.max_score, 5)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClassCount:
        """A count from its wire form, or from the spelling ``run --json`` wrote before (``frames_with_detections``)."""
        named = {_OLD_CLASS_FIELDS.get(k, k): v for k, v in data.items()}
        return cls(int(named["frames"]), int(named["objects"]), float(named["max_score"]))


def count_detections(
    counts: dict[str, ClassCount], detections: Iterable[tuple[str, float]], key: Callable[[str], str] = str
) -> None:
    """Add one frame's detections, ``(class name, score)``, to per-class counts.

    A class counts the frame once however many of its detections it holds, each detection
    as an object, and its best score.  ``key`` names the class a detection is counted under
    (a telemetry window cuts long names and folds classes past its bound into ``other``).
    """
    in_frame: set[str] = set()
    for name, score in detections:
        k = key(name)
        c = counts.get(k)
        if c is None:
            c = counts[k] = ClassCount()
        c.objects += 1
        if score > c.max_score:
            c.max_score = score
        if k not in in_frame:
            in_frame.add(k)
            c.frames += 1
