"""What a device publishes: telemetry windows, its status (online with the birth facts, or offline), labels.

One model per payload, used by both sides: ``edgekit.telemetry`` builds its messages with
them and ``edgekit.fleet``'s collector validates what arrives into them.  A model says what
a receiver accepts, which is a little more than a current sender sends: fields an older
device may leave out are optional, and fields this version does not know are kept
(``extra="allow"``), so an older or a newer device still reports.  The JSON Schemas in
``edgekit/protocol/schema/`` are generated from these models (``edgekit.protocol.schemas``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    model_validator,
)

from edgekit.core.sketch import DEFAULT_ACCURACY
from edgekit.protocol.stages import STAGES

# What an SQLite or PostgreSQL BIGINT column holds: counts beyond it cannot be stored.
MAX_INT = 2**63
# Sketch bucket keys beyond this stand for values outside 1e-17..1e17 ms (accuracy 1%): nonsense
# that would overflow ``math.exp`` when a merged sketch is asked for a quantile.
MAX_BUCKET_KEY = 2000
_BUCKET_KEYS = frozenset(str(k) for k in range(-MAX_BUCKET_KEY, MAX_BUCKET_KEY + 1))
_SHA256 = r"^[0-9a-f]{64}$"
# A window's per-class detection counts: class names come from the device, so both the number of
# classes and each name's length are bounded (a sender folds the rest into OTHER_CLASS).
MAX_DETECTION_CLASSES = 64
MAX_CLASS_NAME = 64
OTHER_CLASS = "other"
# A labels message lists at most this many of the newest frame's detections (best first).
MAX_LABEL_DETECTIONS = 100
# A window's per-camera figures: at most this many cameras (a sender folds the rest into
# OTHER_CAMERA), each name as long as a pipeline allows.
MAX_CAMERAS = 64
MAX_CAMERA_NAME = 64
OTHER_CAMERA = "other"
# The other maps a window carries (stages, counters, thermal zones) have keys a device names: bounded
# too, so a valid message cannot carry a quarter MiB of made-up keys into the fleet's store.
MAX_MAP_KEYS = 64
MAX_KEY = 64


class WireMessage(BaseModel):
    """The base of every message model: strict types (JSON ``true`` is not the count 1), finite numbers.

    Unknown fields are kept, not refused: a newer sender must still reach an older receiver.
    """

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow", frozen=True)


#: A count: a non-negative integer a BIGINT column holds.
Count = Annotated[int, Field(ge=0, le=MAX_INT - 1)]  # le, not lt: keeps the check on 64-bit integers
#: A device or fleet name as its payload says it (the topic's names are checked by their own rule).
Name = Annotated[str, Field(min_length=1)]
#: A key of a map a device names (a stage, a counter, a thermal zone).
Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY)]


def _check_buckets(buckets: Any, info: ValidationInfo) -> dict[str, int]:
    # By hand, not as dict[str, Count] plus a model validator: this runs six times a telemetry
    # message, and one set comparison against every canonical key plus one sum() is a third of
    # what per-item validation costs.  "012", "-0" or " 12" (which would collide when read back)
    # are refused.  The fields before ``buckets`` are in ``info.data`` when they were valid.
    if type(buckets) is not dict:
        raise ValueError("buckets must be an object")
    if not _BUCKET_KEYS.issuperset(buckets):
        raise ValueError(f"bucket keys must be integers from -{MAX_BUCKET_KEY} to {MAX_BUCKET_KEY}")
    total = info.data.get("zero", 0)
    if buckets:
        counts = buckets.values()
        try:
            total += sum(counts)  # a float among the counts makes this a float
        except TypeError:
            raise ValueError("bucket counts must be integers") from None
        if type(total) is not int or min(counts) < 0:
            raise ValueError("bucket counts must be non-negative integers")
    if "count" in info.data and total != info.data["count"]:
        raise ValueError("sketch counts do not add up: zero + buckets != count")
    return buckets


def _check_accuracy(accuracy: float) -> float:
    # Sketches of one accuracy merge exactly; another accuracy would break the fleet's queries.
    if accuracy != DEFAULT_ACCURACY:
        raise ValueError(f"sketch accuracy {accuracy} is not {DEFAULT_ACCURACY}")
    return accuracy


#: Bucket key -> count, checked by ``_check_buckets`` (the schema says what it checks).
Buckets = Annotated[dict[str, Count], PlainValidator(_check_buckets, json_schema_input_type=dict[str, Count])]


class Sketch(WireMessage):
    """A latency sketch (DDSketch, milliseconds): counts per logarithmic bucket, mergeable by adding counts.

    Bucket k holds values in (gamma^(k-1), gamma^k], gamma = (1+accuracy)/(1-accuracy).  Only
    sketches of the fleet's one accuracy are accepted: other accuracies would not merge exactly.
    ``zero`` plus the bucket counts is ``count``; ``min`` and ``max`` are null only when it is 0.
    """

    accuracy: Annotated[float, AfterValidator(_check_accuracy)] = Field(
        json_schema_extra={"const": DEFAULT_ACCURACY}, description="relative accuracy; must be the fleet's"
    )
    count: Count
    sum: float
    min: float | None = Field(description="null when count is 0")
    max: float | None = Field(description="null when count is 0")
    zero: Count = Field(description="values of 0 ms (they have no logarithm)")
    buckets: Buckets = Field(
        json_schema_extra={"propertyNames": {"pattern": "^(0|-?[1-9][0-9]{0,3})$"}},
        description="bucket key (a decimal integer) -> how many values fell in it",
    )

    @model_validator(mode="after")
    def _has_min_and_max(self) -> Sketch:
        if self.count and (self.min is None or self.max is None):
            raise ValueError("a sketch with values needs their min and max")
        return self


def _every_stage(stages: dict[str, Sketch]) -> dict[str, Sketch]:
    missing = [s for s in STAGES if s not in stages]
    if missing:
        raise ValueError(f"stages_ms lacks {', '.join(missing)}")
    return stages


#: A class name as a detection count or a labels message carries it (bounded: it comes from a device).
ClassName = Annotated[str, Field(min_length=1, max_length=MAX_CLASS_NAME)]


class DetectionCount(WireMessage):
    """One class over one window: frames with at least one detection of it, its detections, the best score."""

    frames: Count = Field(description="frames with at least one detection of this class")
    objects: Count = Field(description="detections of this class (a frame may hold several)")
    max_score: float = Field(ge=0, le=1, description="the highest score among them")

    @model_validator(mode="after")
    def _objects_cover_frames(self) -> DetectionCount:
        if self.objects < self.frames:
            raise ValueError("objects < frames: every counted frame holds at least one detection")
        return self


#: A camera's name in a pipeline of many, as a window or a labels message carries it.
CameraName = Annotated[str, Field(min_length=1, max_length=MAX_CAMERA_NAME)]


class Health(WireMessage):
    """How a source kept delivering, when the window closed: counts since the pipeline started, the
    seconds without frames (the current outage included), and the seconds since its last frame.

    Every field is optional (0): a device may know only some of them.
    """

    outages: Count = Field(default=0, description="times it stopped delivering (stalls included)")
    reopens: Count = Field(default=0, description="times it was opened again")
    stalls: Count = Field(default=0, description="outages with the connection open but no frame coming")
    corrupt: Count = Field(default=0, description="frames the decoder reported damaged, skipped")
    size_changes: Count = Field(default=0, description="times the frame size changed mid-stream")
    rate_changes: Count = Field(default=0, description="times the frame rate changed mid-stream")
    down_s: float = Field(
        default=0.0,
        ge=0,
        description="seconds without frames in outages since the pipeline started, "
        "the current one included (only goes up)",
    )
    since_frame_s: float = Field(default=0.0, ge=0, description="seconds since its last frame (a gauge)")


class CameraWindow(WireMessage):
    """One camera of a many-camera pipeline over one window: its frames, misses, drops and latency, its health."""

    frames: Count
    missed: Count = Field(description="its frames over the latency budget")
    dropped: Count = Field(description="frames its slot dropped before the window's frames")
    latency_ms: Sketch = Field(description="end-to-end latency of its frames")
    health: Health | None = Field(default=None, description="the camera's health; absent from older devices")


#: The most trace ids a window names (its slowest frames).
MAX_WINDOW_TRACES = 8


class TraceRef(WireMessage):
    """One of a window's slowest frames, whose trace the device exported over OTLP."""

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="W3C trace id, 32 lowercase hex digits")
    latency_ms: float = Field(ge=0, description="the frame's end-to-end latency")
    index: Count = Field(description="the frame's position in its source")
    camera: CameraName | None = Field(default=None, description="its camera, in a many-camera pipeline")


