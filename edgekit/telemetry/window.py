"""``MetricsWindow``: what the frame loop hands to telemetry — a few sketch additions per frame, under a lock.

The frame path calls ``observe(record)`` (microseconds); the publisher thread calls
``take()`` on its timer, which swaps in a fresh window and returns the finished one.
Serialising, writing the spool and talking to the broker all happen on that thread.

A detector's window (``MetricsWindow(detections=True)``) also counts, per class name, the
frames with at least one detection, the detections, and the best score.  The class names
come from the model's labels, but a window never holds more than ``MAX_DETECTION_CLASSES``
of them (later ones are counted as ``other``) nor a name longer than ``MAX_CLASS_NAME``:
what the fleet accepts.

A pipeline of many cameras tags each record with its camera; the window then also keeps,
per camera, its frames, misses, drops (``dropped_before`` of its frames) and a latency
sketch.  Once seen, a camera is listed in every later window (with 0 frames while it sends
none), so a stalled camera shows.  At most ``MAX_CAMERAS`` are listed: the first
``MAX_CAMERAS - 1`` by name, every later one counted together as ``other`` (one warning),
so the cameras' frames still add up to the window's.  A single source's records have no
camera, and its windows no ``cameras``: its messages stay what they were.

Given ``health`` (``Pipeline.health``), a window closed by ``take`` also says how the sources
kept delivering (``SourceHealth``): the sources together as ``health``, each camera's in its
own entry.  It is asked when the window closes, on the publisher's thread: a stalled camera
sends no frames, but its seconds without them still reach the fleet.

Given ``traces`` (``FrameTracer.worst``), a closed window also names its slowest frames' trace
ids (``traces``), asked as it closes: the tracer's window closes with it, so they are the same frames.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekit.core.sketch import LatencySketch
from edgekit.core.tally import ClassCount, FrameTally, SourceHealth, count_detections
from edgekit.pipeline.records import FrameRecord
from edgekit.protocol.messages import (
    MAX_CAMERA_NAME,
    MAX_CAMERAS,
    MAX_CLASS_NAME,
    MAX_DETECTION_CLASSES,
    OTHER_CAMERA,
    OTHER_CLASS,
)
from edgekit.protocol.stages import STAGES

log = logging.getLogger(__name__)


def class_key(name: str, known: dict[str, ClassCount]) -> str:
    """The name a class is counted under: cut to ``MAX_CLASS_NAME``, ``other`` once the window is full."""
    key = name[:MAX_CLASS_NAME] or OTHER_CLASS
    if key in known or len(known) < MAX_DETECTION_CLASSES - 1:
        return key  # one place is kept for "other"
    return OTHER_CLASS


@dataclass(kw_only=True)
class Window(FrameTally):
    """One reporting window: its wall-clock span, its frames, misses and latency, the per-stage sketches.

    Its own ``dropped`` is not on the wire: a single source's drops travel in the message's
    ``counters`` (since the start), a many-camera pipeline's also per camera (``cameras``).
    """

    start: float
    end: float = 0.0
    stages: dict[str, LatencySketch] = field(default_factory=lambda: {s: LatencySketch() for s in STAGES})
    #: Per class, a detector's counts; ``None`` for a classifier (its message has no such field).
    detections: dict[str, ClassCount] | None = None
    #: Per camera, a many-camera pipeline's counts; ``None`` for a single source (no such field).
    cameras: dict[str, FrameTally] | None = None
    #: How the sources kept delivering when it closed, together; ``None`` when not asked (no field).
    health: SourceHealth | None = None
    #: Each camera's, under the name its figures are counted under (``cameras``).
    camera_health: dict[str, SourceHealth] | None = None
    #: Its slowest frames' traces (``edgekit.telemetry.tracing``), slowest first; ``None``: not traced.
    traces: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        span = self.end - self.start
        out: dict[str, Any] = {
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "frames": self.frames,
            "missed": self.missed,
            "fps": round(self.frames / span, 3) if span > 0 else 0.0,
            "latency_ms": self.latency.to_dict(),
            "stages_ms": {s: sk.to_dict() for s, sk in self.stages.items()},
        }
        if self.detections is not None:
            out["detections"] = {name: c.to_dict() for name, c in self.detections.items()}
        if self.cameras is not None:
            health = self.camera_health or {}
            out["cameras"] = {
                name: c.to_dict() | ({"health": health[name].to_dict()} if name in health else {})
                for name, c in self.cameras.items()
            }
        if self.health is not None:
            out["health"] = self.health.to_dict()
        if self.traces is not None:
            out["traces"] = self.traces
        return out


class MetricsWindow:
    """The pipeline observer that fills windows; thread-safe between the loop and the publisher."""

    def __init__(
        self,
        detections: bool = False,
        cameras: Iterable[str] = (),
        health: Callable[[], Mapping[str, SourceHealth]] | None = None,
        traces: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._health = health  # each camera's health now (``Pipeline.health``), asked as a window closes
        self._traces = traces  # the slowest frames' trace refs (``FrameTracer.worst``), asked likewise
        self.detections = detections  # a detector's windows count its detections per class
        # Camera -> the name it is counted under (itself, or "other" past the bound), kept across
        # windows; ``cameras`` names them up front, so the first window (and a birth) lists them all.
        self._camera_keys: dict[str, str] = {}
        self._camera_slots: dict[str, None] = {}  # the names a window lists, in first-seen order
        self._folded = False  # a camera was counted as "other" (warned once)
        for name in cameras:
            self._camera_key(name)
        self._window = self._new(time.time())

    def _new(self, start: float) -> Window:
        cameras = {key: FrameTally() for key in self._camera_slots} if self._camera_slots else None
        return Window(start=start, detections={} if self.detections else None, cameras=cameras)

    def _camera_key(self, camera: str) -> str:
        """The name ``camera`` is counted under, decided once: itself, or ``other`` once the window is full."""
        key = camera[:MAX_CAMERA_NAME]
        if key not in self._camera_slots and len(self._camera_slots) >= MAX_CAMERAS - 1:
            if not self._folded:
                self._folded = True
                log.warning(
                    "telemetry: more than %d cameras; %r and any later ones are reported together as %r",
                    MAX_CAMERAS - 1,
                    camera,
                    OTHER_CAMERA,
                )
            key = OTHER_CAMERA  # one place is kept for "other"
        self._camera_slots[key] = None
        self._camera_keys[camera] = key
        return key

    def blank(self, at: float) -> Window:
        """A window without frames that lists the cameras seen so far and their health (what a Sparkplug
        birth declares)."""
        with self._lock:
            w = self._new(at)
        w.end = at
        if self._health is not None:  # a birth declares the health metrics every window sends
            self._add_health(w, self._health())
        return w

    def observe(self, record: FrameRecord) -> None:
        with self._lock:
            w = self._window
            w.count(record.latency_ms, record.met, record.dropped_before)
            for stage, ms in record.stage_ms().items():
                w.stages[stage].add(ms)
            if record.camera:
                self._observe_camera(w, record)
            counts = w.detections
            if counts is None or not record.detections:
                return
            count_detections(
                counts,
                # min/max keep a bad score (NaN, above 1) from reaching the message: the fleet refuses it.
                (
                    (d.name, min(max(float(d.score), 0.0), 1.0) if d.score == d.score else 0.0)
                    for d in record.detections
                ),
                key=lambda name: class_key(name, counts),
            )

    def _observe_camera(self, w: Window, record: FrameRecord) -> None:
        # Under the lock.  Two dict look-ups on the usual path; the slow path runs once per camera.
        key = self._camera_keys.get(record.camera)
        if key is None:
            key = self._camera_key(record.camera)
        cams = w.cameras
        if cams is None:
            cams = w.cameras = {}
        c = cams.get(key)
        if c is None:
            c = cams[key] = FrameTally()
        c.count(record.latency_ms, record.met, record.dropped_before)

    def take(self) -> Window:
        """The window so far (closed now); a new one starts."""
        now = time.time()
        with self._lock:
            done, self._window = self._window, self._new(now)
        done.end = now
        if self._health is not None:
            self._add_health(done, self._health())
        if self._traces is not None:
            done.traces = self._traces()
        return done

    def _add_health(self, w: Window, health: Mapping[str, SourceHealth]) -> None:
        w.health = SourceHealth()
        for h in health.values():
            w.health.add(h)
        if w.cameras is None:
            return
        w.camera_health = {}
        with self._lock:
            keys = dict(self._camera_keys)
        for camera, h in health.items():
            key = keys.get(camera)
            if key is not None and key in w.cameras:
                w.camera_health.setdefault(key, SourceHealth()).add(h)
