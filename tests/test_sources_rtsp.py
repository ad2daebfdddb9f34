"""RTSP sources against a real server (gst-rtsp-server on loopback): each transport and codec, each fault.

The cells are those of ``benchmarks/source_matrix.py``, which prints them as a table: a codec, a
transport and a fault done on the camera's side (tests/source_faults.py), asserted here on what
the source made of it: frames after the fault, outages and reopens counted, stalls found by the
watchdog rather than by the connection's end, a clear error for wrong credentials.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import source_faults
from rtsp_server import RtspCamera, rtsp_server_missing

from edgekit.errors import SourceError
from edgekit.pipeline.sources import (
    SourceInfo,
    open_source,
    parse_source,
    stall_timeout_s,
)

_MISSING = rtsp_server_missing()
needs_server = pytest.mark.skipif(_MISSING is not None, reason=f"no RTSP server here: {_MISSING}")

# h264 through every fault on both transports; h265 through the two that reopen the stream.
CELLS = [("h264", t, f) for t in ("tcp", "udp") for f in source_faults.FAULTS[1:]] + [
    ("h265", t, f) for t in ("tcp", "udp") for f in ("none", "server killed")
]


@needs_server
@pytest.mark.parametrize(("codec", "transport", "fault"), CELLS, ids=lambda v: str(v).replace(" ", "-"))
def test_rtsp_source_survives(codec: str, transport: str, fault: str) -> None:
    cell = source_faults.run_cell(codec, transport, fault)
    if fault == "wrong credentials":
        assert "refused the user and password" in cell.error
        assert "s3cret" not in cell.error and "not-it" not in cell.error  # never shown
        return
    assert cell.frames_after >= 30, cell  # frames came back after the fault, and kept coming
    if fault == "server killed":
        assert cell.outages >= 1 and cell.reopens >= 1, cell
        assert cell.stalls == 0, cell  # the connection ended: an outage, not a stall
        assert cell.down_s >= source_faults.DOWN_S * 0.9, cell
    elif fault == "stream paused":
        # Found by the watchdog while the connection was still open, before the stream resumed.
        assert cell.stalls >= 1 and cell.reopens >= 1, cell
        assert cell.detect_s is not None and cell.detect_s < source_faults.PAUSE_S, cell
        assert cell.down_s >= stall_timeout_s(30), cell
    elif fault == "packets dropped":
        # Losses damage frames; they do not end the stream or make the source reopen it.
        assert cell.reopens == 0, cell
    elif fault == "resolution change":
        assert cell.outages == 0, cell
    else:
        assert (cell.outages, cell.reopens, cell.stalls) == (0, 0, 0), cell
        assert cell.sizes == [(640, 480)]


def _udp_socket_inodes() -> set[str]:
    """Inodes of this process's UDP sockets bound on loopback (RTP over UDP receives on them)."""
    ours = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[8:-1])
    bound = set()
    for line in Path("/proc/self/net/udp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[1].startswith("0100007F:") or cols[1].startswith("00000000:"):
            bound.add(cols[9])
    return ours & bound


@needs_server
@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_the_transport_option_is_the_one_used(transport: str) -> None:
    with RtspCamera() as cam:
        before = _udp_socket_inodes()
        source = open_source(cam.url + f"#transport={transport}")
        try:
            assert source.read() is not None
            receiving = _udp_socket_inodes() - before
        finally:
            source.close()
    if transport == "udp":
        assert receiving, "no UDP socket was opened for RTP"
    else:
        assert not receiving, "RTP over TCP opened UDP sockets"


@needs_server
def test_credentials_open_the_stream_and_never_reach_the_log(caplog: pytest.LogCaptureFixture) -> None:
    with RtspCamera(user="viewer", password="pa:ss@word") as cam:
        source = open_source(cam.url)
        reader = source_faults.Reader(source)
        reader.start()
        try:
            assert reader.wait_frames(5) is not None
            cam.stop()  # the source logs the outage and its reopening attempts, URL included
            reader.watch_outage(2.0)
        finally:
            source.close()
            reader.join(10)
    assert source.counters.outages == 1
    assert "viewer:***@" in caplog.text  # the URL is logged, its password masked
    assert "pa:ss" not in caplog.text and "pa%3Ass" not in caplog.text


@needs_server
@pytest.mark.parametrize(
    ("path", "expect"),
    [("/nope", "has no stream at '/nope'"), ("", "wants a user and password")],
)
def test_an_rtsp_url_that_cannot_open_says_why(path: str, expect: str) -> None:
    with RtspCamera(user="viewer", password="pw") as cam:
        url = f"rtsp://127.0.0.1:{cam.port}{path or '/cam'}"
        with pytest.raises(SourceError) as err:
            open_source(url)
    assert expect in err.value.message and err.value.hint


def test_nothing_listening_is_said_at_once() -> None:
    from rtsp_server import free_port

    port = free_port()
    with pytest.raises(SourceError) as err:
        open_source(f"rtsp://127.0.0.1:{port}/cam")
    assert "nothing listens" in err.value.message


def test_stream_options_follow_the_hash() -> None:
    spec = parse_source("rtsp://cam.local/s1#transport=udp")
    assert (spec.target, spec.params) == ("rtsp://cam.local/s1", {"transport": "udp"})
    assert parse_source("rtsp://cam.local/s1").params == {"transport": "tcp"}  # survives loss
    assert parse_source("http://cam.local/mjpg").params == {}
    for bad, says in [
        ("rtsp://cam/s#transport=quic", "is not one of"),
        ("rtsp://cam/s#latency=9", "unknown stream option"),
        ("http://cam/mjpg#transport=udp", "applies to rtsp://"),
    ]:
        with pytest.raises(SourceError) as err:
            parse_source(bad)
        assert says in err.value.message and err.value.hint


@pytest.mark.parametrize(
    ("fps", "seconds"), [(None, 1.0), (30, 1.0), (60, 0.5), (120, 0.5), (10, 2.0), (1, 3.0)]
)
def test_the_stall_timeout_follows_the_rate(fps: float | None, seconds: float) -> None:
    assert stall_timeout_s(fps) == pytest.approx(seconds)


def test_time_without_frames_runs_from_the_last_frame() -> None:
    import time

    import numpy as np

    from edgekit.pipeline.sources import Source

    class Flaky(Source):
        def __init__(self) -> None:
            super().__init__(SourceInfo("flaky", "stream", True, 30.0))
            self.gap_s = 0.0

        def _read(self) -> np.ndarray:
            if self.gap_s:
                self._outage(stalled=True)
                time.sleep(self.gap_s)
                self.gap_s = 0.0
            return np.zeros((8, 8, 3), np.uint8)

    src = Flaky()
    src.read()
    assert src.down_now_s() == 0.0
    src.gap_s = 0.2
    src.read()
    assert src.counters.down_s >= 0.2 and src.counters.stalls == 1 and src.counters.outages == 1
    assert src.down_now_s() == 0.0


@needs_server
def test_a_stream_read_late_starts_at_the_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames queued between opening and the first read are skipped, not handed over in a burst."""
    import time

    from edgekit.pipeline import sources

    monkeypatch.setattr(sources, "STREAM_OPENERS", [])  # OpenCV's FFmpeg, where frames queue
    with RtspCamera() as cam:
        source = open_source(cam.url)
        try:
            time.sleep(3.0)  # a pipeline loading its model: ~90 frames queue meanwhile
            assert source.read() is not None
            assert source.counters.stale >= 30
            started = time.monotonic()
            for _ in range(15):
                assert source.read() is not None
            # Caught up, the frames come at the camera's pace (half a second for 15 at 30 fps),
            # not out of a queue.
            assert time.monotonic() - started >= 0.3
        finally:
            source.close()