class Window(WireMessage):
    """One reporting window: its wall-clock span, frames and missed deadlines, the latency sketches.

    A detector's window also counts what it found per class (``detections``); a classifier's
    has no such field.  A device says how its sources kept delivering (``health``; each camera's
    in its own entry).  A pipeline of many cameras also reports each camera (``cameras``); a
    single-source pipeline's window has no such field.
    """

    start: float = Field(description="seconds since the epoch")
    end: float = Field(description="seconds since the epoch")
    frames: Count
    missed: Count = Field(description="frames over the latency budget")
    fps: float | None = Field(default=None, ge=0)
    latency_ms: Sketch = Field(description="end-to-end latency per frame")
    stages_ms: Annotated[dict[Key, Sketch], AfterValidator(_every_stage)] = Field(
        max_length=MAX_MAP_KEYS,
        json_schema_extra={"required": list(STAGES)},
        description=f"one sketch per stage: {', '.join(STAGES)} (more are kept)",
    )
    detections: dict[ClassName, DetectionCount] | None = Field(
        default=None,
        max_length=MAX_DETECTION_CLASSES,
        description=f"a detector's per-class counts (at most {MAX_DETECTION_CLASSES} classes, "
        f"the rest as {OTHER_CLASS!r}); absent for a classifier",
    )
    cameras: dict[CameraName, CameraWindow] | None = Field(
        default=None,
        max_length=MAX_CAMERAS,
        description=f"a many-camera pipeline's per-camera figures (at most {MAX_CAMERAS} cameras, "
        f"the rest as {OTHER_CAMERA!r}); absent for a single source",
    )
    health: Health | None = Field(
        default=None,
        description="the pipeline's sources together (a single source: its own); absent from older devices",
    )
    traces: list[TraceRef] | None = Field(
        default=None,
        max_length=MAX_WINDOW_TRACES,
        description="the trace ids of its slowest frames, slowest first; absent when the device does not trace",
    )

    @model_validator(mode="after")
    def _parts_within_frames(self) -> Window:
        for name, count in (self.detections or {}).items():
            if count.frames > self.frames:
                raise ValueError(f"detections of {name[:40]!r} in more frames than the window has")
        # Every frame comes from one camera: together they cannot have more than the window.
        if self.cameras and sum(c.frames for c in self.cameras.values()) > self.frames:
            raise ValueError("the cameras have more frames than the window has")
        return self


