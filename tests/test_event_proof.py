"""Event proofs: a snapshot with the boxes drawn and a clip of pre- and post-roll, on disk, bounded.

A made-up video (a grey square moving over a dark background, frames made with numpy) goes
through a real ``ProofWriter``; the files it leaves are opened with OpenCV and checked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgekit.detection.detector import Detection
from edgekit.detection.draw import HIGHLIGHT_COLOUR, colour_of, line_width
from edgekit.events.event import Event, event_id
from edgekit.events.proof import ProofConfig, ProofWriter
from edgekit.events.proof_ring import EncodedFrame, FrameRing
from edgekit.events.proof_store import Retention, is_temp, list_proofs, remove_temps, write_snapshot

W, H = 320, 240
FPS = 10.0
T0 = 1_796_000_000.0  # a fixed capture clock: 2026-11-30 (UTC), so the day folder is known
SIDE = 60
DAY = "20261130"


def square_at(i: int) -> tuple[float, float, float, float]:
    x = 20 + 4 * i
    y = 80 + (i % 20)
    return (float(x), float(y), float(x + SIDE), float(y + SIDE))


def frame_at(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    frame = rng.integers(20, 60, size=(H, W, 3), dtype=np.uint8)  # dark noise: no box colour in it
    x0, y0, x1, y1 = (int(v) for v in square_at(i))
    frame[y0:y1, x0:x1] = 150
    return frame


def detection_at(i: int) -> Detection:
    return Detection(class_id=0, name="person", score=0.9, box=square_at(i))


def event_at(k: int, camera: str = "door") -> Event:
    return Event(
        id=event_id(camera, "enter", "hall", 1, k),
        kind="enter",
        camera=camera,
        zone="hall",
        t=T0 + k / FPS,
        frame_index=k,
        track_id=1,
        class_name="person",
        box=square_at(k),
    )


def close_to(pixel: np.ndarray, colour: tuple[int, int, int], tol: int = 70) -> bool:
    return bool(np.all(np.abs(pixel.astype(int) - np.array(colour)) <= tol))


def test_snapshot_and_clip_of_an_event_are_on_disk_and_right(tmp_path: Path) -> None:
    k, n = 40, 70
    cfg = ProofConfig(pre_s=1.0, post_s=1.0, queue_size=256, retention=Retention(86400.0, 1 << 30))
    writer = ProofWriter(tmp_path, cfg).start()
    for i in range(n):
        frame = frame_at(i)
        assert writer.offer("door", frame, T0 + i / FPS)
        if i == k:
            assert writer.event(event_at(k), frame, [detection_at(k)])
    writer.close()
    assert writer.stats.dropped_frames == 0 and writer.stats.failed == 0

    [entry] = list_proofs(tmp_path)
    ev = event_at(k)
    assert (entry.event_id, entry.camera, entry.kind, entry.t) == (ev.id, "door", "enter", ev.t)
    assert entry.snapshot == tmp_path / "door" / DAY / f"{ev.id}.jpg"
    assert entry.clip == entry.snapshot.with_suffix(".avi")
    assert entry.bytes == sum(p.stat().st_size for p in entry.snapshot.parent.iterdir())
    assert list_proofs(tmp_path, camera="gate") == []
    assert list_proofs(tmp_path, since=ev.t + 1) == []

    # The snapshot: the frame's size, the class colour along the detection's four edges, the
    # highlight just outside them, and that colour nowhere away from the box and its label.
    shot = cv2.imread(str(entry.snapshot))
    assert shot is not None and shot.shape == (H, W, 3)
    x0, y0, x1, y1 = (round(v) for v in square_at(k))
    green, thick = colour_of(0), line_width((H, W))
    for x, y in [((x0 + x1) // 2, y0), ((x0 + x1) // 2, y1), (x0, (y0 + y1) // 2), (x1, (y0 + y1) // 2)]:
        assert close_to(shot[y, x], green), (x, y, shot[y, x])
    pad = 2 * thick
    for x, y in [((x0 + x1) // 2, y0 - pad), ((x0 + x1) // 2, y1 + pad), (x0 - pad, (y0 + y1) // 2)]:
        assert close_to(shot[y, x], HIGHLIGHT_COLOUR), (x, y, shot[y, x])
    near = np.zeros((H, W), bool)
    m = pad + thick + 2
    near[max(0, y0 - m) : y1 + m, max(0, x0 - m) : x1 + m] = True
    near[max(0, y0 - 40) : y0, x0 : x0 + 160] = True  # the label above the box
    is_green = np.all(np.abs(shot.astype(int) - np.array(green)) <= 70, axis=2)
    assert is_green[near].sum() > 4 * (x1 - x0)  # the edges are there...
    assert is_green[~near].sum() == 0  # ...and nowhere else
    # The same pixels in the frame before drawing were not green: the colour is the drawing's.
    assert not np.all(np.abs(frame_at(k)[y0, (x0 + x1) // 2].astype(int) - np.array(green)) <= 70)

    # The clip: 1 s of pre-roll (frames k-10..k) and 1 s of post-roll (k+1..k+10).
    cap = cv2.VideoCapture(str(entry.clip))
    assert cap.isOpened()
    frames = []
    while True:
        ok, image = cap.read()
        if not ok:
            break
        frames.append(image)
    cap.release()
    assert abs(len(frames) - 21) <= 1, len(frames)
    assert all(f.shape == (H, W, 3) for f in frames)
    # Its first frame is the pre-roll's: the square where it was 10 frames before the event.
    xa, ya, xb, yb = (int(v) for v in square_at(k - 10))
    assert frames[0][ya + 5 : yb - 5, xa + 5 : xb - 5].mean() > 120
    side = entry.snapshot.with_suffix(".json").read_text()
    assert '"frames": 21' in side and '"fps": 10.0' in side


def test_a_clip_killed_mid_write_leaves_nothing_that_looks_valid(tmp_path: Path) -> None:
    ev = event_at(5)
    write_snapshot(tmp_path, ev, frame_at(5), [detection_at(5)])
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        import numpy as np
        from edgekit.events.event import Event
        from edgekit.events.proof_ring import EncodedFrame
        from edgekit.events.proof_store import encode_jpeg, write_clip
        frame = np.random.default_rng(0).integers(0, 255, size=(480, 640, 3), dtype=np.uint8)
        jpeg = encode_jpeg(frame)
        ev = Event(id={ev.id!r}, kind="enter", camera="door", zone="hall", t={ev.t!r}, frame_index=5)
        print("go", flush=True)
        write_clip(Path(sys.argv[1]), ev, [EncodedFrame({T0!r} + i / 10, jpeg) for i in range(20000)])
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"go\n"
        folder = tmp_path / "door" / DAY
        deadline = time.monotonic() + 60
        while not any(is_temp(p) and p.stat().st_size > 0 for p in folder.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, (
                "the writer never started its temp file"
            )
            time.sleep(0.005)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    names = sorted(p.name for p in folder.iterdir())
    assert f"{ev.id}.avi" not in names  # only the hidden temp: the clip was never renamed into place
    assert any(is_temp(folder / name) for name in names)
    [entry] = list_proofs(tmp_path)
    assert entry.clip is None and entry.snapshot is not None
    assert remove_temps(tmp_path) == 1  # what a writer's start does
    assert sorted(p.name for p in folder.iterdir()) == [f"{ev.id}.jpg", f"{ev.id}.json"]


def test_retention_removes_the_oldest_events_beyond_the_size_cap_and_age(tmp_path: Path) -> None:
    now = time.time()
    for k in range(5):
        ev = event_at(k)
        write_snapshot(tmp_path, ev, frame_at(k), [detection_at(k)])
        for p in (tmp_path / "door" / DAY).glob(f"{ev.id}.*"):
            os.utime(p, (now - 1000 + k, now - 1000 + k))  # event k is older than event k + 1
    sizes = [e.bytes for e in list_proofs(tmp_path)]
    cap = sum(sizes[-2:])  # room for the two newest
    removed = Retention(max_age_s=86400.0, max_bytes=cap).apply(tmp_path, keep={event_at(0).id}, now=now)
    left = [e.event_id for e in list_proofs(tmp_path)]
    # Event 0 is being written (kept), so 1, 2 and then 3 go to make room.
    assert removed == 3 and left == [event_at(0).id, event_at(4).id]
    assert Retention(max_age_s=500.0, max_bytes=1 << 30).apply(tmp_path, now=now) == 2
    assert list_proofs(tmp_path) == [] and not (tmp_path / "door").exists()


def test_the_ring_is_bounded_by_bytes_and_counts_what_it_drops() -> None:
    ring = FrameRing(seconds=3.0, max_bytes=10_000)
    for i in range(100):  # 10 fps of 1000-byte frames: 3 s would be 31 frames, 31 KB
        ring.push(EncodedFrame(i / 10, bytes(1000)))
    # The cap holds 10 frames, under 1 s: every frame that left did so early, and counts.
    assert ring.bytes <= 10_000 and len(ring) == 10 and ring.dropped == 90
    aged = FrameRing(seconds=3.0, max_bytes=1 << 20)
    for i in range(100):
        aged.push(EncodedFrame(i / 10, bytes(1000)))
    assert len(aged) == 31 and aged.dropped == 0  # age is the normal way out, not a drop
    assert [f.t for f in aged.since(9.0, 9.9)] == pytest.approx([9.0 + i / 10 for i in range(10)])


def test_offer_never_waits_and_counts_what_a_full_queue_drops(tmp_path: Path) -> None:
    writer = ProofWriter(tmp_path, ProofConfig(queue_size=4))  # not started: nothing drains the queue
    frame = frame_at(0)
    took = [writer.offer("door", frame, T0 + i) for i in range(10)]
    assert took == [True] * 4 + [False] * 6 and writer.stats.dropped_frames == 6
    assert not writer.event(event_at(0), frame, [detection_at(0)]) and writer.stats.dropped_events == 1
    # Against a full queue, an offer returns at once: a thousand take microseconds each; one
    # that waited even 10 ms for room would take 10 s here (the bound is loose on purpose).
    start = time.monotonic()
    assert not any(writer.offer("door", frame, T0) for _ in range(1000))
    assert time.monotonic() - start < 5.0 and writer.stats.dropped_frames == 1006


def test_a_camera_name_that_is_not_a_file_name_is_refused(tmp_path: Path) -> None:
    bad = event_at(3, camera="../etc")
    with pytest.raises(ValueError, match="not a safe file name"):
        write_snapshot(tmp_path, bad, frame_at(3), [detection_at(3)])
    assert list(tmp_path.iterdir()) == []
