"""The preview: a real HTTP server fed constructed frame results (the detector's end-to-end run with a
real model is tests/test_detection_e2e.py).  The page in headless Chromium shows the boxes where the
detections are; the stream's JPEGs carry them; a stalled viewer holds back neither the encoder nor
the other viewers; nothing is encoded while nobody watches; bad paths are 404; it is bounded in
viewers and connections; it refuses foreign Host names on loopback; and it closes cleanly.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from chromium import drawn_box, image_rect, open_chromium, require_chromium, screenshot_bgr

from edgekit.detection.detector import Detection
from edgekit.detection.draw import colour_of, line_width
from edgekit.pipeline.records import FrameResult
from edgekit.preview import PreviewError, PreviewFeed, PreviewServer, parse_address
from edgekit.preview.server import BOUNDARY
from edgekit.processing.postprocess import Label
from edgekit.testing.frames import finished_frame

FACE = Detection(0, "face", 0.93, (200.0, 120.0, 360.0, 330.0))


def result(
    index: int, frame: np.ndarray | None = None, detections: tuple[Detection, ...] = (FACE,)
) -> FrameResult:
    image = frame if frame is not None else np.full((480, 640, 3), 128, np.uint8)
    return finished_frame(index, image, detections, candidate="onnx-fp32")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Stream:
    """An MJPEG client: each ``next()`` is one part's ``(X-Frame-Index, JPEG bytes)``."""

    def __init__(self, url: str) -> None:
        self.response = urllib.request.urlopen(url + "stream.mjpg", timeout=20)
        assert self.response.headers["Content-Type"] == f"multipart/x-mixed-replace; boundary={BOUNDARY}"
        assert self.response.readline() == f"--{BOUNDARY}\r\n".encode()

    def next(self) -> tuple[int, bytes]:
        headers = {}
        while (line := self.response.readline()) != b"\r\n":
            if not line:
                raise EOFError("the stream ended")
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()
        assert headers["content-type"] == "image/jpeg"
        data = self.response.read(int(headers["content-length"]))
        assert self.response.read(len(BOUNDARY) + 6) == f"\r\n--{BOUNDARY}\r\n".encode()  # closes the part
        return int(headers["x-frame-index"]), data

    def until(self, index: int) -> bytes:
        while True:
            got, data = self.next()
            if got >= index:
                assert got == index, f"frame {index} was skipped for {got}"
                return data

    def close(self) -> None:
        self.response.close()


@pytest.fixture
def preview() -> Iterator[PreviewServer]:
    server = PreviewServer("127.0.0.1", 0, model="blazeface", task="detection").start()
    try:
        yield server
    finally:
        server.close()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# -- the address -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("[::1]:0", ("::1", 0)),
        ("camera.local:9000", ("camera.local", 9000)),
    ],
)
def test_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["8080", "host:http", ":70000", "::1:8080", "[nothost]:80", ""])
def test_malformed_addresses_are_refused_with_a_hint(text: str) -> None:
    with pytest.raises(PreviewError) as err:
        parse_address(text)
    assert err.value.hint


def test_a_port_in_use_is_an_error_with_a_hint(preview: PreviewServer) -> None:
    with pytest.raises(PreviewError, match="cannot listen") as err:
        PreviewServer("127.0.0.1", preview.port)
    assert "--preview :0" in err.value.hint


# -- what it serves ------------------------------------------------------------------------------


def test_detections_json_is_the_newest_frame(preview: PreviewServer) -> None:
    status, body = get(preview.url + "detections")
    first = json.loads(body)
    assert (status, first["index"], first["detections"]) == (200, None, [])
    assert (first["model"], first["task"]) == ("blazeface", "detection")
    preview.offer(result(7))
    preview.offer(result(8, detections=(FACE, Detection(0, "face", 0.61, (10.0, 20.0, 50.0, 70.0)))))
    latest = json.loads(get(preview.url + "detections")[1])
    assert (latest["index"], latest["width"], latest["height"]) == (8, 640, 480)
    assert [(d["name"], d["score"], d["box"]) for d in latest["detections"]] == [
        ("face", 0.93, [200.0, 120.0, 360.0, 330.0]),
        ("face", 0.61, [10.0, 20.0, 50.0, 70.0]),
    ]


def test_a_classifiers_labels_are_in_the_json(preview: PreviewServer) -> None:
    labelled = result(3, detections=())
    preview.offer(FrameResult((Label(281, "tabby", 0.8),), labelled.record, labelled.frame))
    latest = json.loads(get(preview.url + "detections")[1])
    assert latest["labels"] == [{"id": 281, "name": "tabby", "score": 0.8}]


@pytest.mark.parametrize("path", ["nope", "stream.mjpg/x", "detections.json", "../etc/passwd", "index.htm"])
def test_bad_paths_are_404(preview: PreviewServer, path: str) -> None:
    assert get(preview.url + path)[0] == 404