class Throttled(WireMessage):
    """A Raspberry Pi's throttling flags (``vcgencmd get_throttled``)."""

    now: bool | None = None
    since_boot: bool | None = None
    under_voltage: bool | None = None
    raw: int | None = None


class Gauges(WireMessage):
    """What the device measured of itself at the end of the window; each only where it can be read."""

    cpu_percent: float | None = None
    process_cpu_percent: float | None = None
    memory_total_mb: float | None = None
    memory_available_mb: float | None = None
    process_rss_mb: float | None = None
    gpu_percent: float | None = None
    cpu_freq_ratio: float | None = None
    temperature_c: dict[Key, float] | None = Field(
        default=None, max_length=MAX_MAP_KEYS, description="thermal zone -> degrees C"
    )
    throttled: Throttled | None = None


class SpoolState(WireMessage):
    """The device's spool when the window closed: messages and bytes still waiting for the broker."""

    pending: Count | None = None
    bytes: Count | None = None


class Telemetry(WireMessage):
    """One reporting window of one device (``edgekit/v1/<fleet>/<device>/telemetry``, QoS 1).

    De-duplicate on ``(device, epoch, seq)``: a message can arrive twice after a reconnect; a
    new epoch means the device's sequence restarted.  A device sends every field; older ones
    may lack ``epoch`` (then ``""``), ``sent_at``, ``gauges`` and ``spool``.
    """

    schema_: Literal["edgekit/v1/telemetry"] = Field(alias="schema")
    device: Name
    fleet: Name | None = None
    session: str | None = Field(default=None, description="the publishing process's id")
    epoch: str = Field(
        default="",
        max_length=32,
        description="made with the device's spool: seq is unique per (device, epoch)",
    )
    seq: Count
    sent_at: float | None = Field(default=None, description="seconds since the epoch")
    window: Window
    counters: dict[Key, Count] = Field(
        max_length=MAX_MAP_KEYS, description="the pipeline's and the reporting's counters (only go up)"
    )
    gauges: Gauges | None = None
    spool: SpoolState | None = None


