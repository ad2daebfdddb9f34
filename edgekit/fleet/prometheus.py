"""``/metrics``: the fleet's cumulative totals in the Prometheus text exposition format (0.0.4).

Rendered from our own sketches rather than through ``prometheus_client``: the server holds a
cumulative ``LatencySketch`` per device and stage, and a histogram's buckets are read off it
at scrape time.  Every device gets the same fixed buckets so ``histogram_quantile`` can sum
them across a fleet, and the buckets sit tightly around the common frame budgets (60, 30,
20, 15 and 10 fps) so "p95 over budget" is decided at a bucket edge, not by interpolation.

A bucket count is ``count(values <= le)`` as well as a 1 % sketch allows: values at or below
``le * 0.99`` are always counted and values above ``le * 1.01`` never are; a value within 1 %
of ``le`` may land on either side.  ``_sum``, ``_count`` and the ``+Inf`` bucket are exact.

(A frame of exactly 33.3 ms, for one, counts above the 0.0333 edge: its sketch bucket's
representative value is 33.45 ms.)  A bucket's count is a sum of sketch counts alone, so as
the cumulative sketch grows no bucket ever goes down.

Each camera's health (``edgekit.fleet.camera_health``) is what its device last said: its own
counts since its pipeline started (outages, reopens, stalls, corrupt frames, size changes,
seconds without frames), which a device restart resets (``rate()`` and ``increase()`` read that
as a reset), and the seconds since its last frame, a gauge.  A single source has ``camera=""``
(no label, to Prometheus).

Every device series carries the ``fleet`` and ``device`` labels; the collector's own series
(messages by kind, rejections by reason, lag) carry neither.  Counters are the view's totals
since the server started, so they never go down while it runs (a restart resets them, which
``rate()`` understands).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edgekit.core.sketch import LatencySketch
from edgekit.fleet.view import DeviceTotals

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds.  Each common budget (16.7, 33.3, 50, 66.7, 100 ms) is an edge, with edges a few
# ms either side of it, so the buckets bracket a budget tightly where the alert decides.
FRAME_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.0125,
    0.015,
    0.0167,
    0.02,
    0.025,
    0.03,
    0.0333,
    0.0375,
    0.045,
    0.05,
    0.06,
    0.0667,
    0.075,
    0.09,
    0.1,
    0.125,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
)
# Stages are parts of a frame: fewer, wider buckets reaching further down (a sink takes ~0.1 ms).
STAGE_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.0167,
    0.025,
    0.0333,
    0.05,
    0.0667,
    0.1,
    0.25,
    0.5,
    1.0,
)

# The quantiles of each camera's latency summary: a camera gets a few series, not a histogram's two dozen
# (a device may run 64 cameras); the device's own histogram still sums across a fleet.
CAMERA_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)

# The birth fields that become labels of edgekit_device_info.
INFO_LABELS: tuple[str, ...] = ("profile", "model", "version", "backend", "precision", "edgekit")
# Birth fields are free text from the network: a model name of 200 kB must not become a label.
MAX_LABEL_VALUE = 128
# At most this many device series in one scrape (about 1,600 devices of a classifier's detail, some 18 MB):
# the online and most recently heard devices are exported first, and edgekit_metrics_devices says
# how many were left out.  A bigger fleet raises it (edgekit fleet serve --metrics-max-series).
MAX_SERIES = 250_000


def escape_label(value: object) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped.

    The value is also made valid UTF-8 (JSON lets a lone surrogate through, which would make
    the whole response unencodable) and cut to ``MAX_LABEL_VALUE`` characters.
    """
    text = "" if value is None else str(value)
    text = text.encode("utf-8", "replace").decode("utf-8")[:MAX_LABEL_VALUE]
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def cumulative_counts(sketch: LatencySketch, bounds_ms: Sequence[float]) -> list[int]:
    """For each upper bound (ms, ascending), how many of the sketch's values are ``<=`` it.

    A sketch bucket counts under a bound when its representative value (the one
    ``quantile`` reports, within 1 % of every value in the bucket) is ``<=`` the bound.
    Each count is a sum of the sketch's bucket counts alone, so while a cumulative sketch
    grows no histogram bucket ever goes down; taking a shortcut through the exact min or
    max would break that (a bound just above the max counts a value that a later, larger
    max no longer lets it count), and Prometheus would read the drop as a counter reset.
    """
    gamma = (1 + sketch.accuracy) / (1 - sketch.accuracy)
    items = sorted(sketch.buckets.items())
    out: list[int] = []
    seen, i = sketch.zero, 0
    for bound in bounds_ms:
        while i < len(items) and 2 * gamma ** items[i][0] / (1 + gamma) <= bound:
            seen += items[i][1]
            i += 1
        out.append(seen)
    return out