def test_only_get_is_served(preview: PreviewServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", preview.port, timeout=10)
    conn.request("POST", "/detections", body=b"{}")
    assert conn.getresponse().status == 501
    conn.close()


def test_on_loopback_a_foreign_host_name_is_refused(preview: PreviewServer) -> None:
    # A page on another site whose DNS name was rebound to 127.0.0.1 sends its own name as Host.
    assert get(preview.url + "detections", {"Host": f"attacker.example:{preview.port}"})[0] == 403
    assert get(preview.url + "detections", {"Host": f"localhost:{preview.port}"})[0] == 200


def test_the_stream_carries_the_boxes_in_each_jpeg(preview: PreviewServer) -> None:
    preview.offer(result(1))
    stream = Stream(preview.url)
    try:
        index, data = stream.next()
    finally:
        stream.close()
    assert index == 1
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (480, 640, 3)
    x0, y0, x1, y1 = FACE.box
    box = drawn_box(image, colour_of(0), min_edge=int(0.6 * (y1 - y0)))
    assert box is not None, "no box outline in the JPEG"
    tol = line_width((480, 640)) + 2
    assert np.allclose(box, (x0, y0, x1, y1), atol=tol), (box, FACE.box)


# -- bounded: nothing encoded for nobody, a stalled viewer holds back no one -----------------------


def test_nothing_is_encoded_while_nobody_watches_and_a_newcomer_sees_the_newest_frame(
    preview: PreviewServer,
) -> None:
    for i in range(10):
        preview.offer(result(i))
    assert preview.feed.encoded == 0  # no viewer: the encoder is asleep, not encoding and discarding
    stream = Stream(preview.url)
    try:
        assert stream.next()[0] == 9
    finally:
        stream.close()
    assert preview.feed.encoded == 1


def test_a_stalled_viewer_holds_back_neither_the_encoder_nor_another_viewer(preview: PreviewServer) -> None:
    # Noise does not compress: each JPEG is about a megabyte, more than the sockets can buffer.
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (720, 1280, 3), np.uint8) for _ in range(4)]
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", preview.port))
    stalled.sendall(b"GET /stream.mjpg HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # and never reads
    wait_for("the stalled viewer to be counted", lambda: preview.feed.viewers == 1)
    watching = Stream(preview.url)
    try:
        for i in range(30):
            preview.offer(result(i, frames[i % len(frames)]))
            watching.until(i)  # every frame reaches the viewer that reads
    finally:
        watching.close()
        stalled.close()
    assert preview.feed.dropped > 0  # the stalled viewer's queue overflowed: it lost old frames


def test_viewers_are_bounded() -> None:
    with PreviewServer("127.0.0.1", 0, feed=PreviewFeed(max_viewers=1)).start() as server:
        server.offer(result(0))
        first = Stream(server.url)
        try:
            first.next()
            assert get(server.url + "stream.mjpg")[0] == 503
            assert get(server.url + "detections")[0] == 200  # the page still answers
        finally:
            first.close()
        wait_for("the viewer's slot to be freed", lambda: server.feed.viewers == 0)
        again = Stream(server.url)
        again.close()


def test_connections_are_bounded() -> None:
    with PreviewServer("127.0.0.1", 0, max_connections=2).start() as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        try:
            time.sleep(0.2)  # let the server accept both (they hold their slots, saying nothing)
            extra = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            extra.sendall(b"GET /detections HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert extra.recv(100) == b""  # closed at once, not queued behind the idle ones
            extra.close()
        finally:
            for s in idle:
                s.close()

        def answered() -> bool:
            try:
                return get(server.url + "detections")[0] == 200
            except OSError:  # refused: the idle connections' threads have not seen them close yet
                return False

        assert wait_for("a slot to come back", answered)


# -- closing -------------------------------------------------------------------------------------


def preview_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("edgekit-preview")]


def test_close_ends_streams_frees_the_port_and_leaves_no_thread() -> None:
    before = preview_threads()
    server = PreviewServer("127.0.0.1", 0).start()
    server.offer(result(0))
    stream = Stream(server.url)
    stream.next()
    server.close()
    with pytest.raises((EOFError, AssertionError, OSError, http.client.HTTPException)):
        for _ in range(100):  # a repeat of frame 0 may have been on its way: then the end
            stream.next()
    stream.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5)
    assert preview_threads() == before
    PreviewServer("127.0.0.1", server.port).close()  # the port is free again
    server.close()  # twice is harmless


# -- the page in a browser -----------------------------------------------------------------------


def test_the_page_in_chromium_draws_the_boxes_where_the_detections_are(
    preview: PreviewServer, tmp_path: Path
) -> None:
    require_chromium()
    frame = np.full((480, 640, 3), 90, np.uint8)
    cv2.circle(frame, (280, 225), 80, (150, 170, 200), -1)  # something where the face is
    preview.offer(result(42, frame))
    driver = open_chromium(tmp_path)
    try:
        driver.get(preview.url)
        wait_for(
            "the stream to show a frame and the list its face",
            lambda: driver.execute_script(
                "return document.getElementById('stream').naturalWidth > 0"
                " && document.getElementById('objects').textContent.includes('face 0.93')"
            ),
        )
        assert "frame 42" in driver.find_element("id", "status").text
        rect = image_rect(driver, "stream")
        shot = screenshot_bgr(driver)
        cv2.imwrite(str(tmp_path / "preview.png"), shot)
    finally:
        driver.quit()
    assert (rect["naturalWidth"], rect["naturalHeight"]) == (640, 480)
    scale = rect["width"] / rect["naturalWidth"]
    x0, y0, x1, y1 = FACE.box
    expected = (
        rect["left"] + x0 * scale,
        rect["top"] + y0 * scale,
        rect["left"] + x1 * scale,
        rect["top"] + y1 * scale,
    )
    box = drawn_box(shot, colour_of(0), min_edge=int(0.6 * (y1 - y0) * scale))
    assert box is not None, f"no box on the page (screenshot: {tmp_path / 'preview.png'})"
    tol = (line_width((480, 640)) + 2) * max(scale, 1.0)
    assert np.allclose(box, expected, atol=tol), (box, expected)
