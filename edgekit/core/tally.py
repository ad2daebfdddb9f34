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

``SourceHealth``
    How a camera kept delivering: its outages, reopens, stalls, corrupt frames and size
    changes (counts since the pipeline started), the seconds it went without frames (the
    current outage included) and the seconds since its last frame, now.  The pipeline keeps
    one per camera; a telemetry window carries one per camera (``cameras/<name>/health``) and
    the pipeline's sources together (``health``); the fleet keeps each camera's latest.
    ``to_dict`` is the wire form, ``from_dict`` reads it back (a field an older device left
    out reads as 0).

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


@dataclass
class SourceHealth:
    """How a source kept delivering: counts since the pipeline started, time without frames, and a gauge.

    Every field but ``since_frame_s`` only goes up while the pipeline runs (a restart starts
    them again from 0, which a Prometheus ``rate()`` understands).
    """

    outages: int = 0  # times it stopped delivering (stalls included)
    reopens: int = 0  # times it was opened again
    stalls: int = 0  # outages with the connection open and no frame coming (the watchdog's)
    corrupt: int = 0  # frames the decoder reported damaged, skipped
    size_changes: int = 0  # times the frame size (resolution) changed mid-stream
    rate_changes: int = 0  # times the frame rate changed mid-stream (where the decoder says it)
    down_s: float = 0.0  # seconds without frames in outages, the current one included
    since_frame_s: float = 0.0  # seconds since its last frame, now (a gauge, not a count)

    #: The fields that are counts (they add up across cameras; the fleet exports each as a counter).
    COUNTS = ("outages", "reopens", "stalls", "corrupt", "size_changes", "rate_changes")

    def add(self, other: SourceHealth) -> None:
        """Fold another source in: counts and time without frames add up, the longest silence wins."""
        for name in self.COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.down_s += other.down_s
        self.since_frame_s = max(self.since_frame_s, other.since_frame_s)

    def stalled(self, after_s: float) -> bool:
        """No frame for more than ``after_s`` seconds."""
        return self.since_frame_s > after_s

    def to_dict(self) -> dict[str, Any]:
        """The wire form: the counts, ``down_s`` and ``since_frame_s`` (seconds, to the ms)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in self.COUNTS}
        out["down_s"] = round(self.down_s, 3)
        out["since_frame_s"] = round(self.since_frame_s, 3)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceHealth:
        """A health from its wire form (checked already); a field left out reads as 0."""
        return cls(
            outages=int(data.get("outages", 0)),
            reopens=int(data.get("reopens", 0)),
            stalls=int(data.get("stalls", 0)),
            corrupt=int(data.get("corrupt", 0)),
            size_changes=int(data.get("size_changes", 0)),
            rate_changes=int(data.get("rate_changes", 0)),
            down_s=float(data.get("down_s", 0.0)),
            since_frame_s=float(data.get("since_frame_s", 0.0)),
        )
