"""The Sparkplug B 3.0 flavour of telemetry: protobuf payloads, births, deaths and rebirths.

Mapping: the fleet is the Sparkplug *group*, the device id the *edge node*, and the
pipeline on it the *device* ``pipeline``::

    spBv1.0/<fleet>/NBIRTH/<device-id>            node birth: bdSeq, Node Control/Rebirth, edgekit facts
    spBv1.0/<fleet>/NDEATH/<device-id>            the MQTT Will: bdSeq of the session that died
    spBv1.0/<fleet>/DBIRTH/<device-id>/pipeline   every metric DDATA will carry, with the model facts
    spBv1.0/<fleet>/DDATA/<device-id>/pipeline    each window: counters, percentiles, sketches, gauges
                                                  (and per camera, of many: frames, misses, drops, percentiles),
                                                  the sources' health (``health/<field>``, per camera too);
                                                  or one zone or line event (``event/...``, see below)
    spBv1.0/<fleet>/NCMD/<device-id>              commands; ``Node Control/Rebirth = true`` is honoured

DDATA goes out with QoS 1, not the QoS 0 the specification asks for: it leaves the device's
spool only on the broker's PUBACK, so a link that drops silently loses no window (a host
application cannot tell the publisher's QoS; it may see a window twice, with the same
``telemetry/seq`` metric).  Births stay QoS 0: every connect sends them again.

An event (``edgekit.protocol.event_messages``) is a DDATA of its own on the same device, with the
metrics ``EVENT_METRICS`` names: ``event/json`` (the whole JSON event message, what a fleet
collector reads) and, for SCADA tools, ``event/id``, ``event/kind``, ``event/camera``,
``event/zone`` (``""`` for none) and ``event/t``.  DBIRTH declares them (blank) with the rest.
A host drops a repeated event by ``event/id``.

``seq`` runs 0..255 over every message of the node after NBIRTH (which has 0); ``bdSeq``
rises with every MQTT session and is kept in the spool.  The payload schema is
``org.eclipse.tahu.protobuf.Payload`` (the fields edgekit uses, same numbers and types as
the specification's ``sparkplug_b.proto``), built at run time: no generated code to ship.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from functools import cache
from typing import Any

from edgekit.core.tally import SourceHealth


def _loads(text: str) -> Any:
    """JSON (only JSON) of a sketch metric; orjson when installed: a collector reads thousands a second."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - the fleet extra installs it
        return json.loads(text)
    return orjson.loads(text)


NAMESPACE = "spBv1.0"
DEVICE = "pipeline"
REBIRTH = "Node Control/Rebirth"

# Sparkplug B DataType codes (specification 6.4.16).
INT64, UINT64, DOUBLE, BOOLEAN, STRING = 4, 8, 10, 11, 12


