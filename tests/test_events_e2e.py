"""Zone and line events end to end: a made-up video of squares on known paths, a real detector, real proof.

The video (MJPEG AVI, 320x240, 30 fps) is drawn here; the detector is ``tests/yolo_model.py``'s
ONNX graph, built into a signed bundle by the real build, which finds the red and the green
square where they are.  Every expected event is worked out from the squares' drawn paths (the
bottom-centre of each square against the zone's and the line's pixels), not from the engine, and
each must come at its frame within 2 frames:

* red goes right across the line (east), into the zone, waits there 40 frames (dwell at 1 s,
  present at 10 frames), goes back out and across the line again (west); it is not drawn for
  2 frames just before its first crossing, and keeps its id;
* green goes left across the line (west), below the zone, and leaves the picture.

Then the same run reports to a real Mosquitto that is killed during the run and started again:
the fleet's store holds each of the run's events once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_build_user_detector import model_dir, write_frames
from yolo_model import Square, frame_with

import edgekit
from edgekit.convert.build_records import BuildRequest
from edgekit.convert.builder import build
from edgekit.convert.modelcard import read_card
from edgekit.detection.draw import colour_of
from edgekit.events.event import Event
from edgekit.events.proof import ProofConfig, list_proofs
from edgekit.events.zones import regions_from_dict
from edgekit.pipeline import FrameResult

W, H, FPS = 320, 240, 30.0
SIDE = 40
LINE_X = 160  # the line: x = 160, drawn from the bottom up (a below b), so going right is "east"
ZONE = (200, 320, 0, 140)  # x0, x1, y0, y1: red's anchor (y 100) is in its rows, green's (y 200) is not
GAP = (26, 27)  # red is not drawn on these frames
FRAMES = 150

REGIONS = {
    "count_interval_s": 2.0,
    "zones": {
        "bay": {
            "polygon": [[ZONE[0], ZONE[2]], [ZONE[1], ZONE[2]], [ZONE[1], ZONE[3]], [ZONE[0], ZONE[3]]],
            "dwell_s": 1.0,
            "min_frames": 10,
            "inertia": 1,
        }
    },
    "lines": {"gate": {"a": [LINE_X, H], "b": [LINE_X, 0], "directions": ["east", "west"]}},
}


def red_x(i: int) -> int | None:
    """Red's left edge on frame ``i`` (y 60..100): right to 250, a wait, back left to 0."""
    if i in GAP or i > 140:
        return None
    if i <= 50:
        return 5 * i
    if i <= 90:
        return 250
    return 250 - 5 * (i - 90)


def green_x(i: int) -> int | None:
    """Green's left edge (y 160..200): from frame 10, left from 180 to 0."""
    return 180 - 5 * (i - 10) if 10 <= i <= 46 else None


def squares(i: int) -> list[Square]:
    out: list[Square] = []
    if (x := red_x(i)) is not None:
        out.append(("red", x, 60, SIDE))
    if (x := green_x(i)) is not None:
        out.append(("green", x, 160, SIDE))
    return out


def first(frames: range, test: object) -> int:
    return next(i for i in frames if test(i))  # type: ignore[operator]


def anchor(x: int | None) -> float | None:
    return None if x is None else x + SIDE / 2


# The truth, from the paths: the first frame on which each thing holds.
RED_EAST = first(range(FRAMES), lambda i: (a := anchor(red_x(i))) is not None and a > LINE_X)
RED_IN = first(range(FRAMES), lambda i: (a := anchor(red_x(i))) is not None and a > ZONE[0])
RED_DWELL = RED_IN + round(1.0 * FPS)
RED_PRESENT = RED_IN + 10 - 1
RED_OUT = first(range(RED_IN, FRAMES), lambda i: (a := anchor(red_x(i))) is not None and a < ZONE[0])
RED_WEST = first(range(RED_OUT, FRAMES), lambda i: (a := anchor(red_x(i))) is not None and a < LINE_X)
GREEN_WEST = first(range(10, FRAMES), lambda i: (a := anchor(green_x(i))) is not None and a < LINE_X)


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("video") / "squares.avi"
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), FPS, (W, H))
    assert out.isOpened()
    for i in range(FRAMES):
        out.write(np.ascontiguousarray(frame_with(squares(i), H, W)[..., ::-1]))
    out.release()
    return path


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    root = tmp_path_factory.mktemp("squares-events")
    folder = model_dir(root / "squares", "channels-first")
    out = root / "bundle"
    build(
        BuildRequest(
            card=read_card(folder),
            device="x86_64-cpu",
            out=out,
            backends=("onnxruntime",),
            precisions=("fp32",),
            eval=write_frames(root / "eval", 8, seed=2),
            sign_key=keys[0],
            measure_latency=False,
        )
    )
    with edgekit.load(out, device="x86_64-cpu", trusted_keys=[keys[1]]) as model:
        model.bundle_dir = out  # type: ignore[attr-defined]  # for the command-line test
        yield model