class ModelFacts(WireMessage):
    """Which model and artifact the device runs."""

    name: str | None = None
    version: str | None = None
    sha256: str | None = Field(default=None, pattern=_SHA256, description="the fp32 source model's SHA-256")
    artifact: str | None = None
    artifact_sha256: str | None = Field(default=None, pattern=_SHA256)


class Status(WireMessage):
    """A device's presence (``edgekit/v1/<fleet>/<device>/status``, retained, QoS 1).

    ``online`` and the birth facts (what it runs: model, backend, precision, budget, profile,
    source, policy) on every connect; ``offline`` from the Last Will or a clean stop.
    """

    schema_: Literal["edgekit/v1/status"] = Field(alias="schema")
    state: Literal["online", "offline"]
    device: Name
    fleet: Name | None = None
    ts: float | None = Field(default=None, description="seconds since the epoch")
    session: str | None = None
    edgekit: str | None = Field(default=None, description="the device's edgekit version")
    model: ModelFacts | None = None
    candidate: str | None = None
    backend: str | None = None
    precision: str | None = None
    budget_ms: float | None = Field(default=None, gt=0)
    profile: str | None = None
    source: str | None = None
    policy: str | None = Field(default=None, description="drop-oldest, block or degrade")


class Label(WireMessage):
    """One class the model reported, with its score."""

    id: int
    name: str
    score: float


class BoxDetection(WireMessage):
    """One object a detector found: its class, score and box in frame pixels (x0, y0, x1, y1)."""

    class_id: int
    name: ClassName
    score: float = Field(ge=0, le=1)
    # A list, not a tuple: strict validation of the dict a sender builds takes no list as a tuple.
    box: list[float] = Field(min_length=4, max_length=4, description="x0, y0, x1, y1 in frame pixels")


class Labels(WireMessage):
    """What the model said lately (``edgekit/v1/<fleet>/<device>/labels``, QoS 0, optional).

    A classifier sends its top ``labels``; a detector sends ``labels: []`` (so a receiver from
    before detection still accepts it) and the frame's ``detections``, best first.  A pipeline
    of many cameras says which camera the frame came from (``camera``).
    """

    schema_: Literal["edgekit/v1/labels"] = Field(alias="schema")
    device: Name
    ts: float | None = None
    labels: list[Label]
    detections: list[BoxDetection] | None = Field(
        default=None, max_length=MAX_LABEL_DETECTIONS, description="a detector's objects, best first"
    )
    camera: CameraName | None = Field(
        default=None, description="the camera of the frame, in a pipeline of many; absent for a single source"
    )


def dump(message: BaseModel) -> dict[str, Any]:
    """A message as the plain dict a sender publishes: every field it was given, ``schema`` first."""
    return message.model_dump(mode="json", by_alias=True, exclude_unset=True)
