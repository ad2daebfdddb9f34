"""Proof with each event, made off the frame thread: a snapshot now, a clip once its post-roll is in.

The loop thread only *offers*: :meth:`ProofWriter.offer` (every frame, for the pre-roll) and
:meth:`ProofWriter.event` put a tuple on a bounded queue without waiting; when the queue is
full the item is dropped and counted (a slow disk costs proofs, never frames).  The worker
thread JPEG-encodes each frame into its camera's :class:`FrameRing`, writes snapshots, collects
each clip's post-roll and writes the clip when the frames reach ``event.t + post_s``, and
applies retention after each write.  Frames are kept by reference until encoded: the pipeline
hands every sink the same array and none writes into it.

Proofs stay on the device; the agent lists them (:func:`list_proofs`) and the dashboard
fetches one on demand: nothing here publishes.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgekit.detection.detector import Detection
from edgekit.events.event import Event
from edgekit.events.proof_ring import EncodedFrame, FrameRing
from edgekit.events.proof_store import (
    JPEG_QUALITY,
    ProofEntry,
    Retention,
    encode_jpeg,
    list_proofs,
    remove_temps,
    write_clip,
    write_snapshot,
)

log = logging.getLogger(__name__)

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class ProofConfig:
    """How much proof to keep: pre- and post-roll seconds, the ring's byte cap per camera, the queue."""

    pre_s: float = 3.0
    post_s: float = 2.0
    clips: bool = True
    ring_bytes: int = 32 * MiB
    queue_size: int = 64
    quality: int = JPEG_QUALITY
    retention: Retention = field(
        default_factory=lambda: Retention(max_age_s=7 * 86400.0, max_bytes=1024 * MiB)
    )


@dataclass
class _PendingClip:
    event: Event
    frames: list[EncodedFrame]

    @property
    def bytes(self) -> int:
        return sum(len(f.jpeg) for f in self.frames)


@dataclass
class ProofStats:
    """What the writer did and what it had to give up (read from any thread; ints are atomic to read)."""

    encoded: int = 0
    snapshots: int = 0
    clips: int = 0
    dropped_frames: int = 0  # offer() found the queue full
    dropped_events: int = 0  # event() found the queue full
    failed: int = 0  # a write that raised (disk full, ...): logged, the worker goes on
    removed: int = 0  # events removed by retention


_Item = tuple[str, str, np.ndarray, float] | tuple[Event, np.ndarray, tuple[Detection, ...]] | None


class ProofWriter:
    """Snapshots and clips of events under ``root``, written by one worker thread of its own."""

    def __init__(self, root: Path, config: ProofConfig | None = None) -> None:
        self.root = root
        self.config = config or ProofConfig()
        self.stats = ProofStats()
        self.rings: dict[str, FrameRing] = {}
        self._queue: queue.Queue[_Item] = queue.Queue(self.config.queue_size)
        self._pending: list[_PendingClip] = []
        self._thread: threading.Thread | None = None

    # -- the loop thread ------------------------------------------------------------------------

    def offer(self, camera: str, frame: np.ndarray, t: float) -> bool:
        """Hand a frame over for the pre-roll and pending clips; False (and counted) when the queue is full."""
        if not self.config.clips:
            return False
        try:
            self._queue.put_nowait(("frame", camera, frame, t))
        except queue.Full:
            self.stats.dropped_frames += 1
            return False
        return True

    def event(self, event: Event, frame: np.ndarray, detections: Sequence[Detection]) -> bool:
        """Hand over an event with its frame (offered before it) and detections; False when dropped."""
        try:
            self._queue.put_nowait((event, frame, tuple(detections)))
        except queue.Full:
            self.stats.dropped_events += 1
            return False
        return True

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> ProofWriter:
        """Remove what a crash left, apply retention, and start the worker.

        One writer per ``root``: any temp file found here is a crash's leftover, not another's write.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        remove_temps(self.root)
        self.stats.removed += self.config.retention.apply(self.root)
        self._thread = threading.Thread(target=self._run, name="edgekit-proof", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued, write pending clips with the post-roll they have, stop the worker."""
        if self._thread is None:
            return
        self._queue.put(None)  # waits for room: close is not on the frame path
        self._thread.join(timeout)
        self._thread = None

    def list(self, camera: str | None = None, since: float | None = None) -> list[ProofEntry]:
        """The proofs on disk (see :func:`list_proofs`)."""
        return list_proofs(self.root, camera, since)

    # -- the worker -----------------------------------------------------------------------------

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if isinstance(item[0], Event):
                    self._on_event(item[0], item[1], item[2])
                else:
                    _, camera, frame, t = item
                    self._on_frame(str(camera), frame, float(t))
            except Exception:
                self.stats.failed += 1
                log.exception("event proof: a write failed")
        for clip in self._pending:
            self._finish(clip)
        self._pending.clear()

    def _on_frame(self, camera: str, frame: np.ndarray, t: float) -> None:
        cfg = self.config
        ring = self.rings.get(camera)
        if ring is None:
            ring = self.rings[camera] = FrameRing(cfg.pre_s, cfg.ring_bytes)
        encoded = EncodedFrame(t, encode_jpeg(frame, cfg.quality))
        self.stats.encoded += 1
        ring.push(encoded)
        still = []
        for clip in self._pending:
            if clip.event.camera != camera:
                still.append(clip)
                continue
            if t > clip.event.t:
                clip.frames.append(encoded)
            # Post-roll is bounded like the ring: past its byte cap the clip ends early.
            if t >= clip.event.t + cfg.post_s or clip.bytes > cfg.ring_bytes:
                self._finish(clip)
            else:
                still.append(clip)
        self._pending = still

    def _on_event(self, event: Event, frame: np.ndarray, detections: tuple[Detection, ...]) -> None:
        write_snapshot(self.root, event, frame, detections, quality=self.config.quality)
        self.stats.snapshots += 1
        if self.config.clips:
            ring = self.rings.get(event.camera)
            pre = ring.since(event.t - self.config.pre_s, event.t) if ring is not None else []
            self._pending.append(_PendingClip(event, list(pre)))
        self._retain()

    def _finish(self, clip: _PendingClip) -> None:
        try:
            if clip.frames:
                write_clip(self.root, clip.event, clip.frames)
                self.stats.clips += 1
        except Exception:
            self.stats.failed += 1
            log.exception("event proof: the clip of %s failed", clip.event.id)
        self._retain()

    def _retain(self) -> None:
        keep = {c.event.id for c in self._pending}
        self.stats.removed += self.config.retention.apply(self.root, keep=keep)


__all__ = ["FrameRing", "ProofConfig", "ProofEntry", "ProofStats", "ProofWriter", "Retention", "list_proofs"]