@cache
def payload_class() -> Any:
    """The ``Payload`` message class (protobuf), with its nested ``Metric``."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="edgekit/sparkplug_b.proto", package="org.eclipse.tahu.protobuf", syntax="proto2"
    )
    payload = fdp.message_type.add(name="Payload")
    metric = payload.nested_type.add(name="Metric")
    metric.oneof_decl.add(name="value")

    def add(msg: Any, name: str, number: int, kind: int, repeated: bool = False, **kw: Any) -> None:
        label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
        msg.field.add(name=name, number=number, type=kind, label=label, **kw)

    add(payload, "timestamp", 1, F.TYPE_UINT64)
    add(payload, "metrics", 2, F.TYPE_MESSAGE, True, type_name=".org.eclipse.tahu.protobuf.Payload.Metric")
    add(payload, "seq", 3, F.TYPE_UINT64)
    add(payload, "uuid", 4, F.TYPE_STRING)
    add(payload, "body", 5, F.TYPE_BYTES)
    for name, number, kind in (
        ("name", 1, F.TYPE_STRING),
        ("alias", 2, F.TYPE_UINT64),
        ("timestamp", 3, F.TYPE_UINT64),
        ("datatype", 4, F.TYPE_UINT32),
        ("is_historical", 5, F.TYPE_BOOL),
        ("is_transient", 6, F.TYPE_BOOL),
        ("is_null", 7, F.TYPE_BOOL),
    ):
        add(metric, name, number, kind)
    for name, number, kind in (
        ("int_value", 10, F.TYPE_UINT32),
        ("long_value", 11, F.TYPE_UINT64),
        ("float_value", 12, F.TYPE_FLOAT),
        ("double_value", 13, F.TYPE_DOUBLE),
        ("boolean_value", 14, F.TYPE_BOOL),
        ("string_value", 15, F.TYPE_STRING),
        ("bytes_value", 16, F.TYPE_BYTES),
    ):
        add(metric, name, number, kind, oneof_index=0)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("org.eclipse.tahu.protobuf.Payload"))


def _kind(value: Any) -> int:
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):
        return UINT64 if value >= 0 else INT64
    if isinstance(value, float):
        return DOUBLE
    return STRING


def encode(
    metrics: dict[str, Any], seq: int | None, *, ts_ms: int | None = None, historical: bool = False
) -> bytes:
    """A Payload with one metric per item (type from the Python value), ``seq`` and a timestamp."""
    msg = payload_class()()
    now = ts_ms if ts_ms is not None else int(time.time() * 1000)
    msg.timestamp = now
    if seq is not None:
        msg.seq = seq
    for name, value in metrics.items():
        m = msg.metrics.add()
        m.name = name
        m.timestamp = now
        kind = _kind(value)
        m.datatype = kind
        if historical:
            m.is_historical = True
        if value is None:
            m.is_null = True
        elif kind == BOOLEAN:
            m.boolean_value = value
        elif kind == UINT64:
            m.long_value = value
        elif kind == INT64:
            m.long_value = value & 0xFFFFFFFFFFFFFFFF  # two's complement, as the specification says
        elif kind == DOUBLE:
            m.double_value = value
        else:
            m.string_value = str(value)
    out: bytes = msg.SerializeToString()
    return out


def decode(data: bytes) -> dict[str, Any]:
    """A Payload as plain data: timestamp, seq and ``metrics`` by name (for tests and tools)."""
    msg = payload_class()()
    msg.ParseFromString(data)
    metrics: dict[str, Any] = {}
    for m in msg.metrics:
        which = m.WhichOneof("value")
        metrics[m.name] = None if m.is_null or which is None else getattr(m, which)
    return {
        "timestamp": msg.timestamp,
        "seq": msg.seq if msg.HasField("seq") else None,
        "metrics": metrics,
        "historical": any(m.is_historical for m in msg.metrics),
    }


def read_metrics(data: bytes) -> tuple[int, dict[str, Any]]:
    """The timestamp and the metrics by name of a Payload, and nothing else: a collector's hot path.

    A metric without a value (``is_null``) reads as ``None``.  Raises protobuf's ``DecodeError``
    on bytes that are not a Payload.
    """
    msg = payload_class().FromString(data)
    metrics: dict[str, Any] = {}
    for m in msg.metrics:  # one attribute read less per metric than decode(): ~30% faster
        which = m.WhichOneof("value")
        metrics[m.name] = getattr(m, which) if which is not None else None
    return msg.timestamp, metrics


def topic(fleet: str, kind: str, node: str, device: str | None = None) -> str:
    return f"{NAMESPACE}/{fleet}/{kind}/{node}" + (f"/{device}" if device else "")


def window_metrics(payload: dict[str, Any]) -> dict[str, Any]:
    """DDATA metrics from a JSON telemetry payload: counters, percentiles and sketches per stage, gauges.

    The percentiles are for SCADA tools that read Sparkplug; the ``<stage>/sketch`` strings
    (the sketch's compact JSON) are what a fleet collector merges: fleet percentiles come
    from merged sketches, never from averaged percentiles.
    """
    from edgekit.core.sketch import LatencySketch

    out: dict[str, Any] = {}
    window = payload["window"]
    out["window/start"] = float(window["start"])
    out["window/end"] = float(window["end"])
    out["window/frames"] = int(window["frames"])
    out["window/missed"] = int(window["missed"])
    out["window/fps"] = float(window["fps"])
    for stage, sketch in {"latency": window["latency_ms"], **window["stages_ms"]}.items():
        s = LatencySketch.from_dict(sketch)
        for q in (50, 90, 99):
            # Always a Double (NaN for a window without frames): a metric keeps the type DBIRTH declared.
            out[f"{stage}/p{q}_ms"] = float(s.quantile(q / 100))
        out[f"{stage}/sketch"] = json.dumps(sketch, separators=(",", ":"))
    for name, value in payload["counters"].items():
        out[f"counters/{name}"] = int(value)
    for name, value in payload["gauges"].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[f"gauges/{name}"] = float(value)
        elif name == "temperature_c" and isinstance(value, dict):
            for zone, c in value.items():
                out[f"gauges/temperature_c/{zone}"] = float(c)
    # A detector's per-class counts, ``detections/<class>/{frames,objects,max_score}`` (the class
    # may hold a "/": its field is after the last one).  A classifier's DDATA has none.
    for name, count in (window.get("detections") or {}).items():
        out[f"detections/{name}/frames"] = int(count["frames"])
        out[f"detections/{name}/objects"] = int(count["objects"])
        out[f"detections/{name}/max_score"] = float(count["max_score"])
    # A many-camera pipeline's per-camera figures, ``cameras/<name>/{frames,missed,dropped}`` and
    # ``cameras/<name>/latency_ms/p50|p90|p99`` (percentiles only: the fleet merges the window's
    # sketches, not these).  A single source's DDATA has none.
    for name, cam in (window.get("cameras") or {}).items():
        out[f"cameras/{name}/frames"] = int(cam["frames"])
        out[f"cameras/{name}/missed"] = int(cam["missed"])
        out[f"cameras/{name}/dropped"] = int(cam["dropped"])
        s = LatencySketch.from_dict(cam["latency_ms"])
        for q in (50, 90, 99):
            out[f"cameras/{name}/latency_ms/p{q}"] = float(s.quantile(q / 100))
    # How the sources kept delivering, ``health/<field>`` (the sources together) and each camera's
    # ``cameras/<name>/health/<field>``: counts as Int64, the seconds as Double.
    out |= _health_metrics("health", window.get("health"))
    for name, cam in (window.get("cameras") or {}).items():
        out |= _health_metrics(f"cameras/{name}/health", cam.get("health"))
    out["telemetry/seq"] = int(payload["seq"])
    out["telemetry/epoch"] = str(payload.get("epoch", ""))
    return out


def _health_metrics(prefix: str, health: Mapping[str, Any] | None) -> dict[str, Any]:
    if not health:
        return {}
    out: dict[str, Any] = {f"{prefix}/{name}": int(health.get(name, 0)) for name in SourceHealth.COUNTS}
    for name in ("down_s", "since_frame_s"):
        out[f"{prefix}/{name}"] = float(health.get(name, 0.0))
    return out


def _typed(metrics: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = metrics.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"metric {name!r} is {type(value).__name__}, not {getattr(kind, '__name__', kind)}")
    return value


def telemetry_body(
    metrics: Mapping[str, Any], *, fleet: str, device: str, ts_ms: int, session: str = ""
) -> dict[str, Any]:
    """The JSON telemetry payload (``edgekit/v1/telemetry``) a DDATA's metrics stand for: ``window_metrics`` reversed.

    Raises ``ValueError`` when a metric the body needs is missing or of the wrong type; the
    sketches are parsed as JSON only (the caller checks them as it checks any JSON telemetry).
    """
    stages: dict[str, Any] = {}
    counters: dict[str, Any] = {}
    gauges: dict[str, Any] = {}
    detections: dict[str, dict[str, Any]] = {}
    health: dict[str, Any] = {}
    for name, value in metrics.items():
        group, _, rest = name.partition("/")
        if group == "health":
            health[rest] = value  # checked with the rest of the body by the caller (Telemetry's model)
        elif group == "detections":
            cls, _, part = rest.rpartition("/")
            if part not in ("frames", "objects", "max_score") or not cls:
                raise ValueError(f"metric {name!r} is not detections/<class>/<frames|objects|max_score>")
            detections.setdefault(cls, {})[part] = value
        elif group == "counters":
            counters[rest] = value
        elif group == "gauges":
            if not isinstance(value, float) or not math.isfinite(value):
                continue  # declared at birth but not measured (NaN): the JSON body leaves it out
            zone = rest.partition("temperature_c/")[2]
            if zone:
                gauges.setdefault("temperature_c", {})[zone] = value
            else:
                gauges[rest] = value
        elif rest == "sketch" and group != "latency":
            stages[group] = _loads(_typed(metrics, name, str))
    window: dict[str, Any] = {
        "start": _typed(metrics, "window/start", float),
        "end": _typed(metrics, "window/end", float),
        "frames": _typed(metrics, "window/frames", int),
        "missed": _typed(metrics, "window/missed", int),
        "fps": _typed(metrics, "window/fps", float),
        "latency_ms": _loads(_typed(metrics, "latency/sketch", str)),
        "stages_ms": stages,
    }
    if detections:  # checked with the rest of the body by the caller (Telemetry's model)
        window["detections"] = detections
    if health:
        window["health"] = health
    return {
        "schema": "edgekit/v1/telemetry",
        "device": device,
        "fleet": fleet,
        "session": session,
        "epoch": metrics.get("telemetry/epoch") or "",
        "seq": _typed(metrics, "telemetry/seq", int),
        "sent_at": ts_ms / 1000,
        "window": window,
        "counters": counters,
        "gauges": gauges,
        "spool": {},
    }


def birth_facts(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Properties/...`` metrics of a birth as the JSON status birth has them (``Properties/model/name`` -> model.name)."""
    facts: dict[str, Any] = {}
    for name, value in metrics.items():
        if not name.startswith("Properties/"):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"metric {name!r} is {value}")
        path = name.split("/")[1:]
        if len(path) > 2 or not all(path):
            raise ValueError(f"property {name!r} is nested deeper than the status birth")
        if len(path) == 1:
            facts[path[0]] = value
        else:
            group = facts.setdefault(path[0], {})
            if not isinstance(group, dict):
                raise ValueError(f"property {name!r} under a plain value")
            group[path[1]] = value
    return facts


