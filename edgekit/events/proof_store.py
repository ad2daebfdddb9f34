"""Event proofs on the device's disk: a snapshot, maybe a clip, and a sidecar JSON per event.

Layout: ``<root>/<camera>/<YYYYMMDD>/<event id>.{jpg,avi,json}`` (the day of the event's
capture time, UTC).  Every file is written whole or not at all (a temp name beside it, fsync,
rename): a crash leaves only hidden ``.…tmp-…`` names, which nothing here lists and a writer's
start removes.  The sidecar is written last, so an entry that lists a file has that file.

The clip is Motion JPEG in AVI through ``cv2.VideoWriter``: it needs no codec beyond what
OpenCV always has, any player opens it, and the frames are JPEGs already in the ring; H.264
would be a fifth of the size but needs GStreamer or an FFmpeg build that a device may lack.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.core.io import TMP_MARK, atomic_path, remove_tree, write_atomic
from edgekit.core.names import safe_name
from edgekit.detection.detector import Detection
from edgekit.detection.draw import draw_detections
from edgekit.events.event import Event
from edgekit.events.proof_ring import EncodedFrame

JPEG_QUALITY = 80  # a box and a face stay legible; a 640x480 frame is ~30-60 KB


def event_dir(root: Path, event: Event) -> Path:
    """The folder of ``event``'s proofs: ``<root>/<camera>/<YYYYMMDD>``."""
    if not (safe_name(event.camera) and safe_name(event.id)):  # they become path parts
        raise ValueError(f"event {event.id!r} of camera {event.camera!r}: not a safe file name")
    day = datetime.fromtimestamp(event.t, timezone.utc).strftime("%Y%m%d")
    return root / event.camera / day


def encode_jpeg(frame: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """``frame`` (BGR) as JPEG bytes."""
    import cv2

    ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"cannot encode a frame of shape {frame.shape} as JPEG")
    return bytes(buf.tobytes())


def decode_jpeg(data: bytes) -> np.ndarray:
    """JPEG bytes back to a BGR frame."""
    import cv2

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError("not a JPEG image")
    out: np.ndarray = image
    return out


def _sidecar(path: Path, doc: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def write_snapshot(
    root: Path,
    event: Event,
    frame: np.ndarray,
    detections: Sequence[Detection],
    *,
    quality: int = JPEG_QUALITY,
) -> Path:
    """``<event id>.jpg``: the frame with its boxes drawn and the event's box highlighted; and its sidecar."""
    folder = event_dir(root, event)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{event.id}.jpg"
    write_atomic(path, encode_jpeg(draw_detections(frame, detections, highlight=event.box), quality))
    _sidecar(folder / f"{event.id}.json", {"event": event.to_dict(), "snapshot": path.name})
    return path


def write_clip(root: Path, event: Event, frames: Sequence[EncodedFrame], *, fps: float | None = None) -> Path:
    """``<event id>.avi`` (Motion JPEG) of ``frames``, then the sidecar rewritten to name it.

    ``fps`` None: the frames' own rate, from their capture times (10 when that cannot tell).
    """
    import cv2

    if not frames:
        raise ValueError(f"event {event.id}: no frames for a clip")
    folder = event_dir(root, event)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{event.id}.avi"
    span = frames[-1].t - frames[0].t
    rate = fps if fps is not None else ((len(frames) - 1) / span if span > 0 else 10.0)
    first = decode_jpeg(frames[0].jpeg)
    h, w = first.shape[:2]
    with atomic_path(path, suffix=".avi") as tmp:
        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter.fourcc(*"MJPG"), rate, (w, h))
        if not writer.isOpened():
            raise OSError(f"OpenCV cannot write Motion JPEG to {tmp}")
        try:
            for f in frames:
                image = decode_jpeg(f.jpeg)
                if image.shape[:2] != (h, w):  # a camera that changed size mid-clip: fit it
                    image = cv2.resize(image, (w, h))
                writer.write(image)
        finally:
            writer.release()  # the AVI index is written here: before it the file does not play
    side = folder / f"{event.id}.json"
    try:
        doc: dict[str, Any] = json.loads(side.read_text())
    except (OSError, ValueError):
        doc = {"event": event.to_dict()}
    doc["clip"] = {
        "file": path.name,
        "frames": len(frames),
        "fps": round(rate, 3),
        "start_t": frames[0].t,
        "end_t": frames[-1].t,
        "size": [w, h],
    }
    _sidecar(side, doc)
    return path


