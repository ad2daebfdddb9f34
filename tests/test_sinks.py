"""The frame path's one protocol: each sink told each finished frame once, a failing or slow one never stops the loop."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import cv2
import pytest
import tiny_detector as td
from stand_in import slower

import edgekit
from edgekit.pipeline.sinks import Sink, sink

FRAMES = 12


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    bundle = td.classifier_bundle(tmp_path_factory.mktemp("cls") / "tiny", keys[0])
    with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[keys[1]]) as model:
        yield model


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("frames")
    for i in range(FRAMES):
        cv2.imwrite(str(out / f"{i:03d}.png"), td.square_frame(i % 4, (i // 4) % 4))
    return out


def test_each_sink_is_told_each_frame_once_with_its_final_record(
    classifier: edgekit.Model, folder: Path
) -> None:
    inline: list[edgekit.FrameResult] = []
    queued: list[edgekit.FrameResult] = []
    closed: list[str] = []
    with edgekit.Pipeline(classifier, str(folder)) as p:
        p.add_sink(sink("inline", inline.append, close=lambda: closed.append("inline")))
        p.add_sink(sink("queued", queued.append, depth=FRAMES, close=lambda: closed.append("queued")))
        assert isinstance(p.sinks._inline[-1], Sink)
        results = list(p)
    assert sorted(closed) == ["inline", "queued"]  # closed with the pipeline, once each
    assert [r.record.index for r in inline] == [r.record.index for r in queued] == list(range(FRAMES))
    assert [r.labels for r in inline] == [r.labels for r in results]
    assert inline[-1].record is queued[-1].record is p.last_record  # one record, built once
    assert p.sinks.dropped == {} and p.sinks.errors == {}


def test_a_sink_that_raises_is_counted_and_logged_once_and_the_loop_goes_on(
    classifier: edgekit.Model, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_: edgekit.FrameResult) -> None:
        raise RuntimeError("disk full")

    after: list[int] = []
    with (
        caplog.at_level(logging.ERROR, "edgekit.pipeline.sinks"),
        edgekit.Pipeline(classifier, str(folder)) as p,
    ):
        p.add_sink(sink("broken", broken))
        p.add_sink(sink("after", lambda r: after.append(r.record.index)))
        summary = p.run()
    assert summary.frames == FRAMES and summary.ended_by == "source ended"
    assert after == list(range(FRAMES))  # the sink after it missed nothing
    assert p.sinks.errors == {"broken": FRAMES} and summary.to_dict()["sink_errors"] == {"broken": FRAMES}
    logged = [r for r in caplog.records if "broken" in r.getMessage()]
    assert len(logged) == 1 and "disk full" in (logged[0].exc_text or "")


def test_a_queued_sink_that_falls_behind_drops_counted_and_never_holds_the_loop(
    classifier: edgekit.Model, folder: Path
) -> None:
    # The sink blocks until the run is over: a loop that waited for it would never end.
    release = threading.Event()
    got: list[int] = []

    def stuck(result: edgekit.FrameResult) -> None:
        release.wait()
        got.append(result.record.index)

    depth = 2
    with slower(classifier, 2.0), edgekit.Pipeline(classifier, str(folder)) as p:
        p.add_sink(sink("stuck", stuck, depth=depth))
        summary = p.run()
        assert summary.frames == FRAMES  # every frame labelled while the sink sat on its first
        dropped = p.sinks.dropped["stuck"]
        assert FRAMES - depth - 1 <= dropped <= FRAMES - depth  # the one it holds, and its queue, kept
        release.set()
    # Closing drains what was queued: every frame was told or counted as dropped, none twice.
    assert len(got) + dropped == FRAMES and got == sorted(set(got))
    assert summary.to_dict()["sink_dropped"] == {"stuck": dropped}


def test_the_old_hook_lists_are_gone() -> None:
    # One way in for frame consumers (add_sink): the per-kind hook lists must not come back.
    root = Path(edgekit.__file__).parent
    old = re.compile(
        r"\b(add_observer|add_result_sink|add_label_sink|add_closer|_observers|_result_sinks|_label_sinks|_closers)\b"
    )
    hits = [
        f"{p.relative_to(root)}:{m.group(0)}" for p in root.rglob("*.py") for m in old.finditer(p.read_text())
    ]
    assert hits == []


def test_each_record_says_which_frame_it_is(classifier: edgekit.Model, folder: Path, tmp_path: Path) -> None:
    from test_sources import write_video

    from edgekit.pipeline import Source, SourceInfo

    # A folder's frames are its files (an unreadable one skipped, not misnamed); a video file's, its
    # name with the record's index; a stream's, its URI without the password.
    (folder.parent / "mixed").mkdir(exist_ok=True)
    mixed = folder.parent / "mixed"
    cv2.imwrite(str(mixed / "a.png"), td.square_frame(0, 0))
    (mixed / "b.png").write_bytes(b"not a png")
    cv2.imwrite(str(mixed / "c.png"), td.square_frame(1, 1))
    with edgekit.Pipeline(classifier, str(mixed)) as p:
        names = [r.record.source_name for r in p]
    assert names == ["a.png", "c.png"]
    clip = write_video(tmp_path / "clip.avi", [td.square_frame(i % 4, 0) for i in range(3)])
    with edgekit.Pipeline(classifier, str(clip)) as p:
        rows = [r.record.to_dict() for r in p]
    assert [(r["source_name"], r["index"]) for r in rows] == [("clip.avi", i) for i in range(3)]

    class Stream(Source):
        def _read(self) -> None:
            return None

    live = Stream(SourceInfo("rtsp://admin:secret@cam.local/stream", "stream", live=True))
    assert "secret" not in live.frame_name() and "cam.local/stream" in live.frame_name()
