"""``EventSink``: tracks, zone and line events, and their proof, from the pipeline's finished frames.

One sink for every camera with zones or lines.  Per frame of such a camera it runs the camera's
:class:`~edgekit.events.tracking.Tracker` on the frame's detections, then its
:class:`~edgekit.events.zone_engine.ZoneEngine` on the tracks, and hands each event to

* the proof writer (a snapshot of this frame with its boxes, and a clip around it), which encodes
  and writes on its own thread: the frame thread only puts a reference on a bounded queue;
* each outlet (``Pipeline.on_event``: telemetry's ``publish_event``, which spools it, or yours);
* the queue that ``Pipeline.events()`` and ``edgekit run --events`` read.

It runs inline, on the loop thread, for two reasons: a tracker must see every frame in order
(a queued sink that fell behind would lose frames, and a track its continuity), and events
must come out in the order of the frames that decided them.  Its cost is measured
(``benchmarks/event_cost.py``): well under a millisecond per frame at 20 objects.

Time: a live camera's events carry the frame's capture time; a file or folder read faster or
slower than real time carries *media* time instead (the first frame's capture time plus
``index / fps``), so a dwell of 30 s means 30 s of the video, however fast it was read.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from edgekit.events.tracking import Track, Tracker
from edgekit.events.zone_engine import ZoneEngine

if TYPE_CHECKING:
    from edgekit.events.event import Event
    from edgekit.events.proof import ProofWriter
    from edgekit.events.zones import CameraRegions
    from edgekit.pipeline.records import FrameResult

log = logging.getLogger(__name__)

EventOutlet = Callable[["Event"], None]

#: Events waiting for ``Pipeline.events()`` (or ``take``): a reader that never reads loses the
#: oldest, counted in ``EventSink.dropped``; a few minutes of a busy scene.
MAX_WAITING = 10_000

#: What events call the camera of a pipeline of one source (whose records name it ""): the name
#: it would have as the first of many (``cam0``), so that its proofs and messages name a camera.
ONE_CAMERA = "cam0"

#: Events that say what happened at one moment get a snapshot; a ``count`` summarises an interval.
_PROOF_KINDS = frozenset({"enter", "leave", "dwell", "cross", "present"})


class _Camera:
    """One camera's tracker, zones and clock."""

    def __init__(self, name: str, regions: CameraRegions, tracker: Tracker, media_fps: float | None) -> None:
        self.engine = ZoneEngine(name or ONE_CAMERA, regions)
        self.tracker = tracker
        self.media_fps = media_fps  # None: a live camera (capture time is the clock)
        self.t0: float | None = None
        self.last_t = 0.0
        self.last_index = -1
        self.tracks: list[Track] = []

    def clock(self, captured_at: float, index: int) -> float:
        if self.media_fps is None:
            return captured_at
        if self.t0 is None:
            self.t0 = captured_at - index / self.media_fps
        return self.t0 + index / self.media_fps


class EventSink:
    """Tracker, zones and events of each camera that has zones or lines (a ``Sink``; inline)."""

    name = "events"
    depth = 0

    def __init__(
        self,
        regions: Mapping[str, CameraRegions],
        *,
        media_fps: Mapping[str, float | None] | None = None,
        proof: ProofWriter | None = None,
        outlets: Iterable[EventOutlet] = (),
        tracker: Callable[[], Tracker] = Tracker,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        fps = media_fps or {}
        self._cameras = {
            name: _Camera(name, r, tracker(), fps.get(name))
            for name, r in regions.items()
            if r.zones or r.lines
        }
        self.proof = proof
        #: Called with each event, in order, on the loop thread (keep them cheap: a queue put).
        self.outlets: list[EventOutlet] = list(outlets)
        self._waiting: deque[Event] = deque()
        self._max_waiting = max_waiting
        self._lock = threading.Lock()
        self._flushed = False
        #: Events so far by kind; events a reader left waiting too long (the oldest, dropped).
        self.counts: Counter[str] = Counter()
        self.dropped = 0
        self.outlet_errors = 0

    @property
    def cameras(self) -> list[str]:
        """The cameras this sink watches (those with zones or lines)."""
        return list(self._cameras)

    def tracks(self, camera: str = "") -> list[Track]:
        """The camera's tracks as of its last frame (seen and predicted)."""
        cam = self._cameras.get(camera)
        return list(cam.tracks) if cam is not None else []

    # -- the frame thread ------------------------------------------------------------------

    def frame(self, result: FrameResult) -> None:
        record = result.record
        cam = self._cameras.get(record.camera)
        if cam is None:
            return
        t = cam.clock(record.captured_at, record.index)
        cam.last_t, cam.last_index = t, record.index
        cam.tracks = cam.tracker.update(result.detections, t)
        height, width = result.frame.shape[:2]
        events = cam.engine.update(cam.tracks, t, record.index, (width, height))
        if self.proof is not None:
            self.proof.offer(cam.engine.camera, result.frame, t)  # the clips' pre- and post-roll
            for event in events:
                if event.kind in _PROOF_KINDS:
                    self.proof.event(event, result.frame, result.detections)
        self._emit(events)

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            self.counts[event.kind] += 1
            for outlet in self.outlets:
                try:
                    outlet(event)
                except Exception:  # an outlet must not end the frame loop (counted, logged once)
                    self.outlet_errors += 1
                    if self.outlet_errors == 1:
                        log.exception("events: an outlet raised (counted; logged once)")
        if events:
            with self._lock:
                self._waiting.extend(events)
                while len(self._waiting) > self._max_waiting:
                    self._waiting.popleft()
                    self.dropped += 1

    def take(self) -> list[Event]:
        """The events not yet taken, oldest first (from any thread)."""
        with self._lock:
            out = list(self._waiting)
            self._waiting.clear()
        return out

    def flush(self) -> list[Event]:
        """The end of the run: each camera's open stays leave and its partial interval is counted (once)."""
        if self._flushed:
            return []
        self._flushed = True
        events: list[Event] = []
        for cam in self._cameras.values():
            if cam.last_index >= 0:
                events.extend(cam.engine.flush(cam.last_t, cam.last_index))
        self._emit(events)
        return events

    def close(self) -> None:
        self.flush()
        if self.proof is not None:
            self.proof.close()