def run_events(model: edgekit.Model, video: Path, proof_dir: Path | None = None) -> list[Event]:
    with edgekit.Pipeline(model, str(video)) as pipeline:
        # The file is read as fast as the loop goes, faster than a camera: a queue that holds the
        # whole clip, so a machine busy with other work does not drop proofs (by design, when the
        # writer falls behind) and make this test about its speed.
        proof = ProofConfig(pre_s=1.0, post_s=1.0, queue_size=1024)
        pipeline.add_events(regions_from_dict(REGIONS), proof_dir=proof_dir, proof=proof)
        return list(pipeline.events())


def near(event: Event, frame: int) -> bool:
    return abs(event.frame_index - frame) <= 2


def test_every_crossing_once_each_way_and_zone_events_at_their_frames(
    detector: edgekit.Model, video: Path
) -> None:
    events = run_events(detector, video)
    moments = [e for e in events if e.kind != "count"]
    by_class = {c: [e for e in moments if e.class_name == c] for c in ("red", "green")}
    red, green = by_class["red"], by_class["green"]
    # One track each, across red's 2-frame gap: every event of red names the same id (``present``
    # is the class's, not a track's).
    ids = {c: {e.track_id for e in by_class[c] if e.kind != "present"} for c in by_class}
    assert len(ids["red"]) == 1 and len(ids["green"]) == 1 and ids["red"] != ids["green"], moments
    got = [(e.kind, e.zone, e.direction) for e in red]
    assert got == [
        ("cross", "gate", "east"),
        ("enter", "bay", None),
        ("present", "bay", None),
        ("dwell", "bay", None),
        ("leave", "bay", None),
        ("cross", "gate", "west"),
    ], red
    for event, frame in zip(red, (RED_EAST, RED_IN, RED_PRESENT, RED_DWELL, RED_OUT, RED_WEST), strict=True):
        assert near(event, frame), (event, frame)
    assert [(e.kind, e.zone, e.direction) for e in green] == [("cross", "gate", "west")], green
    assert near(green[0], GREEN_WEST), (green[0], GREEN_WEST)
    dwell = next(e for e in red if e.kind == "dwell")
    assert dwell.dwell_s is not None and dwell.dwell_s >= 1.0
    # Media time: 150 frames at 30 fps are 5 s of video however fast they were read.
    assert abs((red[-1].t - red[0].t) - (RED_WEST - RED_EAST) / FPS) < 3 / FPS
    # The counts per interval (2 s, and the last partial one) add up to the crossings.
    counts = [e for e in events if e.kind == "count"]
    assert len(counts) == 3
    crossed: dict[str, int] = {}
    for c in counts:
        assert c.counts is not None
        for direction, per_class in c.counts.get("lines", {}).get("gate", {}).items():
            crossed[direction] = crossed.get(direction, 0) + sum(per_class.values())
    assert crossed == {"east": 1, "west": 2}
    # Each event its own id; the same video again gives the same events at the same frames (new
    # ids: a second run is new events, its times are of now).
    assert len({e.id for e in events}) == len(events)
    again = run_events(detector, video)
    what = lambda es: [(e.kind, e.zone, e.class_name, e.frame_index, e.direction) for e in es]  # noqa: E731
    assert what(again) == what(events)


