"""Many cameras, one pipeline: earliest deadline first, per-camera accounts, one camera's end is not the others'."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from mjpeg_server import MjpegCamera
from skimage import data

import edgekit
from edgekit.detection.detector import iou
from edgekit.errors import PipelineError, SourceError
from edgekit.pipeline.batching import Batcher, parse_batch
from edgekit.pipeline.cameras import Camera, CameraGroup, name_cameras, open_cameras
from edgekit.pipeline.capture import Frame
from edgekit.pipeline.levels import Level
from edgekit.pipeline.policy import Policy
from edgekit.pipeline.sources import open_source

from conftest import edgekit as run_cli


def frame(camera: str, captured_ns: int, index: int = 0) -> Frame:
    return Frame(np.zeros((4, 4, 3), np.uint8), index, captured_ns, 0.0, 0, camera)


def group_of(*names: str) -> CameraGroup:
    # Threads are made but never started: the tests put frames into the slots themselves.
    return CameraGroup({n: open_source("synthetic:8x8@0") for n in names}, Policy.DROP_OLDEST, {})


def test_the_oldest_waiting_frame_goes_first_whatever_camera_sent_more() -> None:
    g = group_of("fast", "slow")
    fast, slow = g.cameras["fast"].slot, g.cameras["slow"].slot
    slow.put(frame("slow", 100))
    for t in (110, 120, 130):  # the fast camera sends three frames: the slot keeps its newest
        fast.put(frame("fast", t))
    taken = [g.take(0) for _ in range(2)]
    assert [(f.camera, f.captured_ns) for f in taken if f] == [("slow", 100), ("fast", 130)]
    assert g.take(0) is None  # nothing waits: a zero timeout returns at once
    assert (g.cameras["fast"].slot.dropped, g.dropped) == (2, 2)  # drops are per camera, and summed


def test_a_camera_that_fails_ends_alone_and_one_alone_raises() -> None:
    g = group_of("a", "b")
    g.cameras["b"].slot.finish(SourceError("the stream went away", ""))
    g.cameras["a"].slot.put(frame("a", 5))
    got = g.take(0.1)
    assert got is not None and got.camera == "a"
    assert g.take(0) is None and g.cameras["b"].ended.startswith("failed: the stream went away")
    assert not g.finished  # camera a has not ended
    g.cameras["a"].slot.finish()
    assert g.take(0.1) is None and g.finished and g.cameras["a"].ended == "source ended"

    one = group_of("")
    one.cameras[""].slot.finish(SourceError("gone", ""))
    with pytest.raises(SourceError, match="gone"):
        one.take(0.1)


def test_camera_names_and_bad_arguments() -> None:
    opened = open_cameras(name_cameras(["synthetic:8x8@0", "synthetic:8x8@0"]))
    assert list(opened) == ["cam0", "cam1"]
    for s in opened.values():
        s.close()
    assert name_cameras({"door": "synthetic:8x8@0"}) == {"door": Camera("synthetic:8x8@0")}
    with pytest.raises(PipelineError, match="empty"):
        name_cameras([])
    with pytest.raises(PipelineError, match="1-64 characters"):
        name_cameras({"": "synthetic:8x8@0"})


def test_each_frame_waits_as_long_as_its_cameras_budget_allows() -> None:
    # The yard camera's frame is older, but it has 66 ms: the door's, captured 10 ms later with
    # 33 ms, is due first (43 against 66).
    ms = 1_000_000
    g = CameraGroup(
        {n: open_source("synthetic:8x8@0") for n in ("door", "yard")},
        {"door": Policy.DROP_OLDEST, "yard": Policy.BLOCK},
        {},
        {"door": 33 * ms, "yard": 66 * ms},
    )
    g.cameras["yard"].slot.put(frame("yard", 0))
    g.cameras["door"].slot.put(frame("door", 10 * ms))
    assert [f.camera for f in (g.take(0), g.take(0)) if f] == ["door", "yard"]
    assert (g.cameras["door"].slot.policy, g.cameras["yard"].slot.policy) == (
        Policy.DROP_OLDEST,
        Policy.BLOCK,
    )


# -- with the reference model ---------------------------------------------------------------------

CAT_CLASSES = {281, 282, 283, 284, 285}


@pytest.fixture(scope="module")
def model(x86_bundle: tuple[Path, dict[str, Any]]) -> Any:
    with edgekit.load(x86_bundle[0], device="x86_64-cpu") as m:
        yield m


def held(pipeline: Any, seconds: float = 1.0) -> list[Any]:
    """Every result, the loop held after the first for ``seconds``: meanwhile every camera's slot
    fills (folders read as fast as they go), so the next take finds frames of several cameras
    waiting together however fast this machine labels (a race when nothing holds the loop)."""
    results = []
    for r in pipeline:
        if not results:
            time.sleep(seconds)
        results.append(r)
    return results


def folder(path: Path, images: list[np.ndarray], size: tuple[int, int]) -> Path:
    path.mkdir()
    for i, image in enumerate(images):
        cv2.imwrite(str(path / f"{i:02d}.png"), cv2.resize(image[..., ::-1], size))
    return path


@pytest.mark.slow
def test_each_cameras_labels_are_what_it_gets_alone(model: Any, tmp_path: Path) -> None:
    # Two folders of different sizes replayed at 15 fps like cameras (block: no frame dropped).
    a = folder(tmp_path / "a", [data.chelsea(), data.astronaut(), data.coffee()] * 3, (640, 480))
    b = folder(tmp_path / "b", [data.rocket(), data.chelsea()] * 3, (320, 240))
    alone = {}
    for name, path in (("door", a), ("yard", b)):
        with edgekit.Pipeline(model, str(path)) as p:
            alone[name] = [(r.record.index, r.labels) for r in p]
    with edgekit.Pipeline(model, sources={"door": str(a), "yard": str(b)}, realtime=True, fps=15) as p:
        results = list(p)
        summary = p.summary()
    together = {
        name: [(r.record.index, r.labels) for r in results if r.record.camera == name] for name in alone
    }
    assert together == alone  # every frame of each camera, in order, labelled as it was alone
    d = summary.to_dict()
    assert d["frames"] == 9 + 6 and d["source_kind"] == "2 cameras" and d["ended_by"] == "sources ended"
    assert {n: (c["frames"], c["missed"] + c["met"], c["ended"]) for n, c in d["cameras"].items()} == {
        "door": (9, 9, "source ended"),
        "yard": (6, 6, "source ended"),
    }
    assert "Camera door" in summary.render() and "Camera yard" in summary.render()
    assert {r.record.to_dict()["camera"] for r in results} == {"door", "yard"}


@pytest.mark.slow
def test_a_network_camera_that_goes_away_is_reopened_and_the_other_keeps_sending(model: Any) -> None:
    net = MjpegCamera([cv2.resize(data.chelsea()[..., ::-1], (320, 240))], fps=20)
    net.start()
    gone: list[float] = []
    try:
        with edgekit.Pipeline(
            model, sources={"net": net.url, "synth": "synthetic:320x240@20"}, duration_s=4
        ) as p:
            for result in p:
                rec = result.record
                if rec.camera == "net" and not gone and p.per_camera["net"].frames == 10:
                    net.stop()
                    gone.append(time.perf_counter_ns())
                    threading.Timer(1.0, net.start).start()
            records = [r for r in p.stats.recent]
        d = p.summary().to_dict()
    finally:
        net.stop()
    assert gone and d["counters"]["source_outages"] >= 1 and d["counters"]["source_reopens"] >= 1
    # The synthetic camera went on while the network one was away (the second after it left).
    during = [r for r in records if r.camera == "synth" and gone[0] < r.captured_ns < gone[0] + 0.9e9]
    assert len(during) >= 5
    assert d["cameras"]["net"]["frames"] > 10  # and the network camera came back
    # Each camera's health says which one it was (issue 34).
    assert d["cameras"]["net"]["health"]["outages"] == d["counters"]["source_outages"]
    assert d["cameras"]["net"]["health"]["reopens"] == d["counters"]["source_reopens"]
    assert d["cameras"]["synth"]["health"]["outages"] == 0 and d["health"]["outages"] >= 1


@pytest.mark.slow
def test_cli_run_with_two_sources(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str], tmp_path: Path
) -> None:
    a = folder(tmp_path / "a", [data.chelsea()] * 3, (320, 240))
    b = folder(tmp_path / "b", [data.chelsea()] * 2, (320, 240))
    records = tmp_path / "records.jsonl"
    r = run_cli(
        cache_env,
        *("run", str(x86_bundle[0]), "--device", "x86_64-cpu", "--source", str(a), "--source", str(b)),
        *("--records", str(records), "--json"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert {n: c["frames"] for n, c in doc["cameras"].items()} == {"cam0": 3, "cam1": 2}
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert sorted(row["camera"] for row in rows) == ["cam0"] * 3 + ["cam1"] * 2
    assert all(row["labels"][0]["id"] in CAT_CLASSES for row in rows)


# -- batching -------------------------------------------------------------------------------------


def test_parse_batch() -> None:
    assert [parse_batch(b) for b in ("auto", "off", 3, "2")] == [None, 1, 3, 2]
    for bad in (0, -1, "x", "2.5", 2.5, True, ""):
        with pytest.raises(PipelineError, match="batch must be"):
            parse_batch(bad)  # type: ignore[arg-type]


def planner(max_batch: int = 4, budget_ms: float = 33.0) -> Batcher:
    # A fixed-batch session makes a batcher of one; the test then gives it the sizes and times
    # a batch-capable one would have measured: inference 2 ms + 1.5 ms a frame, 0.5 ms prep+post.
    level = Level("stand-in", open_fixed_session(), None)  # type: ignore[arg-type]
    b = Batcher(level, dict.fromkeys("abc", budget_ms), most=None)
    b.max = max_batch
    b.infer_ns = {k: 2e6 + 1.5e6 * (k - 1) for k in range(1, max_batch + 1)}
    b.frame_ns = 0.5e6
    return b


class _Fixed:
    batchable = False
    artifact = Path("fixed.onnx")


def open_fixed_session() -> Any:
    return _Fixed()


MS = 1_000_000


def test_a_batch_waits_only_for_a_frame_due_within_the_window_and_the_deadline() -> None:
    b = planner()
    t = 1_000 * MS
    for cam, offset in (("a", 0), ("b", MS)):  # b delivers 1 ms after a, both every 33 ms
        for i in range(3):
            b.arrivals.saw(frame(cam, t - (3 - i) * 33 * MS + offset, i))
    a = frame("a", t)
    assert (
        b.may_wait([a], opened_ns=t, now=t) == t + MS + 500_000
    )  # b is due in 1 ms: wait for it, a little past
    assert b.may_wait([a], opened_ns=t, now=t + 2 * MS) is None  # b is overdue: not coming soon
    assert b.may_wait([a, frame("b", t + MS)], opened_ns=t, now=t + MS) is None  # no other camera to wait for
    # b is due within the window, but a has waited 28 ms: a batch of two (2 + 1.5 ms inference,
    # 2 x 0.5 ms prep+post, 1 ms margin) would end past a's deadline.
    old = frame("a", t - 28 * MS)
    assert b.may_wait([old], opened_ns=t, now=t) is None
    assert (
        b.may_wait([frame("a", t - 20 * MS)], opened_ns=t, now=t) == t + MS + 500_000
    )  # 13 ms left: it fits
    full = planner(max_batch=1)
    full.arrivals = b.arrivals
    assert full.may_wait([a], opened_ns=t, now=t) is None
    assert planner().may_wait([a], opened_ns=t, now=t) is None  # nothing predicted yet
    late = planner()
    for i in range(3):  # c delivers 10 ms after a: beyond the 3.3 ms window
        late.arrivals.saw(frame("c", t - (3 - i) * 33 * MS + 10 * MS, i))
    assert late.may_wait([a], opened_ns=t, now=t) is None


@pytest.mark.slow
def test_batched_frames_are_labelled_as_each_camera_alone(model: Any, tmp_path: Path) -> None:
    # Three folders read as fast as they go (block: every slot always holds a frame), batches of up to 3.
    images = [data.chelsea(), data.astronaut(), data.coffee(), data.rocket()]
    paths = {
        name: folder(tmp_path / name, images[i:] + images[:i], size)
        for i, (name, size) in enumerate((("door", (640, 480)), ("yard", (320, 240)), ("gate", (480, 360))))
    }
    alone = {}
    for name, path in paths.items():
        with edgekit.Pipeline(model, str(path)) as p:
            alone[name] = [(r.record.index, r.labels) for r in p]
    with edgekit.Pipeline(model, sources={n: str(p) for n, p in paths.items()}, batch=3) as p:
        results = held(p)
        summary = p.summary().to_dict()
    together = {n: [(r.record.index, r.labels) for r in results if r.record.camera == n] for n in alone}
    assert together == alone
    assert model.session.batchable and summary["batch"]["max"] == 3
    batched = [r.record for r in results if r.record.batch > 1]
    assert batched and summary["batch"]["mean"] > 1
    for rec in batched:  # a batched frame's stages still add up to its latency
        assert rec.to_dict()["batch"] == rec.batch
        total = sum(rec.stage_ms().values())
        assert total == pytest.approx(rec.latency_ms, abs=0.01)


def test_a_camera_with_its_own_budget_and_policy(model: Any, tmp_path: Path) -> None:
    images = [data.chelsea(), data.coffee()] * 2
    a, b = folder(tmp_path / "a", images, (320, 240)), folder(tmp_path / "b", images, (160, 120))
    with edgekit.Pipeline(
        model, sources={"door": edgekit.Camera(str(a), budget_ms=66), "yard": str(b)}, budget_ms=30
    ) as p:
        records = [r.record for r in p]
        d = p.summary().to_dict()
    assert {r.camera: r.deadline_ns - r.captured_ns for r in records} == {
        "door": 66_000_000,
        "yard": 30_000_000,
    }
    assert {n: (c["budget_ms"], c["policy"]) for n, c in d["cameras"].items()} == {
        "door": (66, "block"),
        "yard": (30, "block"),
    }
    assert "budget 66 ms" in p.summary().render()
    with pytest.raises(PipelineError, match="one switch for every camera"):
        edgekit.Pipeline(model, sources={"door": edgekit.Camera(str(a), policy="degrade")})
    with pytest.raises(PipelineError, match="positive number"):
        edgekit.Pipeline(model, sources={"door": edgekit.Camera(str(a), budget_ms=-1)})


@pytest.fixture(scope="module")
def face_detector(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from detector_bundle import build_blazeface

    with edgekit.load(build_blazeface(tmp_path_factory.mktemp("blazeface")), device="x86_64-cpu") as m:
        yield m


@pytest.mark.slow
def test_batched_detections_are_each_cameras_alone(face_detector: Any, tmp_path: Path) -> None:
    # BlazeFace (its build freed the batch): two cameras of faces at different sizes, batches of two.
    faces = [
        data.astronaut(),
        cv2.cvtColor(data.camera(), cv2.COLOR_GRAY2RGB),
        data.astronaut()[:300, 50:350],
    ]
    paths = {
        "door": folder(tmp_path / "door", faces, (640, 480)),
        "yard": folder(tmp_path / "yard", faces[::-1], (320, 320)),
    }
    alone = {}
    for name, path in paths.items():
        with edgekit.Pipeline(face_detector, str(path)) as p:
            alone[name] = [r.detections for r in p]
    with edgekit.Pipeline(face_detector, sources={n: str(p) for n, p in paths.items()}, batch=2) as p:
        results = held(p)
    assert face_detector.session.batchable and any(r.record.batch == 2 for r in results)
    for name, frames in alone.items():
        together = [r.detections for r in results if r.record.camera == name]
        assert len(together) == len(frames) and sum(map(len, frames)) >= 2  # faces were found
        for got, want in zip(together, frames, strict=True):
            assert [d.class_id for d in got] == [d.class_id for d in want]
            assert all(iou(g.box, w.box) >= 0.9 for g, w in zip(got, want, strict=True))