Labels = tuple[tuple[str, object], ...]


class _Family:
    """One metric family: its HELP and TYPE lines, then its samples (the format wants them together)."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: list[tuple[str, Labels, float]] = []

    def add(self, labels: Labels, value: float, suffix: str = "") -> None:
        self.samples.append((self.name + suffix, labels, value))

    def histogram(self, labels: Labels, sketch: LatencySketch, buckets: Sequence[float]) -> None:
        # Sketches are in ms, Prometheus wants seconds.
        counts = cumulative_counts(sketch, [b * 1000 for b in buckets])
        for le, n in zip(buckets, counts, strict=True):
            self.add((*labels, ("le", _number(le))), n, "_bucket")
        self.add((*labels, ("le", "+Inf")), sketch.count, "_bucket")
        self.add(labels, sketch.sum / 1000 if sketch.count else 0.0, "_sum")
        self.add(labels, sketch.count, "_count")

    def summary(self, labels: Labels, sketch: LatencySketch, quantiles: Sequence[float]) -> None:
        # A quantile of no values is NaN, as the format has it for an empty summary.
        for q in quantiles:
            self.add((*labels, ("quantile", _number(q))), sketch.quantile(q) / 1000)
        self.add(labels, sketch.sum / 1000 if sketch.count else 0.0, "_sum")
        self.add(labels, sketch.count, "_count")

    def lines(self) -> list[str]:
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        out = [f"# HELP {self.name} {help_text}", f"# TYPE {self.name} {self.kind}"]
        for name, labels, value in self.samples:
            if labels:
                pairs = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
                out.append(f"{name}{{{pairs}}} {_number(value)}")
            else:
                out.append(f"{name} {_number(value)}")
        return out


def _info(birth: Mapping[str, Any]) -> dict[str, object]:
    model = birth.get("model")
    name, version = (model.get("name"), model.get("version")) if isinstance(model, Mapping) else (model, None)
    return {
        "profile": birth.get("profile"),
        "model": name,
        "version": version,
        "backend": birth.get("backend"),
        "precision": birth.get("precision"),
        "edgekit": birth.get("edgekit"),
    }


# Each camera's health: (family, its SourceHealth field, HELP).  Counts are the device's own since its
# pipeline started; the last is a gauge.
HEALTH_FAMILIES: tuple[tuple[str, str, str], ...] = (
    (
        "edgekit_camera_outages_total",
        "outages",
        "Times the camera stopped delivering frames (stalls included).",
    ),
    (
        "edgekit_camera_reopens_total",
        "reopens",
        "Times the camera's source was opened again after an outage.",
    ),
    (
        "edgekit_camera_stalls_total",
        "stalls",
        "Outages where the camera's connection stayed open but no frame came (the watchdog's).",
    ),
    ("edgekit_camera_corrupt_frames_total", "corrupt", "Frames the decoder reported damaged, skipped."),
    (
        "edgekit_camera_size_changes_total",
        "size_changes",
        "Times the camera's frame size changed mid-stream.",
    ),
    (
        "edgekit_camera_rate_changes_total",
        "rate_changes",
        "Times the camera's frame rate changed mid-stream.",
    ),
    (
        "edgekit_camera_down_seconds_total",
        "down_s",
        "Seconds the camera delivered no frames in outages, the current one included.",
    ),
)
SINCE_FRAME = "edgekit_camera_seconds_since_frame"


def series_of(d: DeviceTotals) -> int:
    """How many samples ``render`` writes for ``d``."""
    camera = 3 + len(CAMERA_QUANTILES) + 2
    return (
        5
        + (len(HEALTH_FAMILIES) + 1) * len(d.health)
        + (d.last_seen is not None)
        + (d.budget_ms is not None)
        + bool(d.birth)
        + 2 * len(d.detections or {})
        + camera * len(d.cameras or {})
        + len(FRAME_BUCKETS)
        + 3
        + (len(STAGE_BUCKETS) + 3) * len(d.stages)
        + len(d.events)
    )


def bounded(devices: Iterable[DeviceTotals], max_series: int) -> tuple[list[DeviceTotals], int]:
    """The devices whose series fit in ``max_series`` (online, then the most recently heard first), in
    their given order, and how many were left out."""
    given = list(devices)
    ranked = sorted(range(len(given)), key=lambda i: (given[i].state != "online", -(given[i].last_seen or 0)))
    kept, room = set(), max_series
    for i in ranked:
        room -= series_of(given[i])
        if room < 0:
            break
        kept.add(i)
    return [d for i, d in enumerate(given) if i in kept], len(given) - len(kept)


def render(
    devices: Iterable[DeviceTotals], collector: Mapping[str, Any] | None = None, max_series: int = MAX_SERIES
) -> str:
    """The exposition text for ``devices`` (at most ``max_series`` of their samples) and the collector's counters.

    ``collector`` is ``view.collector_stats()``: ``seen`` (messages by kind), ``rejected``
    (by reason), ``lag_ms`` (e.g. ``{"p50": 3.1, "p99": 40.0}``), ``devices`` (``tracked``,
    ``max``), ``link`` (the MQTT reader's counters: ``connects``, ``too_large``,
    ``malformed``, ``restarts``...) and ``remote_write`` (``RemoteWriter.stats()``); missing parts are skipped.
    """
    f = {
        name: _Family(name, kind, text)
        for name, kind, text in (
            ("edgekit_device_up", "gauge", "1 when the device is online, 0 when offline (status or Will)."),
            ("edgekit_device_last_seen_timestamp_seconds", "gauge", "When the device was last heard from."),
            ("edgekit_budget_seconds", "gauge", "The device's frame budget."),
            ("edgekit_device_info", "gauge", "What the device runs, from its birth message; always 1."),
            ("edgekit_frames_total", "counter", "Frames the device reported since the server started."),
            ("edgekit_frames_missed_total", "counter", "Frames over budget since the server started."),
            ("edgekit_windows_total", "counter", "Telemetry windows accepted since the server started."),
            ("edgekit_telemetry_gaps_total", "counter", "Jumps in the device's telemetry sequence."),
            (
                "edgekit_detections_total",
                "counter",
                "Objects a detector found since the server started, by class (at most 256 per device, the rest as other).",
            ),
            (
                "edgekit_detection_frames_total",
                "counter",
                "Frames with at least one detection of the class since the server started.",
            ),
            (
                "edgekit_camera_frames_total",
                "counter",
                "Frames of each camera of a many-camera device since the server started.",
            ),
            (
                "edgekit_camera_missed_total",
                "counter",
                "Frames of each camera over budget since the server started.",
            ),
            (
                "edgekit_camera_dropped_total",
                "counter",
                "Frames each camera's slot dropped (never inferred) since the server started.",
            ),
            (
                "edgekit_camera_latency_seconds",
                "summary",
                "Frame latency of each camera, capture to sink, from its merged sketch since the server started.",
            ),
            *(
                (name, "counter", text + " As the device last said, since its pipeline started.")
                for name, _, text in HEALTH_FAMILIES
            ),
            (
                SINCE_FRAME,
                "gauge",
                "Seconds since the camera's last frame, as the device last said (0 while frames flow).",
            ),
            (
                "edgekit_events_total",
                "counter",
                "Zone and line events the device sent since the server started, by camera, zone or line "
                "(none for count events) and kind; each event once, however often it arrived.",
            ),
            ("edgekit_frame_latency_seconds", "histogram", "Frame latency, capture to sink."),
            ("edgekit_stage_latency_seconds", "histogram", "Latency of each stage of a frame."),
            (
                "edgekit_metrics_devices",
                "gauge",
                "Devices in this scrape (exported) and left out to keep it within its series limit "
                "(omitted: the offline and least recently heard).",
            ),
        )
    }
    devices, omitted = bounded(devices, max_series)
    f["edgekit_metrics_devices"].add((("which", "exported"),), len(devices))
    f["edgekit_metrics_devices"].add((("which", "omitted"),), omitted)
    for d in devices:
        who: Labels = (("fleet", d.fleet), ("device", d.device))
        f["edgekit_device_up"].add(who, 1 if d.state == "online" else 0)
        if d.last_seen is not None:
            f["edgekit_device_last_seen_timestamp_seconds"].add(who, d.last_seen)
        if d.budget_ms is not None:
            # Rounded so 33.3 ms is 0.0333 s, equal to the bucket edge, not 0.033299999999999996.
            f["edgekit_budget_seconds"].add(who, float(f"{d.budget_ms / 1000:.9g}"))
        if d.birth:
            f["edgekit_device_info"].add((*who, *_info(d.birth).items()), 1)
        f["edgekit_frames_total"].add(who, d.frames)
        f["edgekit_frames_missed_total"].add(who, d.missed)
        f["edgekit_windows_total"].add(who, d.windows)
        f["edgekit_telemetry_gaps_total"].add(who, d.gaps)
        # Class names come from devices: bounded in number by the view, escaped and cut by escape_label.
        for name, count in sorted((d.detections or {}).items()):
            f["edgekit_detections_total"].add((*who, ("class", name)), count.objects)
            f["edgekit_detection_frames_total"].add((*who, ("class", name)), count.frames)
        # Camera names come from devices: bounded in number by the view, escaped and cut by escape_label.
        for name, camera in sorted((d.cameras or {}).items()):
            at: Labels = (*who, ("camera", name))
            f["edgekit_camera_frames_total"].add(at, camera.frames)
            f["edgekit_camera_missed_total"].add(at, camera.missed)
            f["edgekit_camera_dropped_total"].add(at, camera.dropped)
            f["edgekit_camera_latency_seconds"].summary(at, camera.latency, CAMERA_QUANTILES)
        for name, health in sorted(d.health.items()):
            at = (*who, ("camera", name))
            for metric, field, _ in HEALTH_FAMILIES:
                f[metric].add(at, getattr(health, field))
            f[SINCE_FRAME].add(at, health.since_frame_s)
        # Cameras and zones come from devices: bounded in number by the view, escaped and cut by escape_label.
        for (camera_name, zone, kind), n in sorted(d.events.items()):
            f["edgekit_events_total"].add((*who, ("camera", camera_name), ("zone", zone), ("kind", kind)), n)
        f["edgekit_frame_latency_seconds"].histogram(who, d.latency, FRAME_BUCKETS)
        for stage, sketch in sorted(d.stages.items()):
            f["edgekit_stage_latency_seconds"].histogram((*who, ("stage", stage)), sketch, STAGE_BUCKETS)
    families = list(f.values())
    if collector is not None:
        families += _collector_families(collector)
    lines: list[str] = []
    for family in families:
        lines += family.lines()
    return "\n".join(lines) + "\n"


def _collector_families(stats: Mapping[str, Any]) -> list[_Family]:
    seen = _Family("edgekit_collector_messages_total", "counter", "Messages the collector accepted, by kind.")
    for kind, n in sorted(dict(stats.get("seen") or {}).items()):
        seen.add((("kind", kind),), int(n))
    rejected = _Family(
        "edgekit_collector_rejected_total", "counter", "Messages the collector refused, by reason."
    )
    for reason, n in sorted(dict(stats.get("rejected") or {}).items()):
        rejected.add((("reason", reason),), int(n))
    lag = _Family(
        "edgekit_collector_lag_seconds",
        "gauge",
        "From a telemetry window's sending to its ingestion, by statistic (p50, p99).",
    )
    for stat, ms in sorted(dict(stats.get("lag_ms") or {}).items()):
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms):
            lag.add((("stat", stat),), ms / 1000)
    devices = _Family(
        "edgekit_collector_devices", "gauge", "Devices the collector tracks, and the most it will (limit)."
    )
    for which, n in sorted(dict(stats.get("devices") or {}).items()):
        if isinstance(n, int) and not isinstance(n, bool):
            devices.add((("which", which),), n)
    link = _Family(
        "edgekit_collector_link_events_total",
        "counter",
        "The MQTT reader: messages read, connects, messages too large (drained), malformed packets "
        "(connection ended), reader restarts, handler errors, reads left unacknowledged (the store "
        "could not take them; the broker delivers them again).",
    )
    for event, n in sorted(dict(stats.get("link") or {}).items()):
        if isinstance(n, int) and not isinstance(n, bool):
            link.add((("event", event),), n)
    pushed = _Family(
        "edgekit_collector_remote_write_total",
        "counter",
        "The push to a time-series database (--remote-write): pushes, push failures, samples sent, "
        "samples dropped (the database away too long, or refusing them), windows folded, windows dropped "
        "(the queue full), windows late (pushed at their device's latest time).",
    )
    waiting = _Family(
        "edgekit_collector_remote_write_waiting",
        "gauge",
        "What waits for the time-series database: queued windows and pending samples.",
    )
    for event, n in sorted(dict(stats.get("remote_write") or {}).items()):
        if isinstance(n, int) and not isinstance(n, bool):
            if event in ("queued_windows", "pending_samples"):
                waiting.add((("what", event),), n)
            else:
                pushed.add((("event", event),), n)
    return [seen, rejected, lag, devices, link, *((pushed, waiting) if stats.get("remote_write") else ())]