def test_an_event_has_a_snapshot_with_its_box_and_a_clip_around_it(
    detector: edgekit.Model, video: Path, tmp_path: Path
) -> None:
    proofs = tmp_path / "proofs"
    events = run_events(detector, video, proofs)
    enter = next(e for e in events if e.kind == "enter")
    assert enter.box is not None
    listed = {p.event_id: p for p in list_proofs(proofs)}
    moments = [e for e in events if e.kind != "count"]
    assert set(listed) == {e.id for e in moments}  # every moment's proof, no count's
    entry = listed[enter.id]
    assert entry.snapshot is not None and entry.clip is not None
    snap = cv2.imread(str(entry.snapshot))
    assert snap.shape == (H, W, 3)
    # The box is drawn where the detection was: its sides (the top holds the label) are in the
    # class's colour on the snapshot, and were not on the frame.
    raw = frame_with(squares(enter.frame_index), H, W)[..., ::-1].astype(np.int16)
    x0, y0, x1, y1 = (round(v) for v in enter.box)
    sides = (np.s_[y0 : y1 + 1, x0], np.s_[y0 : y1 + 1, x1], np.s_[y1, x0 : x1 + 1])  # as cv2 draws
    colour = np.asarray(colour_of(0), dtype=np.int16)

    def in_colour(image: np.ndarray) -> float:
        px = np.concatenate([image[s] for s in sides]).astype(np.int16)
        return float((np.abs(px - colour).sum(axis=1) < 90).mean())

    assert in_colour(snap) > 0.8 and in_colour(raw) < 0.05, (in_colour(snap), in_colour(raw))
    far = (slice(0, 40), slice(W - 60, W))  # top right: no square, no box, no label
    assert np.abs(snap[far].astype(np.int16) - raw[far]).mean() < 8
    # The clip: 1 s before the event and 1 s after, at the frame size.
    clip = cv2.VideoCapture(str(entry.clip))
    assert clip.isOpened()
    n = 0
    while True:
        ok, frame = clip.read()
        if not ok:
            break
        assert frame.shape == (H, W, 3)
        n += 1
    clip.release()
    assert 2 * FPS - 4 <= n <= 2 * FPS + 2, n


def test_events_reach_the_fleet_once_each_across_a_broker_outage(
    detector: edgekit.Model, video: Path, tmp_path: Path
) -> None:
    from test_event_wire import collecting, wait_until

    from edgekit.fleet.store import FleetStore
    from edgekit.telemetry import report
    from edgekit.testing.mosquitto import Mosquitto

    broker = Mosquitto(tmp_path).start()
    store = FleetStore(tmp_path / "fleet.db")
    try:
        with collecting(broker, store) as collector:
            subscribed = time.time()
            saved = tmp_path / "mosquitto.db"
            # Real time (5 s of video), so that the broker is gone for part of the run.
            with edgekit.Pipeline(detector, str(video), realtime=True) as pipeline:
                pipeline.add_events(regions_from_dict(REGIONS))
                publisher = report(
                    pipeline,
                    broker.url,
                    device_id="cam-1",
                    fleet="lab",
                    interval_s=0.5,
                    spool=tmp_path / "s.db",
                )
                made: list[Event] = []
                outage, restarted, during = False, False, 0
                for event in pipeline.events():
                    made.append(event)
                    during += outage and not restarted
                    if not outage and event.kind == "cross":
                        assert wait_until(lambda: saved.exists() and saved.stat().st_mtime > subscribed, 10)
                        broker.kill()  # the events from here to its restart wait in the spool
                        outage = True
                    elif outage and event.kind == "dwell":
                        broker.start()
                        restarted = True
                # Before the pipeline closes (and its publisher with it): the spool sent and acknowledged.
                assert wait_until(lambda: len(publisher.spool) == 0, 40), len(publisher.spool)
            stored = lambda: store.events("lab", "cam-1", limit=1000)  # noqa: E731
            assert wait_until(lambda: len(stored()) >= len(made), 40), (len(stored()), collector.stats())
            time.sleep(0.5)
            assert outage and during >= 3 and publisher.events.dropped == 0
            assert sorted(e["id"] for e in stored()) == sorted(e.id for e in made)  # each once
    finally:
        broker.stop()
        store.close()


