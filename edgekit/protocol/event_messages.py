"""What a device publishes about its zones and lines: one ``EventMessage`` per event.

``edgekit/v1/<fleet>/<device>/events``, QoS 1, through the device's spool like a telemetry
window: at least once, so a receiver drops what it has seen by the event's ``id`` (a UUID
the device derives from what the event is: the same event sent again has the same id).
``seq`` numbers the device's event messages within its spool's ``epoch``, as windows'
``seq`` does theirs; it says what a gap is, the id says what a duplicate is.

Everything a device names (camera, zone or line, class, direction, the keys of ``counts``)
is bounded, as the other messages bound their maps: a valid message cannot carry a
quarter MiB of made-up keys into the fleet's store.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from edgekit.protocol.telemetry_messages import (
    MAX_MAP_KEYS,
    CameraName,
    ClassName,
    Count,
    Key,
    Name,
    WireMessage,
)

#: What happened: entered or left a zone, stayed in it (dwell), crossed a line, was present for
#: N frames, or a per-interval count of a camera's zones and lines.
EVENT_KINDS = ("enter", "leave", "dwell", "cross", "present", "count")
#: An event's id: a lower-case UUID (safe as a file name: the device names its proof files with it).
EVENT_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

#: class name -> how many.
ClassCounts = Annotated[dict[ClassName, Count], Field(max_length=MAX_MAP_KEYS)]
#: ``enter``/``leave``/``occupancy`` (a zone) or a direction (a line) -> class counts.
PlaceCounts = Annotated[dict[Key, ClassCounts], Field(max_length=8)]


class EventCounts(WireMessage):
    """A ``count`` event's interval: per zone its enters, leaves and occupancy at the end; per line each direction."""

    zones: Annotated[dict[Key, PlaceCounts], Field(max_length=MAX_MAP_KEYS)] = Field(
        default_factory=dict, description="zone -> {enter|leave|occupancy: {class: n}}"
    )
    lines: Annotated[dict[Key, PlaceCounts], Field(max_length=MAX_MAP_KEYS)] = Field(
        default_factory=dict, description="line -> {direction: {class: n}}"
    )


class EventMessage(WireMessage):
    """One event of one camera of a device (``edgekit/v1/<fleet>/<device>/events``, QoS 1).

    De-duplicate on ``(device, id)``: a message can arrive twice after a reconnect.  ``t`` is
    the capture time of the frame that decided the event, ``frame_index`` its index in the
    camera's stream; ``since_t`` when what it reports began (a stay, a run of frames, a count's
    interval).  Fields that do not apply to the kind are left out.
    """

    schema_: Literal["edgekit/v1/event"] = Field(alias="schema")
    device: Name
    fleet: Name | None = None
    session: str | None = Field(default=None, description="the publishing process's id")
    epoch: str = Field(default="", max_length=32, description="the device spool's epoch: seq is unique in it")
    seq: Count = Field(description="numbers the device's event messages (a gap is a lost event)")
    sent_at: float | None = Field(default=None, description="seconds since the epoch")
    id: str = Field(
        pattern=EVENT_ID_PATTERN, description="the event's stable id: the same event always has the same"
    )
    kind: Literal["enter", "leave", "dwell", "cross", "present", "count"]
    camera: CameraName
    zone: Key | None = Field(default=None, description="the zone or line; absent for a count event")
    t: float = Field(description="capture time of the deciding frame, seconds since the epoch")
    frame_index: Count
    track_id: Count | None = None
    class_name: ClassName | None = None
    direction: Key | None = Field(default=None, description="a crossing's direction (cross events)")
    dwell_s: float | None = Field(default=None, ge=0)
    since_t: float | None = None
    # A list, not a tuple: strict validation of the dict a sender builds takes no list as a tuple.
    box: list[float] | None = Field(
        default=None, min_length=4, max_length=4, description="x0, y0, x1, y1 in frame pixels"
    )
    counts: EventCounts | None = Field(default=None, description="count events only")

    @model_validator(mode="after")
    def _fits_its_kind(self) -> EventMessage:
        if self.kind == "count":
            if self.counts is None:
                raise ValueError("a count event needs its counts")
        elif self.zone is None:
            raise ValueError(f"a {self.kind} event needs its zone or line")
        if self.kind == "cross" and self.direction is None:
            raise ValueError("a cross event needs its direction")
        return self
