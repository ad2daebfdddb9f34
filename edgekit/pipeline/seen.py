"""What the model saw over a run: a detector's objects per class, or a classifier's top-1 histogram.

``Seen`` is an inline sink (``Pipeline.add_sink``): it reads the labels or detections each
``FrameRecord`` already carries, so tallying costs a few dict updates per frame; of a
detector's frames it keeps only the last ``LAST`` (which frame, and its boxes) for ``run --json``.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from edgekit.core.tally import ClassCount, count_detections
from edgekit.pipeline.records import FrameRecord, FrameResult

#: A detector's last frames ``run --json`` lists with their boxes.
LAST = 5


class Seen:
    """Tally of a run's frames: per class for ``task="detection"``, top-1 names for classification."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.frames = 0
        self.top1: Counter[str] = Counter()  # classification: frames whose best label this is
        self.classes: dict[str, ClassCount] = {}  # detection: by class name
        self._last: deque[FrameRecord] = deque(maxlen=LAST)

    name = "seen"
    depth = 0  # a few dict updates per frame

    def frame(self, result: FrameResult) -> None:
        self.observe(result.record)

    def close(self) -> None:
        pass

    def last_frames(self) -> list[dict[str, Any]]:
        """A detector's last frames: which frame (index, camera, source name) and its detections (boxes in frame pixels)."""
        return [
            {
                "index": r.index,
                **({"camera": r.camera} if r.camera else {}),
                **({"source_name": r.source_name} if r.source_name else {}),
                "detections": [d.to_dict() for d in r.detections],
            }
            for r in self._last
        ]

    def observe(self, record: FrameRecord) -> None:
        self.frames += 1
        if self.task != "detection":
            if record.labels:
                self.top1[record.labels[0].name] += 1
            return
        self._last.append(record)
        count_detections(self.classes, ((d.name, d.score) for d in record.detections))

    def to_dict(self) -> dict[str, Any]:
        """Detection: ``{class: {frames, objects, max_score}}`` (as telemetry names them), most frames
        first; classification: ``{top-1 name: frames}``, most frames first."""
        if self.task == "detection":
            ranked = sorted(self.classes.items(), key=lambda kv: (-kv[1].frames, kv[0]))
            return {name: c.to_dict() for name, c in ranked}
        return dict(sorted(self.top1.items(), key=lambda kv: (-kv[1], kv[0])))

    def render(self, limit: int = 10) -> str:
        """A few lines for people: the ``limit`` most frequent classes."""
        if self.task == "detection":
            head = f"What the model saw ({self.frames} frames; detections by class):"
            rows = [
                f"  {name:<24} {c['objects']:>7} in {c['frames']} frames (max score {c['max_score']:.2f})"
                for name, c in list(self.to_dict().items())[:limit]
            ]
            empty = "  nothing detected"
        else:
            head = f"What the model saw ({self.frames} frames; top-1 label):"
            rows = [
                f"  {name:<24} {n:>7} frames ({n / self.frames:.0%})"
                for name, n in list(self.to_dict().items())[:limit]
            ]
            empty = "  no labels"
        more = len(self.classes if self.task == "detection" else self.top1) - limit
        return "\n".join([head, *(rows or [empty]), *([f"  ... and {more} more"] if more > 0 else [])])