def test_supervision_gets_the_detections_and_tracks_and_counts_the_same_crossings(
    detector: edgekit.Model, video: Path
) -> None:
    # supervision is in edgekit[all], which the set-up installs: the suite has it.
    import supervision as sv

    from edgekit.events.sv_detections import as_supervision
    from edgekit.pipeline.sinks import sink

    line = sv.LineZone(start=sv.Point(LINE_X, H), end=sv.Point(LINE_X, 0))
    seen: list[int] = []
    tracker_ids: set[int] = set()

    def watch(result: FrameResult) -> None:
        # After the event sink (inline sinks run in the order added): this frame's tracks.
        dets = result.supervision()
        assert len(dets) == len(result.detections)
        assert [list(b) for b in dets.xyxy] == [list(np.float32(d.box)) for d in result.detections]
        seen.append(len(dets))
        # Predicted tracks too: fed matched boxes only, LineZone misses red's first crossing, which
        # comes right after its 2-frame gap (it keeps too short a history of each track's side).
        tracked = as_supervision(events.tracks(""), predicted=True)
        tracker_ids.update(int(i) for i in tracked.tracker_id)
        line.trigger(tracked)

    with edgekit.Pipeline(detector, str(video)) as pipeline:
        events = pipeline.add_events(regions_from_dict(REGIONS))
        pipeline.add_sink(sink("supervision", watch))
        ours = [e for e in pipeline.events() if e.kind == "cross"]
    assert len(seen) == FRAMES and max(seen) == 2
    assert len(tracker_ids) == 2  # red and green, one id each across the gap
    # supervision's LineZone, fed edgekit's tracks, counts what the zone engine counted.
    directions = sorted(e.direction or "" for e in ours)
    assert directions == ["east", "west", "west"]
    assert sorted((line.in_count, line.out_count)) == [1, 2]


RUN_TOML = f"""
count_interval_s = 2.0

[zones.bay]
polygon = [[{ZONE[0]}, {ZONE[2]}], [{ZONE[1]}, {ZONE[2]}], [{ZONE[1]}, {ZONE[3]}], [{ZONE[0]}, {ZONE[3]}]]
dwell_s = 1.0
min_frames = 10
inertia = 1

[lines.gate]
a = [{LINE_X}, {H}]
b = [{LINE_X}, 0]
directions = ["east", "west"]
"""


def test_edgekit_run_events_prints_them_and_json_carries_them(
    detector: edgekit.Model, video: Path, tmp_path: Path, cache_env: dict[str, str]
) -> None:
    from conftest import edgekit as cli

    run_file = tmp_path / "run.toml"
    run_file.write_text(RUN_TOML)
    bundle = str(detector.bundle_dir)  # type: ignore[attr-defined]
    args = ("run", bundle, "--source", str(video), "--config", str(run_file), "--events")
    r = cli(cache_env, *args, "--proof-dir", str(tmp_path / "proofs"))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("frame ")]
    assert [ln.split()[4:6] for ln in lines if " cross " in ln] == [
        ["cross", "west"],
        ["cross", "east"],
        ["cross", "west"],
    ], r.stdout
    assert len(list_proofs(tmp_path / "proofs")) == 7  # 3 crossings, enter, present, dwell, leave
    r = cli(cache_env, *args, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["events"]["counts"] == {
        "count": 3,
        "cross": 3,
        "dwell": 1,
        "enter": 1,
        "leave": 1,
        "present": 1,
    }
    assert [e["kind"] for e in doc["events"]["last"]][:2] == ["cross", "cross"]
    # Zones with no camera to hold them, and a typo, are told apart from a run.
    bad = tmp_path / "bad.toml"
    bad.write_text(RUN_TOML.replace("dwell_s", "dwel_s"))
    r = cli(cache_env, "run", bundle, "--source", str(video), "--config", str(bad), "--events")
    assert r.returncode != 0 and "dwel_s" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_agent_gives_its_pipeline_the_run_file_it_checked(
    tmp_path: Path, cache_env: dict[str, str]
) -> None:
    from edgekit.commands.agent import _run_file_args
    from edgekit.deploy.agent import Agent, AgentConfig
    from edgekit.deploy.slots import StateRoot
    from edgekit.protocol.broker import BrokerConfig

    from conftest import edgekit as cli

    run_file = tmp_path / "run.toml"
    run_file.write_text(RUN_TOML)
    url = "mqtt://127.0.0.1:1"
    config = AgentConfig(url, "lab", "cam-1", source="synthetic", child_args=_run_file_args(run_file))
    argv = Agent(StateRoot(tmp_path / "root"), BrokerConfig.from_url(url), config)._child_argv(tmp_path / "b")
    assert argv[argv.index("--config") + 1] == str(run_file.resolve())
    # A mistake in it stops the agent as it starts, naming the key, not each pipeline start.
    run_file.write_text(RUN_TOML.replace("dwell_s", "dwel_s"))
    env = cache_env | {"EDGEKIT_AGENT_ROOT": str(tmp_path / "agent")}
    args = ("agent", "run", "--mqtt", url, "--device-id", "cam-1", "--source", "synthetic")
    r = cli(env, *args, "--run-config", str(run_file))
    assert r.returncode != 0 and "dwel_s" in r.stderr and "Traceback" not in r.stderr, r.stderr