#: The metrics an event's DDATA carries, with the blank value (of each one's type) DBIRTH declares.
EVENT_METRICS: dict[str, Any] = {
    "event/json": "",
    "event/id": "",
    "event/kind": "",
    "event/camera": "",
    "event/zone": "",
    "event/t": 0.0,
}


def event_metrics(body: Mapping[str, Any]) -> dict[str, Any]:
    """DDATA metrics from a JSON event message (``edgekit/v1/event``): the message itself and its key fields."""
    return {
        "event/json": json.dumps(body, separators=(",", ":")),
        "event/id": str(body["id"]),
        "event/kind": str(body["kind"]),
        "event/camera": str(body["camera"]),
        "event/zone": str(body.get("zone") or ""),
        "event/t": float(body["t"]),
    }


def is_event(metrics: Mapping[str, Any]) -> bool:
    """Whether a DDATA's metrics are an event's (else a telemetry window's)."""
    return "event/json" in metrics


def event_body(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON event message an event DDATA carries (parsed only: the caller checks it against its model).

    Raises ``ValueError`` when ``event/json`` is not a JSON object.
    """
    body = _loads(_typed(metrics, "event/json", str))
    if not isinstance(body, dict):
        raise ValueError("metric 'event/json' is not a JSON object")
    return body