def is_temp(path: Path) -> bool:
    """A name a writer is still writing (or a crash left): never listed, never counted as a proof."""
    return path.name.startswith(".") and TMP_MARK in path.name


def remove_temps(root: Path) -> int:
    """Delete what crashed writes left under ``root`` (call only when no writer runs); how many."""
    gone = 0
    for p in root.rglob(f".*{TMP_MARK}*") if root.is_dir() else ():
        remove_tree(p)
        gone += 1
    return gone


@dataclass(frozen=True, slots=True)
class ProofEntry:
    """One event's proofs, as the agent lists them and the dashboard asks for them."""

    event_id: str
    camera: str
    kind: str
    t: float
    snapshot: Path | None
    clip: Path | None
    bytes: int


def _groups(root: Path) -> dict[Path, list[Path]]:
    """Finished proof files under ``root`` by event (``folder/<event id>``), temps left out."""
    out: dict[Path, list[Path]] = {}
    for p in root.glob("*/*/*") if root.is_dir() else ():
        if p.is_file() and not is_temp(p) and not p.name.startswith("."):
            out.setdefault(p.parent / p.name.split(".", 1)[0], []).append(p)
    return out


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:  # removed by retention between listing and stat
        return 0


def list_proofs(root: Path, camera: str | None = None, since: float | None = None) -> list[ProofEntry]:
    """The events with proofs under ``root`` (one camera's, captured at or after ``since``), oldest first."""
    entries = []
    for stem, files in _groups(root).items():
        side = stem.with_suffix(".json")
        if side not in files:
            continue  # media whose sidecar is not written yet (or was removed first by retention)
        try:
            doc = json.loads(side.read_text())
        except (OSError, ValueError):
            continue
        event = doc.get("event", {})
        if camera is not None and event.get("camera") != camera:
            continue
        t = float(event.get("t", 0.0))
        if since is not None and t < since:
            continue
        snap = stem.parent / doc["snapshot"] if "snapshot" in doc else None
        clip = stem.parent / doc["clip"]["file"] if "clip" in doc else None
        entries.append(
            ProofEntry(
                event_id=stem.name,
                camera=str(event.get("camera", stem.parent.parent.name)),
                kind=str(event.get("kind", "")),
                t=t,
                snapshot=snap if snap is not None and snap in files else None,
                clip=clip if clip is not None and clip in files else None,
                bytes=sum(_size(p) for p in files),
            )
        )
    return sorted(entries, key=lambda e: (e.t, e.event_id))


@dataclass(frozen=True, slots=True)
class Retention:
    """Keep proofs at most ``max_age_s`` old (by file time) and ``max_bytes`` in all; oldest go first."""

    max_age_s: float
    max_bytes: int

    def apply(self, root: Path, *, keep: Collection[str] = (), now: float | None = None) -> int:
        """Remove whole events (sidecar first, so none is listed half-gone) until within bounds; how many.

        ``keep``: event ids still being written (a clip waiting for its post-roll), never removed.
        Temp files are neither counted nor removed: they are being written.
        """
        now = time.time() if now is None else now
        groups = []
        for stem, files in _groups(root).items():
            newest = max((p.stat().st_mtime for p in files if p.exists()), default=0.0)
            groups.append((newest, stem, files, sum(_size(p) for p in files)))
        groups.sort(key=lambda g: (g[0], str(g[1])))
        total = sum(g[3] for g in groups)
        removed = 0
        for newest, stem, files, size in groups:
            if now - newest <= self.max_age_s and total <= self.max_bytes:
                break
            if stem.name in keep:
                continue
            for p in sorted(files, key=lambda p: p.suffix != ".json"):  # the sidecar first
                p.unlink(missing_ok=True)
            total -= size
            removed += 1
            _remove_if_empty(stem.parent)
        return removed


def _remove_if_empty(folder: Path) -> None:
    for d in (folder, folder.parent):
        try:
            d.rmdir()
        except OSError:
            return  # not empty (or gone): the usual case


__all__ = [
    "ProofEntry",
    "Retention",
    "encode_jpeg",
    "event_dir",
    "is_temp",
    "list_proofs",
    "remove_temps",
    "write_clip",
    "write_snapshot",
]
