"""What zones and lines report: one frozen ``Event`` per happening, with an id a receiver can dedupe on.

An event's id is a UUID derived (uuid5) from what the event is: the camera, the kind, the zone or
line, the track (its id and the capture time it was first seen, so a tracker that restarts its
ids at 1 after a restart of the device does not repeat old ids) and how many events of that
kind this track has had there before.  Replaying the same frames gives the same ids; delivering
an event twice (at-least-once through the spool) gives a receiver two equal ids to drop one of.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

EventKind = Literal["enter", "leave", "dwell", "cross", "present", "count"]

_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "edgekit:events")


def event_id(*parts: object) -> str:
    """The stable id of the event that ``parts`` (camera, kind, place, track, sequence...) describe."""
    return str(uuid.uuid5(_NAMESPACE, "\x1f".join(repr(p) for p in parts)))


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened in a zone or on a line of one camera.

    ``zone`` names the zone or line (a camera's zones and lines share one namespace).
    ``t`` is the capture time of the frame that decided the event and ``frame_index`` its
    index; ``since_t`` is when what it reports began (the stay for ``leave``/``dwell``, the run
    of frames for ``present``, the interval for ``count``).  ``counts`` (``count`` events only)
    is ``{"zones": {zone: {"enter"|"leave"|"occupancy": {class: n}}}, "lines": {line:
    {direction: {class: n}}}}``.
    """

    id: str
    kind: EventKind
    camera: str
    zone: str | None
    t: float
    frame_index: int
    track_id: int | None = None
    class_name: str | None = None
    direction: str | None = None
    dwell_s: float | None = None
    since_t: float | None = None
    box: tuple[float, float, float, float] | None = None
    counts: dict[str, dict[str, dict[str, dict[str, int]]]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: fields that do not apply to this kind are left out."""
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "camera": self.camera,
            "t": self.t,
            "frame_index": self.frame_index,
        }
        optional: dict[str, Any] = {
            "zone": self.zone,
            "track_id": self.track_id,
            "class_name": self.class_name,
            "direction": self.direction,
            "dwell_s": self.dwell_s,
            "since_t": self.since_t,
            "box": list(self.box) if self.box is not None else None,
            "counts": self.counts,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out
